"""The engine's fast twins (``minitx/fast/core.py``: ``apply`` and ``backward``) against the
references (``Function.apply`` and ``engine.backward``).

Same graph, same numbers, same errors: random programs of ops (hypothesis) give bit-identical
outputs and gradients with the fast layer on and off, and every error the engine raises — a
gradient of the wrong shape or count, a second backward, a saved array changed in place, a NaN
under anomaly mode — is raised by the twin too, with the same message.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import Function, configuration
from minitx.fast import core
from support import tensor

UNARY = {"exp": F.exp, "tanh": F.tanh, "neg": lambda t: -t, "sq": lambda t: t * t,
         "softmax": lambda t: F.softmax(t, axis=-1), "sum0": lambda t: t.sum(axis=0)}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / (b * b + 1.0), "matmul": lambda a, b: a @ b.T}


def run(fast, program, seed, dtype):
    """Run ``program`` (a list of (op, operand indices)) on two leaves; the output and the
    leaves' gradients, on the host."""
    rng = np.random.default_rng(seed)
    leaves = [tensor(rng.standard_normal((3, 3)), dtype=dtype, requires_grad=True)
              for _ in range(2)]
    values = list(leaves)
    # row_sum's twin (BLAS's X·1) sums in another order than the reference: equal here by
    # luck of the rows' length on the host, not on a GPU (cuBLAS). This file is about the
    # engine's twins; row_sum's are in test_reductions.py.
    with minitx.using_config(fast=fast), configuration.without_twins("row_sum"):
        for name, i, j, number in program:
            a, b = values[i % len(values)], values[j % len(values)]
            if name in UNARY:
                out = UNARY[name](a)
            elif name == "number":
                out = a * number + number
            else:
                out = BINARY[name](a, b)
            if out.shape != (3, 3):
                out = out + a                           # back to (3, 3) by broadcasting
            values.append(out)
        values[-1].sum().backward()
    return [values[-1].numpy()] + [np.zeros((3, 3)) if t.grad is None else t.grad.numpy()
                                   for t in leaves]                  # a leaf left unused


program = st.lists(st.tuples(st.sampled_from(sorted(UNARY) + sorted(BINARY) + ["number"]),
                             st.integers(0, 20), st.integers(0, 20),
                             st.sampled_from([0.5, -2.0, 3, 1e-3])), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(program, st.integers(0, 2 ** 16), st.sampled_from(["float64", "float32"]))
def test_random_programs_give_the_same_bits_with_and_without_the_twins(prog, seed, dtype):
    with np.errstate(all="ignore"):
        fast, reference = run(True, prog, seed, dtype), run(False, prog, seed, dtype)
    for got, want in zip(fast, reference):
        np.testing.assert_array_equal(got, want)


def test_the_nodes_are_the_references():
    """The twin records the same node: class, parents, needs, a ``saved_tensors`` tuple, and
    freed the same way after backward."""
    nodes = {}
    for fast in (True, False):
        with minitx.using_config(fast=fast):
            x = tensor(np.ones(3), requires_grad=True)
            y = F.exp(x) * 2.0
            ctx = y._ctx
            nodes[fast] = (ctx.fn, len(ctx.parents), ctx.needs_input_grad,
                           type(ctx.saved_tensors), ctx.parents[0]._ctx.fn)
            y.sum().backward()
            assert ctx.freed and ctx.saved_tensors is None and not ctx.__dict__
    assert nodes[True] == nodes[False]


def broken(backward):
    """A Function computing 2x whose backward is ``backward``: deliberately wrong."""
    return type("Broken", (Function,), {"forward": staticmethod(lambda ctx, x: x * 2),
                                        "backward": staticmethod(backward)})


WrongShape = broken(lambda ctx, grad: grad[:1])
WrongCount = broken(lambda ctx, grad: (grad, grad))
MakesNaN = broken(lambda ctx, grad: grad * np.nan)


def _error(fast, make):
    with minitx.using_config(fast=fast):
        with pytest.raises(Exception) as info:
            make()
    return type(info.value), str(info.value).split(" at ")[0]


def _backward_twice():
    y = F.exp(tensor(np.ones(2), requires_grad=True)).sum()
    y.backward()
    y.backward()


def _saved_changed():
    x = tensor(np.ones(2), requires_grad=True)
    y = F.exp(x)
    with minitx.no_grad():
        y.mul_(2.0)
    y.sum().backward()


def _anomaly():
    with minitx.autograd.detect_anomaly():
        MakesNaN.apply(tensor(np.ones(2), requires_grad=True)).sum().backward()


@pytest.mark.parametrize("make", [
    lambda: WrongShape.apply(tensor(np.ones(3), requires_grad=True)).sum().backward(),
    lambda: WrongCount.apply(tensor(np.ones(3), requires_grad=True)).sum().backward(),
    _backward_twice, _saved_changed, _anomaly,
    lambda: F.exp(tensor(np.ones(2))).backward(),                   # nothing requires grad
    lambda: F.exp(tensor(np.ones(2), requires_grad=True)).backward(),   # not one element
], ids=["wrong-shape", "wrong-count", "twice", "saved-changed", "anomaly", "no-grad", "shape"])
def test_every_engine_error_is_the_references(make):
    fast, reference = _error(True, make), _error(False, make)
    assert fast == reference
    assert fast[0] is not AssertionError


def test_both_twins_are_registered_and_switch_off():
    assert configuration.twins()["apply"] is core.apply
    assert configuration.twins()["backward"] is core.backward
    with minitx.using_config(fast=False):
        assert configuration.twin("apply") is None and configuration.twin("backward") is None
