"""The row reductions of softmax and attention, ``row_max`` and ``row_sum``, as NumPy runs fastest.

NumPy's ``max`` and ``sum`` along the last axis of a C-contiguous array walk it row by row;
for the short rows of attention's scores (N = 8 … 256) the per-row overhead is most of the
time. Two other spellings of the same reductions run as one vectorised pass or one BLAS call:

- ``row_max``: ``argmax`` (vectorised over the rows) and a gather of the entries it points at;
- ``row_sum``: the matrix-vector product X·1, one BLAS call.

Their references are ``minitx/ops/_util.py``'s ``row_max`` / ``row_sum``
(``x.max(axis=-1, keepdims=True)`` / ``x.sum(axis=-1, keepdims=True)``); the measured gains
are in ``benchmarks/README.md``.
"""
from __future__ import annotations

import math

import numpy

from .. import configuration
from ..backend import get_array_module

__all__ = ["row_max", "row_sum"]


def row_max(x):
    """Twin of ``ops._util.row_max`` (``x.max(axis=-1, keepdims=True)``), for a C-contiguous
    NumPy array as ``argmax`` and a gather: the entry ``argmax`` points at is the row's maximum,
    and ``argmax`` stops at a row's first NaN, so a NaN row gives NaN as ``max`` does (a row
    of −inf gives −inf). Other arrays take the reference."""
    k = x.shape[-1] if x.ndim else 0
    if x.__class__ is not numpy.ndarray or k == 0 or not x.flags.c_contiguous:
        return x.max(axis=-1, keepdims=True)
    at = x.argmax(axis=-1).reshape(-1)
    at += numpy.arange(0, at.size * k, k)                # the flat index of each row's argmax
    return x.reshape(-1)[at].reshape(x.shape[:-1] + (1,))


def row_sum(x):
    """Twin of ``ops._util.row_sum`` (``x.sum(axis=-1, keepdims=True)``), for a C-contiguous
    float32/float64 array as the matrix-vector product X·1: the same sum of each row, added in
    BLAS's order instead of NumPy's (equal within float rounding of a length-k sum). Other
    arrays take the reference."""
    if x.dtype.kind != "f" or x.dtype.itemsize < 4 or not x.flags.c_contiguous or x.ndim == 0:
        return x.sum(axis=-1, keepdims=True)
    rows, k = math.prod(x.shape[:-1]), x.shape[-1]
    xp = get_array_module(x)
    return (x.reshape(rows, k) @ xp.ones(k, dtype=x.dtype)).reshape(x.shape[:-1] + (1,))


configuration.register_twin("row_max", row_max)
configuration.register_twin("row_sum", row_sum)
