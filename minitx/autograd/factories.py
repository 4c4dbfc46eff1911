"""Tensor factories with PyTorch's spellings: ``minitx.zeros(2, 3)``, ``minitx.randn(4, 8,
requires_grad=True)``, ``minitx.arange(10)``.

Every factory takes the shape as separate ints or as one tuple/list (``zeros(2, 3)`` ==
``zeros((2, 3))``), a ``dtype`` (a NumPy dtype or its name; float32 by default, as PyTorch's
default float) and ``requires_grad`` (floating dtypes only). Arrays are made on the active
backend (NumPy or CuPy); random draws come from minitx's one generator, so
``minitx.manual_seed`` makes them repeatable. The ``*_like`` factories take the shape and dtype
of a Tensor or array (and keep its device).
"""
from __future__ import annotations

import numbers

from .. import backend, validate
from .tensor import Tensor

__all__ = ["zeros", "ones", "full", "rand", "randn", "randint", "arange", "zeros_like",
           "ones_like", "full_like", "randn_like"]


def _shape(shape, who: str) -> tuple:
    """``(2, 3)`` or ``((2, 3),)`` (the two ways PyTorch takes a shape) → (2, 3)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return validate.int_tuple(list(shape), "shape", minimum=0, owner=who)


def _dtype(dtype, default="float32"):
    return backend.as_dtype(default if dtype is None else dtype)


def _make(array, requires_grad, who: str) -> Tensor:
    """Wrap an array already on its device (only floating Tensors may require gradients)."""
    if validate.boolean(requires_grad, "requires_grad", owner=who) and array.dtype.kind != "f":
        raise validate.OptionError(f"{who}: only floating-point tensors can require "
                                   f"gradients, got dtype {array.dtype}")
    return Tensor._wrap(array, requires_grad)


def zeros(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """A Tensor of zeros of ``shape`` (float32 unless ``dtype``)."""
    array = backend.xp().zeros(_shape(shape, "zeros"), dtype=_dtype(dtype))
    return _make(array, requires_grad, "zeros")


def ones(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """A Tensor of ones of ``shape`` (float32 unless ``dtype``)."""
    array = backend.xp().ones(_shape(shape, "ones"), dtype=_dtype(dtype))
    return _make(array, requires_grad, "ones")


def full(shape, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    """A Tensor of ``shape`` (a tuple, as PyTorch takes it) filled with ``fill_value``."""
    shape = _shape((shape,) if isinstance(shape, (tuple, list)) else (shape,), "full")
    fill_value = validate.real(fill_value, "fill_value", finite=False, owner="full")
    array = backend.xp().full(shape, fill_value, dtype=_dtype(dtype))
    return _make(array, requires_grad, "full")


def rand(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform draws in [0, 1) of ``shape`` (float32 unless ``dtype``, a floating one)."""
    draws = backend.rng().random(_shape(shape, "rand"))               # host, then device
    return _make(backend.xp().asarray(draws.astype(_float_dtype(dtype, "rand"))),
                 requires_grad, "rand")


def randn(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard normal draws N(0, 1) of ``shape`` (float32 unless ``dtype``, a floating one)."""
    draws = backend.rng().standard_normal(_shape(shape, "randn"))     # host, then device
    return _make(backend.xp().asarray(draws.astype(_float_dtype(dtype, "randn"))),
                 requires_grad, "randn")


def randint(low=0, high=None, size=None, *, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform integers in [low, high) of shape ``size`` (int64 unless ``dtype``), PyTorch's
    ``randint``: ``randint(high, size)``, ``randint(low, high, size)``, or by keyword
    (``randint(10, size=(2, 3))``). ``size`` is a tuple, as PyTorch takes it. The draws come
    from minitx's generator (``manual_seed``), so they differ from PyTorch's."""
    if size is None and isinstance(high, (tuple, list)):       # randint(high, size)
        low, high, size = 0, low, high
    elif high is None and size is not None:                     # randint(high, size=size)
        low, high = 0, low
    if high is None or size is None:
        raise validate.OptionError("randint: needs high and size: randint(high, size) or "
                                   f"randint(low, high, size), got low={low!r}, high={high!r}, "
                                   f"size={size!r}")
    low = validate.integer(low, "low", owner="randint")
    high = validate.integer(high, "high", minimum=low + 1, owner="randint",
                            expected=f"an int > low ({low})")
    size = _shape((size,) if isinstance(size, (tuple, list)) else (size,), "randint")
    draws = backend.rng().integers(low, high, size=size)               # host, then device
    return _make(backend.xp().asarray(draws.astype(_dtype(dtype, "int64"))), requires_grad,
                 "randint")


def _float_dtype(dtype, who: str):
    dtype = _dtype(dtype)
    if dtype.kind != "f":
        raise validate.OptionError(f"{who}: dtype must be a floating dtype (float16, float32, "
                                   f"float64), got {dtype}")
    return dtype


def arange(start, end=None, step=1, dtype=None, requires_grad: bool = False) -> Tensor:
    """start, start + step, … (< end), PyTorch's ``arange``: ``arange(5)`` is 0 … 4.

    The dtype is int64 when start, end and step are all ints, float32 otherwise (PyTorch's
    rule), unless ``dtype`` is given.
    """
    if end is None:
        start, end = 0, start
    values = [validate.real(v, name, owner="arange")
              for v, name in ((start, "start"), (end, "end"), (step, "step"))]
    if values[2] == 0:
        raise validate.OptionError("arange: step must be non-zero, got 0")
    integral = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    dtype = _dtype(dtype, "int64" if integral else "float32")
    if integral:
        start, end, step = int(start), int(end), int(step)
    array = backend.xp().arange(start, end, step).astype(dtype)
    return _make(array, requires_grad, "arange")


def _like(x, who: str):
    """(shape, dtype, xp) of a Tensor or array."""
    data = x.data if isinstance(x, Tensor) else x
    if not hasattr(data, "shape") or not hasattr(data, "dtype"):
        raise validate.OptionError(f"{who}: x must be a Tensor or an array, got "
                                   f"{type(x).__name__}")
    return data.shape, data.dtype, backend.get_array_module(data)


def zeros_like(x, dtype=None, requires_grad: bool = False) -> Tensor:
    """Zeros of x's shape, dtype (unless ``dtype``) and device."""
    shape, own, xp = _like(x, "zeros_like")
    return _make(xp.zeros(shape, dtype=_dtype(dtype, own)), requires_grad, "zeros_like")


def ones_like(x, dtype=None, requires_grad: bool = False) -> Tensor:
    """Ones of x's shape, dtype (unless ``dtype``) and device."""
    shape, own, xp = _like(x, "ones_like")
    return _make(xp.ones(shape, dtype=_dtype(dtype, own)), requires_grad, "ones_like")


def full_like(x, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    """``fill_value`` in x's shape, dtype (unless ``dtype``) and device."""
    shape, own, xp = _like(x, "full_like")
    fill_value = validate.real(fill_value, "fill_value", finite=False, owner="full_like")
    array = xp.full(shape, fill_value, dtype=_dtype(dtype, own))
    return _make(array, requires_grad, "full_like")


def randn_like(x, dtype=None, requires_grad: bool = False) -> Tensor:
    """N(0, 1) draws of x's shape and floating dtype (unless ``dtype``), on x's device."""
    shape, own, xp = _like(x, "randn_like")
    draws = backend.rng().standard_normal(shape).astype(_float_dtype(
        own if dtype is None else dtype, "randn_like"))
    return _make(xp.asarray(draws), requires_grad, "randn_like")
