"""The fast attention paths against dense attention, at the edges of their blocks (float64).

``F.scaled_dot_product_attention`` works by blocks of heads × query rows (``attention_blocks``,
sized by ``BLOCK_SCORES`` and ``CAUSAL_BLOCK``) and runs blocks of different heads in parallel
threads; ``flash_attention`` by tiles of ``block_q`` × ``block_k``. Both must give dense
attention's output and gradients for every size: N just below, at and above a block size,
Nq ≠ Nk (with the bottom-right causal alignment), grouped key/value heads, and masks that
leave a row with no key at all (zeros, never NaN). Here the block sizes are made small so
that small inputs cross their boundaries; the reference is dense NumPy with softmax's own VJP,
written out below independently of ``attention_backward``.
"""
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx.functional as F
from minitx.backend import device_of
from minitx.ops import sdpa as ops_attention
from minitx.ops import parallel
from support import assert_close, qkv, tensor

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - threadpoolctl is a test dependency
    threadpool_limits = None


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    """Every test here runs the threaded paths: two worker threads (``MINITX_THREADS``), and
    BLAS at two threads outside them. The suite gives each pytest-xdist worker its share of
    the cores, one on a 2-core machine (tests/conftest.py), which would leave these paths
    untested."""
    with mock.patch.dict(os.environ, {"MINITX_THREADS": "2"}):
        if threadpool_limits is None:
            yield
        else:
            with threadpool_limits(limits=2, user_api="blas"):
                yield


def test_the_blocks_here_do_run_in_two_threads():
    """The fixture above takes effect: attention's blocks go to two worker threads (host
    arrays; device arrays, the stand-in's included, go in order in the calling thread)."""
    seen = set()
    real = parallel.map_in_threads

    def spy(fn, items, like=None):
        def marked(item):                       # notes whether it runs in a worker thread
            seen.add(getattr(parallel._state, "worker", False))
            return fn(item)
        return real(marked, items, like)
    q, k, v = qkv(256, b=2, h=4, d=8)         # 2¹⁹ scores: more than one thread's worth
    with mock.patch.object(ops_attention, "map_in_threads", spy):
        F.scaled_dot_product_attention(tensor(q), tensor(k), tensor(v))
    assert parallel.thread_count() == 2
    threaded = parallel._blas_controller() is not None and device_of(tensor(q).data) == "cpu"
    assert seen == {threaded}, f"worker threads: expected {threaded}, got {seen}"


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
@given(block_case(), st.booleans(), st.sampled_from(["none", "bool", "bias"]),
       st.sampled_from(["rows", "heads", "all"]))
def test_sdpa_equals_dense_across_block_boundaries(case, causal, mask_kind, grouping):
    r, b, h, hkv, nq, nk, seed = case
    rng = np.random.default_rng(seed)
    q, k, v = qkv(nq, nk, b=b, h=h, hkv=hkv, d=3, dv=2, rng=rng)
    do = rng.standard_normal((b, h, nq, 2))
    allowed = bias = None
    if mask_kind == "bool":                      # (B, 1, Nq, Nk), one query row with no key
        allowed = rng.random((b, 1, nq, nk)) < 0.7
        allowed[0, 0, rng.integers(nq)] = False
    elif mask_kind == "bias":                    # (1, H, Nq, Nk), learned: gets a gradient
        bias = rng.standard_normal((1, h, nq, nk))
    # "rows": r query rows per block, one head; "heads": whole heads, 2 per block; "all": one
    scores, pack = {"rows": (r * (h // hkv) * nk, 1), "heads": (10 ** 9, 2 * (h // hkv) * nk * nq),
                    "all": (10 ** 9, 10 ** 9)}[grouping]
    with mock.patch.object(ops_attention, "BLOCK_SCORES", scores), \
            mock.patch.object(ops_attention, "PACK_SCORES", pack), \
            mock.patch.object(ops_attention, "CAUSAL_BLOCK", r):
        def fn(q, k, v, *rest):
            mask = rest[0] if rest else allowed
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
        out, grads = run(fn, (q, k, v), do, () if bias is None else (bias,))
        assert out._ctx.fn is ops_attention.SDPAFunction
    want, (dq, dk, dv, ds) = dense_reference(q, k, v, do, allowed, bias, causal)
    assert_close(out, want, rtol=1e-10, atol=1e-12)
    for got, ref in zip(grads, (dq, dk, dv)):
        assert np.all(np.isfinite(got.numpy()))
        assert_close(got, ref, rtol=1e-10, atol=1e-12)
    if bias is not None:
        assert_close(grads[3], ds.sum(axis=0, keepdims=True), rtol=1e-10, atol=1e-12)


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


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 40),
       st.integers(0, 40), st.booleans(), st.integers(1, 400), st.integers(1, 12),
       st.integers(1, 2000), st.integers(1, 4), st.integers(0, 5000))
def test_block_plan_covers_every_visible_score_once(b, hkv, g, nq, nk, causal, scores, rows,
                                                    pack, parts, parallel):
    """``attention_blocks``: every (batch, head, query, visible key) in exactly one block, for
    any sizes (empty sequences too) and any block limits; packed heads leave at least
    ``parts`` groups of (batch, key head) for the cores when there are that many and more
    than ``parallel`` scores in all."""
    count = np.zeros((b, hkv * g, nq, nk), dtype=int)
    groups = set()
    for bs, hs, hq, i0, i1, kend in ops_attention.attention_blocks(
            b, hkv, g, nq, nk, causal, scores=scores, causal_rows=rows, pack=pack,
            parts=parts, parallel=parallel):
        assert (hq.start, hq.stop) == (hs.start * g, hs.stop * g)
        assert i1 > i0 and kend > 0
        if causal:                  # at most half the rows; a quarter past 8·parallel scores
            part = 4 if b * hkv * g * nk * nq > 8 * parallel else 2
            assert i1 - i0 <= max(1, -(-nq // part))
        count[bs, hq, i0:i1, :kend] += 1
        groups.add((bs.start, hs.start))
    visible = np.tri(nq, nk, nk - nq, dtype=bool) if causal else np.ones((nq, nk), bool)
    assert np.all(count[:, :, visible] == 1)
    assert np.all(count[:, :, ~visible] <= 1)           # the diagonal blocks' masked part
    if visible.any() and b * hkv * g * nk * nq > parallel:
        assert len(groups) >= min(parts, b * hkv)


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


def test_threads_leave_blas_as_they_found_it_even_when_called_from_threads():
    """Calls from several user threads at once: the BLAS thread count lowered for the blocks
    is restored once the last one finishes (each restoring its own view would leave it at 1),
    and every call still gives the single-thread answer."""
    import threading
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    before = [lib["num_threads"] for lib in blas.info()]
    q, k, v = qkv(64, b=2, h=4, d=8)
    want = F.scaled_dot_product_attention(tensor(q), tensor(k), tensor(v)).numpy()
    results = []

    def call():
        for _ in range(5):
            results.append(F.scaled_dot_product_attention(tensor(q), tensor(k), tensor(v)).numpy())
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 15
    for got in results:
        np.testing.assert_array_equal(got, want)
    assert [lib["num_threads"] for lib in blas.info()] == before


def test_blas_is_restored_by_the_last_caller_out_not_the_first():
    """Interleaved callers (A in, B in, A out, B out): BLAS stays at one thread until B is
    out, then is back where it was — a per-call limit would restore A's saved value at A's
    exit and B's saved value (one thread) at B's exit."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    before = [lib["num_threads"] for lib in blas.info()]
    controller = parallel._blas_controller()
    a, b = parallel._one_thread_blas(controller), parallel._one_thread_blas(controller)
    a.__enter__()
    b.__enter__()
    assert all(lib["num_threads"] == 1 for lib in blas.info())
    a.__exit__(None, None, None)
    assert all(lib["num_threads"] == 1 for lib in blas.info())
    b.__exit__(None, None, None)
    assert [lib["num_threads"] for lib in blas.info()] == before
