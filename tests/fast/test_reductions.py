"""The fast twin of ``row_max`` (``minitx/fast/reductions.py``: argmax and a gather) against its
reference (``minitx/ops/_util.py``: NumPy's ``max`` along the last axis), and the switch that
chooses between them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import configuration
from minitx.fast import reductions
from minitx.ops import _util
from support import tensor, to_host
from twin_spy import spy_on

SPECIAL = ["none", "nan", "neg_inf_row", "pos_inf", "inf_and_neg_inf", "all_nan_row"]


def _rows(seed, lead, k, dtype, special):
    """Standard normals of shape lead + (k,) with one kind of special value planted."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(tuple(lead) + (k,)) * 3).astype(dtype)
    flat = x.reshape(-1, k)                           # a view: x is contiguous
    if flat.shape[0] and special != "none":
        row = r.integers(flat.shape[0])
        if special == "nan":
            flat[row, r.integers(k)] = np.nan
        elif special == "neg_inf_row":
            flat[row, :] = -np.inf
        elif special == "pos_inf":
            flat[row, r.integers(k)] = np.inf
        elif special == "inf_and_neg_inf":
            flat[row, 0], flat[row, -1] = np.inf, -np.inf
        else:
            flat[row, :] = np.nan
    return x


def _layouts(x, layout):
    """x as given (C-contiguous), every other column of a wider array, or transposed twice
    (Fortran order): the twins must take the reference for the last two."""
    if layout == "strided":
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "fortran":
        return np.asfortranarray(x)
    return x


cases = dict(lead=st.lists(st.integers(0, 5), min_size=0, max_size=3), k=st.integers(1, 40),
             special=st.sampled_from(SPECIAL),
             layout=st.sampled_from(["contiguous", "strided", "fortran"]),
             seed=st.integers(0, 2 ** 32 - 1))


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(["float64", "float32", "float16", "int32"]), **cases)
def test_row_max_is_the_reference_bit_for_bit(lead, k, dtype, special, layout, seed):
    """The entry argmax points at is the row's maximum exactly: NaN rows give NaN, −inf rows
    −inf, ±inf rows +inf, in every dtype and layout."""
    if dtype == "int32" and special != "none":
        return
    x = _layouts(_rows(seed, lead, k, dtype, special), layout)
    got = reductions.row_max(x)
    want = x.max(axis=-1, keepdims=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 4)])
def test_empty_arrays(shape):
    """The max of an empty row raises as NumPy's does; no rows give no maxima."""
    x = np.zeros(shape, np.float32)
    if shape[-1]:
        np.testing.assert_array_equal(reductions.row_max(x), x.max(-1, keepdims=True))
    else:
        with pytest.raises(ValueError):
            reductions.row_max(x)


@pytest.mark.parametrize("name", ["row_max"])
def test_the_switch_picks_the_twin_or_the_reference(name, monkeypatch):
    """With the fast layer on, ``_util.row_max`` calls the registered twin; with it
    off, they never do, ``why_not_fast`` says why, and the answer is NumPy's own."""
    assert configuration.twins()[name] is getattr(reductions, name)
    calls = spy_on(monkeypatch, name)
    x = np.random.default_rng(1).standard_normal((4, 3, 9))
    reference = getattr(np, name[4:])(x, axis=-1, keepdims=True)
    with minitx.using_config(fast=False):
        assert "minitx.config.fast is False" in configuration.why_not_fast(name)
        np.testing.assert_array_equal(getattr(_util, name)(x), reference)
    assert calls == []
    with minitx.using_config(fast=True):
        assert configuration.why_not_fast(name) is None
        bound = 9 * np.finfo(x.dtype).eps * np.abs(x).sum(-1, keepdims=True)   # k·eps·Σ|xᵢ|
        assert np.all(np.abs(getattr(_util, name)(x) - reference) <= bound)
    assert calls == [name]


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), k=st.integers(1, 40),
       dtype=st.sampled_from(["float32", "float64"]), masked=st.booleans(),
       seed=st.integers(0, 2 ** 32 - 1))
def test_softmax_with_the_twins_equals_the_reference(lead, k, dtype, masked, seed):
    """softmax and its gradient, through the public op, fast against reference: the shift is
    the same number (row_max is exact), the sum differs by rounding only, so the probabilities
    agree to a few ulp; an all −inf row gives zeros in both."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(tuple(lead) + (k,)) * 4).astype(dtype)
    if masked:
        x.reshape(-1, k)[0] = -np.inf
    g = r.standard_normal(x.shape).astype(dtype)
    out = {}
    for fast in (True, False):
        with minitx.using_config(fast=fast):
            t = tensor(x, dtype=None, requires_grad=True)
            s = F.softmax(t, -1)
            s.backward(tensor(g, dtype=None))
            out[fast] = to_host(s), to_host(t.grad)
    eps = np.finfo(dtype).eps
    for got, want in zip(out[True], out[False]):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=(k + 4) * eps, atol=(k + 4) * eps)
    if masked:
        np.testing.assert_array_equal(out[True][0].reshape(-1, k)[0], 0)
