"""Sparse patterns and the blocked gather kernel: exact under each mask, never N × N."""

import numpy as np
import pytest

from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.masks import (PATTERNS, bigbird_mask, bigbird_random_blocks, dilated_mask,
                                    fixed_mask, local_mask, longformer_mask, render_pattern,
                                    strided_mask)
from support import assert_close, peak_bytes, qkv, tensor

SPARSE = ["local", "dilated", "longformer", "bigbird", "strided", "fixed"]


def test_local_mask_by_hand():
    expected = np.array([[1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0],
                         [0, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1],
                         [0, 0, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(local_mask(5, 1), expected)
    np.testing.assert_array_equal(local_mask(5, 1, causal=True), expected & np.tri(5, dtype=bool))


def test_dilated_strided_fixed_by_rule():
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    d = i - j
    np.testing.assert_array_equal(dilated_mask(12, 2, 3), (np.abs(d) <= 6) & (d % 3 == 0))
    np.testing.assert_array_equal(strided_mask(12, 4), ((d < 4) | (d % 4 == 0)) & (d >= 0))
    np.testing.assert_array_equal(fixed_mask(12, 4, 1),
                                  ((i // 4 == j // 4) | (j % 4 == 3)) & (j <= i))


def test_longformer_global_rows_and_columns():
    m = longformer_mask(10, 1, global_tokens=(0, -1))
    assert m[0].all() and m[:, 0].all() and m[9].all() and m[:, 9].all()
    assert not m[4, 7]
    mc = longformer_mask(10, 1, global_tokens=(0, -1), causal=True)
    np.testing.assert_array_equal(mc, m & np.tri(10, dtype=bool))
    with pytest.raises(ValueError, match="global token index"):
        longformer_mask(4, 1, global_tokens=(7,))


def test_bigbird_is_seeded_and_block_structured():
    a, b = bigbird_mask(32, 4, 2, 1, seed=3), bigbird_mask(32, 4, 2, 1, seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, bigbird_mask(32, 4, 2, 1, seed=4))
    # constant on 4 × 4 blocks
    blocks = a.reshape(8, 4, 8, 4)
    assert np.all(blocks == blocks[:, :1, :, :1])
    table = bigbird_random_blocks(8, 2, 1, seed=3)
    for t, row in enumerate(table):                 # random blocks avoid window and globals
        assert all(abs(r - t) > 1 and r >= 1 for r in row if r >= 0)
    assert a[:4].all() and a[:, :4].all()           # global block
    causal_table = bigbird_random_blocks(8, 2, 1, seed=3, causal=True)
    assert all(r < t - 1 for t, row in enumerate(causal_table) for r in row if r >= 0)


def test_render_pattern():
    text = render_pattern(local_mask(3, 0))
    assert text == "■ · ·\n· ■ ·\n· · ■"
    with pytest.raises(ValueError, match="2-d"):
        render_pattern(np.ones(3, dtype=bool))
    for name, build in PATTERNS.items():
        assert len(render_pattern(build(8)).splitlines()) == 8


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,options", [
    ("local", {"window": 3, "block_size": 5}), ("local", {"window": 0}),
    ("dilated", {"window": 2, "dilation": 3, "block_size": 4}),
    ("longformer", {"window": 2, "global_tokens": (0, 5, -1), "block_size": 8}),
    ("longformer", {"window": 1, "dilation": 2, "global_tokens": ()}),
    ("longformer", {"window": 2, "dilation": (1, 3), "global_tokens": (3,), "block_size": 4}),
    ("bigbird", {"block": 3, "num_random": 2, "num_global": 1}),
    ("bigbird", {"block": 5, "num_random": 0, "num_global": 2, "seed": 7}),
    ("strided", {"stride": 5}), ("fixed", {"stride": 6, "summary": 2})])
@pytest.mark.parametrize("n", [1, 2, 29, 64])
def test_equals_dense_under_own_pattern(name, options, causal, n):
    layer = REGISTRY[name](16, 2, causal=causal, **options)
    q, k, v = qkv(n, d=8, seed=n)
    out = layer.attend(*[tensor(x) for x in (q, k, v)])
    ref = dense_attention_array(q, k, v, layer.pattern(n))
    assert_close(out, ref, atol=1e-6)


@pytest.mark.parametrize("name", SPARSE)
def test_gradients_equal_dense_masked(name):
    import minitx.functional as F
    layer = REGISTRY[name](16, 2, causal=name in ("strided", "fixed"))
    n = 23
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 2, n, 8)) for _ in range(3)]
    g = rng.standard_normal((1, 2, n, 8))
    allowed = layer.pattern(n)
    grads = []
    for mode in ("sparse", "dense"):
        t = [tensor(x, requires_grad=True) for x in arrays]
        if mode == "sparse":
            out = layer.attend(*t)
        else:
            s = F.matmul(t[0], F.swapaxes(t[1], -1, -2)) * (1 / np.sqrt(8))
            out = F.matmul(F.softmax(F.masked_fill(s, ~allowed, -np.inf), axis=-1), t[2])
        out.backward(g)
        grads.append([x.grad.numpy() for x in t])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=1e-10)


def test_longformer_dilation_per_head():
    layer = REGISTRY["longformer"](16, 2, window=1, dilation=(1, 2), global_tokens=())
    p = layer.pattern(8)
    assert p.shape == (2, 8, 8)
    np.testing.assert_array_equal(p[0], dilated_mask(8, 1, 1))
    np.testing.assert_array_equal(p[1], dilated_mask(8, 1, 2))
    with pytest.raises(ValueError, match="per head"):
        REGISTRY["longformer"](16, 2, dilation=(1, 2, 3))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="window"):
        REGISTRY["local"](16, 2, window=-1)
    with pytest.raises(ValueError, match="dilation"):
        REGISTRY["dilated"](16, 2, dilation=0)
    with pytest.raises(ValueError, match="summary"):
        REGISTRY["fixed"](16, 2, stride=2, summary=3)
    with pytest.raises(ValueError, match="block_size"):
        REGISTRY["local"](16, 2, block_size=0)


@pytest.mark.parametrize("name,options", [("local", {"window": 8}),
                                          ("longformer", {"window": 8, "global_tokens": (0,)}),
                                          ("bigbird", {"block": 8})])
def test_memory_is_linear_never_n_squared(name, options):
    """At N = 4096 (float32, one head, D = 16) the whole forward + backward allocates far
    less than one N × N float32 matrix (64 MiB): the kernel only holds O(N·c) scores."""
    n, d = 4096, 16
    layer = REGISTRY[name](d, 1, **options)
    rng = np.random.default_rng(0)
    t = [tensor(rng.standard_normal((1, 1, n, d)), dtype="float32", requires_grad=True)
         for _ in range(3)]
    peak = peak_bytes(lambda: layer.attend(*t).sum().backward())    # host and device
    assert peak < n * n * 4 / 4, peak               # < a quarter of one N × N matrix
