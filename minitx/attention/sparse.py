r"""Sparse attention, exact under a mask: local, dilated, Longformer, BigBird, Sparse Transformer.

Every variant here computes *exactly* softmax attention restricted to its pattern
(``kind = "masked"``),

$$
O = \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + M \right) V,
\qquad M_{ij} = 0 \text{ where the pattern allows } (i, j), \ -\infty \text{ elsewhere,}
$$

but never builds the N × N score matrix. They share one kernel,
``blocked_sparse_attention``:

1. split the queries into blocks of b consecutive positions (pad N up to nb·b);
2. give every query block a fixed-length list of c key positions (the union of what its
   queries may see: e.g. the window around the block), an (nb, c) integer table;
3. gather those keys and values (fancy indexing; its backward scatter-adds), score only
   there, and mask each (query, key) pair with the *same rule* that draws ``pattern(n)``
   (see ``masks.py``), evaluated on the index pairs;
4. softmax with −inf for masked pairs (a row with nothing allowed gives zeros), weight the
   gathered values.

Global tokens (Longformer, BigBird) attend to every key, so their g query rows are computed
densely (g × N scores) and substituted; global keys are added to every block's key list.

Cost: O(N·c·D) time and O(N·c) memory for scores, with c = b + 2w for a window of w on
each side (c = O(w) when b ~ w): linear in N. (The strided Sparse Transformer pattern itself
has N·(2l + N/l) entries; with stride l ~ √N that is O(N√N).)

**The patterns.** Where $M_{ij} = 0$, for each variant; causal adds $j \le i$ to every one
(local, causal: $0 \le i - j \le w$). G is the set of global tokens, which attend to all
positions and all positions attend to; $\beta(i) = \lfloor i / b \rfloor$ is the block of
position i, $R_{\beta}$ the r random blocks of block β:

$$
\begin{array}{rl}
\text{local:} & |i - j| \le w \\
\text{dilated:} & |i - j| \le w d \ \text{and}\ (i - j) \bmod d = 0 \\
\text{longformer:} & \text{dilated, or}\ i \in G \ \text{or}\ j \in G \\
\text{bigbird:} & |\beta(i) - \beta(j)| \le 1 \ \text{or}\ \beta(j) \in R_{\beta(i)} \\
& \quad \text{or}\ \min(\beta(i), \beta(j)) < g \\
\text{strided:} & |i - j| < l \ \text{or}\ (i - j) \bmod l = 0 \\
\text{fixed:} & \lfloor i / l \rfloor = \lfloor j / l \rfloor \ \text{or}\ j \bmod l \ge l - c
\end{array}
$$
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, scatter_add, to_device_of
from ..nn.hooks import HookPoint
from ..ops.attention_maths import attention_backward
from .base import AttentionBase, check_heads, materialized_attention, register, repeat_kv
from .masks import (bigbird_random_blocks, bigbird_rule, dilated_rule, fixed_rule, grid_mask,
                    local_rule, longformer_rule, strided_rule)

__all__ = ["blocked_sparse_attention", "BlockedSparseFunction", "SparseAttentionBase",
           "LocalAttention", "DilatedAttention", "LongformerAttention", "BigBirdAttention",
           "StridedAttention", "FixedAttention"]


# A key list may name a position twice (a window overlapping a global token, say); softmax
# must count each key once.
def _dedup(index, valid):
    """Mark repeated key positions in a row as invalid, so no key is counted twice.

    index, valid: (nb, c). Returns the new valid mask (first occurrence kept).
    """
    xp = get_array_module(index)
    key = xp.where(valid, index, -1)
    order = xp.argsort(key, axis=1, kind="stable")
    ranked = xp.take_along_axis(key, order, axis=1)
    repeat = xp.zeros(ranked.shape, dtype=bool)
    repeat[:, 1:] = ranked[:, 1:] == ranked[:, :-1]
    first = xp.empty_like(repeat)
    first[xp.arange(index.shape[0])[:, None], order] = ~repeat     # back to the row's order
    return valid & first


SPARSE_CHUNK = 2 ** 15     # score entries per chunk of query blocks in the fused op (128 KiB)


class BlockedSparseFunction(Function):
    """Exact attention on gathered key blocks as one node, O(N·D) memory: inputs (q, k, v).

    The same computation as the composed form of ``blocked_sparse_attention`` (steps 1–4 of
    the module docstring), done by chunks of query blocks: only a chunk's gathered keys,
    values and scores exist at a time. Saved: the output and the row logsumexp lse (B, H,
    nb·b, 1) (+inf for a row with no key, so that P = exp(S − lse) = 0 there); backward
    recomputes each chunk's P = exp(S − lse) and applies the five equations of
    ``ops/attention_maths.py`` (``attention_backward``), scatter-adding the gathered keys' and
    values' gradients back to their positions (``backend.scatter_add``).
    """

    @staticmethod
    def forward(ctx, q, k, v, *, block, idx, allowed_of, scale):
        xp = get_array_module(q, k, v)
        bsz, h, n, _ = q.shape
        nb = idx.shape[0]
        out = xp.zeros((bsz, h, nb * block, v.shape[-1]), dtype=q.dtype)   # padded rows
        lse = xp.empty((bsz, h, nb * block, 1), dtype=q.dtype)
        # Per chunk of query blocks: a safe softmax over the gathered scores (shift by the row max;
        # a row with no key keeps p = 0), then out = P V over the gathered values.
        for t0, t1 in _chunks(nb, bsz * h * block * idx.shape[1]):
            qb, kg, vg, s = _chunk_scores(q, k, v, idx, t0, t1, block, allowed_of, scale)
            m = s.max(axis=-1, keepdims=True)
            m = xp.where(xp.isfinite(m), m, 0)                  # no key: shift by 0
            s -= m
            p = xp.exp(s, out=s)
            total = p.sum(axis=-1, keepdims=True)
            seen = total > 0
            p /= xp.where(seen, total, 1)                        # a row with no key: zeros
            rows = slice(t0 * block, t1 * block)
            out[:, :, rows] = (p @ vg).reshape(bsz, h, -1, out.shape[-1])
            lse[:, :, rows] = xp.where(seen, m + xp.log(xp.where(seen, total, 1)),
                                       xp.inf).reshape(bsz, h, -1, 1)
        # Keep only O and lse = m + log Σ exp(s − m) per row (+inf where no key, so exp(S − lse)
        # = 0): backward rebuilds P from them instead of storing it.
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = dict(block=block, idx=idx, allowed_of=allowed_of, scale=scale)
        return out[:, :, :n]

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        block, idx, allowed_of, scale = (ctx.options[key] for key in
                                         ("block", "idx", "allowed_of", "scale"))
        xp = get_array_module(grad)
        bsz, h, n, _ = q.shape
        dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
        # Per chunk again: P = exp(S − lse), the padding rows' gradient set to 0, and
        # δ = rowsum(dO ⊙ O).
        for t0, t1 in _chunks(idx.shape[0], bsz * h * block * idx.shape[1]):
            qb, kg, vg, s = _chunk_scores(q, k, v, idx, t0, t1, block, allowed_of, scale)
            cb = t1 - t0
            r0, r1 = t0 * block, min(t1 * block, n)
            s -= lse[:, :, t0 * block:t1 * block].reshape(bsz, h, cb, block, 1)
            p = xp.exp(s, out=s)                                 # P recomputed
            g = xp.zeros((bsz, h, cb * block, grad.shape[-1]), dtype=grad.dtype)
            g[:, :, :r1 - r0] = grad[:, :, r0:r1]                # padding rows: no gradient
            g = g.reshape(bsz, h, cb, block, -1)
            o = out[:, :, t0 * block:t1 * block].reshape(g.shape)
            delta = (g * o).sum(axis=-1, keepdims=True)          # δ = rowsum(dO ⊙ O)
            # (B·H·cb) independent small attentions: fold the chunk axis into the heads
            fold = lambda x: x.reshape((bsz, h * cb) + x.shape[3:])          # noqa: E731
            tq, tk, tv, _ = attention_backward(fold(g), fold(p), fold(qb), fold(kg),
                                               fold(vg), fold(delta), scale)
            dq[:, :, r0:r1] = tq.reshape(bsz, h, cb * block, -1)[:, :, :r1 - r0]
            where = (slice(None), slice(None), idx[t0:t1])
            scatter_add(dk, where, tk.reshape(kg.shape))
            scatter_add(dv, where, tv.reshape(vg.shape))
        return dq, dk, dv


def _chunks(nb, scores_per_block):
    """[t0, t1) ranges of query blocks holding about ``SPARSE_CHUNK`` scores each."""
    step = max(1, SPARSE_CHUNK // max(scores_per_block, 1))
    return [(t0, min(t0 + step, nb)) for t0 in range(0, nb, step)]


def _chunk_scores(q, k, v, idx, t0, t1, block, allowed_of, scale):
    """Query blocks [t0, t1): Q·scale (B, H, cb, b, D) (zero rows past N), gathered keys and
    values (B, H, cb, c, D/Dv), and the scores (B, H, cb, b, c), −inf where not allowed."""
    xp = get_array_module(q)
    bsz, h, n, d = q.shape
    cb = t1 - t0
    r0, r1 = t0 * block, min(t1 * block, n)
    qb = xp.zeros((bsz, h, cb * block, d), dtype=q.dtype)
    qb[:, :, :r1 - r0] = q[:, :, r0:r1]
    qb *= scale
    qb = qb.reshape(bsz, h, cb, block, d)
    kg, vg = k[:, :, idx[t0:t1]], v[:, :, idx[t0:t1]]                    # (B, H, cb, c, ·)
    s = qb @ xp.swapaxes(kg, -1, -2)                                     # (B, H, cb, b, c)
    xp.copyto(s, -xp.inf, where=~allowed_of(t0, t1))
    return qb, kg, vg, s


def blocked_sparse_attention(q, k, v, *, block: int, key_index, rule, global_rows=None,
                             scale: float = None):
    """Exact attention under a sparsity rule, computed on gathered key blocks.

    q (B, H, N, D), k (B, H, N, D), v (B, H, N, Dv) Tensors (equal head counts);
    ``key_index`` (nb, c) ints with nb = ⌈N/block⌉: the keys query block t may look at
    (entries outside [0, N) are ignored, repeats counted once); ``rule(i, j)`` → bool on
    broadcast position arrays (True = may attend); ``global_rows``: positions whose rows
    are computed densely over all N keys. Returns (B, H, N, Dv).

    Time O(N·c·D + g·N·D), memory O(N·c + g·N); exact under the rule.
    """
    xp = get_array_module(q.data)
    bsz, h, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nb, c = key_index.shape
    padded = nb * block
    # Entries outside [0, N) and repeats become invalid; indices are clipped so the gather stays
    # in range (the invalid ones are masked anyway).
    key_index = xp.asarray(key_index)
    valid = (key_index >= 0) & (key_index < n)
    valid = _dedup(key_index, valid)
    idx = xp.clip(key_index, 0, n - 1)                                      # (nb, c)

    # A chunk's mask: the variant's rule on (query, key) position pairs, AND a valid key, AND a
    # real query (not padding past N).
    def allowed_of(t0, t1):                          # (cb, b, c) for query blocks [t0, t1)
        i = (xp.arange(t0, t1)[:, None] * block + xp.arange(block)[None, :])[:, :, None]
        j = idx[t0:t1, None, :]
        real = i < n                                 # padding queries (past N) see nothing
        return rule(xp.minimum(i, n - 1), j) & valid[t0:t1, None, :] & real

    # No global rows: the fused, chunked node. Otherwise the composed form below (gather, score,
    # mask, softmax), then the global rows substituted.
    if global_rows is None or len(global_rows) == 0:
        return BlockedSparseFunction.apply(q, k, v, block=block, idx=idx, allowed_of=allowed_of,
                                           scale=scale)
    qp = F.pad(q, ((0, 0), (0, 0), (0, padded - n), (0, 0))) if padded > n else q
    qb = F.reshape(qp, (bsz, h, nb, block, d))                              # (B, H, nb, b, D)
    kg = F.getitem(k, (slice(None), slice(None), idx))                      # (B, H, nb, c, D)
    vg = F.getitem(v, (slice(None), slice(None), idx))                      # (B, H, nb, c, Dv)
    # (B, H, nb, b, D) @ (B, H, nb, D, c) -> (B, H, nb, b, c)
    s = F.matmul(qb, F.swapaxes(kg, -1, -2)) * scale

    s = F.masked_fill(s, ~allowed_of(0, nb), -math.inf)                    # (nb, b, c) mask
    p = F.softmax(s, axis=-1)                       # rows with nothing allowed -> zeros
    out = F.matmul(p, vg)                           # (B, H, nb, b, c) @ (B, H, nb, c, Dv)
    out = F.reshape(out, (bsz, h, padded, v.shape[-1]))
    if padded > n:
        out = F.getitem(out, (slice(None), slice(None), slice(0, n)))      # (B, H, N, Dv)
    if global_rows is None or len(global_rows) == 0:
        return out

    # Global query rows see every key: dense (g × N) scores for those rows only.
    rows = xp.asarray(global_rows)
    g = rows.shape[0]
    qg = F.getitem(q, (slice(None), slice(None), rows))                     # (B, H, g, D)
    sg = F.matmul(qg, F.swapaxes(k, -1, -2)) * scale                        # (B, H, g, N)
    allowed_g = rule(rows[:, None], xp.arange(n)[None, :])                  # (g, N)
    sg = F.masked_fill(sg, ~allowed_g, -math.inf)
    out_g = F.matmul(F.softmax(sg, axis=-1), v)                             # (B, H, g, Dv)
    # Substitute: position rows[t] reads row N + t of the concatenation.
    select = xp.arange(n)
    select[rows] = n + xp.arange(g)
    both = F.concatenate([out, out_g], axis=2)                              # (B, H, N + g, Dv)
    return F.getitem(both, (slice(None), slice(None), select))


def _window_index(n, block, before, after):
    """(nb, block + before + after): positions [t·b − before, t·b + b − 1 + after] per block."""
    nb = -(-n // block)
    start = host_xp.arange(nb)[:, None] * block - before
    return start + host_xp.arange(block + before + after)[None, :]


class SparseAttentionBase(AttentionBase):
    """Shared plumbing: a variant supplies ``_rule(n)`` and ``_layout(n)``.

    ``_rule(n)`` → a function rule(i, j) → bool; ``_layout(n)`` → (block, key_index,
    global_rows). ``pattern(n)`` evaluates the rule on the full grid (tests/pictures only).
    """

    kind = "masked"

    def __init__(self, embed_dim, num_heads, causal=False, block_size: int = 16, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.block_size = validate.positive_int(block_size, "block_size", owner=self.name)
        self.hook_mask = HookPoint()          # (N, N) bool, True = may attend: pattern(N)
        self.hook_attn_scores = HookPoint()   # (B, H, N, N) Q Kᵀ/√D, −inf outside the mask
        self.hook_pattern = HookPoint()       # (B, H, N, N) the masked softmax, 0 outside

    def _rule(self, n):  # pragma: no cover - abstract
        raise NotImplementedError

    def _layout(self, n):  # pragma: no cover - abstract
        # host (NumPy) index tables: blocked_sparse_attention moves them to the data once
        raise NotImplementedError

    def pattern(self, n: int):
        """(n, n) bool mask of this variant's pattern (True = may attend)."""
        return grid_mask(n, self._rule(n))

    def attend(self, q, k, v):
        """Exact attention under ``pattern(N)``: (B, H, N, D) → (B, H, N, Dv), O(N·c) memory."""
        _, h, _, nq, nk, _ = check_heads(q, k, v, self.name)
        if nq != nk:
            raise ValueError(f"{self.name}: self-attention needs equal query/key lengths, got "
                             f"{nq} and {nk}")
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        if self.hook_mask.active or self.hook_attn_scores.active or self.hook_pattern.active:
            # a hook wants the N × N maps: dense attention under the same mask (O(N²) memory)
            allowed = self.hook_mask(Tensor(to_device_of(self.pattern(nq), q.data)))
            return materialized_attention(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]),
                                          mask=allowed.data, hook_scores=self.hook_attn_scores,
                                          hook_pattern=self.hook_pattern)[0]
        block, key_index, global_rows = self._layout(nq)
        return blocked_sparse_attention(q, k, v, block=block, key_index=key_index,
                                        rule=self._rule(nq), global_rows=global_rows)


@register("local")
class LocalAttention(SparseAttentionBase):
    r"""Sliding-window attention: query i sees the keys within w positions of it.

    Formula: the module docstring's, "local" pattern: a window of w on each side. Computed
    on gathered key blocks, never N × N.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); key table (⌈N/b⌉, b + 2w) (causal: b + w), scores
    (B, H, ⌈N/b⌉, b, b + 2w).

    Options: ``window`` w (default 4), ``block_size`` b (query block, default 16),
    ``causal`` (False).

    Complexity: {complexity}; for the scores (the gathered keys/values are O(B·H·N·(1 +
    2w/b)·D)).

    Exactness: exact under its sparsity mask (``local_mask`` / ``pattern(n)``).

    Reference: Beltagy, Peters & Cohan (2020), "Longformer: The Long-Document Transformer"
    (its sliding window); local attention also in Parmar et al. (2018), "Image Transformer".
    """

    complexity = "time O(B·H·N·(b + 2w)·D), memory O(B·H·N·(b + 2w))"

    def __init__(self, embed_dim, num_heads, causal=False, window: int = 4, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(window, "window", minimum=0, owner=self.name)
        self.window = window

    def _rule(self, n):
        return lambda i, j: local_rule(i, j, self.window, self.causal)

    def _layout(self, n):
        b = min(self.block_size, n)
        after = 0 if self.causal else self.window
        return b, _window_index(n, b, self.window, after), None


@register("dilated")
class DilatedAttention(SparseAttentionBase):
    r"""Dilated sliding window: query i sees the keys i ± t·d for t = 0 … w.

    Formula: the module docstring's, "dilated" pattern: w keys each side, every d-th.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); key table (⌈N/b⌉, b + 2wd) (causal: b + wd).

    Options: ``window`` w (default 2), ``dilation`` d (default 2), ``block_size`` b (16),
    ``causal`` (False).

    Complexity: {complexity}; the key list per block spans the whole reach b + 2wd and the rule
    masks the off-stride keys, so only 2w + 1 of them count.

    Exactness: exact under its sparsity mask (``dilated_mask`` / ``pattern(n)``).

    Reference: Beltagy, Peters & Cohan (2020), "Longformer: The Long-Document Transformer",
    §3.1 (dilated sliding window).
    """

    complexity = "time O(B·H·N·(b + 2wd)·D), memory O(B·H·N·(b + 2wd))"

    def __init__(self, embed_dim, num_heads, causal=False, window: int = 2, dilation: int = 2,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(window, "window", minimum=0, owner=self.name)
        validate.integer(dilation, "dilation", minimum=1, owner=self.name)
        self.window, self.dilation = window, dilation

    def _rule(self, n):
        return lambda i, j: dilated_rule(i, j, self.window, self.dilation, self.causal)

    def _layout(self, n):
        b = min(self.block_size, n)
        reach = self.window * self.dilation
        return b, _window_index(n, b, reach, 0 if self.causal else reach), None


@register("longformer")
class LongformerAttention(SparseAttentionBase):
    r"""Longformer attention: a (dilated) sliding window plus global tokens.

    Formula: the module docstring's, "longformer" pattern: the dilated window plus the global
    tokens G.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); key table (⌈N/b⌉, b + 2wd + g); the g global query
    rows are computed densely, (B, H, g, N). ``pattern(n)`` is (n, n), or (H, n, n) with a
    dilation per head.

    Options: ``window`` w (4), ``global_tokens`` G (indices, default (0,): a [CLS]-like first
    token; negative allowed), ``dilation`` d (1; or one dilation per head, as the paper does —
    e.g. (1, 2) for 2 heads), ``block_size`` b (16), ``causal`` (False).

    Complexity: {complexity}; b + 2wd + g keys per query block row, plus g dense global rows of
    N.

    Exactness: exact under its sparsity mask (``longformer_mask`` / ``pattern(n)``).

    Reference: Beltagy, Peters & Cohan (2020), "Longformer: The Long-Document Transformer".
    """

    complexity = "time O(B·H·N·(b + 2wd + 2g)·D), memory O(B·H·N·(b + 2wd + 2g))"

    def __init__(self, embed_dim, num_heads, causal=False, window: int = 4,
                 global_tokens=(0,), dilation=1, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(window, "window", minimum=0, owner=self.name)
        # dilation: one int, or one per head (the paper gives heads different dilations).
        per_head = isinstance(dilation, (tuple, list))
        dilations = tuple(dilation) if per_head else (dilation,)
        if per_head and len(dilations) != num_heads:
            raise ValueError(f"dilation per head needs {num_heads} values, got {len(dilations)}")
        for d in dilations:
            validate.integer(d, "dilation", minimum=1, owner=self.name)
        self.window, self.dilation = window, (dilations if per_head else dilation)
        self.global_tokens = validate.int_tuple(global_tokens, "global_tokens", owner=self.name)

    # Global tokens: negative indices count from the end; out-of-range ones are dropped.
    def _globals(self, n):
        rows = sorted({t % n for t in self.global_tokens if -n <= t < n})
        mask = host_xp.zeros(n, dtype=bool)
        mask[rows] = True
        return host_xp.asarray(rows, dtype=host_xp.int64), mask

    def _rule(self, n):
        _, mask = self._globals(n)
        if not isinstance(self.dilation, tuple):
            return lambda i, j: longformer_rule(i, j, self.window, mask, self.dilation, self.causal)
        # Per-head dilations: the rule gains a leading head axis, giving an (H, N, N) pattern.
        per_head = host_xp.asarray(self.dilation)

        def rule(i, j):                       # a leading head axis: (H, ...) masks
            d = to_device_of(per_head, i).reshape((-1,) + (1,) * max(i.ndim, j.ndim))
            return longformer_rule(i, j, self.window, mask, d, self.causal)
        return rule

    def pattern(self, n: int):
        """(n, n) bool mask, or (H, n, n) with a dilation per head."""
        if not isinstance(self.dilation, tuple):
            return super().pattern(n)
        return self._rule(n)(host_xp.arange(n)[:, None], host_xp.arange(n)[None, :])

    def _layout(self, n):
        rows, _ = self._globals(n)
        b = min(self.block_size, n)
        dil = max(self.dilation) if isinstance(self.dilation, tuple) else self.dilation
        reach = self.window * dil
        # Each query block's keys: its window, reaching w·d on each side (the rule drops the
        # off-stride keys), plus every global key.
        window = _window_index(n, b, reach, 0 if self.causal else reach)
        extra = host_xp.broadcast_to(rows[None, :], (window.shape[0], rows.shape[0]))
        return b, host_xp.concatenate([window, extra], axis=1), rows


@register("bigbird")
class BigBirdAttention(SparseAttentionBase):
    r"""BigBird, block form: window blocks + random blocks + global blocks.

    Formula: the module docstring's, "bigbird" pattern on blocks of b positions: the
    neighbouring blocks, r random blocks, and the first g blocks as global.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); random table R (⌈N/b⌉, r) (−1 = none), key table
    (⌈N/b⌉, (3 + r + g)·b); global query rows (B, H, g·b, N).

    Options: ``block`` b (default 4), ``num_random`` r (1), ``num_global`` g (1), ``seed`` (0;
    R is drawn once per sequence length from a private generator, the same for every batch
    and head: a pure function of the options), ``causal`` (False). ``block_size`` defaults to
    ``block`` and is not used by the layout.

    Complexity: {complexity}.

    Exactness: exact under its sparsity mask (``bigbird_mask`` / ``pattern(n)``).

    Reference: Zaheer, Guruganesh, Dubey, Ainslie, Alberti, Ontañón et al. (2020), "Big Bird:
    Transformers for Longer Sequences".
    """

    complexity = "time O(B·H·N·b·(3 + r + 2g)·D), memory O(B·H·N·b·(3 + r + 2g))"

    def __init__(self, embed_dim, num_heads, causal=False, block: int = 4, num_random: int = 1,
                 num_global: int = 1, seed: int = 0, **options):
        options.setdefault("block_size", block)
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(block, "block", minimum=1, owner=self.name)
        validate.integer(num_random, "num_random", minimum=0, owner=self.name)
        validate.integer(num_global, "num_global", minimum=0, owner=self.name)
        self.seed = validate.nonnegative_int(seed, "seed", owner=self.name)
        self.block, self.num_random, self.num_global = block, num_random, num_global
        self._tables = {}

    # R, the random key blocks of each query block, is drawn once per block count and cached:
    # a pure function of (nb, options).
    def _table(self, n):
        nb = -(-n // self.block)
        if nb not in self._tables:
            self._tables[nb] = bigbird_random_blocks(nb, self.num_random, self.num_global,
                                                     self.seed, self.causal)
        return self._tables[nb]

    def _rule(self, n):
        table = self._table(n)
        return lambda i, j: bigbird_rule(i, j, self.block, table, self.num_global, self.causal)

    # Key blocks per query block t: t − 1, t, t + 1, its r random blocks and the g global blocks;
    # blocks out of range map to negative (invalid) positions. The first g blocks' rows are global.
    def _layout(self, n):
        b = self.block
        nb = -(-n // b)
        t = host_xp.arange(nb)[:, None]
        hx = host_xp
        blocks = [t - 1, t, t + 1, hx.asarray(self._table(n)),
                  hx.broadcast_to(hx.arange(self.num_global)[None, :], (nb, self.num_global))]
        blocks = hx.concatenate([hx.broadcast_to(x, (nb, x.shape[1])) for x in blocks], axis=1)
        blocks = host_xp.where((blocks >= 0) & (blocks < nb), blocks, -(n + b))   # out of range
        index = (blocks[:, :, None] * b + host_xp.arange(b)[None, None, :]).reshape(nb, -1)
        rows = host_xp.arange(min(self.num_global * b, n))
        return b, index, rows


@register("strided")
class StridedAttention(SparseAttentionBase):
    r"""Sparse Transformer, strided pattern: the nearest l positions and every l-th position.

    Formula: the module docstring's, "strided" pattern: both heads of the paper's
    factorisation (the last l positions, and every l-th) merged into one pattern;
    bidirectional when causal=False.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); a key list per query (query block of 1) of
    c = 2l − 1 + 2⌈N/l⌉ entries, gathered K/V (B, H, N, c, D).

    Options: ``stride`` l (default 4), ``causal`` (False). (``block_size`` is not used.)

    Complexity: {complexity}; each query gathers its own keys and values; O(N√N·D) at l = √N, as
    in the paper.

    Exactness: exact under its sparsity mask (``strided_mask`` / ``pattern(n)``).

    Reference: Child, Gray, Radford & Sutskever (2019), "Generating Long Sequences with Sparse
    Transformers".
    """

    complexity = "time O(B·H·N·(l + N/l)·D), memory O(B·H·N·(l + N/l)·D)"

    def __init__(self, embed_dim, num_heads, causal=False, stride: int = 4, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(stride, "stride", minimum=1, owner=self.name)
        self.stride = stride

    def _rule(self, n):
        return lambda i, j: strided_rule(i, j, self.stride, self.causal)

    # One query per block: the keys within l − 1 either way, then every l-th position back and
    # forth (c = 2l − 1 + 2⌈N/l⌉ keys per query).
    def _layout(self, n):
        l = self.stride
        i = host_xp.arange(n)[:, None]
        near = i + host_xp.arange(-(l - 1), l)[None, :]                  # |i − j| < l
        steps = host_xp.arange(1, -(-n // l) + 1)[None, :] * l
        index = host_xp.concatenate([near, i - steps, i + steps], axis=1)   # (N, 2l − 1 + 2⌈N/l⌉)
        return 1, index, None


@register("fixed")
class FixedAttention(SparseAttentionBase):
    r"""Sparse Transformer, fixed pattern: own block of l positions plus the summary cells of
    every block.

    Formula: the module docstring's, "fixed" pattern: the own block of l positions and the
    last c "summary" positions of every block.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); query block = pattern block l, key table
    (⌈N/l⌉, l + ⌈N/l⌉·c) (own block + all summary positions).

    Options: ``stride`` l (default 4), ``summary`` c (default 1, ≤ l), ``causal`` (False).
    (``block_size`` is not used.)

    Complexity: {complexity}; for the scores — O(N√N) at l = √N. Causal masks the future summary
    cells but still computes them.

    Exactness: exact under its sparsity mask (``fixed_mask`` / ``pattern(n)``).

    Reference: Child, Gray, Radford & Sutskever (2019), "Generating Long Sequences with Sparse
    Transformers".
    """

    complexity = "time O(B·H·N·(l + N·c/l)·D), memory O(B·H·N·(l + N·c/l))"

    def __init__(self, embed_dim, num_heads, causal=False, stride: int = 4, summary: int = 1,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        validate.integer(stride, "stride", minimum=1, owner=self.name)
        validate.integer(summary, "summary", minimum=1, owner=self.name)
        if summary > stride:
            raise ValueError(f"summary ({summary}) must be ≤ stride ({stride})")
        self.stride, self.summary = stride, summary

    def _rule(self, n):
        return lambda i, j: fixed_rule(i, j, self.stride, self.summary, self.causal)

    # Query block = the pattern's block of l; its keys: its own l positions plus the last c
    # ("summary") positions of every block.
    def _layout(self, n):
        l, c = self.stride, self.summary
        nb = -(-n // l)
        own = _window_index(n, l, 0, 0)                                          # (nb, l)
        cells = (host_xp.arange(nb)[:, None] * l + host_xp.arange(l - c, l)[None, :]).reshape(1, -1)
        table = host_xp.concatenate([own, host_xp.broadcast_to(cells, (nb, cells.shape[1]))],
                                    axis=1)
        return l, table, None
