"""Helpers shared by the ops: undoing broadcasting, normalising axes, the row maximum."""
from __future__ import annotations

import numbers

from .. import configuration
from ..backend import get_array_module

__all__ = ["unbroadcast", "normalize_axis", "normalize_axes", "restore_reduced", "row_max"]


def unbroadcast(grad, shape, dtype=None):
    """Sum ``grad`` over the axes that broadcasting added or stretched, giving ``shape``.

    If ``x`` of shape ``shape`` was broadcast to ``grad.shape`` in the forward pass, each
    element of ``x`` was used once per copy, so its gradient is the sum over the copies::

        x: (3, 1)  ->  y: (2, 3, 4)      dL/dx = sum of dL/dy over axis 0 and axis 2

    ``dtype`` (default: keep) casts the result, for ops that promoted their inputs.
    This is the one place in minitx that undoes broadcasting.
    """
    if grad.shape != shape and grad.shape != tuple(shape):
        extra = grad.ndim - len(shape)
        if extra:
            grad = grad.sum(axis=tuple(range(extra)))
        stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
        if stretched:
            grad = grad.sum(axis=stretched, keepdims=True)
    if dtype is not None and grad.dtype is not dtype and grad.dtype != dtype:   # `is`: cheap
        grad = grad.astype(dtype)
    return grad


def row_max(x):
    """``x.max(axis=-1, keepdims=True)``: each row's largest entry (softmax's shift).

    A NaN in a row gives NaN, a row of −inf gives −inf. The fast layer may stand in for it
    (``minitx/fast/reductions.py``)."""
    fast = configuration.twin("row_max")
    if fast is not None:
        return fast(x)
    return x.max(axis=-1, keepdims=True)


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int, or a clear ValueError."""
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{name} must be in [{-ndim}, {ndim}) for a {ndim}-d input, got {axis}")
    return axis % max(ndim, 1)


def normalize_axes(axis, ndim: int):
    """``None`` → all axes; an int or tuple → a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(normalize_axis(a, ndim) for a in as_tuple(axis)))


def as_tuple(value) -> tuple:
    """An int (a NumPy integer too) → ``(value,)``; a sequence → a tuple. For the arguments
    that take one int or several: a shape, an axis, ``normalized_shape``."""
    return (int(value),) if isinstance(value, numbers.Integral) else tuple(value)


def restore_reduced(grad, axes, keepdims: bool):
    """Re-insert reduced axes (size 1) so ``grad`` broadcasts against the input again."""
    if keepdims or not axes:
        return grad
    xp = get_array_module(grad)
    return xp.expand_dims(grad, axes)
