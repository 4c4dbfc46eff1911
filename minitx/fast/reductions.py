"""Softmax's and attention's row maximum, ``row_max``, as NumPy runs it fastest.

NumPy's ``max`` along the last axis of a C-contiguous array walks it row by row; for the short
rows of attention's scores (N = 8 … 256) the per-row overhead is most of the time. ``argmax``
(vectorised over the rows) and a gather of the entries it points at is the same reduction in
one pass. Its reference is ``minitx/ops/_util.py``'s ``row_max``
(``x.max(axis=-1, keepdims=True)``); the measured gain is in ``benchmarks/README.md``, as is
why the row sum has no twin (X·1 through BLAS lost at the larger softmax).
"""
from __future__ import annotations

import numpy

from .. import configuration

__all__ = ["row_max"]


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


configuration.register_twin("row_max", row_max)
