"""Independent pieces of work on every core: one Python thread per core, BLAS one thread each.

The fast twin of a plain loop, ``[fn(item) for item in items]`` (the reference in
``ops/flash.py``): the same calls on the same items, each writing its own slice of the outputs
in the same order of operations, so the results are identical — only the time differs.

Why it helps: NumPy runs an element-wise ufunc (the softmax's ``exp``, its row max and sums) on
one core, and its BLAS splits a matmul over all of them — but attention's matmuls are small (a
few hundred query rows against D = 64) and gain little from the split. Heads of attention are
independent, so running different heads in different threads, each with a one-thread BLAS,
keeps every core busy with the matmuls *and* the element-wise passes. NumPy releases the GIL
inside ufuncs and matmul, so plain threads do run in parallel.

The BLAS thread count is lowered for the duration with ``threadpoolctl`` (an optional extra:
``pip install ".[fast]"``); without it, or with ``MINITX_THREADS=1``, or on a GPU, or with a
single core, the work runs in order, in the calling thread.
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import backend, configuration

__all__ = ["map_in_threads", "thread_count"]

_state = threading.local()          # marks the worker threads: no pools inside pools
_pool = _controller = _blas_limit = None
_pool_size = _blas_users = 0
_lock = threading.Lock()


def thread_count() -> int:
    """Threads to use: ``MINITX_THREADS`` if set, else the cores this process may run on."""
    env = os.environ.get("MINITX_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"MINITX_THREADS must be a positive integer, got {env!r}")
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                  # not on Linux
        return os.cpu_count() or 1


def _blas_controller():
    """threadpoolctl's controller over the loaded BLAS libraries, or None without it."""
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController  # noqa: PLC0415 - optional extra
            _controller = ThreadpoolController()
        except ImportError:
            _controller = False
    return _controller or None


def _executor(n):
    """The shared pool of ``n`` worker threads (made again if ``n`` changed)."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != n:
            _pool = ThreadPoolExecutor(n, thread_name_prefix="minitx",
                                       initializer=setattr, initargs=(_state, "worker", True))
            _pool_size = n
        return _pool


def map_in_threads(fn, items, like=None):
    """``[fn(item) for item in items]``, the items spread over the cores when that is possible.

    ``like``: an array the work runs on; only NumPy (host) work is threaded. ``fn`` must be
    safe to run concurrently on different items (write disjoint outputs, draw no random
    numbers). Exceptions propagate as in the plain loop.
    """
    items = list(items)
    n = min(thread_count(), len(items))
    controller = _blas_controller() if n > 1 else None
    if (controller is None or getattr(_state, "worker", False)
            or (like is not None and backend.device_of(like) != "cpu")):
        return [fn(item) for item in items]
    with _one_thread_blas(controller):
        return list(_executor(n).map(fn, items))


@contextlib.contextmanager
def _one_thread_blas(controller):
    """BLAS at one thread while any caller is inside; the first one in lowers it, the last
    one out restores it (callers in several threads at once must not restore each other's
    lowered value)."""
    global _blas_users, _blas_limit
    with _lock:
        if _blas_users == 0:
            _blas_limit = controller.limit(limits=1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _lock:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limit.restore_original_limits()
                _blas_limit = None


configuration.register_twin("map_in_threads", map_in_threads)
