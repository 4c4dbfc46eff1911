"""The contract every registered attention variant keeps (see minitx/attention/base.py).

Parametrised over the whole REGISTRY — every variant, whoever wrote it:

- float64 gradients of ``attend`` match finite differences at N = 1, 7, 33;
- no NaN at N = 1;
- causal variants: perturbing tokens after t leaves outputs up to t unchanged (through
  ``layer(x)``); variants that refuse causal raise ValueError at construction;
- "exact"/"masked" variants equal ``dense_attention_array`` under ``layer.pattern(n)``;
  "score" variants with a ``reference`` equal it;
- grouped key/value heads (GQA/MQA) are accepted and equal repeating them by hand;
- eval mode is deterministic;
- a property test over random sizes N = 1…39, input scales 1e-3…1e4, float32/float64: outputs
  are finite with the right shape, and in float64 exact/masked kinds equal the dense reference
  (``MINITX_HYPOTHESIS_PROFILE=thorough`` for 200 examples per variant).
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from support import assert_close, assert_equal, params_to_float64, qkv, tensor, to_host

NAMES = sorted(REGISTRY)
E, H = 8, 2                      # embed dim 8, 2 heads -> head dim D = 4
D = E // H


def build(name, causal=False, num_kv_heads=None):
    """A float64 layer in eval mode (None if it refuses causal=True, checked elsewhere)."""
    minitx.manual_seed(0)
    kwargs = {} if num_kv_heads is None else {"num_kv_heads": num_kv_heads}
    layer = REGISTRY[name](E, H, causal=causal, **kwargs)
    return params_to_float64(layer).eval()


def refuses_causal(name):
    return not getattr(REGISTRY[name], "supports_causal", True)


# every (variant, causal) pair a variant accepts; the refusal itself is checked in
# test_refusing_causal_raises, so the refused pairs are not generated (rather than skipped)
CASES = [(n, c) for n in NAMES for c in (False, True) if not (c and refuses_causal(n))]


def test_registry_is_not_empty():
    assert len(NAMES) >= 10, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_refusing_causal_raises(name):
    if refuses_causal(name):
        with pytest.raises(ValueError):
            REGISTRY[name](E, H, causal=True)
    else:
        REGISTRY[name](E, H, causal=True)


@pytest.mark.parametrize("name,causal", CASES)
def test_gradcheck_attend(name, causal):
    layer = build(name, causal)
    for n in (1, 7):
        arrays = qkv(n, b=1, h=H, d=D, scale=0.7, seed=n)
        minitx.gradcheck(layer.attend, tuple(tensor(a, requires_grad=True) for a in arrays))
    # N = 33: only q carries requires_grad (keeps the finite differences cheap). On a device
    # each forward is dozens of kernel launches (reformer's hashing, sorting and gathers: past
    # 20 s for the 528 forwards of the element-by-element check on an H100), so there the check
    # takes one random direction through q (gradcheck's fast mode, two forwards), which a wrong
    # gradient passes only with probability zero; the host keeps the per-element check.
    q, k, v = qkv(33, b=1, h=H, d=D, scale=0.7, seed=33)
    q = tensor(q, requires_grad=True)
    minitx.gradcheck(layer.attend, (q, tensor(k), tensor(v)),
                     fast=not isinstance(q.data, np.ndarray))


@pytest.mark.parametrize("name", NAMES)
def test_no_nan_at_length_one(name):
    for causal in ([False] if refuses_causal(name) else [False, True]):
        layer = build(name, causal)
        x = tensor(np.random.default_rng(1).standard_normal((2, 1, E)))
        assert np.all(np.isfinite(layer(x).numpy()))
        heads = [tensor(a) for a in qkv(1, b=2, h=H, d=D, scale=0.7, seed=0)]
        assert np.all(np.isfinite(layer.attend(*heads).numpy()))


@pytest.mark.parametrize("name", [n for n in NAMES if not refuses_causal(n)])
def test_causality(name):
    layer = build(name, causal=True)
    rng = np.random.default_rng(2)
    n, t = 12, 5
    x = rng.standard_normal((2, n, E))
    y1 = layer(tensor(x)).numpy()
    x2 = x.copy()
    x2[:, t + 1:] += rng.standard_normal(x2[:, t + 1:].shape) * 3
    y2 = layer(tensor(x2)).numpy()
    np.testing.assert_allclose(y1[:, :t + 1], y2[:, :t + 1], atol=1e-10,
                               err_msg=f"{name}: output before t changed with future tokens")
    assert not np.allclose(y1[:, t + 1:], y2[:, t + 1:])   # the perturbation did something


@pytest.mark.parametrize("name,causal", CASES)
def test_equals_dense_under_pattern(name, causal):
    layer = build(name, causal)
    kind = layer.kind
    for n in (1, 7, 33):
        arrays = qkv(n, b=2, h=H, d=D, scale=0.7, seed=n)
        q, k, v = (tensor(a) for a in arrays)
        out = layer.attend(q, k, v).numpy()
        if kind in ("exact", "masked"):
            ref = dense_attention_array(*arrays, layer.pattern(n))       # on the host
        elif hasattr(layer, "reference"):
            ref = layer.reference(q.data, k.data, v.data)   # reads the layer's (device) params
        else:
            assert out.shape == q.shape and np.all(np.isfinite(out))
            continue
        assert_close(out, ref, atol=1e-6, rtol=1e-6, err_msg=f"{name} n={n}")


@pytest.mark.parametrize("name", NAMES)
def test_pattern_shape_and_dtype(name):
    layer = build(name)
    if layer.kind in ("exact", "masked"):
        p = layer.pattern(9)
        assert p.shape == (9, 9) and p.dtype == bool


@pytest.mark.parametrize("hkv", [1])
@pytest.mark.parametrize("name", NAMES)
def test_grouped_kv_heads(name, hkv):
    layer = build(name, num_kv_heads=hkv)
    x = tensor(np.random.default_rng(3).standard_normal((2, 9, E)))
    assert layer(x).shape == (2, 9, E)
    qa, ka, va = qkv(9, b=2, h=H, hkv=hkv, d=D, scale=0.7, seed=4)
    q = tensor(qa)
    shared = layer.attend(q, tensor(ka), tensor(va))
    rep = [tensor(np.repeat(a, H // hkv, axis=1)) for a in (ka, va)]
    assert_close(shared, layer.attend(q, *rep), atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_eval_mode_is_deterministic(name):
    layer = build(name)
    x = tensor(np.random.default_rng(5).standard_normal((2, 10, E)))
    assert_equal(layer(x), layer(x))


@pytest.mark.parametrize("name,causal", CASES)
@given(n=st.integers(1, 39), seed=st.integers(0, 2 ** 16), log_scale=st.floats(-3, 4),
       dtype=st.sampled_from(["float32", "float64"]))
def test_contract_on_random_sizes_and_scales(name, causal, n, seed, log_scale, dtype):
    layer = build(name, causal)
    if dtype == "float32":
        layer.to(dtype="float32")
    q, k, v = qkv(n, b=1, h=H, d=D, seed=seed, scale=10.0 ** log_scale, dtype=dtype)
    try:
        out = layer.attend(tensor(q, dtype=None), tensor(k, dtype=None), tensor(v, dtype=None))
    except ValueError as exc:                       # a length the variant cannot take, named
        assert "max_len" in str(exc) or "length" in str(exc), exc
        return
    got = to_host(out)
    assert got.shape == (1, H, n, D) and np.all(np.isfinite(got)), (name, n, log_scale)
    if dtype == "float64" and layer.kind in ("exact", "masked"):
        ref = dense_attention_array(q, k, v, layer.pattern(n))
        assert_close(got, ref, atol=1e-6 * max(1.0, np.abs(v).max()), rtol=1e-6)
