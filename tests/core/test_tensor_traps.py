"""Tensor calls that read two ways, NumPy's and PyTorch's: ``x.transpose(0, 1)`` is the identity
permutation to NumPy and a swap to PyTorch, so minitx refuses it with both readings named instead
of returning the tensor unchanged; two axes of a tensor that is not 2-D name ``swapaxes``. And
PyTorch's ``permute``, ``t`` and ``contiguous``, which ported code calls."""
import ast

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from support import tensor, need

import minitx
from minitx.validate import OptionError


def _x(shape, seed=0, requires_grad=False):
    return tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=requires_grad)


# ---- transpose(a, b) on a 2-D tensor: refused where the readings differ ------------------

@pytest.mark.parametrize("axes", [(0, 1), (-2, -1), (0, -1), (-2, 1)])
def test_two_axes_that_numpy_reads_as_the_identity_on_2d_are_refused(axes):
    x = _x((2, 3))
    with pytest.raises(OptionError) as info:
        x.transpose(*axes)
    message = str(info.value)
    assert message.startswith(f"transpose: axes {axes} on a 2-D tensor read two ways")
    assert "NumPy's permutation" in message and "PyTorch's swap" in message
    for spelling in ("x.T", "x.swapaxes(0, 1)", "x.transpose((1, 0))"):
        assert spelling in message


@pytest.mark.parametrize("axes", [(1, 0), (-1, 0), (1, -2), (-1, -2)])
def test_two_axes_that_both_readings_call_a_swap_are_taken_on_2d(axes):
    data = np.arange(6.0).reshape(2, 3)
    out = tensor(data).transpose(*axes)
    np.testing.assert_array_equal(out.numpy(), data.T)


def test_the_spellings_the_error_names_do_swap_and_a_tuple_0_1_stays_numpys_identity():
    data = np.arange(6.0).reshape(2, 3)
    x = tensor(data)
    for swapped in (x.T, x.swapaxes(0, 1), x.transpose((1, 0)), x.t(), x.permute(1, 0)):
        np.testing.assert_array_equal(swapped.numpy(), data.T)
    np.testing.assert_array_equal(x.transpose((0, 1)).numpy(), data)     # one tuple: NumPy
    np.testing.assert_array_equal(x.transpose().numpy(), data.T)          # none: reversed


# ---- two axes of a tensor that is not 2-D: PyTorch's swap, refused naming swapaxes -------

@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5).filter(lambda n: n != 2).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(-n - 1, n), st.integers(-n - 1, n))))
def test_two_axes_of_a_tensor_with_other_than_two_axes_name_swapaxes(case):
    ndim, a, b = case
    shape = tuple(range(2, 2 + ndim))                       # distinct extents: (2, 3, 4, …)
    data = np.random.default_rng(0).standard_normal(shape)
    with pytest.raises(OptionError) as info:
        tensor(data).transpose(a, b)
    message = str(info.value)
    assert message.startswith(f"transpose: axes must be a permutation of all the axes of this "
                              f"{ndim}-D tensor")
    assert f"x.swapaxes({a}, {b})" in message
    if -ndim <= a < ndim and -ndim <= b < ndim:
        # the permutation the message offers is the swap PyTorch's transpose(a, b) means
        perm = ast.literal_eval(message.split("x.transpose(")[1].rsplit(")", 1)[0])
        np.testing.assert_array_equal(np.transpose(data, perm), np.swapaxes(data, a, b))


def test_the_3d_case_the_error_message_spells_out():
    with pytest.raises(OptionError, match=r"write x\.swapaxes\(1, 2\) or "
                                          r"x\.transpose\(\(0, 2, 1\)\)"):
        minitx.zeros(2, 3, 4).transpose(1, 2)


# ---- a full permutation stays NumPy's, as ints or as one tuple ---------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4).flatmap(lambda n: st.permutations(list(range(n)))))
def test_a_full_permutation_is_numpys_transpose_either_way(perm):
    if len(perm) == 2 and perm == [0, 1]:
        perm = [1, 0]                                       # (0, 1) on 2-D: refused above
    shape = tuple(range(2, 2 + len(perm)))
    data = np.random.default_rng(1).standard_normal(shape)
    expected = np.transpose(data, perm)
    x = tensor(data)
    np.testing.assert_array_equal(x.transpose(*perm).numpy(), expected)
    np.testing.assert_array_equal(x.transpose(tuple(perm)).numpy(), expected)
    np.testing.assert_array_equal(x.permute(*perm).numpy(), expected)
    np.testing.assert_array_equal(x.permute(perm).numpy(), expected)


def test_permute_and_t_are_differentiable():
    x = _x((2, 3, 4), requires_grad=True)
    assert minitx.gradcheck(lambda v: v.permute(2, 0, 1), (x,))
    m = _x((3, 2), requires_grad=True)
    assert minitx.gradcheck(lambda v: v.t(), (m,))


# ---- permute, t, contiguous: PyTorch's spellings, with their errors ----------------------

@pytest.mark.parametrize("dims", [(0, 0, 1), (0, 1), (0, 1, 2, 3), (0, 1, 3), (0, 1, -4),
                                  (0, 1, 2.0), (True, 0, 1)])
def test_permute_refuses_what_is_not_a_permutation(dims):
    with pytest.raises(OptionError, match=r"permute: dims must be a permutation of the 3 axes "
                                          r"0\.\.2 \(each once; negatives count back\), got"):
        minitx.zeros(2, 3, 4).permute(*dims)


def test_permute_counts_negative_dims_back():
    data = np.random.default_rng(2).standard_normal((2, 3, 4))
    np.testing.assert_array_equal(tensor(data).permute(-1, 0, -2).numpy(),
                                  np.transpose(data, (2, 0, 1)))


def test_t_transposes_2d_leaves_0d_and_1d_as_they_are_and_refuses_more_axes():
    v, s = _x((3,)), _x(())
    assert v.t() is v and s.t() is s                      # PyTorch's t(): ≤ 2-D, 0/1-D as is
    with pytest.raises(OptionError, match=r"t: expects a tensor with at most 2 axes, got 3 "
                                          r"\(shape \(2, 3, 4\)\); swap two axes with "
                                          r"x\.swapaxes"):
        minitx.zeros(2, 3, 4).t()


def test_contiguous_returns_the_tensor_and_the_pytorch_idiom_around_it_runs():
    data = np.random.default_rng(3).standard_normal((2, 3, 4))
    x = tensor(data)
    assert x.contiguous() is x
    # PyTorch: x.transpose(1, 2).contiguous().view(2, -1) — here the swap is swapaxes
    merged = x.swapaxes(1, 2).contiguous().view(2, -1)
    np.testing.assert_array_equal(merged.numpy(), np.swapaxes(data, 1, 2).reshape(2, -1))


def test_the_pytorch_spellings_agree_with_pytorch():
    torch = need("torch")
    data = np.random.default_rng(4).standard_normal((2, 3, 4))
    x, tx = tensor(data), torch.from_numpy(data)
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), tx.permute(2, 0, 1).numpy())
    np.testing.assert_array_equal(x.swapaxes(1, 2).numpy(), tx.transpose(1, 2).numpy())
    np.testing.assert_array_equal(x[0].t().numpy(), tx[0].t().numpy())
    np.testing.assert_array_equal(x[0, 0].t().numpy(), tx[0, 0].t().numpy())
    np.testing.assert_array_equal(x.swapaxes(1, 2).contiguous().view(2, -1).numpy(),
                                  tx.transpose(1, 2).contiguous().view(2, -1).numpy())
