r"""The gated delta rule: the delta rule's memory, decayed before every write — by one number
per head (gated DeltaNet) or by one number per key channel (Kimi Delta Attention, KDA).

Yang, Kautz & Hatamizadeh (2025), "Gated Delta Networks: Improving Mamba2 with Delta Rule"
(ICLR); Kimi Team / Moonshot AI (2025), "Kimi Linear: An Expressive, Efficient Attention
Architecture" (KDA).

The delta rule (``delta_rule.py``) corrects what the memory holds for a key, but never forgets
the keys it is not asked about. Mamba-2 (``ssd.py``) forgets everything at a rate α_t ∈ (0, 1)
chosen by the token, but only adds. The gated delta rule does both: decay the memory by α_t,
then write with the delta rule. With column vectors and the paper's S (Dv × Dk):

$$
S_t = \alpha_t S_{t-1}\left(I - \beta_t k_t k_t^\top\right) + \beta_t v_t k_t^\top,
\qquad o_t = \tau\, S_t q_t
$$

KDA gives every key channel its own rate, a vector α_t ∈ (0, 1)^{Dk}; in Kimi's orientation,
S (Dk × Dv):

$$
S_t = \left(I - \beta_t k_t k_t^\top\right) \operatorname{Diag}(\alpha_t)\, S_{t-1}
      + \beta_t k_t v_t^\top,
\qquad o_t = \tau\, S_t^\top q_t
$$

With every α_{t,d} = a_t the transpose of KDA's recurrence is gated DeltaNet's, and with
a_t = 1 gated DeltaNet is the delta rule (both tested exactly, and shown by ``identities``).

**Decay and write strength, from the token.** Per head h, from the raw key head k̃_t (D), with
learned w_h, u_h (D), U_h (D × D), b_h, A_h and δ_h (a number, or a D-vector for KDA):

$$
\beta_t = \sigma\!\left(w_h^\top \tilde k_t + b_h\right), \qquad
\log \alpha_t = -e^{A_h} \operatorname{softplus}\!\left(u_h^\top \tilde k_t + \delta_h\right)
\ \text{(gated DeltaNet)}, \qquad
\log \alpha_t = -e^{A_h} \operatorname{softplus}\!\left(U_h \tilde k_t + \delta_h\right)
\ \text{(KDA, per channel)}
$$

(the official gate −exp(A_log)·softplus(· + dt_bias), Mamba-2's discretised decay; A_h is
``A_log``, δ_h ``dt_bias``). As the official code does, q and k are made unit vectors,
k_t = k̃_t/√(‖k̃_t‖² + ε), and τ = 1/√D by default.

**Chunkwise form.** The code stores the state as (Dk, Dv) for both variants (KDA's own
orientation, gated DeltaNet's transposed) and folds τ into q. Inside a chunk of c tokens,
started from S₀, let G_t = Σ_{i≤t} log α_i (a D-vector for KDA; the same number in every
channel for gated DeltaNet) and M the causal mask (diagonal included). Unrolled, S_t =
Diag(e^{G_t}) S₀ + Σ_{i≤t} Diag(e^{G_t − G_i}) k_i u_iᵀ, and the rows u_t of U solve a unit
lower-triangular system, as in the delta rule's UT form:

$$
A_{ts} = \beta_t \sum_d k_{td} k_{sd} e^{G_{td} - G_{sd}} \ (s < t), \qquad
(I + A)\, U = \operatorname{diag}(\beta) \left(V - (K \odot e^{G}) S_0\right)
$$

$$
W_{ts} = \sum_d q_{td} k_{sd} e^{G_{td} - G_{sd}}, \qquad
O = (Q \odot e^{G}) S_0 + (W \odot M)\, U, \qquad
S_c = \operatorname{Diag}(e^{G_c}) S_0 + \left(K \odot e^{G_c - G}\right)^\top U
$$

For gated DeltaNet e^{G_t − G_s} = a_{s+1} ··· a_t is retention's decay mask
(``retention.decay_mask``) and W = Q Kᵀ ⊙ L; for KDA it is that mask in every channel
(c × c × D numbers a chunk). Every exponent is G_t − G_s ≤ 0 (s ≤ t): the products are
formed pairwise, never as e^{G_t}/e^{G_s}, which would overflow where the decay is strong. U
comes from ``delta_rule.unit_lower_solve`` (forward substitution). One chunk of N tokens is
the parallel form; chunk after chunk it is the chunkwise form; one token at a time the
recurrence (``gated_delta_recurrent``). For the backward the layers keep only each chunk's
inputs and the state it starts from, and run the chunk again there (``chunk_recomputed``): the
c × c terms (KDA's c × c × D decays) exist for one chunk at a time. The implied pattern
(``hook_pattern``) is P = (W ⊙ M)(I + A)⁻¹ diag(β), with O = P (V − (K ⊙ e^G) S₀) +
(Q ⊙ e^G) S₀.

**Differences from the official code** (flash-linear-attention's ``GatedDeltaNet`` and
``KimiDeltaAttention`` layers and their ``naive_recurrent_*`` references, which the parity
test transcribes):

- β_t and α_t read the token through the head's key projection (w_h·W_k x_t, a D → 1 or
  D → D map per head), so that ``attend(q, k, v)`` holds everything; the official layers
  project them from x: β_t = σ(W_β x_t), and the gate input W_a x_t (gated DeltaNet) or a
  low-rank W_f↑ W_f↓ x_t (KDA).
- Grouped heads follow the attention contract (H query heads reading Hkv key/value heads;
  α and β per query head); the official layers share q and k among value heads instead
  (Qwen3-Next's ``num_v_heads`` > ``num_k_heads``).
- Not included: the short causal convolutions (kernel 4) with SiLU on q, k and v before the
  normalisation; the output gate and the gated RMSNorm of each head's output; KDA's
  alternative bounded gate (``lower_bound``·σ(·)).
- Non-causal (``causal=False``) is minitx's extension: every query reads the memory after the
  last token, o_t = τ S_N q_t, as ``deltanet`` does.
- The chunk length (16 here, 64 there) changes the rounding only, not the output.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
# checkpoint: a chunk (and the gate) kept for the backward as its inputs only, and run again
from ..autograd.checkpoint import checkpoint
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, rng, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import check_heads, register, repeat_kv, repeat_kv_array
from .delta_rule import _unit_rows, delta_chunk, unit_lower_solve
from .retention import RecurrentAttention, decay_mask, run_in_chunks

__all__ = ["gated_delta_chunk", "kda_chunk", "gated_delta_recurrent", "run_gated_chunks",
           "chunk_recomputed", "GatedDeltaNet", "KimiDeltaAttention"]


def _solve_and_read(scores, a, r, beta, hook_pattern):
    """U = (I + A)⁻¹ diag(β) R and the in-chunk output scores·U (the module docstring's
    chunkwise form); with ``hook_pattern`` the output is P R through the implied pattern P."""
    b_ = F.expand_dims(beta, -1)                                        # (B, H, c, 1)
    u = unit_lower_solve(a, r * b_)                                     # (B, H, c, Dv)
    if hook_pattern is None:
        return u, F.matmul(scores, u)
    xp = get_array_module(scores.data)
    diag_beta = b_ * xp.eye(scores.shape[-1], dtype=scores.dtype)      # (B, H, c, c)
    return u, F.matmul(hook_pattern(F.matmul(scores, unit_lower_solve(a, diag_beta))), r)


def gated_delta_chunk(q, k, v, beta, log_alpha, state=None, causal: bool = True,
                      hook_pattern=None):
    """One chunk of gated DeltaNet (the module docstring's chunkwise form, a decay per token
    and head), τ already in q, started from the state S₀ (stored (Dk, Dv)) the chunks before
    left.

    q, k (B, H, c, Dk) (unit keys), v (B, H, c, Dv), beta and log_alpha = log α (B, H, c),
    state (B, H, Dk, Dv) Tensor or None. ``causal=False`` (one chunk, no state): every query
    reads the memory after the last token. ``hook_pattern``: a HookPoint (or None) that sees
    and may replace the implied pattern P (B, H, c, c). Returns (O (B, H, c, Dv),
    S (B, H, Dk, Dv)). Time O(B·H·(c²·D + c·D²)).
    """
    # the decays inside the chunk: cumulative logs, and every pair's product as a mask
    total = F.cumsum(log_alpha, axis=-1)                                # G_t, (B, H, c)
    last = total[..., -1:]                                              # G_c, (B, H, 1)
    decay = decay_mask(log_alpha)                                       # e^{G_t − G_s}, s ≤ t
    a = F.tril(F.matmul(k, F.swapaxes(k, -1, -2)) * decay, -1) * F.expand_dims(beta, -1)
    to_end = F.expand_dims(F.exp(last - total), -1)                     # e^{G_c − G_s}
    # what each query reads of each key's write: W ⊙ M, or (non-causal) of the final memory
    if causal:
        scores = F.matmul(q, F.swapaxes(k, -1, -2)) * decay             # W ⊙ M
    elif state is not None:
        raise ValueError("gated_delta_chunk: a state (the tokens before) needs causal=True")
    else:                                        # every query reads S_c: q_t·(e^{G_c − G_s} k_s)
        scores = F.matmul(q, F.swapaxes(k * to_end, -1, -2))
    # the state the chunks before left, decayed to token t, is what the writes correct
    from_start = F.expand_dims(F.exp(total), -1)                        # e^{G_t}, (B, H, c, 1)
    r = v if state is None else v - F.matmul(k, state) * from_start     # V − (K ⊙ e^G) S₀
    u, out = _solve_and_read(scores, a, r, beta, hook_pattern)
    new_state = F.matmul(F.swapaxes(k * to_end, -1, -2), u)            # (B, H, Dk, Dv)
    # and it is read by each query, and carried (decayed over the chunk) into the next one
    if state is not None:
        out = out + F.matmul(q, state) * from_start
        new_state = new_state + state * F.expand_dims(F.exp(last), -1)
    return out, new_state


def kda_chunk(q, k, v, beta, log_alpha, state=None, causal: bool = True, hook_pattern=None):
    """One chunk of KDA (the module docstring's chunkwise form, a decay per token, head and
    key channel), τ already in q, started from the state S₀ (Dk, Dv) the chunks before left.

    q, k (B, H, c, Dk) (unit keys), v (B, H, c, Dv), beta (B, H, c), log_alpha = log α
    (B, H, c, Dk), state (B, H, Dk, Dv) Tensor or None; ``causal`` and ``hook_pattern`` as
    ``gated_delta_chunk``'s. Returns (O (B, H, c, Dv), S (B, H, Dk, Dv)).
    Time O(B·H·(c²·D + c·D²)), memory O(B·H·c²·D) (the decay of each pair, per channel; one
    chunk's at a time through ``chunk_recomputed``).
    """
    # the decays inside the chunk, per channel: cumulative logs and each pair's mask
    total = F.cumsum(log_alpha, axis=-2)                                # G_t, (B, H, c, Dk)
    last = total[..., -1:, :]                                           # G_c, (B, H, 1, Dk)
    decay = decay_mask(F.swapaxes(log_alpha, -1, -2))                   # (B, H, Dk, c, c)
    pairs = "bhtd,bhsd,bhdts->bhts"              # Σ_d x_td k_sd e^{G_td − G_sd}, s ≤ t
    a = F.tril(F.einsum(pairs, k, k, decay), -1) * F.expand_dims(beta, -1)
    to_end = F.exp(last - total)                                        # e^{G_c − G_s}
    # what each query reads of each key's write: W ⊙ M, or (non-causal) of the final memory
    if causal:
        scores = F.einsum(pairs, q, k, decay)                           # W ⊙ M
    elif state is not None:
        raise ValueError("kda_chunk: a state (the tokens before) needs causal=True")
    else:
        scores = F.matmul(q, F.swapaxes(k * to_end, -1, -2))
    # the state before the chunk, decayed channel by channel to token t: V − (K ⊙ e^G) S₀
    from_start = F.exp(total)                                           # e^{G_t}
    r = v if state is None else v - F.matmul(k * from_start, state)
    u, out = _solve_and_read(scores, a, r, beta, hook_pattern)
    new_state = F.matmul(F.swapaxes(k * to_end, -1, -2), u)            # (B, H, Dk, Dv)
    # and it is read by each query, and carried (decayed over the chunk) into the next one
    if state is not None:
        out = out + F.matmul(q * from_start, state)
        new_state = new_state + state * F.swapaxes(F.exp(last), -1, -2)   # Diag(e^{G_c}) S₀
    return out, new_state


def gated_delta_recurrent(q, k, v, beta, log_alpha):
    """The module docstring's recurrence, token by token (the definition), τ already in q,
    the state stored (Dk, Dv), S₀ = 0: decay, then the delta rule's write, then the read.

    q, k (B, H, N, Dk), v (B, H, N, Dv), beta (B, H, N) Tensors; log_alpha = log α (B, H, N)
    (gated DeltaNet: one decay per head) or (B, H, N, Dk) (KDA: one per key channel) →
    (O (B, H, N, Dv), S_N). Time O(N·Dk·Dv) per head, state O(Dk·Dv): a loop over
    positions — the recurrence is the point."""
    xp = get_array_module(q.data)
    b, h, n, _ = q.shape
    s = Tensor._wrap(xp.zeros((b, h, k.shape[-1], v.shape[-1]), dtype=q.dtype))
    alpha = F.exp(log_alpha)
    # a decay per head scales all of S; one per channel scales each row d of S (Dk, Dv)
    alpha = F.expand_dims(F.expand_dims(alpha, -1), -1) if len(log_alpha.shape) == 3 else \
        F.expand_dims(alpha, -1)                                        # (B, H, N, 1|Dk, 1)
    bt = F.expand_dims(F.expand_dims(beta, -1), -1)                     # (B, H, N, 1, 1)
    outs = []
    for t in range(n):
        kt, vt = k[:, :, t:t + 1], v[:, :, t:t + 1]                    # (B, H, 1, D)
        s = alpha[:, :, t] * s                                          # Diag(α_t) S
        error = vt - F.matmul(kt, s)                                    # v_t − k_t S
        s = s + bt[:, :, t] * F.matmul(F.swapaxes(kt, -1, -2), error)   # (B, H, Dk, Dv)
        outs.append(F.matmul(q[:, :, t:t + 1], s))
    return F.concatenate(outs, axis=2), s


def run_gated_chunks(chunk_fn, q, k, v, beta, log_alpha, state=None, chunk_size=None,
                     recompute: bool = False, **options):
    """The chunkwise form: ``chunk_fn`` (``gated_delta_chunk`` or ``kda_chunk``) on chunks of
    ``chunk_size`` tokens in order (None: one chunk), each started from the state the one
    before left; beta (B, H, N) and log_alpha (B, H, N[, Dk]) are sliced with the tokens, and
    ``options`` passed on. Returns (O (B, H, N, Dv), the state after the last token). A loop
    over N/C chunks, not tokens.

    ``recompute``: keep for the backward only each chunk's inputs and the state it starts
    from, and run the chunk again there (``chunk_recomputed``) — the same values and
    gradients, with memory O(N·D + (N/C)·D²) instead of every chunk's in-chunk terms
    (O(N·C), and O(N·C·D) for KDA's per-channel decays)."""
    n = q.shape[2]
    size = n if chunk_size is None else chunk_size
    run = chunk_recomputed if recompute and is_grad_enabled() else _call
    outs = []
    for start in range(0, n, size):
        part = slice(start, min(n, start + size))
        out, state = run(chunk_fn, q[:, :, part], k[:, :, part], v[:, :, part],
                         beta[:, :, part], log_alpha[:, :, part], state, **options)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else F.concatenate(outs, axis=2)), state


def _call(chunk_fn, *args, **options):
    """The chunk as composed: its graph keeps every intermediate for the backward."""
    return chunk_fn(*args, **options)


def chunk_recomputed(chunk_fn, q, k, v, beta, log_alpha, state=None, **options):
    """``chunk_fn(q, k, v, beta, log_alpha, state, **options)`` through ``autograd.checkpoint``:
    the forward keeps none of the chunk's intermediates (its c × c scores, the solve, KDA's
    c × c × Dk decays), only its inputs; the backward runs the chunk again, graph on, and
    backpropagates through that. Returns (O, S) as ``chunk_fn`` does."""
    c = q.shape[2]

    def joined(*args):                   # one Tensor out, as checkpoint asks: [O; S] on rows
        out, new_state = chunk_fn(*args[:5], args[5] if len(args) > 5 else None, **options)
        return F.concatenate([out, new_state], axis=2)         # (B, H, c + Dk, Dv)

    both = checkpoint(joined, q, k, v, beta, log_alpha, *(() if state is None else (state,)))
    return both[:, :, :c], both[:, :, c:]


def _softplus_array(x):
    return get_array_module(x).logaddexp(0, x)


@register("gated_deltanet")
class GatedDeltaNet(RecurrentAttention):
    r"""Gated DeltaNet: the delta rule on a memory that decays by a data-dependent α_t per head
    before each write — it forgets everything a little and corrects what it is told.

    Formula: the module docstring's S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,
    o_t = τ S_t q_t, on unit keys and queries, with β_t and log α_t learned functions of the
    raw key head. Computed chunkwise (``gated_delta_chunk``); its differences from the official
    code are listed there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); β and log α (B, H, N); the state (B, H, D, D) (stored
    as Sᵀ). Hook points (besides hook_q/k/v/z): ``hook_beta`` β and ``hook_log_alpha``
    log α (≤ 0; 0 is no decay) (B, H, N), replaceable; ``hook_pattern`` the implied pattern
    P (B, H, N, N) (module docstring), out = P V, replaceable, formed on request (one chunk of
    N); ``hook_state`` the state after the last token.

    Options: ``causal`` (False), ``chunk_size`` C (16; None: one chunk), ``scale`` τ (None:
    1/√D, the official kernel's), ``eps`` (1e-12, in the normalisations), ``num_kv_heads``,
    ``bias``. Parameters: ``beta_weight`` w (H, D), ``beta_bias`` b (H,), ``alpha_weight`` u
    (H, D), ``dt_bias`` δ (H,) (softplus(δ) log-uniform in [0.001, 0.1]), ``A_log`` (H,)
    (e^A uniform in [1, 16]), initialised as the official layer's. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant size).

    Complexity: {complexity}; decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own recurrence,
    ``reference``, chunkwise against token by token, and against the official equations in
    PyTorch).

    Reference: Yang, Kautz & Hatamizadeh (2025), "Gated Delta Networks: Improving Mamba2 with
    Delta Rule", ICLR.
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
        g = rng()
        xp = active_xp()
        # β = σ(w·k̃ + b) starts near 1/2 (w small), as deltanet's
        self.beta_weight = Parameter(xp.asarray(g.standard_normal((h, d)) * 0.02)
                                     .astype("float32"))
        self.beta_bias = Parameter(xp.zeros((h,), dtype="float32"))
        # the official initialisation: softplus(δ) log-uniform in [1e-3, 1e-1] (δ = softplus⁻¹
        # of it = Δ + log(1 − e^{−Δ})), e^A uniform in [1, 16]; the gate weights small
        dt = host_xp.exp(g.uniform(math.log(1e-3), math.log(1e-1), self._gate_shape()))
        self.dt_bias = Parameter(xp.asarray(dt + host_xp.log(-host_xp.expm1(-dt)))
                                 .astype("float32"))
        self.alpha_weight = Parameter(
            xp.asarray(g.standard_normal(self._gate_shape() + (d,)) * 0.02).astype("float32"))
        self.A_log = Parameter(xp.asarray(host_xp.log(g.uniform(1, 16, h))).astype("float32"))
        self.hook_beta = HookPoint()        # (B, H, N) write strengths
        self.hook_log_alpha = HookPoint()   # (B, H, N) log decays (KDA: (B, H, N, D))
        self.hook_pattern = HookPoint()     # (B, H, N, N) implied pattern, on request

    def _gate_shape(self):
        """The shape of δ: one decay per head."""
        return (self.num_heads,)

    def gate_input(self, k):
        """Raw key heads k (B, H, N, D) → u_h·k̃_t + δ_h (B, H, N)."""
        return (F.einsum("bhnd,hd->bhn", k, self.alpha_weight)
                + F.reshape(self.dt_bias, (1, -1, 1)))

    def log_decay(self, k):
        """Raw key heads k (B, H, N, D) → log α = −e^{A_h} softplus(gate_input(k)) (module
        docstring), (B, H, N) or, for KDA, (B, H, N, D)."""
        # e^{A_h}, (1, H, 1) or, for a decay per channel, (1, H, 1, 1)
        rate = F.reshape(F.exp(self.A_log), (1, -1) + (1,) * len(self._gate_shape()))
        return -rate * F.softplus(self.gate_input(k))

    def features(self, q, k):
        """Raw heads q, k (B, H, N, D) → τ·(unit q), unit k, β (B, H, N), log α (module
        docstring)."""
        beta = F.sigmoid(F.einsum("bhnd,hd->bhn", k, self.beta_weight)
                         + F.reshape(self.beta_bias, (1, -1, 1)))
        # the gate's steps are kept by none but the backward, which recomputes them (for KDA
        # each is D numbers a token)
        log_alpha = checkpoint(self.log_decay, k)
        return (_unit_rows(q, self.eps) * self.scale, _unit_rows(k, self.eps),
                self.hook_beta(beta), self.hook_log_alpha(log_alpha))

    _chunk_fn = staticmethod(gated_delta_chunk)

    def _chunks(self, q, k, v, beta, log_alpha, state, chunk_size, causal=True):
        hooked = self.hook_pattern if self.hook_pattern.active else None
        # a hooked pattern may be read or replaced: then the chunk's graph is the one recorded
        return run_gated_chunks(self._chunk_fn, q, k, v, beta, log_alpha, state, chunk_size,
                                recompute=hooked is None, causal=causal, hook_pattern=hooked)

    def extend(self, q, k, v, state):
        """The n new tokens after ``state``: q (B, H, n, D), k/v (B, Hkv, n, D) → (out, state)."""
        h = q.shape[1]
        q, k, beta, log_alpha = self.features(q, repeat_kv(k, h))
        chunk = None if self.hook_pattern.active else self.chunk_size
        return self._chunks(q, k, repeat_kv(v, h), beta, log_alpha, state, chunk)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D)."""
        check_heads(q, k, v, self.name)
        # Causal: each query reads the state just after its own token (the chunked recurrence).
        # Non-causal: every token is written first, then each query reads the final S.
        if self.causal:
            out, state = self.extend(q, k, v, None)
        else:
            h = q.shape[1]
            qn, kn, beta, log_alpha = self.features(q, repeat_kv(k, h))
            vh = repeat_kv(v, h)
            if self.hook_pattern.active:                 # one chunk, so the pattern is whole
                out, state = self._chunks(qn, kn, vh, beta, log_alpha, None, None, causal=False)
            else:                                        # write every token, then read
                _, state = self._chunks(qn, kn, vh, beta, log_alpha, None, self.chunk_size)
                out = F.matmul(qn, state)                               # (B, H, N, Dv)
        self.show_state(state)
        return out

    def _gates_array(self, k):
        """Raw key heads (B, H, N, D) → β and log α as raw arrays (the module docstring's
        formulas, for ``reference``)."""
        xp = get_array_module(k)
        w, b = (p.data.astype(k.dtype) for p in (self.beta_weight, self.beta_bias))
        beta = 1 / (1 + xp.exp(-(xp.einsum("bhnd,hd->bhn", k, w) + b[:, None])))
        u, delta = (p.data.astype(k.dtype) for p in (self.alpha_weight, self.dt_bias))
        rate = xp.exp(self.A_log.data.astype(k.dtype))
        if u.ndim == 2:                                                 # per head
            return beta, -rate[:, None] * _softplus_array(
                xp.einsum("bhnd,hd->bhn", k, u) + delta[:, None])
        return beta, -rate[:, None, None] * _softplus_array(            # per channel
            xp.einsum("bhnd,hed->bhne", k, u) + delta[:, None, :])

    def reference(self, q, k, v):
        """Raw arrays: the module docstring's recurrence token by token, o = τ q̂ S
        (non-causal: every query reads the final S) — the definition, for tests."""
        xp = get_array_module(q)
        h = q.shape[1]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        beta, log_alpha = self._gates_array(k)
        alpha = xp.exp(log_alpha)
        qn = q / xp.sqrt((q * q).sum(-1, keepdims=True) + self.eps) * self.scale
        kn = k / xp.sqrt((k * k).sum(-1, keepdims=True) + self.eps)
        s = xp.zeros(q.shape[:2] + (k.shape[-1], v.shape[-1]), dtype=q.dtype)   # (Dk, Dv)
        out = xp.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
        for t in range(q.shape[2]):
            # decay (all of S, or row d by α_{t,d}), read what S stores under k̂_t, move it
            # towards v_t by β_t, then read with q̂_t
            s = s * (alpha[:, :, t, None, None] if alpha.ndim == 3 else
                     alpha[:, :, t, :, None])
            error = v[:, :, t] - xp.einsum("bhd,bhde->bhe", kn[:, :, t], s)
            s = s + beta[:, :, t, None, None] * kn[:, :, t, :, None] * error[:, :, None, :]
            out[:, :, t] = xp.einsum("bhd,bhde->bhe", qn[:, :, t], s)
        if not self.causal:
            out = xp.einsum("bhnd,bhde->bhne", qn, s)
        return out

    @staticmethod
    def _identity_inputs(seed, channels):
        """Unit q, k (1, 2, 13, 4), v, β ∈ (0.1, 1) and log α with α ∈ (0.5, 1), float64
        (log α (1, 2, 13), or (1, 2, 13, 4) with ``channels``)."""
        g = host_xp.random.default_rng(seed)
        q, k, v = (Tensor(active_xp().asarray(g.standard_normal((1, 2, 13, 4))))
                   for _ in range(3))
        beta = Tensor(active_xp().asarray(g.uniform(0.1, 1.0, (1, 2, 13))))
        shape = (1, 2, 13, 4) if channels else (1, 2, 13)
        log_alpha = Tensor(active_xp().asarray(host_xp.log(g.uniform(0.5, 1.0, shape))))
        return _unit_rows(q, 1e-12), _unit_rows(k, 1e-12), v, beta, log_alpha

    @classmethod
    def identities(cls, seed=0):
        """Chunkwise (C = 4) and one chunk (the parallel form) against the recurrence, and
        α ≡ 1 against the delta rule: float64, B = 1, H = 2, D = 4, N = 13."""
        q, k, v, beta, log_alpha = cls._identity_inputs(seed, channels=False)
        # one set of inputs through the recurrence, chunks of 4, and one chunk of all 13
        with no_grad():
            recurrent = to_host(gated_delta_recurrent(q, k, v, beta, log_alpha)[0].data)
            rows = []
            for c in (4, 13):
                out = to_host(run_gated_chunks(gated_delta_chunk, q, k, v, beta, log_alpha,
                                               None, c)[0].data)
                rows.append((f"chunkwise (C = {c}) − recurrence S_t = α_t S_{{t−1}}(I − "
                             f"β_t k_t k_tᵀ) + β_t v_t k_tᵀ, max |Δ|",
                             float(host_xp.abs(out - recurrent).max()), 1e-12))
            # log α = 0: nothing decays, and the chunk must be the delta rule's own
            no_decay = Tensor(active_xp().zeros((1, 2, 13)))
            gated = to_host(run_gated_chunks(gated_delta_chunk, q, k, v, beta, no_decay,
                                             None, 4)[0].data)
            delta = to_host(run_in_chunks(delta_chunk, q, k, v, beta, None, 4)[0].data)
        rows.append(("gated DeltaNet with α ≡ 1 − deltanet (both C = 4), max |Δ|",
                     float(host_xp.abs(gated - delta).max()), 1e-12))
        return rows


@register("kda")
class KimiDeltaAttention(GatedDeltaNet):
    r"""Kimi Delta Attention (KDA): the gated delta rule with a decay per key channel — each
    of the D rows of the memory forgets at its own data-dependent rate α_{t,d}.

    Formula: the module docstring's S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ,
    o_t = τ S_tᵀ q_t, on unit keys and queries, with β_t and the vector log α_t learned
    functions of the raw key head. Computed chunkwise (``kda_chunk``); with the same decay in
    every channel it is ``gated_deltanet``. Its differences from the official code are listed
    in the module docstring.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); β (B, H, N); log α (B, H, N, D); the state (B, H, D, D).
    Hook points (besides hook_q/k/v/z): ``hook_beta`` β (B, H, N) and ``hook_log_alpha``
    log α (B, H, N, D) (≤ 0; 0 is no decay), replaceable; ``hook_pattern`` the implied pattern
    P (B, H, N, N), out = P V, replaceable, formed on request (one chunk of N);
    ``hook_state`` the state after the last token.

    Options: as ``gated_deltanet``'s: ``causal`` (False), ``chunk_size`` C (16; None: one
    chunk), ``scale`` τ (None: 1/√D), ``eps`` (1e-12), ``num_kv_heads``, ``bias``.
    Parameters: ``beta_weight`` (H, D), ``beta_bias`` (H,), ``alpha_weight`` U (H, D, D) (a
    full D × D map per head; the official layer's is low-rank, from x), ``dt_bias`` δ (H, D)
    (softplus(δ) log-uniform in [0.001, 0.1]), ``A_log`` (H,) (e^A uniform in [1, 16]).
    Decoding: ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant
    size).

    Complexity: {complexity}; decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own recurrence,
    ``reference``, chunkwise against token by token, and against the official equations in
    PyTorch).

    Reference: Kimi Team (2025), "Kimi Linear: An Expressive, Efficient Attention
    Architecture", Moonshot AI; Yang, Kautz & Hatamizadeh (2025), "Gated Delta Networks", ICLR.
    """

    complexity = "time O(B·H·N·(C·D + D²)), memory O(B·H·(N·(C + D + D²/C) + C²·D))"

    _chunk_fn = staticmethod(kda_chunk)

    def _gate_shape(self):
        """The shape of δ: one decay per head and key channel."""
        return (self.num_heads, self.head_dim)

    def gate_input(self, k):
        """Raw key heads k (B, H, N, D) → U_h k̃_t + δ_h (B, H, N, D)."""
        return (F.einsum("bhnd,hed->bhne", k, self.alpha_weight)
                + F.expand_dims(F.expand_dims(self.dt_bias, 0), 2))

    @classmethod
    def identities(cls, seed=0):
        """Chunkwise (C = 4) and one chunk (the parallel form) against the recurrence, and a
        decay that is the same in every channel against gated DeltaNet: float64, B = 1, H = 2,
        D = 4, N = 13."""
        q, k, v, beta, log_alpha = cls._identity_inputs(seed, channels=True)
        # one set of inputs through the recurrence, chunks of 4, and one chunk of all 13
        with no_grad():
            recurrent = to_host(gated_delta_recurrent(q, k, v, beta, log_alpha)[0].data)
            rows = []
            for c in (4, 13):
                out = to_host(run_gated_chunks(kda_chunk, q, k, v, beta, log_alpha, None,
                                               c)[0].data)
                rows.append((f"chunkwise (C = {c}) − recurrence S_t = (I − β_t k_t k_tᵀ) "
                             f"Diag(α_t) S_{{t−1}} + β_t k_t v_tᵀ, max |Δ|",
                             float(host_xp.abs(out - recurrent).max()), 1e-12))
            # channel 0's decays, copied to every channel, against gated DeltaNet's chunk
            per_head = log_alpha[..., 0]                                  # (1, 2, 13)
            same = F.broadcast_to(F.expand_dims(per_head, -1), log_alpha.shape)
            kda = to_host(run_gated_chunks(kda_chunk, q, k, v, beta, same, None, 4)[0].data)
            gated = to_host(run_gated_chunks(gated_delta_chunk, q, k, v, beta, per_head, None,
                                             4)[0].data)
        rows.append(("KDA with α_{t,d} = a_t in every channel − gated DeltaNet (both C = 4), "
                     "max |Δ|", float(host_xp.abs(kda - gated).max()), 1e-12))
        return rows
