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

import math
import os

import numpy

from .. import configuration

__all__ = [
    "get_backend", "set_backend", "get_array_module", "xp", "cupy_or_none", "gpu_available",
    "to_device", "device_of", "to_host", "to_device_of", "host_xp", "manual_seed", "rng",
    "as_dtype", "default_float", "scatter_add", "add_at",
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
            f"({_cupy['error']}); install it with `python -m pip install \".[gpu]\"`")
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
``numpy`` directly (``tests/core/test_backend.py`` scans for it)."""


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
    """``target[index] += values`` with repeated indices accumulating (in place): ``add_at``
    (an embedding's backward sends each row's gradient to its token's row this way). The fast
    layer may stand in for it (``minitx/fast/scatter.py``)."""
    fast = configuration.twin("scatter_add")
    if fast is not None:
        return fast(target, index, values)
    add_at(target, index, values)


def add_at(target, index, values) -> None:
    """``target[index] += values``, each repeated index adding once more (in place): NumPy's
    ``numpy.add.at`` on the host, ``add_at_in_order`` on a device. (``target[index] += values``
    itself would add only once per distinct index.)"""
    if get_array_module(target) is numpy:
        numpy.add.at(target, index, values)
    else:
        add_at_in_order(target, index, values)


def add_at_in_order(target, index, values) -> None:
    """``add_at`` without atomic additions: the bits of ``numpy.add.at``, on any device.

    CuPy's ``cupyx.scatter_add`` adds with atomics, in whatever order the threads arrive: an
    embedding's gradient then changes in its last bit from run to run, and a resumed training
    run drifts from the uninterrupted one. ``numpy.add.at`` adds the values to each place one
    after another, in the index's order. Here the same additions happen in the same order, in
    rounds: a stable sort by place numbers each value within its place (0 for the first value
    that adds to it, 1 for the second, …), and round r adds every place's value number r at
    once. No place occurs twice in a round, so ``target[places] += values`` is exact there; as
    many rounds as the most values any one place receives, one launch each.

    An index of integer arrays, integers and slices picks whole rows of the axes it does not
    cover (an embedding's backward: rows of the table), and the rows are what is sorted; any
    other index (a boolean mask, ``None``, ``...``) is sorted element by element.
    """
    xp = get_array_module(target)
    items = index if isinstance(index, tuple) else (index,)
    if target.size == 0 or any(getattr(i, "size", 1) == 0 for i in items):
        return                                                    # nothing adds anywhere
    rows_of = all(isinstance(i, (int, slice)) or getattr(i, "dtype", None) is not None
                  and i.dtype.kind in "iu" for i in items)
    lead = target.shape[:len(items)] if rows_of else target.shape    # the axes indexed
    if rows_of:                    # NumPy's add.at refuses an index out of range; CuPy wraps
        for axis, (i, n) in enumerate(zip(items, lead)):
            if getattr(i, "ndim", 0) and not (-n <= int(i.min()) and int(i.max()) < n):
                bad = int(i.min()) if int(i.min()) < -n else int(i.max())
                raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {n}")
    place = xp.arange(math.prod(lead)).reshape(lead)[index]        # each row's flat place
    if place.size == 0:
        return
    rest = target.shape[len(lead):]
    v = xp.broadcast_to(values, place.shape + rest).reshape(place.size, *rest)
    place = place.reshape(-1)
    by_place = xp.argsort(place, kind="stable")                   # each place's values in order
    place = place[by_place]
    first = xp.ones(place.size, dtype=bool)                       # a place's first value
    first[1:] = place[1:] != place[:-1]
    starts = xp.flatnonzero(first)
    number = xp.arange(place.size) - starts[xp.cumsum(first) - 1]    # 0, 1, … within a place
    by_round = xp.argsort(number, kind="stable")                  # round 0's values, round 1's…
    where = xp.unravel_index(place[by_round], lead)               # in rounds, once
    v = v[by_place[by_round]]
    add_once = _add_distinct(xp)
    low = 0
    for size in xp.bincount(number).tolist():                     # the rounds' sizes, on the host
        add_once(target, tuple(w[low:low + size] for w in where), v[low:low + size])
        low += size


def _add_distinct(xp):
    """``target[index] += values`` for an index whose places are all distinct: on a device one
    ``cupyx.scatter_add`` launch (no two threads meet, so its atomic additions are exactly the
    plain ones) instead of a gather, an add and a scatter."""
    if xp is numpy:
        def add(target, index, values):
            target[index] += values
        return add
    import cupyx  # noqa: PLC0415 - CuPy is only touched in this module
    return cupyx.scatter_add


from .npz import CheckpointError, read_npz  # noqa: E402  (host file I/O, re-exported)
