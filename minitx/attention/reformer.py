r"""Reformer: LSH attention — hash, sort by bucket, attend within chunks.

Kitaev, Kaiser & Levskaya (2020), "Reformer: The Efficient Transformer".

Softmax attention is dominated by the keys closest to each query. Angular LSH puts close
vectors in the same bucket with high probability: round t hashes with its own random
Gaussian R_t (D, n_buckets/2), a random rotation,

$$
h_t(x) = \operatorname{argmax}\left[ x R_t \,;\, -x R_t \right]
$$

Shared-QK attention (as in the paper): keys are the *normalised queries*, k̂_j = q_j/‖q_j‖,
so a query and its key hash alike. Per hash round t, query i attends to the set 𝒫_t(i) of
positions the steps below leave it:

$$
O_i^t = \sum_{j \in \mathcal{P}_t(i)} \operatorname{softmax}_j\!\left(
\frac{q_i \cdot \hat{k}_j}{\sqrt{D}} \right) v_j,
\qquad O_i = \sum_t \operatorname{softmax}_t\!\left( \mathrm{lse}_i^t \right) O_i^t
$$


1. bucket every position, sort positions stably by (bucket, position);
2. cut the sorted sequence into chunks of c; each chunk's queries attend to the keys of
   their own chunk and the previous chunk (wrapping around), and only to keys in the same
   bucket;
3. a position never attends to itself unless it has no other target (its score is set to
   −10⁵, as in the paper: with shared QK, q·k_self is the largest score and useless);
4. unsort the outputs and the row logsumexps.

Rounds are combined by their logsumexp weights (O_i above) — each round's softmax
renormalised over the union of what the rounds saw (duplicates across
rounds are not de-weighted; the paper's multiplicity correction is omitted).

Causal: key position ≤ query position, *and* the key lies at most c steps back in the
sorted order. Within a bucket, later positions sort after earlier ones, so the keys a query
can see are its c most recent same-bucket predecessors — a set that does not depend on any
later token (plain chunk boundaries would leak the future: inserting later tokens shifts them).

With one bucket and c ≥ N it is exact full attention under the no-self rule. Time
O(rounds·N·c·D), memory O(rounds·N·c). Approximate.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, rng, xp as active_xp
from ..nn.hooks import HookPoint
from .base import AttentionBase, check_heads, register, repeat_kv

__all__ = ["lsh_hash", "lsh_attention", "ReformerAttention", "SELF_SCORE"]

SELF_SCORE = -1e5
"""The score a position gives itself: attended only when nothing else is allowed."""


def lsh_hash(x, rotations):
    """Angular LSH buckets: x (B, H, N, D) raw, rotations (D, n_buckets/2) → (B, H, N) ints.

    With n_buckets = 1 (rotations of width 0) every position is in bucket 0.
    """
    xp = get_array_module(x)
    if rotations.shape[-1] == 0:
        return xp.zeros(x.shape[:-1], dtype=xp.int64)
    rotated = x @ rotations.astype(x.dtype)                         # (B, H, N, nb/2)
    return xp.concatenate([rotated, -rotated], axis=-1).argmax(axis=-1)


def _gather_rows(x, index):
    """x (B, H, N, D) Tensor, index (B, H, M) ints → (B, H, M, D) (scatter-add backward)."""
    return F.take_along_axis(x, index[..., None], axis=2)


def lsh_attention(q, v, rotations, chunk: int, causal: bool = False, chunk_hook=None):
    """One or more LSH rounds of shared-QK attention.

    q (B, H, N, D), v (B, H, N, Dv) Tensors; rotations (rounds, D, n_buckets/2) raw.
    Returns (B, H, N, Dv). ``chunk_hook`` (a HookPoint, or None) is shown every round's
    chunk patterns, (B, H, rounds, ⌈N/c⌉, c, c or 2c), rows and columns in sorted order.
    """
    xp = get_array_module(q.data)
    bsz, h, n, d = q.shape
    # Pad N up to nc chunks of c; the keys are the unit-length queries (shared QK).
    c = min(chunk, n)
    nc = -(-n // c)
    padded = nc * c
    scale = 1.0 / math.sqrt(d)
    norm = F.sqrt((q * q).sum(axis=-1, keepdims=True) + 1e-12)
    keys = q / norm                                                 # shared QK: unit keys

    outs, lses, chunks = [], [], []
    for r in range(rotations.shape[0]):
        # Step 1: bucket every position and sort stably by (bucket, position); padding slots go
        # last, with positions past N and bucket −1, so no real query matches them.
        bucket = lsh_hash(q.data, rotations[r])                     # (B, H, N)
        order = xp.argsort(bucket * n + xp.arange(n), axis=-1, kind="stable")   # (B, H, N)
        pad = xp.zeros((bsz, h, padded - n), dtype=order.dtype)
        sorted_pos = xp.concatenate([order, pad], axis=-1)          # (B, H, P) positions
        real = xp.arange(padded) < n                                # (P,) padding flags
        pos = xp.where(real, sorted_pos, n + xp.arange(padded))     # pads: past every position
        bkt = xp.where(real, xp.take_along_axis(
            bucket, xp.minimum(sorted_pos, n - 1), axis=-1), -1)    # (B, H, P)

        # Step 2: gather q, keys and values in sorted order and cut them into chunks of c; a
        # chunk's keys are its own and the previous chunk's (2c).
        sq = F.reshape(_gather_rows(q, sorted_pos), (bsz, h, nc, c, d))
        sk = F.reshape(_gather_rows(keys, sorted_pos), (bsz, h, nc, c, d))
        sv = F.reshape(_gather_rows(v, sorted_pos), (bsz, h, nc, c, v.shape[-1]))
        rank = xp.arange(padded).reshape(nc, c)
        pos_c, bkt_c = pos.reshape(bsz, h, nc, c), bkt.reshape(bsz, h, nc, c)
        if nc > 1:                                  # look one chunk back (wrapping around)
            prev = (xp.arange(nc) - 1) % nc
            sk = F.concatenate([sk, F.getitem(sk, (slice(None), slice(None), prev))], axis=3)
            sv = F.concatenate([sv, F.getitem(sv, (slice(None), slice(None), prev))], axis=3)
            kpos = xp.concatenate([pos_c, pos_c[:, :, prev]], axis=-1)      # (B, H, nc, 2c)
            kbkt = xp.concatenate([bkt_c, bkt_c[:, :, prev]], axis=-1)
            krank = xp.concatenate([rank, rank[prev]], axis=-1)             # (nc, 2c)
        else:
            kpos, kbkt, krank = pos_c, bkt_c, rank
        # (B, H, nc, c, D) @ (B, H, nc, D, c') -> (B, H, nc, c, c')
        s = F.matmul(sq, F.swapaxes(sk, -1, -2)) * scale
        # Allowed: same bucket and a real key; causal adds j ≤ i and at most c sorted steps back.
        qpos, qbkt = pos_c[..., :, None], bkt_c[..., :, None]
        allowed = (kbkt[..., None, :] == qbkt) & (kpos[..., None, :] < n)
        if causal:
            qrank = rank[:, :, None]
            back = qrank - krank[:, None, :]                        # sorted steps back
            allowed = allowed & (kpos[..., None, :] <= qpos) & (back >= 0) & (back <= c)
        allowed = allowed | (qpos >= n)         # padding rows (dropped later): keep finite
        # Step 3: a position scores itself −10⁵: attended only when nothing else is allowed.
        is_self = kpos[..., None, :] == qpos
        s = F.masked_fill(s, is_self & allowed, SELF_SCORE)
        s = F.masked_fill(s, ~allowed, -math.inf)
        lse = F.logsumexp(s, axis=-1)                                       # (B, H, nc, c)
        probs = F.softmax(s, axis=-1)                                       # (B, H, nc, c, c')
        if chunk_hook is not None:
            chunks.append(probs)
        out = F.matmul(probs, sv)                                           # (B, H, nc, c, Dv)
        # Unsort: sorted slot t holds position order[t]; position i sits at slot inv[i].
        inv = xp.argsort(order, axis=-1)                                    # (B, H, N)
        out = _gather_rows(F.reshape(out, (bsz, h, padded, v.shape[-1])), inv)
        lse = F.squeeze(_gather_rows(F.reshape(lse, (bsz, h, padded, 1)), inv), -1)
        outs.append(out)
        lses.append(lse)
    if chunks:
        chunk_hook(F.stack(chunks, axis=2))                 # read-only: (B, H, R, nc, c, c')
    # Several rounds: weight each round's output by the softmax over rounds of its lse,
    # exp(lse_r) / Σ_r' exp(lse_r'): its share of the rounds' total unnormalised mass.
    if len(outs) == 1:
        return outs[0]
    weights = F.softmax(F.stack(lses, axis=-1), axis=-1)                    # (B, H, N, rounds)
    stacked = F.stack(outs, axis=-1)                                        # (B, H, N, Dv, rounds)
    return (stacked * F.expand_dims(weights, -2)).sum(axis=-1)


@register("reformer")
class ReformerAttention(AttentionBase):
    r"""Reformer LSH attention, shared-QK: hash, sort by bucket, attend within chunks.

    Formula: the module docstring's, 𝒫_t(i) being the keys of i's bucket in its sorted chunk
    or the previous one (causal: j ≤ i and at most c sorted steps back), itself only when
    nothing else is allowed (score −10⁵).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    v (B, Hkv, N, D) → (B, H, N, D) (k is unused); buffer ``rotations`` R (r, D,
    n_buckets/2); buckets (B, H, N); chunked scores (B, H, ⌈N/c⌉, c, 2c).

    Options: ``n_buckets`` (default 4; even, or 1 for a single bucket), ``n_hashes`` r
    (rounds, default 2), ``chunk_size`` c (default 32), ``causal`` (False). R is drawn once
    (seeded by ``minitx.manual_seed``); ``redraw()`` draws new rotations.

    Complexity: {complexity}.

    Exactness: approximate (of shared-QK attention under the no-self rule: exact with one
    bucket and c ≥ N (``pattern_reference``); more rounds lower the chance that a near key
    falls in another bucket).

    Reference: Kitaev, Kaiser & Levskaya (2020), "Reformer: The Efficient Transformer".
    """

    complexity = "time O(B·H·r·(N·c·D + N log N)), memory O(B·H·r·N·c)"

    kind = "approximate"
    projections = ("q", "v", "out")        # shared-QK: the keys are the normalised queries

    def __init__(self, embed_dim, num_heads, causal=False, n_buckets: int = 4,
                 n_hashes: int = 2, chunk_size: int = 32, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.hook_buckets = HookPoint()     # (B, H, rounds, N) int bucket of each position
        self.hook_sort_order = HookPoint()  # (B, H, rounds, N) positions sorted by bucket
        self.hook_chunk_pattern = HookPoint()   # (B, H, rounds, ⌈N/c⌉, c, c or 2c) per-chunk
        # n_buckets even (argmax over [xR; −xR] gives twice R's columns as buckets), or 1.
        n_buckets = validate.positive_int(n_buckets, "n_buckets", owner="reformer")
        if n_buckets > 1 and n_buckets % 2:
            raise validate.OptionError(f"reformer: n_buckets must be 1 or a positive even int, "
                                       f"got {n_buckets!r}")
        self.n_buckets = n_buckets
        self.n_hashes = validate.positive_int(n_hashes, "n_hashes", owner="reformer")
        self.chunk_size = validate.positive_int(chunk_size, "chunk_size", owner="reformer")
        self.register_buffer("rotations", Tensor(self._draw()))

    # R: one random Gaussian (D, n_buckets/2) matrix per round, a buffer (not learned).
    def _draw(self):
        shape = (self.n_hashes, self.head_dim, self.n_buckets // 2 if self.n_buckets > 1 else 0)
        return active_xp().asarray(rng().standard_normal(shape))

    def redraw(self) -> None:
        """Draw new random rotations."""
        self.rotations.data = self._draw()

    def attend(self, q, k, v):
        """q (B, H, N, D), v (B, Hkv, N, Dv) → (B, H, N, Dv); k unused (shared-QK)."""
        _, h, *_ = check_heads(q, k, v, self.name)
        rot = self.rotations.data if isinstance(self.rotations, Tensor) else self.rotations
        if self.hook_buckets.active or self.hook_sort_order.active:     # read-only views
            xp = get_array_module(q.data)
            n = q.shape[2]
            buckets = xp.stack([lsh_hash(q.data, r) for r in rot], axis=2)   # (B, H, R, N)
            self.hook_buckets(Tensor(buckets))
            self.hook_sort_order(Tensor(xp.argsort(buckets * n + xp.arange(n), axis=-1,
                                                   kind="stable")))
        return lsh_attention(q, repeat_kv(v, h), rot, self.chunk_size, self.causal,
                             self.hook_chunk_pattern if self.hook_chunk_pattern.active else None)

    def pattern_reference(self, q, v):
        """Raw arrays: full shared-QK attention under the no-self rule (the one-bucket limit)."""
        xp = get_array_module(q)
        n = q.shape[2]
        keys = q / xp.sqrt((q * q).sum(-1, keepdims=True) + 1e-12)
        allowed = ~xp.eye(n, dtype=bool)
        if self.causal:
            allowed = allowed & xp.tri(n, dtype=bool)
        allowed = allowed | (xp.eye(n, dtype=bool) & ~allowed.any(-1, keepdims=True))
        return allowed, keys
