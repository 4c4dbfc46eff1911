"""Softmax: the explicit Jacobian J = diag(s) − s sᵀ against the fused backward, its
properties, PyTorch's Jacobian, and fully masked (all −inf) rows."""
import numpy as np
import pytest

import minitx
import minitx.functional as F
from support import tensor, need


@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 4), -1), ((2, 3, 6), 1), ((4, 3), 0)])
def test_jacobian_times_g_equals_backward(shape, axis, rng):
    x = rng.standard_normal(shape) * 2
    g = rng.standard_normal(shape)
    t = tensor(x, requires_grad=True)
    F.softmax(t, axis).backward(minitx.tensor(g))
    J = F.softmax_jacobian(minitx.tensor(x), axis).numpy()      # (..., n, n), axis moved last
    g_last = np.moveaxis(g, axis, -1)
    vjp = np.einsum("...ij,...i->...j", J, g_last)               # gᵀ J
    np.testing.assert_allclose(np.moveaxis(vjp, -1, axis), t.grad.numpy(), atol=1e-14)


def test_jacobian_rows_sum_to_zero_and_symmetric(rng):
    x = rng.standard_normal((4, 7)) * 3
    J = F.softmax_jacobian(minitx.tensor(x)).numpy()
    np.testing.assert_allclose(J.sum(axis=-1), 0, atol=1e-15)
    np.testing.assert_allclose(J, np.swapaxes(J, -1, -2), atol=0)
    s = F.softmax(minitx.tensor(x)).numpy()
    np.testing.assert_allclose(np.diagonal(J, axis1=-2, axis2=-1), s * (1 - s), atol=1e-15)


def test_jacobian_matches_torch(rng):
    torch = need("torch")
    x = rng.standard_normal(6)
    ours = F.softmax_jacobian(minitx.tensor(x)).numpy()
    theirs = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1),
                                                torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-15)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_minus_inf_rows_give_zeros_and_zero_gradient(dtype, fast, rng):
    """In both forms of the row reductions (minitx/fast/reductions.py)."""
    x = rng.standard_normal((3, 5)).astype(dtype)
    x[1] = -np.inf                                   # a fully masked attention row
    x[2, :2] = -np.inf                               # partly masked: normal softmax
    t = tensor(x, dtype=None, requires_grad=True)                 # float32 stays float32
    with minitx.using_config(fast=fast):
        s = F.softmax(t, -1)
    out = s.numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0)
    np.testing.assert_allclose(out[[0, 2]].sum(-1), 1, rtol=1e-6)
    np.testing.assert_array_equal(out[2, :2], 0)
    s.backward(minitx.tensor(rng.standard_normal((3, 5)).astype(dtype)))
    grad = t.grad.numpy()
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[1], 0)


def test_masked_fill_then_softmax_fully_masked_row():
    scores = tensor(np.zeros((2, 3)), requires_grad=True)
    mask = np.array([[True, True, True], [False, True, False]])
    p = F.softmax(F.masked_fill(scores, mask, -np.inf), -1)
    np.testing.assert_array_equal(p.numpy(), [[0, 0, 0], [0.5, 0, 0.5]])
    p.sum().backward()
    assert np.all(np.isfinite(scores.grad.numpy()))


def test_softmax_is_shift_invariant_and_stable(rng):
    x = rng.standard_normal((2, 4))
    big = F.softmax(minitx.tensor(x + 1000.0)).numpy()
    np.testing.assert_allclose(big, F.softmax(minitx.tensor(x)).numpy(), atol=1e-15)
    assert np.all(np.isfinite(F.log_softmax(minitx.tensor(x * 1e4)).numpy()))


def test_log_softmax_all_minus_inf_row_is_minus_inf_not_nan():
    x = minitx.tensor(np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, 2.0]]), requires_grad=True)
    y = F.log_softmax(x, axis=-1)
    assert np.all(np.isneginf(y.numpy()[0]))
    # the finite row is untouched: log softmax by hand
    row = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(y.numpy()[1], row - np.log(np.exp(row).sum()), rtol=1e-12)
    F.log_softmax(x, axis=-1)[1].sum().backward()
    assert np.all(np.isfinite(x.grad.numpy()))
