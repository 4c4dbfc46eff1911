"""The array-module switch: NumPy on the CPU, CuPy on an NVIDIA GPU.

This is the only module that imports CuPy (lazily, on demand). Compute code asks
``get_array_module(*arrays)`` for the module its inputs live in and writes its math once
against that ``xp`` (Chainer's pattern)::

    xp = get_array_module(x)          # numpy or cupy
    y = xp.exp(x - x.max(axis=-1, keepdims=True))

The active backend decides where *new* arrays are created (``minitx.tensor([...])``,
parameter initialisation, random numbers). It starts as ``$MINITX_BACKEND`` (default
``"numpy"``) and changes with ``set_backend``.

Random numbers come from one ``numpy.random.Generator`` seeded by ``manual_seed``; draws are
made on the host and moved to the device, so a seed gives the same numbers on both backends.
"""
from __future__ import annotations

import os

import numpy

__all__ = [
    "get_backend", "set_backend", "get_array_module", "xp", "cupy_or_none", "gpu_available",
    "to_device", "device_of", "to_host", "to_device_of", "host_xp", "manual_seed", "rng",
    "as_dtype", "default_float", "scatter_add", "row_max", "tune_host_allocator",
    "describe_device", "read_npz", "CheckpointError",
]

_BACKENDS = ("numpy", "cupy")
_state = {"name": "numpy", "xp": numpy}
_cupy = {"module": None, "tried": False, "error": None}


def cupy_or_none():
    """Return the ``cupy`` module if it imports, else ``None`` (never raises)."""
    if not _cupy["tried"]:
        _cupy["tried"] = True
        try:
            import cupy  # noqa: PLC0415 - the one place CuPy is imported
            _cupy["module"] = cupy
        except Exception as exc:  # ImportError, or a broken CUDA install
            _cupy["error"] = f"{type(exc).__name__}: {exc}"
    return _cupy["module"]


def gpu_available() -> bool:
    """True when CuPy imports *and* a CUDA device can be used."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        return bool(cp.is_available())
    except Exception:
        return False


def _require_cupy():
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError(
            "backend 'cupy' requested but CuPy is not installed "
            f"({_cupy['error']}); install it with `pip install minitx[gpu]`")
    if not gpu_available():
        raise RuntimeError(
            "backend 'cupy' requested but no CUDA GPU is available "
            "(cupy.is_available() is False)")
    return cp


def set_backend(name: str) -> None:
    """Make ``name`` ("numpy" or "cupy") the array module for newly created arrays.

    Raises ``ValueError`` for an unknown name and ``RuntimeError`` (saying whether CuPy is
    missing or there is no GPU) when CuPy cannot be used; the backend is then unchanged.
    """
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
    module = numpy if name == "numpy" else _require_cupy()
    _state["name"], _state["xp"] = name, module


def get_backend() -> str:
    """The name of the active backend: "numpy" or "cupy"."""
    return _state["name"]


def xp():
    """The active array module (``numpy`` or ``cupy``)."""
    return _state["xp"]


def get_array_module(*arrays):
    """The array module that ``arrays`` live in: ``cupy`` if any is a CuPy array, else ``numpy``.

    Tensors are accepted too (their ``.data`` array is inspected). A CuPy array is tested
    first: its own ``.data`` is a device memory pointer, not an array.
    """
    cp = _cupy["module"]
    if cp is not None:
        for a in arrays:
            if isinstance(a, cp.ndarray) or isinstance(getattr(a, "data", None), cp.ndarray):
                return cp
    return numpy


def device_of(array) -> str:
    """"cuda" for a CuPy array, "cpu" otherwise."""
    cp = _cupy["module"]
    return "cuda" if cp is not None and isinstance(array, cp.ndarray) else "cpu"


def to_device(array, device: str):
    """Move ``array`` to "cpu" (a NumPy array) or "cuda" (a CuPy array)."""
    if device == "cpu":
        cp = _cupy["module"]
        if cp is not None and isinstance(array, cp.ndarray):
            return cp.asnumpy(array)
        return numpy.asarray(array)
    if device in ("cuda", "gpu"):
        return _require_cupy().asarray(array)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


host_xp = numpy
"""The host array module, named for what it is: compute code writes ``host_xp.arange(n)`` for
host-only metadata (pattern pictures, index tables that are moved to the data once), and never
``numpy`` directly (``tests/test_backend.py`` scans for it)."""


def to_host(x):
    """A NumPy array of ``x`` (a NumPy/CuPy array, a Tensor, a Python scalar or list): the one
    explicit device → host transfer, for printing, plotting and test references."""
    if not isinstance(x, numpy.ndarray) and callable(getattr(x, "numpy", None)):
        return x.numpy()                                       # a Tensor
    return to_device(x, "cpu")


def to_device_of(array, *like):
    """``array`` on the device of ``like`` (arrays or Tensors): a host array meeting device data
    is copied there once; anything already in place (or not an array) is returned as is.

    This is how host data (masks, token ids, index arrays, constants) enters the GPU: once, at
    the boundary of the op or function that receives it.
    """
    cp = _cupy["module"]
    if cp is None or not isinstance(array, numpy.ndarray):
        return array
    if get_array_module(*like) is cp:
        return cp.asarray(array)
    return array


# --- dtypes ---------------------------------------------------------------------------------

_FLOATS = (numpy.dtype("float16"), numpy.dtype("float32"), numpy.dtype("float64"))


def default_float():
    """The dtype Python floats become: float32 (like PyTorch)."""
    return numpy.dtype("float32")


def as_dtype(dtype):
    """Turn a NumPy dtype, a dtype's name ("float32") or a type into a ``numpy.dtype``."""
    try:
        return numpy.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be a NumPy dtype or its name, got {dtype!r}") from exc


# --- random numbers -------------------------------------------------------------------------

_rng = {"gen": numpy.random.default_rng(0)}


def manual_seed(seed: int) -> None:
    """Seed every random draw minitx makes (initialisers, dropout, random features, ...)."""
    if not isinstance(seed, (int, numpy.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    _rng["gen"] = numpy.random.default_rng(int(seed))


def rng() -> numpy.random.Generator:
    """The shared host-side generator (reseeded by ``manual_seed``)."""
    return _rng["gen"]


# --- host allocator -------------------------------------------------------------------------

def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse instead of returning it to the OS (Linux, glibc).

    Attention allocates and frees many same-sized arrays of (B, H, N, N) scores per step.
    By default glibc serves such large blocks with fresh ``mmap`` pages and unmaps them
    on free, so every step pays for the kernel to fault in and zero the pages again —
    measured here as about 40% of a fused attention forward+backward. Raising the mmap
    threshold to its maximum (32 MiB) and the trim threshold to 1 GiB makes ``free`` keep
    the memory in the heap for the next step (a caching allocator, as PyTorch has).
    The cost: the process keeps its peak heap. Not a side effect of importing minitx: the CLI,
    the examples and the benchmarks call it (``MINITX_MALLOC_TUNING=0`` turns it off); returns
    True when the settings were applied.
    """
    if os.environ.get("MINITX_MALLOC_TUNING", "1") == "0":
        return False
    try:
        import ctypes  # noqa: PLC0415
        import platform  # noqa: PLC0415
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3            # from <malloc.h>
        ok = libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        ok &= libc.mallopt(m_trim_threshold, 1 << 30)
        return bool(ok)
    except Exception:                                          # never fail an import for this
        return False


def _add_rows(target, index, values) -> None:
    """``numpy.add.at(target, index, values)`` for a 1-d integer ``index`` of rows, by segments
    of the sorted index (see ``scatter_add``)."""
    if index.min() < 0:                        # one name per row: -1 and n − 1 are one row
        index = numpy.where(index < 0, index + target.shape[0], index)
    order = numpy.argsort(index, kind="stable")
    rows = index[order]
    starts = numpy.flatnonzero(numpy.concatenate(([True], rows[1:] != rows[:-1])))
    target[rows[starts]] += numpy.add.reduceat(values[order], starts, axis=0)


def row_max(x):
    """``x.max(axis=-1, keepdims=True)``: each row's largest entry (softmax's shift).

    For the softmax of attention and ``softmax``; it lives here, where the array modules are
    told apart. On NumPy, for a C-contiguous ``x``, as ``argmax`` and a gather: NumPy's
    ``max`` along the last axis runs row by row, ``argmax`` is vectorised (measured
    86 → 23 µs at (64, 4, 8, 8), 168 → 71 µs at (2, 4, 256, 256)). ``argmax`` picks a row's
    first NaN, so a row with a NaN gives NaN, as ``max`` does; a row of −inf gives −inf.
    """
    k = x.shape[-1]
    if x.__class__ is not numpy.ndarray or k == 0 or not x.flags.c_contiguous:
        return x.max(axis=-1, keepdims=True)
    at = x.argmax(axis=-1).reshape(-1)
    at += numpy.arange(0, at.size * k, k)                # the flat index of each row's argmax
    return x.reshape(-1)[at].reshape(x.shape[:-1] + (1,))


def _init_from_env() -> None:
    name = os.environ.get("MINITX_BACKEND", "numpy").strip().lower() or "numpy"
    set_backend(name)


_init_from_env()


def describe_device() -> str:
    """Where new arrays compute: "CPU (NumPy x.y)" or "GPU <id>: <name> (CuPy x.y)"."""
    if _state["name"] == "numpy":
        return f"CPU (NumPy {numpy.__version__})"
    cp = _state["xp"]
    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id).get("name", b"?")
    name = name.decode() if isinstance(name, bytes) else str(name)
    return f"GPU {dev.id}: {name} (CuPy {cp.__version__})"


def scatter_add(target, index, values) -> None:
    """``target[index] += values`` with repeated indices accumulating (in place).

    NumPy: ``numpy.add.at``, except for whole rows picked by a 1-d integer index (an
    embedding's backward), which are summed by segments instead: a stable sort of the index,
    ``numpy.add.reduceat`` over the runs of equal rows, one ``+=`` per distinct row —
    measured against NumPy 2.4's ``add.at``: 4.1× faster at 640 rows of 64 from a vocabulary
    of 11, 1.6× at 8,192 rows of 256 from 50, 4.1× at 1,024 of 64 from 100; where most rows are
    distinct ``add.at`` is as fast or faster (0.74× at 4,608 rows from 4,192), but an
    embedding's rows repeat. The stable sort keeps each row's values in their order.
    CuPy: ``cupyx.scatter_add``.
    """
    if get_array_module(target) is numpy:
        if index.__class__ is numpy.ndarray and index.ndim == 1 and index.dtype.kind in "iu" \
                and index.size > 1 and values.__class__ is numpy.ndarray \
                and values.shape == index.shape + target.shape[1:]:
            _add_rows(target, index, values)
        else:
            numpy.add.at(target, index, values)
    else:
        import cupyx  # noqa: PLC0415 - CuPy is only touched in this module
        cupyx.scatter_add(target, index, values)


from .npz import CheckpointError, read_npz  # noqa: E402  (host file I/O, re-exported)
