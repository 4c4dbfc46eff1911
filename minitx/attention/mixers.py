r"""Token mixers that replace attention: FNet (Fourier) and AFT (attention-free transformer).

FNet — Lee-Thorp, Ainslie, Eckstein & Ontañón (2022), "FNet: Mixing Tokens with Fourier
Transforms": a 2-d discrete Fourier transform over the sequence and hidden axes, real part,

$$
y = \operatorname{Re}\left( \mathcal{F}_{\mathrm{seq}}\!\left(
\mathcal{F}_{\mathrm{hidden}}(x) \right) \right) = \operatorname{Re}(F_N X F_E)
$$

with the symmetric DFT matrices F. No parameters, O(N·E·(log N + log E)) time, exact (a
fixed linear map). Its gradient: for a real upstream gradient G,
dL/dX = Re(F_N G F_E) = Re(FFT2(G)) — the same transform.

AFT — Zhai, Talbott, Srivastava, Huang, Goh, Zhang & Susskind (2021), "An Attention Free
Transformer":

$$
y_t = \sigma(q_t) \odot \frac{\sum_{t'} \exp(k_{t'} + w_{t t'}) \odot v_{t'}}
{\sum_{t'} \exp(k_{t'} + w_{t t'})}
$$

is AFT-full; AFT-simple is the same with w = 0, a softmax over positions of k per feature.

elementwise over features (no q·k dot product); w (max_len, max_len) learned pairwise
position biases. Bidirectional: computed as exp(w) @ (exp(k) ⊙ v) — O(N²·D) time, O(N² + N·D)
memory for full; O(N·D) for simple. Stabilised by subtracting constants that cancel in the
ratio: max over positions of k per feature, and the row max of w. Causal: the (N, N, D)
exponents are formed and each row is shifted by its max over the visible positions t' ≤ t
only (a shift shared by prefix sums would have to include future positions; see ``aft``),
O(N²·D) time and memory for both variants.
Both are kind "score" (a different mixing rule, tested against its own dense formula).
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import AttentionBase, check_heads, register, repeat_kv, repeat_kv_array

__all__ = ["fourier_mix", "FNetMixing", "aft", "AFTAttention"]


# Re(FFT2) is a fixed linear map with symmetric DFT matrices, so its backward is the same
# transform applied to the gradient.
class _FourierMix(Function):
    @staticmethod
    def forward(ctx, x, axes):
        xp = get_array_module(x)
        ctx.axes = axes
        return xp.fft.fft2(x, axes=axes).real.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        return xp.fft.fft2(grad, axes=ctx.axes).real.astype(grad.dtype, copy=False), None


def fourier_mix(x, axes=(-2, -1)):
    """Re(FFT2(x)) over ``axes`` (default: the last two, sequence and hidden). Same shape."""
    return _FourierMix.apply(x, tuple(axes))


@register("fnet")
class FNetMixing(AttentionBase):
    r"""FNet Fourier mixing: a parameter-free 2-d DFT replaces attention. Bidirectional only.

    Formula: the module docstring's FNet for ``layer(x)``; ``attend`` applies the same 2-d
    transform over (N, D) to v, per head (q and k unused).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E), mixed directly — no projections, as in
    the paper (the layer has no parameters at all); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D).

    Options: none of its own; ``causal=True`` raises ValueError.

    Complexity: {complexity}; a complex intermediate.

    Exactness: a different score function (tested against its own dense formula,
    ``reference``: explicit DFT matrices): a fixed linear map, not an approximation.

    Reference: Lee-Thorp, Ainslie, Eckstein & Ontañón (2022), "FNet: Mixing Tokens with
    Fourier Transforms".
    """

    complexity = "time O(B·N·E·(log N + log E)), memory O(B·N·E)"

    kind = "score"
    supports_causal = False
    projections = ()               # no projections at all, as in the paper
    head_hooks = False             # no q, k, v: it mixes x itself

    def __init__(self, embed_dim, num_heads, causal=False, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.hook_mixed = HookPoint()      # (B, N, E) Re(FFT_seq(FFT_hidden(x))), the output

    def forward(self, x):
        """x (B, N, E) → Re(FFT_seq(FFT_hidden(x))) (B, N, E)."""
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"FNetMixing: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        return self.hook_mixed(fourier_mix(x, (1, 2)))

    def attend(self, q, k, v):
        """(B, H, N, D) heads → Re(FFT2 over (N, D) of v); q and k unused."""
        _, h, *_ = check_heads(q, k, v, self.name)
        return fourier_mix(repeat_kv(v, h), (2, 3))

    def reference(self, q, k, v):
        """Raw arrays: the same transform with explicit DFT matrices."""
        xp = get_array_module(v)
        v = repeat_kv_array(v, q.shape[1])
        n, d = v.shape[-2:]
        fn = xp.exp(-2j * math.pi * xp.outer(xp.arange(n), xp.arange(n)) / n)
        fd = xp.exp(-2j * math.pi * xp.outer(xp.arange(d), xp.arange(d)) / d)
        return (fn @ v @ fd).real


def aft(q, k, v, w=None, causal: bool = False):
    """AFT on heads: q, k (B, H, N, D), v (B, H, N, Dv=D) Tensors; w (N, N) Tensor or None
    (AFT-simple). Returns (B, H, N, D).

    Stabilising shifts. y_td = Σ_t' e^(k_t'd + w_tt') v_t'd / Σ_t' e^(k_t'd + w_tt') is a
    ratio in which every term of the output (t, d) carries the same factor e^(−s_td) for any
    s_td that does not depend on t', so subtracting s_td from all its exponents changes
    nothing mathematically; numerically, s_td should be the largest exponent *among the terms
    that row t may see*, so that the biggest visible term is e^0 = 1 and the denominator is
    ≥ 1 (no 0/0 = NaN, no overflow).

    - Bidirectional: every position is visible to every row, so the factorised shift
      s_td = max_t' k_t'd + max_t' w_tt' (a per-feature max of k, a row max of w) is a max
      over allowed positions, and the fast forms exp(w) @ (exp(k) ⊙ v) (full) and plain sums
      (simple) can be used. (For full, the visible maximum of k + w can still sit far below
      max k + max w when large k and large w never coincide — the paper's shift, kept for its
      O(N² + N·D) memory.)
    - Causal: the visible terms of row t are t' ≤ t. A shift shared by the prefix sums /
      the exp(w) @ (exp(k) ⊙ v) product must be one constant for every row, i.e. it would have
      to include the future positions' maxima, and a large future k_t'd or w_tt' then
      underflows every visible term of the early rows (0/0). A prefix (running) max of k is
      no way out: it is a different shift per *key*, which does not cancel in a prefix sum
      shared by all later rows. So the causal path forms the (B, H, N, N, D) exponents
      k_t'd + w_tt' explicitly, masks t' > t to −∞ and subtracts s_td = max_{t' ≤ t} of them:
      each row's shift depends on visible positions only, and is treated as a constant in
      backward (its true derivative contribution is zero, since the output does not depend
      on it). Cost: O(B·H·N²·D) time and memory, also for AFT-simple.
    """
    xp = get_array_module(k.data)
    n = k.shape[2]
    # Bidirectional: one shift per feature (max of k) and one per row (max of w), then the
    # O(N² + N·D) product form exp(w) @ (exp(k) ⊙ v).
    if not causal:
        ek = F.exp(k - Tensor._wrap(k.data.max(axis=2, keepdims=True)))    # per-feature shift
        if w is None:                                                        # AFT-simple
            num, den = (ek * v).sum(axis=2, keepdims=True), ek.sum(axis=2, keepdims=True)
        else:                                                                # AFT-full
            ew = F.exp(w - Tensor._wrap(w.data.max(axis=-1, keepdims=True)))   # row shift
            num = F.matmul(ew, ek * v)                                   # (N, N) @ (B, H, N, D)
            den = F.matmul(ew, ek)
        return F.sigmoid(q) * (num / den)
    # Causal: explicit (t, t', D) exponents k_t' + w_tt', the future masked to −∞, each row
    # shifted by its own visible max.
    bias = Tensor._wrap(xp.zeros((n, n), dtype=k.dtype)) if w is None else w
    logits = F.expand_dims(k, 2) + F.reshape(bias, (n, n, 1))            # (B, H, t, t', D)
    future = ~xp.tri(n, dtype=bool)[:, :, None]                          # t' > t, (N, N, 1)
    logits = F.masked_fill(logits, future, -math.inf)
    shift = logits.data.max(axis=3, keepdims=True)                       # visible max, finite
    e = F.exp(logits - Tensor._wrap(shift))                              # future terms: 0
    num = (e * F.expand_dims(v, 2)).sum(axis=3)                          # (B, H, N, D)
    den = e.sum(axis=3)                                                  # ≥ 1
    return F.sigmoid(q) * (num / den)


@register("aft")
class AFTAttention(AttentionBase):
    r"""Attention Free Transformer: elementwise gating with learned pairwise position biases.

    Formula: the module docstring's AFT (causal: t' ≤ t), elementwise over features, no q·k
    product; bidirectional: computed as exp(w) @ (exp(k) ⊙ v) with stabilising shifts that
    cancel; causal: explicit (N, N, D) exponents, each row shifted by its max over the
    visible positions only (so large future values cannot underflow the past to 0/0).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D) (value dim must equal D); parameter w (max_len,
    max_len) for "full", zero-initialised.

    Options: ``variant`` ("full" default, or "simple"), ``max_len`` (default 128; "full"
    raises for longer sequences), ``causal`` (False).

    Complexity: {complexity}.

    Exactness: a different score function (tested against its own dense formula,
    ``reference``); w is learned.

    Reference: Zhai, Talbott, Srivastava, Huang, Goh, Zhang & Susskind (2021), "An Attention
    Free Transformer".
    """

    complexity = ("time O(B·H·N²·D), memory O(N² + B·H·N·D) (full); simple: time and memory "
                  "O(B·H·N·D); causal: time and memory O(B·H·N²·D)")

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, variant: str = "full",
                 max_len: int = 128, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.variant = validate.choice(variant, "variant", ("full", "simple"), owner="aft")
        self.hook_position_bias = HookPoint()   # (N, N) w_tt' it mixes with ("full" only)
        self.hook_gate = HookPoint()            # (B, H, N, D) σ(Q), the output's gate
        self.max_len = validate.positive_int(max_len, "max_len", owner="aft")
        if variant == "full":
            self.w = Parameter(active_xp().zeros((max_len, max_len), dtype="float32"))

    # w is sliced to the sequence's (N, N) corner; a sequence longer than max_len has no bias.
    def _bias(self, n):
        if self.variant == "simple":
            return None
        if n > self.max_len:
            raise ValueError(f"aft: sequence length {n} exceeds max_len={self.max_len}")
        return F.getitem(self.w, (slice(0, n), slice(0, n)))

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D)."""
        _, h, _, nq, nk, d = check_heads(q, k, v, self.name)
        if v.shape[-1] != d or nq != nk:
            raise ValueError(f"aft: needs value dim == head dim {d} and equal lengths, got "
                             f"value dim {v.shape[-1]}, lengths {nq} and {nk}")
        bias = self._bias(nq)
        if bias is not None:
            bias = self.hook_position_bias(bias)
        out = aft(q, repeat_kv(k, h), repeat_kv(v, h), bias, self.causal)
        if self.hook_gate.active:                  # read-only: σ(Q) is applied inside aft
            self.hook_gate(F.sigmoid(q))
        return out

    def reference(self, q, k, v):
        """Raw arrays: the (N, N, D) formula of the paper, (B, H, N, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        n = q.shape[2]
        w = xp.zeros((n, n)) if self.variant == "simple" else self.w.data[:n, :n].astype(q.dtype)
        logits = k[:, :, None, :, :] + w[None, None, :, :, None]        # (B, H, t, t', D)
        if self.causal:
            logits = xp.where(xp.tri(n, dtype=bool)[None, None, :, :, None], logits, -xp.inf)
        e = xp.exp(logits - logits.max(axis=3, keepdims=True))
        y = (e * v[:, :, None]).sum(3) / e.sum(3)
        return 1 / (1 + xp.exp(-q)) * y
