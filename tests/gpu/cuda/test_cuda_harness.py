"""The harness itself: a ThreadSanitizer run of the real kernels (both families) is clean, and
a deliberately broken copy of the fp16 tensor-core forward (the barrier after a K tile's cp.async
copies are waited for removed, see cuda_emu_harness.BROKEN_MARKER) is caught.

Why the broken kernel is caught reliably: cp.async.wait_group only guarantees the *calling
thread's* copies; the K rows a warp reads through ldmatrix were copied by all 128 threads. The
emulation lands each copy either at once or only at its thread's wait (at random), poisons shared
memory with 0xFF bytes (NaN) before every block, and every thread is a real OS thread that yields
at random at each scheduling point. Without the barrier a warp reads K rows another thread has
not landed yet (NaN in a fresh tile, the previous tile's keys later), and a fast warp's V(t) copy
can overwrite V(t-1) while a slow warp still multiplies by it, so the output is NaN or wrong.
Each run uses a different scheduling seed; all must fail.

The same broken copy also has the naive fp32 forward's rescale removed (``acc = alpha acc + p v``
becomes ``acc = acc + p v``, see cuda_emu_harness.NAIVE_RESCALE): the check the naive tests use
must reject it, while the unbroken naive kernel passes it.
"""
import os
import subprocess

import numpy as np
import pytest

import cuda_emu_harness as H
from minitx.backend import flash_cuda as fc


def _inputs(seed):
    rng = np.random.default_rng(seed)
    B, Hh, Nq, Nk, D = 1, 2, 33, 150, 32      # 3 key tiles of 64 (fp16 kernel)
    q = rng.standard_normal((B, Hh, Nq, D)).astype(np.float16)
    k = rng.standard_normal((B, Hh, Nk, D)).astype(np.float16)
    v = rng.standard_normal((B, Hh, Nk, D)).astype(np.float16)
    return q, k, v


def test_broken_source_removes_exactly_one_barrier():
    src = fc.kernel_source()
    broken = H.broken_source(src)
    assert src.count("__syncthreads()") == broken.count("__syncthreads()") + 1


def _detected(lib, seed):
    """True if the broken forward is wrong vs the reference, non-finite, or hangs."""
    q, k, v = _inputs(seed)
    o_ref, lse_ref, _ = H.ref_forward(q, k, v, causal=True)
    try:
        o, lse = H.run_isolated(lib, lambda launch, _lib: H.emu_forward(launch, q, k, v, causal=True),
                                timeout=60, seed=seed)
    except H.EmuTimeout:
        return True
    if not (np.all(np.isfinite(o)) and np.all(np.isfinite(lse))):
        return True
    bound = H.error_bounds(q, k, v, o_ref.astype(q.dtype), o_ref, q.dtype, causal=True)["o"]
    return bool(np.any(np.abs(o.astype(np.float64) - o_ref) > bound))


def test_correct_kernel_passes_the_same_check(emu_lib):
    for seed in range(2):
        assert not _detected(emu_lib, seed)


def test_missing_barrier_is_detected(broken_lib):
    results = [_detected(broken_lib, seed) for seed in range(4)]
    assert all(results), f"broken kernel slipped through in runs {results}"


@pytest.mark.slow
def test_threadsanitizer_reports_no_race(tsan_exe):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
    try:
        p = subprocess.run([tsan_exe], capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("TSan run of the emulated forward+backward timed out (deadlock?)")
    out = p.stdout + p.stderr
    assert "WARNING: ThreadSanitizer" not in out, out[-4000:]
    assert p.returncode == 0 and "EMU_MAIN OK" in out, out[-4000:]


def _naive_detected(lib, seed):
    """True if the naive forward is wrong vs the float64 reference (or non-finite, or hangs)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((1, 2, 33, 32), (1, 2, 150, 32), (1, 2, 150, 32)))
    o_ref, _, _ = H.ref_forward(q, k, v, causal=True)
    try:
        o, lse = H.run_isolated(lib, lambda launch, _lib: H.emu_forward(
            launch, q, k, v, causal=True, kernel="naive"), timeout=60, seed=seed)
    except H.EmuTimeout:
        return True
    if not (np.all(np.isfinite(o)) and np.all(np.isfinite(lse))):
        return True
    bound = H.error_bounds(q, k, v, o_ref.astype(q.dtype), o_ref, q.dtype, causal=True)["o"]
    return bool(np.any(np.abs(o.astype(np.float64) - o_ref) > bound))


def test_correct_naive_kernel_passes_the_same_check(emu_lib):
    assert not _naive_detected(emu_lib, 0)


def test_naive_forward_without_its_rescale_is_detected(broken_lib):
    results = [_naive_detected(broken_lib, seed) for seed in range(2)]
    assert all(results), f"broken naive kernel slipped through in runs {results}"
