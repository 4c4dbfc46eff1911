"""Indexing: ``x[index]`` (basic and advanced), take_along_axis, embedding, where, masked_fill.

Reading with repeated indices (``x[[0, 0, 1]]``, an embedding lookup) uses an element
several times, so the backward *scatter-adds*: each use contributes its gradient.
"""
from __future__ import annotations

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, scatter_add
from ._util import normalize_axis, unbroadcast

__all__ = ["getitem", "take_along_axis", "embedding", "where", "masked_fill"]


def _raw_index(index):
    """Replace Tensors inside an index by their arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(_raw_index(i) for i in index)
    if isinstance(index, list):
        return [_raw_index(i) for i in index]
    return index


def _is_basic(index) -> bool:
    """True when the index holds only ints, slices, None and Ellipsis (a view, no repeats)."""
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, slice)) or i is None or i is Ellipsis for i in items)


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, index):
        ctx.index, ctx.shape, ctx.dtype = index, x.shape, x.dtype
        return x[index]

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        out = xp.zeros(ctx.shape, dtype=ctx.dtype)
        if _is_basic(ctx.index):
            out[ctx.index] = grad            # a view: every element is read at most once
        else:
            scatter_add(out, ctx.index, grad)
        return out, None


class TakeAlongAxis(Function):
    @staticmethod
    def forward(ctx, x, indices, axis):
        xp = get_array_module(x)
        n = x.shape[axis]
        if indices.size:          # NumPy refuses an index out of range; CuPy would wrap it
            low, high = int(indices.min()), int(indices.max())
            if low < -n or high >= n:
                raise IndexError(f"index {low if low < -n else high} is out of bounds for "
                                 f"axis {axis} with size {n}")
        ctx.save_for_backward(indices)
        ctx.axis, ctx.shape = axis, x.shape
        return xp.take_along_axis(x, indices, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        xp = get_array_module(grad)
        out = xp.zeros(ctx.shape, dtype=grad.dtype)
        # Full fancy index: `indices` on `axis`, a broadcast arange on every other axis.
        full = []
        for d in range(grad.ndim):
            if d == ctx.axis:
                full.append(indices)
            else:
                shape = [1] * grad.ndim
                shape[d] = grad.shape[d]
                full.append(xp.arange(grad.shape[d]).reshape(shape))
        scatter_add(out, tuple(full), grad)
        return out, None, None


class Embedding(Function):
    @staticmethod
    def forward(ctx, indices, weight, padding_idx):
        ctx.save_for_backward(indices)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        # weight[indices], (...,) -> (..., E); NumPy's take reads the rows several times faster
        return get_array_module(weight).take(weight, indices, axis=0)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        xp = get_array_module(grad)
        dweight = xp.zeros(ctx.shape, dtype=grad.dtype)
        scatter_add(dweight, indices.reshape(-1), grad.reshape(-1, ctx.shape[1]))
        if ctx.padding_idx is not None:
            dweight[ctx.padding_idx] = 0              # the padding row is never trained
        return None, dweight, None


class Where(Function):
    @staticmethod
    def forward(ctx, cond, a, b):
        xp = get_array_module(cond, a, b)
        ctx.save_for_backward(cond)
        ctx.meta = tuple((getattr(v, "shape", ()), getattr(v, "dtype", None)) for v in (a, b))
        return xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, grad):
        (cond,) = ctx.saved_tensors
        (sa, da), (sb, db) = ctx.meta
        _, na, nb = ctx.needs_input_grad
        return (None,
                unbroadcast(grad * cond, sa, da) if na else None,
                unbroadcast(grad * ~cond, sb, db) if nb else None)


class MaskedFill(Function):
    @staticmethod
    def forward(ctx, x, mask, value):
        xp = get_array_module(x)
        ctx.save_for_backward(mask)
        ctx.shape = x.shape
        return xp.where(mask, xp.asarray(value, dtype=x.dtype), x)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return unbroadcast(grad * ~mask, ctx.shape), None, None   # filled slots get nothing


def _as_bool(mask, name="mask"):
    data = mask.data if isinstance(mask, Tensor) else mask
    xp = get_array_module(data)
    data = xp.asarray(data)
    if data.dtype != bool:
        raise TypeError(f"{name} must be a bool array, got dtype {data.dtype}")
    return data


def getitem(x, index):
    """``x[index]``: NumPy indexing (ints, slices, None, ..., integer/bool arrays).

    Backward: the gradient is written back into a zero array of x's shape; with advanced
    (array) indices it is scatter-added, so repeated indices accumulate.
    """
    return GetItem.apply(x, _raw_index(index))


def take_along_axis(x, indices, axis: int):
    """``numpy.take_along_axis``: y[..., i, ...] = x[..., indices[..., i, ...], ...].

    ``indices`` (integers) broadcast against x on the other axes. Backward scatter-adds.
    """
    idx = indices.data if isinstance(indices, Tensor) else indices
    axis = normalize_axis(axis, len(x.shape))
    return TakeAlongAxis.apply(x, idx, axis)


def embedding(indices, weight, padding_idx=None):
    """Look up rows of ``weight`` (V, E) for integer ``indices`` (...,) → (..., E).

    dweight[v] = Σ over positions with indices == v of the output gradient (scatter-add);
    the ``padding_idx`` row gets no gradient.
    """
    idx = indices.data if isinstance(indices, Tensor) else indices
    xp = get_array_module(idx)
    idx = xp.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding indices must be integers, got dtype {idx.dtype}")
    v = weight.shape[0]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= v):
        raise IndexError(f"embedding indices must lie in [0, {v}), got values in "
                         f"[{int(idx.min())}, {int(idx.max())}]")
    return Embedding.apply(idx, weight, padding_idx)


def where(cond, a, b):
    """Elementwise ``a if cond else b`` with broadcasting; gradients flow to the chosen side."""
    return Where.apply(_as_bool(cond, "cond"), a, b)


def masked_fill(x, mask, value: float):
    """x with ``value`` wherever ``mask`` (bool, broadcastable) is True — PyTorch's polarity.

    The filled positions receive no gradient.
    """
    return MaskedFill.apply(x, _as_bool(mask), value)
