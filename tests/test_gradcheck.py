"""gradcheck itself: it must catch a wrong backward and say where, and refuse low precision."""
import re

import numpy as np
import pytest

import minitx
from minitx import Function
from minitx.autograd import GradcheckError
from support import tensor


class ScaledWrong(Function):
    """y = x², but backward returns 2.2·x·g instead of 2·x·g (10% off)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2.2 * x * grad


class SecondInputWrong(Function):
    """y = a·b; the gradient for b is off by a factor of 3 in one element only."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        gb = grad * a
        gb[1, 2] *= 3.0
        return grad * b, gb


def test_correct_backward_passes(rng):
    x = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    assert minitx.gradcheck(lambda v: v * v, (x,))


def test_wrong_backward_is_caught_with_a_helpful_message(rng):
    x = tensor(rng.uniform(0.5, 1.5, (3, 4)), requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        minitx.gradcheck(ScaledWrong.apply, (x,))
    msg = str(info.value)
    assert "input 0" in msg
    assert re.search(r"element \(\d+, \d+\)", msg)
    m = re.search(r"analytic (\S+) vs numerical (\S+)", msg)
    assert m, msg
    analytic, numerical = float(m.group(1)), float(m.group(2))
    assert analytic == pytest.approx(1.1 * numerical, rel=1e-6)   # the factor 2.2/2


def test_message_names_the_offending_input_and_element(rng):
    a = tensor(rng.uniform(0.5, 1.5, (3, 4)), requires_grad=True)
    b = tensor(rng.uniform(0.5, 1.5, (3, 4)), requires_grad=True)
    with pytest.raises(GradcheckError, match=r"input 1 \(shape \(3, 4\)\) at element \(1, 2\)"):
        minitx.gradcheck(SecondInputWrong.apply, (a, b))


def test_raise_exception_false_returns_false(rng):
    x = tensor(rng.uniform(0.5, 1.5, (2, 2)), requires_grad=True)
    assert minitx.gradcheck(ScaledWrong.apply, (x,), raise_exception=False) is False
    assert minitx.gradcheck(lambda v: v * v, (x,), raise_exception=False) is True


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_non_float64_input_raises_type_error(dtype):
    x = minitx.tensor(np.ones(3), dtype=dtype, requires_grad=True)
    with pytest.raises(TypeError, match="float64"):
        minitx.gradcheck(lambda v: v * 2.0, (x,))


def test_needs_an_input_requiring_grad():
    with pytest.raises(ValueError):
        minitx.gradcheck(lambda v: v * 2.0, (minitx.tensor(np.ones(3)),))


def test_non_differentiated_inputs_and_multiple_outputs_are_allowed(rng):
    x = tensor(rng.standard_normal(4), requires_grad=True)
    c = minitx.tensor(rng.standard_normal(4))                     # constant
    assert minitx.gradcheck(lambda v, w: (v * w, v.exp()), (x, c))


def test_gradcheck_leaves_inputs_unchanged(rng):
    a = rng.standard_normal((2, 3))
    x = tensor(a, requires_grad=True)
    minitx.gradcheck(lambda v: v.tanh(), (x,))
    np.testing.assert_array_equal(x.numpy(), a)
    assert x.grad is None


def test_zero_dim_input(rng):
    assert minitx.gradcheck(lambda v: v * v * 3.0, (tensor(np.array(1.3), requires_grad=True),))
