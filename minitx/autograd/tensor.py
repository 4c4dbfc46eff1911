"""``Tensor``: an ndarray (NumPy or CuPy) plus the graph node that produced it.

A Tensor holds
- ``data``: the raw array, of the active array module (writing to it directly is invisible
  to autograd; ``copy_``, ``fill_`` and the in-place methods are counted, so a backward that
  saved the old values raises — see ``versions``);
- ``requires_grad``: whether gradients flow to it;
- ``grad``: after ``backward``, a Tensor of the same shape and dtype (leaves only);
- ``_ctx``: the Function context that produced it (``None`` for leaves).

Operators and methods are thin wrappers over ``minitx.functional``; the math and its
derivative live there, one Function per op. PyTorch's names for these methods (``t.size()``,
``t.float()``, ``t.view``, ``t.unsqueeze``, ``dim=`` / ``keepdim=``, …) are in
``spellings.py``, which ``Tensor`` inherits.
"""
from __future__ import annotations

from operator import iadd as _iadd, imul as _imul, isub as _isub, itruediv as _itruediv

import numpy

from .. import backend
from . import grad_mode as _grad_mode, versions
from .spellings import PyTorchSpellings

__all__ = ["Tensor", "tensor"]


_KINDS = "biuf"          # bool, signed/unsigned ints, floats: what a Tensor holds


def _to_array(data, dtype):
    """Turn ``data`` into an array of the active backend, applying minitx's dtype rules."""
    xp = backend.xp()
    if isinstance(data, Tensor):
        array = data.data
    elif isinstance(data, (numpy.ndarray, numpy.generic)) or \
            hasattr(data, "__cuda_array_interface__"):
        array = data
    else:
        # Python scalars and (nested) lists: floats become float32, like PyTorch.
        try:
            array = numpy.asarray(data)
        except ValueError as exc:                     # ragged nested lists
            raise ValueError(f"tensor: data must be a rectangular nested list or an array, "
                             f"got {type(data).__name__}: {exc}") from exc
        if array.dtype == numpy.float64 and dtype is None:
            array = array.astype(numpy.float32)
    if array.dtype.kind not in _KINDS:
        raise TypeError(f"tensor: data must be bool, integer or floating point, got dtype "
                        f"{array.dtype} (from {type(data).__name__}); complex, string and "
                        "object arrays are not supported")
    if backend.get_array_module(array) is not xp:
        array = backend.to_device(array, "cuda" if xp is not numpy else "cpu")
    if dtype is not None:
        target = backend.as_dtype(dtype)
        if target.kind not in _KINDS:
            raise TypeError(f"tensor: dtype must be bool, integer or floating point, got {target}")
        array = array.astype(target, copy=False)
    elif not hasattr(array, "shape"):
        array = xp.asarray(array)
    return xp.asarray(array)


class Tensor(PyTorchSpellings):
    """An n-dimensional array that can record how it was computed and backpropagate.

    ``Tensor(data, requires_grad=False, dtype=None)``: ``data`` is a Python scalar, a nested
    list, a NumPy/CuPy array or a Tensor. Python floats become float32; arrays keep their
    dtype (bool masks stay bool); ``dtype`` (a NumPy dtype or its name) overrides. Complex,
    string and object data are refused. Only floating-point tensors may require gradients.

    **The dtype rule.** Ops combine dtypes as NumPy does (float32 with float64 computes in
    float64; a Python float does not widen a float32 tensor), and every input's gradient comes
    back in that input's own dtype: the engine casts it, in one place, for every op — so a
    float32 parameter always gets a float32 ``.grad``, whatever it was combined with.
    """

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "__weakref__")
    __array_priority__ = 1000  # make `ndarray <op> Tensor` call Tensor's reflected operator

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        array = _to_array(data, dtype)
        if requires_grad and array.dtype.kind != "f":
            raise TypeError("only floating-point tensors can require gradients, "
                            f"got dtype {array.dtype}")
        self.data = array
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None

    @classmethod
    def _wrap(cls, array, requires_grad=False):
        """Fast internal constructor: no conversion, no checks."""
        t = object.__new__(Tensor)
        t.data = array
        t.grad = None
        t.requires_grad = requires_grad
        t._ctx = None
        return t

    # ---- properties ----------------------------------------------------------------------
    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self) -> str:
        """"cpu" or "cuda"."""
        return backend.device_of(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def T(self):
        """All axes reversed (NumPy's ``.T``)."""
        return self.transpose()

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        body = numpy.array2string(self.numpy(), precision=4, separator=", ", prefix="tensor(")
        extra = ""
        if self.dtype != numpy.float32 and self.dtype.kind == "f" or self.dtype.kind != "f":
            extra += f", dtype={self.dtype}"
        if self.device != "cpu":
            extra += f", device='{self.device}'"
        if self._ctx is not None:
            extra += f", grad_fn=<{self._ctx.fn.__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # ---- conversion ----------------------------------------------------------------------
    def numpy(self):
        """The data as a NumPy array (copied from the GPU when needed)."""
        return backend.to_device(self.data, "cpu")

    def __array__(self, dtype=None, copy=None):
        if self.device != "cpu":
            raise TypeError("can't convert a cuda Tensor to NumPy implicitly; use .numpy()")
        return self.data if dtype is None else self.data.astype(dtype)

    def item(self):
        """The value of a one-element tensor as a Python scalar."""
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}")
        return int(self.item())

    def detach(self) -> "Tensor":
        """The same data, cut from the graph (shares memory)."""
        return Tensor._wrap(self.data, False)

    def clone(self) -> "Tensor":
        """A differentiable copy."""
        return _F.clone(self)

    def requires_grad_(self, mode: bool = True) -> "Tensor":
        if mode and self.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got {self.dtype}")
        self.requires_grad = bool(mode)
        return self

    # ---- in-place writes: not recorded in the graph, each one counted --------------------
    # Every write below calls versions.mark_written, so a backward that saved this memory
    # before the write raises instead of returning a wrong gradient. Writing to ``.data``
    # directly bypasses that count, as in PyTorch.

    def copy_(self, src) -> "Tensor":
        """Write ``src`` (a Tensor, a NumPy/CuPy array or a nested list) into this tensor in
        place, on this tensor's device and in its dtype (PyTorch's ``copy_``); ``src`` must
        broadcast to this tensor's shape. Not recorded in the graph: for loading weights and
        setting test values. Returns ``self``."""
        data = src.data if isinstance(src, Tensor) else src
        if not hasattr(data, "shape"):
            data = numpy.asarray(data)
        data = backend.to_device(data, self.device)
        try:
            shape = numpy.broadcast_shapes(tuple(data.shape), self.shape)
        except ValueError:
            shape = None
        if shape != tuple(self.shape):
            raise ValueError(f"copy_: src of shape {tuple(data.shape)} does not broadcast to "
                             f"this tensor's shape {tuple(self.shape)}")
        self.data[...] = data.astype(self.dtype, copy=False)
        versions.mark_written(self.data)
        return self

    def fill_(self, value) -> "Tensor":
        """Set every element to the number ``value``, in place. Returns ``self``."""
        if isinstance(value, Tensor):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float, numpy.number)):
            raise TypeError(f"fill_: value must be a number, got {type(value).__name__}")
        self.data[...] = value
        versions.mark_written(self.data)
        return self

    def zero_(self) -> "Tensor":
        """Set every element to 0, in place. Returns ``self``."""
        return self.fill_(0)

    def _inplace(self, name, op, symbol, other) -> "Tensor":
        """``self ← self op other`` in place (``other`` broadcast to this shape, cast to this
        dtype). Refused on a tensor that requires grad while grad mode is on: the write is
        not recorded, so a gradient through it would be wrong — write ``t = t + x``, or
        update under ``minitx.no_grad()`` as an optimizer does."""
        if self.requires_grad and _grad_mode._state["enabled"]:
            raise RuntimeError(
                f"{name}: in-place ops are not recorded in the graph, and this tensor requires "
                f"grad; write t = t {symbol} x, or do it under "
                "minitx.no_grad() (as an optimizer step does)")
        other = backend.to_device_of(other.data if isinstance(other, Tensor) else other,
                                     self.data)         # a host array meets device data once
        try:
            shape = numpy.broadcast_shapes(tuple(getattr(other, "shape", ())), self.shape)
        except ValueError:
            shape = None
        if shape != tuple(self.shape):
            raise ValueError(f"{name}: other of shape {tuple(other.shape)} does not broadcast "
                             f"to this tensor's shape {tuple(self.shape)}")
        try:
            op(self.data, other)
        except TypeError as exc:          # NumPy's casting rule: int tensor /= 2, …
            raise TypeError(f"{name}: the result cannot be written into this {self.dtype} "
                            f"tensor in place ({exc})") from exc
        versions.mark_written(self.data)
        return self

    def add_(self, other) -> "Tensor":
        """``self += other`` in place (see ``_inplace`` for when it is refused)."""
        return self._inplace("add_", _iadd, "+", other)

    def sub_(self, other) -> "Tensor":
        """``self -= other`` in place."""
        return self._inplace("sub_", _isub, "-", other)

    def mul_(self, other) -> "Tensor":
        """``self *= other`` in place."""
        return self._inplace("mul_", _imul, "*", other)

    def div_(self, other) -> "Tensor":
        """``self /= other`` in place."""
        return self._inplace("div_", _itruediv, "/", other)

    def to(self, device: str) -> "Tensor":
        """A copy on "cpu" or "cuda" (differentiable: gradients flow back to this device)."""
        if device == self.device:
            return self
        return _F.to_device(self, device)

    def astype(self, dtype) -> "Tensor":
        """Cast to ``dtype`` (differentiable between floating dtypes)."""
        return _F.astype(self, dtype)

    # ---- autograd ------------------------------------------------------------------------
    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        ``grad`` defaults to 1 for a one-element tensor. Unless ``retain_graph`` is True the
        arrays saved for backward are freed, and a second backward raises.
        """
        _engine.backward(self, grad, retain_graph=retain_graph)

    def zero_grad(self) -> None:
        self.grad = None

    # ---- arithmetic ----------------------------------------------------------------------
    # + − × ÷: a Python number is a constant of the op, which NumPy casts to the tensor's
    # dtype (NEP 50)
    def __add__(self, other):
        return _add(self, other)

    def __radd__(self, other):
        return _add(other, self)

    def __sub__(self, other):
        return _sub(self, other)

    def __rsub__(self, other):
        return _sub(other, self)

    def __mul__(self, other):
        return _mul(self, other)

    def __rmul__(self, other):
        return _mul(other, self)

    def __truediv__(self, other):
        return _div(self, other)

    def __rtruediv__(self, other):
        return _div(other, self)

    def __pow__(self, other):
        return _F.pow(self, other)

    def __rpow__(self, other):
        return _F.pow(other, self)

    def __matmul__(self, other):
        return _F.matmul(self, other)

    def __rmatmul__(self, other):
        return _F.matmul(other, self)

    def __neg__(self):
        return _F.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _F.abs(self)

    def __getitem__(self, index):
        return _F.getitem(self, index)

    # ---- comparisons: boolean tensors, never differentiable ------------------------------
    def _compare(self, other, op):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._wrap(op(self.data, other), False)

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    def __invert__(self):
        if self.dtype != numpy.bool_:
            raise TypeError(f"~ needs a bool tensor, got {self.dtype}")
        return Tensor._wrap(~self.data, False)

    def __and__(self, other):
        return self._compare(other, lambda a, b: a & b)

    def __or__(self, other):
        return self._compare(other, lambda a, b: a | b)

    __hash__ = object.__hash__

    # ---- shape methods (NumPy names and semantics) ---------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _F.reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _F.transpose(self, axes or None)

    def swapaxes(self, axis1: int, axis2: int):
        return _F.swapaxes(self, axis1, axis2)

    def broadcast_to(self, shape):
        return _F.broadcast_to(self, shape)

    def flatten(self):
        return _F.reshape(self, (-1,))

    # ---- elementwise shortcuts -----------------------------------------------------------
    def exp(self):
        return _F.exp(self)

    def log(self):
        return _F.log(self)

    def sqrt(self):
        return _F.sqrt(self)

    def tanh(self):
        return _F.tanh(self)

    def sigmoid(self):
        return _F.sigmoid(self)

    def relu(self):
        return _F.relu(self)

    def masked_fill(self, mask, value):
        return _F.masked_fill(self, mask, value)


def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    """Create a Tensor (see ``Tensor``): floats become float32, arrays keep their dtype."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


# Bound last, because both import Tensor from this module: the engine (backward) and the ops
# (Tensor's operators and methods, and those of spellings.py, are thin calls into minitx.ops —
# autograd and ops are one layer, the core).
from . import engine as _engine  # noqa: E402
from .. import ops as _F  # noqa: E402
# + − × ÷ call their Functions directly: the hottest calls of a small model
from ..ops.elementwise import Add, Div, Mul, Sub  # noqa: E402

_add, _sub, _mul, _div = Add.apply, Sub.apply, Mul.apply, Div.apply
