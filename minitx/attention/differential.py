r"""Differential attention: the difference of two softmax maps cancels common-mode noise.

Ye, Dong, Xia, Sun, Zhu, Huang & Wei (2024), "Differential Transformer".

Softmax attention never gives a key exactly zero weight, so every query spends some of its
mass on irrelevant context ("attention noise"). Differential attention computes two maps from
two halves of the query and key and subtracts one from the other, as a differential amplifier
subtracts the noise two inputs share. With [Q₁; Q₂] = X W_Q and [K₁; K₂] = X W_K (each half of
width d), V = X W_V (width 2d), l the layer's depth (1 = the first layer) and λ_q1, λ_k1,
λ_q2, λ_k2 ∈ R^d learned (one λ per layer, shared by its heads):

$$
\operatorname{DiffAttn}(X) = \left( \operatorname{softmax}\!\left(
\frac{Q_1 K_1^\top}{\sqrt{d}} \right) - \lambda \operatorname{softmax}\!\left(
\frac{Q_2 K_2^\top}{\sqrt{d}} \right) \right) V,
\quad \lambda = e^{\lambda_{q_1} \cdot \lambda_{k_1}} - e^{\lambda_{q_2} \cdot \lambda_{k_2}}
+ \lambda_{\mathrm{init}},
\quad \lambda_{\mathrm{init}} = 0.8 - 0.6\, e^{-0.3 (l - 1)}
$$

Each head's output is normalised on its own (RMSNorm over its 2d features, the paper's
"GroupNorm") and scaled by (1 − λ_init), which keeps the gradient flow like a Transformer's:

$$
\mathrm{head}_h = (1 - \lambda_{\mathrm{init}})\,
\operatorname{RMSNorm}\!\left( \operatorname{DiffAttn}_h(X) \right),
\qquad y = [\mathrm{head}_1; \dots; \mathrm{head}_H]\, W_O
$$

With ``rope=True`` each half Q₁, Q₂, K₁, K₂ is rotated by its token's position first (RoPE
on every half-head of width d, pairs (2i, 2i + 1), θ_i = base^(−2i/d)), as in the paper's
code; the scores above then read (R Q₁)(R K₁)ᵀ and (R Q₂)(R K₂)ᵀ.

Each row of the map softmax(·) − λ softmax(·) sums to 1 − λ, not 1, and its entries can be
negative: it is a different score function, not an approximation of softmax attention.

**Differences from the official code** (the authors' ``MultiheadDiffAttn``):

- RoPE: the official layer always rotates every query/key half-head; here it is the
  ``rope`` option (False by default, so the layer takes whatever positions a model gives it;
  ``GPTConfig(attention="diff", position="none", attention_options={"rope": True})`` is the
  official arrangement — ``position="rope"`` selects the ``rope`` variant itself and so is
  refused beside ``diff``). With ``rope=True`` the layer equals a torch transcription of the
  official equations (tested, outputs and gradients, and through a KV cache).
- Grouped heads: with Hkv < H, query head h reads both halves of key/value head
  h // (H/Hkv); the official code repeats key *half*-heads instead, which pairs a head's two
  queries with one half (the two agree for Hkv = H).
- The head count is given per differential head, as the official code's: ``diff`` with H
  heads (each of width D = E/H, halves d = D/2) is the paper's model with H heads, which it
  compares with a Transformer of 2H heads.
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, manual_seed, to_host, xp as active_xp
from ..nn import init
from ..nn.hooks import HookPoint
from ..nn.layers import RMSNorm
from ..nn.module import Parameter

# Each of the two maps is ordinary softmax attention, so the scores and the attention op are
# reused from ``ops``; only the weighted difference P₁ − λP₂ is new here.
from ..ops.activation import softmax
from ..ops.linalg import matmul
from ..ops.sdpa import attention_scores, scaled_dot_product_attention
from .base import (AttentionBase, causal_pattern, check_heads, register, repeat_kv,
                   repeat_kv_array, softmax_rows_array)
from .positions import apply_rope

__all__ = ["lambda_init_for_depth", "DifferentialAttention"]


def lambda_init_for_depth(layer_index: int) -> float:
    """The module docstring's λ_init for the paper's 1-based depth l = layer_index + 1 (minitx
    counts layers from 0): 0.2 for the first layer, rising towards 0.8."""
    layer_index = validate.nonnegative_int(layer_index, "layer_index", owner="diff")
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


@register("diff")
class DifferentialAttention(AttentionBase):
    r"""Differential attention: two softmax maps from split query/key halves, the second
    subtracted with a learned weight λ, each head RMS-normalised.

    Formula: the module docstring's head_h = (1 − λ_init) RMSNorm((P₁ − λ P₂) v), with
    P₁ = softmax(q₁k₁ᵀ/√d + M) and P₂ = softmax(q₂k₂ᵀ/√d + M) from the halves of each head's
    q and k (M the causal or given mask), RoPE on each half with ``rope``; its differences
    from the official code are listed there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D), D = E/H even, d = D/2 (keys at positions
    0 … Nk − 1, queries at the last Nq, for RoPE); P₁, P₂ (B, H, Nq, Nk); λ (1,). The
    projections are exactly ``mha``'s (same parameters), plus λ_q1, λ_k1, λ_q2, λ_k2 (d,)
    and the RMSNorm weight (D,), shared by the heads.

    Options: ``layer_index`` l − 1 (0-based depth, default 0; GPT and the transformer stacks
    fill it in), ``lambda_init`` (None → from ``layer_index``; a number fixes it), ``eps``
    of the RMSNorm (1e-5, the paper's), ``rope`` (False; True rotates every half-head as the
    paper's code, d even, so D a multiple of 4), ``base`` (RoPE's, 10000.0), plus
    ``causal``, ``num_kv_heads``, ``bias``.

    Complexity: {complexity}; two maps of half width, so the same as ``mha``.

    Exactness: a different score function (tested against its own dense formula,
    ``reference``): rows of P₁ − λP₂ sum to 1 − λ and may be negative. kind "score".

    Reference: Ye, Dong, Xia, Sun, Zhu, Huang & Wei (2024), "Differential Transformer".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "score"
    supports_attn_mask = True
    supports_kv_cache = True
    model_options = ("layer_index",)

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, bias=True,
                 layer_index: int = 0, lambda_init: float = None, eps: float = 1e-5,
                 rope: bool = False, base: float = 10000.0):
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         bias=bias)
        # Each head splits into two query/key halves of width d = D/2, so D must be even; λ_init
        # follows the depth unless a number is given.
        who = "diff"
        if self.head_dim % 2:
            raise validate.OptionError(f"{who}: the head dim embed_dim/num_heads must be even "
                                       f"(two query/key halves), got {self.head_dim}")
        self.layer_index = layer_index                      # validated by the property
        self._lambda_init = None if lambda_init is None else \
            validate.real(lambda_init, "lambda_init", owner=who)
        half = self.head_dim // 2
        self.rope = validate.boolean(rope, "rope", owner=who)
        self.base = validate.positive_real(base, "base", owner=who)
        if self.rope and half % 2:
            raise validate.OptionError(f"{who}: rope=True rotates pairs of each half-head, so "
                                       f"the head dim embed_dim/num_heads must be a multiple "
                                       f"of 4, got {self.head_dim}")
        # λ's four vectors, N(0, 0.1²) as in the paper's code
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, Parameter(active_xp().zeros((half,), dtype="float32")))
            init.normal_(getattr(self, name), 0.0, 0.1)
        self.head_norm = RMSNorm(self.head_dim, eps=validate.positive_real(eps, "eps",
                                                                           owner=who))
        self.hook_pattern1 = HookPoint()     # (B, H, N, Nk) the first map P₁
        self.hook_pattern2 = HookPoint()     # (B, H, N, Nk) the second map P₂
        self.hook_pattern = HookPoint()      # (B, H, N, Nk) P₁ − λ P₂, the map V is read with
        self.hook_lambda = HookPoint()       # (1,) λ

    # ---- depth and λ ---------------------------------------------------------------------
    @property
    def layer_index(self) -> int:
        """The 0-based depth; the stacks set it on each copy of a layer."""
        return self._layer_index

    @layer_index.setter
    def layer_index(self, value):
        self._layer_index = validate.nonnegative_int(value, "layer_index", owner="diff")

    @property
    def lambda_init(self) -> float:
        """λ_init: the ``lambda_init`` given, else the paper's schedule at ``layer_index``."""
        if self._lambda_init is not None:
            return self._lambda_init
        return lambda_init_for_depth(self.layer_index)

    def lambda_value(self):
        """The module docstring's λ, a differentiable (1,) Tensor."""
        first = (self.lambda_q1 * self.lambda_k1).sum(axis=-1, keepdims=True).exp()
        second = (self.lambda_q2 * self.lambda_k2).sum(axis=-1, keepdims=True).exp()
        return first - second + self.lambda_init

    # ---- the attention -------------------------------------------------------------------
    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        check_heads(q, k, v, f"{self.name}.attend")
        if q.shape[-1] % 2 or v.shape[-1] != self.head_dim:
            raise ValueError(f"diff.attend: q/k must have an even width and v the head dim "
                             f"{self.head_dim}, got q {tuple(q.shape)}, v {tuple(v.shape)}")
        half = q.shape[-1] // 2
        q1, q2 = q[..., :half], q[..., half:]                        # (B, H, Nq, d) each
        k1, k2 = k[..., :half], k[..., half:]                        # (B, Hkv, Nk, d) each
        if self.rope:
            # every half-head rotated by position: keys 0 … Nk − 1, queries the last Nq
            nq, nk = q.shape[2], k.shape[2]
            q1, q2 = (apply_rope(t, offset=nk - nq, base=self.base) for t in (q1, q2))
            k1, k2 = (apply_rope(t, base=self.base) for t in (k1, k2))
        lam = self.hook_lambda(self.lambda_value())                  # (1,)
        opts = dict(attn_mask=attn_mask, is_causal=self.causal, scale=1.0 / math.sqrt(half),
                    enable_gqa=True)
        if any(p.active for p in (self.hook_pattern, self.hook_pattern1, self.hook_pattern2)):
            # the composed form: both maps and their difference formed, for the hooks
            p1 = self.hook_pattern1(softmax(attention_scores(q1, k1, **opts), axis=-1))
            p2 = self.hook_pattern2(softmax(attention_scores(q2, k2, **opts), axis=-1))
            pattern = self.hook_pattern(p1 - lam * p2)               # (B, H, Nq, Nk)
            out = matmul(pattern, repeat_kv(v, q.shape[1]))          # (B, H, Nq, D)
        else:
            # (P₁ − λP₂) V = P₁V − λ P₂V: two fused attentions, no map kept
            out = scaled_dot_product_attention(q1, k1, v, **opts) - \
                lam * scaled_dot_product_attention(q2, k2, v, **opts)
        # each head on its own: RMSNorm over its D features, then (1 − λ_init)
        return self.head_norm(out) * (1.0 - self.lambda_init)

    def reference(self, q, k, v):
        """Raw arrays: the formula with both maps formed densely, (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        nq, nk, half = q.shape[2], k.shape[2], q.shape[3] // 2
        allowed = causal_pattern(nq, nk, xp) if self.causal else None
        halves = [(q[..., s], k[..., s]) for s in (slice(0, half), slice(half, None))]
        if self.rope:
            # the rotation as a phase: ⟨R_i q, R_j k⟩ = Re Σ_t q_t conj(k_t) e^{i(i − j)θ_t}
            theta = self.base ** (-2.0 * xp.arange(half // 2) / half)             # (d/2,)
            dist = xp.arange(nk - nq, nk)[:, None] - xp.arange(nk)[None, :]       # (Nq, Nk)
            phase = xp.exp(1j * dist[:, :, None] * theta)                         # (Nq, Nk, d/2)
            scores = [xp.einsum("bhit,bhjt,ijt->bhij", a[..., 0::2] + 1j * a[..., 1::2],
                                (c[..., 0::2] + 1j * c[..., 1::2]).conj(), phase).real
                      for a, c in halves]
        else:
            scores = [xp.einsum("bhid,bhjd->bhij", a, c) for a, c in halves]
        p = [softmax_rows_array(s / math.sqrt(half), allowed) for s in scores]
        lam = self.lambda_value().data.astype(q.dtype)                # (1,)
        o = (p[0] - lam * p[1]) @ v                                  # (B, H, Nq, D)
        o = o / xp.sqrt((o * o).mean(axis=-1, keepdims=True) + self.head_norm.eps)
        return o * self.head_norm.weight.data.astype(q.dtype) * (1.0 - self.lambda_init)

    # ---- the proofs the site shows --------------------------------------------------------
    @classmethod
    def identities(cls, seed=0):
        """(claim, value, limit) in float64: rows of P₁ − λP₂ sum to 1 − λ; the fused form
        (two SDPAs) equals the composed one (both maps formed); decoding through a KVCache
        equals the full causal forward."""
        e, h = 16, 2
        manual_seed(seed)
        layer = cls(e, h, causal=True, layer_index=2).double()
        x = Tensor(active_xp().asarray(host_xp.random.default_rng(seed).standard_normal(
            (2, 9, e))))
        maps = []
        with no_grad():
            # unhooked: two fused SDPAs; with hook_pattern set: both maps formed
            fused = to_host(layer(x).data)
            layer.hook_pattern.add_hook(lambda p, hook: maps.append(to_host(p.data)))
            composed = to_host(layer(x).data)
            layer.reset_hooks()
            lam = float(to_host(layer.lambda_value().data)[0])
            # a prefill of 4 tokens, then one at a time, through a KVCache
            cache = layer.new_cache()
            steps = [layer(x[:, :4], kv_cache=cache)] + \
                [layer(x[:, t:t + 1], kv_cache=cache) for t in range(4, 9)]
            decoded = host_xp.concatenate([to_host(s.data) for s in steps], axis=1)
        return [("rows of P₁ − λP₂ sum to 1 − λ, max |Σ_j − (1 − λ)|",
                 float(abs(maps[0].sum(axis=-1) - (1.0 - lam)).max()), 1e-12),
                ("fused (P₁V − λP₂V) − composed ((P₁ − λP₂)V), max |Δ|",
                 float(abs(fused - composed).max()), 1e-12),
                ("decoding through a KVCache − full forward, max |Δ|",
                 float(abs(decoded - fused).max()), 1e-12)]

