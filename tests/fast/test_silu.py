"""The fast twins of SiLU and its backward (``minitx/fast/silu.py``: in place, in cache-sized
pieces, the backward from one exponential) against the reference (``minitx/ops/elementwise.py``'s
``Silu``): the same bits, for any shape, dtype and piece size, special values included; and a
mixture of experts, whose experts' activation is SiLU, with the layer on and off (outputs and
gradients in float64, over sizes, expert counts and top-k, some experts receiving no token)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitx
import minitx.functional as F
import minitx.nn as nn
from minitx import configuration
from minitx.fast import silu as fast_silu
from support import tensor, to_host
from twin_spy import spy_on

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 17.0, -17.0, 40.0, -40.0, 90.0,
           -90.0, 800.0, -800.0]


def _reference(x, g):
    """The reference's forward and backward, with the fast layer off."""
    with minitx.using_config(fast=False), np.errstate(all="ignore"):
        t = tensor(x, dtype=None, requires_grad=True)
        y = F.silu(t)
        y.backward(tensor(g, dtype=None))
        return to_host(y), to_host(t.grad)


def _values(r, shape, dtype):
    """Normal values of scale 6 (both branches of σ, and its saturation), with special values
    (infinities, NaN, ±0, where e^{−|x|} underflows) at random places."""
    x = (r.standard_normal(shape) * 6).astype(dtype)
    flat = x.reshape(-1)
    if flat.size:
        at = r.integers(0, flat.size, min(flat.size, 4))
        flat[at] = r.choice(SPECIAL, at.size)
    return x


@settings(max_examples=80, deadline=None)
@given(hnp.array_shapes(min_dims=0, max_dims=3, max_side=9),
       st.sampled_from(["float64", "float32", "float16"]), st.sampled_from([1, 3, 16, 2 ** 14]),
       st.integers(0, 2 ** 32 - 1))
def test_twins_are_the_reference_bit_for_bit(shape, dtype, chunk, seed):
    """Forward and backward, any shape (0-d and empty too), float64 / float32 (the twins) and
    float16 (the reference, which the twins hand it to), pieces of one value, of a few, and the
    library's size: the same bits as the reference (NaN where it has NaN)."""
    r = np.random.default_rng(seed)
    x, g = _values(r, shape, dtype), r.standard_normal(shape).astype(dtype)
    want_y, want_dx = _reference(x, g)
    with np.errstate(all="ignore"):
        y = fast_silu.silu(x, chunk=chunk)
        dx = fast_silu.silu_backward(x, g, chunk=chunk)
    assert y.shape == dx.shape == x.shape
    assert y.dtype == want_y.dtype == dtype
    np.testing.assert_array_equal(y, want_y)
    # float16's backward returns float32, as the reference's, which the engine rounds once
    np.testing.assert_array_equal(dx.astype(dtype), want_dx)


def test_special_values_and_both_tails():
    """σ's two branches meet at 0; x·σ(−x) underflows far out; ±inf and NaN as the
    reference has them (inf · 0 is NaN in the backward's x·σ(−x) at x = ±inf)."""
    x = np.array(SPECIAL, dtype=np.float64)
    g = np.ones_like(x)
    want_y, want_dx = _reference(x, g)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(fast_silu.silu(x), want_y)
        np.testing.assert_array_equal(fast_silu.silu_backward(x, g), want_dx)
    assert want_y[0] == 0 and want_y[2] == np.inf and want_dx[0] == 0.5


def test_a_gradient_of_another_dtype_takes_the_reference():
    x = np.random.default_rng(3).standard_normal(50).astype(np.float32)
    g = np.random.default_rng(4).standard_normal(50)                     # float64
    with minitx.using_config(fast=False):
        from minitx.ops.elementwise import sigmoid_array
        want = g * (sigmoid_array(x) * (1 + x * sigmoid_array(-x)))
    got = fast_silu.silu_backward(x, g)
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got, want)


def test_device_arrays_are_never_cut_into_pieces():
    """Only host arrays go in pieces: on the active backend, with pieces smaller than the
    array, the result is the one-piece evaluation there, bit for bit."""
    r = np.random.default_rng(9)
    x = tensor(r.normal(0, 4, 300), dtype="float32").data
    g = tensor(r.normal(0, 1, 300), dtype="float32").data
    np.testing.assert_array_equal(to_host(fast_silu.silu(x, chunk=16)),
                                  to_host(fast_silu.silu(x, chunk=1000)))
    np.testing.assert_array_equal(to_host(fast_silu.silu_backward(x, g, chunk=16)),
                                  to_host(fast_silu.silu_backward(x, g, chunk=1000)))


def test_the_switch_picks_the_twins_or_the_reference(monkeypatch):
    """SiLU calls both twins with the fast layer on and neither with it off."""
    assert configuration.twins()["silu"] is fast_silu.silu
    assert configuration.twins()["silu_backward"] is fast_silu.silu_backward
    forward = spy_on(monkeypatch, "silu")
    backward = spy_on(monkeypatch, "silu_backward")
    x = np.random.default_rng(2).normal(0, 3, (3, 50)).astype(np.float32)
    for fast in (False, True):
        with minitx.using_config(fast=fast):
            assert (configuration.why_not_fast("silu") is None) is fast
            t = tensor(x, dtype=None, requires_grad=True)
            F.silu(t).sum().backward()
    assert forward == ["silu"] and backward == ["silu_backward"]


# ---- a mixture of experts, the layer on and off ------------------------------------------------

@st.composite
def moe_case(draw):
    n = draw(st.integers(1, 8))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 7)), n, draw(st.integers(1, n)),
            draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(0, 2 ** 16)))


@settings(max_examples=30, deadline=None)
@given(moe_case())
def test_a_mixture_of_experts_is_the_same_with_the_layer_on_and_off(case):
    """float64 outputs and the gradients of the input and of every parameter, bit for bit,
    with the two twins and without them (the rest of the fast layer on both times), over
    batch, tokens, expert counts, top-k and widths (T·k < n leaves experts without a token:
    their gradients are zero on both paths)."""
    b, n_tok, n, k, e, i, seed = case
    minitx.manual_seed(seed)
    moe = nn.MoE(e, i, n, k, n_shared_experts=1, dtype="float64")
    x = np.random.default_rng(seed).standard_normal((b, n_tok, e))
    got = {}
    for fast in (True, False):
        with configuration.without_twins(*(() if fast else ("silu", "silu_backward"))):
            moe.zero_grad()
            xt = tensor(x, requires_grad=True)
            y = moe(xt)
            (y * y).sum().backward()
            got[fast] = [to_host(y), to_host(xt.grad)] + \
                [to_host(p.grad) for p in moe.parameters()]
    for a, w in zip(got[True], got[False]):
        np.testing.assert_array_equal(a, w)
    counts = to_host(moe.tokens_per_expert)
    for idle in np.flatnonzero(counts == 0):
        assert not to_host(moe.experts.gate_proj.grad)[idle].any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_silu_on_an_experts_width_crosses_many_pieces(dtype):
    """An activation of 2048 routed rows by 704 (a decoder's expert width): 88 pieces."""
    r = np.random.default_rng(7)
    x = (r.standard_normal((2048, 704)) * 4).astype(dtype)
    g = r.standard_normal((2048, 704)).astype(dtype)
    want_y, want_dx = _reference(x, g)
    np.testing.assert_array_equal(fast_silu.silu(x), want_y)
    np.testing.assert_array_equal(fast_silu.silu_backward(x, g), want_dx)
