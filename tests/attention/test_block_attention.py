"""``block_attention`` (MoBA's and NSA's attention over chosen blocks, each block read once for
all its queries) against ``gathered_attention`` over the same keys (each query's own copy):
outputs and float64 gradients on a hypothesis grid of sizes, blocks (repeated, partial, out of
the keys' range), masks (rows with nothing allowed included); and its memory, which holds no
per-query copy of the keys."""
import math
import tracemalloc

import numpy as np
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention.selection import block_attention, gathered_attention
from support import assert_close, qkv, tensor


def _device(a):
    """A host index or mask array on the active backend, its dtype kept."""
    return tensor(a, dtype=None).data


def _both(q, k, v, blocks, allowed, block, grad_out):
    """(output, dq, dk, dv) of block_attention and of gathered_attention over the same keys."""
    nk = k.shape[2]
    keys = blocks[..., None] * block + np.arange(block)                 # (B, H, Nq, c, b)
    index = np.minimum(keys, nk - 1).reshape(keys.shape[:3] + (-1,))
    flat = allowed.reshape(index.shape)
    scale = 1.0 / math.sqrt(q.shape[-1])
    results = []
    for run in (lambda Q, K, V: block_attention(Q, K, V, _device(blocks), _device(allowed),
                                                block, scale),
                lambda Q, K, V: gathered_attention(Q, K, V, _device(index), _device(flat),
                                                   scale)[0]):
        Q, K, V = (tensor(a, requires_grad=True) for a in (q, k, v))
        out = run(Q, K, V)
        (out * tensor(grad_out)).sum().backward()
        results.append((out, Q.grad, K.grad, V.grad))
    return results


@settings(deadline=None)
@given(n=st.integers(1, 17), extra=st.integers(0, 9), block=st.integers(1, 5),
       c=st.integers(1, 4), share=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 16))
def test_equals_gathered_attention_with_its_gradients(n, extra, block, c, share, seed):
    rng = np.random.default_rng(seed)
    nk = n + extra
    nb = -(-nk // block)
    q, k, v = qkv(n, nk, b=2, h=2, d=3, dv=5, seed=seed)
    blocks = rng.integers(0, nb, (2, 2, n, c))              # repeats allowed, the last partial
    keys = blocks[..., None] * block + np.arange(block)
    allowed = (rng.random((2, 2, n, c, block)) < share) & (keys < nk)
    grad_out = rng.standard_normal((2, 2, n, 5))
    by_block, gathered = _both(q, k, v, blocks, allowed, block, grad_out)
    for got, want, what in zip(by_block, gathered, ("output", "dq", "dk", "dv")):
        assert_close(got, want, atol=1e-12, rtol=1e-12, err_msg=what)
    # a query that may read nothing gets zeros, and passes no gradient to its query
    empty = ~allowed.any(axis=(-1, -2))
    assert np.all(minitx.backend.to_host(by_block[0].data)[empty] == 0)
    assert np.all(minitx.backend.to_host(by_block[1])[empty] == 0)


def test_memory_holds_no_copy_of_the_keys_per_query():
    """N = 2,048 queries reading 3 blocks of 64 keys, D = 64, float32: the gathered form copies
    2·N·3·64·D numbers (keys and values, 201 MB); by blocks, forward and backward together
    stay under an eighth of that (scores N·3·64 and one query copy per block, N·3·D)."""
    n, block, c, d = 2048, 64, 3, 64
    rng = np.random.default_rng(0)
    q, k, v = (tensor(a, dtype="float32", requires_grad=True)
               for a in qkv(n, b=1, h=1, d=d, dtype="float32"))
    own = np.arange(n) // block
    blocks = np.stack([own, np.maximum(own - 1, 0), rng.integers(0, n // block, n)], -1)
    allowed = np.ones((1, 1, n, c, block), dtype=bool)
    copy = 2 * n * c * block * d * 4
    tracemalloc.start()
    out = block_attention(q, k, v, _device(blocks[None, None]), _device(allowed), block, 0.125)
    out.sum().backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < copy / 8, (peak, copy)
