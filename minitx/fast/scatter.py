"""``scatter_add`` of whole rows by sorted segments: an embedding's backward, faster on NumPy.

The reference (``minitx/backend``'s ``scatter_add``, which calls ``add_at``: ``numpy.add.at``)
adds one value at a time. An embedding's backward adds many rows of gradient into few distinct
rows of the table (tokens repeat), and for whole rows a stable sort of the index,
``numpy.add.reduceat`` over the runs of equal rows and one ``+=`` per distinct row does the
same sums with vectorised loops. Where each row gets only a few values (a mixture of experts'
tokens, gathered once for each of their k experts; the unsorting of its routed tokens, a
permutation, one value per row), ``reduceat``'s short segments are slower than ``add.at``:
there the values are added in rounds, the j-th value of every row in round j, one indexed
``+=`` per round (a permutation needs one round and no sort). The rounds add in ``add.at``'s
order, so they give its result bit for bit. The measured gains are in ``benchmarks/README.md``.
"""
from __future__ import annotations

import numpy

from .. import configuration
from ..backend import add_at

__all__ = ["scatter_add", "add_rows", "ROUNDS"]


ROUNDS = 8         # at most this many values per row: added in rounds, not by segments


def add_rows(target, index, values, rounds: int = ROUNDS) -> None:
    """``numpy.add.at(target, index, values)`` for a 1-d integer ``index`` of rows of
    ``target``. Rows that get at most ``rounds`` values each: their values added in rounds (the
    module docstring; bit for bit ``add.at``'s result). Otherwise each distinct row gets the sum
    of its values, added once; the stable sort keeps each row's values in their order. An index
    out of range raises IndexError before anything is written."""
    n, low, high = target.shape[0], index.min(), index.max()
    if low < -n or high >= n:
        raise IndexError(f"index {low if low < -n else high} is out of bounds for axis 0 with "
                         f"size {n}")
    if low < 0:                                # one name per row: -1 and n − 1 are one row
        index = numpy.where(index < 0, index + n, index)
    counts = numpy.bincount(index, minlength=n)                # values per row
    most = int(counts.max())
    if most == 1:
        target[index] += values                # every row once: one round, no sort
        return
    order = numpy.argsort(index, kind="stable")
    rows = index[order]
    starts = numpy.flatnonzero(numpy.concatenate(([True], rows[1:] != rows[:-1])))
    if most <= rounds:
        per_row = counts[rows[starts]]
        for j in range(most):                  # round j: the j-th value of each row that has one
            live = starts[per_row > j]
            target[rows[live]] += values[order[live + j]]
        return
    target[rows[starts]] += numpy.add.reduceat(values[order], starts, axis=0)


def scatter_add(target, index, values) -> None:
    """Twin of ``backend.scatter_add`` (``numpy.add.at``): for NumPy arrays and a 1-d integer
    index of whole rows, ``add_rows``, which adds the same values to the same rows: in
    ``add.at``'s order where rows get few values (bit for bit), else summed per row first (equal
    within float rounding: the sums are grouped differently). Anything else takes the
    reference."""
    if target.__class__ is numpy.ndarray and target.ndim >= 1 \
            and index.__class__ is numpy.ndarray and index.ndim == 1 \
            and index.dtype.kind in "iu" and index.size > 1 \
            and values.__class__ is numpy.ndarray \
            and values.shape == index.shape + target.shape[1:]:
        add_rows(target, index, values)
    else:
        add_at(target, index, values)


configuration.register_twin("scatter_add", scatter_add)
