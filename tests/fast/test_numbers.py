"""A Python number meeting a Tensor in + − × ÷, in the fast layer (``minitx/fast/numbers.py``,
used by the fast ``apply`` of ``fast/core.py``: the number converted once into a cached
read-only 0-d array of the tensor's dtype) against the reference (``Tensor``'s operators pass
the number on as it is), and the switch that chooses between them."""
import operator
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minitx
from minitx import configuration
from minitx.fast import core, numbers
from support import tensor, to_host

OPS = ["add", "sub", "mul", "truediv"]
shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
python_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-2 ** 70, 2 ** 70),
    st.sampled_from([0.0, -0.0, 0, 1, -1, 0.5, 1e-3, 0.999, 1e300, -1e-300]))


def _run(fast, dtype, shape, op, reflected, number, seed):
    """``t ∘ number`` (or ``number ∘ t``) and d(sum of it · g)/dt, with the fast layer on or
    off: (output, its gradient) on the host, or the exception NumPy raised."""
    rng = np.random.default_rng(seed)
    x = tensor(rng.standard_normal(shape) + 0.5, dtype=dtype, requires_grad=True)
    g = tensor(rng.standard_normal(shape), dtype=dtype)
    fn = getattr(operator, op)
    with minitx.using_config(fast=fast), warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # overflow, division by zero alike
        try:
            y = fn(number, x) if reflected else fn(x, number)
            y.backward(g)
        except (OverflowError, TypeError) as exc:       # an int too large for the dtype
            return type(exc)
    return to_host(y), to_host(x.grad)


def _identical(a, b):
    """Equal values, NaNs in the same places, the same dtype and the same signs of zero."""
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.signbit(a), np.signbit(b))


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float64", "float32"]), shape=shapes,
       op=st.sampled_from(OPS), reflected=st.booleans(), number=python_numbers,
       seed=st.integers(0, 2 ** 16))
@example(dtype="float32", shape=(3,), op="mul", reflected=False, number=-0.0, seed=0)
@example(dtype="float32", shape=(2, 2), op="truediv", reflected=True, number=3, seed=1)
@example(dtype="float32", shape=(2,), op="add", reflected=False, number=2 ** 70, seed=2)
def test_outputs_and_gradients_are_identical_with_the_fast_layer_on_and_off(
        dtype, shape, op, reflected, number, seed):
    reference = _run(False, dtype, shape, op, reflected, number, seed)
    fast = _run(True, dtype, shape, op, reflected, number, seed)
    if not isinstance(reference, tuple):                # both raise the same error
        assert fast is reference
        return
    for got, want in zip(fast, reference):
        _identical(got, want)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float64", "float32"]), number=python_numbers)
def test_the_twin_gives_the_number_numpy_would_have_used(dtype, number):
    """NEP 50: NumPy casts a Python number to the array's float dtype, so the twin's 0-d
    array holds exactly that value (for ints too large for the dtype NumPy's own cast decides:
    inf, or OverflowError in both)."""
    t = minitx.tensor(np.ones(2, dtype=dtype))
    if not isinstance(t.data, np.ndarray):              # a device tensor: numbers pass as is
        assert numbers.cached_operand(t, number) is number
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = np.asarray(number, dtype=dtype)
        except OverflowError:
            with pytest.raises(OverflowError):
                numbers.cached_operand(t, number)
            return
        got = numbers.cached_operand(t, number)
        assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == np.dtype(dtype)
        _identical(got, want)
        _identical(t.data * got, t.data * number)


@pytest.mark.parametrize("other", [True, np.float64(2.0), np.ones(2), "text", None])
def test_what_is_not_a_python_float_or_int_passes_as_it_is(other):
    t = minitx.tensor(np.ones(2, dtype=np.float32))
    assert numbers.cached_operand(t, other) is other
    assert numbers.cached_operand(t, t) is t


def test_an_int_tensor_keeps_numpys_own_rule():
    """An int tensor meets a float as NumPy has it (float64 out), so the number is not cast."""
    t = minitx.tensor(np.array([1, 2, 3]))
    assert numbers.cached_operand(t, 0.5) == 0.5 and type(numbers.cached_operand(t, 0.5)) is float
    assert (t * 0.5).dtype == np.float64


def test_numbers_met_again_reuse_one_read_only_array():
    """The 0-d arrays of Python numbers are cached per (number, dtype); they are read-only,
    since every op that meets the number shares one."""
    t = minitx.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    with minitx.using_config(fast=True):
        a, b = t * 0.25, t * 0.25
        if not isinstance(t.data, np.ndarray):      # device arrays take Python numbers as they are
            assert a._ctx.parents[1] == 0.25 and type(a._ctx.parents[1]) is float
            return
        assert a._ctx.parents[1] is b._ctx.parents[1]
        assert not a._ctx.parents[1].flags.writeable
        assert (t * 0.25)._ctx.parents[1].dtype == np.float32
        assert (t.double() * 0.25)._ctx.parents[1].dtype == np.float64


def test_with_the_fast_layer_off_the_number_is_passed_on_as_it_is():
    t = minitx.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    with minitx.using_config(fast=False):
        y = t * 0.25
    assert y._ctx.parents[1] == 0.25 and type(y._ctx.parents[1]) is float


def test_zeros_are_not_cached_so_minus_zero_stays_minus_zero():
    t = minitx.tensor(np.ones(2, dtype=np.float32))
    if not isinstance(t.data, np.ndarray):
        pytest.skip("the twin passes numbers on as they are for device tensors")
    plus, minus = numbers.cached_operand(t, 0.0), numbers.cached_operand(t, -0.0)
    assert not np.signbit(plus) and np.signbit(minus)
    assert numbers.cached_operand(t, 0.0) is not plus          # a new array each time


def test_a_loop_over_ever_new_numbers_keeps_the_cache_bounded():
    t = minitx.tensor(np.ones(2, dtype=np.float64))
    if not isinstance(t.data, np.ndarray):
        pytest.skip("the twin passes numbers on as they are for device tensors")
    for i in range(1, 3 * numbers._LIMIT):
        numbers.cached_operand(t, i / 7)
    assert 0 < len(numbers._NUMBERS[np.dtype(np.float64)]) <= numbers._LIMIT


# ---- the switch --------------------------------------------------------------------------

def test_the_fast_apply_is_what_caches_the_numbers():
    assert configuration.twins()["apply"] is core.apply


def test_with_the_fast_layer_off_no_number_is_cached(monkeypatch):
    calls = []
    real = numbers.cached_operand
    monkeypatch.setattr(core, "cached_operand", lambda *a: calls.append(1) or real(*a))
    t = minitx.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    with minitx.using_config(fast=False):
        assert configuration.why_not_fast("apply") is not None
        _ = t * 2.0 + 1.0 - t / 3.0
    assert calls == []
    with minitx.using_config(fast=True):
        assert configuration.why_not_fast("apply") is None
        _ = t * 2.0 + 1.0 - t / 3.0
        _ = t * t                                   # two Tensors: no number to cache
    assert calls == [1] * 3                         # *, + and / meet a number; − two Tensors
