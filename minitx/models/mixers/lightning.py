r"""MiniMax-01's lightning-attention layer: the token mixer of MiniMax-Text-01's linear layers.

MiniMax (2025), "MiniMax-01: Scaling Foundation Models with Lightning Attention". Seven of
every eight layers of MiniMax-Text-01 mix tokens with lightning attention
(``attention/lightning.py``: causal linear attention with a constant decay λ_h per head,
computed block by block), wrapped in MiniMax's projections. For x_t (1, E), H heads of D dims:

$$
[q_t^{(h)}, k_t^{(h)}, v_t^{(h)}]_h = \operatorname{SiLU}(x_t W_{qkv}), \qquad
S_t^{(h)} = \lambda_h S_{t-1}^{(h)} + k_t^{(h)\top} v_t^{(h)}, \qquad
o_t^{(h)} = q_t^{(h)} S_t^{(h)}
$$

$$
y_t = \Bigl( \sigma(x_t W_g) \odot \operatorname{RMSNorm}\bigl([o_t^{(1)}, \dots, o_t^{(H)}]
\bigr) \Bigr) W_o, \qquad \lambda_h = e^{-s_h}
$$

with S_0 = 0 and MiniMax's rates s_h for layer l of L (``attention.lightning``'s
``lightning_slopes``). The recurrence is computed in blocks of c tokens
(``lightning_blocks``, which ``attention/lightning.py`` proves equal to it); a cache keeps
S_t, D × D numbers per head whatever the length.

Where HuggingFace's ``MiniMaxLightningAttention`` and this layer meet the paper: q, k and v
come from one fused projection, laid out per head as [q, k, v] (D each), all three through
SiLU; there is no 1/√D, no normalisation by a running sum of keys and no positional rotation
(the decay orders the tokens); the RMSNorm runs over all H·D output dims at once (not per
head) with eps 10⁻⁶ whatever the model's ``rms_norm_eps``; the gate σ(x W_g) reads the
layer's input. Padding (``attention_mask`` 0) zeroes a token's q, k and v after the SiLU, as
HF does, so it adds nothing to the state: left padding leaves the real tokens' outputs as
without it.
"""
from __future__ import annotations

from ... import validate
from ...attention.base import hooked_heads
from ...attention.lightning import lightning_block, lightning_blocks, lightning_slopes
from ...attention.retention import RecurrentState
from ...nn.decoder_layers import DecoderRMSNorm
from ...nn.hooks import HookPoint
from ...nn.layers import Linear
from ...nn.module import Module
from ...ops.elementwise import sigmoid, silu
from ...ops.indexing import masked_fill
from ...ops.sdpa import merge_heads
from . import register_mixer

__all__ = ["LightningMixer"]

# the option (its default): blocks of 256 tokens, as MiniMax-Text-01's config.json says
OPTIONS = {"block": 256}


@register_mixer("lightning")
class LightningMixer(Module):
    """MiniMax's lightning-attention layer (formula: the module docstring), layer ``index`` of
    a ``DecoderConfig``'s ``num_layers`` L. x (B, N, E) → (B, N, E).

    Sizes from the config: H = ``num_heads`` heads of D = ``head_dim`` (every head has its own
    k and v: ``num_kv_heads`` is for the softmax layers). Option
    (``mixer_options["lightning"]``): ``block`` c, the block length (256). Parameters, as HF
    names them: ``qkv_proj`` (E → 3·H·D), ``output_gate`` (E → H·D), ``norm`` (H·D),
    ``out_proj`` (H·D → E); the decays are constants. Cache: ``new_cache()``, a
    ``RecurrentState`` holding S (B, H, D, D), ``len()`` the tokens seen. Hook points:
    ``hook_q``/``hook_k``/``hook_v``/``hook_z`` (B, N, H, D; z = o before the norm),
    ``hook_decay`` Λ (1, H, c, c) (replaceable; when set the call runs as one block, c = N),
    ``hook_state`` S after the call's last token (with a cache, what it keeps),
    ``hook_gate`` σ(x W_g) (B, N, H·D). Time O(B·H·N·(c + D)·D); decoding O(H·D²) per token.
    """

    def __init__(self, c, index: int):
        super().__init__()
        who = "DecoderConfig.mixer_options['lightning']"
        options = dict(c.mixer_options.get("lightning") or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise validate.unknown_options(unknown, sorted(OPTIONS), owner=who)
        self.block = validate.positive_int(options.get("block", OPTIONS["block"]), "block",
                                           owner=who)
        e, h, d = c.hidden_size, c.num_heads, c.head_dim
        self.num_heads, self.head_dim = h, d
        self.qkv_proj = Linear(e, 3 * h * d, bias=False)
        self.output_gate = Linear(e, h * d, bias=False)
        self.norm = DecoderRMSNorm(h * d, eps=1e-6)
        self.out_proj = Linear(h * d, e, bias=False)
        # the rates s_h (host float64): MiniMax's slopes scaled by the layer's depth
        self.slopes = lightning_slopes(h, index, c.num_layers)
        for name in ("q", "k", "v", "z", "decay", "state", "gate"):
            setattr(self, f"hook_{name}", HookPoint())

    @classmethod
    def parameter_count(cls, c) -> int:
        """5·E·H·D + H·D: the four projections' matrices and the norm's gain."""
        return 5 * c.hidden_size * c.num_heads * c.head_dim + c.num_heads * c.head_dim

    @classmethod
    def state_numbers(cls, c, tokens: int) -> int:
        """H·D² per sequence once a token is seen: the state does not grow."""
        return c.num_heads * c.head_dim ** 2 if tokens else 0

    def new_cache(self):
        """An empty ``RecurrentState``: S and the number of tokens seen."""
        return RecurrentState()

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` (B, cached + N) bool, False = padding;
        ``positions`` is not read (the decays order the tokens)."""
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        if kv_cache is not None and not isinstance(kv_cache, RecurrentState):
            raise TypeError("LightningMixer: kv_cache must be a RecurrentState (from "
                            f"new_cache()), got {type(kv_cache).__name__}")
        qkv = silu(self.qkv_proj(x))                                   # (B, N, 3·H·D)
        if keep is not None:                     # padding adds nothing to the state
            qkv = masked_fill(qkv, ~keep[:, -n:, None], 0.0)
        qkv = qkv.reshape(b, n, h, 3 * d).transpose(0, 2, 1, 3)        # (B, H, N, 3D)
        q, k, v = (hooked_heads(hook, qkv[..., i * d:(i + 1) * d]) for i, hook in
                   enumerate((self.hook_q, self.hook_k, self.hook_v)))
        # blocks of c tokens from the cached state (one block when Λ is hooked)
        state = None if kv_cache is None else kv_cache.tensor()
        if self.hook_decay.active:
            z, state = lightning_block(q, k, v, self.slopes, state, hook_decay=self.hook_decay)
        else:
            z, state = lightning_blocks(q, k, v, self.slopes, self.block, state)  # (B, H, N, D)
        state = self.hook_state(state)
        if kv_cache is not None:
            kv_cache.update(state, n)                 # its values: no graph is kept
        # RMSNorm over all heads, the sigmoid gate from the input, then out
        z = merge_heads(hooked_heads(self.hook_z, z))                   # (B, N, H·D)
        gate = self.hook_gate(sigmoid(self.output_gate(x)))
        return self.out_proj(gate * self.norm(z))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, block={self.block}"
