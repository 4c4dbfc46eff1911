"""Anomaly mode's forward check: an op whose output holds a NaN that none of its inputs held
raises ``AnomalyError``, naming the op and the user's line; infinity is allowed (log(0), a
mask's −inf), and a NaN that came in passes on. The README's own example, ``model(x).log()`` on
a negative output, gives a NaN loss with finite gradients — so the backward check alone says
nothing; the forward check names the ``log``."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from support import qkv, tensor

import minitx
import minitx.functional as F
from minitx import nn
from minitx.autograd import AnomalyError, detect_anomaly, is_anomaly_enabled

# these tests make inf and nan on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

PATHS = pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])


def _negative_model():
    """A float64 Linear layer whose outputs are negative for the input below."""
    model = nn.Linear(3, 2).to(dtype="float64")
    model.weight.copy_(-np.ones((2, 3)))
    model.bias.copy_(np.zeros(2))
    return model, tensor([[1.0, 2.0, 3.0]])


# ---- the README's example ---------------------------------------------------------------

def test_without_anomaly_mode_the_readme_example_is_silent_and_its_gradients_finite():
    model, x = _negative_model()
    loss = model(x).log().mean()                    # log(−6): nan
    loss.backward()
    assert math.isnan(loss.item())
    assert np.all(np.isfinite(model.weight.grad.numpy()))     # d log(y)/dy = 1/y: finite


@PATHS
def test_the_readme_example_raises_at_the_log_naming_the_users_line(fast):
    model, x = _negative_model()
    with minitx.using_config(fast=fast), detect_anomaly():
        with pytest.raises(AnomalyError) as info:
            loss = model(x).log().mean()            # noqa: F841
    message = str(info.value)
    assert message.startswith("Log.forward made nan from inputs without nan "
                              "(inputs: float64(1, 2); output: float64(1, 2)); it ran at ")
    assert "test_anomaly_forward.py:" in message and "`loss = model(x).log().mean()" in message
    assert not is_anomaly_enabled()


def test_the_fast_and_reference_paths_raise_the_same_error():
    def message(fast):
        with minitx.using_config(fast=fast), detect_anomaly():
            with pytest.raises(AnomalyError) as info:
                F.sqrt(tensor([-1.0, 4.0], requires_grad=True))
        return str(info.value)
    assert message(True) == message(False)


# ---- the rule: NaN made here raises; infinity and a NaN that came in do not ---------------

special = st.sampled_from([-math.inf, -2.0, -1e-300, 0.0, 1e-300, 3.0, math.inf, math.nan])


@settings(max_examples=60, deadline=None)
@given(st.lists(special, min_size=1, max_size=4))
def test_log_raises_exactly_when_it_makes_a_nan(values):
    # log x is real for x ≥ 0 (log 0 = −inf, log inf = inf) and nan for x < 0
    makes_nan = any(v < 0 for v in values) and not any(math.isnan(v) for v in values)
    with detect_anomaly():
        if makes_nan:
            with pytest.raises(AnomalyError, match=r"^Log\.forward made nan"):
                F.log(tensor(values, requires_grad=True))
        else:
            F.log(tensor(values, requires_grad=True))


@pytest.mark.parametrize("make,op", [
    (lambda x: x - x, "Sub"),                       # inf − inf
    (lambda x: x * 0.0, "Mul"),                     # inf · 0
    (lambda x: x / x, "Div"),                       # inf / inf
])
def test_nan_made_from_infinity_raises_at_the_op_that_makes_it(make, op):
    x = tensor([math.inf, 1.0], requires_grad=True)
    with detect_anomaly():
        with pytest.raises(AnomalyError, match=rf"^{op}\.forward made nan"):
            make(x)


def test_infinity_from_finite_inputs_is_allowed():
    with detect_anomaly():
        y = F.log(tensor([0.0, 1.0], requires_grad=True))             # log 0 = −inf
        z = F.exp(tensor([1000.0], requires_grad=True))               # overflow: inf
        w = F.masked_fill(tensor([1.0, 2.0]), tensor([True, False], dtype=None), -math.inf)
    assert y.numpy()[0] == -math.inf and z.numpy()[0] == math.inf
    assert w.numpy()[0] == -math.inf


def test_a_nan_that_came_in_passes_on():
    with detect_anomaly():
        a = F.exp(tensor([math.nan, 0.0], requires_grad=True))        # in the data
        b = tensor([1.0, 2.0], requires_grad=True) * math.nan         # a Python constant
        c = F.masked_fill(tensor([1.0, 2.0]), tensor([True, False], dtype=None), math.nan)
    assert np.isnan(a.numpy()[0]) and np.isnan(b.numpy()).all() and np.isnan(c.numpy()[0])


def test_the_forward_check_runs_under_no_grad_too_and_check_nan_false_turns_it_off():
    with detect_anomaly(), minitx.no_grad():
        with pytest.raises(AnomalyError, match=r"^Sqrt\.forward made nan"):
            F.sqrt(tensor([-1.0]))
    with detect_anomaly(check_nan=False):
        y = F.sqrt(tensor([-1.0], requires_grad=True))
    assert np.isnan(y.numpy()[0])
    assert "`y = F.sqrt(tensor([-1.0], requires_grad=True))`" in y._ctx.trace


def test_a_node_made_under_anomaly_mode_still_records_where_it_ran():
    x = tensor([4.0], requires_grad=True)
    with detect_anomaly():
        y = x.sqrt()
    assert "test_anomaly_forward.py:" in y._ctx.trace and "`y = x.sqrt()`" in y._ctx.trace


# ---- attention's −inf inside masked scores is not an anomaly ----------------------------

@PATHS
@pytest.mark.filterwarnings("ignore:attn_mask hides every query")   # n = 1: the empty row
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 9), causal=st.booleans(), seed=st.integers(0, 100))
def test_masked_attention_forward_and_backward_pass_under_anomaly_mode(fast, n, causal, seed):
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(n, seed=seed))
    allowed = np.random.default_rng(seed).random((1, 1, n, n)) < 0.5
    allowed[..., range(n), range(n)] = True         # each query may see itself …
    allowed[..., 0, :] = False                      # … but the first sees no key at all
    with minitx.using_config(fast=fast), detect_anomaly():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=tensor(allowed, dtype=None),
                                             is_causal=causal)
        out.sum().backward()
    assert np.all(out.numpy()[..., 0, :] == 0)      # the empty row: zero, never NaN
    assert all(np.all(np.isfinite(t.grad.numpy())) for t in (q, k, v))


@PATHS
def test_small_models_train_a_step_under_anomaly_mode(fast):
    minitx.manual_seed(0)
    gpt = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    encoder = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    tokens = tensor(np.random.default_rng(0).integers(0, 11, (2, 8)), dtype=None)
    src = tensor(np.random.default_rng(1).standard_normal((2, 5, 8)), dtype="float32")
    padding = np.zeros((2, 5), dtype=bool)
    padding[1, 3:] = True                           # the second sequence is 3 tokens long
    with minitx.using_config(fast=fast), detect_anomaly():
        _, loss = gpt(tokens, targets=tokens)       # causal attention, cross-entropy
        loss = loss + encoder(src, src_key_padding_mask=tensor(padding, dtype=None)).sum()
        loss.backward()
    assert np.isfinite(loss.item())
    assert all(p.grad is None or np.all(np.isfinite(p.grad.numpy()))
               for p in list(gpt.parameters()) + list(encoder.parameters()))
