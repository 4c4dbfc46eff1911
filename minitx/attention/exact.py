"""Exact attention: scaled dot-product attention, the first forms, and the exact variants.

The one formula behind every transformer (Vaswani et al. 2017, "Attention Is All You Need"):

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + M) V,        scale = 1/√D by default,

Q (…, Nq, D), K (…, Nk, D), V (…, Nk, Dv). M is the mask: −inf where a query may not look,
or any additive bias (ALiBi, relative positions, padding). A row whose keys are *all* masked
gives a zero output and zero gradients (never NaN).

What is here:

- ``scaled_dot_product_attention`` — PyTorch's functional API, computed by ONE fused Function
  (``SDPAFunction``) whose backward is written out by hand (see its docstring);
- ``attention_weights`` — the probabilities softmax(Q Kᵀ·scale + M) alone, differentiable;
- the forms readers meet first: ``dot_product_attention`` (Luong et al. 2015, "dot" and
  "general"), ``AdditiveAttention`` (Bahdanau et al. 2015), single-head ``SelfAttention`` and
  ``CausalSelfAttention``;
- registered variants: ``mha`` (``ExactSelfAttention``), ``mqa`` (one key/value head,
  Shazeer 2019), ``gqa`` (grouped key/value heads, Ainslie et al. 2023), ``dot`` (Luong score,
  unscaled) and ``additive`` (Bahdanau score per head).

Causal masks are **bottom-right aligned** everywhere in minitx: with Nq queries and Nk keys,
query i may see key j iff j ≤ i + (Nk − Nq), i.e. the queries are the *last* Nq positions
(what a KV cache needs). PyTorch's ``is_causal`` is top-left aligned (j ≤ i); the two agree
when Nq = Nk.
"""
from __future__ import annotations

import math

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of, xp as active_xp
from ..nn.layers import Linear
from ..nn.module import Module, Parameter
from ..ops.activation import softmax
from ..ops.dropout import dropout, dropout_mask
from ..ops.elementwise import tanh
from ..ops.indexing import masked_fill
from ..ops.linalg import matmul
from ..ops.shape import broadcast_to, expand_dims, reshape, swapaxes
from ..ops._util import unbroadcast
from .base import (AttentionBase, causal_pattern, check_heads, merge_heads, register, repeat_kv,
                   softmax_rows_array, split_heads)

__all__ = ["scaled_dot_product_attention", "attention_weights", "SDPAFunction",
           "CausalSDPAFunction",
           "AttentionWeightsFunction", "dot_product_attention", "additive_scores",
           "AdditiveAttention", "SelfAttention", "CausalSelfAttention", "ExactSelfAttention",
           "MultiQueryAttention", "GroupedQueryAttention", "DotProductSelfAttention",
           "AdditiveSelfAttention", "merge_masks", "default_kv_heads"]


# ---- raw-array helpers -------------------------------------------------------------------

def _softmax_rows_(s):
    """Safe softmax over the last axis, *in place* on a fresh scores array; returns it.

    A row that is entirely −inf (every key masked) becomes all zeros instead of NaN.
    """
    xp = get_array_module(s)
    m = s.max(axis=-1, keepdims=True)
    m[~xp.isfinite(m)] = 0                      # all −inf: shift by 0 so exp gives exact 0s
    s -= m
    xp.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    total[total == 0] = 1                       # empty row: 0 / 1 = 0
    s /= total
    return s


def _grouped_scores(qs, k):
    """Scores for grouped heads without copying K: (B, H, Nq, D), (B, Hkv, Nk, D) → (B, H, Nq, Nk).

    Query heads h = kv·G + g (G = H/Hkv) are contiguous, so q viewed as (B, Hkv, G·Nq, D)
    puts every query of a group against its shared key head in one matmul.
    """
    xp = get_array_module(qs, k)
    b, h, nq, d = qs.shape
    hkv, nk = k.shape[1], k.shape[2]
    qg = qs.reshape(b, hkv, (h // hkv) * nq, d)
    # (B, Hkv, G·Nq, D) @ (B, Hkv, D, Nk) -> (B, Hkv, G·Nq, Nk) ≡ (B, H, Nq, Nk)
    return (qg @ xp.swapaxes(k, -1, -2)).reshape(b, h, nq, nk)


def _scores(qs, k, bias, allowed):
    """S = qs kᵀ (+ bias), −inf where not ``allowed``; always a fresh array."""
    xp = get_array_module(qs, k)
    s = _grouped_scores(qs, k)
    if bias is not None:
        s += bias.astype(s.dtype, copy=False)
    if allowed is not None:
        xp.copyto(s, -xp.inf, where=~allowed)                   # in place, broadcasting the mask
    return s


def _dscores(ds, qs, k, scale, needs, bias_meta):
    """From dS (B, H, Nq, Nk) to (dQ, dK, dBias): dQ = dS K·scale, dK = Σ_group dSᵀ Q·scale."""
    xp = get_array_module(ds)
    b, h, nq, nk = ds.shape
    hkv, d = k.shape[1], k.shape[3]
    dsg = ds.reshape(b, hkv, (h // hkv) * nq, nk)
    dq = dk = dbias = None
    if needs[0]:
        # (B, Hkv, G·Nq, Nk) @ (B, Hkv, Nk, D) -> (B, Hkv, G·Nq, D) ≡ (B, H, Nq, D)
        dq = (dsg @ k).reshape(b, h, nq, d)
        dq *= scale
    if needs[1]:
        # (B, Hkv, Nk, G·Nq) @ (B, Hkv, G·Nq, D) -> (B, Hkv, Nk, D): the group sum is the matmul
        dk = xp.swapaxes(dsg, -1, -2) @ qs.reshape(b, hkv, (h // hkv) * nq, d)
    if needs[2]:
        dbias = unbroadcast(ds, *bias_meta)                     # (shape, dtype) of the bias
    return dq, dk, dbias


# ---- the fused Functions -----------------------------------------------------------------

class SDPAFunction(Function):
    """O = dropout(softmax(Q Kᵀ·scale + bias, masked)) V in one node; inputs (q, k, v, bias).

    Shapes: q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` None or
    broadcastable to (B, H, Nq, Nk) (differentiable); ``allowed`` bool broadcastable to the
    same (True = may attend). Forward saves P (B, H, Nq, Nk) and O. Backward, with
    P̃ = P ⊙ keep/(1 − p) the dropped-out probabilities:

        dV = P̃ᵀ dO                     (summed over each key/value head's query group)
        dP̃ = dO Vᵀ,   dP = dP̃ ⊙ keep/(1 − p)
        dS = P ⊙ (dP − δ),   δ = rowsum(dP ⊙ P) = rowsum(dO ⊙ O)     (O(N·D), not O(N²))
        dQ = dS K · scale,   dK = dSᵀ Q · scale,   dBias = dS (un-broadcast)

    Masked entries have P = 0, hence dS = 0: fully masked rows get zero gradients.
    Time O(B·H·Nq·Nk·D), memory O(B·H·Nq·Nk) for P.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, *, allowed, scale, dropout_p):
        b, h, nq, _ = q.shape
        hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
        qs = q * scale                                           # scale Q (N·D), not S (N²)
        p = _softmax_rows_(_scores(qs, k, bias, allowed))        # (B, H, Nq, Nk)
        keep = dropout_mask(p.shape, dropout_p, p) if dropout_p > 0 else None
        pd = p * keep if keep is not None else p
        # (B, Hkv, G·Nq, Nk) @ (B, Hkv, Nk, Dv) -> (B, Hkv, G·Nq, Dv) ≡ (B, H, Nq, Dv)
        o = (pd.reshape(b, hkv, (h // hkv) * nq, nk) @ v).reshape(b, h, nq, dv)
        ctx.save_for_backward(qs, k, v, p, keep, o)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return o

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, p, keep, o = ctx.saved_tensors
        xp = get_array_module(grad)
        b, h, nq, nk = p.shape
        hkv, dv = v.shape[1], v.shape[3]
        rows = (h // hkv) * nq
        dog = grad.reshape(b, hkv, rows, dv)
        dvv = None
        if ctx.needs_input_grad[2]:
            pd = p * keep if keep is not None else p
            # (B, Hkv, Nk, G·Nq) @ (B, Hkv, G·Nq, Dv) -> (B, Hkv, Nk, Dv)
            dvv = xp.swapaxes(pd.reshape(b, hkv, rows, nk), -1, -2) @ dog
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[3])
        if not any(needs):
            return None, None, dvv, None
        # (B, Hkv, G·Nq, Dv) @ (B, Hkv, Dv, Nk) -> (B, Hkv, G·Nq, Nk) ≡ (B, H, Nq, Nk)
        ds = (dog @ xp.swapaxes(v, -1, -2)).reshape(b, h, nq, nk)
        if keep is not None:
            ds *= keep
        ds -= (grad * o).sum(axis=-1, keepdims=True)             # δ = rowsum(dO ⊙ O)
        ds *= p                                                  # dS = P ⊙ (dP − δ)
        dq, dk, dbias = _dscores(ds, qs, k, ctx.scale, needs, ctx.bias_meta)
        return dq, dk, dvv, dbias


class CausalSDPAFunction(Function):
    """Causal O = softmax(Q Kᵀ·scale, causal) V, skipping the key blocks no query can see.

    The same math as ``SDPAFunction`` (P saved, the same backward), computed one block of
    ``block`` queries at a time: block [i0, i1) only meets keys [0, i1 + Nk − Nq) (bottom-right
    causal alignment), so the masked upper triangle is never computed — about half the
    scores, exponentials and products of the dense path for long sequences:

        work ∝ Σ_blocks (i1 + Nk − Nq) ≈ ½·Nq·Nk + ½·block·Nq   instead of Nq·Nk.

    A Python loop over blocks (not positions). Memory: the saved P blocks, ≈ ½·Nq·Nk.
    """

    @staticmethod
    def forward(ctx, q, k, v, *, scale, block):
        xp = get_array_module(q, k, v)
        b, h, nq, _ = q.shape
        hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
        g, offset = h // hkv, nk - nq
        qs = q * scale
        o = xp.zeros((b, h, nq, dv), dtype=q.dtype)
        probs = []
        for i0 in range(0, nq, block):
            i1 = min(i0 + block, nq)
            kend = min(nk, i1 + offset)                 # keys past kend are future for all rows
            if kend <= 0:                               # nothing visible: rows stay zero
                probs.append(None)
                continue
            # (B, H, bq, D) vs (B, Hkv, kend, D) -> (B, H, bq, kend), −inf above the diagonal
            s = _grouped_scores(qs[:, :, i0:i1], k[:, :, :kend])
            visible = xp.tri(i1 - i0, kend, i0 + offset, dtype=bool)
            xp.copyto(s, -xp.inf, where=~visible)
            p = _softmax_rows_(s)
            # (B, Hkv, G·bq, kend) @ (B, Hkv, kend, Dv) -> (B, H, bq, Dv)
            o[:, :, i0:i1] = (p.reshape(b, hkv, g * (i1 - i0), kend)
                              @ v[:, :, :kend]).reshape(b, h, i1 - i0, dv)
            probs.append(p)
        ctx.save_for_backward(qs, k, v, o)
        ctx.probs, ctx.scale, ctx.block = probs, scale, block
        return o

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, o = ctx.saved_tensors
        xp = get_array_module(grad)
        b, h, nq, d = qs.shape
        hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
        g = h // hkv
        delta = (grad * o).sum(axis=-1, keepdims=True)           # δ = rowsum(dO ⊙ O)
        dq = xp.zeros_like(qs)
        dk = xp.zeros(k.shape, dtype=k.dtype)
        dvv = xp.zeros(v.shape, dtype=v.dtype)
        for n, p in enumerate(ctx.probs):
            if p is None:
                continue
            i0 = n * ctx.block
            i1, kend = i0 + p.shape[2], p.shape[3]
            rows = g * (i1 - i0)
            pg = p.reshape(b, hkv, rows, kend)                   # (B, Hkv, G·bq, kend)
            dog = xp.ascontiguousarray(grad[:, :, i0:i1]).reshape(b, hkv, rows, dv)
            dvv[:, :, :kend] += xp.swapaxes(pg, -1, -2) @ dog    # dV = Pᵀ dO
            ds = (dog @ xp.swapaxes(v[:, :, :kend], -1, -2)).reshape(p.shape)   # dP = dO Vᵀ
            ds -= delta[:, :, i0:i1]
            ds *= p                                              # dS = P ⊙ (dP − δ)
            dsg = ds.reshape(b, hkv, rows, kend)
            dq[:, :, i0:i1] = (dsg @ k[:, :, :kend]).reshape(b, h, i1 - i0, d) * ctx.scale
            qg = xp.ascontiguousarray(qs[:, :, i0:i1]).reshape(b, hkv, rows, d)
            dk[:, :, :kend] += xp.swapaxes(dsg, -1, -2) @ qg     # dK = dSᵀ Q·scale
        return dq, dk, dvv


class AttentionWeightsFunction(Function):
    """P = softmax(Q Kᵀ·scale + bias, masked) in one node; inputs (q, k, bias).

    Backward: dS = P ⊙ (dP − rowsum(dP ⊙ P)), then dQ = dS K·scale, dK = dSᵀ Q·scale,
    dBias = dS. Shapes as in ``SDPAFunction``; output (B, H, Nq, Nk).
    """

    @staticmethod
    def forward(ctx, q, k, bias, *, allowed, scale):
        qs = q * scale
        p = _softmax_rows_(_scores(qs, k, bias, allowed))
        ctx.save_for_backward(qs, k, p)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return p

    @staticmethod
    def backward(ctx, grad):
        qs, k, p = ctx.saved_tensors
        ds = grad * p
        ds -= p * ds.sum(axis=-1, keepdims=True)                 # P ⊙ (dP − Σ dP ⊙ P)
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return _dscores(ds, qs, k, ctx.scale, needs, ctx.bias_meta)


class _FlashCUDAFunction(Function):
    """The CUDA flash kernels (``minitx.backend.flash_cuda``) as a Function: saves (O, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, *, causal, scale, kernels):
        o, lse = kernels.flash_attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = dict(causal=causal, scale=scale)
        ctx.kernels = kernels
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        xp = get_array_module(grad)
        return ctx.kernels.flash_attention_backward(q, k, v, o, lse, xp.ascontiguousarray(grad),
                                                    **ctx.options)


def _flash_kernels(q, k, v):
    """``flash_cuda`` when q/k/v are CuPy arrays its kernels take (``flash_cuda.supports``:
    float32/float16, compiled head dims, GQA) and the kernels load; else None, and the fused
    Function runs instead."""
    if get_array_module(q).__name__ == "numpy":
        return None
    try:
        from ..backend import flash_cuda  # noqa: PLC0415 - lazy: only on the GPU path
        return flash_cuda if flash_cuda.supports(q, k, v) and flash_cuda.is_available() else None
    except Exception:
        return None


# ---- argument checking and mask plumbing -------------------------------------------------

def _shape(t):
    return tuple(t.shape)


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
    batch = shape[:-3]
    if all(n == 1 for n in batch):
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


def _prepare(fn, query, key, value, attn_mask, is_causal, scale, enable_gqa):
    """Shared checks: 4-d views of q/k/v, the bool ``allowed`` array and the float ``bias``."""
    b, h, hkv, nq, nk = _check_qkv(fn, query, key, value, enable_gqa)
    lead = tuple(query.shape[:-3])
    d, dv = query.shape[-1], value.shape[-1]
    q4 = reshape(query, (b, h, nq, d))
    k4 = reshape(key, (b, hkv, nk, d))
    v4 = reshape(value, (b, hkv, nk, dv))
    xp = get_array_module(query.data)
    allowed = bias = None
    if attn_mask is not None:
        mdata = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
        if not hasattr(mdata, "dtype"):
            raise TypeError(f"{fn}: attn_mask must be an array or Tensor, got "
                            f"{type(attn_mask).__name__}")
        if mdata.dtype == bool:
            allowed = _mask_to_4d(fn, to_device_of(mdata, query.data), lead, h, nq, nk)
        elif mdata.dtype.kind == "f":
            bias = _mask_to_4d(fn, to_device_of(attn_mask, query.data), lead, h, nq, nk)
        else:
            raise TypeError(f"{fn}: attn_mask must be bool (True = may attend) or float "
                            f"(added to the scores), got dtype {mdata.dtype}")
    if is_causal:
        tri = causal_pattern(nq, nk, xp)                          # bottom-right aligned
        allowed = tri if allowed is None else allowed & tri
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"{fn}: scale must be a positive number or None, got {scale!r}")
    return q4, k4, v4, allowed, bias, float(scale), lead, (b, h, nq, dv)


def _check_dropout(fn, p):
    if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{fn}: dropout_p must be in [0, 1), got {p!r}")
    return float(p)


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
    grad: learned biases get gradients). ``is_causal``: query i sees key j iff
    j ≤ i + Nk − Nq (bottom-right aligned; PyTorch aligns top-left, the same when Nq = Nk);
    it may be combined with ``attn_mask`` (their AND). ``scale`` defaults to 1/√D.
    ``dropout_p`` drops attention probabilities (seeded by ``minitx.manual_seed``).

    Rows with every key masked give zeros and zero gradients (PyTorch gives NaN there).
    With ``return_weights=True`` returns ``(out, weights)``, weights (…, H, Nq, Nk) being the
    probabilities before dropout, differentiable.

    One fused Function (``SDPAFunction``): time O(Nq·Nk·D) per head, memory O(Nq·Nk).
    Causal with no other mask, no dropout and Nq > 64: ``CausalSDPAFunction``, the same
    math by query blocks that skip the future keys (about half the work).
    On CuPy, with no mask, no dropout and no weights, the CUDA flash kernels run instead
    (memory O(N·D)).
    """
    fn = "scaled_dot_product_attention"
    q4, k4, v4, allowed, bias, scale, lead, (b, h, nq, dv) = _prepare(
        fn, query, key, value, attn_mask, is_causal, scale, enable_gqa)
    dropout_p = _check_dropout(fn, dropout_p)
    nd = len(query.shape)
    if return_weights:
        w = AttentionWeightsFunction.apply(q4, k4, bias, allowed=allowed, scale=scale)
        wd = dropout(w, dropout_p) if dropout_p > 0 else w
        hkv, nk = k4.shape[1], k4.shape[2]
        # (B, Hkv, G·Nq, Nk) @ (B, Hkv, Nk, Dv) -> (B, Hkv, G·Nq, Dv) -> (B, H, Nq, Dv)
        o = reshape(matmul(reshape(wd, (b, hkv, (h // hkv) * nq, nk)), v4), (b, h, nq, dv))
        return _unflatten(o, lead, nd), _unflatten(w, lead, nd)
    if attn_mask is None and dropout_p == 0.0:
        kernels = _flash_kernels(q4.data, k4.data, v4.data)
        if kernels is not None:
            o = _FlashCUDAFunction.apply(q4, k4, v4, causal=bool(is_causal), scale=scale,
                                         kernels=kernels)
            return _unflatten(o, lead, nd)
    if is_causal and attn_mask is None and dropout_p == 0.0 and nq > _CAUSAL_BLOCK:
        o = CausalSDPAFunction.apply(q4, k4, v4, scale=scale, block=_CAUSAL_BLOCK)
        return _unflatten(o, lead, nd)
    o = SDPAFunction.apply(q4, k4, v4, bias, allowed=allowed, scale=scale, dropout_p=dropout_p)
    return _unflatten(o, lead, nd)


_CAUSAL_BLOCK = 64   # query block of the causal path: above it, skipping the future pays off


def attention_weights(query, key, attn_mask=None, is_causal: bool = False, scale: float = None,
                      enable_gqa: bool = False):
    """P = softmax(Q Kᵀ · scale + M): the attention map alone, (…, H, Nq, Nk), differentiable.

    Same arguments and mask semantics as ``scaled_dot_product_attention``.
    """
    fn = "attention_weights"
    q4, k4, _, allowed, bias, scale, lead, _ = _prepare(fn, query, key, key, attn_mask,
                                                          is_causal, scale, enable_gqa)
    w = AttentionWeightsFunction.apply(q4, k4, bias, allowed=allowed, scale=scale)
    return _unflatten(w, lead, len(query.shape))


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


# ---- the forms readers meet first --------------------------------------------------------

def _masked_softmax(scores, mask):
    """softmax over keys; ``mask`` True = may attend (fully masked rows give zeros)."""
    if mask is not None:
        m = mask.data if isinstance(mask, Tensor) else mask
        scores = masked_fill(scores, ~m, -math.inf)
    return softmax(scores, axis=-1)


def dot_product_attention(query, key, value, weight=None, mask=None):
    """Luong et al. (2015), "Effective Approaches to Attention-based NMT": unscaled scores.

        "dot":      score(q, k) = qᵀ k
        "general":  score(q, k) = qᵀ W k          (``weight`` W of shape (Dq, Dk))
        α = softmax(scores) over keys,   context = α V

    query (…, Nq, Dq), key (…, Nk, Dk), value (…, Nk, Dv); ``mask`` broadcastable to
    (…, Nq, Nk), True = may attend. Returns ``(context (…, Nq, Dv), weights (…, Nq, Nk))``.
    Time O(Nq·Nk·D).
    """
    if weight is None:
        if query.shape[-1] != key.shape[-1]:
            raise ValueError(f"dot_product_attention: 'dot' scores need equal query/key dims, "
                             f"got query {_shape(query)} and key {_shape(key)} (pass weight "
                             "for 'general')")
        qw = query
    else:
        if _shape(weight) != (query.shape[-1], key.shape[-1]):
            raise ValueError(f"dot_product_attention: weight must be (Dq, Dk) = "
                             f"{(query.shape[-1], key.shape[-1])}, got {_shape(weight)}")
        qw = matmul(query, weight)                              # (…, Nq, Dq) @ (Dq, Dk)
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"dot_product_attention: key and value must have the same length, "
                         f"got key {_shape(key)} and value {_shape(value)}")
    scores = matmul(qw, swapaxes(key, -1, -2))                  # (…, Nq, Dk) @ (…, Dk, Nk)
    weights = _masked_softmax(scores, mask)                     # (…, Nq, Nk)
    return matmul(weights, value), weights                      # (…, Nq, Nk) @ (…, Nk, Dv)


def additive_scores(q, k, w_q, w_k, w):
    """Bahdanau score e_ij = wᵀ tanh(W_q q_i + W_k k_j) for every (i, j).

    q (…, Nq, Dq), k (…, Nk, Dk), W_q (A, Dq), W_k (A, Dk), w (A,) → (…, Nq, Nk).
    Memory O(Nq·Nk·A): the tanh of every pair is formed.
    """
    qa = expand_dims(matmul(q, swapaxes(w_q, 0, 1)), -2)         # (…, Nq, 1, A)
    ka = expand_dims(matmul(k, swapaxes(w_k, 0, 1)), -3)         # (…, 1, Nk, A)
    return matmul(tanh(qa + ka), w)                             # (…, Nq, Nk, A) @ (A,)


class AdditiveAttention(Module):
    """Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning to
    Align and Translate": additive (MLP) attention.

        e_ij = vᵀ tanh(W_q q_i + W_k k_j),   α = softmax_j(e),   c_i = Σ_j α_ij v_j

    Parameters ``W_q.weight`` (A, Dq), ``W_k.weight`` (A, Dk), ``v.weight`` (1, A).
    ``forward(query (B, Nq, Dq), key (B, Nk, Dk), value (B, Nk, Dv), mask=None)`` with
    ``mask`` broadcastable to (B, Nq, Nk), True = may attend; returns
    ``(context (B, Nq, Dv), weights (B, Nq, Nk))``. Time and memory O(Nq·Nk·A).
    """

    def __init__(self, query_dim: int, key_dim: int = None, hidden_dim: int = None):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        for name, val in (("query_dim", query_dim), ("key_dim", key_dim),
                          ("hidden_dim", hidden_dim)):
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"AdditiveAttention: {name} must be a positive int, got {val!r}")
        self.W_q = Linear(query_dim, hidden_dim, bias=False)
        self.W_k = Linear(key_dim, hidden_dim, bias=False)
        self.v = Linear(hidden_dim, 1, bias=False)

    def forward(self, query, key, value, mask=None):
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(f"AdditiveAttention: key and value must have the same length, "
                             f"got key {_shape(key)} and value {_shape(value)}")
        scores = additive_scores(query, key, self.W_q.weight, self.W_k.weight,
                                 reshape(self.v.weight, (-1,)))     # (B, Nq, Nk)
        weights = _masked_softmax(scores, mask)
        return matmul(weights, value), weights


class SelfAttention(Module):
    """Single-head self-attention: the smallest complete example.

        Q = X W_Qᵀ, K = X W_Kᵀ, V = X W_Vᵀ,   Y = softmax(Q Kᵀ/√E + M) V

    x (B, N, E) → (B, N, E); ``mask`` broadcastable to (B, N, N), True = may attend.
    ``causal=True`` adds the causal mask (position i sees j ≤ i). The last attention map is
    kept in ``last_attn_weights`` (B, N, N) (a raw array) for visualisation. O(N²·E).
    """

    def __init__(self, embed_dim: int, causal: bool = False, bias: bool = True):
        super().__init__()
        if not isinstance(embed_dim, int) or embed_dim <= 0:
            raise ValueError(f"SelfAttention: embed_dim must be a positive int, got {embed_dim!r}")
        self.embed_dim, self.causal = embed_dim, bool(causal)
        self.query = Linear(embed_dim, embed_dim, bias=bias)
        self.key = Linear(embed_dim, embed_dim, bias=bias)
        self.value = Linear(embed_dim, embed_dim, bias=bias)
        self.last_attn_weights = None

    def forward(self, x, mask=None):
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__}: x must be (B, N, {self.embed_dim}), got "
                             f"shape {_shape(x)}")
        q, k, v = self.query(x), self.key(x), self.value(x)          # (B, N, E) each
        y, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                            return_weights=True)     # (B, N, E), (B, N, N)
        self.last_attn_weights = w.data
        return y


class CausalSelfAttention(SelfAttention):
    """``SelfAttention`` with the causal mask: position i attends to positions j ≤ i only."""

    def __init__(self, embed_dim: int, bias: bool = True):
        super().__init__(embed_dim, causal=True, bias=bias)


def _is_bool(mask):
    data = mask.data if isinstance(mask, Tensor) else mask
    return data.dtype == bool


# ---- registered variants -----------------------------------------------------------------

def default_kv_heads(num_heads: int) -> int:
    """The largest divisor of H that is at most H/2 (1 when H is 1 or prime)."""
    for g in range(num_heads // 2, 0, -1):
        if num_heads % g == 0:
            return g
    return 1


@register("mha")
class ExactSelfAttention(AttentionBase):
    """Multi-head self-attention, exact: scaled dot-product softmax attention on every head.

    Formula: O = softmax(Q Kᵀ/√D + M) V per head, y = merge_heads(O) W_oᵀ, with
    Q, K, V = x W_qᵀ, x W_kᵀ, x W_vᵀ split into heads; M is 0, −inf above the diagonal when
    causal (bottom-right aligned), plus any ``attn_mask``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D), D = E/H. Projections ``q_proj``/``out_proj`` E → E,
    ``k_proj``/``v_proj`` E → Hkv·D; probabilities P (B, H, N, Nk).

    Options: ``causal`` (False), ``num_kv_heads`` Hkv (None → H), ``bias`` (True),
    ``dropout`` (0.0; on the probabilities, training mode only).

    Complexity: time O(B·H·N²·D), memory O(B·H·N²): the fused SDPA keeps P for backward
    (causal with N > 64 runs by query blocks that skip the future keys, about half of both).

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser & Polosukhin (2017),
    "Attention Is All You Need".

    Beyond the registry contract it accepts ``forward(x, attn_mask=None, kv_cache=None)``:
    ``attn_mask`` bool (True = may attend) or float (added), broadcastable to (B, H, N, Nk);
    ``kv_cache`` (a ``KVCache``) receives this step's keys/values and the queries attend to
    everything cached (bottom-right causal). Set ``record_weights = True`` to keep the last map
    in ``last_attn_weights`` (B, H, Nq, Nk). Subclasses add positions by overriding
    ``transform_qk`` (rotate q/k), ``score_bias`` (an additive bias) and ``value_term`` (a term
    added to the output).
    """

    complexity = "time O(N²·D), memory O(N²)"

    kind = "exact"
    supports_kv_cache = True
    supports_attn_mask = True
    needs_weights = False          # True when value_term uses the attention weights

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, bias=True,
                 dropout: float = 0.0):
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         bias=bias)
        self.dropout = _check_dropout(type(self).__name__, dropout)
        self.record_weights = False
        self.last_attn_weights = None
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E)."""
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__}: x must be (B, N, {self.embed_dim}), "
                             f"got shape {_shape(x)}")
        q = split_heads(self.q_proj(x), self.num_heads)              # (B, H, N, D)
        k = split_heads(self.k_proj(x), self.num_kv_heads)           # (B, Hkv, N, D)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)                             # (B, Hkv, Nk, D)
        return self.out_proj(merge_heads(self.attend(q, k, v, attn_mask=attn_mask)))

    # hooks for position schemes ------------------------------------------------------------
    def transform_qk(self, q, k):
        return q, k

    def score_bias(self, q, k):
        return None

    def value_term(self, weights, nq, nk):
        return None

    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        check_heads(q, k, v, f"{self.name}.attend")
        nq, nk = q.shape[2], k.shape[2]
        q, k = self.transform_qk(q, k)
        bias = self.score_bias(q, k)
        if attn_mask is not None and bias is not None and not _is_bool(attn_mask):
            mask = attn_mask + bias                               # two float biases add up
        else:
            mask = merge_masks(attn_mask, bias)
        need = self.record_weights or self.needs_weights
        res = scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal, scale=self.scale, enable_gqa=True, return_weights=need)
        if not need:
            return res
        out, w = res
        if self.record_weights:
            self.last_attn_weights = w.data
        extra = self.value_term(w, nq, nk)
        return out if extra is None else out + extra


@register("mqa")
class MultiQueryAttention(ExactSelfAttention):
    """Multi-query attention: all H query heads share ONE key/value head (exact softmax attention).

    Formula: O_h = softmax(Q_h Kᵀ/√D + M) V for h = 1 … H, with one shared K and V (Hkv = 1).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, 1, N, D) (any Hkv dividing H is accepted) → (B, H, N, D). ``k_proj``/``v_proj``
    map E → D, so the KV cache shrinks H-fold.

    Options: ``num_kv_heads`` (must be 1; anything else raises ValueError — use "gqa"),
    ``causal`` (False), ``bias`` (True), ``dropout`` (0.0); the rest as ``mha``.

    Complexity: time O(B·H·N²·D), memory O(B·H·N²) for P; keys/values O(B·N·D).

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Shazeer (2019), "Fast Transformer Decoding: One Write-Head is All You Need".
    """

    complexity = "time O(N²·D), memory O(N²)"

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=1, **options):
        if num_kv_heads != 1:
            raise ValueError(f"mqa uses num_kv_heads=1, got {num_kv_heads!r} (use 'gqa')")
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=1, **options)


@register("gqa")
class GroupedQueryAttention(ExactSelfAttention):
    """Grouped-query attention: Hkv key/value heads, each shared by a group of H/Hkv query heads.

    Formula: O_h = softmax(Q_h K_g(h)ᵀ/√D + M) V_g(h), g(h) = ⌊h / (H/Hkv)⌋ (exact softmax
    attention; Hkv = H is MHA, Hkv = 1 is MQA).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D). ``k_proj``/``v_proj`` map E → Hkv·D.

    Options: ``num_kv_heads`` Hkv (None → ``default_kv_heads(H)``: the largest divisor of H
    that is ≤ H/2, i.e. H/2 for even H, 1 for H = 1 or prime H), ``causal`` (False),
    ``bias`` (True), ``dropout`` (0.0).

    Complexity: time O(B·H·N²·D), memory O(B·H·N²) for P; keys/values O(B·Hkv·N·D).

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebrón & Sanghai (2023), "GQA:
    Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints".
    """

    complexity = "time O(N²·D), memory O(N²)"

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, **options):
        if num_kv_heads is None and isinstance(num_heads, int) and num_heads > 0:
            num_kv_heads = default_kv_heads(num_heads)
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         **options)


@register("dot")
class DotProductSelfAttention(ExactSelfAttention):
    """Luong's "dot" score per head, *unscaled* (optionally his "general" score with a learned W).

    Formula: O = softmax(Q Kᵀ + M) V ("dot"); O = softmax((Q W_h) Kᵀ + M) V ("general",
    one W_h (D, D) per head). No 1/√D: softmax attention at temperature 1 instead of √D.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); ``score_weight`` W (H, D, D) when general.

    Options: ``general`` (False; W initialised to the identity), ``causal`` (False),
    ``num_kv_heads`` (None → H), ``bias`` (True), ``dropout`` (0.0).

    Complexity: time O(B·H·N²·D) (+ O(B·H·N·D²) for general), memory O(B·H·N²).

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Luong, Pham & Manning (2015), "Effective Approaches to Attention-based Neural
    Machine Translation".
    """

    complexity = "time O(N²·D), memory O(N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, general: bool = False, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.scale = 1.0
        self.general = bool(general)
        if self.general:
            eye = active_xp().eye(self.head_dim, dtype="float32")
            self.score_weight = Parameter(active_xp().broadcast_to(
                eye, (num_heads, self.head_dim, self.head_dim)).copy())

    def transform_qk(self, q, k):
        if self.general:                                         # q W: (B, H, Nq, D) @ (H, D, D)
            q = matmul(q, self.score_weight)
        return q, k

    def reference(self, q, k, v):
        """Raw arrays: softmax(Q Kᵀ + M) V unscaled ((Q W_h) Kᵀ when general), (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = xp.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = xp.repeat(v, q.shape[1] // v.shape[1], axis=1)
        if self.general:
            q = xp.einsum("bhid,hde->bhie", q, self.score_weight.data.astype(q.dtype))
        s = xp.einsum("bhid,bhjd->bhij", q, k)                  # no 1/√D
        nq, nk = s.shape[-2:]
        return softmax_rows_array(s, causal_pattern(nq, nk, xp) if self.causal else None) @ v


@register("additive")
class AdditiveSelfAttention(ExactSelfAttention):
    """Bahdanau's additive (MLP) score inside multi-head self-attention.

    Formula: e_ij = wᵀ tanh(W_q q_i + W_k k_j) per head, O = softmax_j(e + M) V, with
    W_q, W_k (A, D) and w (A,) shared by the heads (no 1/√D).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, attn_mask=None)``:
    q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D); the pairwise tanh features
    (B, H, N, Nk, A).

    Options: ``hidden_dim`` A (None → D), ``causal`` (False), ``num_kv_heads`` (None → H),
    ``bias`` (True), ``dropout`` (0.0).

    Complexity: time O(B·H·N²·(A + D)), memory O(B·H·N²·A): the tanh of every (query, key)
    pair is formed and kept for backward.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning
    to Align and Translate".
    """

    complexity = "time O(N²·(A+D)), memory O(N²·A)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, hidden_dim: int = None, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        a = self.head_dim if hidden_dim is None else hidden_dim
        if not isinstance(a, int) or a <= 0:
            raise ValueError(f"additive: hidden_dim must be a positive int, got {hidden_dim!r}")
        self.W_q = Linear(self.head_dim, a, bias=False)
        self.W_k = Linear(self.head_dim, a, bias=False)
        self.w = Linear(a, 1, bias=False)

    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, _, nq, nk, _ = check_heads(q, k, v, f"{self.name}.attend")
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        scores = additive_scores(q, k, self.W_q.weight, self.W_k.weight,
                                 reshape(self.w.weight, (-1,)))     # (B, H, Nq, Nk)
        xp = get_array_module(q.data)
        allowed = causal_pattern(nq, nk, xp) if self.causal else None
        if attn_mask is not None:
            if _is_bool(attn_mask):
                m = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
                allowed = m if allowed is None else allowed & m
            else:
                scores = scores + attn_mask
        w = _masked_softmax(scores, allowed)
        if self.training and self.dropout > 0:
            w = dropout(w, self.dropout)
        if self.record_weights:
            self.last_attn_weights = w.data
        return matmul(w, v)                                      # (B, H, Nq, Nk) @ (B, H, Nk, D)

    def reference(self, q, k, v):
        """Raw arrays: e_ij = wᵀ tanh(W_q q_i + W_k k_j) with explicit (i, j) loops folded into
        broadcasting, softmax_j(e + M) V, (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = xp.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = xp.repeat(v, q.shape[1] // v.shape[1], axis=1)
        w_q, w_k = self.W_q.weight.data.astype(q.dtype), self.W_k.weight.data.astype(q.dtype)
        w = self.w.weight.data.astype(q.dtype)[0]                 # (A,)
        hid = xp.tanh((q @ w_q.T)[:, :, :, None, :] + (k @ w_k.T)[:, :, None, :, :])
        e = (hid * w).sum(axis=-1)                                # (B, H, Nq, Nk)
        nq, nk = e.shape[-2:]
        return softmax_rows_array(e, causal_pattern(nq, nk, xp) if self.causal else None) @ v
