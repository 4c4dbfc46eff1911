r"""What some families change in a decoder layer (``decoder_block.DecoderBlock``, pre-norm),
one subclass each, and the choice of each layer's token mixer. ``block_class`` and
``layer_mixer`` read the configuration, so the plain block names none of them.

- ``PostNorm`` (``norm_placement="post"``, OLMo 2): the norm on each sublayer's output,
  inside the residual, h + Norm(F(h)).
- ``Sandwich`` (``norm_placement="sandwich"``, Gemma 3): a norm on both sides,
  h + Norm'(F(Norm h)) (four norms per layer).
- ``OneSublayer`` (``single_sublayer``, Nemotron-H): a layer is one norm and one sublayer,
  its mixer or, for the layer types "mlp" and "moe", its MLP: h + F(Norm h).
- ``ScaledResidual`` (``residual_scales``, MiniMax): the residual is the normalised input,
  each term weighted per layer, for the attention (α₁, β₁) and the MLP (α₂, β₂):

$$
h \leftarrow \alpha\, \operatorname{Norm}(h) + \beta\, F(\operatorname{Norm} h)
$$

Steadier training is the reason for all three. A placement is the softmax-attention
layers': a layer whose mixer is a registered recurrence keeps the plain pre-norm block
(OLMo-Hybrid's gated DeltaNet layers are Llama's, between OLMo 3's post-norm attention
layers; ``block_class``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..nn.module import Module
from .attention_features import attention_class
from .decoder_attention import norm_layer
from ..attention import SharedKVCache
from ..nn.hooks import HookPoint
from .decoder_block import DecoderBlock, layer_mlp
from .latent_attention import LatentDecoderAttention
from .mixers import MIXERS

if TYPE_CHECKING:                       # a type only: decoder.py imports this module
    from .decoder import DecoderConfig

__all__ = ["PostNorm", "Sandwich", "OneSublayer", "ScaledResidual", "block_class",
           "layer_mixer"]


class PostNorm(DecoderBlock):
    """``ln1_post`` and ``ln2_post`` on the outputs; no input norms (``ln1``, ``ln2`` None).
    ``hook_attn_out`` and ``hook_mlp_out`` see the normalised outputs."""

    def __init__(self, c: DecoderConfig, attn: Module, index: int = 0):
        super().__init__(c, attn, index)
        self.ln1 = self.ln2 = None
        self.ln1_post = norm_layer(c, c.hidden_size)
        self.ln2_post = norm_layer(c, c.hidden_size)

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        x = self.hook_resid_pre(x)
        a = self.hook_attn_out(self.ln1_post(self.attn(x, kv_cache, keep, positions)))
        x = self.hook_resid_mid(x + a)
        return self.hook_resid_post(x + self.hook_mlp_out(self.ln2_post(self.mlp(x))))


class Sandwich(DecoderBlock):
    """``ln1``/``ln2`` on the inputs, ``ln1_post``/``ln2_post`` on the outputs."""

    def __init__(self, c: DecoderConfig, attn: Module, index: int = 0):
        super().__init__(c, attn, index)
        self.ln1_post = norm_layer(c, c.hidden_size)
        self.ln2_post = norm_layer(c, c.hidden_size)

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        x = self.hook_resid_pre(x)
        a = self.attn(self.ln1(x), kv_cache, keep, positions)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.ln1_post(a)))
        m = self.mlp(self.ln2(x))
        return self.hook_resid_post(x + self.hook_mlp_out(self.ln2_post(m)))


class OneSublayer(Module):
    """``ln1``, then the mixer ``attn`` or (an "mlp" or "moe" layer) ``mlp``, the other None.
    Hook points: ``hook_resid_pre``, ``hook_attn_out`` or ``hook_mlp_out``,
    ``hook_resid_post``. An MLP layer's cache counts tokens and holds nothing."""

    def __init__(self, c: DecoderConfig, attn: Module, index: int = 0):
        super().__init__()
        self.ln1 = norm_layer(c, c.hidden_size)
        ffn = c.layer_types[index] in ("mlp", "moe")      # a layer of MLP only
        self.attn = None if ffn else attn
        self.mlp = layer_mlp(c, index) if ffn else None
        names = ("resid_pre", "mlp_out" if ffn else "attn_out", "resid_post")
        for name in names:
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        # an MLP layer keeps nothing; its cache still counts tokens, as the others' do
        return SharedKVCache() if self.attn is None else self.attn.new_cache()

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        x = self.hook_resid_pre(x)
        h = self.ln1(x)
        if self.attn is not None:
            out = self.hook_attn_out(self.attn(h, kv_cache, keep, positions))
        else:
            if kv_cache is not None:           # the layer count of tokens, as every cache's
                kv_cache.advance(x.shape[1])
            out = self.hook_mlp_out(self.mlp(h))
        return self.hook_resid_post(x + out)


class ScaledResidual(DecoderBlock):
    """``scales`` = this layer's (α₁, β₁, α₂, β₂) from ``residual_scales``."""

    def __init__(self, c: DecoderConfig, attn: Module, index: int = 0):
        super().__init__(c, attn, index)
        self.scales = c.residual_scales[index]

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        a1, b1, a2, b2 = self.scales
        x = self.hook_resid_pre(x)
        n = self.ln1(x)
        a = self.hook_attn_out(self.attn(n, kv_cache, keep, positions))
        x = self.hook_resid_mid(n * a1 + a * b1)
        n = self.ln2(x)
        return self.hook_resid_post(n * a2 + self.hook_mlp_out(self.mlp(n)) * b2)

    def extra_repr(self) -> str:
        return f"scales={self.scales}"


def block_class(c: DecoderConfig):
    """What builds each layer of ``c``, called as ``(c, mixer, index)``: the plain block, or
    the class its norms' placement or MiniMax's residual weights ask for (``check_config``
    allows the weights with pre-norm only). The placement is the attention layers' only: with
    mixer layers among them, those are built as the plain block (module docstring)."""
    if c.residual_scales is not None:
        return ScaledResidual
    if c.single_sublayer:
        return OneSublayer
    placed = {"pre": DecoderBlock, "post": PostNorm, "sandwich": Sandwich}[c.norm_placement]
    if placed is DecoderBlock or not set(c.layer_types or ()) & set(MIXERS):
        return placed

    def by_layer(c, attn, index=0):
        return (DecoderBlock if c.layer_types[index] in MIXERS else placed)(c, attn, index)
    return by_layer


def layer_mixer(c: DecoderConfig, index: int) -> Module:
    """Layer ``index``'s token mixer: a registered recurrence (a hybrid's layer type),
    DeepSeek's latent attention (``attention="mla"``), or softmax attention with the
    additions ``attention_features.attention_class`` composes, full or sliding."""
    layer_type = c.layer_types[index]
    if layer_type in ("mlp", "moe"):                   # a layer with no mixer (Nemotron-H)
        return None
    if layer_type in MIXERS:
        return MIXERS[layer_type](c, index)
    if c.attention == "mla":
        return LatentDecoderAttention(c)
    return attention_class(c)(c, layer_type == "sliding", index)
