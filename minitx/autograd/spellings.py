"""PyTorch's spellings of Tensor's methods, so that code ported from PyTorch runs as written.

minitx spells its Tensor the NumPy way (``t.size`` is the element count, ``t.ndim``,
``t.astype("float32")``, ``t.reshape``, ``axis=`` / ``keepdims=``). Each method here is
PyTorch's name for one of those, and forwards to it: ``t.size()``, ``t.numel()``, ``t.dim()``,
``t.float()``, ``t.view(...)``, ``t.unsqueeze(d)``, ``t.cpu()``, and the reductions and shape
methods that take ``dim=`` / ``keepdim=`` (``sum``, ``mean``, ``softmax``, …; the ops of
``minitx.functional`` accept those as aliases of ``axis=`` / ``keepdims=`` in one place,
``validate.dim_alias``, and refuse them where PyTorch means something else, naming minitx's
spelling). No maths lives here: ``Tensor`` inherits this class (``tensor.py``), and this module
is the home of every further PyTorch alias of a Tensor method.
"""
from __future__ import annotations

import numpy

from . import tensor as _tensor   # the module (tensor.py imports this one at its top)

__all__ = ["PyTorchSpellings", "Size"]


class Size(int):
    """The element count (an int, NumPy's ``a.size``) that, called, is PyTorch's ``t.size()``:
    the shape, or ``t.size(dim)``: one extent (negative dims count back)."""

    def __new__(cls, shape):
        count = 1
        for extent in shape:
            count *= extent
        size = super().__new__(cls, count)
        size.shape = tuple(shape)
        return size

    def __call__(self, dim=None):
        if dim is None:
            return self.shape
        if isinstance(dim, bool) or not isinstance(dim, (int, numpy.integer)) or \
                not -len(self.shape) <= dim < len(self.shape):
            raise IndexError(f"size: dim must be an int in [{-len(self.shape)}, "
                             f"{len(self.shape) - 1}] for shape {self.shape}, got {dim!r}")
        return self.shape[dim]


def _functional():
    """``minitx.functional``'s ops, as ``tensor.py`` binds them at its end (the ops import
    Tensor, so they load after it, and after this module); looked up when a method runs."""
    return _tensor._F


class PyTorchSpellings:
    """PyTorch's names for Tensor's NumPy-named methods (see the module docstring). A mixin
    with no state of its own (``__slots__ = ()``: a Tensor keeps no ``__dict__``)."""

    __slots__ = ()

    # ---- size, count, rank, dtype casts --------------------------------------------------
    @property
    def size(self) -> Size:
        """The number of elements (NumPy: ``t.size``); ``t.size()`` is the shape and
        ``t.size(dim)`` one extent (PyTorch)."""
        return Size(self.data.shape)

    def numel(self) -> int:
        """The number of elements (PyTorch's name for ``t.size``)."""
        return int(self.data.size)

    def dim(self) -> int:
        """The number of dimensions (PyTorch's name for ``t.ndim``)."""
        return self.data.ndim

    def float(self):
        """Cast to float32, differentiably (PyTorch's ``t.float()``; ``t.astype("float32")``)."""
        return self.astype("float32")

    def double(self):
        """Cast to float64, differentiably (``t.astype("float64")``)."""
        return self.astype("float64")

    def half(self):
        """Cast to float16, differentiably (``t.astype("float16")``)."""
        return self.astype("float16")

    # ---- shapes and devices --------------------------------------------------------------
    def view(self, *shape):
        """PyTorch's name for ``reshape`` (a copy where NumPy cannot make a view)."""
        return self.reshape(*shape)

    def unsqueeze(self, dim: int):
        """A new axis of length 1 at ``dim`` (PyTorch's name for ``expand_dims``)."""
        return _functional().expand_dims(self, dim)

    def cpu(self):
        """``t.to("cpu")``."""
        return self.to("cpu")

    def cuda(self):
        """``t.to("cuda")``."""
        return self.to("cuda")

    # ---- methods taking dim= / keepdim= as well as axis= / keepdims= ----------------------
    def sum(self, *args, **kwargs):
        """Σ over ``axis`` (or ``dim``); ``keepdims`` (or ``keepdim``). See ``F.sum``."""
        return _functional().sum(self, *args, **kwargs)

    def mean(self, *args, **kwargs):
        """Mean over ``axis`` (or ``dim``); ``keepdims`` (or ``keepdim``). See ``F.mean``."""
        return _functional().mean(self, *args, **kwargs)

    def var(self, *args, **kwargs):
        """Variance over ``axis`` with ``ddof`` (NumPy's, default 0). ``dim=`` is refused:
        PyTorch's ``var(dim=)`` divides by n − 1. See ``F.var``."""
        return _functional().var(self, *args, **kwargs)

    def max(self, *args, **kwargs):
        """Maximum over ``axis``. ``dim=`` is refused: PyTorch's ``max(dim=)`` returns
        (values, indices); use ``max(axis=)`` and ``argmax(axis=)``. See ``F.max``."""
        return _functional().max(self, *args, **kwargs)

    def min(self, *args, **kwargs):
        """Minimum over ``axis``; ``dim=`` is refused as for ``max``. See ``F.min``."""
        return _functional().min(self, *args, **kwargs)

    def argmax(self, *args, **kwargs):
        """Index of the maximum over ``axis`` (or ``dim``; None: flattened). See ``F.argmax``."""
        return _functional().argmax(self, *args, **kwargs)

    def argmin(self, *args, **kwargs):
        """Index of the minimum over ``axis`` (or ``dim``). See ``F.argmin``."""
        return _functional().argmin(self, *args, **kwargs)

    def softmax(self, *args, **kwargs):
        """softmax along ``axis`` (or ``dim``), default −1. See ``F.softmax``."""
        return _functional().softmax(self, *args, **kwargs)

    def log_softmax(self, *args, **kwargs):
        """log softmax along ``axis`` (or ``dim``), default −1. See ``F.log_softmax``."""
        return _functional().log_softmax(self, *args, **kwargs)

    def squeeze(self, *args, **kwargs):
        """Drop length-1 axes (``axis`` or ``dim``; None: all). See ``F.squeeze``."""
        return _functional().squeeze(self, *args, **kwargs)

    def expand_dims(self, *args, **kwargs):
        """A new length-1 axis at ``axis`` (or ``dim``). See ``F.expand_dims``."""
        return _functional().expand_dims(self, *args, **kwargs)
