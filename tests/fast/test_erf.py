"""The fast twin of erf (``minitx/fast/erf.py``: two fitted polynomials in float32, host arrays
in cache-sized pieces) against its reference (``minitx/ops/elementwise.py``: the float64 series
and continued fraction, rounded), its fit rerun, and the switch that chooses between them."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitx
import minitx.functional as F
from minitx import configuration
from minitx.fast import erf as fast_erf
from minitx.ops.elementwise import erf_array, erf_float64
from support import tensor, to_host
from twin_spy import spy_on


def _reference(x):
    with minitx.using_config(fast=False):
        return erf_array(x)


def _grid():
    return np.concatenate([np.linspace(-30, 30, 120_001), np.linspace(-6, 6, 60_001),
                           np.linspace(0.99, 1.01, 20_001),        # the seam of the two fits
                           np.linspace(3.99, 4.01, 2_001),         # the large fit's clip
                           np.geomspace(1e-37, 1.0, 20_001),
                           [0.0, 1e-30, -1e-20, 5e-9, 1e3, -1e5]]).astype(np.float32)


def test_twin_accuracy_against_math_erf():
    """The fitted polynomials are within 4e-9 of erf; their float32 evaluation (about a dozen
    roundings, each ≤ half an ulp of a value below 1.13) measured 1.39e-7 at most, 2.3 ulp of
    erf(0.998). 1.5e-7 bounds that, and 2e-7 relative down to 1e-37."""
    x = _grid()
    y = fast_erf.erf(x)
    assert y.dtype == np.float32
    ref = np.array([math.erf(float(v)) for v in x])
    err = np.abs(y.astype(np.float64) - ref)
    assert err.max() <= 1.5e-7, (err.max(), x[err.argmax()])
    nonzero = ref != 0
    assert (err[nonzero] / np.abs(ref[nonzero])).max() <= 2e-7


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9),
                  elements=st.floats(-10, 10, width=32)))
def test_twin_equals_the_reference_within_the_fits_error(x):
    """Twin against reference on any float32 values and shapes (0-d too): both approximate erf
    to float32's precision, the reference within half an ulp, the twin within 1.5e-7 absolute
    and 2e-7 relative; so they differ by at most the sum."""
    got, want = fast_erf.erf(x), _reference(x)
    assert got.shape == want.shape == x.shape and got.dtype == want.dtype == np.float32
    diff = np.abs(got.astype(np.float64) - want)
    bound = np.maximum(1.5e-7, 2e-7 * np.abs(want)) + 0.5 * np.spacing(np.abs(want))
    assert np.all(diff <= bound)


def test_twin_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 4.0, -4.0, 1.0, -1.0, -1e6], np.float32)
    y = fast_erf.erf(x)
    want = _reference(x)
    np.testing.assert_array_equal(y[:7], [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0])
    np.testing.assert_array_equal(y[:7], want[:7])
    assert np.signbit(y[1]) and not np.signbit(y[0])            # odd: erf(−0) = −0
    assert np.all(np.abs(y[7:9] - want[7:9]) <= 1.5e-7) and y[9] == -1.0


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_other_dtypes_take_the_reference_bit_for_bit(dtype):
    x = np.random.default_rng(5).normal(0, 3, 1000).astype(dtype)
    x[:3] = [np.nan, np.inf, -0.0]
    got = fast_erf.erf(x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, _reference(x))
    np.testing.assert_array_equal(got, erf_float64(x).astype(dtype))


@pytest.mark.parametrize("whole,chunk,n", [
    (64, 16, 64), (64, 16, 65), (64, 16, 63), (64, 16, 200), (64, 64, 65), (64, 1, 70),
    (fast_erf.WHOLE, fast_erf.CHUNK, fast_erf.WHOLE + 1)])
def test_pieces_equal_the_whole_array_bit_for_bit(whole, chunk, n):
    """Arrays of more than ``whole`` values go in ``chunk``-value pieces: elementwise, so the
    result is the whole-array evaluation bit for bit (sizes at, around and past the switch, a
    last piece that is partial, pieces of one value, and the library's own sizes; 2-d, so the
    pieces cross rows)."""
    x = np.random.default_rng(n).normal(0, 2, n).astype(np.float32)
    x[:4] = [0.0, -0.0, np.inf, np.nan]
    for shape in ((n,), (1, n), (n, 1)):
        got = fast_erf.erf(x.reshape(shape), whole=whole, chunk=chunk)
        assert got.shape == shape
        np.testing.assert_array_equal(got.reshape(-1), fast_erf.erf_float32(x))


def test_device_arrays_are_never_cut_into_pieces():
    """Only host arrays go in pieces (the cache they are sized for is the CPU's): on the
    active backend, with pieces smaller than the array, the result is the whole array's
    evaluation there, bit for bit. (A GPU's exp may differ from the host's in the last bit, so
    the comparison stays on one device.)"""
    x = np.random.default_rng(9).normal(0, 2, 300).astype(np.float32)
    dev = tensor(x, dtype=None).data
    np.testing.assert_array_equal(to_host(fast_erf.erf(dev, whole=64, chunk=16)),
                                  to_host(fast_erf.erf_float32(dev)))


def _lawson(A, f, w, iterations=300):
    """The minimax solution of w·(A c − f) by Lawson's iteratively reweighted least squares."""
    u = np.full(len(f), 1.0 / len(f))
    for _ in range(iterations):
        s = np.sqrt(u)
        c = np.linalg.lstsq(A * (s * w)[:, None], f * w * s, rcond=None)[0]
        e = np.abs(w * (A @ c - f))
        u = u * e / (u * e).sum()
    return c


def test_coefficients_are_the_documented_fit():
    """The fit described in minitx/fast/erf.py, rerun: the same coefficients. Lawson's
    iteration is deterministic up to BLAS rounding (1e-14); 1e-6 relative is far above that and
    below float32's own rounding of the coefficients (6e-8 relative) times a few."""
    erf, erfc = np.vectorize(math.erf), np.vectorize(math.erfc)
    nodes = np.cos(np.linspace(0, np.pi, 4000))                      # Chebyshev, on [−1, 1]
    x = (nodes + 1) / 2
    x = x[x > 1e-4]                                                  # |x| < 1: x·P(x²)
    c0 = 2 / math.sqrt(math.pi)
    A = np.stack([x ** (2 * i) for i in range(1, 7)], 1)
    small = _lawson(A, erf(x) / x - c0, x * x / erf(x))              # relative error of erf
    x = nodes * 1.5 + 2.5                                            # 1 ≤ x ≤ 4
    A = np.stack([x ** -i for i in range(7)], 1)
    large = _lawson(A, erfc(x) * np.exp(x * x), np.exp(-x * x))      # absolute error of erf
    np.testing.assert_allclose(fast_erf.ERF_SMALL, np.float32([c0, *small]), rtol=1e-6)
    np.testing.assert_allclose(fast_erf.ERF_LARGE, np.float32(large), rtol=1e-6)


def test_the_switch_picks_the_twin_or_the_reference(monkeypatch):
    """erf and GELU (float32) call the twin with the fast layer on and never with it off,
    where ``why_not_fast`` says why and the result is the reference's, bit for bit."""
    assert configuration.twins()["erf"] is fast_erf.erf
    calls = spy_on(monkeypatch, "erf")
    x = np.random.default_rng(2).normal(0, 2, (3, 50)).astype(np.float32)
    want = erf_float64(x).astype(np.float32)
    with minitx.using_config(fast=False):
        assert configuration.why_not_fast("erf") is not None
        np.testing.assert_array_equal(to_host(F.erf(tensor(x, dtype=None))), want)
        F.gelu(tensor(x, dtype=None))
    assert calls == []
    with minitx.using_config(fast=True):
        assert configuration.why_not_fast("erf") is None
        got = to_host(F.erf(tensor(x, dtype=None)))
        F.gelu(tensor(x, dtype=None))
    assert calls == ["erf", "erf"]
    assert np.all(np.abs(got.astype(np.float64) - want) <= 2e-7)


@settings(max_examples=40, deadline=None)
@given(hnp.array_shapes(min_dims=0, max_dims=3, max_side=8), st.integers(0, 2 ** 32 - 1))
def test_gelu_fast_and_reference_agree_in_float32(shape, seed):
    """GELU = x·Φ(x) and its gradient Φ + xφ in both forms: Φ differs by at most half the
    twin's erf error (1.5e-7 / 2 + an ulp), times |x| in the output."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(shape) * 3).astype(np.float32)
    g = r.standard_normal(shape).astype(np.float32)
    out = {}
    for fast in (True, False):
        with minitx.using_config(fast=fast):
            t = tensor(x, dtype=None, requires_grad=True)
            y = F.gelu(t)
            y.backward(tensor(g, dtype=None))
            out[fast] = to_host(y).astype(np.float64), to_host(t.grad).astype(np.float64)
    eps = np.finfo(np.float32).eps
    (y1, d1), (y0, d0) = out[True], out[False]
    np.testing.assert_allclose(y1, y0, rtol=4 * eps, atol=0.8e-7 * np.abs(x).max() + 1e-30)
    np.testing.assert_allclose(d1, d0, rtol=4 * eps, atol=(0.8e-7 + 4 * eps) * np.abs(g).max())
