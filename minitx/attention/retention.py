r"""Retention: attention with a fixed exponential decay instead of a softmax — three forms of one
map, and the decoding state they share with the delta rule and SSD.

Sun, Dong, Huang, Ma, Xia, Xue, Wang & Wei (2023), "Retentive Network: A Successor to
Transformer for Large Language Models".

One head h of retention is a linear recurrence over a (D × Dv) state, with row vectors
q_n, k_n (1, D), v_n (1, Dv) and a fixed decay γ_h per head (``retention_decays``):

$$
S_n = \gamma_h S_{n-1} + \frac{k_n^\top v_n}{\sqrt{D}}, \qquad S_0 = 0, \qquad o_n = q_n S_n
$$

Unrolled, $o_n = \sum_{m \le n} \gamma_h^{\,n-m} \, (q_n \cdot k_m / \sqrt{D}) \, v_m$, which is
the **parallel form**, causal attention with the softmax replaced by a fixed,
position-dependent weight:

$$
O = \left( \frac{Q K^\top}{\sqrt{D}} \odot \mathcal{D} \right) V,
\qquad \mathcal{D}_{nm} = \begin{cases} \gamma_h^{\,n-m} & n \ge m \\ 0 & n < m \end{cases}
$$

The **chunkwise form** splits the sequence into chunks of C tokens: inside a chunk the
parallel form, across chunks the state, O(N·C) memory instead of O(N²). All three give the
same numbers.

The code here is written once for a per-token decay $a_t = e^{\ell_t}$ in place of γ_h,
$S_t = a_t S_{t-1} + k_t^\top v_t$ (k already scaled), where the decay mask becomes

$$
L_{ts} = a_{s+1} \cdots a_t = \exp(\ell_{s+1} + \dots + \ell_t) \quad (t \ge s),
\qquad L_{ts} = 0 \quad (t < s)
$$

and retention is the case a_t = γ_h, where L = 𝒟. ``ssd.py`` (Mamba-2's state-space
duality, Dao & Gu 2024) reuses ``decay_mask`` and ``decayed_chunk`` with input-dependent a_t;
``RecurrentState`` / ``RecurrentAttention`` (the decoding state and the cached forward) serve
retention, the delta rule and SSD.
"""
from __future__ import annotations


from .. import functional as F
from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from .base import (AttentionBase, check_heads, hooked_heads, merge_heads, register, repeat_kv,
                   repeat_kv_array)

__all__ = ["retention_decays", "decay_mask", "decayed_chunk", "run_in_chunks",
           "decayed_recurrence", "RecurrentState", "RecurrentAttention", "Retention"]


def retention_decays(num_heads: int):
    """RetNet's per-head decays γ_h = 1 − 2^(−5−h), h = 0 … H−1 (host float64 array (H,)).

    The paper's schedule (``1 - 2 ** (-5 - arange(H))`` in its code): head 0 forgets fastest
    (γ = 0.96875, a memory of about 1/(1 − γ) = 32 tokens), each next head remembers twice as
    long (γ = 0.984375, 0.9921875, …)."""
    h = host_xp.arange(validate.positive_int(num_heads, "num_heads", owner="retention_decays"))
    return 1.0 - 2.0 ** (-5.0 - h)


# ---- the decay mask, for a constant or a per-token decay ---------------------------------

def decay_mask(log_decay, causal: bool = True):
    """The decay mask L of the module docstring: log_decay ℓ (…, N) Tensor → (…, N, N) Tensor.
    Non-causal, the mask is made symmetric: L_ts = L_st above the diagonal.

    The segment sums are a cumulative sum along each row of the masked (N, N) matrix
    Xᵀ_st = ℓ_t [t > s], whose row s holds Σ_{s<r≤t} ℓ_r at column t (L's transpose) — not a
    difference of prefix sums A_t − A_s, which loses digits when A grows large (Mamba-2's
    ``segsum``). Built transposed because NumPy's cumsum runs about ten times faster along the
    contiguous axis. Time and memory O(N²) per leading index.
    """
    n = log_decay.shape[-1]
    xp = get_array_module(log_decay.data)
    later = ~xp.tri(n, n, 0, dtype=bool)                               # [s, t]: t > s
    rows = F.broadcast_to(F.expand_dims(log_decay, -2), (*log_decay.shape[:-1], n, n))  # ℓ_t
    seg_t = F.cumsum(F.masked_fill(rows, ~later, 0.0), axis=-1)       # [s, t]: Σ_{s<r≤t} ℓ_r
    # causal: −inf where t < s, so exp gives 0 there; otherwise seg_ts + seg_st (one of the two
    # is 0 off the diagonal, both on it) gives the symmetric mask, the same in either frame
    if causal:
        return F.swapaxes(F.exp(F.masked_fill(seg_t, xp.tri(n, n, -1, dtype=bool),
                                              -host_xp.inf)), -1, -2)
    return F.exp(seg_t + F.swapaxes(seg_t, -1, -2))


def decayed_chunk(q, k, v, log_decay, state=None, causal: bool = True, hook_decay=None,
                  hook_pattern=None):
    r"""One chunk of c tokens of the module docstring's decayed recurrence, started from the
    state S₀ left by the chunks before it (None: zero). The output is what the chunk sees
    inside it plus what it reads of the state before; the state after is the decayed state
    before plus the chunk's own writes:

    $$
    \begin{aligned}
    O &= (Q K^\top \odot L) V + (Q S_0) \odot \xi, \qquad \xi_t = a_1 \cdots a_t \\
    S &= (a_1 \cdots a_c) S_0 + K^\top (V \odot \zeta), \qquad \zeta_s = a_{s+1} \cdots a_c
    \end{aligned}
    $$

    with L = ``decay_mask(log_decay)``. With S₀ = None and the whole sequence as one chunk this
    is the parallel form; chunk after chunk it is the chunkwise form (Sun et al. 2023, eq. 7);
    one token at a time it is the recurrence.

    q, k (B, H, c, Dk), v (B, H, c, Dv), log_decay ℓ = log a (B or 1, H, c), state
    (B, H, Dk, Dv) Tensor or None. ``causal=False`` (state must be None) uses the symmetric
    mask. ``hook_decay`` / ``hook_pattern``: HookPoints (or None) that see, and may replace,
    L and the pattern Q Kᵀ ⊙ L. Returns (O (B, H, c, Dv), S (B, H, Dk, Dv)); S is the state
    of the forward recurrence after the chunk (also when ``causal=False``).
    Time O(B·H·c·(c + Dk)·Dv), memory O(B·H·c²).
    """
    decay = decay_mask(log_decay, causal)                              # (B|1, H, c, c)
    if hook_decay is not None:
        decay = hook_decay(decay)
    pattern = F.matmul(q, F.swapaxes(k, -1, -2)) * decay               # (B, H, c, c)
    if hook_pattern is not None:
        pattern = hook_pattern(pattern)
    out = F.matmul(pattern, v)                                         # (B, H, c, Dv)
    # cumulative log-decays A_t = ℓ_1 + … + ℓ_t: ξ_t = exp(A_t), ζ_s = exp(A_c − A_s) (≤ 1)
    total = F.cumsum(log_decay, axis=-1)                               # (B|1, H, c)
    last = total[..., -1:]                                             # (B|1, H, 1)
    to_end = F.exp(last - total)                                       # ζ
    new_state = F.matmul(F.swapaxes(k, -1, -2), v * F.expand_dims(to_end, -1))  # (B, H, Dk, Dv)
    if state is not None:
        if not causal:
            raise ValueError("decayed_chunk: a state (the tokens before) needs causal=True")
        out = out + F.matmul(q, state) * F.expand_dims(F.exp(total), -1)
        new_state = new_state + state * F.expand_dims(F.exp(last), -1)
    return out, new_state


def run_in_chunks(chunk_fn, q, k, v, gates, state=None, chunk_size=None):
    """The chunkwise form of a recurrent variant: ``chunk_fn(q, k, v, gates, state) → (out,
    state)`` applied to chunks of ``chunk_size`` tokens in order (None: one chunk), each
    started from the state the one before left. q, k (B, H, N, Dk), v (B, H, N, Dv), gates
    (…, N) (the per-token decays or write strengths, sliced with the tokens). Returns
    (O (B, H, N, Dv), the state after the last token). A loop over N/C chunks, not tokens."""
    n = q.shape[2]
    size = n if chunk_size is None else chunk_size
    outs = []
    for start in range(0, n, size):
        part = slice(start, min(n, start + size))
        out, state = chunk_fn(q[:, :, part], k[:, :, part], v[:, :, part], gates[..., part],
                              state)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else F.concatenate(outs, axis=2)), state


def decayed_recurrence(q, k, v, log_decay):
    """The recurrent form, token by token — the definition the other forms are checked
    against, and what decoding does: the module docstring's recurrence for a per-token a_t.

    q, k (B, H, N, Dk), v (B, H, N, Dv) Tensors, log_decay ℓ = log a (B or 1, H, N)
    (retention: log γ_h at every t) → (O (B, H, N, Dv), S_N (B, H, Dk, Dv)). Time
    O(N·Dk·Dv) per head, state memory O(Dk·Dv): a Python loop over positions, because the
    recurrence is the point."""
    xp = get_array_module(q.data)
    b, h, n, _ = q.shape
    a = F.expand_dims(F.exp(log_decay), -1)                            # (B|1, H, N, 1)
    s = Tensor._wrap(xp.zeros((b, h, k.shape[-1], v.shape[-1]), dtype=q.dtype))
    outs = []
    for t in range(n):
        kt, vt = k[:, :, t:t + 1], v[:, :, t:t + 1]                    # (B, H, 1, D)
        s = a[:, :, t:t + 1] * s + F.matmul(F.swapaxes(kt, -1, -2), vt)   # (B, H, Dk, Dv)
        outs.append(F.matmul(q[:, :, t:t + 1], s))                     # (B, H, 1, Dv)
    return F.concatenate(outs, axis=2), s


# ---- the decoding state, shared by the recurrent variants --------------------------------

class RecurrentState:
    """The decode cache of a recurrent variant (retention, deltanet, ssd): one state per layer,
    (B, H, Dk, Dv) — the same size after 1 token or 10 000 (a ``KVCache`` grows with every
    token). ``len(cache)`` is the number of tokens seen (GPT reads it as the next position);
    ``state`` the raw array (None before the first token), ``nbytes`` its size, ``reset()``
    forgets. It holds raw arrays: decoding is inference, no gradient flows through it."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget every token seen."""
        self.state = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return 0 if self.state is None else int(self.state.nbytes)

    def tensor(self):
        """The state as a Tensor (no gradient), or None before the first token."""
        return None if self.state is None else Tensor._wrap(self.state)

    def update(self, state, num_tokens: int) -> None:
        """Keep ``state`` (a Tensor or raw array (B, H, Dk, Dv)) after ``num_tokens`` more."""
        raw = state.data if isinstance(state, Tensor) else state
        if self.state is not None and raw.shape != self.state.shape:
            raise ValueError(f"RecurrentState: the new state has shape {tuple(raw.shape)}, the "
                             f"cached one {tuple(self.state.shape)} (another batch or layer?)")
        self.state = raw
        self.length += int(num_tokens)

    def __repr__(self) -> str:
        shape = None if self.state is None else tuple(self.state.shape)
        return f"RecurrentState(tokens={self.length}, state={shape})"


class RecurrentAttention(AttentionBase):
    """The plumbing retention, deltanet and ssd share: a ``RecurrentState`` as the decode
    cache (``new_cache()``), ``forward(x, kv_cache=state)`` continuing from it, the
    ``chunk_size`` option, and ``hook_state`` (B, H, Dk, Dv): the state after the last token of
    the call — read-only without a cache; with one, its return value is what is cached (the
    memory the next tokens read).

    A subclass implements ``extend(q, k, v, state)`` → (out, new state): q (B, H, n, D),
    k/v (B, Hkv, n, D) the new tokens, state the Tensor before them (None: none).
    """

    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, chunk_size=None, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.chunk_size = None if chunk_size is None else \
            validate.positive_int(chunk_size, "chunk_size", owner=self.name)
        self.hook_state = HookPoint()        # (B, H, Dk, Dv) the state after the last token

    def new_cache(self):
        """An empty ``RecurrentState``: the decode cache ``forward(x, kv_cache=…)`` takes."""
        return RecurrentState()

    def extend(self, q, k, v, state):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, n, E) → (B, n, E); with ``kv_cache`` (a ``RecurrentState``) the n tokens
        continue the ones the state has seen (a prefill, or one token at a time)."""
        if kv_cache is None:
            return super().forward(x, attn_mask=attn_mask)
        # Decoding with a state: only causal layers (a state summarises the past, never the future),
        # no attn_mask (the decay already weights the past), and x must be (B, n, E).
        who = type(self).__name__
        if not isinstance(kv_cache, RecurrentState):
            raise TypeError(f"{who} ({self.name}): kv_cache must be a RecurrentState (from "
                            f"new_cache()), got {type(kv_cache).__name__}")
        if not self.causal:
            raise ValueError(f"{who} ({self.name}): decoding with a state needs causal=True, "
                             f"got causal=False")
        if attn_mask is not None:
            raise ValueError(f"{who} ({self.name}) does not take an attn_mask")
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        # Heads as in the parallel form; the recurrence continues from the cached state, and the new
        # state is stored outside the graph (the cache holds values, not history to backpropagate).
        q, k, v = self.project(x)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        y, state = self.extend(q, k, v, kv_cache.tensor())
        with no_grad():
            kv_cache.update(self.hook_state(state), x.shape[1])
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def show_state(self, state):
        """Run ``hook_state`` on the final state of a cache-less call (read-only)."""
        if self.hook_state.active:
            self.hook_state(state)


@register("retention")
class Retention(RecurrentAttention):
    r"""Retention (RetNet): causal attention with a fixed, position-dependent decay in place of
    the softmax — a linear recurrence with a (D × Dv) state per head.

    Formula: the module docstring's recurrence and its parallel form, per head, with
    the decays γ_h of ``retention_decays``.

    Included: the retention core, its three forms (parallel; chunkwise, eq. 7; recurrent, for
    decoding) and the paper's decay schedule. Not included, and why: the xPos-like rotation
    of q and k (e^{inθ}; RoPE's rotation, see ``rope``) — here positions come from the decay
    alone (use ``GPTConfig(position="none")`` or "learned"); the per-head GroupNorm, the
    swish gate and the score normalisations of the paper's MSR block — they sit outside the
    attention contract, and the normalisations exist only because GroupNorm's scale
    invariance cancels them. Non-causal (``causal=False``) is minitx's extension, not the
    paper's: the symmetric decay D_nm = γ^{|n−m|} (the 1-D case of RMT's distance decay,
    Fan et al. 2023); it has no recurrent form.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); D (1, H, N, N); the state S (B, H, D, D).
    Hook points (besides hook_q/k/v/z): ``hook_decay`` D (1, H, N, N) and ``hook_pattern``
    Q Kᵀ/√D ⊙ D (B, H, N, N), both replaceable (out = pattern V); ``hook_state`` the state
    after the last token. Forms with a hook on D or the pattern run as one chunk.

    Options: ``causal`` (False), ``chunk_size`` C (None: the parallel form; an int: the
    chunkwise form, causal only), ``num_kv_heads``, ``bias``. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant size).

    Complexity: {complexity}; chunkwise O(B·H·N·C·D) memory; decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own dense formula,
    ``reference``, and its three forms against each other).

    Reference: Sun, Dong, Huang, Ma, Xia, Xue, Wang & Wei (2023), "Retentive Network: A
    Successor to Transformer for Large Language Models".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, chunk_size=None, **base):
        super().__init__(embed_dim, num_heads, causal=causal, chunk_size=chunk_size, **base)
        self.gammas = retention_decays(self.num_heads)      # host (H,), fixed as in the paper
        self.scale = self.head_dim ** -0.5
        self.hook_decay = HookPoint()        # (1, H, N, N) the decay mask 𝒟
        self.hook_pattern = HookPoint()      # (B, H, N, N) Q Kᵀ/√D ⊙ D

    def log_decay(self, n: int, like):
        """(1, H, n) Tensor of log γ_h (retention's constant per-token decay), in ``like``'s
        array module and dtype."""
        xp = get_array_module(like.data)
        logs = xp.asarray(host_xp.log(self.gammas), dtype=like.dtype)                  # (H,)
        return Tensor._wrap(xp.broadcast_to(logs[None, :, None], (1, self.num_heads, n)).copy())

    def decay_matrix(self, n: int):
        """The decay mask 𝒟 (H, n, n) of the module docstring, a host array (γ^{|n−m|} when
        non-causal): what each head remembers of each earlier token (a picture)."""
        like = Tensor(active_xp().zeros((), dtype="float64"))
        with no_grad():
            return to_host(decay_mask(self.log_decay(n, like), self.causal).data)[0]

    def _chunk(self, q, k, v, log_decay, state, causal=True):
        hooked = self.hook_decay.active or self.hook_pattern.active
        return decayed_chunk(q, k * self.scale, v, log_decay, state, causal=causal,
                             hook_decay=self.hook_decay if hooked else None,
                             hook_pattern=self.hook_pattern if hooked else None)

    def extend(self, q, k, v, state):
        """The n new tokens after ``state``: q (B, H, n, D), k/v (B, Hkv, n, D) → (out, state)."""
        h = q.shape[1]
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        hooked = self.hook_decay.active or self.hook_pattern.active
        return run_in_chunks(self._chunk, q, k, v, self.log_decay(q.shape[2], q), state,
                             None if hooked else self.chunk_size)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D)."""
        check_heads(q, k, v, self.name)
        if self.causal:
            out, state = self.extend(q, k, v, None)
        else:
            h = q.shape[1]
            out, state = self._chunk(q, repeat_kv(k, h), repeat_kv(v, h),
                                     self.log_decay(q.shape[2], q), None, causal=False)
        self.show_state(state)
        return out

    def reference(self, q, k, v):
        """Raw-array parallel form of the module docstring, with 𝒟 built from powers of γ
        (γ^{|n−m|} non-causal), not through ``decay_mask``: for tests."""
        xp = get_array_module(q)
        n, h = q.shape[2], q.shape[1]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        dist = xp.arange(n)[:, None] - xp.arange(n)[None, :]                     # n − m
        g = xp.asarray(self.gammas, dtype=q.dtype)[:, None, None]               # (H, 1, 1)
        decay = g ** xp.abs(dist) * (1.0 if not self.causal else (dist >= 0))   # (H, N, N)
        return ((q @ xp.swapaxes(k, -1, -2)) * self.scale * decay) @ v

    @classmethod
    def identities(cls, seed=0):
        """The three forms agree (float64, B = 1, H = 3, D = 4, N = 13)."""
        rng = host_xp.random.default_rng(seed)
        q, k, v = (Tensor(active_xp().asarray(rng.standard_normal((1, 3, 13, 4))))
                   for _ in range(3))
        # One layer, three evaluations of it: parallel, chunkwise (C = 4: the recurrence across
        # chunks, the parallel form inside each) and token by token through the recurrence.
        layer = cls(12, 3, causal=True)
        with no_grad():
            parallel = layer.attend(q, k, v).numpy()
            layer.chunk_size = 4
            chunkwise = layer.attend(q, k, v).numpy()
            recurrent = decayed_recurrence(q, k * layer.scale, v,
                                           layer.log_decay(13, q))[0].numpy()
        ref = to_host(layer.reference(q.data, k.data, v.data))
        return [("parallel form − recurrent form (token by token), max |Δ|",
                 float(host_xp.abs(parallel - recurrent).max()), 1e-12),
                ("chunkwise (C = 4) − parallel, max |Δ|",
                 float(host_xp.abs(chunkwise - parallel).max()), 1e-12),
                ("parallel − dense γ^(n−m) powers, max |Δ|",
                 float(host_xp.abs(parallel - ref).max()), 1e-12)]
