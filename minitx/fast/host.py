"""The host's own settings for speed: OpenBLAS's idle threads, and glibc's allocator.

Neither changes a single number minitx computes; both change how long it takes.

- **OpenBLAS's spinning threads.** After every matmul NumPy's OpenBLAS keeps each idle worker
  thread spinning for 2²⁸ cycles. The spinning thread takes a core from the element-wise passes
  that follow and from attention's worker threads (``fast/parallel.py``).
  ``OPENBLAS_THREAD_TIMEOUT=20`` (2²⁰ cycles, 256 times shorter) keeps the threads awake for the
  next of a run of small matmuls and asleep during a longer element-wise stretch. OpenBLAS reads the
  variable once, when NumPy loads it, so ``prepare_blas`` runs first when minitx is imported
  (``minitx/fast/__init__.py``) and takes effect only when minitx is imported before NumPy; a
  value the user set is kept, and with ``MINITX_FAST=0`` nothing is set.
- **A caching host allocator** (``tune_host_allocator``, called by the CLI, the examples and the
  benchmarks, never on import: it changes the whole process's allocator).

Their measured effect is in ``benchmarks/README.md``.
"""
from __future__ import annotations

import os
import sys

from .. import configuration

__all__ = ["prepare_blas", "tune_host_allocator"]


def prepare_blas() -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT=20`` for this process when the fast layer is on and NumPy
    is not loaded yet (after that OpenBLAS would not read it); a value already set is kept.
    Returns whether the variable now holds minitx's value."""
    if not configuration.config.fast or "numpy" in sys.modules:
        return False
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
    return os.environ["OPENBLAS_THREAD_TIMEOUT"] == "20"


def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse instead of returning it to the OS (Linux, glibc).

    Attention allocates and frees many same-sized (B, H, N, N) score arrays per step. By
    default glibc serves such large blocks with fresh ``mmap`` pages and unmaps them on free,
    so every step pays for the kernel to fault in and zero the pages again. Raising the mmap
    threshold to its maximum (32 MiB) and the trim threshold to 1 GiB makes ``free`` keep the
    memory in the heap for the next step (a caching allocator, as PyTorch has). The cost: the
    process keeps its peak heap. Returns True when the settings were applied; does nothing
    (False) with the fast layer off, with ``MINITX_MALLOC_TUNING=0``, or off Linux/glibc.
    """
    if not configuration.config.fast or os.environ.get("MINITX_MALLOC_TUNING", "1") == "0":
        return False
    try:
        import ctypes  # noqa: PLC0415 - only where the allocator is tuned
        import platform  # noqa: PLC0415
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3            # from <malloc.h>
        ok = libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        ok &= libc.mallopt(m_trim_threshold, 1 << 30)
        return bool(ok)
    except (OSError, AttributeError):          # no libc to load, or no mallopt in it
        return False
