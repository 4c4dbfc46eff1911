r"""Scaled dot-product attention by blocks, on every core: the fast twin of ``SDPAFunction``.

The reference (``SDPAFunction``) computes the whole (B, H, Nq, Nk) score matrix at once, then its
softmax, then P V. This twin computes the same numbers by *blocks*: a few heads × a few hundred
query rows against every key they can see (``attention_blocks``), one BLAS call per matmul, the
softmax in place on the block's scores. Five tricks, each exact in real arithmetic:

1. **Causal skipping.** A causal block of rows [i0, i1) meets only keys [0, i1 + Nk − Nq); the
   keys past that are in every row's future, so they are never computed, and only the block's
   diagonal part gets a mask. About half the work and memory of the dense form.
2. **Threads over heads** (``fast/parallel.py``). NumPy runs an element-wise pass on one core;
   blocks of different (batch, key head) pairs write disjoint slices, so they run in parallel
   threads with a one-thread BLAS each.
3. **No shift when no score can overflow.** softmax(s) = exp(s − c) / Σ exp(s − c) for any c;
   c = the row max only keeps exp from overflowing. When Cauchy–Schwarz bounds every score,
   |Sᵢⱼ| ≤ max‖qᵢ·scale‖ · max‖kⱼ‖ ≤ ``UNSHIFTED_LIMIT`` (``scores_bound``), c = 0 is as good:
   every exp lies in [e⁻²⁰, e²⁰], far from float32's overflow and underflow. That skips the row
   max and one pass over the scores. With a bias, half precision or a larger bound, it shifts.
4. **Unnormalised E.** Each block keeps E = exp(S − c) and the row scale r = 1/rowsum(E), so
   P = E·r, and r is applied to the (rows, Dv) output and, in backward, to N × D operands:
   P̃ᵀ dO = Ẽᵀ (dO·r), dS K = (E ⊙ (dP − δ)) K · r, dSᵀ Q = (E ⊙ (dP − δ))ᵀ (Q·r) — one pass
   over the N × N scores fewer (``attention_backward_scaled``).
5. **δ inside the matmul.** For large blocks without dropout, dP − δ is one matmul,
   [dO, −δ] [V, 1]ᵀ = dO Vᵀ − δ 1ᵀ, instead of a matmul and a pass over the scores.

E is saved rather than recomputed from the row logsumexp (as ``flash_attention`` does): the
recomputation costs one more N²·D matmul and an exp pass in backward; the price is memory
(``flash_attention`` is the linear-memory choice). The output is laid out as (B, Nq, H, Dv), so
that ``merge_heads`` of it is a view, and the gradients as the inputs are, so that the backward
of ``split_heads`` is one too. Dropout draws the whole mask first, exactly as the reference
does, so a seed gives both the same dropout. The block sizes are tuning constants, below; what
each trick buys is measured in ``benchmarks/README.md``; ``tests/fast/test_sdpa.py`` checks the
twin against the reference at and around every block boundary.
"""
from __future__ import annotations

import itertools
import math

from .. import configuration
from ..autograd.function import Function
from ..backend import get_array_module
from ..ops._util import row_max, unbroadcast
from ..ops.dropout import dropout_mask
from ..ops.sdpa import grouped_key_grad, grouped_scores, grouped_values
from .parallel import map_in_threads, thread_count

__all__ = ["BlockedSDPAFunction", "attention_blocks", "attention_backward_scaled",
           "scores_bound", "BLOCK_SCORES", "PACK_SCORES", "PARALLEL_SCORES", "CAUSAL_BLOCK",
           "UNSHIFTED_LIMIT", "DELTA_IN_MATMUL"]

BLOCK_SCORES = 2 ** 21      # most score entries per block: 8 MiB of float32
PACK_SCORES = 2 ** 20       # whole heads share a block up to this many scores (short sequences)
PARALLEL_SCORES = 2 ** 18   # fewer scores in all run in one thread (a hand-off has a cost)
CAUSAL_BLOCK = 256          # most query rows per causal block: smaller ones skip more future
UNSHIFTED_LIMIT = 20.0      # |scores| up to this: softmax without its shift
DELTA_IN_MATMUL = 2 ** 18   # blocks of this many scores fold δ into dO Vᵀ (smaller: the copies
#                             cost more than the pass they save)


def scores_bound(qs, k) -> float:
    """A bound on |Sᵢⱼ| = |qᵢ · kⱼ| over every head of a call (``qs`` already scaled), by
    Cauchy–Schwarz: max‖qᵢ‖ · max‖kⱼ‖. Infinite for half precision (its exp overflows at 11),
    NaN when an input holds NaN."""
    if qs.dtype.itemsize < 4 or qs.size == 0 or k.size == 0:
        return float("inf") if qs.dtype.itemsize < 4 else 0.0
    xp = get_array_module(qs, k)
    squares = (xp.einsum("...d,...d->...", x, x).max() for x in (qs, k))
    return math.sqrt(float(next(squares)) * float(next(squares)))


def attention_blocks(b, hkv, group, nq, nk, causal, scores=None, causal_rows=None,
                     pack=None, parts=1, parallel=None):
    """The blocks the twin works by: (bs, hs, hq, i0, i1, kend) tuples.

    A block is batches ``bs`` × key/value heads ``hs`` (query heads ``hq``, G = ``group`` per key
    head) × query rows [i0, i1) against keys [0, kend). Long sequences go one head and
    ``scores`` // (G·Nk) query rows at a time (``BLOCK_SCORES``: hundreds of rows, enough
    for BLAS to run near its peak); causal blocks have at most ``causal_rows``
    (``CAUSAL_BLOCK``) rows and at most half the query rows (a quarter when there are more
    than 8·``parallel`` scores in all), so that the future keys they skip are most of the
    upper triangle, even for a short sequence. Short sequences put several heads in one block
    while the heads' whole score matrices hold at most ``pack`` (``PACK_SCORES``) scores and
    at most 1/``parts`` of the (batch, key head) pairs when there are more than ``parallel``
    (``PARALLEL_SCORES``) scores in all, so that the calls are few but there are blocks for
    ``parts`` cores. Blocks whose rows see no key are left out (their output rows stay 0).
    """
    scores = BLOCK_SCORES if scores is None else scores
    pack = PACK_SCORES if pack is None else pack
    parallel = PARALLEL_SCORES if parallel is None else parallel
    per_head = group * nk                                 # score entries per row per key head
    total = b * hkv * per_head * nq                       # scores in all
    rows = max(1, min(nq, scores // max(per_head, 1)))
    if causal:                                            # ⌈Nq / 2⌉ or ⌈Nq / 4⌉; 1 for Nq = 0
        part = 4 if total > 8 * parallel else 2
        rows = max(1, min(rows, CAUSAL_BLOCK if causal_rows is None else causal_rows,
                          -(-nq // part)))
    # whole (batch, key head) score matrices per block: as many as ``pack`` holds and, when
    # the work is worth a thread hand-off, at most 1/parts of them (blocks for parts cores)
    units = pack // max(per_head * nq, 1) if per_head * nq <= pack else 1
    if total > parallel:
        units = min(units, (b * hkv) // max(parts, 1))
    units = max(units, 1)
    heads = min(hkv, units)
    batches = max(1, min(b, units // hkv)) if heads == hkv else 1
    for b0 in range(0, b, batches):
        bs = slice(b0, min(b0 + batches, b))
        for h0 in range(0, hkv, heads):
            h1 = min(h0 + heads, hkv)
            for i0 in range(0, nq, rows):
                i1 = min(i0 + rows, nq)
                kend = min(nk, i1 + nk - nq) if causal else nk
                if kend > 0:
                    yield bs, slice(h0, h1), slice(h0 * group, h1 * group), i0, i1, kend


def _by_heads(blocks):
    """Blocks grouped by their (batches, key heads): groups touch disjoint slices of every
    output and gradient (dK, dV included), so groups may run in parallel."""
    return [list(g) for _, g in itertools.groupby(blocks, key=lambda b: (b[0].start, b[1].start))]


def _part(x, bs, hs, i0, i1, kend):
    """Batches ``bs``, heads ``hs``, query rows [i0, i1) and keys [0, kend) of a
    (B|1, H|1, Nq|1, Nk|1) mask, bias or bias gradient (size-1 dims stay whole)."""
    if x is None:
        return None
    return x[bs if x.shape[0] != 1 else slice(None), hs if x.shape[1] != 1 else slice(None),
             slice(i0, i1) if x.shape[2] != 1 else slice(None),
             slice(0, kend) if x.shape[3] != 1 else slice(None)]


def attention_backward_scaled(do, e, r, qs, k, v, delta, scale, needs, keep=None,
                              delta_in_matmul=DELTA_IN_MATMUL):
    """``ops.sdpa.attention_backward`` for a block saved unnormalised: P = E · r.

    do (B, H, n, Dv), e (B, H, n, m) = exp(S − c), r (B, H, n, 1) = 1/rowsum(E), qs = Q·scale,
    k, v, delta (B, H, n, 1) = rowsum(dO ⊙ O), ``keep`` the scaled dropout mask or None,
    ``needs`` = which of (dQ, dK, dV, dS) to compute. The same five equations with r moved onto
    the N × D operands (see the module docstring); ``delta_in_matmul``: blocks of at least this
    many scores without dropout compute dP − δ as one matmul. Returns (dq, dk, dv, ds), None
    where not needed.
    """
    hkv = k.shape[1]
    xp = get_array_module(do, v)
    ed = e if keep is None else e * keep                       # Ẽ
    dv = grouped_key_grad(ed, do * r, hkv) if needs[2] else None   # (1) dV = Ẽᵀ (dO·r)
    if keep is None and e.size >= delta_in_matmul:             # (2)−(3): [dO, −δ] [V, 1]ᵀ
        ones = xp.ones(v.shape[:-1] + (1,), dtype=v.dtype)
        dp = grouped_scores(xp.concatenate([do, -delta], axis=-1),
                            xp.concatenate([v, ones], axis=-1))
    else:
        dp = grouped_scores(do, v)                             # (2) dP = dO Vᵀ ⊙ keep/(1 − p)
        if keep is not None:
            dp *= keep
        dp -= delta
    dp *= e                                                    # (3) dS·/r = E ⊙ (dP − δ)
    dq = dk = None
    if needs[0]:
        dq = grouped_values(dp, k)                             # (4) dQ = (dS/r) K · r·scale
        dq *= r * scale
    if needs[1]:
        dk = grouped_key_grad(dp, qs * r, hkv)                 # (5) dK = (dS/r)ᵀ (Q·scale·r)
    ds = dp * r if needs[3] else None
    return dq, dk, dv, ds


class BlockedSDPAFunction(Function):
    """``SDPAFunction`` by blocks on every core (see the module docstring): same inputs, same
    outputs and gradients to rounding. The keywords after ``dropout_p`` are the tuning knobs,
    for tests that put small inputs across a block boundary."""

    @staticmethod
    def forward(ctx, q, k, v, bias, *, allowed, causal, scale, dropout_p, causal_rows=None,
                scores=None, pack=None, unshifted_limit=UNSHIFTED_LIMIT,
                delta_in_matmul=DELTA_IN_MATMUL):
        xp = get_array_module(q, k, v)
        b, h, nq, _ = q.shape
        hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
        offset = nk - nq                                  # bottom-right causal alignment
        qs = q * scale                                    # scale Q (N·D), not S (N²)
        # (B, H, Nq, Dv) stored as (B, Nq, H, Dv): merge_heads is then a view, not a copy
        o = xp.zeros((b, nq, h, dv), dtype=q.dtype).transpose(0, 2, 1, 3)
        shift = bias is not None or not scores_bound(qs, k) <= unshifted_limit   # NaN: shift
        keep = dropout_mask((b, h, nq, nk), dropout_p, qs) if dropout_p > 0 else None

        def one(block):
            bs, hs, hq, i0, i1, kend = block
            s = grouped_scores(qs[bs, hq, i0:i1], k[bs, hs, :kend])   # (B', H', rows, kend)
            if bias is not None:
                s += _part(bias, bs, hq, i0, i1, kend).astype(s.dtype, copy=False)
            visible = _part(allowed, bs, hq, i0, i1, kend)
            if visible is not None:
                xp.copyto(s, -xp.inf, where=~visible)     # in place, broadcasting the mask
            if causal:                                    # only the block's diagonal part:
                c0 = max(0, i0 + offset)                  # keys < c0 are past for every row
                tri = xp.tri(i1 - i0, kend - c0, i0 + offset - c0, dtype=bool)
                xp.copyto(s[..., c0:], -xp.inf, where=~tri)   # j ≤ i + Nk − Nq
            if shift:                                     # E = exp(S − max); else exp(S)
                m = row_max(s)
                s -= xp.where(xp.isfinite(m), m, 0)       # a row with no key: shift by 0
            e = xp.exp(s, out=s)                          # P = E · r
            total = e.sum(axis=-1, keepdims=True)
            r = 1 / xp.where(total > 0, total, 1)         # (B', H', rows, 1); no key: E = 0
            kb = _part(keep, bs, hq, i0, i1, kend)
            ob = grouped_values(e if kb is None else e * kb, v[bs, hs, :kend])
            ob *= r                                       # O = (Ẽ V)·r
            o[bs, hq, i0:i1] = ob
            return block + (e, r, kb)

        # every block writes its own rows of O, so the forward runs block by block (the
        # threads stay busy when the heads do not divide among them); the backward's
        # accumulations into dK and dV need whole heads, so it runs by _by_heads' groups
        blocks = attention_blocks(b, hkv, h // hkv, nq, nk, causal, scores=scores,
                                  causal_rows=causal_rows, pack=pack, parts=thread_count())
        ctx.groups = _by_heads(map_in_threads(one, blocks, like=qs))
        ctx.save_for_backward(qs, k, v, o)
        ctx.scale, ctx.delta_in_matmul = scale, delta_in_matmul
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return o

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, o = ctx.saved_tensors
        xp = get_array_module(grad)
        needs = ctx.needs_input_grad
        delta = xp.einsum("...d,...d->...", grad, o)[..., None]   # δ = rowsum(dO ⊙ O)
        # laid out as the inputs are (zeros_like keeps their strides): for heads split from
        # (B, N, H·D) by split_heads, its backward is then a view, not a copy
        dq = xp.zeros_like(qs) if needs[0] else None
        dk = xp.zeros_like(k) if needs[1] else None
        dv = xp.zeros_like(v) if needs[2] else None
        dbias = xp.zeros(ctx.bias_meta[0], dtype=ctx.bias_meta[1]) if needs[3] else None

        def group(blocks):
            for bs, hs, hq, i0, i1, kend, e, r, keep in blocks:
                bq, bk, bv, ds = attention_backward_scaled(
                    grad[bs, hq, i0:i1], e, r, qs[bs, hq, i0:i1], k[bs, hs, :kend],
                    v[bs, hs, :kend], delta[bs, hq, i0:i1], ctx.scale, needs, keep,
                    ctx.delta_in_matmul)
                if needs[0]:
                    dq[bs, hq, i0:i1] = bq
                if needs[1]:
                    dk[bs, hs, :kend] += bk
                if needs[2]:
                    dv[bs, hs, :kend] += bv
                if needs[3]:
                    part = _part(dbias, bs, hq, i0, i1, kend)
                    part += unbroadcast(ds, part.shape, dbias.dtype)

        if needs[3]:                                      # heads may share a bias entry
            for g in ctx.groups:
                group(g)
        else:
            map_in_threads(group, ctx.groups, like=qs)
        return dq, dk, dv, dbias


configuration.register_twin("sdpa", BlockedSDPAFunction)
