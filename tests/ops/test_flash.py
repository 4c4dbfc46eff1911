"""FlashAttention (tiled, online softmax, recomputing backward): exactness, masks, memory."""

import numpy as np
import pytest

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY, causal_pattern, dense_attention_array
from minitx.ops.flash import flash_attention, flash_attention_arrays
from support import assert_close, assert_equal, peak_bytes, qkv, tensor


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk,bq,bk", [(1, 1, 64, 64), (37, 37, 8, 16), (64, 64, 64, 64),
                                         (20, 45, 7, 9), (45, 20, 16, 4), (100, 100, 32, 8)])
def test_equals_dense_float32(nq, nk, bq, bk, causal):
    q, k, v = qkv(nq, nk, d=16, dtype=np.float32)
    out = flash_attention(*[tensor(x, dtype=None) for x in (q, k, v)], causal=causal,
                          block_q=bq, block_k=bk)
    assert out.dtype == np.float32
    ref = dense_attention_array(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                causal_pattern(nq, nk) if causal else None)
    assert_close(out, ref, atol=1e-6, rtol=0)


def test_lse_is_the_row_logsumexp():
    q, k, v = qkv(30, 50, d=16)
    _, lse = flash_attention_arrays(q, k, v, causal=True, block_q=8, block_k=8)
    s = q @ np.swapaxes(k, -1, -2) / 4.0
    s = np.where(causal_pattern(30, 50), s, -np.inf)
    m = s.max(-1, keepdims=True)
    np.testing.assert_allclose(lse, (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0],
                               atol=1e-12)


def test_key_mask_and_fully_masked_rows():
    q, k, v = qkv(9, 12, d=16)
    key_mask = np.ones((2, 12), dtype=bool)
    key_mask[0, 3:] = False
    key_mask[1] = False                                   # batch 1: every key masked
    t = [tensor(x, requires_grad=True) for x in (q, k, v)]
    out = flash_attention(*t, key_mask=key_mask, block_q=4, block_k=5)
    ref = dense_attention_array(q, k, v, key_mask[:, None, None, :])
    assert_close(out, ref, atol=1e-12)
    assert_equal(out.numpy()[1], 0)
    _, lse = flash_attention_arrays(q, k, v, key_mask=key_mask)
    assert np.all(np.isneginf(lse[1]))
    out.sum().backward()
    for x in t:
        assert np.all(np.isfinite(x.grad.numpy()))
    assert_equal(t[0].grad.numpy()[1], 0)


def test_causal_with_more_queries_than_keys_gives_zero_rows():
    # bottom-right alignment: query i sees keys j ≤ i + (Nk − Nq); the first rows see none
    q, k, v = qkv(10, 4, d=16)
    out = flash_attention(*[tensor(x) for x in (q, k, v)], causal=True, block_q=3,
                          block_k=2).numpy()
    np.testing.assert_allclose(out, dense_attention_array(q, k, v, causal_pattern(10, 4)),
                               atol=1e-12)
    np.testing.assert_array_equal(out[:, :, :6], 0)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = qkv(11, b=1, h=2, hkv=1, d=4)
    key_mask = np.array([[True] * 9 + [False] * 2])
    t = [tensor(x, requires_grad=True) for x in (q, k, v)]
    minitx.gradcheck(lambda a, b, c: flash_attention(a, b, c, causal=causal, key_mask=key_mask,
                                                     block_q=4, block_k=3), t)


def dense(q, k, v, causal):
    s = F.matmul(q, F.swapaxes(k, -1, -2)) * (1.0 / np.sqrt(q.shape[-1]))
    if causal:
        s = F.masked_fill(s, ~causal_pattern(q.shape[2], k.shape[2]), -np.inf)
    return F.matmul(F.softmax(s, axis=-1), v)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_dense(causal):
    q, k, v = qkv(70, d=8, seed=3)
    g = np.random.default_rng(4).standard_normal((2, 2, 70, 8))
    grads = []
    for fn in (lambda a, b, c: flash_attention(a, b, c, causal=causal, block_q=16, block_k=32),
               lambda a, b, c: dense(a, b, c, causal)):
        t = [tensor(x, requires_grad=True) for x in (q, k, v)]
        fn(*t).backward(g)
        grads.append([x.grad.numpy() for x in t])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=1e-10)


def test_layer_is_exact_and_grouped():
    layer = REGISTRY["flash"](16, 4, causal=True, num_kv_heads=2, block_q=4, block_k=4)
    assert layer.kind == "exact"
    q, k, v = qkv(13, h=4, hkv=2, d=4)
    out = layer.attend(*[tensor(x) for x in (q, k, v)])
    assert_close(out, dense_attention_array(q, k, v, layer.pattern(13)), atol=1e-12)
    with pytest.raises(ValueError, match="block_q"):
        REGISTRY["flash"](16, 4, block_q=0)
    with pytest.raises(ValueError, match="key_mask"):
        flash_attention(*[tensor(x) for x in (q, k, v)], key_mask=np.ones((2, 5), bool))


def test_memory_is_linear_in_n():
    """N = 2048, one head, D = 16, float64, forward + backward.

    Flash keeps q, k, v, O, dO, dq, dk, dv and their inputs' grads (a few N·D arrays) plus
    a handful of block_q × block_k tiles; dense must hold at least the N × N score matrix
    (N²·8 bytes = 32 MiB) — in practice scores, probabilities and their gradient.
    """
    n, d, block = 2048, 16, 128
    q, k, v = qkv(n, b=1, h=1, d=d, seed=5)
    g = np.ones((1, 1, n, d))

    def run(fn):
        t = [tensor(x, requires_grad=True) for x in (q, k, v)]
        fn(*t).backward(g)

    flash_peak = peak_bytes(lambda: run(lambda a, b, c: flash_attention(
        a, b, c, block_q=block, block_k=block)))
    bound = 24 * n * d * 8 + 16 * block * block * 8           # ≈ 8 MiB
    assert flash_peak < bound, (flash_peak, bound)
    dense_peak = peak_bytes(lambda: run(lambda a, b, c: dense(a, b, c, False)))
    assert dense_peak >= n * n * 8, dense_peak
    assert dense_peak > 3 * flash_peak
