"""Global switch for graph recording: ``no_grad()`` and ``enable_grad()``."""
from __future__ import annotations

import contextlib

_state = {"enabled": True}


def is_grad_enabled() -> bool:
    """True when new operations record the graph needed for ``backward``."""
    return _state["enabled"]


def set_grad_enabled(mode: bool) -> None:
    _state["enabled"] = bool(mode)


@contextlib.contextmanager
def _grad_mode(mode: bool):
    previous = _state["enabled"]
    _state["enabled"] = mode
    try:
        yield
    finally:
        _state["enabled"] = previous


def no_grad():
    """Context manager (also usable as a decorator) under which no graph is recorded.

    >>> with minitx.no_grad():
    ...     y = model(x)          # y.requires_grad is False, nothing is saved for backward
    """
    return _grad_mode(False)


def enable_grad():
    """Context manager that turns graph recording back on inside ``no_grad``."""
    return _grad_mode(True)
