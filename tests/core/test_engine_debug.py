"""The engine's debugging aids: saved-array versions (an in-place write between a forward and
its backward raises, naming the op) and anomaly mode (a NaN/inf gradient raises, naming the op
and the user's line where its forward ran; its forward check is tested in
test_anomaly_forward.py). Also the in-place methods that count as writes."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
import minitx.functional as F
from minitx import nn, optim
from minitx.autograd import (AnomalyError, SavedArrayModified, detect_anomaly,
                             is_anomaly_enabled, set_detect_anomaly, versions)

# the anomaly tests make inf and nan on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _t(values, grad=True):
    return minitx.tensor(np.asarray(values, dtype=np.float64), requires_grad=grad)


# ---- saved-array versions -------------------------------------------------------------

def test_a_saved_input_written_by_copy_makes_backward_raise_naming_the_op():
    x, w = _t([1.0, 2.0]), _t([3.0, 4.0])
    y = x * w                                  # Mul saves x and w
    w.copy_(np.array([30.0, 40.0]))
    with pytest.raises(SavedArrayModified, match=r"^Mul: array 1 saved for its backward"):
        y.sum().backward()


def test_a_saved_output_written_in_place_makes_backward_raise():
    x = _t([0.5, 1.0])
    y = x.exp()                                # Exp saves its output
    z = y.sum()                                # Sum saves no array
    y.fill_(0.0)
    with pytest.raises(SavedArrayModified, match=r"^Exp: .*modified in place"):
        z.backward()


@pytest.mark.skipif(os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy",
                    reason="the strict CuPy stand-in wraps each result in a new object and keeps "
                           "no view → owner link (real CuPy keeps it in .base, as NumPy does)")
def test_a_write_through_a_view_counts_for_the_memory_it_shares():
    x, w = _t([1.0, 2.0, 3.0, 4.0]), _t([1.0, 1.0, 1.0, 1.0])
    y = (x * w).sum()
    with minitx.no_grad():
        view = w.reshape(2, 2)                 # NumPy reshape: a view of w's memory
    assert np.shares_memory(view.data, w.data)
    view.fill_(5.0)
    with pytest.raises(SavedArrayModified, match="Mul"):
        y.backward()


def test_an_input_that_was_not_saved_may_be_written_and_the_gradient_is_right():
    x, w = _t([1.0, 2.0]), _t([3.0, 4.0])
    y = (x + w).exp()                          # Add saves nothing; Exp saves its output
    expected = np.exp(np.array([4.0, 6.0]))
    w.copy_(np.array([0.0, 0.0]))              # w is not saved by anything: no error
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-15)
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-15)


def test_writes_to_unrelated_tensors_do_not_raise():
    x, w, other = _t([1.0, 2.0]), _t([3.0, 4.0]), _t([0.0, 0.0], grad=False)
    y = x * w
    other.copy_(np.array([7.0, 7.0]))
    other.add_(1.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])


def test_an_optimizer_step_between_forward_and_backward_raises():
    minitx.manual_seed(0)
    layer = nn.Linear(3, 2).to(dtype="float64")
    opt = optim.SGD(layer.parameters(), lr=0.1)
    x = minitx.tensor(np.ones((4, 3)))
    layer(x).sum().backward()
    loss = layer(x).sum()                      # this forward saved the weight
    opt.step()                                 # … which the step now changes
    with pytest.raises(SavedArrayModified, match="saved for its backward"):
        loss.backward()


def test_load_state_dict_and_init_count_as_writes():
    minitx.manual_seed(0)
    layer = nn.Linear(3, 2).to(dtype="float64")
    x = minitx.tensor(np.ones((1, 3)))
    loss = layer(x).sum()
    layer.load_state_dict({k: np.zeros(v.shape) for k, v in layer.state_dict().items()})
    with pytest.raises(SavedArrayModified):
        loss.backward()
    loss = layer(x).sum()
    nn.init.constant_(layer.weight, 1.0)
    with pytest.raises(SavedArrayModified):
        loss.backward()


def test_writing_dot_data_bypasses_the_check_as_documented():
    # .data is the raw array, outside autograd's view (PyTorch's rule): the backward runs
    # and uses the new values — which is exactly why copy_/fill_ exist.
    x, w = _t([1.0, 2.0]), _t([3.0, 4.0])
    y = x * w
    w.data[...] = 10.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 10.0])


def test_the_write_table_forgets_freed_memory(monkeypatch):
    # an empty table: entries other tests left (device arrays that take no weak reference stay
    # until their id is reused) would otherwise raise the pruning threshold
    monkeypatch.setattr(versions, "_written", {})
    monkeypatch.setattr(versions, "_prune_at", [1024])
    for _ in range(5000):
        versions.mark_written(np.zeros(3))     # each array is freed right after
    assert len(versions._written) < 2100


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), writes=st.integers(0, 3))
def test_without_a_write_to_saved_memory_backward_equals_the_formula(n, writes):
    g = np.random.default_rng(n)
    a, b = g.standard_normal(n), g.standard_normal(n)
    x, w = _t(a), _t(b)
    y = (x * w).tanh()
    scratch = minitx.tensor(np.zeros(n))
    for _ in range(writes):                    # writes elsewhere move the counter only
        scratch.add_(1.0)
    y.sum().backward()
    d = 1.0 - np.tanh(a * b) ** 2
    np.testing.assert_allclose(x.grad.numpy(), d * b, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(w.grad.numpy(), d * a, rtol=1e-13, atol=1e-15)


# ---- in-place methods ---------------------------------------------------------------------

def test_in_place_arithmetic_values_and_broadcasting():
    t = minitx.tensor(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    assert t.add_(1.0) is t
    t.mul_(np.array([2.0, 10.0])).sub_(minitx.tensor([1.0, 1.0])).div_(2.0)
    np.testing.assert_array_equal(t.numpy(), [[1.5, 14.5], [3.5, 24.5]])
    assert t.dtype == np.float32
    assert t.zero_().numpy().sum() == 0.0
    assert (t.fill_(np.float32(2.5)).numpy() == 2.5).all()


def test_in_place_arithmetic_is_refused_on_a_tensor_that_requires_grad_outside_no_grad():
    w = _t([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"add_: in-place ops are not recorded.*t = t \+ x"):
        w.add_(1.0)
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])        # nothing half-done
    with minitx.no_grad():
        w.add_(1.0)
    np.testing.assert_array_equal(w.numpy(), [2.0, 3.0])


def test_in_place_bad_input_is_named():
    t = minitx.tensor(np.arange(4))
    with pytest.raises(TypeError, match=r"div_: the result cannot be written into this int64"):
        t.div_(2)
    with pytest.raises(ValueError, match=r"add_: other of shape \(3,\) does not broadcast "
                                         r"to this tensor's shape \(4,\)"):
        t.add_(np.ones(3, dtype=np.int64))
    with pytest.raises(TypeError, match="fill_: value must be a number, got str"):
        t.fill_("1")
    np.testing.assert_array_equal(t.numpy(), [0, 1, 2, 3])


# ---- anomaly mode -----------------------------------------------------------------------

def test_anomaly_mode_names_the_op_and_the_users_line():
    x = _t([0.0, 1.0])
    with detect_anomaly():
        y = x.sqrt().sum()                     # d sqrt(x)/dx = 1/(2 sqrt x): inf at 0
        with pytest.raises(AnomalyError) as info:
            y.backward()
    message = str(info.value)
    assert message.startswith("Sqrt.backward returned inf in the gradient of input 0")
    assert "test_engine_debug.py:" in message and "`y = x.sqrt().sum()  " in message
    assert not is_anomaly_enabled()


def test_anomaly_mode_says_nan_and_points_past_minitx_to_the_callers_line():
    minitx.manual_seed(0)
    layer = nn.Linear(2, 2).to(dtype="float64")
    x = _t([[np.nan, 4.0]])                    # a NaN in the data: no op made it, so the
    with detect_anomaly():                     # forward check lets it pass …
        out = layer(x)
        with pytest.raises(AnomalyError, match=r"returned nan") as info:
            out.sum().backward()               # … and the weight's gradient x^T·1 is nan
    # the op ran inside minitx/nn; the trace names the line of this file that called it
    assert "`out = layer(x)`" in str(info.value)


def test_without_anomaly_mode_the_inf_gradient_is_returned():
    x = _t([0.0, 1.0])
    x.sqrt().sum().backward()
    assert np.isinf(x.grad.numpy()[0])


def test_anomaly_state_is_restored_after_an_exception_and_settable():
    with pytest.raises(KeyError):
        with detect_anomaly():
            assert is_anomaly_enabled()
            raise KeyError("boom")
    assert not is_anomaly_enabled()
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled()
        x = _t([4.0])
        x.sqrt().sum().backward()              # finite: no error
        np.testing.assert_allclose(x.grad.numpy(), [0.25])
    finally:
        set_detect_anomaly(False)


def test_anomaly_mode_names_where_a_saved_array_was_modified():
    x, w = _t([1.0]), _t([2.0])
    with detect_anomaly():
        y = F.mul(x, w)
    w.copy_(np.array([5.0]))
    with pytest.raises(SavedArrayModified, match=r"its forward ran at .*`y = F\.mul\(x, w\)`"):
        y.sum().backward()
