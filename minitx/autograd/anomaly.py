"""Anomaly mode: an op that makes a NaN, or a backward that returns NaN or infinity, raises,
naming the op and the line of *your* code where its forward ran.

    with minitx.autograd.detect_anomaly():
        loss = model(x).log().mean()   # AnomalyError: Log.forward made nan from inputs
        loss.backward()                # without nan …; it ran at train.py:41 in step: `loss = …`

Two checks, each with its rule:

- **forward**: an output that holds a NaN although no input held one raises: the NaN was made
  there (log or sqrt of a negative number, 0/0, ∞ − ∞, 0·∞). Infinity in a forward output is
  allowed, because it is often meant: log(0) = −∞, the −∞ that a mask writes into attention
  scores (softmax turns it into a weight of 0), exp overflowing. Where an infinity does go wrong,
  a later op turns it into a NaN, and *that* op raises. A NaN that came in (in the data, or as a
  constant) passes on without an error: it was not made here.
- **backward**: a gradient with NaN or infinity raises (PyTorch's ``detect_anomaly`` checks
  this one only).

Off by default: while on, every op records where it was called from (a walk up the Python
stack, a few µs per op) and every output and gradient is scanned for non-finite values.
"""
from __future__ import annotations

import contextlib
import linecache
import math
import os
import sys

from .. import backend
from .checks import describe, input_index
from .tensor import Tensor

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "user_frame",
           "check_forward", "check_backward", "AnomalyError"]

_state = {"enabled": False}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class AnomalyError(RuntimeError):
    """Under anomaly mode, a forward made a NaN or a backward returned NaN or infinity."""


def is_anomaly_enabled() -> bool:
    return _state["enabled"]


def set_detect_anomaly(mode: bool) -> None:
    """Turn anomaly mode on or off for everything that follows."""
    _state["enabled"] = bool(mode)


@contextlib.contextmanager
def detect_anomaly(check_nan: bool = True):
    """Context manager (and decorator): anomaly mode inside, the previous mode restored after,
    even on an exception. ``check_nan=False`` only records where ops ran."""
    previous = _state["enabled"], _state.get("check_nan", True)
    _state["enabled"], _state["check_nan"] = True, bool(check_nan)
    try:
        yield
    finally:
        _state["enabled"], _state["check_nan"] = previous


def user_frame() -> str:
    """Where the caller's code, outside the minitx package, called into minitx:
    ``file:line in function: `source line` `` (the innermost such frame)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "inside minitx"
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    where = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
    return f"{where}: `{line}`" if line else where


def _has_nan(value) -> bool:
    """Whether ``value`` (an array, a Tensor, a Python or NumPy number, or a tuple or list of
    them, as an op's inputs come) holds a NaN."""
    if isinstance(value, (tuple, list)):
        return any(_has_nan(v) for v in value)
    if isinstance(value, Tensor):
        value = value.data
    if isinstance(value, float):
        return math.isnan(value)
    if getattr(value, "dtype", None) is None or value.dtype.kind not in "fc":
        return False                               # integers and bools hold no NaN
    return bool(backend.get_array_module(value).isnan(value).any())


def check_forward(fn, arrays, kwargs, out) -> str:
    """The forward check (see the module docstring), called by ``Function.apply`` under
    anomaly mode: raise if ``out``, the result of ``fn.forward(*arrays, **kwargs)``, holds a NaN
    that none of the inputs held. Returns where the forward ran, for the node's ``trace``."""
    where = user_frame()
    # out is scanned first: a finite output (nearly always) costs one pass and no more
    if _state.get("check_nan", True) and _has_nan(out) and \
            not _has_nan(list(arrays)) and not _has_nan(list(kwargs.values())):
        raise AnomalyError(
            f"{fn.__name__}.forward made nan from inputs without nan "
            f"(inputs: {', '.join(describe(a) for a in arrays)}; output: {describe(out)}); "
            f"it ran at {where}")
    return where


def check_backward(ctx, parent, grad) -> None:
    """The backward check: a gradient with NaN or infinity raises, naming the op and where its
    forward ran (called by the engine for each gradient, under anomaly mode)."""
    xp = backend.get_array_module(grad)
    if grad.dtype.kind == "f" and not bool(xp.isfinite(grad).all()):
        what = "nan" if bool(xp.isnan(grad).any()) else "inf"
        where = getattr(ctx, "trace", None) or "before anomaly mode was turned on"
        raise AnomalyError(
            f"{ctx.fn.__name__}.backward returned {what} in the gradient of input "
            f"{input_index(ctx, parent)} ({describe(grad)}); its forward ran at {where}")
