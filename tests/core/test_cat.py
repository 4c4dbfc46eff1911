"""``minitx.cat`` / ``F.cat``: PyTorch's ``torch.cat(tensors, dim=0)``, the same op as
``F.concatenate``. Values against NumPy's ``concatenate`` on the host (and ``torch.cat`` where
PyTorch is installed), gradients by central differences in float64, and the mistakes a porter
makes (an empty list, one tensor instead of a list, shapes that disagree off the joined dim)
named with the argument, what was expected and what was given."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx.validate import OptionError
from support import assert_close, tensor, need


@st.composite
def joinable(draw):
    """Host arrays of 1–3 dims, equal but along one dim, and that dim (possibly negative)."""
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    dim = draw(st.integers(-ndim, ndim - 1))
    sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    arrays = []
    for n in sizes:
        s = list(shape)
        s[dim] = n
        arrays.append(rng.standard_normal(s))
    return arrays, dim


# ---- values and gradients -------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(joinable())
def test_cat_equals_numpys_concatenate_with_dim_and_negative_dims(case):
    arrays, dim = case
    ts = [tensor(a) for a in arrays]
    expected = np.concatenate(arrays, axis=dim)
    assert_close(minitx.cat(ts, dim=dim), expected)
    assert_close(F.cat(ts, dim), expected)                      # positional, as torch.cat
    assert_close(F.cat(ts, axis=dim), expected)                 # NumPy's spelling too
    assert_close(F.concatenate(tuple(ts), dim=dim), expected)   # the op cat names


@settings(max_examples=15, deadline=None)
@given(joinable())
def test_cat_gradient_reaches_every_input(case):
    arrays, dim = case
    ts = [tensor(a, requires_grad=True) for a in arrays]
    assert minitx.gradcheck(lambda *xs: minitx.cat(list(xs), dim=dim), ts)


def test_cat_gradient_is_the_upstream_gradient_cut_at_the_seams():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(4.0).reshape(2, 2)
    ta, tb = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    weights = np.arange(10.0).reshape(2, 5) + 1                 # a different weight per slot
    (minitx.cat([ta, tb], dim=-1) * tensor(weights)).sum().backward()
    assert_close(ta.grad, weights[:, :3])
    assert_close(tb.grad, weights[:, 3:])


def test_cat_matches_torch_cat():
    torch = need("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, n, 3)) for n in (1, 4, 2)]
    expected = torch.cat([torch.from_numpy(a) for a in arrays], dim=-2).numpy()
    assert_close(minitx.cat([tensor(a) for a in arrays], dim=-2), expected)


def test_cat_is_exported_where_pytorch_users_look():
    assert minitx.cat is F.cat and "cat" in minitx.__all__
    import inspect
    assert list(inspect.signature(minitx.cat).parameters)[:2] == ["tensors", "dim"]


# ---- the mistakes, named ------------------------------------------------------------------

def test_an_empty_list_is_refused_naming_tensors():
    with pytest.raises(OptionError, match="cat: tensors must be a non-empty list of tensors"):
        minitx.cat([])
    with pytest.raises(ValueError, match="concatenate: xs must be a non-empty list"):
        F.concatenate([], axis=0)                                # still a ValueError


def test_shapes_that_disagree_off_the_joined_dim_name_the_entry_and_both_shapes():
    a, b = tensor(np.ones((2, 3))), tensor(np.ones((3, 3)))
    msg = r"cat: tensors\[1\] has shape \(3, 3\) but tensors\[0\] has \(2, 3\); every dim " \
          r"but dim 1 must match"
    with pytest.raises(OptionError, match=msg):
        minitx.cat([a, b], dim=1)
    assert minitx.cat([a, b], dim=0).shape == (5, 3)             # along dim 0 they join
    with pytest.raises(OptionError, match=r"tensors\[1\] has shape \(3,\)"):
        minitx.cat([a, tensor(np.ones(3))])                      # another rank


def test_one_tensor_instead_of_a_list_is_refused_not_split_into_rows():
    x = tensor(np.ones((2, 3)))
    with pytest.raises(OptionError, match=r"cat: tensors must be a list or tuple of tensors, "
                                          r"got one Tensor of shape \(2, 3\)"):
        minitx.cat(x)


@pytest.mark.parametrize("dim", [2, -3, 1.0, True])
def test_a_dim_out_of_range_or_not_an_int_is_named_with_its_range(dim):
    ts = [tensor(np.ones((2, 3)))] * 2
    with pytest.raises(OptionError, match=r"cat: dim must be an int >= -2 and <= 1, got"):
        minitx.cat(ts, dim=dim)


def test_dim_and_axis_together_and_0_d_entries_are_refused():
    ts = [tensor(np.ones((2, 3)))] * 2
    with pytest.raises(OptionError, match="pass dim= or its NumPy spelling axis=, not both"):
        minitx.cat(ts, dim=1, axis=0)
    with pytest.raises(OptionError, match=r"tensors\[0\] is 0-d.*use stack"):
        minitx.cat([tensor(1.0), tensor(2.0)])
    with pytest.raises(OptionError, match=r"tensors\[1\] must be a Tensor or array, got list"):
        minitx.cat([ts[0], [[1.0, 2.0, 3.0]]])
