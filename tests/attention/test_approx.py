"""Performer (FAVOR+) and Linformer: unbiasedness, the 1/√m law, budgets, errors, redraws."""
import importlib.util
import math

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.performer import orthogonal_gaussian, performer_kernel
from support import REPO, assert_close, assert_equal, params_to_float64, qkv, tensor, to_host

ROOT = REPO


def load_quality():
    spec = importlib.util.spec_from_file_location("approx_quality",
                                                  ROOT / "benchmarks" / "approx_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_kernel(q, k):
    return np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))


# ---- Performer ---------------------------------------------------------------------------

def test_orthogonal_features_are_orthogonal_within_a_block_with_chi_norms():
    minitx.manual_seed(0)
    w = to_host(orthogonal_gaussian(16, 8))            # two blocks of 8
    for block in (w[:8], w[8:]):
        unit = block / np.linalg.norm(block, axis=1, keepdims=True)
        np.testing.assert_allclose(unit @ unit.T, np.eye(8), atol=1e-10)
    minitx.manual_seed(1)
    norms = np.linalg.norm(to_host(orthogonal_gaussian(8000, 8)), axis=1)
    # chi(8): mean √2 Γ(4.5)/Γ(4) ≈ 2.7416, variance 8 − mean². The rows' norms are iid chi(8)
    # draws, so the sample mean of 8000 has standard error √(var/8000) ≈ 0.0078; allow 4 of them
    # (a wrong degree of freedom, e.g. chi(7) with mean ≈ 2.55, is off by > 20).
    mean = math.sqrt(2) * math.gamma(4.5) / math.gamma(4)
    se = math.sqrt((8 - mean ** 2) / norms.size)
    assert abs(norms.mean() - mean) < 4 * se, (norms.mean(), mean, se)


def test_kernel_estimate_is_unbiased_and_attention_converges():
    """Averaging φ(q)φ(k)ᵀ over many feature redraws converges to exp(q·k/√D), and the
    row-normalised average to exact softmax attention."""
    q, k, _ = qkv(16, b=1, h=1, d=8, scale=0.5)
    exact = exact_kernel(q, k)
    minitx.manual_seed(0)
    errors, total = [], np.zeros_like(exact)
    for r in range(1, 1601):
        total += performer_kernel(q, k, to_host(orthogonal_gaussian(16, 8)))
        if r in (25, 1600):
            mean = total / r
            errors.append(np.linalg.norm(mean - exact) / np.linalg.norm(exact))
    # Monte-Carlo bounds (fixed seed): the relative error falls like 1/√r, ideal ratio
    # √(1600/25) = 8 (measured ≈ 10, 0.124 → 0.012). 0.025 is about 2× the error the 25-draw
    # value predicts for 1600 draws (0.124/8 ≈ 0.016), and a ratio > 3 still rules out an
    # estimate that stops improving (a biased kernel would plateau, ratio → 1).
    assert errors[1] < 0.025 and errors[1] < errors[0] / 3
    att = (total / 1600) / (total / 1600).sum(-1, keepdims=True)
    soft = exact / exact.sum(-1, keepdims=True)
    # the row-normalised attention inherits that ~1% kernel error (measured max 0.0038 on
    # weights of size ~1/16); 0.01 leaves margin for it while a biased estimate would not fit
    assert np.abs(att - soft).max() < 0.01


def test_error_shrinks_like_inverse_sqrt_m():
    """Fit log(error) against log(m) for m ∈ {16, 64, 256, 1024}: slope ≈ −1/2.

    The kernel estimate is an average of m terms, so its variance is σ²/m and its RMS
    error σ/√m; we average 20 draws per m (the error estimate itself then has ~16% noise,
    i.e. ±0.07 in log) — a tolerance of ±0.15 on the slope covers that with margin.
    """
    q, k, _ = qkv(16, b=1, h=1, d=8, scale=0.6, seed=1)
    exact = exact_kernel(q, k)
    minitx.manual_seed(0)
    ms = [16, 64, 256, 1024]
    rms = []
    for m in ms:
        errs = [np.linalg.norm(performer_kernel(q, k, to_host(orthogonal_gaussian(m, 8)))
                               - exact) ** 2 for _ in range(20)]
        rms.append(np.sqrt(np.mean(errs)) / np.linalg.norm(exact))
    slope = np.polyfit(np.log(ms), np.log(rms), 1)[0]
    assert -0.65 < slope < -0.35, (slope, rms)


def test_stabilisation_cancels_and_survives_large_inputs():
    """The subtracted maxima cancel (stabilised == unstabilised where both are finite) and
    large inputs that overflow exp stay finite."""
    from minitx.attention.performer import performer_attention
    minitx.manual_seed(0)
    w = orthogonal_gaussian(32, 8)                     # on the active backend, as the layer's
    q, k, _ = qkv(10, b=1, h=1, d=8, scale=0.5)
    v = np.random.default_rng(0).standard_normal((1, 1, 10, 8))
    t = [tensor(x) for x in (q, k, v)]
    out = performer_attention(*t, w, eps=0.0)
    kern = performer_kernel(q, k, to_host(w))          # the reference, on the host
    assert_close(out, (kern / kern.sum(-1, keepdims=True)) @ v, atol=1e-10)
    big = [tensor(x * 60) for x in (q, k)]
    assert np.all(np.isfinite(performer_attention(*big, t[2], w).numpy()))


def test_causal_performer_equals_masked_kernel_form():
    from minitx.attention.performer import performer_attention
    minitx.manual_seed(0)
    w = orthogonal_gaussian(32, 8)
    q, k, _ = qkv(9, b=1, h=1, d=8, scale=0.5)
    v = np.random.default_rng(1).standard_normal((1, 1, 9, 8))
    t = [tensor(x) for x in (q, k, v)]
    out = performer_attention(*t, w, causal=True, eps=0.0)
    kern = performer_kernel(q, k, to_host(w)) * np.tri(9)
    assert_close(out, (kern / kern.sum(-1, keepdims=True)) @ v, atol=1e-10)


def test_redraw_only_when_asked():
    minitx.manual_seed(0)
    layer = REGISTRY["performer"](16, 2)
    w0 = layer.features.numpy().copy()
    x = tensor(np.random.default_rng(0).standard_normal((1, 5, 16)))
    layer.train()
    layer(x)
    assert_equal(layer.features, w0)                              # training, no option
    layer.redraw()
    assert not np.allclose(layer.features.numpy(), w0)
    layer = REGISTRY["performer"](16, 2, redraw_in_training=True)
    w1 = layer.features.numpy().copy()
    layer.eval()
    layer(x)
    assert_equal(layer.features, w1)                              # eval: never
    layer.train()
    layer(x)
    assert not np.allclose(layer.features.numpy(), w1)


# ---- Linformer ---------------------------------------------------------------------------

def test_linformer_refuses_causal_and_long_sequences():
    with pytest.raises(ValueError, match="causal"):
        REGISTRY["linformer"](16, 2, causal=True)
    layer = REGISTRY["linformer"](16, 2, max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        layer(tensor(np.zeros((1, 9, 16))))
    with pytest.raises(ValueError, match="init"):
        REGISTRY["linformer"](16, 2, init="nope")


def test_linformer_full_rank_pooling_is_exact():
    layer = params_to_float64(REGISTRY["linformer"](16, 2, proj_dim=12, max_len=12, init="pool"))
    q, k, v = qkv(12, d=8, seed=0)
    out = layer.attend(*[tensor(x) for x in (q, k, v)])
    assert_close(out, dense_attention_array(q, k, v), atol=1e-12)


def test_linformer_projections_are_learned():
    layer = REGISTRY["linformer"](16, 2, proj_dim=4, max_len=16)
    x = tensor(np.random.default_rng(0).standard_normal((2, 10, 16)), dtype="float32")
    layer(x).sum().backward()
    assert layer.E.grad is not None and np.abs(layer.E.grad.numpy()[:, :10]).sum() > 0
    assert_equal(layer.E.grad.numpy()[:, 10:], 0)                 # unused columns
    shared = REGISTRY["linformer"](16, 2, share_kv=True)
    assert shared.F is None


# ---- errors fall as budgets grow (small sizes) --------------------------------------------

@pytest.mark.parametrize("name", ["performer", "linformer", "reformer", "routing"])
def test_error_falls_as_budget_grows(name):
    quality = load_quality()
    option, values, fixed = quality.BUDGETS[name]
    small = {"performer": [8, 64, 512], "linformer": [4, 16, 64], "reformer": [1, 4, 16],
             "routing": [16, 4, 1]}[name]
    fixed = dict(fixed)
    if name == "linformer":
        fixed["max_len"] = 64
    if name == "routing":
        fixed["window"] = 64
    rows = quality.quality_table(n=64, d=8, seeds=2, scale=0.5,
                                 budgets={name: (option, small, fixed)})
    att = [r[3] for r in rows]
    out = [r[4] for r in rows]
    assert att[0] > att[1] > att[2], rows
    assert out[0] > out[1] > out[2], rows
