r"""FlashAttention on the CPU: exact attention in tiles, never holding the N × N matrix.

Dao, Fu, Ermon, Rudra & Ré (2022), "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness" (backward as in FlashAttention-2, Dao 2023).

Forward, for one block of queries Q_i against blocks K_j, V_j, with the *online softmax*:
a running row max m, a running row sum ℓ and an unnormalised output acc, updated per key
tile (S (b_q, b_k), masked entries −inf; each update rescales what came before to the new
max m'), then normalised once, with the row logsumexp lse kept:

$$
\begin{array}{rcl}
S & = & Q_i K_j^\top \cdot \mathrm{scale} \\
m' & = & \max\!\left( m, \operatorname{rowmax} S \right) \\
\ell & \leftarrow & e^{m - m'} \ell + \operatorname{rowsum} e^{S - m'} \\
\mathrm{acc} & \leftarrow & e^{m - m'} \mathrm{acc} + e^{S - m'} V_j \\
m & \leftarrow & m'
\end{array}
$$

$$
O_i = \frac{\mathrm{acc}}{\ell}, \qquad \mathrm{lse}_i = m + \log \ell
$$

Only (O, lse) are kept for backward — the same statistics as the CUDA kernel
(``minitx.backend.flash_cuda``).

Backward recomputes each tile's probabilities from the saved lse, P = exp(S − lse), and applies
the five equations of ``ops/attention_maths.py`` to the tile (``attention_backward``), with
δ = rowsum(dO ⊙ O) computed once per block of queries. Different (batch, key head) pairs are
independent: with the fast layer on they run in parallel threads.

Time O(N²·D) (like dense), memory O(N·D + b_q·b_k): exact. Causal masking is bottom-right
aligned (key j visible to query i iff j ≤ i + Nk − Nq) and tiles entirely above the diagonal
are skipped. ``key_mask`` (B, Nk) bool, True = may attend, masks padding keys; a row with no
visible key gives zeros and lse = −inf (handled without NaN). Grouped key/value heads are read
in place (no copy), through the ``grouped_*`` helpers.
"""
from __future__ import annotations

import math

from .. import configuration, validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from . import dispatch
from ._util import row_max
from .attention_maths import attention_backward, grouped_scores, grouped_values
from .sdpa import _widen_half, check_heads, check_scale
from .elementwise import astype

__all__ = ["flash_attention", "flash_attention_arrays", "flash_backward_arrays",
           "FlashAttentionFunction"]


def _tile_mask(xp, q0, q1, k0, k1, offset, causal, key_mask, bs):
    """Allowed (query, key) pairs of one tile: (B' or 1, 1, b_q, b_k) bool, or None when every
    pair is allowed (no key mask, and the tile lies wholly on or below the causal diagonal)."""
    mask = None
    if causal and k1 - 1 > q0 + offset:                # some key is in the first row's future
        i = xp.arange(q0, q1)[:, None]
        j = xp.arange(k0, k1)[None, :]
        mask = (j <= i + offset)[None, None]
    if key_mask is not None:
        km = key_mask[bs, None, None, k0:k1]                      # (B', 1, 1, b_k)
        mask = km if mask is None else mask & km
    return mask


def _head_groups(b, hkv, group):
    """One (batch, key/value head) at a time: (bs, hs, hq) slices. Groups write disjoint parts
    of every output and gradient, so they may run in parallel threads."""
    return [(slice(i, i + 1), slice(j, j + 1), slice(j * group, (j + 1) * group))
            for i in range(b) for j in range(hkv)]


def _each_head_group(fn, groups, like):
    """``fn(g)`` for every group, in order — or, with the fast layer on, spread over the cores
    (its twin ``map_in_threads``, ``fast/parallel.py``: the same calls, disjoint outputs)."""
    threaded = configuration.twin("map_in_threads")
    if threaded is not None:
        return threaded(fn, groups, like=like)
    return [fn(g) for g in groups]


def _key_end(q1, nk, offset, causal):
    """Keys [0, end) that some row of a query block ending at q1 may see: past it, all future."""
    return max(0, min(nk, q1 + offset)) if causal else nk


def flash_attention_arrays(q, k, v, *, causal=False, scale=None, key_mask=None, block_q=256,
                           block_k=512):
    """Tiled forward on raw arrays: q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv) → (O, lse).

    O (B, H, Nq, Dv); lse (B, H, Nq) = log Σ_j exp(s_ij) over visible j (−inf if none).
    ``scale`` None → 1/√D.
    """
    xp = get_array_module(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    bsz, h, nq, _ = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[-1]
    # Bottom-right causal alignment: key j is visible to query i iff j ≤ i + (Nk − Nq).
    offset = nk - nq
    out = xp.empty((bsz, h, nq, dv), dtype=q.dtype)
    lse = xp.empty((bsz, h, nq), dtype=q.dtype)

    # One block of queries of one head group: the online softmax over key tiles (the module
    # docstring's recurrence); keys past the causal edge are never visited.
    def rows(bs, hs, hq, q0, q1):
        qi = q[bs, hq, q0:q1] * scale                                   # (1, G, bq, D)
        shape = qi.shape[:3] + (1,)
        m = xp.full(shape, -xp.inf, dtype=q.dtype)                      # running max
        l = xp.zeros(shape, dtype=q.dtype)                              # running sum
        acc = xp.zeros(qi.shape[:3] + (dv,), dtype=q.dtype)             # running P V
        kend = _key_end(q1, nk, offset, causal)
        for k0 in range(0, kend, block_k):
            k1 = min(k0 + block_k, kend)
            s = grouped_scores(qi, k[bs, hs, k0:k1])                     # (1, G, bq, bk)
            mask = _tile_mask(xp, q0, q1, k0, k1, offset, causal, key_mask, bs)
            if mask is not None:
                xp.copyto(s, -xp.inf, where=~mask)
            # Raise the running max to m', rescale the old sums by exp(m − m'), add this tile's
            # P = exp(S − m') to l and P V_j to acc.
            m_new = xp.maximum(m, row_max(s))
            m_safe = xp.where(xp.isfinite(m_new), m_new, 0)   # all −inf so far: shift by 0
            s -= m_safe
            p = xp.exp(s, out=s)                              # P, in the scores' memory
            alpha = xp.exp(m - m_safe)                        # rescales the old sums (0 if m=−inf)
            l *= alpha
            l += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += grouped_values(p, v[bs, hs, k0:k1])        # + P V_j
            m = m_new
        # O = acc / l and lse = m + log l; a row that saw no key (l = 0) gets 0 and −inf, not NaN.
        seen = l > 0
        out[bs, hq, q0:q1] = acc / xp.where(seen, l, 1)
        lse[bs, hq, q0:q1] = xp.where(seen, m + xp.log(xp.where(seen, l, 1)), -xp.inf)[..., 0]

    def group(g):
        for q0 in range(0, nq, block_q):
            rows(*g, q0, min(q0 + block_q, nq))

    _each_head_group(group, _head_groups(bsz, hkv, h // hkv), like=q)
    return out, lse


def flash_backward_arrays(q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
                          block_q=256, block_k=512):
    """Tiled backward on raw arrays: recompute P per tile from lse → (dq, dk, dv)."""
    xp = get_array_module(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    bsz, h, nq = q.shape[:3]
    hkv, nk = k.shape[1], k.shape[2]
    offset = nk - nq
    dq = xp.zeros_like(q)
    dk = xp.zeros_like(k)
    dv = xp.zeros_like(v)
    lse_safe = xp.where(xp.isfinite(lse), lse, xp.inf)[..., None]  # no key: P = exp(−inf) = 0

    def group(g):
        bs, hs, hq = g
        for q0 in range(0, nq, block_q):
            q1 = min(q0 + block_q, nq)
            qs = q[bs, hq, q0:q1] * scale                                # (1, G, bq, D)
            # δ = rowsum(dO ⊙ O) per block: no N × D temporary (linear memory is the point)
            delta = (do[bs, hq, q0:q1] * o[bs, hq, q0:q1]).sum(axis=-1, keepdims=True)
            kend = _key_end(q1, nk, offset, causal)
            for k0 in range(0, kend, block_k):
                k1 = min(k0 + block_k, kend)
                # Rebuild the tile's P = exp(S − lse) (masked entries −inf → 0), then
                # the five equations of attention_backward; a key tile's dK, dV add up
                # over every query block.
                kj, vj = k[bs, hs, k0:k1], v[bs, hs, k0:k1]
                s = grouped_scores(qs, kj)                               # (1, G, bq, bk)
                mask = _tile_mask(xp, q0, q1, k0, k1, offset, causal, key_mask, bs)
                if mask is not None:
                    xp.copyto(s, -xp.inf, where=~mask)
                s -= lse_safe[bs, hq, q0:q1]
                p = xp.exp(s, out=s)                                     # P recomputed
                tq, tk, tv, _ = attention_backward(do[bs, hq, q0:q1], p, qs, kj, vj, delta,
                                                   scale)
                dq[bs, hq, q0:q1] += tq
                dk[bs, hs, k0:k1] += tk
                dv[bs, hs, k0:k1] += tv

    _each_head_group(group, _head_groups(bsz, hkv, h // hkv), like=q)
    return dq, dk, dv


class FlashAttentionFunction(Function):
    """The tiled algorithm as one node: saves only (q, k, v, O, lse); backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, *, causal, scale, key_mask, block_q, block_k):
        o, lse = flash_attention_arrays(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                        block_q=block_q, block_k=block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = dict(causal=causal, scale=scale, key_mask=key_mask, block_q=block_q,
                           block_k=block_k)
        return o

    # Backward recomputes P tile by tile from the saved lse, with the gradient in q's dtype.
    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        grad = grad.astype(q.dtype, copy=False)
        return flash_backward_arrays(q, k, v, o, lse, grad, **ctx.options)


def flash_attention(q, k, v, causal: bool = False, scale: float = None, key_mask=None,
                    block_q: int = 256, block_k: int = 512):
    """Exact softmax(q kᵀ·scale) v by tiles: q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv) Tensors.

    ``key_mask`` (B, Nk) bool (True = may attend; a NumPy mask is moved to the data's device).
    Returns (B, H, Nq, Dv). Memory O(N·D + block_q·block_k) in forward and backward; exact
    (the same result as dense up to rounding). The default tiles, 256 queries × 512 keys
    (512 KiB of float32 scores), are large enough for BLAS and small next to a long sequence.
    On CuPy float32/float16 the CUDA kernel runs (``ops/dispatch.py``); the tiles are the
    CPU's version of the same algorithm.
    """
    fn = "flash_attention"
    _, h, _, nq, nk, d = check_heads(q, k, v, fn)
    block_q = validate.positive_int(block_q, "block_q", owner=fn)
    block_k = validate.positive_int(block_k, "block_k", owner=fn)
    causal = validate.boolean(causal, "causal", owner=fn)
    if key_mask is not None:
        km = key_mask.data if isinstance(key_mask, Tensor) else key_mask
        if getattr(km, "dtype", None) != bool or tuple(km.shape) != (q.shape[0], nk):
            raise ValueError(f"{fn}: key_mask must be bool of shape {(q.shape[0], nk)}, got "
                             f"{getattr(km, 'dtype', type(km).__name__)} "
                             f"{tuple(getattr(km, 'shape', ()))}")
        key_mask = to_device_of(km, q.data)
    scale = check_scale(fn, scale, d)
    # On a GPU with float32/float16 data the CUDA kernel takes the call; otherwise the CPU
    # tiles run, half precision widened to float32 so the running sums keep their accuracy.
    if dispatch.choose_kernel(fn, q.data, k.data, v.data, key_mask=key_mask):
        return dispatch.FlashKernelFunction.apply(q, k, v, causal=causal, scale=scale,
                                                  key_mask=key_mask)
    dtype = q.dtype
    q, k, v = _widen_half(q, k, v)              # float16 tiles accumulate in float32
    o = FlashAttentionFunction.apply(q, k, v, causal=causal, scale=scale, key_mask=key_mask,
                                     block_q=block_q, block_k=block_k)
    return o if o.dtype == dtype else astype(o, dtype)
