r"""Scaled dot-product attention as one fused op: the formula, its backward, PyTorch's API.

The one formula behind every transformer (Vaswani et al. 2017, "Attention Is All You Need"):

    S = Q Kᵀ · scale + M,     P = softmax(S) (over keys),     O = P V,     scale = 1/√D,

Q (…, Nq, D), K (…, Nk, D), V (…, Nk, Dv); M is the mask: −inf where a query may not look, or
any additive bias (ALiBi, relative positions, padding). With dropout, O = P̃ V, P̃ = P ⊙ keep/(1−p).

$$
O = \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + M \right) V
$$

**The backward, derived once.** Given dO = ∂L/∂O:

    (1) dV = P̃ᵀ dO                          O = P̃ V is linear in V
    (2) dP = (dO Vᵀ) ⊙ keep/(1 − p)         … and in P̃
    (3) dS = P ⊙ (dP − δ),  δ = rowsum(dP ⊙ P) = rowsum(dO ⊙ O)     softmax's VJP
    (4) dQ = dS K · scale                   S = (Q·scale) Kᵀ
    (5) dK = dSᵀ Q · scale

$$
dV = \tilde{P}^\top dO, \quad
dP = \frac{(dO\, V^\top) \odot \mathrm{keep}}{1 - p}, \quad
dS = P \odot (dP - \delta), \quad
dQ = \frac{dS\, K}{\sqrt{D}}, \quad
dK = \frac{dS^\top Q}{\sqrt{D}}
$$

with $\delta_i = \sum_j dP_{ij} P_{ij} = dO_i \cdot O_i$.

(3) is softmax's own backward (``ops.activation.softmax_backward_array``); attention can use the
cheaper δ = rowsum(dO ⊙ O), an O(N·D) sum instead of O(N²), because rowsum(dP ⊙ P) =
Σⱼ Pᵢⱼ (dOᵢ · Vⱼ) = dOᵢ · Oᵢ. ``attention_backward`` below is these five lines, and it is the only
place they are written in array code: the fused ``SDPAFunction`` calls it per block of queries,
the tiled FlashAttention (``ops/flash.py``) per tile with P recomputed from the saved logsumexp,
and ``attention_weights`` uses (3)–(5). The CUDA kernel is the other place (in CUDA C++).

**Masks.** A bool mask means True = may attend (PyTorch's polarity for this function); a float
mask is added to the scores. Causal masks are **bottom-right aligned** everywhere in minitx:
with Nq queries and Nk keys, query i may see key j iff j ≤ i + (Nk − Nq), i.e. the queries are
the *last* Nq positions (what a KV cache needs). PyTorch's ``is_causal`` is top-left aligned
(j ≤ i); the two agree when Nq = Nk. A row whose keys are *all* masked gives a zero output and
zero gradients, never NaN.

**Grouped heads (MQA/GQA).** K and V may have Hkv heads, Hkv | H: query head h reads key/value
head h // G, G = H/Hkv. Query heads of a group are contiguous, so q viewed as (B, Hkv, G·Nq, D)
meets its shared key head in one matmul — no copy of K or V (``grouped_*`` helpers).

**Blocks, causal skipping, cores.** The fused op works by blocks (``attention_blocks``): a few
hundred query rows of one head against every key they can see, one BLAS call per matmul,
the softmax in place. For causal attention block [i0, i1) only meets keys [0, i1 + Nk − Nq),
so the upper triangle is never computed — about half the work and memory of the dense form
for long sequences — and only the block's diagonal part is masked. Blocks of different heads
run in parallel threads (``ops/parallel.py``): NumPy's element-wise passes use one core each.

**The CUDA kernel.** On CuPy arrays, with at most causal and key-padding masks, no dropout and
no weights requested, the hand-written flash kernel runs instead (``ops/dispatch.py``).
"""
from __future__ import annotations

import itertools
import math

from .. import validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from . import dispatch
from ._util import row_max, row_sum, unbroadcast
from .activation import softmax_array, softmax_backward_array
from .dropout import dropout, dropout_mask
from .elementwise import astype
from .indexing import masked_fill
from .linalg import matmul
from .parallel import map_in_threads, thread_count
from .shape import broadcast_to, reshape

__all__ = ["scaled_dot_product_attention", "attention_weights", "why_not_flash",
           "split_heads", "merge_heads", "repeat_kv", "check_heads",
           "attention_backward", "grouped_scores", "grouped_values", "grouped_key_grad",
           "SDPAFunction", "AttentionWeightsFunction", "merge_masks", "check_scale",
           "CAUSAL_BLOCK", "BLOCK_SCORES", "PACK_SCORES", "PARALLEL_SCORES",
           "attention_blocks"]

BLOCK_SCORES = 2 ** 21  # most score entries per block of the fused op: 8 MiB of float32
PACK_SCORES = 2 ** 20   # whole heads share a block up to this many scores (short sequences)
PARALLEL_SCORES = 2 ** 18  # fewer scores in all run in one thread: a hand-off costs ~50 µs
CAUSAL_BLOCK = 256      # most query rows per causal block: smaller ones skip more future
UNSHIFTED_LIMIT = 20.0  # |scores| up to this: softmax without its shift (SDPAFunction)
DELTA_IN_MATMUL = 2 ** 18  # blocks of this many scores fold δ into dO Vᵀ (attention_backward):
#                        5–14 % faster at 256+ rows, D = 64; smaller ones lose to the copies


# ---- head bookkeeping --------------------------------------------------------------------

def split_heads(x, num_heads: int):
    """(B, N, H·D) → (B, H, N, D)."""
    b, n, e = x.shape
    return x.reshape(b, n, num_heads, e // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, D) → (B, N, H·D)."""
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def repeat_kv(x, num_heads: int):
    """Repeat key/value heads so (B, Hkv, N, D) becomes (B, H, N, D) (for MQA/GQA).

    Head h of the query uses key/value head h // (H / Hkv), as in PyTorch's enable_gqa.
    Differentiable: the gradient of a shared head is the sum over the query heads using it.
    """
    b, hkv, n, d = x.shape
    if hkv == num_heads:
        return x
    group = num_heads // hkv
    x = reshape(x, (b, hkv, 1, n, d))
    x = broadcast_to(x, (b, hkv, group, n, d))
    return reshape(x, (b, num_heads, n, d))


def check_heads(q, k, v, name: str = "attend"):
    """Validate (B, H, Nq, D) / (B, Hkv, Nk, D) / (B, Hkv, Nk, Dv) and return the sizes.

    Raises ValueError naming the argument, the expected and the given shape.
    """
    for arg, t in (("query", q), ("key", k), ("value", v)):
        if len(t.shape) != 4:
            raise ValueError(f"{name}: {arg} must be 4-d (B, H, N, D), got shape {tuple(t.shape)}")
    b, h, nq, d = q.shape
    bk, hk, nk, dk = k.shape
    bv, hv, nv, _ = v.shape
    if bk != b or bv != b:
        raise ValueError(f"{name}: batch sizes differ: query {b}, key {bk}, value {bv}")
    if dk != d:
        raise ValueError(f"{name}: key head dim must equal query head dim {d}, got {dk}")
    if hk != hv or nk != nv:
        raise ValueError(f"{name}: key {tuple(k.shape)} and value {tuple(v.shape)} must share "
                         "heads and length")
    if h % hk:
        raise ValueError(f"{name}: key/value head count {hk} must divide the query head "
                         f"count {h}")
    return b, h, hk, nq, nk, d


# ---- grouped heads: H query heads against Hkv key/value heads, without copying K or V --------

def grouped_scores(qs, k):
    """(B, H, n, D) · (B, Hkv, m, D) → (B, H, n, m): query head h against key head h // G."""
    b, h, n, d = qs.shape
    hkv, m = k.shape[1], k.shape[2]
    xp = get_array_module(qs, k)
    # (B, Hkv, G·n, D) @ (B, Hkv, D, m) -> (B, Hkv, G·n, m) ≡ (B, H, n, m)
    return (qs.reshape(b, hkv, (h // hkv) * n, d) @ xp.swapaxes(k, -1, -2)).reshape(b, h, n, m)


def grouped_values(p, v):
    """(B, H, n, m) · (B, Hkv, m, Dv) → (B, H, n, Dv): weights of head h applied to V[h // G]
    (also dQ = dS K, with K in V's place)."""
    b, h, n, m = p.shape
    hkv, dv = v.shape[1], v.shape[3]
    # (B, Hkv, G·n, m) @ (B, Hkv, m, Dv) -> (B, Hkv, G·n, Dv) ≡ (B, H, n, Dv)
    return (p.reshape(b, hkv, (h // hkv) * n, m) @ v).reshape(b, h, n, dv)


def grouped_key_grad(ds, x, hkv: int):
    """(B, H, n, m), (B, H, n, X) → (B, Hkv, m, X) = Σ over each group of dsᵀ x: the gradient
    of a shared key/value head is the sum over the query heads that read it — the matmul over
    the group's G·n rows does the sum."""
    b, h, n, m = ds.shape
    xp = get_array_module(ds, x)
    rows = (h // hkv) * n
    # (B, Hkv, m, G·n) @ (B, Hkv, G·n, X) -> (B, Hkv, m, X)
    return xp.swapaxes(ds.reshape(b, hkv, rows, m), -1, -2) @ x.reshape(b, hkv, rows, x.shape[-1])


# ---- the backward, written once ----------------------------------------------------------

def attention_backward(do, p, qs, k, v, delta, scale, needs=(True, True, True), keep=None,
                       row_scale=None):
    """The five equations of the module docstring, for one block of queries.

    do (B, H, n, Dv), p (B, H, n, m) the probabilities (before dropout), qs = Q·scale
    (B, H, n, D), k (B, Hkv, m, D), v (B, Hkv, m, Dv), delta (B, H, n, 1) = rowsum(dO ⊙ O),
    ``keep`` the dropout mask (scaled, or None). ``needs`` = which of (dQ, dK, dV) to compute.
    ``row_scale`` (B, H, n, 1) or None: then ``p`` holds the *unnormalised* E = exp(S − max)
    and P = E · row_scale; the row scale goes onto the N × D operands (dO, dQ, Q), never
    onto an N × N array: P̃ᵀ dO = Ẽᵀ (dO·r), dS K = (E ⊙ (dP − δ)) K · r,
    dSᵀ Q = (E ⊙ (dP − δ))ᵀ (Q·r).
    Returns (dq (B, H, n, D), dk (B, Hkv, m, D), dv (B, Hkv, m, Dv), ds (B, H, n, m)); entries
    not needed are None. ds (a bias gradient is ds un-broadcast) is None with ``row_scale``
    unless ``needs`` has a fourth entry True (then it costs one more pass over it).
    """
    hkv = k.shape[1]
    pd = p if keep is None else p * keep                       # P̃ (or Ẽ)
    if needs[2]:                                               # (1) dV = P̃ᵀ dO
        dv = grouped_key_grad(pd, do if row_scale is None else do * row_scale, hkv)
    else:
        dv = None
    if keep is None and p.size >= DELTA_IN_MATMUL:             # (2), (3): dP − δ as one
        xp = get_array_module(do, v)                           # matmul, [dO, −δ] [V, 1]ᵀ =
        dp = grouped_scores(                                   # dO Vᵀ − δ 1ᵀ: one pass
            xp.concatenate([do, -delta], axis=-1),             # over the scores fewer
            xp.concatenate([v, xp.ones(v.shape[:-1] + (1,), dtype=v.dtype)], axis=-1))
    else:
        dp = grouped_scores(do, v)                             # (2) dP = dO Vᵀ …
        if keep is not None:
            dp *= keep                                         #     … ⊙ keep/(1 − p)
        dp -= delta
    dp *= p                                                    # (3) dS = P ⊙ (dP − δ),
                                                               #     in dP's fresh memory
    ds = dp                                                    #     (÷ r with row_scale)
    dq = dk = None
    if needs[0]:
        dq = grouped_values(ds, k)                             # (4) dQ = dS K · scale
        dq *= scale if row_scale is None else row_scale * scale
    if needs[1]:                                               # (5) dK = dSᵀ (Q · scale)
        dk = grouped_key_grad(ds, qs if row_scale is None else qs * row_scale, hkv)
    if row_scale is not None:
        if len(needs) > 3 and needs[3]:
            ds *= row_scale
        else:
            ds = None
    return dq, dk, dv, ds


# ---- the fused Functions -----------------------------------------------------------------

def _part(x, bs, hs, i0, i1, kend):
    """Batches ``bs``, heads ``hs``, query rows [i0, i1) and keys [0, kend) of a
    (B|1, H|1, Nq|1, Nk|1) mask, bias or bias gradient (size-1 dims stay whole)."""
    if x is None:
        return None
    return x[bs if x.shape[0] != 1 else slice(None), hs if x.shape[1] != 1 else slice(None),
             slice(i0, i1) if x.shape[2] != 1 else slice(None),
             slice(0, kend) if x.shape[3] != 1 else slice(None)]




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
    """The blocks the fused op works by: (bs, hs, hq, i0, i1, kend) tuples.

    A block is batches ``bs`` × key/value heads ``hs`` (query heads ``hq``, G = ``group`` per key
    head) × query rows [i0, i1) against keys [0, kend). Long sequences go one head and
    ``scores`` // (G·Nk) query rows at a time (``BLOCK_SCORES``: hundreds of rows, enough
    for BLAS to run near its peak); causal blocks have at most ``causal_rows``
    (``CAUSAL_BLOCK``) rows and at most half the query rows (a quarter when there are more
    than 8·``parallel`` scores in all: measured 7.2 against 8.1 ms at B = 4, H = 8, N = 256,
    D = 32, and no gain for fewer heads), so that the future keys they skip are most of the
    upper triangle (keys past kend = i1 + Nk − Nq are in every row's future), even for a
    short sequence. Short sequences put several heads in one block while the
    heads' whole score matrices hold at most ``pack`` (``PACK_SCORES``) scores and at most
    1/``parts`` of the (batch, key head) pairs when there are more than ``parallel``
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


class SDPAFunction(Function):
    """O = dropout(softmax(Q Kᵀ·scale + bias, masked)) V in one node; inputs (q, k, v, bias).

    Shapes: q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` None or
    (B|1, H|1, Nq|1, Nk|1) (differentiable); ``allowed`` bool of the same form (True = may
    attend) or None; ``causal`` adds the bottom-right causal mask (no N × N mask is built:
    only each block's diagonal part gets one). Work goes by the blocks of
    ``attention_blocks``: a few heads × query rows against every key they can see, one BLAS
    call per matmul, the softmax in place on the block's scores; blocks of different heads
    run in parallel threads (``ops/parallel.py``; in order with dropout, whose random draws
    must come in order, and for a bias gradient, which heads may share).

    **The softmax's shift only when it is needed.** softmax(s) = exp(s − c) / Σ exp(s − c) for
    any c; c = the row max keeps exp from overflowing. When no score can be large,
    |Sᵢⱼ| ≤ max‖qᵢ·scale‖ · max‖kⱼ‖ ≤ ``UNSHIFTED_LIMIT`` (Cauchy–Schwarz; two O(N·D) passes,
    ``scores_bound``), c = 0 is as good: every exp lies in [e⁻²⁰, e²⁰], far from float32's
    overflow and underflow, and each is computed to the same relative precision. That skips
    the row max and a pass over each block's scores (measured: 124 of the 740 µs of a
    4-head block at N = 256). With a bias, half precision, or a larger bound, the max is
    subtracted as usual.

    Saved for backward: Q·scale, K, V, O and, per block, E = exp(S − c) (B', H', rows,
    keys seen) with the row scale r = 1/rowsum(E), so P = E·r: the normalisation is applied
    to the (rows, Dv) output and, in backward, to N × D operands (``attention_backward``'s
    ``row_scale``) — one pass over the N × N scores fewer. Backward: ``attention_backward``
    per block, dBias = dS un-broadcast. Masked entries have P = 0, hence dS = 0: fully
    masked rows get zero gradients.

    Why E is saved rather than recomputed from the row logsumexp (as ``flash_attention``
    does): recomputing costs one more N²·D matmul and an exp pass in backward — measured
    about 20 % slower at N = 1,024 (a NumPy prototype of both), and ``flash_attention`` at
    N = 4,096 is 1.0–1.3× this op's time. The price is memory: 512 MiB of saved E for
    B·H = 8, N = 4,096 in float32; ``flash_attention`` is the linear-memory choice.
    Time O(B·H·Nq·Nk·D) (about half with causal), memory O(B·H·Nq·Nk) for E (about half).
    ``block`` overrides ``CAUSAL_BLOCK``.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, *, allowed, causal, scale, dropout_p, block=None):
        xp = get_array_module(q, k, v)
        b, h, nq, _ = q.shape
        hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
        offset = nk - nq                                  # bottom-right causal alignment
        qs = q * scale                                    # scale Q (N·D), not S (N²)
        # (B, H, Nq, Dv) stored as (B, Nq, H, Dv): merge_heads is then a view, not a copy
        o = xp.zeros((b, nq, h, dv), dtype=q.dtype).transpose(0, 2, 1, 3)
        shift = bias is not None or not scores_bound(qs, k) <= UNSHIFTED_LIMIT   # NaN: shift

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
            # softmax in place, its normalisation left for the (rows, Dv) output: O = (E V)·r
            if shift:                                     # E = exp(S − max); else exp(S)
                m = row_max(s)
                m = xp.where(xp.isfinite(m), m, 0)        # a row with no key: shift by 0
                s -= m
            e = xp.exp(s, out=s)                          # P = E · r
            total = row_sum(e)
            r = 1 / xp.where(total > 0, total, 1)         # (B', H', rows, 1); no key: E = 0
            keep = dropout_mask(e.shape, dropout_p, e) if dropout_p > 0 else None
            ob = grouped_values(e if keep is None else e * keep, v[bs, hs, :kend])
            ob *= r
            o[bs, hq, i0:i1] = ob
            return block + (e, r, keep)

        groups = _by_heads(attention_blocks(b, hkv, h // hkv, nq, nk, causal, causal_rows=block,
                                            parts=thread_count()))
        if dropout_p > 0:                                 # random draws in a fixed order
            ctx.groups = [[one(blk) for blk in g] for g in groups]
        else:
            ctx.groups = map_in_threads(lambda g: [one(blk) for blk in g], groups, like=qs)
        ctx.blocks = [blk for g in ctx.groups for blk in g]       # for readers and tests
        ctx.save_for_backward(qs, k, v, o)
        ctx.scale = scale
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
                bq, bk, bv, ds = attention_backward(
                    grad[bs, hq, i0:i1], e, qs[bs, hq, i0:i1], k[bs, hs, :kend],
                    v[bs, hs, :kend], delta[bs, hq, i0:i1], ctx.scale, needs, keep, r)
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


class AttentionWeightsFunction(Function):
    """P = softmax(Q Kᵀ·scale + bias, masked) in one node; inputs (q, k, bias).

    Backward: equations (3)–(5) of the module docstring with δ = rowsum(dP ⊙ P) (softmax's own
    VJP), dBias = dS. Shapes as in ``SDPAFunction``; output (B, H, Nq, Nk).
    """

    @staticmethod
    def forward(ctx, q, k, bias, *, allowed, causal, scale):
        xp = get_array_module(q, k)
        qs = q * scale
        s = grouped_scores(qs, k)                                   # (B, H, Nq, Nk)
        if bias is not None:
            s += bias.astype(s.dtype, copy=False)
        nq, nk = s.shape[2], s.shape[3]
        if causal:
            tri = xp.tri(nq, nk, nk - nq, dtype=bool)
            allowed = tri if allowed is None else allowed & tri
        if allowed is not None:
            xp.copyto(s, -xp.inf, where=~allowed)
        p = softmax_array(s, inplace=True)
        ctx.save_for_backward(qs, k, p)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return p

    @staticmethod
    def backward(ctx, grad):
        qs, k, p = ctx.saved_tensors
        needs = ctx.needs_input_grad
        ds = softmax_backward_array(p, grad)                        # (3) with δ = Σ dP ⊙ P
        dq = dk = None
        if needs[0]:
            dq = grouped_values(ds, k) * ctx.scale                  # (4)
        if needs[1]:
            dk = grouped_key_grad(ds, qs, k.shape[1])                  # (5)
        dbias = unbroadcast(ds, *ctx.bias_meta) if needs[2] else None
        return dq, dk, dbias


# ---- argument checking and mask plumbing -------------------------------------------------

def _shape(t):
    return tuple(t.shape)


def check_scale(fn: str, scale, d: int) -> float:
    """``scale`` None → 1/√D; else a finite number > 0 (not bool): one rule for SDPA and flash."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    return validate.positive_real(scale, "scale", owner=fn)


def _check_qkv(fn, query, key, value, enable_gqa):
    """Validate (…, H, Nq, D) / (…, Hkv, Nk, D) / (…, Hkv, Nk, Dv); return the 4-d sizes."""
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}: {arg} must be a Tensor, got {type(t).__name__}")
        if len(t.shape) < 2:
            raise ValueError(f"{fn}: {arg} must have at least 2 dims (…, N, D), got shape "
                             f"{_shape(t)}")
    nd = len(query.shape)
    if len(key.shape) != nd or len(value.shape) != nd:
        raise ValueError(f"{fn}: query, key and value must have the same number of dims, got "
                         f"query {_shape(query)}, key {_shape(key)}, value {_shape(value)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"{fn}: key must have query's last dim (D={query.shape[-1]}), got key "
                         f"shape {_shape(key)}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"{fn}: value must match key in every dim but the last: expected "
                         f"{_shape(key)[:-1] + ('Dv',)}, got {_shape(value)}")
    if query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"{fn}: batch dims differ: query {_shape(query)[:-3]}, key "
                         f"{_shape(key)[:-3]}")
    h = query.shape[-3] if nd >= 3 else 1
    hkv = key.shape[-3] if nd >= 3 else 1
    if h != hkv and not (enable_gqa and h % hkv == 0):
        hint = (" (pass enable_gqa=True to share key/value heads)" if h % hkv == 0 else
                f" (with enable_gqa the key/value head count must divide {h})")
        raise ValueError(f"{fn}: key/value have {hkv} heads but query has {h}{hint}")
    b = 1
    for n in query.shape[:-3]:
        b *= n
    return b, h, hkv, query.shape[-2], key.shape[-2]


def _mask_to_4d(fn, mask, lead, h, nq, nk):
    """Bring a mask broadcastable to (*lead, H, Nq, Nk) to (B or 1, H or 1, Nq or 1, Nk or 1).

    Works on raw arrays and on Tensors (through differentiable reshape/broadcast ops).
    """
    is_t = isinstance(mask, Tensor)
    data = mask.data if is_t else mask
    target = tuple(lead) + (h, nq, nk)
    shape = tuple(data.shape)
    if len(shape) > len(target) or any(m not in (1, t) for m, t in
                                       zip(shape[::-1], target[::-1])):
        raise ValueError(f"{fn}: attn_mask of shape {shape} does not broadcast to "
                         f"(…batch, H, Nq, Nk) = {target}")
    shape = (1,) * (len(target) - len(shape)) + shape
    if all(n == 1 for n in shape[:-3]):
        new = (1,) + shape[-3:]
        return reshape(mask, new) if is_t else data.reshape(new)
    full = tuple(lead) + shape[-3:]
    b = 1
    for n in lead:
        b *= n
    if is_t:
        return reshape(broadcast_to(reshape(mask, shape), full), (b,) + shape[-3:])
    xp = get_array_module(data)
    return xp.broadcast_to(data.reshape(shape), full).reshape((b,) + shape[-3:])


def _prepare(fn, query, key, value, attn_mask, scale, enable_gqa):
    """Shared checks: 4-d views of q/k/v, the bool ``allowed`` array and the float ``bias``."""
    b, h, hkv, nq, nk = _check_qkv(fn, query, key, value, enable_gqa)
    lead = tuple(query.shape[:-3])
    d, dv = query.shape[-1], value.shape[-1]
    q4 = reshape(query, (b, h, nq, d))
    k4 = reshape(key, (b, hkv, nk, d))
    v4 = reshape(value, (b, hkv, nk, dv))
    allowed = bias = None
    if attn_mask is not None:
        mdata = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
        if not hasattr(mdata, "dtype"):
            raise TypeError(f"{fn}: attn_mask must be an array or Tensor, got "
                            f"{type(attn_mask).__name__}")
        if mdata.dtype == bool:                     # a host mask enters the device once, here
            allowed = _mask_to_4d(fn, to_device_of(mdata, query.data), lead, h, nq, nk)
        elif mdata.dtype.kind == "f":
            bias = _mask_to_4d(fn, to_device_of(attn_mask, query.data), lead, h, nq, nk)
        else:
            raise TypeError(f"{fn}: attn_mask must be bool (True = may attend) or float "
                            f"(added to the scores), got dtype {mdata.dtype} (an int 1/0 "
                            "mask is ambiguous: use mask.astype(bool))")
    return q4, k4, v4, allowed, bias, check_scale(fn, scale, d), lead, (b, h, nq, dv)


def _key_mask(allowed, b, nk):
    """A bool (B|1, 1, 1, Nk) mask is a key-padding mask: as (B, Nk), the kernel takes it."""
    if allowed is None or allowed.shape[1] != 1 or allowed.shape[2] != 1 or \
            allowed.shape[3] != nk:
        return None
    xp = get_array_module(allowed)
    return xp.ascontiguousarray(xp.broadcast_to(allowed[:, 0, 0, :], (b, nk)))


def _widen_half(*tensors):
    """float16 tensors as float32 (differentiable casts), others as they are: the array code
    computes half-precision attention in float32 — scores of inputs of size 300 at D = 16
    already overflow float16's 65,504 — and casts the result back (PyTorch's CPU math path
    does the same). The CUDA kernel keeps float16 inputs and accumulates in float32 itself."""
    return [t if t is None or not isinstance(t, Tensor) or t.dtype != "float16"
            else astype(t, "float32") for t in tensors]


def _unflatten(t, lead, nd):
    """(B, H, N, X) back to the caller's layout (*lead, H, N, X), or (N, X) for 2-d inputs."""
    if nd == 4:
        return t
    h, n, x = t.shape[1:]
    return reshape(t, (n, x) if nd == 2 else tuple(lead) + (h, n, x))


# ---- the functional API ------------------------------------------------------------------

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float = None,
                                 enable_gqa: bool = False, return_weights: bool = False):
    """softmax(Q Kᵀ · scale + M) V — PyTorch's ``F.scaled_dot_product_attention``.

    Shapes: query (…, H, Nq, D), key (…, Hkv, Nk, D), value (…, Hkv, Nk, Dv) → (…, H, Nq, Dv),
    any number of leading batch dims (also (N, D) without heads). Hkv ≠ H needs
    ``enable_gqa=True`` and Hkv | H (query head h uses key/value head h // (H/Hkv)).

    ``attn_mask`` broadcastable to (…, H, Nq, Nk): bool, True = may attend (PyTorch's
    polarity for this function), or float, added to the scores (may be a Tensor requiring
    grad: learned biases get gradients). Beware: a 1/0 mask given as *float* is added (a bias
    of 0 or 1), not applied; an int mask is refused. ``is_causal``: query i sees key j iff
    j ≤ i + Nk − Nq (bottom-right aligned; PyTorch aligns top-left, the same when Nq = Nk);
    it may be combined with ``attn_mask`` (their AND). ``scale`` defaults to 1/√D.
    ``dropout_p`` drops attention probabilities (seeded by ``minitx.manual_seed``).

    Rows with every key masked give zeros and zero gradients (PyTorch gives NaN there).
    With ``return_weights=True`` returns ``(out, weights)``, weights (…, H, Nq, Nk) being the
    probabilities before dropout, differentiable.

    One fused Function (``SDPAFunction``, backward in ``attention_backward``): time
    O(Nq·Nk·D) per head, memory O(Nq·Nk) (about half when causal). On CuPy, with at most
    causal and key-padding masks (a bool mask of shape (B|1, 1, 1, Nk)), no dropout and no
    weights, the CUDA flash kernel runs instead (memory O(N·D)); ``why_not_flash`` says why
    a call does not.
    """
    fn = "scaled_dot_product_attention"
    q4, k4, v4, allowed, bias, scale, lead, (b, h, nq, dv) = _prepare(
        fn, query, key, value, attn_mask, scale, enable_gqa)
    dropout_p = validate.probability(dropout_p, "dropout_p", owner=fn)
    is_causal = validate.boolean(is_causal, "is_causal", owner=fn)
    nd, nk = len(query.shape), k4.shape[2]
    key_mask = _key_mask(allowed, b, nk)
    general = bias is not None or (allowed is not None and key_mask is None)
    if dispatch.choose_kernel(fn, q4.data, k4.data, v4.data, key_mask=key_mask,
                              general_mask=general, dropout_p=dropout_p,
                              need_weights=return_weights):
        o = dispatch.FlashKernelFunction.apply(q4, k4, v4, causal=is_causal, scale=scale,
                                               key_mask=key_mask)
        return _unflatten(o, lead, nd)
    dtype = q4.dtype
    q4, k4, v4, bias = _widen_half(q4, k4, v4, bias)
    if return_weights:
        w = AttentionWeightsFunction.apply(q4, k4, bias, allowed=allowed, causal=is_causal,
                                           scale=scale)
        wd = dropout(w, dropout_p) if dropout_p > 0 else w
        hkv = k4.shape[1]
        # (B, Hkv, G·Nq, Nk) @ (B, Hkv, Nk, Dv) -> (B, Hkv, G·Nq, Dv) -> (B, H, Nq, Dv)
        o = reshape(matmul(reshape(wd, (b, hkv, (h // hkv) * nq, nk)), v4), (b, h, nq, dv))
        if o.dtype != dtype:
            o, w = astype(o, dtype), astype(w, dtype)
        return _unflatten(o, lead, nd), _unflatten(w, lead, nd)
    o = SDPAFunction.apply(q4, k4, v4, bias, allowed=allowed, causal=is_causal, scale=scale,
                           dropout_p=dropout_p)
    return _unflatten(o if o.dtype == dtype else astype(o, dtype), lead, nd)


def why_not_flash(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float = None, enable_gqa: bool = False,
                  return_weights: bool = False):
    """None when ``scaled_dot_product_attention`` with these arguments runs the CUDA flash
    kernel, else the reason it runs the array code (a short sentence). Nothing is computed."""
    fn = "scaled_dot_product_attention"
    q4, k4, v4, allowed, bias, _, _, (b, _, _, _) = _prepare(
        fn, query, key, value, attn_mask, scale, enable_gqa)
    key_mask = _key_mask(allowed, b, k4.shape[2])
    return dispatch.decline_reason(
        q4.data, k4.data, v4.data, key_mask=key_mask, dropout_p=dropout_p,
        general_mask=bias is not None or (allowed is not None and key_mask is None),
        need_weights=return_weights)


def attention_weights(query, key, attn_mask=None, is_causal: bool = False, scale: float = None,
                      enable_gqa: bool = False):
    """P = softmax(Q Kᵀ · scale + M): the attention map alone, (…, H, Nq, Nk), differentiable.

    Same arguments and mask semantics as ``scaled_dot_product_attention``.
    """
    fn = "attention_weights"
    q4, k4, _, allowed, bias, scale, lead, _ = _prepare(fn, query, key, key, attn_mask, scale,
                                                        enable_gqa)
    dtype = q4.dtype
    q4, k4, bias = _widen_half(q4, k4, bias)
    w = AttentionWeightsFunction.apply(q4, k4, bias, allowed=allowed,
                                       causal=validate.boolean(is_causal, "is_causal", owner=fn),
                                       scale=scale)
    return _unflatten(w if w.dtype == dtype else astype(w, dtype), lead, len(query.shape))


def merge_masks(allowed=None, bias=None):
    """Combine a bool ``allowed`` mask (True = may attend) and a float ``bias`` into one
    float mask (bias, −inf where not allowed); returns whichever is given when only one is.
    """
    if allowed is None or bias is None:
        return bias if allowed is None else allowed
    a = allowed.data if isinstance(allowed, Tensor) else allowed
    if isinstance(bias, Tensor):
        return masked_fill(bias, ~a, -math.inf)
    xp = get_array_module(bias)
    return xp.where(a, bias, -xp.inf)
