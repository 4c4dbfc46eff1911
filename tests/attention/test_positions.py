"""Position schemes: sinusoidal, learned, Shaw relative, RoPE, ALiBi — formulas, defining
properties, gradients, and the registered score variants against their dense formulas."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import (REGISTRY, LearnedPositionalEmbedding, SinusoidalPositionalEncoding,
                              alibi_bias, alibi_slopes, apply_rope, causal_pattern,
                              relative_position_index, rope_angles, sinusoidal_positions)
from support import tensor, to_host


def softmax_rows(s, allowed=None):
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


# ---- sinusoidal & learned ----------------------------------------------------------------

@pytest.mark.parametrize("d", [6, 7])
def test_sinusoidal_table_formula(d):
    pe = to_host(sinusoidal_positions(5, d, offset=2, dtype="float64"))
    for pos in range(5):
        for i in range(d):
            angle = (pos + 2) / 10000 ** (2 * (i // 2) / d)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert abs(pe[pos, i] - expected) < 1e-12


def test_sinusoidal_shift_is_a_rotation():
    # PE(pos + k) = R_k PE(pos) for each (sin, cos) pair: a fixed linear map, any pos
    pe = to_host(sinusoidal_positions(12, 8, dtype="float64"))
    omega = 10000 ** (-np.arange(0, 8, 2) / 8)
    k = 3
    for i, w in enumerate(omega):
        rot = np.array([[np.cos(k * w), -np.sin(k * w)], [np.sin(k * w), np.cos(k * w)]])
        pair = pe[:, 2 * i: 2 * i + 2]                         # (sin, cos)
        np.testing.assert_allclose(pair[:-k] @ rot, pair[k:], atol=1e-12)


def test_sinusoidal_module_and_learned_module(rng):
    x = rng.standard_normal((2, 4, 6))
    enc = SinusoidalPositionalEncoding(6)
    np.testing.assert_allclose(enc(tensor(x, requires_grad=True), offset=3).numpy(),
                               x + to_host(sinusoidal_positions(4, 6, offset=3, dtype="float64")),
                               atol=1e-6)
    learned = LearnedPositionalEmbedding(8, 6).to(dtype="float64")
    np.testing.assert_allclose(learned(tensor(x, requires_grad=True), offset=2).numpy(),
                               x + learned.weight.numpy()[2:6], atol=1e-12)
    minitx.gradcheck(lambda x, w: learned(x, offset=4),
                     (tensor(x, requires_grad=True), learned.weight))
    with pytest.raises(ValueError, match="exceed max_len=8"):
        learned(tensor(x, requires_grad=True), offset=5)
    with pytest.raises(ValueError, match="d_model=6"):
        enc(tensor(np.zeros((1, 2, 5)), requires_grad=True))


# ---- relative (Shaw et al.) --------------------------------------------------------------

def test_relative_position_index_clips():
    idx = to_host(relative_position_index(4, 4, 2))
    np.testing.assert_array_equal(idx - 2, np.clip(np.arange(4)[None] - np.arange(4)[:, None],
                                                   -2, 2))
    # 2 queries at positions 3, 4 of 5 keys (bottom-right)
    np.testing.assert_array_equal(to_host(relative_position_index(2, 5, 9)) - 9,
                                  [[-3, -2, -1, 0, 1], [-4, -3, -2, -1, 0]])


@pytest.mark.parametrize("causal", [False, True])
def test_relative_attention_matches_shaw_formula(rng, causal):
    layer = REGISTRY["relative"](8, 2, causal=causal, max_relative_position=2)
    layer.to(dtype="float64")
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    ak, av = layer.rel_k.numpy(), layer.rel_v.numpy()
    idx = to_host(relative_position_index(6, 6, 2))
    e = (np.einsum("bhid,bhjd->bhij", q, k) + np.einsum("bhid,ijd->bhij", q, ak[idx])) / 2.0
    a = softmax_rows(e, causal_pattern(6, 6) if causal else None)
    z = a @ v + np.einsum("bhij,ijd->bhid", a, av[idx])
    tq, tk, tv = (tensor(x, requires_grad=True) for x in (q, k, v))
    np.testing.assert_allclose(layer.attend(tq, tk, tv).numpy(), z, atol=1e-12)
    short = [tensor(x[..., :3, :], requires_grad=True) for x in (q, k, v)]
    minitx.gradcheck(lambda q, k, v, rk, rv: layer.attend(q, k, v),
                     (*short, layer.rel_k, layer.rel_v))


# ---- RoPE --------------------------------------------------------------------------------

@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(-50, 50))
def test_rope_inner_product_depends_only_on_offset(m, n, shift):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 8)), rng.standard_normal((1, 8))

    def dot(a, b):
        return float((apply_rope(q, np.array([a])) * apply_rope(k, np.array([b]))).sum())
    if m + shift >= 0 and n + shift >= 0:
        assert abs(dot(m, n) - dot(m + shift, n + shift)) < 1e-9


def test_rope_rotates_pairs_and_preserves_norms(rng):
    x = rng.standard_normal((3, 5, 6))
    y = apply_rope(x, offset=4)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    ang = rope_angles(np.arange(4, 9), 6)
    re = x[..., 0::2] * np.cos(ang) - x[..., 1::2] * np.sin(ang)
    im = x[..., 0::2] * np.sin(ang) + x[..., 1::2] * np.cos(ang)
    np.testing.assert_allclose(y[..., 0::2], re, atol=1e-12)
    np.testing.assert_allclose(y[..., 1::2], im, atol=1e-12)
    np.testing.assert_allclose(apply_rope(x, np.zeros(5, int)), x)   # position 0: identity
    minitx.gradcheck(lambda x: apply_rope(x, offset=2), (tensor(x, requires_grad=True),))
    with pytest.raises(ValueError, match="head dim D must be a positive even int"):
        apply_rope(rng.standard_normal((2, 5)))
    with pytest.raises(ValueError, match="positions must have shape"):
        apply_rope(x, np.arange(3))


@pytest.mark.parametrize("causal", [False, True])
def test_rope_attention_matches_formula(rng, causal):
    layer = REGISTRY["rope"](8, 2, causal=causal)
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    qr, kr = apply_rope(q), apply_rope(k)
    a = softmax_rows(qr @ np.swapaxes(kr, -1, -2) / 2.0, causal_pattern(5, 5) if causal else None)
    tq, tk, tv = (tensor(x, requires_grad=True) for x in (q, k, v))
    np.testing.assert_allclose(layer.attend(tq, tk, tv).numpy(), a @ v, atol=1e-12)
    with pytest.raises(ValueError, match="must be even"):
        REGISTRY["rope"](6, 2)


# ---- ALiBi -------------------------------------------------------------------------------

def test_alibi_slopes_paper_rule():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1,
                               2.0 ** -3]
    assert np.allclose(alibi_slopes(3), [2 ** -4, 2 ** -8, 2 ** -2])
    assert alibi_slopes(1) == [2.0 ** -8]
    assert len(alibi_slopes(12)) == 12 and len(set(alibi_slopes(12))) == 12
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        alibi_slopes(0)


def test_alibi_bias_and_attention(rng):
    bias = to_host(alibi_bias(2, 3, 5, dtype="float64"))
    pos = np.arange(2, 5)[:, None]                             # queries are the last 3 of 5
    np.testing.assert_allclose(bias[1], -(2.0 ** -8) * np.abs(np.arange(5)[None] - pos))
    layer = REGISTRY["alibi"](8, 2, causal=True)
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    s = q @ np.swapaxes(k, -1, -2) / 2.0 + to_host(alibi_bias(2, 5, 5, dtype="float64"))
    a = softmax_rows(s, causal_pattern(5, 5))
    tq, tk, tv = (tensor(x, requires_grad=True) for x in (q, k, v))
    np.testing.assert_allclose(layer.attend(tq, tk, tv).numpy(), a @ v, atol=1e-12)


@pytest.mark.parametrize("name", ["rope", "alibi", "relative"])
@pytest.mark.parametrize("n", [1, 7, 33])
def test_position_variants_gradcheck_lengths(rng, name, n):
    layer = REGISTRY[name](4, 2, causal=True).to(dtype="float64")
    q, k, v = (tensor(rng.standard_normal((1, 2, n, 2)), requires_grad=True) for _ in range(3))
    minitx.gradcheck(lambda q, k, v: layer.attend(q, k, v), (q, k, v))


@pytest.mark.parametrize("name", ["rope", "alibi", "relative"])
def test_positions_break_permutation_symmetry(rng, name):
    layer = REGISTRY[name](8, 2).to(dtype="float64")
    x = rng.standard_normal((1, 6, 8))
    perm = [5, 0, 3, 1, 2, 4]
    assert not np.allclose(layer(tensor(x[:, perm])).numpy(),
                           layer(tensor(x)).numpy()[:, perm])
