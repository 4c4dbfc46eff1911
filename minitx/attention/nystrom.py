r"""Nyströmformer: softmax attention through m landmarks and the Nyström method.

Xiong, Zeng, Chakraborty, Tan, Fung, Li & Singh (2021), "Nyströmformer: A Nyström-Based
Algorithm for Approximating Self-Attention".

The N × N softmax matrix S = softmax(Q Kᵀ/√D) is never formed. Pick m "landmark" queries Q̃
and keys K̃ (m ≪ N) and form three small softmax kernels instead: F (N × m), every query
against the landmark keys; A (m × m), landmarks against landmarks; B (m × N), the landmark
queries against every key:

$$
F = \operatorname{softmax}\!\left(\frac{Q \tilde K^\top}{\sqrt{D}}\right), \quad
A = \operatorname{softmax}\!\left(\frac{\tilde Q \tilde K^\top}{\sqrt{D}}\right), \quad
B = \operatorname{softmax}\!\left(\frac{\tilde Q K^\top}{\sqrt{D}}\right), \qquad
O = F A^{+} (B V) \approx S V
$$

Why this is the Nyström method: if the landmarks were m of the actual queries and keys, F
would be m columns of S, B m of its rows and A their intersection, and F A⁺ B is the
classical Nyström reconstruction of a matrix from some of its rows and columns — exact when
S has rank ≤ m, and in particular when the landmarks are all N tokens (then F = A = B = S
and S S⁺ S = S). The paper applies the softmax to each small product separately (the
softmax of a block is not the block of the softmax), which is what makes the cost linear.

**Landmarks: segment means.** The N positions are cut into m consecutive segments s_r and
each landmark is the mean of its segment's queries (keys):

$$
\tilde q_r = \frac{1}{|s_r|} \sum_{j \in s_r} q_j , \qquad
s_r = \left\{ j : \lfloor j m / N \rfloor = r \right\}
$$

so the segments hold ⌊N/m⌋ or ⌈N/m⌉ tokens each (none is empty, and every landmark is the
exact mean of its own segment; for N a multiple of m this is the paper's reshape-and-mean).
When m > N there cannot be m non-empty segments: the layer uses m' = min(m, N) landmarks, one
per token. With one landmark per token (m' = N) the layer computes S V exactly, as the
official code does (``exact_at_full``).

**A⁺ by iteration.** A's pseudo-inverse comes from the iteration of Razavi et al. (2014)
that the paper uses (matrix products only, so it runs as fast as attention itself):

$$
Z_0 = \frac{A^\top}{\lVert A \rVert_1 \lVert A \rVert_\infty}, \qquad
Z_{j+1} = \tfrac14 Z_j \left(13 I - A Z_j \left(15 I - A Z_j \left(7 I - A Z_j\right)\right)
\right)
$$

With E_j = I − A Z_j, expanding gives E_{j+1} = (3 E_j³ + E_j⁴)/4: third-order convergence
once ‖E_j‖ < 1. Z₀ makes A Z₀ = A Aᵀ/(‖A‖₁‖A‖∞) symmetric with eigenvalues
λ = σ²/(‖A‖₁‖A‖∞) ∈ (0, 1] (‖A‖₂² ≤ ‖A‖₁‖A‖∞), and every Z_j stays a polynomial in A Aᵀ
times Aᵀ, so each singular direction of A follows the scalar recursion
e ← (3e³ + e⁴)/4 from e₀ = 1 − λ. A direction with small λ first gains about ×3.25 per
iteration (e ≈ 1 − δ → 1 − 3.25 δ), then converges cubically; directions with σ = 0 stay
at e = 1 (Z is 0 there), which is what makes the limit the pseudo-inverse. Six iterations
(the paper's default) take e from 1 − λ to 2e-5 at λ = 10⁻², 0.03 at λ = 3·10⁻³ and 0.3 at
λ = 10⁻³: smaller singular values are left out, a built-in regularisation. More is not
always better: e = 1 is an unstable fixed point (slope 13/4), so when A is exactly
rank-deficient, rounding seeded in a null direction grows ×3.25 per iteration and Z drifts
from A⁺ after a few tens of iterations. ‖·‖₁ and ‖·‖∞ are the max column and row sums of |A|.

**Skip connection (optional).** The paper adds a depthwise convolution of V along the
sequence (kernel 33 in its experiments): out += conv(V), one kernel per head, zero padding
that keeps the length (``depthwise_sequence_conv``). It is off here by default
(``conv_kernel=None``), so the layer is the Nyström approximation alone and its error against
softmax attention means something.

Non-causal: F and B mix every position (a landmark averages future tokens), so
``causal=True`` raises ValueError at construction.

**Differences from the official code** (the authors' ``NystromAttention``, and HuggingFace's
``NystromformerSelfAttention``, which follows it):

- Adopted: with as many landmarks as tokens the official code computes softmax attention
  exactly instead of the iteration; so does this layer when m' = Nq = Nk
  (``exact_at_full=True``, the default; ``False`` keeps iterating: at N = 16 with q, k,
  v ~ N(0, 1), six iterations then leave max |O − O*| = 0.020, the switch 3e-16 — tested).
- Z₀'s norms are taken per (batch, head) matrix, as the paper writes them; the official
  code (HuggingFace's default ``init_option="original"``) takes one maximum over the whole
  batch, a smaller Z₀ for some matrices and so a different 6-iteration output.
- N need not be a multiple of m (uneven segments above); the official code reshapes and so
  needs N divisible by m (or pads the sequence to a fixed length).
- No padding mask (the official code multiplies Q and K by it), and cross-attention lengths
  Nq ≠ Nk are allowed (landmarks m' = min(m, Nq, Nk)).
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host, xp as active_xp
from ..nn import init
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import (IMPLIED_PATTERN_MAX_N, AttentionBase, check_heads, dense_attention_array,
                   register, repeat_kv)

__all__ = ["segment_means_matrix", "iterative_pinv", "depthwise_sequence_conv",
           "NystromAttention"]


def segment_means_matrix(n: int, m: int, xp=None, dtype="float64"):
    """(m, n) matrix S whose row r averages the positions of segment r, so that S X are the
    segment means of X (n, D). Position j belongs to segment ⌊j·m/n⌋ (sizes ⌊n/m⌋ or ⌈n/m⌉,
    none empty for m ≤ n)."""
    n = validate.positive_int(n, "n", owner="segment_means_matrix")
    m = validate.integer(m, "m", minimum=1, maximum=n, owner="segment_means_matrix")
    xp = xp or active_xp()
    seg = xp.arange(n) * m // n                                  # segment of each position
    onehot = (seg[None, :] == xp.arange(m)[:, None]).astype(dtype)   # (m, n)
    return onehot / onehot.sum(axis=1, keepdims=True)


def iterative_pinv(a, iterations: int = 6):
    """Z ≈ A⁺ for a batch of square matrices a (…, m, m), by Razavi et al.'s iteration (the
    module docstring's Z_j), Z₀'s norms per matrix. Differentiable (matmuls only);
    time O(iterations · m³) per matrix."""
    iterations = validate.nonnegative_int(iterations, "iterations", owner="iterative_pinv")
    xp = get_array_module(a.data)
    eye = xp.eye(a.shape[-1], dtype=a.dtype)                     # (m, m)
    # Z₀'s norms: the max column sum and the max row sum of |A|, one pair per matrix
    absa = F.abs(a)
    norm_1 = F.max(F.sum(absa, axis=-2, keepdims=True), axis=-1, keepdims=True)    # (…, 1, 1)
    norm_inf = F.max(F.sum(absa, axis=-1, keepdims=True), axis=-2, keepdims=True)  # (…, 1, 1)
    z = F.swapaxes(a, -1, -2) / (norm_1 * norm_inf)
    # each step takes E = I − A Z to (3 E³ + E⁴)/4 (module docstring)
    for _ in range(iterations):
        az = F.matmul(a, z)                                      # (…, m, m)
        z = F.matmul(z * 0.25, 13 * eye - F.matmul(az, 15 * eye - F.matmul(az, 7 * eye - az)))
    return z


def depthwise_sequence_conv(v, weight):
    r"""The paper's skip connection: a depthwise convolution of v (B, H, N, D) along N, one
    kernel of odd size K per head (weight (H, K)), zero-padded to keep N:

    $$
    y_{b,h,i} = \sum_{t=0}^{K-1} w_{h,t}\, v_{b,h,\,i + t - (K-1)/2}
    $$

    (a cross-correlation, as PyTorch's ``Conv2d(H, H, (K, 1), padding=(K//2, 0),
    groups=H)``). A loop over the K taps, not over positions; time O(B·H·N·D·K)."""
    h, kk = weight.shape
    n, half = v.shape[2], kk // 2
    padded = F.pad(v, ((0, 0), (0, 0), (half, half), (0, 0)))   # (B, H, N + K − 1, D)
    out = None
    for t in range(kk):
        w_t = F.reshape(F.getitem(weight, (slice(None), t)), (h, 1, 1))      # (H, 1, 1)
        term = w_t * F.getitem(padded, (Ellipsis, slice(t, t + n), slice(None)))
        out = term if out is None else out + term
    return out                                                   # (B, H, N, D)


@register("nystrom")
class NystromAttention(AttentionBase):
    r"""Nyströmformer: softmax attention reconstructed from m segment-mean landmarks.

    Formula: the module docstring's O = F A⁺ (B V) on segment-mean landmarks, A⁺ by
    ``pinv_iterations`` steps of Razavi et al.'s iteration, plus conv(V) with the skip on;
    softmax attention itself when every token is a landmark. Its differences from the
    official code are listed there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D); landmarks (B, H, m', D), m' = min(m, Nq, Nk);
    kernels F (B, H, Nq, m'), A and A⁺ (B, H, m', m'), B (B, H, m', Nk); the skip's
    ``conv_weight`` (H, K) (needs Nq = Nk). With m' = Nq = Nk (and ``exact_at_full``) no
    landmark, kernel or pseudo-inverse is formed, and their hooks do not fire.

    Options: ``num_landmarks`` m (default 16; segment j ↦ ⌊j·m/N⌋ when N is not a multiple
    of m; m > N uses one landmark per token), ``pinv_iterations`` (default 6, the paper's),
    ``conv_kernel`` K (None: no skip, the default; a positive odd int: the paper's depthwise
    convolution of V, 33 in its experiments), ``exact_at_full`` (True: softmax attention when
    m' = Nq = Nk, as the official code; False: the iteration there too). Raises ValueError
    for causal=True.

    Complexity: {complexity}; T = ``pinv_iterations``. Scores formed: Nq·m + m² + m·Nk
    (2·N·m + m² for self-attention): linear in N for a fixed m.

    Exactness: approximate; exact with one landmark per token. Relative output error
    ‖O − O*‖/‖O*‖ against softmax attention (``landmark_errors()``: N = 64, D = 8, 2 heads,
    6 iterations, float64):

        m                         1      2      4      8      16     32     64
        smooth q, k (default)     0.38   0.23   0.16   0.088  0.056  0.044  3e-16
        i.i.d. q, k ~ N(0, 1)     0.75   0.75   0.72   0.68   0.49   0.35   3e-16

    (m = 64 = N is computed exactly; with ``exact_at_full=False`` the 6-iteration
    pseudo-inverse of the ill-conditioned S leaves 0.036 and 0.044 there. i.i.d. tokens have
    segment means near 0, so their landmarks say little until m ≈ N).

    Reference: Xiong, Zeng, Chakraborty, Tan, Fung, Li & Singh (2021), "Nyströmformer: A
    Nyström-Based Algorithm for Approximating Self-Attention"; the pseudo-inverse iteration:
    Razavi, Kerayechian, Gachpazan & Shateyi (2014).
    """

    complexity = "time O(B·H·(N·m·D + T·m³)), memory O(B·H·(N·m + m²))"

    kind = "approximate"
    supports_causal = False

    def __init__(self, embed_dim, num_heads, causal=False, num_landmarks: int = 16,
                 pinv_iterations: int = 6, conv_kernel: int = None, exact_at_full: bool = True,
                 **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        # the options, each checked by name; the skip's kernel only when it is on
        who = "nystrom"
        self.num_landmarks = validate.positive_int(num_landmarks, "num_landmarks", owner=who)
        self.pinv_iterations = validate.nonnegative_int(pinv_iterations, "pinv_iterations",
                                                        owner=who)
        if conv_kernel is not None:
            conv_kernel = validate.positive_int(conv_kernel, "conv_kernel", owner=who)
            if conv_kernel % 2 == 0:
                raise validate.OptionError(f"{who}: conv_kernel must be None or a positive "
                                           f"odd int, got {conv_kernel!r}")
            # PyTorch's Conv2d default: U(−1/√fan_in, 1/√fan_in), fan_in = K
            self.conv_weight = Parameter(active_xp().zeros((num_heads, conv_kernel),
                                                           dtype="float32"))
            bound = 1.0 / math.sqrt(conv_kernel)
            init.uniform_(self.conv_weight, -bound, bound)
            self.hook_conv = HookPoint()           # (B, H, N, D) conv(V), the skip's term
        self.conv_kernel = conv_kernel
        self.exact_at_full = validate.boolean(exact_at_full, "exact_at_full", owner=who)
        self.hook_landmarks_q = HookPoint()        # (B, H, m, D) segment means of Q
        self.hook_landmarks_k = HookPoint()        # (B, H, m, D) segment means of K
        self.hook_kernel_f = HookPoint()           # (B, H, N, m) the kernel F
        self.hook_kernel_a = HookPoint()           # (B, H, m, m) the kernel A
        self.hook_kernel_b = HookPoint()           # (B, H, m, Nk) the kernel B
        self.hook_pinv = HookPoint()               # (B, H, m, m) the iterate Z ≈ A⁺
        self.hook_pattern = HookPoint()            # (B, H, N, Nk) implied F Z B, read-only

    def landmarks_for(self, nq: int, nk: int) -> int:
        """m' = min(m, Nq, Nk): the number of landmarks used at these lengths."""
        return min(self.num_landmarks, nq, nk)

    def scores_computed(self, nq: int, nk: int) -> int:
        """Entries of the three kernels F, A, B: Nq·m' + m'² + m'·Nk (2·N·m + m² for
        self-attention), against Nq·Nk for softmax attention (which it is, with N² scores,
        when m' = Nq = Nk and ``exact_at_full``)."""
        m = self.landmarks_for(nq, nk)
        if self.exact_at_full and m == nq == nk:
            return nq * nk
        return nq * m + m * m + m * nk

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, _, nq, nk, d = check_heads(q, k, v, self.name)
        if self.conv_kernel is not None and nq != nk:
            raise ValueError(f"nystrom: the conv skip (conv_kernel={self.conv_kernel}) adds "
                             f"conv(V) per query position and needs Nq == Nk, got {nq} and {nk}")
        k, v = repeat_kv(k, h), repeat_kv(v, h)                  # (B, H, Nk, D)
        m, scale = self.landmarks_for(nq, nk), 1.0 / math.sqrt(d)
        if self.exact_at_full and m == nq == nk:
            # one landmark per token: F = A = B = S, and S A⁺ S = S; the official code's switch
            pattern = F.softmax(F.matmul(q, F.swapaxes(k, -1, -2)) * scale, axis=-1)
            return self._with_skip(F.matmul(pattern, v), pattern, v)
        xp = get_array_module(q.data)
        # landmarks: segment means, (m, N) @ (B, H, N, D) -> (B, H, m, D)
        q_l = self.hook_landmarks_q(F.matmul(segment_means_matrix(nq, m, xp, q.dtype), q))
        k_l = self.hook_landmarks_k(F.matmul(segment_means_matrix(nk, m, xp, k.dtype), k))
        # the three kernels, each a row softmax of a small product
        kf = self.hook_kernel_f(F.softmax(F.matmul(q, F.swapaxes(k_l, -1, -2)) * scale,
                                          axis=-1))              # (B, H, Nq, m)
        ka = self.hook_kernel_a(F.softmax(F.matmul(q_l, F.swapaxes(k_l, -1, -2)) * scale,
                                          axis=-1))              # (B, H, m, m)
        kb = self.hook_kernel_b(F.softmax(F.matmul(q_l, F.swapaxes(k, -1, -2)) * scale,
                                          axis=-1))              # (B, H, m, Nk)
        z = self.hook_pinv(iterative_pinv(ka, self.pinv_iterations))   # (B, H, m, m) ≈ A⁺
        # out = (F Z) (B V): (B, H, Nq, m) @ (B, H, m, D); never an Nq × Nk product
        out = F.matmul(F.matmul(kf, z), F.matmul(kb, v))         # (B, H, Nq, D)
        implied = None
        if self.hook_pattern.active:
            if max(nq, nk) > IMPLIED_PATTERN_MAX_N:
                raise ValueError(f"nystrom: hook_pattern forms the implied N × N pattern; N = "
                                 f"{max(nq, nk)} exceeds IMPLIED_PATTERN_MAX_N = "
                                 f"{IMPLIED_PATTERN_MAX_N}")
            implied = F.matmul(F.matmul(kf, z), kb)              # (B, H, Nq, Nk)
        return self._with_skip(out, implied, v)

    def _with_skip(self, out, pattern, v):
        """Add the skip conv(V) when it is on, and hand ``hook_pattern`` the (B, H, Nq, Nk) map
        the output is linear through (``pattern``, plus the skip's banded matrix C = conv
        applied to I_N), so that out = pattern · V."""
        if self.conv_kernel is not None:
            out = out + self.hook_conv(depthwise_sequence_conv(
                v, self.conv_weight.astype(v.dtype)))
        if self.hook_pattern.active:
            if self.conv_kernel is not None:
                n, xp = v.shape[2], get_array_module(v.data)
                eye = F.reshape(Tensor._wrap(xp.eye(n, dtype=v.dtype)), (1, 1, n, n))
                pattern = pattern + depthwise_sequence_conv(eye,
                                                            self.conv_weight.astype(v.dtype))
            self.hook_pattern(pattern)
        return out

    # ---- the error against softmax attention, for the docs and the site --------------------

    @classmethod
    def landmark_errors(cls, n: int = 64, landmarks=(1, 2, 4, 8, 16, 32, 64), d: int = 8,
                        heads: int = 2, pinv_iterations: int = 6, smooth: bool = True,
                        seed: int = 0, exact_at_full: bool = True):
        """[(m, ‖O − O*‖_F / ‖O*‖_F)]: the relative output error of ``attend`` (skip off)
        against exact softmax attention O* for each number of landmarks m, float64.

        v ~ N(0, 1). ``smooth``: q and k are random walks scaled by 1/√(j+1)
        (q_j = Σ_{i≤j} g_i / √(j+1), g_i ~ N(0, I)): neighbours are alike, the regime segment
        means assume (as in real sequences); otherwise q, k ~ N(0, 1) i.i.d., where a segment
        mean of unrelated tokens is close to 0 and the landmarks say little until m ≈ N.
        ``exact_at_full``: the layer's option (False: the iteration at m = N too)."""
        rng = host_xp.random.default_rng(seed)
        q, k = (rng.standard_normal((1, heads, n, d)) for _ in range(2))
        if smooth:
            q, k = (host_xp.cumsum(x, axis=2) / host_xp.sqrt(host_xp.arange(1, n + 1))[:, None]
                    for x in (q, k))
        v = rng.standard_normal((1, heads, n, d))
        # The target O* is exact softmax attention; each m then builds a layer with m landmarks and
        # measures the relative Frobenius error of its output.
        exact = dense_attention_array(q, k, v)
        rows = []
        for m in landmarks:
            layer = cls(d * heads, heads, num_landmarks=m, pinv_iterations=pinv_iterations,
                        exact_at_full=exact_at_full)
            t = [Tensor(active_xp().asarray(x)) for x in (q, k, v)]
            out = to_host(layer.attend(*t).data)
            norm = host_xp.linalg.norm
            rows.append((m, float(norm(out - exact) / norm(exact))))
        return rows

    @classmethod
    def identities(cls, seed: int = 0):
        """(claim, value, limit) rows for the site: the m = N limit, the pseudo-inverse
        iteration following its scalar recursion, and the error falling with m."""
        rows = []
        # m = N: F = A = B = S, and with a converged A⁺ the output is softmax attention
        n, d = 16, 8
        rng = host_xp.random.default_rng(seed)
        q, k, v = (rng.standard_normal((1, 2, n, d)) for _ in range(3))
        t = [Tensor(active_xp().asarray(x)) for x in (q, k, v)]
        exact = dense_attention_array(q, k, v)
        layer = cls(2 * d, 2, num_landmarks=n)
        gap = to_host(layer.attend(*t).data) - exact
        rows.append(("m = N = 16 landmarks (softmax attention, as the official code): "
                     "Nyström − softmax attention, max |Δ|", float(host_xp.abs(gap).max()),
                     1e-14))
        layer = cls(2 * d, 2, num_landmarks=n, pinv_iterations=40, exact_at_full=False)
        gap = to_host(layer.attend(*t).data) - exact
        rows.append(("m = N = 16 landmarks through 40 pseudo-inverse iterations: Nyström − "
                     "softmax attention, max |Δ|", float(host_xp.abs(gap).max()), 1e-10))
        # 6 iterations: ‖I − A Z₆‖₂ = max over A's singular values of f⁶(1 − σ²/(‖A‖₁‖A‖∞)),
        # f(e) = (3e³ + e⁴)/4 (module docstring)
        a = _softmax_host(q[0, 0, :8] @ k[0, 0, :8].T / math.sqrt(d))        # (8, 8) kernel
        z = to_host(iterative_pinv(Tensor(active_xp().asarray(a)), 6).data)
        e = 1 - host_xp.linalg.svd(a, compute_uv=False) ** 2 / (
            host_xp.abs(a).sum(0).max() * host_xp.abs(a).sum(1).max())
        for _ in range(6):
            e = (3 * e ** 3 + e ** 4) / 4
        measured = host_xp.linalg.norm(host_xp.eye(8) - a @ z, 2)
        # rounding near e = 1 grows ≤ ×3.25 per iteration: 10·m·eps·3.25⁶ ≈ 2e-11
        rows.append(("6 iterations on an 8 × 8 kernel A: ‖I − A Z₆‖₂ − max_σ f⁶(1 − σ²/(‖A‖₁"
                     "‖A‖∞)), |Δ|", float(abs(measured - e.max())), 2e-11))
        # the error against softmax attention falls as landmarks are added (N = 64)
        errors = dict(cls.landmark_errors(64, (4, 16, 64), seed=seed))
        rows.append(("N = 64 (smooth q, k): relative output error at m = 16 (limit: the "
                     "error at m = 4)", errors[16], errors[4]))
        rows.append(("N = 64 (smooth q, k): relative output error at m = 64 = N, computed "
                     "exactly (limit: the error at m = 16)", errors[64], errors[16]))
        return rows


def _softmax_host(s):
    e = host_xp.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
