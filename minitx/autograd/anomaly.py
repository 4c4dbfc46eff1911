"""Anomaly mode: a backward that produces NaN or infinity raises, naming the op and the line
of *your* code where its forward ran.

    with minitx.autograd.detect_anomaly():
        loss = model(x).log().mean()
        loss.backward()      # RuntimeError: Log.backward returned nan in the gradient of
                             # input 0 …; its forward ran at train.py:41 in step: `loss = …`

Off by default: while on, every op records where it was called from (a walk up the Python
stack, a few µs per op) and every gradient is scanned for non-finite values. PyTorch's
``torch.autograd.detect_anomaly`` does the same.
"""
from __future__ import annotations

import contextlib
import linecache
import os
import sys

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "user_frame",
           "AnomalyError"]

_state = {"enabled": False}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class AnomalyError(RuntimeError):
    """A backward, under anomaly mode, produced NaN or infinity."""


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
