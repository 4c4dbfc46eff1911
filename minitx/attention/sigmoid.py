r"""Sigmoid attention: every score through its own logistic function, no row normalisation.

Softmax attention turns a row of scores into a probability distribution: each weight depends
on every other score of its row through the normaliser Σ_j e^{s_ij}. Sigmoid attention
(Ramapuram et al. 2024) replaces the softmax by an elementwise sigmoid and a constant bias:

$$
O = \sigma\!\left( \frac{Q K^\top}{\sqrt{D}} + b + M \right) V,
\qquad \sigma(x) = \frac{1}{1 + e^{-x}}, \qquad b = -\log n
$$

with n the sequence length the model is built for (GPT's ``block_size``) and M the mask
(−inf where masked: causal, bottom-right aligned, and any ``attn_mask``). Each weight
σ(s_ij + b) is a function of its own score alone; the weights of a row need not sum to one.

**Why b = −log n.** For s ≪ log n, σ(s − log n) ≈ e^{s}/n, so a row's weights sum to about
the *mean* of e^{s_ij} over its n keys: the output starts at the scale softmax attention has
(its normaliser is the sum of n such terms). Without b, every σ(s) ≈ ½ at initialisation and
an output row is about half the *sum* of n values: its norm grows with n, which the paper
finds destabilises early training.

**Why a tiled (flash-style) form needs no online rescaling.** Flash attention walks over key
tiles and must carry a running maximum and a running normaliser, rescaling the partial output
whenever the maximum changes, because softmax couples every weight of a row. Here
σ(s_ij + b) depends on s_ij alone, so the output row is a plain sum over key tiles T_1 … T_m:

$$
O_i = \sum_{t=1}^{m} \sum_{j \in T_t} \sigma(s_{ij} + b)\, v_j
$$

— accumulate each tile's σ(S_t + b) V_t and stop; nothing computed earlier is ever revised.
(The paper's FlashSigmoid kernel builds on exactly this.) ``identities`` and
``tests/attention/test_sigmoid.py`` compute the output tile by tile and compare.

**Masks.** A masked score is −inf, and σ(−inf) = 0 exactly, with gradient σ(1 − σ) = 0:
masked keys contribute exactly nothing, and a row with every key masked gives zeros, not NaN.

**Decoding.** b is a constant of the layer, not of the call, so a query attending to the keys
of a ``KVCache`` gets the same weights as in the full causal forward: cached decoding equals
the full forward exactly (tested through GPT in float64).
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host
from ..nn.hooks import HookPoint
from ..ops.elementwise import sigmoid
from ..ops.linalg import matmul
from ..ops.sdpa import attention_scores
from .base import (AttentionBase, causal_pattern, check_heads, register, repeat_kv,
                   repeat_kv_array)
from .kv_cache import KVCache

__all__ = ["SigmoidAttention", "sigmoid_bias"]


def sigmoid_bias(context_length: int) -> float:
    """The paper's constant score bias b (module docstring) for a context of n tokens."""
    n = validate.positive_int(context_length, "context_length", owner="sigmoid")
    return -math.log(n)


@register("sigmoid")
class SigmoidAttention(AttentionBase):
    """Sigmoid attention: each weight a sigmoid of its own score, no row normalisation.

    Formula: the module docstring's, per head, with n = ``context_length``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, attn_mask=None)``:
    q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D); scores and σ map (B, H, Nq, Nk).
    Hooks: ``hook_attn_scores`` S (−inf where masked), ``hook_pattern`` the unnormalised
    σ map P (0 where masked; rows need not sum to 1), with O = P V.

    Options: ``context_length`` n (default 1024; GPT fills in its ``block_size``, the one
    name this option has), ``causal`` (False), ``num_kv_heads`` (None → H), ``bias`` (True,
    the projections'). ``attn_mask`` bool (True = may attend) or float (added to S),
    broadcastable to (B, H, Nq, Nk); ``kv_cache`` a ``KVCache`` (decoding).

    Complexity: {complexity} (Nq·Nk in place of N² for Nq queries and Nk keys); a
    key-tiled form needs no running max or rescaling (module docstring).

    Exactness: a different score function (tested against its own dense formula,
    ``reference``). kind "score".

    Reference: Ramapuram, Danieli, Dhekane, Weers, Busbridge, Ablin et al. (2024), "Theory,
    Analysis, and Best Practices for Sigmoid Self-Attention".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "score"
    supports_kv_cache = True
    supports_attn_mask = True
    model_options = ("context_length",)

    def __init__(self, embed_dim, num_heads, causal=False, context_length: int = 1024,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.context_length = validate.positive_int(context_length, "context_length",
                                                    owner="sigmoid")
        self.score_bias = sigmoid_bias(self.context_length)        # b
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_attn_scores = HookPoint()   # (B, H, Nq, Nk) Q Kᵀ/√D + b, −inf where masked
        self.hook_pattern = HookPoint()       # (B, H, Nq, Nk) σ of the scores, 0 where masked

    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, _, _, _, _ = check_heads(q, k, v, f"{self.name}.attend")
        # the scores with M (a float attn_mask is added here too); then + b
        scores = attention_scores(q, k, attn_mask=attn_mask, is_causal=self.causal,
                                  scale=self.scale, enable_gqa=True)   # (B, H, Nq, Nk)
        scores = self.hook_attn_scores(scores + self.score_bias)
        # σ entry by entry: a masked key gives exactly 0 (module docstring, "Masks")
        pattern = self.hook_pattern(sigmoid(scores))                    # (B, H, Nq, Nk)
        return matmul(pattern, repeat_kv(v, h))   # no division by a row sum: (…, Nk) @ (…, Nk, D)

    def reference(self, q, k, v):
        """Raw arrays: the module's formula with σ = exp(−log(1 + e^{−s})) and masked entries
        set to 0 (causal: bottom-right). (B, H, Nq, D)."""
        xp = get_array_module(q)
        k, v = repeat_kv_array(k, q.shape[1]), repeat_kv_array(v, q.shape[1])
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        s = xp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d) + self.score_bias
        p = xp.exp(-xp.logaddexp(0.0, -s))                     # σ(s), stable for both signs
        if self.causal:
            p = xp.where(causal_pattern(nq, nk, xp), p, 0.0)
        return p @ v

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of sigmoid attention's own identities: (claim, value, limit)."""
        hx = host_xp
        g = hx.random.default_rng(seed)
        layer = cls(8, 2, causal=True, context_length=32).to(dtype="float64").eval()
        q, k, v = (g.standard_normal((1, 2, 13, 4)) for _ in range(3))
        qt, kt, vt = (Tensor(a) for a in (q, k, v))
        out = layer.attend(qt, kt, vt).numpy()
        ref = to_host(layer.reference(qt.data, kt.data, vt.data))
        # the output summed over key tiles of 4 columns: no running max, no rescaling
        s = q @ k.swapaxes(-1, -2) / 2.0 + layer.score_bias           # 1/√D = 1/2
        s = hx.where(hx.tri(13, dtype=bool), s, -hx.inf)
        tiled = sum(1 / (1 + hx.exp(-s[..., t:t + 4])) @ v[:, :, t:t + 4]
                    for t in range(0, 13, 4))
        # decoding one token at a time through a KVCache vs the full causal forward
        x = g.standard_normal((1, 9, 8))
        full = layer(Tensor(x)).numpy()
        cache = KVCache()
        steps = hx.concatenate([layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy()
                                for t in range(9)], axis=1)
        return [("sum over key tiles of σ(S_t + b) V_t − whole σ(S + b) V, max |Δ|",
                 float(hx.abs(tiled - out).max()), 1e-12),
                ("attend − dense formula (reference), max |Δ|",
                 float(hx.abs(out - ref).max()), 1e-12),
                ("decoding through a KVCache − full causal forward, max |Δ|",
                 float(hx.abs(steps - full).max()), 1e-12)]
