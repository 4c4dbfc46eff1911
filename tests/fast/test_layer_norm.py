"""The fast twin of layer_norm (``minitx/fast/norm.py``: every row reduction a matrix-vector
product) against its reference (``minitx/ops/norm.py``: NumPy's means over the normalised
axes), and the switch that chooses between them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitx
import minitx.functional as F
from minitx import configuration
from minitx.fast import norm as fast_norm
from support import tensor, to_host
from twin_spy import spy_on


def _run(fast, x, norm_shape, w, b, g, eps=1e-5):
    """layer_norm's output and the gradients of x, w, b (None where not given) in one form."""
    with minitx.using_config(fast=fast):
        xt = tensor(x, dtype=None, requires_grad=True)
        wt = None if w is None else tensor(w, dtype=None, requires_grad=True)
        bt = None if b is None else tensor(b, dtype=None, requires_grad=True)
        y = F.layer_norm(xt, norm_shape, wt, bt, eps)
        y.backward(tensor(g, dtype=None))
    return [to_host(y)] + [None if t is None else to_host(t.grad) for t in (xt, wt, bt)]


@st.composite
def cases(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=9))
    n_norm = draw(st.integers(1, min(2, len(shape))))
    return shape, shape[len(shape) - n_norm:]


@settings(max_examples=120, deadline=None)
@given(cases(), st.sampled_from(["float64", "float32"]), st.sampled_from(["both", "weight",
       "bias", "none"]), st.sampled_from(["contiguous", "strided"]), st.floats(0, 1e3),
       st.integers(0, 2 ** 32 - 1))
def test_twin_equals_the_reference(case, dtype, affine, layout, offset, seed):
    """Output and every gradient, within a few roundings of the terms each one sums: both forms
    evaluate the same formulas, adding the same numbers in other orders (a length-d sum is
    within d·eps of the sum of its terms' magnitudes). Offsets up to 1e3 make x − μ a
    cancellation, which both forms take from the same float64-accurate μ."""
    shape, norm_shape = case
    r = np.random.default_rng(seed)
    x = (r.standard_normal(shape) * 2 + offset).astype(dtype)
    if layout == "strided":                     # a transposed copy, transposed back: strided
        x = np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)
    w = r.standard_normal(norm_shape).astype(dtype) if affine in ("both", "weight") else None
    b = r.standard_normal(norm_shape).astype(dtype) if affine in ("both", "bias") else None
    g = r.standard_normal(shape).astype(dtype)
    fast, ref = _run(True, x, norm_shape, w, b, g), _run(False, x, norm_shape, w, b, g)
    d, eps = int(np.prod(norm_shape)), np.finfo(dtype).eps
    axes = tuple(range(len(shape) - len(norm_shape), len(shape)))
    batch = tuple(range(len(shape) - len(norm_shape)))
    x64 = x.astype(np.float64)
    mu = x64.mean(axes, keepdims=True)
    rstd = 1 / np.sqrt(((x64 - mu) ** 2).mean(axes, keepdims=True) + 1e-5)
    # the size of the terms each result is made of, and how many roundings it went through:
    # x̂ itself carries the rounding of x − μ (|x|·eps), scaled by rstd
    big = 1 + np.abs(x64) * rstd
    w64 = np.ones(norm_shape) if w is None else np.abs(w.astype(np.float64))
    dxhat = np.abs(g) * w64
    terms = {"y": big * w64 + (0 if b is None else np.abs(b)),
             "x": rstd * big * (dxhat + dxhat.mean(axes, keepdims=True)
                               + (dxhat * big).mean(axes, keepdims=True)),
             "w": (np.abs(g) * big).sum(batch) if batch else np.abs(g) * big,
             "b": np.abs(g).sum(batch) if batch else np.abs(g)}
    rows = max(1, int(np.prod(shape)) // d)
    for name, got, want in zip(("y", "x", "w", "b"), fast, ref):
        assert (got is None) == (want is None)
        if got is None:
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        n = rows if name in ("w", "b") else d
        bound = 8 * (n + 4) * eps * terms[name]
        assert np.all(np.abs(got.astype(np.float64) - want) <= bound), name


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("d", [7, 8, 100, 1000])
def test_a_constant_row_normalises_to_exactly_zero(fast, dtype, d):
    """1e4 + 0.1 repeated (1e4 in float16): the float32 sum of such a row is not exact at most
    widths (at d = 8 it happens to be), yet x − μ must be 0 exactly: in the reference by a mean
    accumulated in float64, in the twin by its residual-mean correction. A float64 row has no
    wider sum in the reference: there μ is within an ulp of |x| (a few 1e-12 at 1e4), times
    rstd = 1/√eps (316), and the output must be that small."""
    for value in (1e4 + 0.1, -3.3, 0.0, 65.5, 1 / 3):
        x = np.full((3, 2, d), value, dtype)
        with minitx.using_config(fast=fast):
            y = to_host(F.layer_norm(tensor(x, dtype=None), d))
        assert y.dtype == dtype
        if fast or dtype != "float64":
            np.testing.assert_array_equal(y, np.zeros_like(x))
        else:
            assert np.all(np.abs(y) <= 2 * np.spacing(abs(value)) / np.sqrt(1e-5))


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_a_non_finite_row_is_nan_in_both_and_leaves_the_others_alone(special):
    r = np.random.default_rng(4)
    x = r.standard_normal((5, 6))
    x[2, 3] = special
    w, b, g = r.standard_normal(6), r.standard_normal(6), r.standard_normal((5, 6))
    with np.errstate(invalid="ignore"):
        fast, ref = _run(True, x, 6, w, b, g), _run(False, x, 6, w, b, g)
    for got, want in zip(fast[:2], ref[:2]):                    # y and dx, row by row
        assert np.all(np.isnan(got[2])) and np.all(np.isnan(want[2]))
        keep = [0, 1, 3, 4]
        np.testing.assert_allclose(got[keep], want[keep], rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=6),
       st.integers(0, 2 ** 32 - 1))
def test_half_precision_is_computed_in_float32_by_both(shape, seed):
    """float16 in and out; in both forms the float32 computation, rounded once to float16, so
    the two agree to within an ulp of float16 (2⁻¹⁰ relative, plus float32's roundings of the
    terms)."""
    r = np.random.default_rng(seed)
    x, w, b, g = (r.standard_normal(s).astype(np.float16)
                  for s in (shape, shape[-1:], shape[-1:], shape))
    fast, ref = _run(True, x, shape[-1], w, b, g), _run(False, x, shape[-1], w, b, g)
    for got, want in zip(fast, ref):
        assert got.dtype == want.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=2 ** -10, atol=2 ** -14)


def test_the_switch_picks_the_twin_or_the_reference(monkeypatch):
    assert configuration.twins()["layer_norm"] is fast_norm.layer_norm
    calls = spy_on(monkeypatch, "layer_norm")
    x = tensor(np.random.default_rng(0).standard_normal((2, 3, 5)), requires_grad=True)
    with minitx.using_config(fast=False):
        assert configuration.why_not_fast("layer_norm") is not None
        y = F.layer_norm(x, 5)
    assert calls == [] and y._ctx.fn.__name__ == "LayerNorm"
    with minitx.using_config(fast=True):
        y = F.layer_norm(x, 5)
    assert calls == ["layer_norm"] and y._ctx.fn is fast_norm.FastLayerNorm


@pytest.mark.parametrize("affine", [True, False])
def test_gradcheck_of_the_twin_in_float64(affine):
    """The twin's own backward (the reference's is checked in tests/ops/test_ops.py), on ragged
    shapes, two normalised axes, and a large offset."""
    r = np.random.default_rng(8)
    for shape, norm in (((3, 7), (7,)), ((2, 3, 4), (3, 4)), ((1, 1, 5), (5,))):
        x = r.standard_normal(shape) + 50
        leaves = [tensor(x, requires_grad=True)]
        if affine:
            leaves += [tensor(r.standard_normal(norm), requires_grad=True) for _ in range(2)]
        with minitx.using_config(fast=True):
            assert minitx.gradcheck(lambda v, *p: F.layer_norm(v, norm, *p), tuple(leaves))
