"""PyTorch's spellings run as written (the habits people bring from PyTorch): ``t.size()`` /
``t.size(dim)``, ``t.float()`` and friends, ``dim=`` / ``keepdim=`` wherever minitx says
``axis=`` / ``keepdims=``, and the factories ``minitx.randn(2, 3, requires_grad=True)`` …
Where PyTorch's meaning differs (``max(dim=)`` returns indices too, ``var(dim=)`` is unbiased,
``split(size, dim=)`` cuts pieces of a length) the PyTorch spelling is refused with the
minitx spelling named, never taken silently."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx.validate import OptionError

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def _x(shape, seed=0, dtype="float64"):
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return minitx.tensor(data, requires_grad=True)


# ---- t.size, t.numel, t.dim, t.float/double/half, t.unsqueeze ----------------------------

@settings(max_examples=30, deadline=None)
@given(shapes)
def test_size_is_numpys_count_and_called_pytorchs_shape(shape):
    t = _x(shape)
    assert t.size == int(np.prod(shape)) and isinstance(t.size, int)
    assert t.size + 1 == int(np.prod(shape)) + 1              # an int in arithmetic
    assert t.size() == shape
    for d in range(-len(shape), len(shape)):
        assert t.size(d) == shape[d]
    assert t.numel() == int(np.prod(shape)) and t.dim() == len(shape)


@pytest.mark.parametrize("dim", [5, -6, 1.0, True])
def test_size_of_a_dim_out_of_range_names_the_range(dim):
    with pytest.raises(IndexError, match=r"dim must be an int in \[-3, 2\] for shape"):
        _x((2, 3, 4)).size(dim)


@pytest.mark.parametrize("method, dtype", [("float", "float32"), ("double", "float64"),
                                           ("half", "float16")])
def test_float_double_half_cast_and_pass_the_gradient_back(method, dtype):
    x = _x((2, 3), dtype="float32")
    y = getattr(x, method)()
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.numpy(), x.numpy().astype(dtype))
    (y * 2.0).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0, np.float32))


def test_unsqueeze_is_expand_dims():
    x = _x((2, 3))
    assert x.unsqueeze(1).shape == (2, 1, 3) and x.unsqueeze(-1).shape == (2, 3, 1)


def test_the_spellings_live_in_their_own_module_and_tensors_keep_no_dict():
    """Every PyTorch spelling of a Tensor method is defined in ``autograd/spellings.py`` (so
    ``tensor.py`` holds only minitx's own names), and the mixin adds no per-tensor ``__dict__``."""
    from minitx.autograd import spellings
    names = ["size", "numel", "dim", "float", "double", "half", "view", "unsqueeze", "cpu",
             "cuda", "sum", "mean", "var", "max", "min", "argmax", "argmin", "softmax",
             "log_softmax", "squeeze", "expand_dims"]
    for name in names:
        member = getattr(minitx.Tensor, name)
        defined_in = (member.fget if isinstance(member, property) else member).__module__
        assert defined_in == spellings.__name__, name
        assert name not in vars(minitx.Tensor), name
    assert issubclass(minitx.Tensor, spellings.PyTorchSpellings)
    assert not hasattr(_x((2,)), "__dict__")


# ---- dim= / keepdim= as aliases of axis= / keepdims= ---------------------------------------

ALIASED = {                     # functional op → extra positional arguments
    "sum": (), "mean": (), "logsumexp": (), "softmax": (), "log_softmax": (), "cumsum": (),
    "argmax": (), "argmin": (), "argsort": (), "sort": (), "expand_dims": (),
}
KEEPDIM = ("sum", "mean", "logsumexp", "argmax", "argmin")


def _same(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u.numpy(), v.numpy())


@settings(max_examples=20, deadline=None)
@given(shapes, st.data())
def test_functional_ops_take_dim_as_axis(shape, data):
    x = _x(shape)
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    for name in ALIASED:
        op = getattr(F, name)
        _same(op(x, dim=d), op(x, axis=d))
        if name in KEEPDIM:
            _same(op(x, dim=d, keepdim=True), op(x, axis=d, keepdims=True))
            assert op(x, dim=d, keepdim=True).ndim == len(shape)


def test_topk_squeeze_concatenate_stack_take_dim():
    x = _x((3, 1, 4))
    _same(F.topk(x, 2, dim=-1), F.topk(x, 2, axis=-1))
    _same(F.squeeze(x, dim=1), F.squeeze(x, axis=1))
    _same(F.concatenate([x, x], dim=2), F.concatenate([x, x], axis=2))
    _same(F.stack([x, x], dim=1), F.stack([x, x], axis=1))


def test_the_gradient_through_dim_is_the_gradient_through_axis():
    x = _x((3, 5))
    F.log_softmax(x, dim=0).sum().backward()
    g_dim = x.grad.numpy().copy()
    x.grad = None
    F.log_softmax(x, axis=0).sum().backward()
    np.testing.assert_array_equal(g_dim, x.grad.numpy())


@pytest.mark.parametrize("method", ["sum", "mean", "softmax", "log_softmax", "argmax", "argmin"])
def test_tensor_methods_take_dim_and_keepdim(method):
    x = _x((2, 3, 4))
    _same(getattr(x, method)(dim=1), getattr(x, method)(axis=1))
    _same(getattr(x, method)(1), getattr(x, method)(axis=1))            # positional as before
    if method in KEEPDIM:
        _same(getattr(x, method)(dim=1, keepdim=True), getattr(x, method)(axis=1, keepdims=True))


def test_tensor_squeeze_and_expand_dims_take_dim():
    x = _x((2, 1, 4))
    assert x.squeeze(dim=1).shape == (2, 4) and x.expand_dims(dim=0).shape == (1, 2, 1, 4)


@pytest.mark.parametrize("call", [lambda x: F.sum(x, axis=0, dim=0),
                                  lambda x: x.mean(axis=1, dim=1),
                                  lambda x: F.softmax(x, axis=-1, dim=-1)])
def test_both_spellings_at_once_is_an_error_naming_both(call):
    with pytest.raises(OptionError, match=r"pass axis= or its PyTorch spelling dim=, not both"):
        call(_x((2, 3)))


def test_keepdims_and_keepdim_at_once_is_an_error():
    with pytest.raises(OptionError, match=r"keepdims= or its PyTorch spelling keepdim="):
        F.sum(_x((2, 3)), axis=0, keepdims=True, keepdim=True)


@pytest.mark.parametrize("call, names", [
    (lambda x: x.max(dim=1), r"max\(x, axis=d\).*argmax\(x, axis=d\)"),
    (lambda x: F.min(x, dim=1), r"min\(x, axis=d\).*argmin\(x, axis=d\)"),
    (lambda x: x.var(dim=0), r"unbiased.*ddof=1"),
    (lambda x: F.split(x, 2, dim=1), r"pieces of length size.*axis=d"),
])
def test_where_pytorch_means_something_else_dim_is_refused_naming_minitxs_spelling(call, names):
    with pytest.raises(OptionError, match=names):
        call(_x((2, 4)))


def test_max_and_var_with_axis_still_work():
    x = _x((2, 4))
    np.testing.assert_array_equal(x.max(axis=1).numpy(), x.numpy().max(axis=1))
    np.testing.assert_allclose(x.var(axis=0, ddof=1).numpy(), x.numpy().var(axis=0, ddof=1))


# ---- factories -----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [minitx.zeros, minitx.ones, minitx.rand, minitx.randn])
def test_factories_take_the_shape_both_ways_and_default_to_float32(make):
    a, b = make(2, 3), make((2, 3))
    assert a.shape == b.shape == (2, 3) and a.dtype == b.dtype == np.float32
    assert make([4]).shape == (4,) and make().shape == ()
    assert make(2, dtype="float64").dtype == np.float64
    assert not a.requires_grad and make(2, requires_grad=True).requires_grad


def test_zeros_ones_full_hold_their_value():
    np.testing.assert_array_equal(minitx.zeros(2, 2).numpy(), np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(minitx.ones(3, dtype="int64").numpy(), np.ones(3, np.int64))
    np.testing.assert_array_equal(minitx.full((2,), -1.5).numpy(), np.array([-1.5, -1.5]))


def test_random_factories_follow_manual_seed_and_their_distribution():
    minitx.manual_seed(3)
    a = minitx.randn(2000)
    minitx.manual_seed(3)
    np.testing.assert_array_equal(a.numpy(), minitx.randn(2000).numpy())
    assert abs(float(a.numpy().mean())) < 0.1 and abs(float(a.numpy().std()) - 1) < 0.1
    u = minitx.rand(2000).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.05


def test_a_factory_tensor_is_a_leaf_that_learns():
    w = minitx.randn(3, 2, requires_grad=True)
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy(), rtol=1e-6)


@pytest.mark.parametrize("args, values, dtype", [
    ((5,), [0, 1, 2, 3, 4], "int64"),
    ((2, 8, 3), [2, 5], "int64"),
    ((0, 1, 0.25), [0, 0.25, 0.5, 0.75], "float32"),
    ((3, 0, -1), [3, 2, 1], "int64"),
    ((np.int64(4),), [0, 1, 2, 3], "int64"),
])
def test_arange_follows_pytorchs_dtype_rule(args, values, dtype):
    # PyTorch's documented rule: int64 when start, end and step are all ints, else the
    # default float dtype (float32)
    t = minitx.arange(*args)
    assert t.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(t.numpy(), np.array(values, dtype=dtype))


@pytest.mark.parametrize("make", [minitx.zeros_like, minitx.ones_like, minitx.randn_like,
                                  lambda x, **kw: minitx.full_like(x, 7.0, **kw)])
def test_like_factories_keep_shape_and_dtype(make):
    x = _x((2, 5))
    y = make(x)
    assert y.shape == (2, 5) and y.dtype == np.float64
    assert make(x.numpy(), dtype="float32").dtype == np.float32


@pytest.mark.parametrize("call, match", [
    (lambda: minitx.zeros(2, -1), r"zeros: shape\[1\] must be an int >= 0, got -1"),
    (lambda: minitx.ones(2.5), r"ones: shape\[0\] must be an int"),
    (lambda: minitx.randn(2, dtype="int64"), r"randn: dtype must be a floating dtype"),
    (lambda: minitx.zeros(2, dtype="int64", requires_grad=True),
     r"zeros: only floating-point tensors can require gradients, got dtype int64"),
    (lambda: minitx.arange(0, 5, 0), r"arange: step must be non-zero"),
    (lambda: minitx.zeros_like([1, 2]), r"zeros_like: x must be a Tensor or an array"),
])
def test_factories_refuse_bad_arguments_naming_them(call, match):
    with pytest.raises(OptionError, match=match):
        call()
