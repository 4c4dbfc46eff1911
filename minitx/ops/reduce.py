"""Reductions: sum, mean, var, max, min, logsumexp, and the running sum cumsum.

``axis`` is None (all axes), an int or a tuple; ``keepdims`` keeps reduced axes as size 1.
Every backward first re-inserts the reduced axes (``restore_reduced``) and then broadcasts.
"""
from __future__ import annotations

import builtins

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module
from ..validate import dim_alias
from ._util import normalize_axes, normalize_axis, restore_reduced

__all__ = ["sum", "mean", "var", "max", "min", "argmax", "argmin", "logsumexp", "cumsum"]


# Σ: every element contributed once, so its gradient is the output's, broadcast back over
# the reduced axes.
class Sum(Function):
    @staticmethod
    def forward(ctx, x, axis, keepdims):
        ctx.axes = normalize_axes(axis, x.ndim)
        ctx.keepdims, ctx.shape = keepdims, x.shape
        return x.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        grad = restore_reduced(grad, ctx.axes, ctx.keepdims)
        # every element contributed once. A real (contiguous) array, not a stride-0
        # broadcast view: matmul on a stride-0 operand cannot use BLAS and is many times slower.
        return xp.broadcast_to(grad, ctx.shape).copy()


# Mean = Σ / n: each of the n elements of a slice receives 1/n of the slice's gradient.
class Mean(Function):
    @staticmethod
    def forward(ctx, x, axis, keepdims):
        ctx.axes = normalize_axes(axis, x.ndim)
        ctx.keepdims, ctx.shape = keepdims, x.shape
        return x.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        count = 1
        for a in ctx.axes:
            count *= ctx.shape[a]
        grad = restore_reduced(grad, ctx.axes, ctx.keepdims) / builtins.max(count, 1)
        return xp.broadcast_to(grad, ctx.shape).copy()                  # see Sum.backward


# var = Σ(x − x̄)²/(n − ddof); forward saves x − x̄, all its backward needs.
class Var(Function):
    @staticmethod
    def forward(ctx, x, axis, keepdims, ddof):
        ctx.axes = normalize_axes(axis, x.ndim)
        count = 1
        for a in ctx.axes:
            count *= x.shape[a]
        if count - ddof <= 0:
            raise ValueError(f"var: ddof={ddof} needs more than {ddof} elements per reduced "
                             f"slice, got {count} (the denominator n − ddof would be "
                             f"{count - ddof})")
        # Two passes (the mean, then squared deviations) rather than E[x²] − E[x]², which cancels
        # catastrophically when the mean is large next to the spread.
        centered = x - x.mean(axis=ctx.axes, keepdims=True)
        ctx.save_for_backward(centered)
        ctx.keepdims, ctx.denominator = keepdims, count - ddof
        return (centered * centered).sum(axis=ctx.axes, keepdims=keepdims) / ctx.denominator

    @staticmethod
    def backward(ctx, grad):
        (centered,) = ctx.saved_tensors
        grad = restore_reduced(grad, ctx.axes, ctx.keepdims)
        # d/dx Σ(x − x̄)²/(n − ddof) = 2(x − x̄)/(n − ddof)  (the x̄ term sums to zero)
        return (grad * (2.0 / ctx.denominator) * centered).astype(centered.dtype, copy=False), \
            None, None, None


class MaxMin(Function):
    """max / min: the gradient goes to the extreme elements, split evenly between ties; where
    a slice holds a NaN, the max/min is NaN and the gradient goes to the NaN (as PyTorch)."""

    @staticmethod
    def forward(ctx, x, axis, keepdims, use_max):
        xp = get_array_module(x)
        ctx.axes = normalize_axes(axis, x.ndim)
        if any(x.shape[a] == 0 for a in ctx.axes) or x.size == 0:
            raise ValueError(f"{'max' if use_max else 'min'} over an empty axis is undefined "
                             f"(shape {tuple(x.shape)}, axis {axis})")
        # Mark the extreme elements (a NaN counts as the extreme of its slice) and save each one's
        # share of the gradient, 1 / (number of ties).
        out = (xp.max if use_max else xp.min)(x, axis=ctx.axes, keepdims=True)
        hits = (x == out) | (xp.isnan(x) & xp.isnan(out))
        ctx.save_for_backward(hits / hits.sum(axis=ctx.axes, keepdims=True))
        ctx.keepdims = keepdims
        return out if keepdims else out.reshape([n for i, n in enumerate(x.shape)
                                                 if i not in ctx.axes])

    @staticmethod
    def backward(ctx, grad):
        (share,) = ctx.saved_tensors
        grad = restore_reduced(grad, ctx.axes, ctx.keepdims)
        return (grad * share).astype(grad.dtype, copy=False), None, None, None


# log Σ exp x, shifted by the max m so no exp overflows: lse = m + log Σ exp(x − m).
class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, axis, keepdims):
        xp = get_array_module(x)
        ctx.axes = normalize_axes(axis, x.ndim)
        if any(x.shape[a] == 0 for a in ctx.axes):      # log of an empty sum: log 0 = −inf
            out = xp.full([1 if i in ctx.axes else n for i, n in enumerate(x.shape)], -xp.inf,
                          dtype=x.dtype)
        else:
            m = xp.max(x, axis=ctx.axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, 0)          # all −inf: avoid (−inf) − (−inf)
            out = xp.log(xp.exp(x - m).sum(axis=ctx.axes, keepdims=True)) + m
        ctx.save_for_backward(x, out)
        ctx.keepdims = keepdims
        return out if keepdims else xp.squeeze(out, axis=ctx.axes)

    # d lse/dx = exp(x − lse), the softmax of x, computed from the saved output.
    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        xp = get_array_module(x)
        grad = restore_reduced(grad, ctx.axes, ctx.keepdims)
        return grad * xp.exp(x - out)                    # d lse / dx = softmax(x)


# Running sum along one axis; its backward is the running sum taken in reverse.
class Cumsum(Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = normalize_axis(axis, x.ndim)
        return get_array_module(x).cumsum(x, axis=ctx.axis).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        # y_i = Σ_{j≤i} x_j, so dL/dx_j = Σ_{i≥j} dL/dy_i: a reversed cumulative sum.
        flipped = xp.flip(grad, axis=ctx.axis)
        return xp.flip(xp.cumsum(flipped, axis=ctx.axis), axis=ctx.axis)


@dim_alias
def sum(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Σ over ``axis`` (None: all). Gradient: broadcast back to x's shape."""
    return Sum.apply(x, axis=axis, keepdims=keepdims)


@dim_alias
def mean(x, axis=None, keepdims: bool = False):
    """Mean over ``axis``. Gradient: 1/n broadcast back."""
    return Mean.apply(x, axis=axis, keepdims=keepdims)


@dim_alias(torch_differs=(
    "torch.var(x, dim=d) is unbiased (divides by n - 1) by default, this var by n "
    "(NumPy's ddof=0); pass axis=d and ddof=1 for PyTorch's value"))
def var(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """Variance Σ(x − x̄)²/(n − ddof) over ``axis`` (NumPy's default ddof=0)."""
    return Var.apply(x, axis, keepdims, ddof)


@dim_alias(torch_differs=(
    "torch.max(x, dim=d) returns (values, indices); use max(x, axis=d) for the values"
    " and argmax(x, axis=d) for the indices"))
def max(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Maximum over ``axis``; ties share the gradient equally."""
    return MaxMin.apply(x, axis, keepdims, True)


@dim_alias(torch_differs=(
    "torch.min(x, dim=d) returns (values, indices); use min(x, axis=d) for the values"
    " and argmin(x, axis=d) for the indices"))
def min(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Minimum over ``axis``; ties share the gradient equally."""
    return MaxMin.apply(x, axis, keepdims, False)


@dim_alias
def argmax(x, axis=None, keepdims: bool = False):
    """Index of the maximum over ``axis`` (None: of the flattened x); an integer Tensor, no
    gradient (an index is not differentiable). The first one wins a tie, as in NumPy."""
    data = x.data if isinstance(x, Tensor) else x
    return Tensor._wrap(data.argmax(axis=axis, keepdims=keepdims), False)


@dim_alias
def argmin(x, axis=None, keepdims: bool = False):
    """Index of the minimum over ``axis``; see ``argmax``."""
    data = x.data if isinstance(x, Tensor) else x
    return Tensor._wrap(data.argmin(axis=axis, keepdims=keepdims), False)


@dim_alias
def logsumexp(x, axis=None, keepdims: bool = False):
    """log Σ exp(x) over ``axis``, computed as m + log Σ exp(x − m) with m = max x.

    Gradient: softmax(x) along ``axis``. A slice that is all −inf, or empty, gives −inf (not
    NaN, not an error).
    """
    return LogSumExp.apply(x, axis=axis, keepdims=keepdims)


@dim_alias
def cumsum(x, axis: int = -1):
    """Running sum along ``axis``: yᵢ = Σ_{j≤i} xⱼ. Gradient: reversed running sum."""
    return Cumsum.apply(x, axis=axis)
