"""FlashAttention on the CPU: exact attention in tiles, never holding the N × N matrix.

Dao, Fu, Ermon, Rudra & Ré (2022), "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness" (backward as in FlashAttention-2, Dao 2023).

Forward, for one block of queries Q_i against blocks K_j, V_j, with the *online softmax*
(running row max m, running row sum l, unnormalised output acc):

    S   = Q_i K_jᵀ · scale                      (b_q, b_k), masked entries −inf
    m'  = max(m, rowmax S)
    P   = exp(S − m')                           (entries of this block, rescaled to m')
    l   = exp(m − m') · l + rowsum P
    acc = exp(m − m') · acc + P V_j
    m   = m'

and at the end O_i = acc / l, lse_i = m + log l (the row logsumexp). Only (O, lse) are kept
for backward — the same statistics as the CUDA kernel (``minitx.backend.flash_cuda``).

Backward recomputes each block of probabilities from the saved lse, P = exp(S − lse), with
D = rowsum(dO ⊙ O):

    dV_j += Pᵀ dO_i        dP = dO_i V_jᵀ        dS = P ⊙ (dP − D)
    dQ_i += dS K_j · scale                       dK_j += dSᵀ Q_i · scale

Time O(N²·D) (like dense), memory O(N·D + b_q·b_k): exact. Causal masking is bottom-right
aligned (key j visible to query i iff j ≤ i + Nk − Nq) and blocks entirely above the
diagonal are skipped. ``key_mask`` (B, Nk) bool, True = may attend, masks padding keys; a
row with no visible key gives zeros and lse = −inf (handled without NaN).
"""
from __future__ import annotations

import math

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from .base import AttentionBase, check_heads, register, repeat_kv

__all__ = ["flash_attention", "flash_attention_arrays", "FlashAttentionFunction",
           "FlashAttention"]


def _cuda_kernels(xp, q=None, k=None, v=None, key_mask=None):
    """The CUDA kernels module when the arrays are CuPy and it can run them, else None.

    The kernels take float32/float16 with head dims up to 128 (``flash_cuda.supports``
    checks shapes, dtypes and grid limits); anything else (e.g. float64 gradchecks on the
    GPU) runs the tiled code below, which is written against ``xp`` and works on CuPy too.
    """
    if xp.__name__ != "cupy":
        return None
    if q is not None and q.dtype.name not in ("float32", "float16"):
        return None
    try:
        from ..backend import flash_cuda  # noqa: PLC0415 - lazy: only on the GPU path
    except ImportError:
        return None
    if q is not None and k is not None and v is not None \
            and not flash_cuda.supports(q, k, v, key_mask=key_mask):
        return None
    return flash_cuda if flash_cuda.is_available() else None


def _repeat_heads(xp, x, h):
    """(B, Hkv, N, D) → (B, H, N, D): query head i reads key/value head i // (H / Hkv)."""
    return x if x.shape[1] == h else xp.repeat(x, h // x.shape[1], axis=1)


def _sum_groups(g, hkv):
    """(B, H, N, D) gradient of repeated heads → (B, Hkv, N, D): sum over each group."""
    b, h, n, d = g.shape
    return g if h == hkv else g.reshape(b, hkv, h // hkv, n, d).sum(axis=2)


def _block_mask(xp, q0, q1, k0, k1, offset, causal, key_mask):
    """Allowed (query, key) pairs of one tile: (B or 1, 1, b_q, b_k) bool, or None (all)."""
    mask = None
    if causal:
        i = xp.arange(q0, q1)[:, None]
        j = xp.arange(k0, k1)[None, :]
        mask = (j <= i + offset)[None, None]
    if key_mask is not None:
        km = key_mask[:, None, None, k0:k1]                       # (B, 1, 1, b_k)
        mask = km if mask is None else mask & km
    return mask


def _tile_visible(q0, q1, k0, offset, causal):
    """False when the whole tile lies above the causal diagonal (skip it)."""
    return not causal or k0 <= (q1 - 1) + offset


def flash_attention_arrays(q, k, v, *, causal=False, scale=None, key_mask=None,
                           block_q=64, block_k=64):
    """Tiled forward on raw arrays: q (B, H, Nq, D), k/v (B, H, Nk, D/Dv) → (O, lse).

    O (B, H, Nq, Dv); lse (B, H, Nq) = log Σ_j exp(s_ij) over visible j (−inf if none).
    """
    xp = get_array_module(q, k, v)
    bsz, h, nq, d = q.shape
    nk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    offset = nk - nq
    out = xp.empty((bsz, h, nq, v.shape[-1]), dtype=q.dtype)
    lse = xp.empty((bsz, h, nq), dtype=q.dtype)
    for q0 in range(0, nq, block_q):
        q1 = min(q0 + block_q, nq)
        qi = q[:, :, q0:q1] * scale                                     # (B, H, bq, D)
        m = xp.full((bsz, h, q1 - q0, 1), -xp.inf, dtype=q.dtype)       # running max
        l = xp.zeros((bsz, h, q1 - q0, 1), dtype=q.dtype)               # running sum
        acc = xp.zeros((bsz, h, q1 - q0, v.shape[-1]), dtype=q.dtype)
        for k0 in range(0, nk, block_k):
            if not _tile_visible(q0, q1, k0, offset, causal):
                break                                   # every later tile is above too
            k1 = min(k0 + block_k, nk)
            s = qi @ xp.swapaxes(k[:, :, k0:k1], -1, -2)   # (B, H, bq, D) @ (B, H, D, bk)
            mask = _block_mask(xp, q0, q1, k0, k1, offset, causal, key_mask)
            if mask is not None:
                s = xp.where(mask, s, -xp.inf)
            m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
            m_safe = xp.where(xp.isfinite(m_new), m_new, 0)   # all −inf so far: shift by 0
            p = xp.exp(s - m_safe)                            # (B, H, bq, bk)
            alpha = xp.exp(m - m_safe)                        # rescales the old sums (0 if m=−inf)
            l = alpha * l + p.sum(axis=-1, keepdims=True)
            acc = alpha * acc + p @ v[:, :, k0:k1]            # (B, H, bq, bk) @ (B, H, bk, Dv)
            m = m_new
        seen = l > 0
        out[:, :, q0:q1] = acc / xp.where(seen, l, 1)
        lse[:, :, q0:q1] = xp.where(seen, m + xp.log(xp.where(seen, l, 1)), -xp.inf)[..., 0]
    return out, lse


def flash_backward_arrays(q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
                          block_q=64, block_k=64):
    """Tiled backward on raw arrays: recompute P per tile from lse → (dq, dk, dv)."""
    xp = get_array_module(q, k, v)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    offset = nk - nq
    dq = xp.zeros_like(q)
    dk = xp.zeros_like(k)
    dv = xp.zeros_like(v)
    delta = (do * o).sum(axis=-1, keepdims=True)                  # D = rowsum(dO ⊙ O)
    lse_safe = xp.where(xp.isfinite(lse), lse, xp.inf)[..., None]  # no key: P = exp(−inf) = 0
    for k0 in range(0, nk, block_k):
        k1 = min(k0 + block_k, nk)
        kj, vj = k[:, :, k0:k1], v[:, :, k0:k1]
        for q0 in range(0, nq, block_q):
            q1 = min(q0 + block_q, nq)
            if not _tile_visible(q0, q1, k0, offset, causal):
                continue
            s = (q[:, :, q0:q1] @ xp.swapaxes(kj, -1, -2)) * scale     # (B, H, bq, bk)
            mask = _block_mask(xp, q0, q1, k0, k1, offset, causal, key_mask)
            if mask is not None:
                s = xp.where(mask, s, -xp.inf)
            p = xp.exp(s - lse_safe[:, :, q0:q1])                       # recomputed P
            doi = do[:, :, q0:q1]
            dv[:, :, k0:k1] += xp.swapaxes(p, -1, -2) @ doi             # Pᵀ dO
            dp = doi @ xp.swapaxes(vj, -1, -2)                          # dO Vᵀ
            ds = p * (dp - delta[:, :, q0:q1])                          # P ⊙ (dP − D)
            dq[:, :, q0:q1] += (ds @ kj) * scale
            dk[:, :, k0:k1] += (xp.swapaxes(ds, -1, -2) @ q[:, :, q0:q1]) * scale
    return dq, dk, dv


class FlashAttentionFunction(Function):
    """Custom Function: saves only (q, k, v, O, lse); backward recomputes P tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, *, causal, scale, key_mask, block_q, block_k):
        # k, v keep their own head count Hkv (GQA/MQA): the CUDA kernel reads the shared
        # heads directly; the tiled CPU code repeats them and sums the gradients back.
        xp = get_array_module(q, k, v)
        cuda = _cuda_kernels(xp, q, k, v, key_mask)
        if cuda is not None:
            o, lse = cuda.flash_attention_forward(q, k, v, causal=causal, scale=scale,
                                                  key_mask=key_mask)
        else:
            h = q.shape[1]
            o, lse = flash_attention_arrays(q, _repeat_heads(xp, k, h), _repeat_heads(xp, v, h),
                                            causal=causal, scale=scale, key_mask=key_mask,
                                            block_q=block_q, block_k=block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cuda = cuda                      # backward takes the same path as forward
        ctx.options = dict(causal=causal, scale=scale, key_mask=key_mask)
        ctx.blocks = dict(block_q=block_q, block_k=block_k)
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        xp = get_array_module(q, k, v)
        grad = xp.ascontiguousarray(grad).astype(q.dtype, copy=False)
        if ctx.cuda is not None:
            return ctx.cuda.flash_attention_backward(q, k, v, o, lse, grad, **ctx.options)
        h, hkv = q.shape[1], k.shape[1]
        dq, dk, dv = flash_backward_arrays(q, _repeat_heads(xp, k, h), _repeat_heads(xp, v, h),
                                           o, lse, grad, **ctx.options, **ctx.blocks)
        return dq, _sum_groups(dk, hkv), _sum_groups(dv, hkv)


def flash_attention(q, k, v, causal: bool = False, scale: float = None, key_mask=None,
                    block_q: int = 64, block_k: int = 64):
    """Exact softmax(q kᵀ·scale) v by tiles: q (B, H, Nq, D), k/v (B, Hkv, Nk, D) Tensors.

    ``key_mask`` (B, Nk) bool (True = may attend). Returns (B, H, Nq, Dv). Memory O(N·D +
    block_q·block_k) in forward and backward; exact (same result as dense up to rounding).
    """
    _, h, _, nq, nk, d = check_heads(q, k, v, "flash_attention")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"flash_attention: {name} must be a positive int, got {size!r}")
    if key_mask is not None:
        km = key_mask.data if isinstance(key_mask, Tensor) else key_mask
        if km.dtype != bool or tuple(km.shape) != (q.shape[0], nk):
            raise ValueError(f"flash_attention: key_mask must be bool of shape "
                             f"{(q.shape[0], nk)}, got {km.dtype} {tuple(km.shape)}")
        key_mask = to_device_of(km, q.data)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return FlashAttentionFunction.apply(q, k, v, causal=bool(causal), scale=scale,
                                        key_mask=key_mask, block_q=block_q, block_k=block_k)


@register("flash")
class FlashAttention(AttentionBase):
    """Exact attention computed tile by tile with the online softmax (``flash_attention``).

    Formula: O = softmax(Q Kᵀ/√D + M) V without forming it: per query tile Q_i and key tile
    K_j, S = Q_i K_jᵀ/√D, m' = max(m, rowmax S), l ← e^(m−m')·l + rowsum e^(S−m'),
    acc ← e^(m−m')·acc + e^(S−m') V_j, m ← m'; finally O_i = acc / l and lse_i = m + log l.
    Backward recomputes P = exp(S − lse) per tile.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, key_mask=None)``:
    q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D); ``key_mask`` (B, N) bool (True = may
    attend). Saved for backward: O and lse (B, H, N); tiles S (B, H, b_q, b_k).

    Options: ``block_q`` b_q (64), ``block_k`` b_k (64), ``causal`` (False; tiles entirely
    above the diagonal are skipped), ``num_kv_heads`` (None → H), ``bias`` (True).

    Complexity: time O(B·H·N²·D) (like dense), memory O(B·H·(N·D + b_q·b_k)): no N × N matrix
    in forward or backward. (On CuPy float32/float16 it runs the CUDA kernels.)

    Exactness: exact (equals softmax attention under pattern(n)), up to rounding.

    Reference: Dao, Fu, Ermon, Rudra & Ré (2022), "FlashAttention: Fast and Memory-Efficient
    Exact Attention with IO-Awareness"; backward as in Dao (2023), "FlashAttention-2".
    """

    complexity = "time O(N²·D), memory O(N·D)"

    kind = "exact"

    def __init__(self, embed_dim, num_heads, causal=False, block_q: int = 64,
                 block_k: int = 64, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        for name, size in (("block_q", block_q), ("block_k", block_k)):
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"{name} must be a positive int, got {size!r}")
        self.block_q, self.block_k = block_q, block_k

    def attend(self, q, k, v, key_mask=None):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv); optional ``key_mask`` (B, N)."""
        return flash_attention(q, k, v, causal=self.causal, key_mask=key_mask,
                               block_q=self.block_q, block_k=self.block_k)
