"""Sorting: ``sort`` and ``topk`` return values (differentiable) and indices (integers)."""
from __future__ import annotations

from ..autograd.tensor import Tensor
from ..backend import get_array_module
from ..validate import dim_alias
from ._util import normalize_axis
from .indexing import take_along_axis

__all__ = ["sort", "topk", "argsort"]


@dim_alias
def argsort(x, axis: int = -1, descending: bool = False):
    """Indices that sort x along ``axis`` (a stable sort); an integer tensor, no gradient."""
    data = x.data if isinstance(x, Tensor) else x
    xp = get_array_module(data)
    idx = xp.argsort(-data if descending else data, axis=axis, kind="stable") \
        if xp.__name__ == "numpy" else xp.argsort(-data if descending else data, axis=axis)
    return Tensor._wrap(idx, False)


@dim_alias
def sort(x, axis: int = -1, descending: bool = False):
    """(values, indices) sorted along ``axis``; values carry the gradient back to where each
    element came from (a permutation: dx = scatter of the gradient)."""
    axis = normalize_axis(axis, len(x.shape))
    idx = argsort(x, axis, descending)
    return take_along_axis(x, idx, axis), idx


@dim_alias
def topk(x, k: int, axis: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The k largest (or smallest) values along ``axis`` and their indices.

    Shapes: x (..., n, ...) → values, indices (..., k, ...). Values are differentiable;
    the gradient flows to the selected elements only.
    """
    axis = normalize_axis(axis, len(x.shape))
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k must be in [0, {n}] for axis {axis} of length {n}, got {k}")
    idx = argsort(x, axis, descending=largest).data
    xp = get_array_module(idx)
    idx = xp.take(idx, xp.arange(k), axis=axis)
    return take_along_axis(x, idx, axis), Tensor._wrap(idx, False)
