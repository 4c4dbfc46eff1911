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

One name means two things: ``transpose``. NumPy's ``a.transpose(*axes)`` permutes all axes,
PyTorch's ``t.transpose(d0, d1)`` swaps two. ``Tensor.transpose`` keeps NumPy's meaning and
refuses the two ints a PyTorch user writes wherever NumPy would read them otherwise
(``transpose_axes``), naming the spellings that say it: ``t.swapaxes(d0, d1)``, ``t.T``,
``t.permute(…)``, ``t.t()``, ``t.transpose((…))``.
"""
from __future__ import annotations

import numbers

import numpy

from ..validate import OptionError
from . import tensor as _tensor   # the module (tensor.py imports this one at its top)

__all__ = ["PyTorchSpellings", "Size", "transpose_axes"]


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
        # t.size(): the shape; t.size(d): one extent, with PyTorch's range check
        if dim is None:
            return self.shape
        if isinstance(dim, bool) or not isinstance(dim, (int, numpy.integer)) or \
                not -len(self.shape) <= dim < len(self.shape):
            raise IndexError(f"size: dim must be an int in [{-len(self.shape)}, "
                             f"{len(self.shape) - 1}] for shape {self.shape}, got {dim!r}")
        return self.shape[dim]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def transpose_axes(ndim: int, axes: tuple):
    """The permutation that ``Tensor.transpose(*axes)`` means on a tensor of ``ndim`` axes
    (``None``: all axes reversed), or an ``OptionError`` where NumPy's reading and PyTorch's
    differ and the call cannot say which one it means:

    - ``()``: reversed; one tuple or list, or ``ndim`` ints other than the case below: NumPy's
      permutation (``transpose((2, 0, 1))``, ``transpose(2, 0, 1)``);
    - two ints on a tensor that does not have 2 axes: not a permutation of its axes, so NumPy
      refuses them, and PyTorch swaps them: refused, naming ``swapaxes``;
    - two ints on a 2-D tensor that name axes 0, 1 in that order (``(0, 1)``, ``(-2, -1)``):
      NumPy's identity, the tensor unchanged, and PyTorch's swap, the matrix transpose —
      refused, naming ``T``, ``swapaxes(0, 1)`` and ``transpose((1, 0))``;
    - ``(1, 0)`` on a 2-D tensor: a swap in both readings: taken.
    """
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        return tuple(axes[0])
    if len(axes) != 2 or not all(_is_int(a) for a in axes):
        return axes or None
    # two ints: the one call whose meaning depends on who reads it
    a, b = (int(v) for v in axes)
    # not 2-D: NumPy would refuse two axes anyway; the error names the swap, with the full
    # permutation that makes it when both axes are in range
    if ndim != 2:
        perm = list(range(ndim))
        if -ndim <= a < ndim and -ndim <= b < ndim:
            perm[a], perm[b] = perm[b], perm[a]
            swap = f"x.swapaxes({a}, {b}) or x.transpose({tuple(perm)})"
        else:
            swap = f"x.swapaxes({a}, {b})"
        raise OptionError(
            f"transpose: axes must be a permutation of all the axes of this {ndim}-D tensor "
            f"(NumPy's transpose), got two, ({a}, {b}); to swap two axes, as PyTorch's "
            f"transpose({a}, {b}) does, write {swap}")
    # 2-D: (0, 1) and (-2, -1) are the identity permutation to NumPy, a swap to PyTorch;
    # (1, 0) is a swap to both, and an axis out of range is left to transpose's own error
    if -2 <= a < 2 and -2 <= b < 2 and (a % 2, b % 2) == (0, 1):
        raise OptionError(
            f"transpose: axes ({a}, {b}) on a 2-D tensor read two ways: NumPy's permutation "
            f"(axes in their own order: the tensor unchanged) and PyTorch's swap (the matrix "
            f"transpose); for the swap write x.T, x.swapaxes(0, 1) or x.transpose((1, 0)), "
            f"for no change x itself")
    return axes


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

    def permute(self, *dims):
        """The axes in the order ``dims``, each axis once: ``t.permute(2, 0, 1)`` or
        ``t.permute((2, 0, 1))`` (PyTorch's name for NumPy's ``transpose(dims)``)."""
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        n = self.data.ndim
        # each dim an int in [-n, n), and together every axis exactly once
        if not all(_is_int(d) and -n <= d < n for d in dims) or \
                sorted(int(d) % max(n, 1) for d in dims) != list(range(n)):
            raise OptionError(f"permute: dims must be a permutation of the {n} axes "
                              f"0..{n - 1} (each once; negatives count back), got {dims}")
        return _functional().transpose(self, tuple(int(d) for d in dims))

    def t(self):
        """The matrix transpose of a 2-D tensor (``t.T``); a 0-D or 1-D tensor is returned
        as it is (PyTorch's ``t()``). More axes are refused: say which two to swap."""
        if self.data.ndim > 2:
            raise OptionError(f"t: expects a tensor with at most 2 axes, got {self.data.ndim} "
                              f"(shape {tuple(self.data.shape)}); swap two axes with "
                              "x.swapaxes(d0, d1), or reverse them all with x.T")
        return self.transpose() if self.data.ndim == 2 else self

    def contiguous(self):
        """``self``. PyTorch needs ``contiguous()`` before ``view`` on a transposed tensor;
        minitx does not: every op takes arrays of any strides (NumPy and CuPy read a view as
        it is), and ``view`` is ``reshape``, which copies where a view cannot be made."""
        return self

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

    # arg-reductions and the softmaxes: dim= accepted, the same meaning as axis=
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
