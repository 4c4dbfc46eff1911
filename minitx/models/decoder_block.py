r"""The plain decoder layer: attention, then the MLP, each behind a norm in the residual stream
(GPT-2's and Llama's pre-norm), for the residual stream h of ``decoder.py``'s formula:

$$
h \leftarrow h + \operatorname{Attn}(\operatorname{Norm}_1 h), \qquad
h \leftarrow h + \operatorname{MLP}(\operatorname{Norm}_2 h)
$$

The other placements of the norms and MiniMax's weighted residual are subclasses in
``block_features.py``; the token mixer (attention or a recurrence) is built there too and
handed in, so this file names none of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import validate
from ..nn.decoder_layers import DenseMLP, GatedMLP
from ..nn.hooks import HookPoint
from ..nn.module import Module
from .decoder_attention import kv_source, norm_layer

# The mixture-of-experts layer lives in its own module; a tree without it still builds every
# dense family, and ``mlp="moe"`` then says what is missing.
try:
    from ..nn.moe import MoE
except ImportError:  # pragma: no cover - depends on the tree
    MoE = None

if TYPE_CHECKING:                       # a type only: decoder.py imports this module
    from .decoder import DecoderConfig

__all__ = ["DecoderBlock", "layer_mlp", "layer_mlp_width"]


def layer_mlp_width(c: DecoderConfig, index: int) -> int:
    """F, or 2F in a layer that borrows its keys under ``double_wide_mlp`` (Gemma 4)."""
    return c.ffn_hidden * (2 if c.double_wide_mlp and kv_source(c, index) is not None else 1)


def layer_mlp(c: DecoderConfig, index: int = 0):
    """Layer ``index``'s MLP: GPT-2's (GELU, or the squared ReLU), a gated one (SwiGLU, GeGLU),
    or a mixture of experts (a dense SwiGLU in the ``dense_layers`` of an MoE model)."""
    gelu = "gelu_tanh" if c.gelu_approximate else "gelu"
    width = layer_mlp_width(c, index)
    moe_layer = c.single_sublayer and c.layer_types[index] == "moe"    # Nemotron-H's
    if c.mlp in ("gelu", "relu2") and not moe_layer:
        act = gelu if c.mlp == "gelu" else "relu2"
        return DenseMLP(c.hidden_size, width, act, bias=c.mlp_bias)
    if (c.mlp in ("swiglu", "geglu") or index in c.dense_layers) and not moe_layer:
        act = gelu if c.mlp == "geglu" else "silu"
        return GatedMLP(c.hidden_size, width, act, bias=c.mlp_bias)
    if MoE is None:
        raise validate.OptionError("DecoderConfig: mlp='moe' needs minitx.nn.moe, which this "
                                   "tree does not have")
    return MoE(c.hidden_size, c.expert_hidden, c.num_experts, c.top_k, **c.moe_options)


class DecoderBlock(Module):
    """One pre-norm layer (module docstring): x (B, N, E) → (B, N, E).

    ``ln1`` and ``ln2`` normalise the inputs of ``attn`` (the token mixer built by
    ``block_features.layer_mixer``) and ``mlp``. Hook points (TransformerLens's):
    ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
    ``hook_resid_post``.
    """

    def __init__(self, c: DecoderConfig, attn: Module, index: int = 0):
        super().__init__()
        self.ln1 = norm_layer(c, c.hidden_size)
        self.attn = attn
        self.ln2 = norm_layer(c, c.hidden_size)
        self.mlp = layer_mlp(c, index)
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """The mixer's cache."""
        return self.attn.new_cache()

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """``kv_cache``, ``keep`` and ``positions`` go to the mixer (``DecoderAttention``'s)."""
        x = self.hook_resid_pre(x)
        a = self.hook_attn_out(self.attn(self.ln1(x), kv_cache, keep, positions))
        x = self.hook_resid_mid(x + a)
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))
