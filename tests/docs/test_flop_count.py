"""The site's operation counter counts what its docstring says, from the shapes, and refuses to
return a count that lost track of the work (``minitx/site/flops.py``).

The expected counts are written from the convention (2·n·k·m per matrix product, one per output
element of an element-wise step, one per input element of a reduction), not read from the
counter. The counter works on NumPy arrays only: the site computes on NumPy whatever the
backend, so these tests build NumPy arrays directly.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx.site.flops import Counted, CountLost, count_call

dims = st.integers(1, 9)


@pytest.fixture(autouse=True)
def on_numpy():
    """The site counts on NumPy whatever the backend (``build.numpy_backend``); so do these."""
    before = minitx.get_backend()
    minitx.set_backend("numpy")
    yield
    minitx.set_backend(before)


def _counted(*shapes, seed=0):
    g = np.random.default_rng(seed)
    return [g.standard_normal(s).view(Counted) for s in shapes]


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 4), n=dims, k=dims, m=dims)
def test_a_matrix_product_counts_two_n_k_m_per_batch_element(batch, n, k, m):
    a, b = _counted((batch, n, k), (k, m))
    assert count_call(lambda: a @ b) == 2 * batch * n * k * m
    assert count_call(lambda: np.matmul(a, b)) == 2 * batch * n * k * m


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 3), n=dims, m=dims, d=dims)
def test_einsum_counts_its_whole_loop_nest(b, h, n, m, d):
    q, k = _counted((b, h, n, d), (b, h, m, d))
    assert count_call(lambda: np.einsum("bhnd,bhmd->bhnm", q, k)) == 2 * b * h * n * m * d
    assert count_call(lambda: np.einsum("...nd,...md->...nm", q, k)) == 2 * b * h * n * m * d


@settings(max_examples=25, deadline=None)
@given(n=dims, m=dims)
def test_element_wise_steps_count_their_outputs_and_reductions_their_inputs(n, m):
    (x,) = _counted((n, m))
    assert count_call(lambda: np.exp(x)) == n * m
    assert count_call(lambda: x + 1.0) == n * m
    assert count_call(lambda: x.sum(axis=-1)) == n * m
    assert count_call(lambda: np.exp(x - x.max(-1, keepdims=True))) == 3 * n * m
    assert count_call(lambda: x.reshape(-1).T[::-1]) == 0           # views: no arithmetic


def test_an_fft_counts_five_l_log_l_per_transform():
    (x,) = _counted((3, 64))
    assert count_call(lambda: np.fft.fft(x, axis=-1)) == 3 * 5 * 64 * 6


def test_work_on_arrays_descended_from_counted_ones_is_counted_through_minitx_ops():
    a = minitx.tensor(np.ones((2, 5, 3)))
    b = minitx.tensor(np.ones((3, 4)))
    with minitx.no_grad():
        assert count_call(lambda: F.matmul(a, b), a, b) == 2 * 2 * 5 * 3 * 4
    assert type(a.data) is np.ndarray and type(b.data) is np.ndarray     # given back


def test_attention_work_grows_four_times_when_n_doubles():
    # dense attention: 2·N²·D for QKᵀ and again for PV, plus O(N²) element-wise steps, so at
    # D = 32 the count of 2N over the count of N is a little under 4, and over 3.9
    def count(n):
        q, k, v = (minitx.tensor(np.random.default_rng(i).standard_normal((1, 2, n, 32)))
                   for i in range(3))
        with minitx.no_grad(), minitx.using_config(fast=False):
            return count_call(lambda: F.scaled_dot_product_attention(q, k, v), q, k, v)
    small, large = count(256), count(512)
    assert small >= 2 * 2 * (2 * 256 * 256 * 32)          # at least the two products
    assert 3.9 < large / small <= 4.0


def test_a_count_that_lost_track_of_the_work_raises():
    (x,) = _counted((4, 4))
    with pytest.raises(CountLost, match="outside the count"):
        count_call(lambda: np.asarray(x) @ np.asarray(x))      # a plain array escapes
    with pytest.raises(RuntimeError, match="do not nest"):
        count_call(lambda: count_call(lambda: x + 1))
    with pytest.raises(CountLost, match="outside the count"):
        count_call(lambda: 2 * minitx.tensor(np.ones(3)))     # a Tensor made of plain data


def test_only_numpy_arrays_are_counted():
    class Device:                     # a stand-in for a Tensor whose data lives elsewhere
        data = [1.0, 2.0]
    with pytest.raises(TypeError, match="counts work on NumPy arrays, got list"):
        count_call(lambda: None, Device())
