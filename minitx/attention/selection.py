r"""Choosing keys: each query attends to the few keys (or blocks of keys) it picks itself.

The sparse patterns of 2020 (``sparse.py``) fix who attends to whom before the text is seen.
The attention of 2025 lets each query choose, by a cheap score, which keys it reads; the
choice is a top-k, so the softmax reads k keys per query instead of N. Three designs, one
family:

**DSA**, DeepSeek Sparse Attention (DeepSeek-V3.2). A *lightning indexer* with h_I small heads
scores every key s for query t, and the query attends to the k keys of highest score:

$$
I_{t,s} = \sum_{j=1}^{h_I} w_{t,j}\, \mathrm{ReLU}\!\left( q^I_{t,j} \cdot k^I_s \right),
\qquad
S_t = \operatorname{top-}k_{\,s \le t}\; I_{t,s},
\qquad
o_t = \sum_{s \in S_t} \operatorname{softmax}_{s \in S_t}\!\left(
\frac{q_t \cdot k_s}{\sqrt{D}} \right) v_s
$$

The choice is shared by every head; the indexer's own query q^I, key k^I and weights w are
small projections (k^I one head shared by all indexer heads).

**MoBA**, Mixture of Block Attention (Lu et al. 2025). The keys are cut into blocks of
length b; a query scores each *past* block by its mean key, k̄_i, and attends to its own
block (causally) and the k best past blocks:

$$
g_{t,i} = q_t \cdot \bar{k}_i, \quad \bar{k}_i = \frac{1}{b} \sum_{s \in \mathcal{B}_i} k_s,
\qquad
S_t = \mathcal{B}_{\lfloor t/b \rfloor} \cup \bigcup_{i \,\in\,
\operatorname{top-}k_{\,i < \lfloor t/b \rfloor}\, g_{t,i}} \mathcal{B}_i,
\qquad
o_t = \sum_{s \in S_t,\ s \le t} \operatorname{softmax}_s\!\left(
\frac{q_t \cdot k_s}{\sqrt{D}} \right) v_s
$$

**NSA**, Native Sparse Attention (Yuan et al. 2025). Three branches, each a softmax
attention, mixed by sigmoid gates per head:

$$
o_t = g^{\mathrm{cmp}}_t\, o^{\mathrm{cmp}}_t + g^{\mathrm{slc}}_t\, o^{\mathrm{slc}}_t
    + g^{\mathrm{win}}_t\, o^{\mathrm{win}}_t,
\qquad g_t = \sigma\!\left( q_t W_g + b_g \right)
$$

- *compressed*: the query attends to one key and one value per complete block, the block
  means k̄_i, v̄_i, giving probabilities p_{t,i} over blocks;
- *selected*: blocks are ranked by p_{t,i} (summed over the query heads that share a
  key/value head); the query reads every key of its top-k blocks, causally; its own block,
  the one before and the first are always chosen (in that order, when k < 3);
- *window*: the last w keys, t − w < s ≤ t.

A score that picks keys is piecewise constant: the top-k does not move under a small change of
its input, so the gradient of the output flows only through the softmax over the chosen keys
(DSA's indexer and MoBA's gate get no gradient from the output; DeepSeek trains its indexer
by a loss of its own, the KL divergence from the attention to the indexer's softmax on the
chosen keys, ``DeepSeekSparseAttention.indexer_loss``). No N × N map is formed. DSA gathers
the keys each query chose, (B, H, N, k, D) (``gathered_attention``). MoBA and NSA choose whole
blocks, and many queries choose the same block: so the (query, block) pairs are grouped by
block, and each chosen block's b keys are scored against all its queries in one product
(``block_attention``: a copy of each query per block it reads, (B, H, N, c, D) for c blocks,
never a copy of the keys per query); NSA's window is read the same way, as the query's own
block of w keys and the one before. Keys read per query: DSA k (its indexer scores all N, in
small heads); MoBA (k + 1)·b; NSA ⌈N/b⌉ block means, k·b chosen keys and w window keys.
``reference`` in each class is the same attention written densely, softmax under the query's
own selection mask; the tests compare the two, and the identities show that a top-k which
keeps every key or block is causal softmax attention.
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.function import Function
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host, xp as active_xp
# the modules and ops the three are written in; the head plumbing and references from base
from ..nn import init
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Parameter
from ..ops.activation import log_softmax, softmax
from ..ops.attention_maths import attention_backward     # BlockAttention's backward
from ..ops.elementwise import relu, sigmoid
from ..ops.indexing import getitem, masked_fill
from ..ops.linalg import matmul
from ..ops.shape import concatenate, reshape, swapaxes, transpose
from .base import (AttentionBase, causal_pattern, check_heads, dense_attention_array,
                   hooked_heads, merge_heads, register, repeat_kv, repeat_kv_array,
                   softmax_rows_array)

__all__ = ["top_k_indices", "top_k_mask", "lightning_scores", "gathered_attention",
           "block_attention", "BlockAttention", "block_means", "DeepSeekSparseAttention",
           "MixtureOfBlockAttention", "NativeSparseAttention"]

#: queries scored by the indexer at a time (bounds its (B, h_I, C, Nk) scores)
INDEX_CHUNK = 64


# ---- choosing, and attending to what was chosen ------------------------------------------

def top_k_indices(scores, k: int):
    """Raw (..., M) scores, −inf where not eligible → (index, valid), each (..., min(k, M)):
    the k highest, ties to the lower index (a stable sort); ``valid`` is False where fewer
    than k entries were eligible."""
    xp = get_array_module(scores)
    kk = min(int(k), scores.shape[-1])
    # a copy, so that the full (…, M) ordering is not kept alive by a view of it
    index = xp.argsort(-scores, axis=-1, kind="stable")[..., :kk].copy()
    valid = xp.take_along_axis(scores, index, axis=-1) > -math.inf
    return index, valid


def top_k_mask(scores, k: int):
    """Raw (..., M) → bool (..., M), the same choice as ``top_k_indices`` written densely:
    entry j is chosen iff it is eligible and fewer than k entries rank before it (a higher
    score, or the same score at a lower index). O(M²) per row: the tests' reference."""
    xp = get_array_module(scores)
    m = scores.shape[-1]
    j = xp.arange(m)
    a, b = scores[..., :, None], scores[..., None, :]                    # entry j, entry j'
    before = (b > a) | ((b == a) & (j[None, :] < j[:, None]))            # (..., M, M)
    return (before.sum(axis=-1) < k) & (scores > -math.inf)


def lightning_scores(qi, ki, w):
    """The lightning indexer's I_{t,s} = Σ_j w_{t,j} ReLU(q^I_{t,j} · k^I_s) (module
    docstring), any scale folded into w by the caller. qi (B, h_I, Nq, d_I), ki (B, Nk, d_I),
    w (B, Nq, h_I) Tensors → (B, Nq, Nk). Memory O(B·h_I·Nq·Nk)."""
    b, hi, nq, di = qi.shape
    nk = ki.shape[1]
    # (B, h_I, Nq, d_I) @ (B, 1, d_I, Nk) -> (B, h_I, Nq, Nk), weighted sum over j
    logits = relu(matmul(qi, reshape(swapaxes(ki, -1, -2), (b, 1, di, nk))))
    return (logits * reshape(transpose(w, (0, 2, 1)), (b, hi, nq, 1))).sum(axis=1)


def index_mask(index, valid, m: int):
    """(..., c) chosen indices and their validity → bool (..., m) mask of what was chosen."""
    xp = get_array_module(index)
    hit = (index[..., None] == xp.arange(m)) & valid[..., None]          # (..., c, m)
    return hit.any(axis=-2)


def gathered_attention(q, k, v, index, allowed, scale: float):
    """Softmax attention of each query over the keys it gathered.

    q (B, H, Nq, D), k/v (B, H, Nk, D) Tensors; ``index`` (B or 1, H or 1, Nq, c) integer
    key positions and ``allowed`` (same shape) bool, raw arrays of the data's device. Query t
    of head h reads keys index[·, h, t, :], those not allowed get probability 0 (a row with
    none gives zeros). Returns (out (B, H, Nq, D), probabilities (B, H, Nq, c)). Memory
    O(B·H·Nq·c·D): the c gathered keys, never an Nq × Nk map.
    """
    xp = get_array_module(q.data)
    b, h, nq, d = q.shape
    bi = xp.arange(b).reshape(b, 1, 1, 1)
    hi = xp.arange(h).reshape(1, h, 1, 1)
    kg = getitem(k, (bi, hi, index))                                     # (B, H, Nq, c, D)
    vg = getitem(v, (bi, hi, index))                                     # (B, H, Nq, c, D)
    # (B, H, Nq, 1, D) @ (B, H, Nq, D, c) -> (B, H, Nq, 1, c)
    s = matmul(reshape(q, (b, h, nq, 1, d)), swapaxes(kg, -1, -2)) * scale
    s = masked_fill(s, ~allowed[..., None, :], -math.inf)
    p = softmax(s, axis=-1)
    out = matmul(p, vg)                                                  # (B, H, Nq, 1, D)
    return reshape(out, (b, h, nq, v.shape[-1])), reshape(p, (b, h, nq, p.shape[-1]))


def block_attention(q, k, v, blocks, allowed, block: int, scale: float):
    """Softmax attention of each query over the keys of the blocks it chose, each chosen
    block's keys read once for all the queries that chose it.

    q (B, H, Nq, D), k/v (B, H, Nk, D) Tensors; ``blocks`` (B, H, Nq, c) integer block
    numbers (block j holds keys j·b … j·b + b − 1) and ``allowed`` (B, H, Nq, c, b) bool,
    which of each block's keys the query may read, raw arrays of the data's device. The same
    attention as ``gathered_attention`` over the c·b keys of those blocks, written by blocks:
    the (query, block) pairs are grouped by the block they read, and a loop over the blocks
    scores each block's b keys against all of its queries at once (one matmul) and weights its
    b values the same way (``BlockAttention``). Returns (B, H, Nq, Dv); a query that may read
    nothing gives zeros. Memory O(B·H·Nq·c·(b + D)) at most (one block's scores at a time,
    and one copy of each query per block it reads), never a copy of the keys per query.
    """
    return BlockAttention.apply(q, k, v, blocks=blocks, allowed=allowed, block=block,
                                scale=scale)


def _pair_groups(blocks, allowed, nk: int, block: int):
    """The (query row, slot) pairs of ``blocks`` (B, H, Nq, c), grouped by the block they
    read: (row (P,) each pair's query row of the (B·H·Nq) rows, back (P,) the permutation
    that puts pairs sorted by group back in order, ok (P, b) each sorted pair's allowed keys,
    groups [(batch·head, keys of the block (a slice), pairs, where they sit in sorted order
    (a slice))])."""
    xp = get_array_module(blocks)
    bsz, h, nq, c = blocks.shape
    nb = -(-nk // block)
    row = xp.repeat(xp.arange(bsz * h * nq), c)                           # (P,)
    group = (row // nq) * nb + blocks.reshape(-1)                         # (P,)
    order = xp.argsort(group, kind="stable")
    back = xp.argsort(order, kind="stable")                               # undoes ``order``
    ok = allowed.reshape(-1, block)[order]                                # (P, b), by group
    edges = to_host(xp.searchsorted(group[order], xp.arange(bsz * h * nb + 1)))
    groups = [(g // nb, slice(g % nb * block, min(nk, (g % nb + 1) * block)),
               order[int(edges[g]):int(edges[g + 1])], slice(int(edges[g]), int(edges[g + 1])))
              for g in range(bsz * h * nb) if edges[g + 1] > edges[g]]
    return row, back, ok, groups


class BlockAttention(Function):
    r"""``block_attention`` as one graph node: inputs q (B, H, Nq, D), k, v (B, H, Nk, D);
    options ``blocks``, ``allowed``, ``block``, ``scale`` (as there).

    Forward, block by block: each (query, block) pair gets its own piece of the softmax — its
    largest score m_j, its sum z_j = Σ e^{s − m_j} and its output u_j = Σ e^{s − m_j} v — and
    each query joins its c pieces at its largest score m = max_j m_j (FlashAttention's rule):

    $$
    Z = \sum_j e^{m_j - m} z_j, \qquad o = \frac{1}{Z} \sum_j e^{m_j - m}\, u_j,
    \qquad \mathrm{lse} = m + \log Z
    $$

    Saved: the output and lse per query besides q, k, v (memory O(B·H·Nq·D)); backward, block
    by block again, recomputes each block's probabilities P = e^{S − lse} and applies the five
    equations of ``ops/attention_maths.py`` (``attention_backward``), each pair's query
    gradient summed over its c slots."""

    @staticmethod
    def forward(ctx, q, k, v, blocks=None, allowed=None, block=None, scale=None):
        xp = get_array_module(q)
        bsz, h, nq, d = q.shape
        nk, dv, c = k.shape[2], v.shape[-1], blocks.shape[-1]
        row, back, ok, groups = _pair_groups(blocks, allowed, nk, block)
        rows = q.reshape(-1, d) * scale                                   # (B·H·Nq, D)
        keys, values = k.reshape(bsz * h, nk, d), v.reshape(bsz * h, nk, dv)
        # each pair's piece of the softmax: (pairs, D) @ (D, b') scores, −inf where not allowed
        m_j = xp.empty(len(row), dtype=q.dtype)
        z_j = xp.empty(len(row), dtype=q.dtype)
        u_j = xp.empty((len(row), dv), dtype=q.dtype)
        for hb, span, pairs, at in groups:
            width = span.stop - span.start
            s = xp.where(ok[at, :width], rows[row[pairs]] @ keys[hb, span].T, -math.inf)
            m_j[at] = s.max(axis=-1)
            e = xp.exp(s - xp.where(xp.isfinite(m_j[at]), m_j[at], 0)[:, None])
            z_j[at], u_j[at] = e.sum(axis=-1), e @ values[hb, span]
        # each query's c pieces joined at its largest score (a piece with nothing allowed,
        # m_j = −inf, weighs 0; a query with nothing allowed gets o = 0, lse = 0)
        m_j, z_j = m_j[back].reshape(-1, c), z_j[back].reshape(-1, c)
        m = m_j.max(axis=-1)
        w = xp.where(xp.isfinite(m_j), xp.exp(m_j - xp.where(xp.isfinite(m), m, 0)[:, None]), 0)
        z = (w * z_j).sum(axis=-1)
        # o and lse for the backward (lse = 0 with nothing allowed: then every P is e^{−∞} = 0)
        some = z > 0
        u_j = u_j[back].reshape(-1, c, dv)          # in query order (the sorted copy is freed)
        u_j *= w[..., None]
        out = u_j.sum(axis=1) / xp.where(some, z, 1)[:, None]
        lse = xp.where(some, m + xp.log(xp.where(some, z, 1)), 0)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.pairs, ctx.c, ctx.scale = (row, back, ok, groups), c, scale
        return out.reshape(bsz, h, nq, dv)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        row, back, ok, groups = ctx.pairs
        xp = get_array_module(q)
        bsz, h, nq, d = q.shape
        nk, dv = k.shape[2], v.shape[-1]
        # the same rows, keys and values as the forward's, recomputed (not kept)
        rows = q.reshape(-1, d) * ctx.scale
        keys, values = k.reshape(bsz * h, nk, d), v.reshape(bsz * h, nk, dv)
        do = grad.reshape(-1, dv)
        delta = (do * out).sum(axis=-1, keepdims=True)                    # δ of (3)
        dq_j = xp.empty((len(row), d), dtype=q.dtype)                     # per pair, sorted
        dk, dv_ = xp.zeros_like(keys), xp.zeros_like(values)
        for hb, span, pairs, at in groups:
            # the block's probabilities, recomputed from lse: 0 where not allowed
            r, width = row[pairs], span.stop - span.start
            s = xp.where(ok[at, :width], rows[r] @ keys[hb, span].T, -math.inf)
            p = xp.exp(s - lse[r, None])
            one = (None, None)                                # as (1, 1, pairs, ·) arrays
            gq, gk, gv, _ = attention_backward(do[r][one], p[one], rows[r][one],
                                               keys[hb, span][one], values[hb, span][one],
                                               delta[r][one], ctx.scale)
            dq_j[at], dk[hb, span], dv_[hb, span] = gq[0, 0], gk[0, 0], gv[0, 0]
        dq = dq_j[back].reshape(-1, ctx.c, d).sum(axis=1)    # each query over its c slots
        return dq.reshape(q.shape), dk.reshape(k.shape), dv_.reshape(v.shape)


def block_means(x, block: int):
    """(B, H, N, D) Tensor → (B, H, ⌈N/b⌉, D): the mean of each block of ``block`` rows
    (the last, partial block over the rows it has)."""
    n = x.shape[2]
    full = n // block
    parts = []
    if full:
        head = getitem(x, (slice(None), slice(None), slice(0, full * block)))
        parts.append(reshape(head, x.shape[:2] + (full, block, x.shape[3])).mean(axis=3))
    if n > full * block:
        tail = getitem(x, (slice(None), slice(None), slice(full * block, n)))
        parts.append(tail.mean(axis=2, keepdims=True))
    return parts[0] if len(parts) == 1 else concatenate(parts, axis=2)


def _block_means_array(x, block: int):
    """Raw arrays: ``block_means`` written as a loop over blocks (the references' form)."""
    xp = get_array_module(x)
    n = x.shape[2]
    return xp.stack([x[:, :, a:a + block].mean(axis=2) for a in range(0, n, block)], axis=2)


def _positions(nq: int, nk: int, xp):
    """The text positions of Nq queries that are the last of Nk keys."""
    return xp.arange(nk - nq, nk)


def _chosen_keys(blocks, ok, block: int, nk: int, positions=None):
    """Which keys of each chosen block a query may read: (…, Nq, c) block numbers and their
    validity → (…, Nq, c, b) bool, the key inside the sequence (and, given the queries'
    ``positions`` (Nq,), not after the query)."""
    xp = get_array_module(blocks)
    keys = blocks[..., None] * block + xp.arange(block)                  # (…, Nq, c, b)
    allowed = ok[..., None] & (keys < nk)
    if positions is not None:
        allowed &= keys <= positions[:, None, None]
    return allowed


def _read_only(hook, make):
    """Fire a read-only hook with ``make()`` (formed only when the hook is set)."""
    if hook.active:
        hook(Tensor._wrap(make()))


class AttachLoss(Function):
    """y = x; in the backward x's gradient passes unchanged and the scalar ``loss`` receives
    gradient 1: an auxiliary loss that trains whenever y is back-propagated (the device of
    DeepSeek-V2's ``AddAuxiliaryLoss``). The output's value never depends on the loss."""

    @staticmethod
    def forward(ctx, x, loss):
        ctx.loss_shape, ctx.loss_dtype = loss.shape, loss.dtype
        return x.copy()

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        return grad, xp.ones(ctx.loss_shape, dtype=ctx.loss_dtype)


# ---- DSA ---------------------------------------------------------------------------------

@register("dsa")
class DeepSeekSparseAttention(AttentionBase):
    r"""DeepSeek Sparse Attention: a lightning indexer scores the keys and each query attends
    to its top-k keys (the indexer's choice shared by all heads).

    Formula: the module docstring's DSA formula, per head: h_I = ``indexer_heads`` indexer
    heads score the keys (I_{t,s}), S_t the k = ``top_k`` keys s (s ≤ t when causal) of
    highest I_{t,s}, shared by every head, and o_t softmax attention over S_t.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D) (queries at the last Nq positions). The indexer:
    q^I = W_q^I [q_1 … q_H] (B, Nq, h_I, d_I) from the query heads, k^I = W_k^I · mean_h k_h
    (B, Nk, d_I), w = W_w [q_1 … q_H] · h_I^{−1/2} d_I^{−1/2} (B, Nq, h_I). Hooks:
    ``hook_index_scores`` I (B, Nq, Nk), −inf at future keys when causal (may be replaced:
    the choice follows), ``hook_selection`` (B, Nq, Nk) bool, the keys chosen (read-only);
    both are formed whole, O(B·N²), only while a hook is set.

    Options: ``top_k`` k, keys per query (default 16), ``indexer_heads`` h_I (4),
    ``indexer_dim`` d_I (16), ``indexer_loss_weight`` (1.0; the weight of ``indexer_loss``
    in training, 0 to leave the indexer untrained), ``causal``, ``num_kv_heads``, ``bias``.

    Complexity: {complexity}; each query reads k keys, not N.

    Exactness: exact under its own, data-dependent selection: equals softmax attention
    masked to the chosen keys, its own dense formula (``reference``; kind "score": the mask
    depends on the data, so there is no fixed ``pattern(n)``); with k ≥ N, causal softmax
    attention.

    Reference: DeepSeek-AI (2025), "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with
    DeepSeek Sparse Attention".

    What minitx leaves out or does differently: the indexer reads the attention's own query
    and key heads (DeepSeek's reads the hidden state and the query's low-rank latent), without
    the LayerNorm on k^I, partial RoPE, the Hadamard rotation and FP8: it runs in the data's
    precision; the attention is plain multi-head softmax, not MLA; the indexer learns only from
    ``indexer_loss`` (the KL term of DeepSeek's sparse training stage, on the chosen keys), whose
    gradient joins the output's backward in training mode (``AttachLoss``), never from the
    output itself; DeepSeek's dense warm-up stage is left out. ``new_cache()`` is a plain
    ``KVCache``: the indexer keys are recomputed from the cached keys at each step.
    DeepSeek-V3.2's layer as DeepSeek builds it (all of the above, with HF's model as the
    oracle) is the decoder's ``index_topk`` switch, ``models/indexer.py``.
    """

    complexity = ("time O(B·N²·h_I·d_I) for the indexer + O(B·H·N·k·D), "
                  "memory O(B·H·N·k·D + B·h_I·C·N), C = INDEX_CHUNK queries")

    kind = "score"
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, top_k: int = 16,
                 indexer_heads: int = 4, indexer_dim: int = 16,
                 indexer_loss_weight: float = 1.0, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        # the options, each checked by name
        self.top_k = validate.positive_int(top_k, "top_k", owner="dsa")
        self.indexer_heads = validate.positive_int(indexer_heads, "indexer_heads", owner="dsa")
        self.indexer_dim = validate.positive_int(indexer_dim, "indexer_dim", owner="dsa")
        self.indexer_loss_weight = validate.nonnegative_real(
            indexer_loss_weight, "indexer_loss_weight", owner="dsa")
        # the lightning indexer: three small projections without bias
        hi, di = self.indexer_heads, self.indexer_dim
        self.indexer_q = Linear(embed_dim, hi * di, bias=False)     # q^I from the query heads
        self.indexer_k = Linear(self.head_dim, di, bias=False)      # k^I from the mean key head
        self.indexer_w = Linear(embed_dim, hi, bias=False)          # w, one per indexer head
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_index_scores = HookPoint()   # (B, Nq, Nk) I, −inf at future keys
        self.hook_selection = HookPoint()      # (B, Nq, Nk) bool, the chosen keys

    def index_scores(self, q, k):
        """I (B, Nq, Nk) as a Tensor (differentiable in the indexer's weights), −inf at
        future keys when causal. q (B, H, Nq, D), k (B, Hkv, Nk, D)."""
        b, _, nq, _ = q.shape
        nk = k.shape[2]
        hi, di = self.indexer_heads, self.indexer_dim
        xq = merge_heads(q)                                              # (B, Nq, E)
        qi = transpose(reshape(self.indexer_q(xq), (b, nq, hi, di)), (0, 2, 1, 3))
        ki = self.indexer_k(k.mean(axis=1))                              # (B, Nk, d_I)
        w = self.indexer_w(xq) * (hi ** -0.5 * di ** -0.5)               # (B, Nq, h_I)
        scores = lightning_scores(qi, ki, w)                             # (B, Nq, Nk)
        if self.causal:
            xp = get_array_module(q.data)
            scores = masked_fill(scores, ~causal_pattern(nq, nk, xp), -math.inf)
        return scores

    def select(self, q, k):
        """The keys each query reads: (index, valid), raw (B, Nq, min(k, Nk)). The indexer
        runs on INDEX_CHUNK queries at a time unless ``hook_index_scores`` is set."""
        nq = q.shape[2]
        with no_grad():
            if self.hook_index_scores.active:
                scores = self.hook_index_scores(self.index_scores(q, k)).data
                return top_k_indices(scores, self.top_k)
            parts = []
            for a in range(0, nq, INDEX_CHUNK):          # a loop over blocks of queries
                rows = slice(a, min(a + INDEX_CHUNK, nq))
                qs = getitem(q, (slice(None), slice(None), rows))
                # causal: the chunk's last query sees the keys up to its own position; cut
                # them there, so that its causal mask lines up (bottom-right)
                cut = k.shape[2] - nq + rows.stop if self.causal else k.shape[2]
                ks = getitem(k, (slice(None), slice(None), slice(0, cut)))
                scores = self.index_scores(qs, ks).data
                index, valid = top_k_indices(scores, self.top_k)
                parts.append((index, valid))
            xp = get_array_module(q.data)
            width = max(p[0].shape[-1] for p in parts)
            # pad each chunk's choice to the widest with invalid entries (earlier chunks see
            # fewer keys when causal)
            pad = [(xp.pad(i, ((0, 0), (0, 0), (0, width - i.shape[-1]))),
                    xp.pad(v, ((0, 0), (0, 0), (0, width - v.shape[-1])))) for i, v in parts]
            return (xp.concatenate([p[0] for p in pad], axis=1),
                    xp.concatenate([p[1] for p in pad], axis=1))

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, *_ = check_heads(q, k, v, f"{self.name}.attend")
        index, valid = self.select(q, k)                                 # (B, Nq, c)
        nk = k.shape[2]
        _read_only(self.hook_selection, lambda: index_mask(index, valid, nk))
        k, v = repeat_kv(k, h), repeat_kv(v, h)                          # (B, H, Nk, D)
        out, p = gathered_attention(q, k, v, index[:, None], valid[:, None], self.scale)
        if self.training and self.indexer_loss_weight and is_grad_enabled():
            # the indexer learns from its own loss, whose gradient joins the output's backward
            loss = self.indexer_loss(q, k, index, valid, p.data) * self.indexer_loss_weight
            out = AttachLoss.apply(out, loss)
        return out

    def indexer_loss(self, q, k, index=None, valid=None, probs=None):
        """DeepSeek's indexer objective on the chosen keys: the mean over batch and queries
        of KL(p_t ‖ softmax_{s ∈ S_t} I_{t,s}), p_t the main attention summed over heads and
        renormalised (a constant: no gradient). A scalar Tensor whose gradient reaches only
        the indexer. The scores are formed for the k chosen keys only, O(B·N·k·h_I·d_I).
        ``index``/``valid`` (B, Nq, c) and ``probs`` (B, H, Nq, c) default to this layer's own
        choice and attention."""
        _, h, *_ = check_heads(q, k, k, f"{self.name}.indexer_loss")
        xp = get_array_module(q.data)
        if index is None:
            index, valid = self.select(q, k)
        if probs is None:
            with no_grad():
                kr = repeat_kv(k, h)
                _, p = gathered_attention(q, kr, kr, index[:, None], valid[:, None],
                                          self.scale)
            probs = p.data
        target = xp.where(valid, probs.sum(axis=1), 0.0)                 # (B, Nq, c)
        target = target / target.sum(axis=-1, keepdims=True)
        # the indexer at the chosen keys only: q^I (B, Nq, h_I, d_I), k^I (B, Nq, c, d_I)
        b, _, nq, _ = q.shape
        hi, di = self.indexer_heads, self.indexer_dim
        xq = Tensor._wrap(merge_heads(Tensor._wrap(q.data)).data)       # no gradient to q
        qi = reshape(self.indexer_q(xq), (b, nq, hi, di))
        ki = self.indexer_k(Tensor._wrap(k.data.mean(axis=1)))           # (B, Nk, d_I)
        ki = getitem(ki, (xp.arange(b).reshape(b, 1, 1), index))         # (B, Nq, c, d_I)
        w = self.indexer_w(xq) * (hi ** -0.5 * di ** -0.5)               # (B, Nq, h_I)
        # (B, Nq, h_I, d_I) @ (B, Nq, d_I, c) -> (B, Nq, h_I, c), weighted sum over j
        scores = (relu(matmul(qi, swapaxes(ki, -1, -2)))
                  * reshape(w, (b, nq, hi, 1))).sum(axis=2)              # (B, Nq, c)
        logq = log_softmax(masked_fill(scores, ~valid, -math.inf), axis=-1)
        logq = masked_fill(logq, ~valid, 0.0)                            # 0 · log 0 = 0
        entropy = xp.where(target > 0, target * xp.log(xp.where(target > 0, target, 1.0)), 0)
        kl = Tensor._wrap(entropy.sum(axis=-1)) - (logq * Tensor._wrap(target)).sum(axis=-1)
        return kl.mean()

    def reference(self, q, k, v):
        """Raw arrays: the indexer written as an einsum, the top-k as a rank mask
        (``top_k_mask``), softmax attention under that mask. (B, H, Nq, D)."""
        xp = get_array_module(q)
        b, h, nq, d = q.shape
        nk = k.shape[2]
        # the indexer, each term an einsum over raw arrays (Linear stores W as (out, in))
        hi, di = self.indexer_heads, self.indexer_dim
        wq, wk, ww = (lin.weight.data for lin in (self.indexer_q, self.indexer_k,
                                                   self.indexer_w))
        xq = q.transpose(0, 2, 1, 3).reshape(b, nq, h * d)
        qi = (xq @ wq.T).reshape(b, nq, hi, di)
        ki = k.mean(axis=1) @ wk.T                                       # (B, Nk, d_I)
        w = (xq @ ww.T) / math.sqrt(hi * di)                             # (B, Nq, h_I)
        scores = xp.einsum("btj,btjs->bts", w,
                           xp.maximum(xp.einsum("btjd,bsd->btjs", qi, ki), 0))
        # the choice written densely: a key is chosen iff fewer than k keys rank before it
        if self.causal:
            scores = xp.where(causal_pattern(nq, nk, xp), scores, -math.inf)
        chosen = top_k_mask(scores, self.top_k)                          # (B, Nq, Nk)
        return dense_attention_array(q, k, v, chosen[:, None])

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of DSA's own identities: (claim, value, limit)."""
        return _selection_identities(cls, "dsa", {"top_k": 64}, {"top_k": 4}, seed)


# ---- MoBA --------------------------------------------------------------------------------

@register("moba")
class MixtureOfBlockAttention(AttentionBase):
    r"""Mixture of Block Attention: each query attends to its own block and the top-k past
    blocks, ranked by its dot product with each block's mean key.

    Formula: the module docstring's MoBA formula, per head: blocks of b = ``block`` keys,
    S_t the own block ⌊t/b⌋ and the k = ``top_k`` blocks i < ⌊t/b⌋ of highest g_{t,i}
    (causal; without ``causal``, any other block), o_t softmax attention over the keys of
    S_t (s ≤ t when causal).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D) (queries at the last Nq positions); scores
    (B, H, Nq, (k + 1)·b), each chosen block's keys read once for all its queries
    (``block_attention``). Hooks: ``hook_gate_scores`` g (B, H, Nq, ⌈Nk/b⌉), −inf where a
    block may not be chosen (may be replaced: the choice follows), ``hook_selection``
    (B, H, Nq, ⌈Nk/b⌉) bool, the blocks read, the own one included (read-only).

    Options: ``block`` b, keys per block (default 8), ``top_k`` k, blocks chosen beside the
    own one (default 2; 0 reads the own block only), ``causal``, ``num_kv_heads``, ``bias``.

    Complexity: {complexity}; each query reads (k + 1)·b keys, not N.

    Exactness: exact under its own, data-dependent selection: softmax attention masked to the
    chosen blocks, its own dense formula (``reference``, kind "score"); with k at least the
    number of past blocks, causal softmax attention.

    Reference: Lu et al. (2025), "MoBA: Mixture of Block Attention for Long-Context LLMs".

    What minitx leaves out or does differently: MoBA's code counts the own block among its
    top-k (minitx's ``top_k`` = its ``moba_topk`` − 1); the block means are taken in the data's
    precision (MoBA's in fp32 from bf16); no varlen batches, no flash kernels. Decoding uses a
    plain ``KVCache``; the block means are recomputed from the cached keys at each step.
    """

    complexity = "time O(B·H·(N²/b + N·k·b)·D), memory O(B·H·(N²/b + N·k·(b + D)))"

    kind = "score"
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, block: int = 8, top_k: int = 2,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.block = validate.positive_int(block, "block", owner="moba")
        self.top_k = validate.nonnegative_int(top_k, "top_k", owner="moba")
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_gate_scores = HookPoint()    # (B, H, Nq, nb) q · mean key, −inf not eligible
        self.hook_selection = HookPoint()      # (B, H, Nq, nb) bool, the blocks read

    def _eligible(self, nq, nk, xp):
        """(Nq, nb) bool: the blocks a query may choose (past blocks; any other when not
        causal), and (Nq,) the own block of each query."""
        own = _positions(nq, nk, xp) // self.block
        blocks = xp.arange(-(-nk // self.block))
        other = blocks[None, :] < own[:, None] if self.causal else blocks[None, :] != own[:, None]
        return other, own

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, *_ = check_heads(q, k, v, f"{self.name}.attend")
        xp = get_array_module(q.data)
        b, _, nq, _ = q.shape
        nk, size = k.shape[2], self.block
        k, v = repeat_kv(k, h), repeat_kv(v, h)                          # (B, H, Nk, D)
        # the gate: each query against each block's mean key; the choice has no gradient
        eligible, own = self._eligible(nq, nk, xp)                       # (Nq, nb), (Nq,)
        with no_grad():
            gate = matmul(q, swapaxes(block_means(k, size), -1, -2)).data   # (B, H, Nq, nb)
        gate = xp.where(eligible, gate, -math.inf)
        gate = self.hook_gate_scores(Tensor._wrap(gate)).data
        chosen, ok = top_k_indices(gate, self.top_k)                     # (B, H, Nq, k)
        # the own block first, then the chosen ones
        blocks = xp.concatenate([xp.broadcast_to(own[:, None], (b, h, nq, 1)), chosen], -1)
        ok = xp.concatenate([xp.ones((b, h, nq, 1), dtype=bool), ok], axis=-1)
        _read_only(self.hook_selection,
                   lambda: index_mask(blocks, ok, eligible.shape[-1]))
        allowed = _chosen_keys(blocks, ok, size, nk,
                               _positions(nq, nk, xp) if self.causal else None)
        return block_attention(q, k, v, blocks, allowed, size, self.scale)

    def reference(self, q, k, v):
        """Raw arrays: block means by a loop over blocks, the top-k as a rank mask, softmax
        under the chosen blocks' keys (and causality). (B, H, Nq, D)."""
        xp = get_array_module(q)
        nq, nk, h = q.shape[2], k.shape[2], q.shape[1]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        eligible, own = self._eligible(nq, nk, xp)
        gate = xp.einsum("bhtd,bhid->bhti", q, _block_means_array(k, self.block))
        gate = xp.where(eligible, gate, -math.inf)
        blocks = top_k_mask(gate, self.top_k) | (xp.arange(gate.shape[-1]) == own[:, None])
        allowed = blocks[..., xp.arange(nk) // self.block]                # (B, H, Nq, Nk)
        if self.causal:
            allowed = allowed & causal_pattern(nq, nk, xp)
        return dense_attention_array(q, k, v, allowed)

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of MoBA's own identities: (claim, value, limit)."""
        return _selection_identities(cls, "moba", {"block": 4, "top_k": 16},
                                     {"block": 4, "top_k": 1}, seed)


# ---- NSA ---------------------------------------------------------------------------------

@register("nsa")
class NativeSparseAttention(AttentionBase):
    r"""Native Sparse Attention: compressed blocks, the top-k selected blocks and a sliding
    window, three softmax attentions mixed by sigmoid gates per head.

    Formula: the module docstring's NSA formula, per head: W_g, b_g are ``gate_weight`` and
    ``gate_bias``; blocks of b = ``block`` keys, k = ``top_k`` selected blocks (ranked by
    p_{t,i} summed over the query heads of a key/value head; the own, previous and first
    blocks always among them), w = ``window`` keys in the window branch.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D) (queries at the last Nq positions); block means
    (B, H, ⌈Nk/b⌉, D); scores (B, H, Nq, k·b) and (B, H, Nq, 2w), each block read once for
    all its queries (``block_attention``; the window as blocks of w keys); gate weights
    ``gate_weight`` (H, D, 3), ``gate_bias`` (H, 3), order (cmp, slc, win). Hooks:
    ``hook_block_scores`` (B, Hkv, Nq, nb) the selection scores, above every sum of
    probabilities on the blocks always chosen (own, then previous, then first: the order
    counts when k < 3), −inf on those that may not be (may be replaced: the choice follows);
    ``hook_selection`` (B, Hkv, Nq, nb) bool, the blocks read (read-only); ``hook_gates``
    (B, H, Nq, 3); ``hook_compressed``, ``hook_selected``, ``hook_window`` (B, Nq, H, D), the
    three branches before the gates.

    Options: ``block`` b, keys per block (default 8), ``top_k`` k, blocks selected (4),
    ``window`` w, keys in the sliding window counting the query's own (8), ``causal``,
    ``num_kv_heads``, ``bias``. Without ``causal`` every block may be chosen or compressed
    and the window is two-sided, |t − s| < w.

    Complexity: {complexity}; each query reads N/b block means, k·b selected keys and w
    window keys.

    Exactness: a different attention (three gated branches), exact under its own,
    data-dependent selection and tested against its own dense formula (``reference``, kind
    "score"); with k ≥ the number of blocks the selected branch, and with w ≥ N the window
    branch, is causal softmax attention.

    Reference: Yuan et al. (2025), "Native Sparse Attention: Hardware-Aligned and Natively
    Trainable Sparse Attention".

    What minitx leaves out or does differently: compression is the block mean over
    non-overlapping blocks (the paper learns an MLP with intra-block positions over
    overlapping blocks, stride d < l; the flash-linear-attention reference uses the mean), and
    the selection blocks are the compression blocks (l' = l); the gates read the head's own
    query (the paper's read the hidden state through an MLP); the always-chosen blocks follow
    the flash-linear-attention reference (first, own, previous); no kernels. Decoding uses a
    plain ``KVCache``: block means are recomputed from the cached keys at each step.
    """

    complexity = ("time O(B·H·(N²/b + N·(k·b + w))·D), "
                  "memory O(B·H·(N²/b + N·(k·b + w) + N·k·D))")

    kind = "score"
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, block: int = 8, top_k: int = 4,
                 window: int = 8, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.block = validate.positive_int(block, "block", owner="nsa")
        self.top_k = validate.positive_int(top_k, "top_k", owner="nsa")
        self.window = validate.positive_int(window, "window", owner="nsa")
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # the gates: one weight vector and bias per head and branch, N(0, 1/D) weights
        d = self.head_dim
        self.gate_weight = Parameter(active_xp().zeros((num_heads, d, 3), dtype="float32"))
        init.normal_(self.gate_weight, 0.0, 1.0 / math.sqrt(d))
        self.gate_bias = Parameter(active_xp().zeros((num_heads, 3), dtype="float32"))
        # the hook points: the choice, the gates and the three branches
        self.hook_block_scores = HookPoint()   # (B, Hkv, Nq, nb) selection scores
        self.hook_selection = HookPoint()      # (B, Hkv, Nq, nb) bool, the blocks read
        self.hook_gates = HookPoint()          # (B, H, Nq, 3) σ(q W_g + b_g)
        self.hook_compressed = HookPoint()     # (B, Nq, H, D) o^cmp
        self.hook_selected = HookPoint()       # (B, Nq, H, D) o^slc
        self.hook_window = HookPoint()         # (B, Nq, H, D) o^win

    def _groups(self, h):
        """Query heads sharing one selection: those of one key/value head of the layer."""
        g = self.num_kv_heads if h % self.num_kv_heads == 0 else h
        return g, h // g

    def _masks(self, nq, nk, xp):
        """(Nq, nb) bool: blocks the compressed branch sees (complete, when causal); (Nq, nb)
        the priority of the blocks always chosen (3 own, 2 previous, 1 first, 0 the others);
        and (Nq,) positions."""
        pos = _positions(nq, nk, xp)
        blocks = xp.arange(-(-nk // self.block))
        own = (pos // self.block)[:, None]
        seen = ((blocks + 1) * self.block - 1 <= pos[:, None]) if self.causal else \
            xp.ones((nq, blocks.shape[0]), dtype=bool)
        forced = xp.where(blocks == own, 3, xp.where(blocks == own - 1, 2,
                                                     xp.where(blocks == 0, 1, 0)))
        forced = forced.astype(xp.int8)              # four levels: (Nq, nb) in bytes
        return seen, forced, pos

    @staticmethod
    def _block_scores(xp, p_sum, seen, forced, size_g):
        """Selection scores: the summed probabilities of the blocks seen, −inf for the others;
        the always-chosen blocks above any sum (≤ size_g), own before previous before first."""
        return xp.where(forced > 0, forced + float(size_g), xp.where(seen, p_sum, -math.inf))

    def _select(self, p, seen, forced, positions, nk):
        """The blocks each key/value group reads, ranked by p (B, H, Nq, nb) summed over its
        query heads, and the keys of them each query may read: raw (B, G, Nq, k) and
        (B, G, Nq, k, b) (``positions`` None: not causal)."""
        xp = get_array_module(p)
        b, h, nq, _ = p.shape
        groups, size_g = self._groups(h)
        score = p.reshape(b, groups, size_g, nq, -1).sum(axis=2)         # (B, G, Nq, nb)
        score = self._block_scores(xp, score, seen, forced, size_g)
        score = self.hook_block_scores(Tensor._wrap(score)).data
        chosen, ok = top_k_indices(score, self.top_k)                    # (B, G, Nq, k)
        _read_only(self.hook_selection, lambda: index_mask(chosen, ok, score.shape[-1]))
        return chosen, _chosen_keys(chosen, ok, self.block, nk, positions)

    def _window_blocks(self, pos, nk, xp):
        """The window as blocks of w keys: t − w < s ≤ t lies in t's own block of w keys and
        the one before (|t − s| < w: and the one after). (Nq, c) block numbers and
        (Nq, c, w) bool, which of each block's keys are in the window (and exist)."""
        w = self.window
        own = pos // w
        shifts = xp.arange(-1, 1) if self.causal else xp.arange(-1, 2)
        blocks = xp.clip(own[:, None] + shifts, 0, -(-nk // w) - 1)        # (Nq, c)
        keys = blocks[..., None] * w + xp.arange(w)                        # (Nq, c, w)
        near = pos[:, None, None] - keys
        inside = (near >= 0) & (near < w) if self.causal else xp.abs(near) < w
        # a block clipped onto its neighbour would read that block's keys twice
        first = xp.concatenate([xp.ones((len(pos), 1), dtype=bool),
                                blocks[:, 1:] != blocks[:, :-1]], axis=1)
        return blocks, inside & (keys < nk) & first[..., None]

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, *_ = check_heads(q, k, v, f"{self.name}.attend")
        xp = get_array_module(q.data)
        b, _, nq, _ = q.shape
        nk, size = k.shape[2], self.block
        k, v = repeat_kv(k, h), repeat_kv(v, h)                          # (B, H, Nk, D)
        seen, forced, pos = self._masks(nq, nk, xp)
        # compressed: one mean key and value per block (the scale on the means: no (Nq, nb)
        # product is kept for it)
        kbar = block_means(k, size) * self.scale
        p = softmax(masked_fill(matmul(q, swapaxes(kbar, -1, -2)), ~seen, -math.inf), -1)
        o_cmp = matmul(p, block_means(v, size))                          # (B, H, Nq, D)
        # selected: the top-k blocks of each key/value group, their keys read by blocks
        groups, size_g = self._groups(h)
        chosen, allowed = self._select(p.data, seen, forced, pos if self.causal else None,
                                       nk)
        del forced                                   # (Nq, nb): not needed past the choice
        o_slc = block_attention(q, k, v, xp.repeat(chosen, size_g, axis=1),
                                xp.repeat(allowed, size_g, axis=1), size, self.scale)
        # window: the last w keys (both sides when not causal), read as blocks of w keys
        wblocks, wok = self._window_blocks(pos, nk, xp)                  # (Nq, c), (Nq, c, w)
        o_win = block_attention(q, k, v, xp.broadcast_to(wblocks, (b, h) + wblocks.shape),
                                xp.broadcast_to(wok, (b, h) + wok.shape), self.window,
                                self.scale)
        # the gates, one per branch and head, from the head's query
        g = self.hook_gates(sigmoid(matmul(q, self.gate_weight)
                                    + reshape(self.gate_bias, (h, 1, 3))))   # (B, H, Nq, 3)
        o_cmp, o_slc, o_win = (hooked_heads(hook, o) for hook, o in
                               ((self.hook_compressed, o_cmp), (self.hook_selected, o_slc),
                                (self.hook_window, o_win)))
        return sum(getitem(g, (Ellipsis, slice(i, i + 1))) * o
                   for i, o in enumerate((o_cmp, o_slc, o_win)))

    def reference(self, q, k, v, branches: bool = False):
        """Raw arrays: the three branches written densely, each a softmax under its own
        (Nq, Nk) or (Nq, nb) mask; the choice as a rank mask. (B, H, Nq, D); with
        ``branches`` also (o^cmp, o^slc, o^win, gates)."""
        xp = get_array_module(q)
        b, h, nq, d = q.shape
        nk = k.shape[2]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        seen, forced, pos = self._masks(nq, nk, xp)
        kbar, vbar = _block_means_array(k, self.block), _block_means_array(v, self.block)
        p = softmax_rows_array(xp.einsum("bhtd,bhid->bhti", q, kbar) * self.scale, seen)
        o_cmp = p @ vbar
        # selected: the rank mask over blocks, spread over each block's keys
        groups, size_g = self._groups(h)
        score = self._block_scores(xp, p.reshape(b, groups, size_g, nq, -1).sum(axis=2),
                                   seen, forced, size_g)
        blocks = xp.repeat(top_k_mask(score, self.top_k), size_g, axis=1)   # (B, H, Nq, nb)
        allowed = blocks[..., xp.arange(nk) // self.block]
        # window: t − w < s ≤ t (|t − s| < w when not causal)
        j = xp.arange(nk)[None, :]
        near = pos[:, None] - j
        if self.causal:
            allowed = allowed & causal_pattern(nq, nk, xp)
            window = (near >= 0) & (near < self.window)
        else:
            window = xp.abs(near) < self.window
        o_slc = dense_attention_array(q, k, v, allowed)
        o_win = dense_attention_array(q, k, v, window)
        # the gates, σ written out
        wg, bg = self.gate_weight.data.astype(q.dtype), self.gate_bias.data.astype(q.dtype)
        gates = 1.0 / (1.0 + xp.exp(-(xp.einsum("bhtd,hdc->bhtc", q, wg) + bg[:, None])))
        out = gates[..., 0:1] * o_cmp + gates[..., 1:2] * o_slc + gates[..., 2:3] * o_win
        return (out, o_cmp, o_slc, o_win, gates) if branches else out

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of NSA's own identities: (claim, value, limit)."""
        return _selection_identities(cls, "nsa", {"block": 4, "top_k": 16, "window": 64},
                                     {"block": 4, "top_k": 2, "window": 3}, seed)


# ---- the identities the three share ------------------------------------------------------

def _hooked_run(layer, x):
    """layer(x) with every hook recording what it saw: (output, {hook name: host array})."""
    seen = {}
    with layer.hooks([(lambda n: True, lambda t, hook: seen.__setitem__(hook.name, t))]):
        out = layer(Tensor(x))
    return out.numpy(), {name: to_host(t) for name, t in seen.items()}


def _causal_softmax(seen, q="hook_q", k="hook_k", v="hook_v"):
    """Causal softmax attention of hooked (B, N, H, D) heads, back in (B, N, H, D)."""
    qh, kh, vh = (seen[n].transpose(0, 2, 1, 3) for n in (q, k, v))
    n = qh.shape[2]
    return dense_attention_array(qh, kh, vh, causal_pattern(n, n)).transpose(0, 2, 1, 3)


def _selection_identities(cls, name, keep_all, sparse, seed):
    """The identities of a key-choosing variant: a top-k that keeps everything is causal
    softmax attention (read through the q, k, v and z hooks, or NSA's branch hooks);
    ``attend`` equals the dense form under its own selection mask; decoding through the cache
    equals the full forward."""
    g = host_xp.random.default_rng(seed)
    n, e, heads = 24, 8, 2
    x = g.standard_normal((1, n, e))
    rows = []
    # a top-k that keeps everything: read the output (or NSA's branches) and q, k, v
    full = cls(e, heads, causal=True, **keep_all).to(dtype="float64").eval()
    _, seen = _hooked_run(full, x)
    want = _causal_softmax(seen)
    if name == "nsa":
        rows += [("top_k ≥ blocks: selected branch − causal softmax of q, k, v, max |Δ|",
                  float(host_xp.abs(seen["hook_selected"] - want).max()), 1e-12),
                 ("window ≥ N: window branch − causal softmax of q, k, v, max |Δ|",
                  float(host_xp.abs(seen["hook_window"] - want).max()), 1e-12)]
    else:
        rows.append((f"top_k keeps every {'key' if name == 'dsa' else 'block'}: z − causal "
                     "softmax of q, k, v, max |Δ|",
                     float(host_xp.abs(seen["hook_z"] - want).max()), 1e-12))
    # a top-k that chooses: the gathered form against the dense one, then decoding
    layer = cls(e, heads, causal=True, **sparse).to(dtype="float64").eval()
    q, k, v = (g.standard_normal((2, heads, n, e // heads)) for _ in range(3))
    out = layer.attend(*(Tensor(a) for a in (q, k, v))).numpy()
    ref = to_host(layer.reference(*(Tensor(a).data for a in (q, k, v))))   # on its device
    rows.append(("attend (the keys it chose) − dense softmax under its own selection mask, "
                 "max |Δ|", float(host_xp.abs(out - ref).max()), 1e-12))
    whole = layer(Tensor(x)).numpy()
    cache = layer.new_cache()
    steps = [layer(Tensor(x[:, :5]), kv_cache=cache).numpy()]
    steps += [layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy() for t in range(5, n)]
    rows.append((f"decoding {n} tokens through the cache − full forward, max |Δ|",
                 float(host_xp.abs(host_xp.concatenate(steps, axis=1) - whole).max()), 1e-12))
    return rows
