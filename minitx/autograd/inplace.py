"""A Tensor's in-place writes: ``copy_``, ``fill_``, ``zero_``, ``add_``, ``sub_``, ``mul_``,
``div_`` (PyTorch's names; the trailing underscore says "in place").

None of them is recorded in the graph: they are for loading weights, setting test values and
an optimizer's step, not for the maths a gradient flows through. Two rules keep them honest:

- each write is counted (``versions.mark_written``), so a backward that saved this memory
  before the write raises ``SavedArrayModified`` instead of returning a wrong gradient;
- the in-place arithmetic is refused on a tensor that requires grad while grad mode is on (the
  write would be invisible to its gradient): write ``t = t + x``, or update under
  ``minitx.no_grad()`` as an optimizer does.

Writing to ``.data`` directly bypasses both, as in PyTorch. ``InPlaceMethods`` is a mixin that
``Tensor`` inherits (``tensor.py``).
"""
from __future__ import annotations

from operator import iadd as _iadd, imul as _imul, isub as _isub, itruediv as _itruediv

import numpy

from .. import backend
from . import grad_mode as _grad_mode, versions
from . import tensor as _tensor   # the module (tensor.py imports this one at its top)

__all__ = ["InPlaceMethods"]


def _broadcasts_to(shape, target) -> bool:
    """Whether an array of ``shape`` broadcasts to exactly ``target`` (NumPy's rule; an
    in-place write cannot grow the tensor it writes into)."""
    try:
        return numpy.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


class InPlaceMethods:
    """The in-place writes of a Tensor (see the module docstring). No state of its own."""

    __slots__ = ()

    # ---- writes of given values ---------------------------------------------------------
    def copy_(self, src):
        """Write ``src`` (a Tensor, a NumPy/CuPy array or a nested list) into this tensor in
        place, on this tensor's device and in its dtype (PyTorch's ``copy_``); ``src`` must
        broadcast to this tensor's shape. Not recorded in the graph: for loading weights and
        setting test values. Returns ``self``."""
        data = src.data if isinstance(src, _tensor.Tensor) else src
        if not hasattr(data, "shape"):
            data = numpy.asarray(data)
        data = backend.to_device(data, self.device)
        if not _broadcasts_to(data.shape, self.shape):
            raise ValueError(f"copy_: src of shape {tuple(data.shape)} does not broadcast to "
                             f"this tensor's shape {tuple(self.shape)}")
        self.data[...] = data.astype(self.dtype, copy=False)
        versions.mark_written(self.data)
        return self

    def fill_(self, value):
        """Set every element to the number ``value``, in place. Returns ``self``."""
        if isinstance(value, _tensor.Tensor):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float, numpy.number)):
            raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
        self.data[...] = value
        versions.mark_written(self.data)
        return self

    def zero_(self):
        """Set every element to 0, in place. Returns ``self``."""
        return self.fill_(0)

    # ---- in-place arithmetic: self ← self op other -------------------------------------
    def _inplace(self, name, op, symbol, other):
        """``self ← self op other`` in place (``other`` broadcast to this shape, cast to this
        dtype). Refused on a tensor that requires grad while grad mode is on: the write is
        not recorded, so a gradient through it would be wrong — write ``t = t + x``, or
        update under ``minitx.no_grad()`` as an optimizer does."""
        if self.requires_grad and _grad_mode._state["enabled"]:
            raise RuntimeError(
                f"{name}: in-place ops are not recorded in the graph, and this tensor requires "
                f"grad; write t = t {symbol} x, or do it under "
                "minitx.no_grad() (as an optimizer step does)")
        other = backend.to_device_of(other.data if isinstance(other, _tensor.Tensor) else other,
                                     self.data)         # a host array meets device data once
        if not _broadcasts_to(getattr(other, "shape", ()), self.shape):
            raise ValueError(f"{name}: other of shape {tuple(other.shape)} does not broadcast "
                             f"to this tensor's shape {tuple(self.shape)}")
        # NumPy's casting rule refuses a result the dtype cannot hold (int tensor /= 2, …)
        try:
            op(self.data, other)
        except TypeError as exc:
            raise TypeError(f"{name}: the result cannot be written into this {self.dtype} "
                            f"tensor in place ({exc})") from exc
        versions.mark_written(self.data)
        return self

    def add_(self, other):
        """``self += other`` in place (see ``_inplace`` for when it is refused)."""
        return self._inplace("add_", _iadd, "+", other)

    def sub_(self, other):
        """``self -= other`` in place."""
        return self._inplace("sub_", _isub, "-", other)

    def mul_(self, other):
        """``self *= other`` in place."""
        return self._inplace("mul_", _imul, "*", other)

    def div_(self, other):
        """``self /= other`` in place."""
        return self._inplace("div_", _itruediv, "/", other)
