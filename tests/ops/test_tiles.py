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

from support import assert_close, qkv, tensor
import minitx.functional as F


def dense_reference(q, k, v, do, allowed=None, bias=None, causal=False):
    """Output and (dq, dk, dv, dbias-before-unbroadcast) of dense attention, by hand.

    S = Q Kᵀ/√D + bias, masked to −inf; P = softmax(S) (0 on a row with no key); O = P V.
    Backward through the dense graph: dV = Pᵀ dO, dP = dO Vᵀ,
    dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K/√D, dK = dSᵀ Q/√D, with K, V repeated over
    the G query heads that share them and their gradients summed back.
    """
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = h // hkv
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(kk, -1, -2) / np.sqrt(d)
    if bias is not None:
        s = s + bias
    mask = np.ones((b, h, nq, nk), dtype=bool)
    if allowed is not None:
        mask &= allowed
    if causal:
        mask &= np.tri(nq, nk, nk - nq, dtype=bool)
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total > 0, total, 1)
    o = p @ vv
    dvv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kk / np.sqrt(d)
    dkk = np.swapaxes(ds, -1, -2) @ q / np.sqrt(d)
    fold = lambda x: x.reshape(b, hkv, g, nk, x.shape[-1]).sum(axis=2)      # noqa: E731
    return o, (dq, fold(dkk), fold(dvv), ds)


def run(fn, arrays, do, extra=()):
    """Forward + backward of ``fn`` on float64 tensors: output and the inputs' gradients."""
    ts = [tensor(x, requires_grad=True) for x in tuple(arrays) + tuple(extra)]
    out = fn(*ts)
    out.backward(tensor(do))
    return out, [t.grad for t in ts]


@st.composite
def block_case(draw):
    """A block size r and sizes N ∈ {m·r − 1, m·r, m·r + 1} for queries and keys."""
    r = draw(st.sampled_from([2, 3, 4, 8]))
    near = lambda: st.builds(lambda m, e: max(1, m * r + e),                 # noqa: E731
                             st.integers(1, 3), st.sampled_from([-1, 0, 1]))
    nq = draw(near())
    nk = draw(st.one_of(st.just(nq), near()))
    b = draw(st.integers(1, 2))
    hkv = draw(st.sampled_from([1, 2]))
    h = hkv * draw(st.sampled_from([1, 2]))
    return r, b, h, hkv, nq, nk, draw(st.integers(0, 2 ** 16))


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
