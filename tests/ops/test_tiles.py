"""The tiled attention paths against dense attention, at the edges of their tiles (float64).

``flash_attention`` works by tiles of ``block_q`` × ``block_k``; the fused sparse op by chunks
of query blocks. Both must give dense attention's output and gradients for every size: N just
below, at and above a tile size, Nq ≠ Nk (with the bottom-right causal alignment), grouped
key/value heads, and masks that leave a row with no key at all (zeros, never NaN). The
reference is dense NumPy with softmax's own VJP, written out below independently of
``attention_backward``. (The blocked SDPA of the fast layer is tested the same way in
``tests/fast/test_fast_sdpa.py``.)
"""
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_reference import block_case, dense_reference
from support import assert_close, qkv, tensor
import minitx.functional as F


def run(fn, arrays, do, extra=()):
    """Forward + backward of ``fn`` on float64 tensors: output and the inputs' gradients."""
    ts = [tensor(x, requires_grad=True) for x in tuple(arrays) + tuple(extra)]
    out = fn(*ts)
    out.backward(tensor(do))
    return out, [t.grad for t in ts]


@settings(max_examples=60, deadline=None)
@given(block_case(), st.booleans(), st.booleans(), st.integers(1, 3))
def test_flash_equals_dense_across_tile_boundaries(case, causal, padded, ratio):
    r, b, h, hkv, nq, nk, seed = case
    rng = np.random.default_rng(seed)
    q, k, v = qkv(nq, nk, b=b, h=h, hkv=hkv, d=3, dv=2, rng=rng)
    do = rng.standard_normal((b, h, nq, 2))
    key_mask = None
    if padded:                                   # the last batch sees no key at all
        key_mask = rng.random((b, nk)) < 0.7
        key_mask[-1] = False
    out, grads = run(lambda q, k, v: F.flash_attention(q, k, v, causal=causal,
                                                       key_mask=key_mask, block_q=r,
                                                       block_k=r * ratio), (q, k, v), do)
    allowed = None if key_mask is None else key_mask[:, None, None, :]
    want, refs = dense_reference(q, k, v, do, allowed, None, causal)
    assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, ref in zip(grads, refs[:3]):
        assert np.all(np.isfinite(got.numpy()))
        assert_close(got, ref, rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["local", "dilated", "strided", "fixed"]), st.integers(1, 40),
       st.sampled_from([1, 2, 3, 16]), st.integers(1, 50), st.booleans(), st.integers(0, 2 ** 16))
def test_sparse_chunks_equal_dense_under_the_pattern(name, n, block, chunk, causal, seed):
    """The fused sparse op by chunks of ``SPARSE_CHUNK`` scores (here as small as one query
    block per chunk), against dense attention masked to ``pattern(n)``."""
    from minitx.attention import REGISTRY
    from minitx.attention import sparse
    rng = np.random.default_rng(seed)
    q, k, v = qkv(n, b=2, h=2, d=3, rng=rng)
    do = rng.standard_normal((2, 2, n, 3))
    layer = REGISTRY[name](6, 2, causal=causal, block_size=block)
    with mock.patch.object(sparse, "SPARSE_CHUNK", chunk):
        out, grads = run(layer.attend, (q, k, v), do)
    assert out._ctx.fn is sparse.BlockedSparseFunction
    want, refs = dense_reference(q, k, v, do, layer.pattern(n), None, False)
    assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, ref in zip(grads, refs[:3]):
        assert_close(got, ref, rtol=1e-10, atol=1e-12)
