r"""What some families add to a decoder layer's plain attention (``decoder.DecoderAttention``),
one class each; ``attention_class`` composes those a configuration switches on, so a reader
of Llama's attention meets none of them.

- ``QKNorm`` (``qk_norm``): RMSNorm on q and k before the rotation, per head over D (Qwen3,
  Gemma 3) or over the whole projection (OLMo 2); keeps the logits from growing. Llama 4 and
  nanochat normalise each head after the rotation instead, without a gain ("after_rope"; a
  NoPE layer has none).
- ``OutputGate`` (``attn_output_gate``, Qwen3-Next): q_proj also yields a gate g per output
  element, and the heads' output becomes z ⊙ σ(g) before o_proj, so a head may switch
  itself off.
- ``SoftCapped`` (``attn_logit_softcap``, Gemma 2): each score s becomes c·tanh(s / c),
  before the mask (a masked −∞ would be capped to −c).
- ``Sinks`` (``attn_sinks``, gpt-oss): a learned logit σ_h per head is one more term in each
  row's softmax, with no value behind it, so a head may attend to nothing:

$$
p_{ij} = \frac{e^{s_{ij}}}{e^{\sigma_h} + \sum_{j'} e^{s_{ij'}}}
$$

The last two change the scores or their softmax, which the fused attention op does not do:
both write attention out (``Composed``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import functools
import math

from .. import backend
from ..nn.decoder_layers import DecoderRMSNorm, softcap
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from ..ops.activation import softmax
from ..ops.elementwise import sigmoid
from ..ops.indexing import getitem, masked_fill
from ..ops.linalg import matmul
from ..ops.sdpa import attention_scores, merge_heads, repeat_kv, split_heads
from ..ops.shape import broadcast_to, concatenate, reshape
from .decoder_attention import DecoderAttention, norm_layer

if TYPE_CHECKING:                       # a type only: decoder.py imports this module
    from .decoder import DecoderConfig

__all__ = ["QKNorm", "OutputGate", "Composed", "SoftCapped", "Sinks", "attention_class"]


class QKNorm(DecoderAttention):
    """``q_norm``/``k_norm`` over D per head (``qk_norm="head"``) or over the whole
    projection (``"proj"``: H·D and Hkv·D), before the rotation; or over D per head after it,
    weightless (``"after_rope"``: no parameters). Hook points ``hook_q_normed``/
    ``hook_k_normed``, laid out as the norm sees them ((B, H, N, D) per head, (B, N, H·D) over
    the projection). TransformerLens hooks q and k before the norm (``hook_q``), as here."""

    def __init__(self, c: DecoderConfig, sliding: bool = False, index: int = 0):
        super().__init__(c, sliding, index)
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        self.kind = c.qk_norm
        self.per_head = c.qk_norm != "proj"
        if self.kind == "after_rope":
            self.q_norm = self.k_norm = None   # one weightless norm, on rotating layers only
            self.l2_norm = DecoderRMSNorm(d, eps=c.norm_eps, affine=False)
        else:
            self.q_norm = norm_layer(c, d if self.per_head else h * d)
            # a layer that borrows its keys normalises none
            self.k_norm = None if self.borrows else norm_layer(c, d if self.per_head else hkv * d)
        self.hook_q_normed, self.hook_k_normed = HookPoint(), HookPoint()

    def rotated(self, q, k):
        if self.kind != "after_rope":
            return q, k
        return (self.hook_q_normed(self.l2_norm(q)),
                None if k is None else self.hook_k_normed(self.l2_norm(k)))

    def normed(self, q, k):
        if self.kind == "after_rope":
            return q, k
        if self.per_head:                                              # (B, H, N, D)
            return (self.hook_q_normed(self.q_norm(q)),
                    None if k is None else self.hook_k_normed(self.k_norm(k)))
        q = split_heads(self.hook_q_normed(self.q_norm(merge_heads(q))), self.num_heads)
        if k is not None:
            k = split_heads(self.hook_k_normed(self.k_norm(merge_heads(k))), self.num_kv_heads)
        return q, k

    def extra_repr(self) -> str:
        return super().extra_repr() + f", qk_norm={self.kind!r}"


class OutputGate(DecoderAttention):
    """q_proj (E → 2·H·D) gives each head's rows as [q_h (D), g_h (D)] (HF's layout); the
    gate, before its sigmoid, is seen by ``hook_out_gate`` (B, N, H·D)."""
    query_width = 2

    def __init__(self, c: DecoderConfig, sliding: bool = False, index: int = 0):
        super().__init__(c, sliding, index)
        self.hook_out_gate = HookPoint()

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        qg = reshape(self.q_proj(x), (b, n, h, 2 * d))
        q, gate = (reshape(qg[..., s], (b, n, h * d)) for s in (slice(0, d), slice(d, None)))
        z = self.heads(x, q, kv_cache, keep, positions)                 # (B, N, H·D)
        return self.o_proj(z * sigmoid(self.hook_out_gate(gate)))


class Composed(DecoderAttention):
    """Attention written out, scores → ``capped`` → mask → ``weights`` → values, for the
    additions below; here the cap is none and the weights a softmax."""
    needs_scores = True

    def attend(self, q, k, v, allowed):
        s = attention_scores(q, k, scale=self.scale, enable_gqa=True)      # (B, H, Nq, Nk)
        s = self.hook_attn_scores(masked_fill(self.capped(s), ~allowed, -math.inf))
        p = self.hook_pattern(self.weights(s))
        return matmul(p, repeat_kv(v, self.num_heads))                     # (B, H, Nq, D)

    def capped(self, s):
        return s

    def weights(self, s):
        return softmax(s, axis=-1)


class SoftCapped(Composed):
    """c·tanh(s / c) on the scores, c = ``attn_logit_softcap``."""

    def __init__(self, c: DecoderConfig, sliding: bool = False, index: int = 0):
        super().__init__(c, sliding, index)
        self.logit_softcap = c.attn_logit_softcap

    def capped(self, s):
        return softcap(super().capped(s), self.logit_softcap)


class Sinks(Composed):
    """``sinks`` (H,), σ_h: the softmax over [s_i1 … s_iNk, σ_h], then the sink's column
    dropped, so ``hook_pattern``'s rows sum to less than 1."""

    def __init__(self, c: DecoderConfig, sliding: bool = False, index: int = 0):
        super().__init__(c, sliding, index)
        self.sinks = Parameter(backend.xp().zeros((c.num_heads,),
                                                  dtype=backend.default_float()))

    def weights(self, s):
        b, h, nq, nk = s.shape
        sink = broadcast_to(reshape(self.sinks, (1, h, 1, 1)), (b, h, nq, 1))
        return getitem(softmax(concatenate([s, sink], axis=-1), axis=-1),
                       (slice(None), slice(None), slice(None), slice(0, nk)))


def attention_class(c: DecoderConfig) -> type:
    """The attention of a (non-latent) layer of ``c``: ``DecoderAttention`` with the additions
    its switches turn on, in one fixed order."""
    return _compose(tuple(cls for cls, on in (
        (OutputGate, c.attn_output_gate), (QKNorm, c.qk_norm is not None),
        (SoftCapped, c.attn_logit_softcap is not None), (Sinks, c.attn_sinks)) if on))


@functools.lru_cache(maxsize=None)
def _compose(additions: tuple) -> type:
    if not additions:
        return DecoderAttention
    if len(additions) == 1:
        return additions[0]
    name = "".join(cls.__name__ for cls in additions) + "Attention"
    return type(name, additions, {"__module__": __name__,
                                  "__doc__": " + ".join(cls.__name__ for cls in additions)})
