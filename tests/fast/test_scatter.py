"""The fast twin of ``scatter_add`` (``minitx/fast/scatter.py``: whole rows summed by sorted
segments) against its reference (``minitx.backend.add_at``: ``numpy.add.at``), and the switch
that chooses between them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import backend, configuration
from minitx.fast import scatter
from support import tensor, to_host
from twin_spy import spy_on


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 3), max_size=2),
       st.lists(st.integers(-9, 8), max_size=40), st.sampled_from(["float64", "float32"]),
       st.integers(0, 2 ** 16))
def test_twin_equals_add_at(rows, width, index, dtype, seed):
    """Rows (of any trailing shape, empty ones too) picked by a 1-d index with repeats and
    negative entries, into a non-zero target: the twin adds each row's values summed first,
    ``add.at`` one at a time, so they agree within the rounding of a sum of the values that
    meet in a row (k roundings of the sum of magnitudes, k the count of values per row, plus
    the target's own)."""
    index = np.array([i % rows - rows * (i < 0) for i in index], dtype=np.int64)
    r = np.random.default_rng(seed)
    shape = (rows, *width)
    target = r.standard_normal(shape).astype(dtype)
    values = r.standard_normal(index.shape + shape[1:]).astype(dtype)
    want = target.copy()
    backend.add_at(want, index, values)
    scatter.scatter_add(target, index, values)
    count = np.bincount(index % rows, minlength=rows).reshape((rows,) + (1,) * len(width))
    size = np.abs(values).astype(np.float64)
    magnitude = np.abs(want).astype(np.float64)
    np.add.at(magnitude, index, size)
    bound = (count + 1) * np.finfo(dtype).eps * magnitude
    assert target.dtype == want.dtype
    assert np.all(np.abs(target.astype(np.float64) - want) <= bound)


def test_each_row_is_added_once_and_exactly_when_it_is_distinct():
    """Distinct rows: one value each, so the twin's result is add.at's bit for bit."""
    r = np.random.default_rng(1)
    target, values = r.standard_normal((6, 3)), r.standard_normal((4, 3))
    index = np.array([5, 0, -3, 1])
    want = target.copy()
    backend.add_at(want, index, values)
    scatter.scatter_add(target, index, values)
    np.testing.assert_array_equal(target, want)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 300), st.integers(0, 5), st.integers(1, scatter.ROUNDS), st.booleans(),
       st.integers(0, 2 ** 16))
def test_few_values_per_row_are_add_at_bit_for_bit(rows, width, repeats, negative, seed):
    """Each row named at most ``ROUNDS`` times (a permutation of the rows, as the backward of
    an unsorting; rows repeated k times in any order, as tokens gathered for k experts; a
    subset, some written as negatives): the rounds add in add.at's order, so its result, bit
    for bit."""
    r = np.random.default_rng(seed)
    index = r.permutation(np.repeat(np.arange(rows), r.integers(0, repeats + 1, rows)))
    if index.size < 2:
        index = np.array([0, rows - 1])
    if negative:
        index = np.where(r.random(index.size) < 0.5, index - rows, index)
    target = r.standard_normal((rows, width)).astype(np.float32)
    values = r.standard_normal((index.size, width)).astype(np.float32)
    want = target.copy()
    backend.add_at(want, index, values)
    scatter.scatter_add(target, index, values)
    np.testing.assert_array_equal(target, want)


@pytest.mark.parametrize("index", [[0, 3], [0, -4], [7, -1], [-10, 2]])
def test_an_index_out_of_range_raises_and_changes_nothing(index):
    target = np.zeros((3, 2))
    with pytest.raises(IndexError, match="out of bounds"):
        scatter.scatter_add(target, np.array(index), np.ones((2, 2)))
    assert not target.any()


@pytest.mark.parametrize("case", ["one row", "2-d index", "tuple index", "bool index",
                                  "values broadcast", "element index"])
def test_other_indices_take_the_reference_bit_for_bit(case, monkeypatch):
    """Everything but a 1-d integer index of two or more whole rows is add.at's, unchanged
    (``add_rows`` must not be reached)."""
    r = np.random.default_rng(2)
    target = r.standard_normal((4, 3))
    index, values = {
        "one row": (np.array([2]), r.standard_normal((1, 3))),
        "2-d index": (np.array([[0, 1], [1, 1]]), r.standard_normal((2, 2, 3))),
        "tuple index": ((np.array([0, 0, 3]), np.array([1, 1, 2])), r.standard_normal(3)),
        "bool index": (np.array([True, False, True, False]), r.standard_normal((2, 3))),
        "values broadcast": (np.array([1, 1, 0]), r.standard_normal(3)),
        "element index": (np.array([0, 0, 2]), r.standard_normal((3, 3))[:, :1]),
    }[case]
    monkeypatch.setattr(scatter, "add_rows", lambda *a: pytest.fail("add_rows was used"))
    want = target.copy()
    np.add.at(want, index, values)
    scatter.scatter_add(target, index, values)
    np.testing.assert_array_equal(target, want)


def test_the_switch_picks_the_twin_or_the_reference(monkeypatch):
    """An embedding's backward (whole rows by a 1-d index) calls the twin with the fast layer
    on and never with it off; the gradients agree within rounding."""
    assert configuration.twins()["scatter_add"] is scatter.scatter_add
    calls = spy_on(monkeypatch, "scatter_add")
    r = np.random.default_rng(3)
    weight = r.standard_normal((7, 4))
    ids = r.integers(0, 7, (5, 6))
    g = r.standard_normal((5, 6, 4))
    grads = {}
    for fast in (False, True):
        with minitx.using_config(fast=fast):
            assert (configuration.why_not_fast("scatter_add") is None) == fast
            w = tensor(weight, requires_grad=True)
            F.embedding(tensor(ids, dtype=None), w).backward(tensor(g))
            grads[fast] = to_host(w.grad)
        assert calls == ([] if not fast else ["scatter_add"])
    want = np.zeros_like(weight)
    np.add.at(want, ids.reshape(-1), g.reshape(-1, 4))
    np.testing.assert_array_equal(grads[False], want)
    np.testing.assert_allclose(grads[True], want, rtol=1e-13, atol=1e-13)
