r"""Softmax, log-softmax, and the softmax Jacobian as a first-class object.

For s = softmax(x) along an axis, with m = max x (the shift changes nothing mathematically
and keeps exp from overflowing), s and its Jacobian are

$$
s_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \qquad
J = \frac{\partial s}{\partial x} = \operatorname{diag}(s) - s s^\top, \qquad
J_{ij} = s_i \left( \delta_{ij} - s_j \right)
$$

so the vector-Jacobian product needed by backward never has to build J (J is symmetric):

$$
dx = J^\top g = s \odot \Big( g - \sum_j g_j s_j \Big)
$$

A slice that is entirely −inf (a fully masked attention row) gives all zeros, not NaN.
float16 is computed in float32 and rounded once, as PyTorch's CPU kernels do.
"""
from __future__ import annotations

from ..autograd.function import Function
from ..backend import get_array_module
from ..validate import dim_alias
from . import elementwise as E
from .elementwise import _widened
from ._util import normalize_axis, row_max
from .shape import swapaxes

__all__ = ["softmax", "log_softmax", "softmax_jacobian", "softmax_array",
           "softmax_backward_array"]


def softmax_array(x, axis: int = -1, inplace: bool = False):
    """softmax (the module docstring's s, shifted by m = max x) on a raw array; rows that are
    all −inf give zeros.

    ``inplace=True`` overwrites ``x`` (a fresh scores array nobody else holds) instead of
    allocating one more array of its size.
    """
    xp = get_array_module(x)
    if x.shape[axis] == 0:                    # softmax over nothing: nothing
        return x if inplace else x.copy()
    last = axis in (-1, x.ndim - 1)           # row_max reduces the last axis
    m = row_max(x) if last else x.max(axis=axis, keepdims=True)          # m = max x
    m = xp.where(xp.isfinite(m), m, 0)        # an all −inf row: shift by 0, its exps are 0
    e = xp.subtract(x, m, out=x if inplace else None)                    # x − m
    xp.exp(e, out=e)                                                     # e^(x − m)
    total = e.sum(axis=axis, keepdims=True)                              # Σⱼ e^(xⱼ − m)
    e /= xp.where(total > 0, total, 1)        # an all −inf row: 0 / 1
    return e


def softmax_backward_array(s, grad, axis: int = -1):
    """The softmax VJP of the module docstring on raw arrays, δ = Σⱼ gⱼ sⱼ along ``axis``.

    A fresh array; masked entries (s = 0) get 0.
    """
    gs = grad * s                                         # g ⊙ s
    delta = gs.sum(axis=axis, keepdims=True)              # δ = Σⱼ gⱼ sⱼ
    gs -= s * delta                                       # s ⊙ g − s δ = s ⊙ (g − δ)
    return gs


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, axis):
        xw = _widened(x)
        s = softmax_array(xw, axis, inplace=xw is not x)      # a float16 x's own float32 copy
        ctx.save_for_backward(s)
        ctx.axis = axis
        return s.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        # the module docstring's vector-Jacobian product: J itself is never formed
        return softmax_backward_array(s, grad, ctx.axis), None


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx, x, axis):
        xp = get_array_module(x)
        dtype, x = x.dtype, _widened(x)
        if x.shape[axis] == 0:                # nothing to normalise
            ctx.save_for_backward(x)
            ctx.axis = axis
            return x.astype(dtype)
        # log softmax = (x − m) − log Σ exp(x − m) with m the row max (0 for an all −inf row,
        # avoiding −inf − (−inf) = NaN).
        m = x.max(axis=axis, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0)
        shifted = x - m
        total = xp.exp(shifted).sum(axis=axis, keepdims=True)
        out = shifted - xp.log(xp.where(total > 0, total, 1))   # all −inf rows stay −inf
        ctx.save_for_backward(out)
        ctx.axis = axis
        return out.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        xp = get_array_module(out)
        g = grad.astype(out.dtype, copy=False)          # in the dtype computed in
        # y = x − lse(x): dx = g − softmax(x) Σ g
        return g - xp.exp(out) * g.sum(axis=ctx.axis, keepdims=True), None


@dim_alias
def softmax(x, axis: int = -1):
    """softmax (module docstring) along ``axis``; same shape as x.

    Fused backward: the module docstring's vector-Jacobian product. All −inf slices give
    zeros (not NaN), with zero gradient.
    """
    axis = normalize_axis(axis, len(x.shape))
    return Softmax.apply(x, axis)


@dim_alias
def log_softmax(x, axis: int = -1):
    """log softmax(x) = x − logsumexp(x) along ``axis``, computed stably.

    Backward: dx = g − softmax(x) Σ g. An all −inf slice gives −inf (not NaN).
    """
    axis = normalize_axis(axis, len(x.shape))
    return LogSoftmax.apply(x, axis)


@dim_alias
def softmax_jacobian(x, axis: int = -1):
    """The full Jacobian J of softmax along ``axis`` (module docstring), formed.

    Shapes: x (..., n) → J (..., n, n) with ``axis`` moved last; Jᵢⱼ = ∂sᵢ/∂xⱼ. Built from
    differentiable ops (so it has a gradient too). Each row sums to zero, because Σᵢ sᵢ = 1
    for every x. O(n²) memory: for teaching and tests, not for attention.
    """
    xp = get_array_module(x)
    axis = normalize_axis(axis, len(x.shape))
    if axis != len(x.shape) - 1:
        x = swapaxes(x, axis, -1)
    s = softmax(x, -1)                                    # (..., n)
    n = x.shape[-1]
    column = s.reshape(s.shape + (1,))                    # (..., n, 1)
    row = s.reshape(s.shape[:-1] + (1, n))                # (..., 1, n)
    eye = xp.eye(n, dtype=x.dtype)
    return E.sub(E.mul(column, eye), E.mul(column, row))  # diag(s) − s sᵀ
