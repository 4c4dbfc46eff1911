r"""The delta rule: a fast-weight memory that corrects what it stores instead of only adding to it.

Schlag, Irie & Schmidhuber (2021), "Linear Transformers Are Secretly Fast Weight Programmers";
Yang, Wang, Zhang, Shen & Kim (2024), "Parallelizing Linear Transformers with the Delta Rule
over Sequence Length".

Causal linear attention writes S_t = S_{t−1} + v_t k_tᵀ: a memory from keys to values that
only ever adds. Writing a second value under the same key leaves a sum of the two. The delta
rule first reads what the memory holds for k_t, S_{t−1} k_t, and writes the *difference* with
a strength β_t ∈ (0, 1) (one step of gradient descent on ½‖S k_t − v_t‖²); the query reads
the memory scaled by τ:

$$
S_t = S_{t-1} + \beta_t \left(v_t - S_{t-1} k_t\right) k_t^\top
    = S_{t-1}\left(I - \beta_t k_t k_t^\top\right) + \beta_t v_t k_t^\top,
\qquad o_t = \tau\, S_t q_t
$$

With ‖k_t‖ = 1 and β_t = 1 the memory then returns exactly v_t for k_t: the old association is
overwritten (``tests/attention/test_delta_rule.py`` shows it against linear attention).
``DeltaNet`` makes every key and query a unit vector, k_t = k̃_t/√(‖k̃_t‖² + ε) from the raw
head k̃_t, takes β_t = σ(w_h·k̃_t + b_h) per head, and τ = 1/√D by default.

**Chunkwise form (Yang et al. 2024).** Write the updates as S_t = S_0 + Σ_{i≤t} u_i k_iᵀ; then
u_t = β_t (v_t − S_0 k_t − Σ_{i<t} (k_iᵀ k_t) u_i), a unit lower-triangular system for all u
of a chunk at once. With rows U, V, K, Q (c × ·), the causal mask M (diagonal included) and
the strictly lower A_ts = β_t k_t·k_s (s < t):

$$
(I + A)\, U = \operatorname{diag}(\beta) \left(V - K S_0^\top\right), \qquad
O = \tau \left( Q S_0^\top + \left(Q K^\top \odot M\right) U \right), \qquad
S_c = S_0 + U^\top K
$$

So the output is linear in V − K S₀ᵀ through the chunk's implied pattern
P = τ (Q Kᵀ ⊙ M)(I + A)⁻¹ diag(β) (c × c): O = P (V − K S₀ᵀ) + τ Q S₀ᵀ (``hook_pattern``).

T = (I + A)⁻¹ is the paper's "UT transform" (it turns the product of Householder-like factors
(I − β k kᵀ) into this WY form). It is never formed: ``UnitLowerSolve`` finds U by forward
substitution, row by row (the recurrence of u_t above), and its gradient by back substitution
with the transpose: for X = (I + A)⁻¹ R,

$$
x_t = r_t - \sum_{s<t} A_{ts}\, x_s, \qquad
(I + A)^\top \bar R = \bar X, \qquad \bar A = -\operatorname{tril}\!\left(\bar R X^\top, -1\right)
$$

(from dX = −(I + A)⁻¹ dA X, the gradient of a linear solve kept to the entries A holds). The
code stores the state transposed, (Dk, Dv), as retention does, so that o_t = τ q_t S_t with row
vectors, and folds τ into the query (q ← τ q̂, as the official kernel does).

**Differences from the official code** (flash-linear-attention's ``DeltaNet`` layer and
``chunk_delta_rule`` kernel, the paper's code):

- τ = 1/√D, the kernel's default scale, is adopted (``scale=None``); ``scale=1.0`` gives the
  unscaled o_t = S_t q_t, whose outputs are √D times the official kernel's (tested).
- β_t = σ(w_h·k̃_t + b_h) reads the token through the head's key projection (w_h·W_k x_t, a
  D-dimensional map per head), so that ``attend(q, k, v)`` holds everything; the official layer
  has a projection of its own, β_t = σ(W_β x_t).
- Not included: the short causal convolutions (kernel 4) and the SiLU applied to q, k and v
  before the normalisation, and the RMSNorm of each head's output (the official layer's
  defaults).
- Non-causal (``causal=False``) is minitx's extension: every query reads the memory after the
  last token, o_t = τ S_N q_t (as bidirectional linear attention reads Σ_j φ(k_j) v_jᵀ).
- The chunk length (16 here, 64 there) changes the rounding only, not the output.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, rng, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import check_heads, register, repeat_kv, repeat_kv_array
from .retention import RecurrentAttention, run_in_chunks

__all__ = ["UnitLowerSolve", "unit_lower_solve", "delta_chunk", "delta_rule_recurrent",
           "DeltaNet"]


class UnitLowerSolve(Function):
    """X = (I + A)⁻¹ R by forward substitution, and its gradient by back substitution (the
    module docstring's formulas). A (…, c, c) strictly lower-triangular (its other entries are
    not read), R (…, c, m). A loop over the c rows, each one step of the recurrence x_t (the
    UT transform's own). Time O(c²·m) per matrix."""

    @staticmethod
    def forward(ctx, a, r):
        xp = get_array_module(a, r)
        x = xp.empty_like(r)                                                   # (…, c, m)
        for t in range(r.shape[-2]):
            # row t from the rows above it, already solved
            x[..., t, :] = r[..., t, :] - (a[..., t:t + 1, :t] @ x[..., :t, :])[..., 0, :]
        ctx.save_for_backward(a, x)
        return x

    @staticmethod
    def backward(ctx, grad):
        a, x = ctx.saved_tensors
        xp = get_array_module(grad)
        dr = xp.empty_like(grad)                                               # (…, c, m)
        # (I + A)ᵀ is unit upper-triangular: solve from the last row up
        for t in range(grad.shape[-2] - 1, -1, -1):
            below = xp.swapaxes(a[..., t + 1:, t:t + 1], -1, -2)              # (…, 1, c−t−1)
            dr[..., t, :] = grad[..., t, :] - (below @ dr[..., t + 1:, :])[..., 0, :]
        return -xp.tril(dr @ xp.swapaxes(x, -1, -2), -1), dr


def unit_lower_solve(a, r):
    """(I + tril(a, −1))⁻¹ r, differentiable in both: a (…, c, c), r (…, c, m) Tensors."""
    return UnitLowerSolve.apply(a, r)


def delta_chunk(q, k, v, beta, state=None, causal: bool = True, hook_pattern=None):
    """One chunk of the delta rule (the module docstring's chunkwise form, with τ already in
    q), started from the state S₀ the chunks before left (stored as (Dk, Dv), so S₀ here is its
    transpose).

    q, k (B, H, c, Dk) (unit keys), v (B, H, c, Dv), beta (B, H, c), state (B, H, Dk, Dv)
    Tensor or None. ``causal=False`` (one chunk, no state): every query reads the final
    memory, O = Q S. ``hook_pattern``: a HookPoint (or None) that sees and may replace the
    implied pattern P (B, H, c, c) of the module docstring. Returns (O (B, H, c, Dv),
    S (B, H, Dk, Dv)). Time O(B·H·(c²·D + c·D²)).
    """
    xp = get_array_module(q.data)
    b_ = F.expand_dims(beta, -1)                                        # (B, H, c, 1)
    a = F.tril(F.matmul(k, F.swapaxes(k, -1, -2)) * b_, -1)             # (B, H, c, c)
    r = v if state is None else v - F.matmul(k, state)                  # V − K S₀
    u = unit_lower_solve(a, r * b_)                                     # (B, H, c, Dv)
    scores = F.matmul(q, F.swapaxes(k, -1, -2))                         # (B, H, c, c)
    if causal:
        scores = F.tril(scores)
    elif state is not None:
        raise ValueError("delta_chunk: a state (the tokens before) needs causal=True")
    if hook_pattern is None:
        out = F.matmul(scores, u)                                       # (B, H, c, Dv)
    else:
        # the implied pattern, formed from I + A applied to diag(β): P R = scores U
        c = q.shape[2]
        diag_beta = b_ * xp.eye(c, dtype=q.dtype)                       # (B, H, c, c)
        out = F.matmul(hook_pattern(F.matmul(scores, unit_lower_solve(a, diag_beta))), r)
    new_state = F.matmul(F.swapaxes(k, -1, -2), u)                      # (B, H, Dk, Dv)
    if state is not None:
        out = out + F.matmul(q, state)
        new_state = new_state + state
    return out, new_state


def delta_rule_recurrent(q, k, v, beta):
    """The module docstring's recurrence, token by token (the definition), with τ already in q
    and S stored as (Dk, Dv), S_0 = 0.

    q, k (B, H, N, Dk), v (B, H, N, Dv), beta (B, H, N) Tensors → (O (B, H, N, Dv), S_N).
    Time O(N·Dk·Dv) per head, state O(Dk·Dv): a loop over positions — the recurrence is the
    point."""
    xp = get_array_module(q.data)
    b, h, n, _ = q.shape
    s = Tensor._wrap(xp.zeros((b, h, k.shape[-1], v.shape[-1]), dtype=q.dtype))
    bt = F.expand_dims(F.expand_dims(beta, -1), -1)                     # (B, H, N, 1, 1)
    outs = []
    for t in range(n):
        kt, vt = k[:, :, t:t + 1], v[:, :, t:t + 1]                    # (B, H, 1, D)
        error = vt - F.matmul(kt, s)                                    # v_t − k_t S, (B, H, 1, Dv)
        s = s + bt[:, :, t] * F.matmul(F.swapaxes(kt, -1, -2), error)   # (B, H, Dk, Dv)
        outs.append(F.matmul(q[:, :, t:t + 1], s))
    return F.concatenate(outs, axis=2), s


def _unit_rows(x, eps):
    """x / √(‖x‖² + ε) over the last axis (a zero row stays zero, with a finite gradient)."""
    return x / F.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


@register("deltanet")
class DeltaNet(RecurrentAttention):
    r"""DeltaNet: linear attention whose memory is written with the delta rule — each token
    replaces (by β_t) what the memory held for its key instead of adding to it.

    Formula: the module docstring's recurrence S_t, o_t = τ S_t q_t, on unit keys and queries,
    with the write strength β_t = σ(w_h·k̃_t + b_h), a learned function of the raw key head.
    Computed chunkwise (``delta_chunk``: the module docstring's chunkwise form); its
    differences from the official code are listed there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); β (B, H, N); the state (B, H, D, D) (stored as Sᵀ).
    Hook points (besides hook_q/k/v/z): ``hook_beta`` β (B, H, N), replaceable;
    ``hook_pattern`` the implied pattern P (module docstring) (B, H, N, N), with out = P V,
    replaceable, formed on request (one chunk of N: an N × N solve);
    ``hook_state`` the state after the last token.

    Options: ``causal`` (False), ``chunk_size`` C (16; None: one chunk), ``scale`` τ (None:
    1/√D, the official kernel's; a positive number: that), ``eps`` (1e-12, under the square
    root of the normalisations), ``num_kv_heads``, ``bias``. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant size).

    Complexity: {complexity}; decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own recurrence,
    ``reference``, and chunkwise against token by token).

    Reference: Schlag, Irie & Schmidhuber (2021), "Linear Transformers Are Secretly Fast
    Weight Programmers"; Yang, Wang, Zhang, Shen & Kim (2024), "Parallelizing Linear
    Transformers with the Delta Rule over Sequence Length".
    """

    complexity = "time O(B·H·N·(C² + C·D + D²)), memory O(B·H·N·(C + D + D²/C))"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, chunk_size=16, eps: float = 1e-12,
                 scale: float = None, **base):
        super().__init__(embed_dim, num_heads, causal=causal, chunk_size=chunk_size, **base)
        self.eps = validate.positive_real(eps, "eps", owner=self.name)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else \
            validate.positive_real(scale, "scale", owner=self.name)
        h, d = self.num_heads, self.head_dim
        # β_t = σ(w_h·k̃_t + b_h): w small at the start, so every β starts near σ(0) = 1/2
        self.beta_weight = Parameter(
            active_xp().asarray(rng().standard_normal((h, d)) * 0.02).astype("float32"))
        self.beta_bias = Parameter(active_xp().zeros((h,), dtype="float32"))
        self.hook_beta = HookPoint()        # (B, H, N) write strengths
        self.hook_pattern = HookPoint()     # (B, H, N, N) implied pattern, on request

    def features(self, q, k):
        """Raw heads q (B, H, N, D), k (B, H, N, D) → τ·(unit q), unit k, β (B, H, N)."""
        beta = F.sigmoid(F.einsum("bhnd,hd->bhn", k, self.beta_weight)
                         + F.reshape(self.beta_bias, (1, -1, 1)))
        return (_unit_rows(q, self.eps) * self.scale, _unit_rows(k, self.eps),
                self.hook_beta(beta))

    def _chunk(self, q, k, v, beta, state):
        hooked = self.hook_pattern if self.hook_pattern.active else None
        return delta_chunk(q, k, v, beta, state, hook_pattern=hooked)

    def extend(self, q, k, v, state):
        """The n new tokens after ``state``: q (B, H, n, D), k/v (B, Hkv, n, D) → (out, state)."""
        h = q.shape[1]
        q, k, beta = self.features(q, repeat_kv(k, h))
        chunk = None if self.hook_pattern.active else self.chunk_size
        return run_in_chunks(self._chunk, q, k, repeat_kv(v, h), beta, state, chunk)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D)."""
        check_heads(q, k, v, self.name)
        # Causal: each query reads the state just after its own token (the chunked recurrence).
        # Non-causal: every token is written first, then each query reads the final S: o = q̂ S.
        if self.causal:
            out, state = self.extend(q, k, v, None)
        elif self.hook_pattern.active:                   # one chunk, so the pattern is whole
            h = q.shape[1]
            qn, kn, beta = self.features(q, repeat_kv(k, h))
            out, state = delta_chunk(qn, kn, repeat_kv(v, h), beta, causal=False,
                                     hook_pattern=self.hook_pattern)
        else:                                            # write every token, then read
            h = q.shape[1]
            qn, kn, beta = self.features(q, repeat_kv(k, h))
            _, state = run_in_chunks(self._chunk, qn, kn, repeat_kv(v, h), beta, None,
                                     self.chunk_size)
            out = F.matmul(qn, state)                                   # (B, H, N, Dv)
        # ``hook_state`` sees the state after the last token (read-only: no cache is kept here).
        self.show_state(state)
        return out

    def reference(self, q, k, v):
        """Raw arrays: the module docstring's recurrence token by token, o = τ q̂ S
        (non-causal: every query reads the final S) — the definition, for tests."""
        xp = get_array_module(q)
        h = q.shape[1]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        # β_t ∈ (0, 1) and a unit k̂: each write's factor I − β k̂ k̂ᵀ has eigenvalues in [0, 1],
        # so the memory cannot blow up
        w = self.beta_weight.data.astype(q.dtype)
        beta = 1 / (1 + xp.exp(-(xp.einsum("bhnd,hd->bhn", k, w)
                                 + self.beta_bias.data.astype(q.dtype)[:, None])))
        qn = q / xp.sqrt((q * q).sum(-1, keepdims=True) + self.eps) * self.scale
        kn = k / xp.sqrt((k * k).sum(-1, keepdims=True) + self.eps)
        # The delta rule: read what S stores under k̂_t, move it towards v_t by a step β_t,
        # then read with q̂_t; S (B, H, Dk, Dv) starts at zero.
        s = xp.zeros(q.shape[:2] + (k.shape[-1], v.shape[-1]), dtype=q.dtype)
        out = xp.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
        for t in range(q.shape[2]):
            error = v[:, :, t] - xp.einsum("bhd,bhde->bhe", kn[:, :, t], s)     # (B, H, Dv)
            s = s + beta[:, :, t, None, None] * kn[:, :, t, :, None] * error[:, :, None, :]
            out[:, :, t] = xp.einsum("bhd,bhde->bhe", qn[:, :, t], s)
        if not self.causal:
            out = xp.einsum("bhnd,bhde->bhne", qn, s)
        return out

    @classmethod
    def identities(cls, seed=0):
        """Chunkwise (C = 4, and one chunk) against the recurrence: float64, B = 1, H = 2,
        D = 4, N = 13."""
        g = host_xp.random.default_rng(seed)
        q, k, v = (Tensor(active_xp().asarray(g.standard_normal((1, 2, 13, 4))))
                   for _ in range(3))
        beta = Tensor(active_xp().asarray(g.uniform(0.1, 1.0, (1, 2, 13))))
        qn, kn = _unit_rows(q, 1e-12), _unit_rows(k, 1e-12)
        with no_grad():
            recurrent = to_host(delta_rule_recurrent(qn, kn, v, beta)[0].data)
            rows = []
            for c in (4, 13):
                out = to_host(run_in_chunks(delta_chunk, qn, kn, v, beta, None, c)[0].data)
                rows.append((f"chunkwise UT form (C = {c}) − recurrence, max |Δ|",
                             float(host_xp.abs(out - recurrent).max()), 1e-12))
        return rows
