"""Tensor: dtype rules, attributes, operators and NumPy-named methods, each checked
against NumPy's own result on the same array."""
import operator

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx import Tensor
from support import to_host


# ---- construction and dtype rules ----------------------------------------------------------

def test_python_floats_become_float32():
    assert minitx.tensor(1.5).dtype == np.float32
    assert minitx.tensor([[1.0, 2.0], [3.0, 4.0]]).dtype == np.float32


def test_python_ints_and_bools_keep_their_kind():
    assert minitx.tensor([1, 2, 3]).dtype.kind == "i"
    assert minitx.tensor([True, False]).dtype == np.bool_


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64,
                                   np.uint8, np.bool_])
def test_numpy_arrays_keep_their_dtype(dtype):
    a = np.arange(6).reshape(2, 3).astype(dtype)
    t = minitx.tensor(a)
    assert t.dtype == dtype
    np.testing.assert_array_equal(to_host(t), a)


def test_bool_mask_stays_bool_and_numpy_scalar_keeps_dtype():
    mask = np.array([[True, False], [False, True]])
    assert minitx.tensor(mask).dtype == np.bool_
    assert minitx.tensor(np.float64(2.0)).dtype == np.float64


@pytest.mark.parametrize("spec", [np.float64, "float64", np.dtype("float64")])
def test_dtype_argument_overrides(spec):
    assert minitx.tensor([1.0, 2.0], dtype=spec).dtype == np.float64
    assert minitx.tensor(np.ones(3, np.float32), dtype=spec).dtype == np.float64
    assert minitx.tensor([1, 2], dtype="float16").dtype == np.float16


def test_bad_dtype_and_bad_data_raise():
    with pytest.raises(TypeError):
        minitx.tensor([1.0], dtype="not-a-dtype")
    with pytest.raises(TypeError):
        minitx.tensor(["a", "b"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_requires_grad_on_non_float_raises(dtype):
    with pytest.raises(TypeError, match="floating-point"):
        minitx.tensor(np.ones(3, dtype=dtype), requires_grad=True)
    with pytest.raises(TypeError):
        minitx.tensor(np.ones(3, dtype=dtype)).requires_grad_()


# ---- attributes and conversion --------------------------------------------------------------

def test_attributes(rng):
    a = rng.standard_normal((2, 3, 4))
    t = minitx.tensor(a, requires_grad=True)
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.dtype == np.float64
    assert t.requires_grad and t.grad is None and t.is_leaf
    assert t.device == ("cuda" if minitx.get_backend() == "cupy" else "cpu")
    assert isinstance(t.numpy(), np.ndarray)
    np.testing.assert_array_equal(t.numpy(), a)
    assert minitx.get_array_module(t.data) is minitx.backend.xp()


def test_array_protocol_and_item(rng):
    a = rng.standard_normal((3,))
    t = minitx.tensor(a)
    if t.device == "cpu":
        np.testing.assert_array_equal(np.asarray(t), a)
        np.testing.assert_array_equal(np.asarray(t, dtype=np.float32), a.astype(np.float32))
    assert minitx.tensor([[2.5]]).item() == 2.5
    assert isinstance(minitx.tensor(3).item(), int)
    with pytest.raises(ValueError):
        t.item()


def test_detach_shares_data_and_leaves_graph(rng):
    x = minitx.tensor(rng.standard_normal(3), requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d._ctx is None and d.data is y.data
    assert y._ctx is not None


def test_backward_signature_defaults_and_explicit_grad(rng):
    a = rng.standard_normal((2, 3))
    x = minitx.tensor(a, requires_grad=True)
    (x * x).sum().backward()                        # grad=None on a one-element output
    np.testing.assert_allclose(to_host(x.grad), 2 * a)
    x.grad = None
    g = rng.standard_normal((2, 3))
    (x * 3).backward(minitx.tensor(g))              # explicit grad for a non-scalar output
    np.testing.assert_allclose(to_host(x.grad), 3 * g)
    with pytest.raises(RuntimeError, match="one-element"):
        (x * 3).backward()


def test_to_cpu_returns_equal_tensor(rng):
    a = rng.standard_normal((2, 2))
    t = minitx.tensor(a)
    c = t.to("cpu")
    assert c.device == "cpu"
    np.testing.assert_array_equal(c.numpy(), a)


def test_repr_mentions_dtype_and_grad_fn():
    x = minitx.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    assert "float64" in repr(x) and "requires_grad" in repr(x)
    assert "grad_fn" in repr(x * 2)


# ---- operators --------------------------------------------------------------------------------

BINARY = [operator.add, operator.sub, operator.mul, operator.truediv]


@pytest.mark.parametrize("op", BINARY)
def test_binary_operators_match_numpy(op, rng):
    a = rng.standard_normal((3, 1, 4))
    b = rng.standard_normal((2, 4)) + 3.0
    ta, tb = minitx.tensor(a), minitx.tensor(b)
    np.testing.assert_allclose(to_host(op(ta, tb)), op(a, b))
    np.testing.assert_allclose(to_host(op(ta, 2.0)), op(a, 2.0))       # tensor <op> scalar
    np.testing.assert_allclose(to_host(op(2.0, tb)), op(2.0, b))       # scalar <op> tensor
    if ta.device == "cpu":                                           # ndarray <op> tensor
        out = op(a, tb)
        assert isinstance(out, Tensor)
        np.testing.assert_allclose(to_host(out), op(a, b))


def test_pow_neg_matmul_operators(rng):
    a = rng.uniform(0.5, 2.0, (3, 4))
    b = rng.standard_normal((4, 5))
    ta, tb = minitx.tensor(a), minitx.tensor(b)
    np.testing.assert_allclose(to_host(ta ** 3), a ** 3)
    np.testing.assert_allclose(to_host(ta ** ta), a ** a)
    np.testing.assert_allclose(to_host(2.0 ** ta), 2.0 ** a)
    np.testing.assert_allclose(to_host(-ta), -a)
    np.testing.assert_allclose(to_host(ta @ tb), a @ b)
    np.testing.assert_allclose(to_host(abs(minitx.tensor(b))), np.abs(b))


def test_scalar_ops_keep_float32():
    t = minitx.tensor([1.0, 2.0])
    for out in (t * 2.0, t + 1, 2.0 / t, t ** 2, -t, t - 0.5):
        assert out.dtype == np.float32


@pytest.mark.parametrize("op", [operator.eq, operator.ne, operator.lt, operator.le,
                                operator.gt, operator.ge])
def test_comparisons_are_bool_and_not_differentiable(op, rng):
    a = rng.integers(0, 3, (4, 5)).astype(np.float64)
    b = rng.integers(0, 3, (5,)).astype(np.float64)
    x = minitx.tensor(a, requires_grad=True)
    out = op(x, minitx.tensor(b))
    assert out.dtype == np.bool_ and not out.requires_grad and out._ctx is None
    np.testing.assert_array_equal(to_host(out), op(a, b))
    np.testing.assert_array_equal(to_host(op(x, 1.0)), op(a, 1.0))


def test_bool_ops_on_masks():
    m = minitx.tensor(np.array([True, False, True]))
    n = minitx.tensor(np.array([True, True, False]))
    np.testing.assert_array_equal(to_host(~m), [False, True, False])
    np.testing.assert_array_equal(to_host(m & n), [True, False, False])
    np.testing.assert_array_equal(to_host(m | n), [True, True, True])


INDICES = [
    (1,), (slice(None), 2), (Ellipsis, 1), (slice(0, 3, 2),), (None, 1),
    (np.array([0, 2, 0]),), (slice(None), np.array([[1, 3], [0, 0]])),
    (np.array([0, 1]), np.array([2, 3])), (-1, slice(None, None, -1)),
]


@pytest.mark.parametrize("index", INDICES, ids=range(len(INDICES)))
def test_getitem_matches_numpy(index, rng):
    a = rng.standard_normal((3, 4, 2))
    np.testing.assert_array_equal(to_host(minitx.tensor(a)[index]), a[index])


def test_getitem_with_bool_mask_and_tensor_index(rng):
    a = rng.standard_normal((3, 4))
    mask = a > 0
    np.testing.assert_array_equal(to_host(minitx.tensor(a)[minitx.tensor(mask)]), a[mask])
    idx = np.array([2, 0])
    np.testing.assert_array_equal(to_host(minitx.tensor(a)[minitx.tensor(idx)]), a[idx])


# ---- NumPy-named shape methods --------------------------------------------------------------

METHODS = [
    ("reshape", (4, 6), {}), ("reshape", ((2, -1),), {}), ("reshape", (-1,), {}),
    ("transpose", (), {}), ("transpose", (2, 0, 1), {}), ("transpose", ((1, 0, 2),), {}),
    ("swapaxes", (0, 2), {}), ("swapaxes", (-1, 1), {}),
    ("sum", (), {}), ("sum", (), {"axis": 1}), ("sum", (), {"axis": (0, 2), "keepdims": True}),
    ("mean", (), {}), ("mean", (), {"axis": -1}), ("mean", (), {"axis": 0, "keepdims": True}),
    ("max", (), {}), ("max", (), {"axis": 1}), ("max", (), {"axis": (0, 1), "keepdims": True}),
    ("min", (), {}), ("min", (), {"axis": 2}), ("min", (), {"axis": -2, "keepdims": True}),
    ("var", (), {"axis": 1}),
]


@pytest.mark.parametrize("name,args,kwargs", METHODS,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(METHODS)])
def test_shape_methods_match_numpy(name, args, kwargs, rng):
    a = rng.standard_normal((2, 3, 4))
    out = getattr(minitx.tensor(a), name)(*args, **kwargs)
    expected = getattr(a, name)(*args, **kwargs)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(to_host(out), expected, rtol=1e-12)


def test_T_astype_flatten_squeeze_expand_dims(rng):
    a = rng.standard_normal((2, 1, 3))
    t = minitx.tensor(a)
    np.testing.assert_array_equal(to_host(t.T), a.T)
    np.testing.assert_array_equal(to_host(t.astype("float32")), a.astype(np.float32))
    assert t.astype(np.float16).dtype == np.float16
    np.testing.assert_array_equal(to_host(t.flatten()), a.flatten())
    np.testing.assert_array_equal(to_host(t.squeeze()), a.squeeze())
    np.testing.assert_array_equal(to_host(t.squeeze(1)), a.squeeze(1))
    np.testing.assert_array_equal(to_host(t.expand_dims(0)), np.expand_dims(a, 0))
    assert len(t) == 2


def test_astype_is_differentiable_back_to_the_source_dtype(rng):
    x = minitx.tensor(rng.standard_normal(4), requires_grad=True)
    y = x.astype("float32")
    (y * y).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(to_host(x.grad), 2 * to_host(x).astype(np.float32), rtol=1e-6)


# ---- dtype preservation through forward and backward -----------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_forward_and_backward_preserve_float_dtype(dtype, rng):
    import minitx.functional as F
    a = rng.standard_normal((3, 4)).astype(dtype)
    w = rng.standard_normal((5, 4)).astype(dtype)
    x = minitx.tensor(a, requires_grad=True)
    wt = minitx.tensor(w, requires_grad=True)
    b = minitx.tensor(np.zeros(5, dtype), requires_grad=True)
    h = F.linear(x, wt, b)
    for f in (F.gelu, F.tanh, F.sigmoid, F.silu, F.exp, F.relu, lambda v: F.softmax(v, -1),
              lambda v: F.layer_norm(v, 5), lambda v: v / 2.0 + 1.0, lambda v: v ** 2,
              lambda v: F.gelu(v, approximate="tanh"), F.elu, F.abs, F.erf):
        h = f(h)
        assert h.dtype == dtype
    loss = h.mean()
    assert loss.dtype == dtype
    loss.backward()
    for t in (x, wt, b):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
    target = minitx.tensor(np.array([0, 2, 1]))
    ce = F.cross_entropy(minitx.tensor(a, requires_grad=True), target)
    assert ce.dtype == dtype


@given(st.sampled_from(["float16", "float32", "float64", "int64"]),
       st.sampled_from(["add", "sub", "mul", "truediv"]), st.booleans(),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                 st.integers(-2 ** 70, 2 ** 70), st.booleans()))
def test_a_python_number_meets_a_tensor_as_numpy_would_have_it(dtype, op, reflected, number):
    """``t ∘ number`` and ``number ∘ t`` give NumPy's values and dtype for the same arrays
    (NEP 50: the number takes the array's float dtype; an int array with a float gives
    float64; a bool stays a bool), whether or not the number was converted first.

    minitx passes a number on to the array module as it is. CuPy stores a Python int as an
    int64 (uint64 from 2^63 on) before it looks at the array's dtype, so an int outside
    [-2^63, 2^64) is CuPy's ``OverflowError`` on a device tensor, even where NumPy would have
    cast it to a float array's dtype."""
    import warnings
    data = np.array([1.5, -2.0, 0.0, 3.0]).astype(dtype)
    fn = getattr(operator, op)
    on_device = not isinstance(minitx.tensor(data).data, np.ndarray)
    if on_device and type(number) is int and not -2 ** 63 <= number < 2 ** 64:
        with pytest.raises(OverflowError):
            fn(number, minitx.tensor(data)) if reflected else fn(minitx.tensor(data), number)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # overflow / division by zero alike
        try:
            want = fn(number, data) if reflected else fn(data, number)
        except (OverflowError, TypeError) as exc:      # a too-large int for an int array
            with pytest.raises(type(exc)):
                fn(number, minitx.tensor(data)) if reflected else fn(minitx.tensor(data), number)
            return
        t = minitx.tensor(data)
        got = fn(number, t) if reflected else fn(t, number)
    got = to_host(got)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    signed = ~np.isnan(want)                        # −0.0 stays −0.0 (0.0 == −0.0 as keys)
    np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(want[signed]))


def test_a_product_with_a_python_number_has_the_right_gradient():
    x = minitx.tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    (0.5 * x * 3 - 2 / (x + 4.0)).sum().backward()
    np.testing.assert_allclose(to_host(x.grad), 1.5 + 2 / (np.array([1.0, -2.0, 3.0]) + 4) ** 2,
                               rtol=1e-15)


def test_minus_zero_is_not_taken_for_zero():
    t = minitx.tensor(np.array([1.5, -2.0], dtype=np.float32))
    assert not np.signbit(to_host(t * 0.0)[0])
    assert np.signbit(to_host(t * -0.0)[0])               # after 0.0 was met: still −0.0
