"""Threads over heads (``minitx/fast/parallel.py``): the same numbers as the plain loop.

``map_in_threads`` is the fast twin of ``[fn(item) for item in items]``: the blocked SDPA and
the tiled flash attention hand it groups of (batch, key head) that write disjoint slices. Here
every test runs with two worker threads (the suite gives each pytest-xdist worker one core,
which would leave the threaded paths untested), checks that the threads are really used, that
the results are bit for bit those of the loop, and that BLAS's thread count is restored.
"""
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx.backend import device_of
from minitx.fast import parallel
from minitx.fast import sdpa as fast_sdpa
from support import qkv, tensor, need

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
    with mock.patch.object(fast_sdpa, "map_in_threads", spy):
        F.scaled_dot_product_attention(tensor(q), tensor(k), tensor(v))
    assert parallel.thread_count() == 2
    threaded = parallel._blas_controller() is not None and device_of(tensor(q).data) == "cpu"
    assert seen == {threaded}, f"worker threads: expected {threaded}, got {seen}"


def test_threads_leave_blas_as_they_found_it_even_when_called_from_threads():
    """Calls from several user threads at once: the BLAS thread count lowered for the blocks
    is restored once the last one finishes (each restoring its own view would leave it at 1),
    and every call still gives the single-thread answer."""
    import threading
    threadpoolctl = need("threadpoolctl")
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
    threadpoolctl = need("threadpoolctl")
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


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 2]), st.integers(1, 70), st.booleans(),
       st.integers(0, 2 ** 16))
def test_threaded_results_are_the_loop_results_bit_for_bit(b, hkv, n, causal, seed):
    """Two threads against one (``MINITX_THREADS=1``: the same twin runs its loop in the
    calling thread): flash attention's tiles and the blocked SDPA's blocks are the same
    computations either way, so outputs and gradients are identical, not just close; and
    both are the reference's to rounding."""
    q, k, v = qkv(n, b=b, h=2 * hkv, hkv=hkv, d=4, seed=seed)
    do = np.random.default_rng(seed + 1).standard_normal((b, 2 * hkv, n, 4))
    calls = (lambda *t: F.flash_attention(*t, causal=causal, block_q=8, block_k=16),
             lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal, enable_gqa=True))
    for call in calls:
        results = []
        for threads, fast in (("2", True), ("1", True), ("2", False)):
            with mock.patch.dict(os.environ, {"MINITX_THREADS": threads}), \
                    minitx.using_config(fast=fast):
                ts = [tensor(a, requires_grad=True) for a in (q, k, v)]
                out = call(*ts)
                out.backward(tensor(do))
            results.append([out.numpy()] + [t.grad.numpy() for t in ts])
        for threaded, in_order, reference in zip(*results):
            np.testing.assert_array_equal(threaded, in_order)
            np.testing.assert_allclose(threaded, reference, rtol=1e-12, atol=1e-13)


def test_without_the_fast_layer_no_thread_is_used():
    """With the switch off, flash attention runs its loop in the calling thread."""
    seen = []
    real = parallel.map_in_threads
    q, k, v = qkv(256, b=2, h=4, d=8)
    with mock.patch.dict(minitx.configuration._TWINS,
                         {"map_in_threads": lambda *a, **kw: seen.append(1) or real(*a, **kw)}):
        with minitx.using_config(fast=False):
            F.flash_attention(tensor(q), tensor(k), tensor(v))
        assert not seen
        F.flash_attention(tensor(q), tensor(k), tensor(v))
        assert seen
