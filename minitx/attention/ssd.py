r"""State-space duality (Mamba-2): a selective state-space model *is* masked linear attention.

Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality".

A selective SSM with a scalar decay per step runs, per head, a recurrence on row vectors
(x_t (1, P) the input, B_t, C_t (1, N_s) input and output maps, h_t (N_s, P) the state,
a_t ∈ (0, 1)); unrolling it, y_t = Σ_{s≤t} (a_{s+1} ··· a_t)(C_t·B_s) x_s, so Y = M X with a
masked matrix M:

$$
h_t = a_t h_{t-1} + B_t^\top x_t, \quad y_t = C_t h_t
\qquad\Longleftrightarrow\qquad
Y = \left(L \odot C B^\top\right) X, \quad
L_{ts} = \begin{cases} \prod_{r=s+1}^{t} a_r & t \ge s \\ 0 & t < s \end{cases}
$$

That is the **duality**: the same map computed two ways. As a *recurrence* (a linear scan):
O(T·N_s·P) time, O(N_s·P) state — an RNN. As *masked attention* with C as queries, B as keys,
X as values and the 1-semiseparable mask L in place of the softmax: O(T²) time, matmuls only —
a transformer. The **chunked algorithm** (the paper's SSD algorithm) takes the best of both:
the quadratic form inside chunks of length Q, the recurrence between chunks (the state passed
on), O(T·Q) memory.

minitx's mapping onto the attention contract: C ↔ q, B ↔ k, X ↔ v (N_s = P = D, the head
dimension), with Mamba-2's parameterisation: a learned, input-dependent step Δ_t per head,
A_h = exp(A_log_h) > 0, and B_t scaled by Δ_t:

$$
\Delta_t = \operatorname{softplus}\!\left(w_h^\top x_t + b_h\right), \quad
a_t = e^{-\Delta_t A_h}, \quad
\bar B_t = \Delta_t B_t
\quad\left(h_t = a_t h_{t-1} + \Delta_t B_t^\top x_t\right)
$$

Of the continuous system h′ = −A_h h + Bᵀx, the decay a_t = e^{−Δ_t A_h} is the exact
(zero-order-hold) discretisation; B̄_t = Δ_t B_t is Euler's rule for the input, the
simplification Mamba uses. Zero-order hold would give B̄ = (ΔA)⁻¹(e^{ΔA} − I)ΔB, here
(1 − a_t) B_t / A_h, which agrees with Δ_t B_t to first order in Δ_t A_h.

Retention is the case a_t = γ (constant, no Δ): both use ``retention.decay_mask`` and
``retention.decayed_chunk``, written for a per-token decay.

**Differences from the official code** (``mamba_ssm``'s ``Mamba2`` layer and its SSD
kernels):

- Grouped heads: with ``num_kv_heads`` G < H this layer shares B and X (k and v) among each
  group of H/G heads and keeps C (q) per head — the attention contract's grouped-query layout
  (the paper's multi-contract SSM, its analogue of multi-query attention). Mamba-2's
  ``ngroups`` shares B and C and keeps X per head (the paper's multi-input SSM, or
  multi-value attention). ``share="bc"`` gives Mamba-2's layout (C and B
  projected to G heads, X to H; tested against Mamba-2's equations; it changes
  ``attend``'s shapes, so the default keeps the contract's).
- Δ_t reads the token through its value head (w_h·W_v x_t; with ``share="bc"`` the value
  head is the head's own X): Mamba-2 projects Δ from x directly, so that ``attend(q, k, v)``
  holds everything here.
- The state size N_s equals the head dimension P = D (Mamba-2 sets them apart: ``d_state``
  and ``headdim``).
- Not included: Mamba-2's block around the SSD — the short causal convolution (and SiLU) of
  x, B and C, the skip term y += D x, the gate y ⊙ SiLU(z) and the norm.
- Non-causal (``causal=False``) is minitx's extension: the symmetric mask L_ts = L_st (a
  forward and a backward scan, cf. Hydra, Hwang et al. 2024), computed in the quadratic form
  only.
"""
from __future__ import annotations

import math


from .. import functional as F
from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, rng, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Parameter
from .base import check_heads, register, repeat_kv, repeat_kv_array, split_heads
from .retention import (RecurrentAttention, decay_mask, decayed_chunk, decayed_recurrence,
                        run_in_chunks)

__all__ = ["ssd_scan", "StateSpaceDuality"]


def ssd_scan(c, b, x, log_a):
    """The SSM as a linear scan (the module docstring's recurrence), token by token.

    c, b (Bt, H, T, N_s), x (Bt, H, T, P), log_a = log a_t (Bt, H, T) Tensors →
    (Y (Bt, H, T, P), h_T (Bt, H, N_s, P)). The same recurrence as retention's with a
    per-token decay: ``retention.decayed_recurrence`` with (q, k, v) = (C, B, X)."""
    return decayed_recurrence(c, b, x, log_a)


@register("ssd")
class StateSpaceDuality(RecurrentAttention):
    r"""SSD (Mamba-2): a selective state-space model with a scalar decay per step, computed as
    masked attention (quadratic), as a linear scan (recurrent), or chunk by chunk.

    Formula: the module docstring's Y = (L ⊙ C B̄ᵀ) X with C = q, B̄_t = Δ_t k_t, X = v and
    Mamba-2's step Δ_t and decay a_t; its differences from the official code are listed
    there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D) (``share="bc"``: q/k (B, Hkv, N, D), v (B, H, N, D));
    Δ (B, H, N); L (B, H, N, N); the state (B, H, D, D).
    Hook points (besides hook_q/k/v/z): ``hook_dt`` Δ (B, H, N), ``hook_decay`` L and
    ``hook_pattern`` L ⊙ C B̄ᵀ (B, H, N, N), replaceable (Y = pattern X; with a hook on either
    the quadratic form runs), ``hook_state`` the state after the last token.
    ``decay_matrix(v)`` gives L for value heads v.

    Options: ``causal`` (False), ``chunk_size`` Q (None: the quadratic form; an int: the
    chunked algorithm, causal only), ``num_kv_heads`` G, ``share`` ("bx": the G groups share
    B and X, the default; "bc": they share B and C, Mamba-2's ``ngroups``), ``bias``.
    Parameters: ``dt_weight`` (H, D), ``dt_bias`` (H,) (initialised so that Δ starts
    log-uniform in [0.001, 0.1]), ``A_log`` (H,) (A uniform in [1, 16]), as Mamba-2. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant size).

    Complexity: {complexity}; chunked (Q) O(B·H·N·(Q + D)·D) time and O(B·H·N·Q) memory;
    decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own dense formula,
    ``reference``, and its three forms against each other).

    Reference: Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient
    Algorithms Through Structured State Space Duality".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, chunk_size=None, share: str = "bx",
                 **base):
        super().__init__(embed_dim, num_heads, causal=causal, chunk_size=chunk_size, **base)
        h, d = self.num_heads, self.head_dim
        self.share = validate.choice(share, "share", ("bx", "bc"), owner=self.name)
        if self.share == "bc":
            # Mamba-2's groups: C (q) has one head per group, X (v) one per head
            bias = self.q_proj.bias is not None
            self.q_proj = Linear(embed_dim, self.num_kv_heads * d, bias=bias)
            self.v_proj = Linear(embed_dim, embed_dim, bias=bias)
        g = rng()
        # Mamba-2's initialisation: Δ = softplus(dt_bias) log-uniform in [1e-3, 1e-1] (bias =
        # softplus⁻¹(Δ) = Δ + log(1 − e^{−Δ})), A uniform in [1, 16]; w small
        dt = host_xp.exp(g.uniform(math.log(1e-3), math.log(1e-1), h))
        self.dt_bias = Parameter(active_xp().asarray(dt + host_xp.log(-host_xp.expm1(-dt)))
                                 .astype("float32"))
        self.dt_weight = Parameter(
            active_xp().asarray(g.standard_normal((h, d)) * 0.02).astype("float32"))
        a_log = host_xp.log(g.uniform(1, 16, h))
        self.A_log = Parameter(active_xp().asarray(a_log).astype("float32"))
        self.hook_dt = HookPoint()          # (B, H, N) Δ
        self.hook_decay = HookPoint()       # (B, H, N, N) L
        self.hook_pattern = HookPoint()     # (B, H, N, N) L ⊙ C B̄ᵀ

    def project(self, x):
        """x (B, N, E) → (C, B, X) heads: q (B, H, N, D), k/v (B, Hkv, N, D); with
        ``share="bc"``, q/k (B, Hkv, N, D) and v (B, H, N, D)."""
        if self.share == "bx":
            return super().project(x)
        g = self.num_kv_heads
        return (split_heads(self.q_proj(x), g), split_heads(self.k_proj(x), g),
                split_heads(self.v_proj(x), self.num_heads))

    def _check(self, q, k, v):
        """The heads ``attend`` takes: (q, k, v) grouped as ``share`` says."""
        if self.share == "bx":
            return check_heads(q, k, v, self.name)
        # "bc": C and B share the G groups, X has a head of its own: as a (query, key, value)
        # triple, (X, B, C) has exactly those shapes
        return check_heads(v, k, q, f"{self.name} (share='bc', checked as (v, k, q))")

    def steps(self, v):
        """Value heads v (B, H, N, D) → the module docstring's Δ and log a, each (B, H, N)."""
        dt = self.hook_dt(F.softplus(F.einsum("bhnd,hd->bhn", v, self.dt_weight)
                                     + F.reshape(self.dt_bias, (1, -1, 1))))
        return dt, -dt * F.reshape(F.exp(self.A_log), (1, -1, 1))

    def decay_matrix(self, v):
        """The module docstring's L (B, H, N, N) Tensor for value heads v (B, Hkv, N, D; with
        ``share="bc"`` (B, H, N, D)), symmetric when non-causal — the picture of what is kept."""
        _, log_a = self.steps(repeat_kv(v, self.num_heads))    # "bc": v has its H heads
        return decay_mask(log_a, self.causal)

    def _chunk(self, c, b, x, log_a, state, causal=True):
        hooked = self.hook_decay.active or self.hook_pattern.active
        return decayed_chunk(c, b, x, log_a, state, causal=causal,
                             hook_decay=self.hook_decay if hooked else None,
                             hook_pattern=self.hook_pattern if hooked else None)

    def _heads(self, q, k, v):
        """(C, B̄ = Δ·k, X, log a) for the H heads (the groups repeated)."""
        h = self.num_heads
        q, k, v = repeat_kv(q, h), repeat_kv(k, h), repeat_kv(v, h)
        dt, log_a = self.steps(v)
        return q, k * F.expand_dims(dt, -1), v, log_a

    def extend(self, q, k, v, state):
        """The n new tokens after ``state``, heads as ``attend`` takes them → (out, state)."""
        c, b, x, log_a = self._heads(q, k, v)
        hooked = self.hook_decay.active or self.hook_pattern.active
        return run_in_chunks(self._chunk, c, b, x, log_a, state,
                             None if hooked else self.chunk_size)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D); ``share="bc"``: q/k
        (B, Hkv, N, D), v (B, H, N, D)."""
        self._check(q, k, v)
        if self.causal:
            out, state = self.extend(q, k, v, None)
        else:
            out, state = self._chunk(*self._heads(q, k, v), None, causal=False)
        self.show_state(state)
        return out

    def reference(self, q, k, v):
        """Raw-array masked-attention form (L ⊙ C B̄ᵀ) X, L_ts = exp(A_t − A_s) from prefix sums
        A_t = Σ_{r≤t} log a_r (symmetric: exp(−|A_t − A_s|)) — not through ``decay_mask``."""
        xp = get_array_module(q)
        h = self.num_heads
        q, k, v = (repeat_kv_array(a, h) for a in (q, k, v))
        w, bias = (p.data.astype(q.dtype) for p in (self.dt_weight, self.dt_bias))
        dt = xp.logaddexp(0, xp.einsum("bhnd,hd->bhn", v, w) + bias[:, None])    # softplus
        big_a = xp.cumsum(-dt * xp.exp(self.A_log.data.astype(q.dtype))[:, None], axis=-1)
        diff = big_a[..., :, None] - big_a[..., None, :]                           # A_t − A_s
        n = q.shape[2]
        if self.causal:
            mask = xp.where(xp.tri(n, dtype=bool), xp.exp(xp.minimum(diff, 0)), 0.0)
        else:
            mask = xp.exp(-xp.abs(diff))
        return (mask * (q @ xp.swapaxes(k * dt[..., None], -1, -2))) @ v

    @classmethod
    def identities(cls, seed=0):
        """Quadratic (masked attention), chunked and scan agree: float64, B = 1, H = 2, D = 4,
        N = 13, a_t drawn in (0.5, 1)."""
        g = host_xp.random.default_rng(seed)
        c, b, x = (Tensor(active_xp().asarray(g.standard_normal((1, 2, 13, 4))))
                   for _ in range(3))
        log_a = Tensor(active_xp().asarray(host_xp.log(g.uniform(0.5, 1.0, (1, 2, 13)))))
        # The same recurrence evaluated three ways: the quadratic masked form, the linear scan, and
        # chunks of 4 (the scan across chunks, the quadratic form inside each).
        with no_grad():
            quadratic = decayed_chunk(c, b, x, log_a)[0]
            scan = ssd_scan(c, b, x, log_a)[0]
            chunked = run_in_chunks(decayed_chunk, c, b, x, log_a, None, 4)[0]
            m = to_host((decay_mask(log_a) * F.matmul(c, F.swapaxes(b, -1, -2))).data)
        # The mask by hand, from prefix sums A of log a: exp(A_t − A_s) for s ≤ t
        a_host = to_host(log_a.data)[0]                                  # (H, T)
        cum = host_xp.cumsum(a_host, -1)
        prod = host_xp.exp(cum[:, :, None] - cum[:, None, :])
        by_hand = host_xp.tril(prod) * (to_host(c.data)[0] @ to_host(b.data)[0].swapaxes(-1, -2))
        q_, s_, ch_ = (to_host(t.data) for t in (quadratic, scan, chunked))
        scan_claim = ("masked attention (L ⊙ CBᵀ)X − linear scan h_t = a_t h_{t−1} + B_tᵀx_t, "
                      "max |Δ|")
        return [(scan_claim, float(host_xp.abs(q_ - s_).max()), 1e-12),
                ("chunked (Q = 4) − masked attention, max |Δ|", float(host_xp.abs(ch_ - q_).max()),
                 1e-12),
                ("M = L ⊙ CBᵀ − products a_{s+1}···a_t by prefix sums, max |Δ|",
                 float(host_xp.abs(m[0] - by_hand).max()), 1e-12)]
