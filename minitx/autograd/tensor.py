"""``Tensor``: an ndarray (NumPy or CuPy) plus the graph node that produced it.

A Tensor holds
- ``data``: the raw array, of the active array module (writing to it directly is invisible
  to autograd; ``copy_``, ``fill_`` and the in-place methods are counted, so a backward that
  saved the old values raises — see ``versions``);
- ``requires_grad``: whether gradients flow to it;
- ``grad``: after ``backward``, a Tensor of the same shape and dtype (leaves only);
- ``_ctx``: the Function context that produced it (``None`` for leaves).

Operators and methods are thin wrappers over ``minitx.functional``; the math and its
derivative live there, one Function per op. What is not autograd lives in the mixins that
``Tensor`` inherits: conversions, devices and dtypes (``devices.py``), the in-place writes
(``inplace.py``) and PyTorch's names for these methods (``t.size()``, ``t.float()``, ``t.view``,
``t.unsqueeze``, ``dim=`` / ``keepdim=``, …: ``spellings.py``).
"""
from __future__ import annotations

import numpy

from .devices import ArrayMethods, to_array as _to_array
from .inplace import InPlaceMethods
from .spellings import PyTorchSpellings, transpose_axes

__all__ = ["Tensor", "tensor"]


class Tensor(ArrayMethods, InPlaceMethods, PyTorchSpellings):
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

    # Four fields and no __dict__: a model makes thousands of Tensors per step
    __slots__ = ("data", "grad", "requires_grad", "_ctx", "__weakref__")

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        array = _to_array(data, dtype)                   # the dtype rules (devices.py)
        # a gradient is a derivative: it needs real numbers, so ints and bools have none
        if requires_grad and array.dtype.kind != "f":
            raise TypeError("only floating-point tensors can require gradients, "
                            f"got dtype {array.dtype}")
        self.data = array
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None

    @classmethod
    def _wrap(cls, array, requires_grad=False):
        """Fast internal constructor: no conversion, no checks. ``Function.apply`` wraps
        every op's output with it, so it is one of the hottest calls."""
        t = object.__new__(Tensor)
        t.data = array
        t.grad = None
        t.requires_grad = requires_grad
        t._ctx = None
        return t

    # ---- properties ----------------------------------------------------------------------
    # the array's own shape, rank and dtype (the ops keep them in step: y = f(x) has the
    # shape and dtype NumPy gives, and every .grad has its tensor's)
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
    def is_leaf(self) -> bool:
        """No Function made it: the user's data, a parameter, or anything made under
        ``no_grad``. Only leaves keep a ``.grad``."""
        return self._ctx is None

    # ---- the graph: cutting it, copying through it, starting backward from here ---------
    def detach(self) -> "Tensor":
        """The same data, cut from the graph (shares memory)."""
        return Tensor._wrap(self.data, False)

    def clone(self) -> "Tensor":
        """A differentiable copy."""
        return _F.clone(self)

    def requires_grad_(self, mode: bool = True) -> "Tensor":
        """Start (or stop) tracking gradients for this tensor; a leaf with ``mode`` True is
        a parameter as far as the engine can tell."""
        if mode and self.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require gradients, got {self.dtype}")
        self.requires_grad = bool(mode)
        return self

    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        ``grad`` defaults to 1 for a one-element tensor. Unless ``retain_graph`` is True the
        arrays saved for backward are freed, and a second backward raises.
        """
        _engine.backward(self, grad, retain_graph=retain_graph)

    def zero_grad(self) -> None:
        self.grad = None

    # ---- arithmetic: each operator is one Function of minitx.ops -------------------------
    # + − × ÷: a Python number is a constant of the op, which NumPy casts to the tensor's
    # dtype (NEP 50). The reflected forms (3 - t) keep the operands' order
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

    # ÷, ** and @ (matrix product, batched over the leading axes as NumPy's matmul)
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

    # unary −, + and abs; t[index]
    def __neg__(self):
        return _F.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _F.abs(self)

    def __getitem__(self, index):
        return _F.getitem(self, index)

    # ---- comparisons: boolean tensors, never differentiable ------------------------------
    # (a comparison is a step function: its derivative is 0 almost everywhere, so no
    # Function records it; the result is a plain bool Tensor, a mask for masked_fill)
    def _compare(self, other, op):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._wrap(op(self.data, other), False)

    def __eq__(self, other):
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other):
        return self._compare(other, lambda a, b: a != b)

    # the orderings, elementwise and broadcast as NumPy's
    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    # ~, & and |: on bool masks; == above returns a Tensor, so hash by identity
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
        """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``; -1 infers one extent."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _F.reshape(self, shape)

    def transpose(self, *axes):
        """NumPy's ``transpose``: the axes permuted (``t.transpose((2, 0, 1))`` or
        ``t.transpose(2, 0, 1)``), or reversed (``t.transpose()``). Two axes meant as
        PyTorch's swap are refused where NumPy reads them otherwise (``transpose_axes``)."""
        return _F.transpose(self, transpose_axes(self.ndim, axes))

    @property
    def T(self):
        """All axes reversed (NumPy's ``.T``): the matrix transpose of a 2-D tensor."""
        return self.transpose()

    def swapaxes(self, axis1: int, axis2: int):
        """Exchange two axes (what PyTorch's ``transpose(axis1, axis2)`` does)."""
        return _F.swapaxes(self, axis1, axis2)

    def broadcast_to(self, shape):
        return _F.broadcast_to(self, shape)

    def flatten(self):
        return _F.reshape(self, (-1,))

    # ---- elementwise shortcuts: t.exp() is F.exp(t) ---------------------------------------
    def exp(self):
        return _F.exp(self)

    def log(self):
        return _F.log(self)

    def sqrt(self):
        return _F.sqrt(self)

    # activations (the rest — gelu, softmax, … — are F's functions, or spellings' methods)
    def tanh(self):
        return _F.tanh(self)

    def sigmoid(self):
        return _F.sigmoid(self)

    def relu(self):
        return _F.relu(self)

    # value where mask is True (PyTorch's polarity): how scores get their −inf
    def masked_fill(self, mask, value):
        return _F.masked_fill(self, mask, value)


def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    """Create a Tensor (see ``Tensor``): floats become float32, arrays keep their dtype."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


# Bound last, because both import Tensor from this module: the engine (backward) and the ops
# (Tensor's operators and methods, and those of the mixins, are thin calls into minitx.ops —
# autograd and ops are one layer, the core).
from . import engine as _engine  # noqa: E402
from .. import ops as _F  # noqa: E402
# + − × ÷ call their Functions directly: the hottest calls of a small model
from ..ops.elementwise import Add, Div, Mul, Sub  # noqa: E402

_add, _sub, _mul, _div = Add.apply, Sub.apply, Mul.apply, Div.apply
