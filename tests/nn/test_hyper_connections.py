"""Hyper-connections (``minitx/nn/hyper_connections.py``) against references written here:

- float64 gradients of both flavours, the final collapse and Sinkhorn match central
  differences, for the streams and every parameter;
- Sinkhorn's output is doubly stochastic to tolerance after its rounds, and its row error
  shrinks as the rounds grow (the columns are exact after every round);
- with one stream and neutral weights the mHC is the plain residual h + F(h), and the gated
  form the pre-norm residual h + F(½ h / rms(h));
- one layer's read / write / mix equals the formulas written as explicit loops over tokens,
  streams and features, here in NumPy (hypothesis over the sizes);
- bad options and inputs are named.

HF's modules are the oracle in tests/oracles/test_torch_parity_hyper_connections.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
import minitx.functional as F
from minitx.nn.hyper_connections import (GatedHyperConnection, ManifoldHyperConnection,
                                         ManifoldHyperHead, expand_streams, sinkhorn)
from minitx.validate import OptionError
from support import assert_close, tensor, to_host


def layer_f(x):
    """A fixed nonlinear layer F: (B, N, E) → (B, N, E), the same in NumPy and minitx."""
    if isinstance(x, np.ndarray):
        return np.tanh(x) * 1.5 + np.roll(x, 1, axis=-1)
    return F.tanh(x) * 1.5 + F.concatenate([x[..., -1:], x[..., :-1]], axis=-1)


def redraw(module, rng, scale=0.5):
    """Every parameter drawn again (biases, scales, norm weights too); their host values."""
    values = {}
    for name, p in module.named_parameters():
        values[name] = rng.standard_normal(p.shape) * scale
        p.data = tensor(values[name]).data
    return values


def sigmoid(a):
    return 1.0 / (1.0 + math.exp(-a))


def silu(a):
    return a * sigmoid(a)


# ---- the references, loop by loop --------------------------------------------------------------

def sinkhorn_by_hand(logits, rounds, eps):
    """One (n, n) matrix: the row softmax + eps, then the column / row rounds, entry by entry."""
    n = logits.shape[0]
    m = np.zeros((n, n))
    for i in range(n):
        z = sum(math.exp(logits[i, j] - logits[i].max()) for j in range(n))
        for j in range(n):
            m[i, j] = math.exp(logits[i, j] - logits[i].max()) / z + eps

    def columns(m):
        return np.array([[m[i, j] / (sum(m[r, j] for r in range(n)) + eps) for j in range(n)]
                         for i in range(n)])
    m = columns(m)
    for _ in range(rounds - 1):
        m = np.array([[m[i, j] / (sum(m[i, c] for c in range(n)) + eps) for j in range(n)]
                      for i in range(n)])
        m = columns(m)
    return m


def mhc_by_hand(h, p, rounds, eps, norm_eps):
    """The mHC layer h'_k = Σ_j M_jk h_j + b_k F(x), token by token, from the host weights."""
    bsz, ntok, n, e = h.shape
    out = np.zeros_like(h)
    x = np.zeros((bsz, ntok, e))
    for b_ in range(bsz):
        for t in range(ntok):
            flat = h[b_, t].reshape(-1)
            rms = math.sqrt(sum(v * v for v in flat) / flat.size + norm_eps)
            ell = [sum(p["weight"][r, c] * flat[c] / rms for c in range(n * e))
                   for r in range((2 + n) * n)]
            a = [sigmoid(ell[i] * p["scale"][0] + p["bias"][i]) + eps for i in range(n)]
            post = [2 * sigmoid(ell[n + i] * p["scale"][1] + p["bias"][n + i])
                    for i in range(n)]
            res = 2 * n                             # the res logits, row-major after pre, post
            logits = np.array([[ell[res + i * n + j] * p["scale"][2] + p["bias"][res + i * n + j]
                                for j in range(n)] for i in range(n)])
            m = sinkhorn_by_hand(logits, rounds, eps)
            for f in range(e):
                x[b_, t, f] = sum(a[i] * h[b_, t, i, f] for i in range(n))
            y = layer_f(x[b_, t])
            for k in range(n):
                for f in range(e):
                    out[b_, t, k, f] = (sum(m[j, k] * h[b_, t, j, f] for j in range(n))
                                        + post[k] * y[f])
    return x, out


def gated_by_hand(h, p, norm_eps, inject=True):
    """Qwen4-Exp's gated layer h'_k = h_k + b_k F(x), token by token, from the host weights."""
    bsz, ntok, n, e = h.shape
    out, x = np.zeros_like(h), np.zeros((bsz, ntok, e))
    down, up = p["mix_down.weight"], p["mix_up.weight"]
    for b_ in range(bsz):
        for t in range(ntok):
            hat = np.zeros(n * e)
            for i in range(n):
                rms = math.sqrt(sum(v * v for v in h[b_, t, i]) / e + norm_eps)
                for f in range(e):
                    hat[i * e + f] = h[b_, t, i, f] / rms * (1 + p["norm_weight"][i * e + f])
            low = [silu(sum(down[r, c] * hat[c] for c in range(n * e)) / n)
                   for r in range(down.shape[0])]
            gate = [sigmoid(sum(up[c, r] * low[r] for r in range(len(low))))
                    for c in range(n * e)]
            for f in range(e):
                x[b_, t, f] = sum(gate[i * e + f] * hat[i * e + f] for i in range(n)) / n
            if not inject:
                continue
            post = [2 * sigmoid(sum(p["inject.weight"][k, c] * hat[c] for c in range(n * e)) / n)
                    for k in range(n)]
            y = layer_f(x[b_, t])
            for k in range(n):
                for f in range(e):
                    out[b_, t, k, f] = h[b_, t, k, f] + post[k] * y[f]
    return x, out


# ---- the dense references -----------------------------------------------------------------------

@settings(deadline=None, max_examples=15)
@given(n=st.integers(1, 4), e=st.integers(1, 6), ntok=st.integers(1, 4),
       rounds=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_mhc_equals_its_loops(n, e, ntok, rounds, seed):
    rng = np.random.default_rng(seed)
    layer = ManifoldHyperConnection(e, n, sinkhorn_iterations=rounds, eps=1e-3, norm_eps=0.05,
                                    dtype="float64")
    p = redraw(layer, rng)
    h = rng.standard_normal((2, ntok, n, e))
    want_x, want = mhc_by_hand(h, p, rounds, 1e-3, 0.05)
    assert_close(layer.read(tensor(h))[0], want_x, rtol=1e-12, atol=1e-13)
    assert_close(layer(tensor(h), layer_f), want, rtol=1e-12, atol=1e-13)


@settings(deadline=None, max_examples=15)
@given(n=st.integers(1, 4), e=st.integers(1, 6), ntok=st.integers(1, 4),
       rank=st.integers(1, 5), inject=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gated_equals_its_loops(n, e, ntok, rank, inject, seed):
    rng = np.random.default_rng(seed)
    layer = GatedHyperConnection(e, n, rank=rank, norm_eps=0.05, inject=inject,
                                 dtype="float64")
    p = redraw(layer, rng)
    h = rng.standard_normal((2, ntok, n, e))
    want_x, want = gated_by_hand(h, p, 0.05, inject)
    if inject:
        assert_close(layer(tensor(h), layer_f), want, rtol=1e-12, atol=1e-13)
        assert_close(layer.read(tensor(h))[0], want_x, rtol=1e-12, atol=1e-13)
    else:
        assert_close(layer(tensor(h)), want_x, rtol=1e-12, atol=1e-13)


def test_mhc_head_equals_its_loop():
    rng = np.random.default_rng(1)
    head = ManifoldHyperHead(5, 3, eps=1e-3, norm_eps=0.05, dtype="float64")
    p = redraw(head, rng)
    h = rng.standard_normal((2, 4, 3, 5))
    want = np.zeros((2, 4, 5))
    for b_ in range(2):
        for t in range(4):
            flat = h[b_, t].reshape(-1)
            rms = math.sqrt((flat ** 2).mean() + 0.05)
            for i in range(3):
                a = sigmoid(p["scale"][0] * (p["weight"][i] @ flat) / rms + p["bias"][i]) + 1e-3
                want[b_, t] += a * h[b_, t, i]
    assert_close(head(tensor(h)), want, rtol=1e-12, atol=1e-13)


def test_expansion_copies_the_embedding_into_every_stream():
    x = np.random.default_rng(2).standard_normal((2, 3, 4))
    got = to_host(expand_streams(tensor(x), 5))
    assert got.shape == (2, 3, 5, 4)
    for i in range(5):
        assert np.array_equal(got[:, :, i], x)


# ---- Sinkhorn -----------------------------------------------------------------------------------

def stochastic_errors(m):
    """max |row sum − 1| and max |column sum − 1| of (..., n, n)."""
    return np.abs(m.sum(-1) - 1).max(), np.abs(m.sum(-2) - 1).max()


@settings(deadline=None, max_examples=25)
@given(n=st.integers(2, 6), log_scale=st.floats(-1, 0), seed=st.integers(0, 2 ** 16))
def test_sinkhorn_converges_to_doubly_stochastic(n, log_scale, seed):
    """Logits of standard deviation up to 1 (a spread of e^±3 in the entries; a wider one
    converges too, but more slowly than 256 rounds allow for the last check)."""
    logits = np.random.default_rng(seed).standard_normal((3, n, n)) * 10 ** log_scale
    rows = []
    for rounds in (1, 2, 4, 8, 16, 64, 256):
        m = to_host(sinkhorn(tensor(logits), rounds, eps=0.0))
        assert (m > 0).all()
        row_err, col_err = stochastic_errors(m)
        assert col_err < 1e-14                     # a round ends on the columns: exact
        rows.append(row_err)
    # the rows' error shrinks with the rounds (to rounding), and is gone after 256
    assert all(b <= a + 1e-15 for a, b in zip(rows, rows[1:])), rows
    assert rows[-1] < 1e-11, rows
    assert rows[0] > 1e-4, rows                     # one round is far from stochastic


@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2 ** 16))
def test_sinkhorn_with_eps_as_hf_uses_it(seed):
    """DeepSeek-V4's settings (20 rounds, eps 1e-6, n = 4) on logits of standard deviation
    ½ (HF's initialisation gives logits near 0): rows and columns sum to 1 within 2·eps (a
    denominator S + eps leaves a sum of S / (S + eps) = 1 − eps/S); the result agrees with
    the entry-by-entry loop. (Logits spread wider need more rounds: with standard deviation 2,
    20 rounds leave row errors near 1e-2.)"""
    logits = np.random.default_rng(seed).standard_normal((4, 4)) * 0.5
    m = to_host(sinkhorn(tensor(logits), 20, eps=1e-6))
    row_err, col_err = stochastic_errors(m)
    assert row_err < 2e-6 and col_err < 2e-6, (row_err, col_err)
    assert_close(m, sinkhorn_by_hand(logits, 20, 1e-6), rtol=1e-13)


# ---- the plain residual as the one-stream limit -------------------------------------------------

def test_one_stream_mhc_is_the_plain_residual():
    """n = 1, eps = 0, W = 0, β_pre = 40 (σ(40) rounds to 1), β_post = 0 (2σ(0) = 1): a = b
    = M = 1 and h' = h + F(h)."""
    layer = ManifoldHyperConnection(6, 1, eps=0.0, dtype="float64")
    layer.weight.data = tensor(np.zeros((3, 6))).data
    layer.bias.data = tensor([40.0, 0.0, 0.7]).data          # res: a 1×1 softmax, any logit
    h = np.random.default_rng(4).standard_normal((2, 5, 1, 6))
    want = h + layer_f(h[:, :, 0])[:, :, None]
    assert_close(layer(tensor(h), layer_f), want, rtol=1e-15, atol=1e-15)


def test_one_stream_gated_is_the_prenorm_residual():
    """n = 1 with U = 0 and γ = 0: G = σ(0) = ½, b = 2σ(C ĥ) (C = 0: 1), so h' =
    h + F(½ h / rms(h)), the pre-norm residual with a norm weight of ½."""
    layer = GatedHyperConnection(6, 1, rank=3, norm_eps=1e-6, dtype="float64")
    layer.mix_up.weight.data = tensor(np.zeros((6, 3))).data
    layer.inject.weight.data = tensor(np.zeros((1, 6))).data
    h = np.random.default_rng(5).standard_normal((2, 5, 1, 6))
    hat = h[:, :, 0] / np.sqrt((h[:, :, 0] ** 2).mean(-1, keepdims=True) + 1e-6)
    want = h + layer_f(0.5 * hat)[:, :, None]
    assert_close(layer(tensor(h), layer_f), want, rtol=1e-14, atol=1e-14)


# ---- gradients ----------------------------------------------------------------------------------

def test_gradcheck_mhc():
    rng = np.random.default_rng(6)
    layer = ManifoldHyperConnection(4, 3, sinkhorn_iterations=5, eps=1e-3, norm_eps=0.05,
                                    dtype="float64")
    redraw(layer, rng)
    h = tensor(rng.standard_normal((1, 3, 3, 4)), requires_grad=True)
    assert minitx.gradcheck(lambda h_, *ps: layer(h_, layer_f), (h, *layer.parameters()))


@pytest.mark.parametrize("inject", [True, False])
def test_gradcheck_gated(inject):
    rng = np.random.default_rng(7)
    layer = GatedHyperConnection(4, 3, rank=2, norm_eps=0.05, inject=inject, dtype="float64")
    redraw(layer, rng)
    h = tensor(rng.standard_normal((1, 3, 3, 4)), requires_grad=True)
    fn = (lambda h_, *ps: layer(h_, layer_f)) if inject else (lambda h_, *ps: layer(h_))
    assert minitx.gradcheck(fn, (h, *layer.parameters()))


def test_gradcheck_head_and_sinkhorn():
    rng = np.random.default_rng(8)
    head = ManifoldHyperHead(4, 3, eps=1e-3, norm_eps=0.05, dtype="float64")
    redraw(head, rng)
    h = tensor(rng.standard_normal((2, 2, 3, 4)), requires_grad=True)
    assert minitx.gradcheck(lambda h_, *ps: head(h_), (h, *head.parameters()))
    logits = tensor(rng.standard_normal((2, 4, 4)), requires_grad=True)
    assert minitx.gradcheck(lambda lg: sinkhorn(lg, 6, 1e-3), (logits,))


# ---- hooks and bad input ------------------------------------------------------------------------

def test_hooks_see_the_read_write_and_mix():
    rng = np.random.default_rng(9)
    layer = ManifoldHyperConnection(4, 3, dtype="float64")
    redraw(layer, rng)
    seen = {}
    for name in ("hook_read", "hook_write", "hook_mix"):
        getattr(layer, name).add_hook(lambda t, hook, name=name:
                                      seen.__setitem__(name, to_host(t)))
    h = rng.standard_normal((2, 3, 3, 4))
    layer(tensor(h), layer_f)
    x, b, m = (to_host(t) for t in layer.read(tensor(h)))
    assert np.array_equal(seen["hook_read"], x) and seen["hook_write"].shape == (2, 3, 3)
    assert np.array_equal(seen["hook_mix"], m) and m.shape == (2, 3, 3, 3)
    # replacing the mix by the identity and the write by zero leaves the streams unchanged
    layer.hook_mix.add_hook(lambda t, hook: tensor(np.broadcast_to(np.eye(3), t.shape).copy()))
    layer.hook_write.add_hook(lambda t, hook: tensor(np.zeros(t.shape)))
    assert_close(layer(tensor(h), layer_f), h, atol=0)


@pytest.mark.parametrize("make,option,value", [
    (lambda v: ManifoldHyperConnection(8, v), "num_streams", 0),
    (lambda v: ManifoldHyperConnection(v, 2), "hidden_size", 1.5),
    (lambda v: ManifoldHyperConnection(8, 2, sinkhorn_iterations=v), "sinkhorn_iterations", 0),
    (lambda v: ManifoldHyperConnection(8, 2, eps=v), "eps", -1e-6),
    (lambda v: ManifoldHyperConnection(8, 2, norm_eps=v), "norm_eps", 0.0),
    (lambda v: ManifoldHyperHead(8, v), "num_streams", -2),
    (lambda v: GatedHyperConnection(8, 2, rank=v), "rank", 0),
    (lambda v: GatedHyperConnection(8, 2, inject=v), "inject", "yes"),
    (lambda v: sinkhorn(tensor(np.zeros((2, 2))), v), "iterations", 2.5),
    (lambda v: expand_streams(tensor(np.zeros((1, 2, 3))), v), "num_streams", 0),
])
def test_bad_options_are_named(make, option, value):
    with pytest.raises((ValueError, TypeError)) as info:
        make(value)
    assert option in str(info.value) and repr(value) in str(info.value), str(info.value)


def test_bad_streams_and_calls_are_named():
    layer = ManifoldHyperConnection(8, 2, dtype="float64")
    with pytest.raises(ValueError, match=r"\(B, N, 2, 8\), got shape \(1, 3, 8\)"):
        layer(tensor(np.zeros((1, 3, 8))), layer_f)
    with pytest.raises(ValueError, match=r"\(B, N, 2, 8\), got shape \(1, 3, 3, 8\)"):
        ManifoldHyperHead(8, 2)(tensor(np.zeros((1, 3, 3, 8))))
    with pytest.raises(OptionError, match="needs the layer"):
        GatedHyperConnection(8, 2)(tensor(np.zeros((1, 3, 2, 8))))
    with pytest.raises(OptionError, match="takes no layer"):
        GatedHyperConnection(8, 2, inject=False)(tensor(np.zeros((1, 3, 2, 8))), layer_f)
