"""Shape ops: reshape, transpose, swapaxes, broadcast_to, squeeze, expand_dims, concatenate
(and PyTorch's spelling of it, ``cat``), stack, split, pad, tril/triu. Their backward moves the
gradient back to the input's layout.
"""
from __future__ import annotations

import numbers

from ..autograd.function import Function
from ..backend import get_array_module
from ..validate import OptionError, dim_alias, integer
from ._util import as_tuple, normalize_axis, unbroadcast

__all__ = ["reshape", "transpose", "swapaxes", "broadcast_to", "squeeze", "expand_dims",
           "concatenate", "cat", "stack", "split", "pad", "tril", "triu", "flip"]


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.shape), None


class Transpose(Function):
    @staticmethod
    def forward(ctx, x, axes):
        axes = tuple(range(x.ndim))[::-1] if axes is None else \
            tuple(a % max(x.ndim, 1) for a in axes)
        if sorted(axes) != list(range(x.ndim)):
            raise ValueError(f"axes must be a permutation of 0..{x.ndim - 1}, got {axes}")
        inverse = [0] * x.ndim
        for i, a in enumerate(axes):
            inverse[a] = i
        ctx.inverse = tuple(inverse)
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, grad):
        return grad.transpose(ctx.inverse), None


class SwapAxes(Function):
    @staticmethod
    def forward(ctx, x, a, b):
        ctx.axes = (a, b)
        return get_array_module(x).swapaxes(x, a, b)

    @staticmethod
    def backward(ctx, grad):
        return get_array_module(grad).swapaxes(grad, *ctx.axes), None, None


class BroadcastTo(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return get_array_module(x).broadcast_to(x, shape)

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.shape), None


class Concatenate(Function):
    @staticmethod
    def forward(ctx, *xs, axis):
        xp = get_array_module(*xs)
        ctx.axis = normalize_axis(axis, xs[0].ndim)
        ctx.bounds, total = [], 0
        for x in xs[:-1]:
            total += x.shape[ctx.axis]
            ctx.bounds.append(total)
        return xp.concatenate(xs, axis=ctx.axis)

    @staticmethod
    def backward(ctx, grad):
        return tuple(get_array_module(grad).split(grad, ctx.bounds, axis=ctx.axis))


class Stack(Function):
    @staticmethod
    def forward(ctx, *xs, axis):
        ctx.axis = normalize_axis(axis, xs[0].ndim + 1)
        return get_array_module(*xs).stack(xs, axis=ctx.axis)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        return tuple(xp.take(grad, i, axis=ctx.axis) for i in range(grad.shape[ctx.axis]))


class Pad(Function):
    @staticmethod
    def forward(ctx, x, pad_width, value):
        ctx.region = tuple(slice(lo, lo + n) for (lo, _), n in zip(pad_width, x.shape))
        return get_array_module(x).pad(x, pad_width, constant_values=value)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.region], None, None        # the padding received no input


class Triangle(Function):
    @staticmethod
    def forward(ctx, x, k, lower):
        xp = get_array_module(x)
        n, m = x.shape[-2:]
        keep = (xp.tri(n, m, k, dtype=bool) if lower else ~xp.tri(n, m, k - 1, dtype=bool))
        ctx.save_for_backward(keep)
        return x * keep

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * keep, None, None


class Flip(Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return get_array_module(x).flip(x, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        return get_array_module(grad).flip(grad, axis=ctx.axis), None


def reshape(x, shape):
    """x with a new shape of the same size (one entry may be −1). NumPy's ``reshape``."""
    return Reshape.apply(x, as_tuple(shape))


def transpose(x, axes=None):
    """Permute axes (None: reverse them). NumPy's ``transpose``; backward: inverse permutation."""
    return Transpose.apply(x, axes)


def swapaxes(x, axis1: int, axis2: int):
    """Exchange two axes. NumPy's ``swapaxes``."""
    return SwapAxes.apply(x, axis1, axis2)


def broadcast_to(x, shape):
    """x broadcast to ``shape``; backward sums over the copies (``unbroadcast``)."""
    return BroadcastTo.apply(x, as_tuple(shape))


@dim_alias
def squeeze(x, axis=None):
    """Remove size-1 axes (all of them, or ``axis``)."""
    shape = x.shape
    if axis is None:
        new = tuple(n for n in shape if n != 1)
    else:
        axes = {normalize_axis(a, len(shape)) for a in as_tuple(axis)}
        for a in axes:
            if shape[a] != 1:
                raise ValueError(f"cannot squeeze axis {a} of size {shape[a]} (shape {shape})")
        new = tuple(n for i, n in enumerate(shape) if i not in axes)
    return Reshape.apply(x, new)


@dim_alias
def expand_dims(x, axis):
    """Insert a size-1 axis at ``axis`` (int or tuple). NumPy's ``expand_dims``."""
    axes = as_tuple(axis)
    ndim = len(x.shape) + len(axes)
    axes = sorted(normalize_axis(a, ndim) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return Reshape.apply(x, tuple(shape))


def _joinable(fn: str, arg: str, xs, axis, axis_name: str):
    """``xs`` as a list, checked for ``fn``: a non-empty sequence (not one tensor) of tensors
    whose shapes agree in every dim but ``axis``; returns (list, axis in [0, ndim))."""
    if hasattr(xs, "shape"):          # one Tensor or array: iterating it would join its rows
        raise OptionError(f"{fn}: {arg} must be a list or tuple of tensors, got one "
                          f"{type(xs).__name__} of shape {tuple(xs.shape)} (pass [x, ...])")
    xs = list(xs)
    if not xs:
        raise OptionError(f"{fn}: {arg} must be a non-empty list of tensors, got an empty one")
    # every entry needs a shape; the first one's sets the rank and the dims that must agree
    for i, x in enumerate(xs):
        if not hasattr(x, "shape"):
            raise OptionError(f"{fn}: {arg}[{i}] must be a Tensor or array, got "
                              f"{type(x).__name__}")
    first = tuple(xs[0].shape)
    if not first:
        raise OptionError(f"{fn}: {arg}[0] is 0-d; 0-d tensors have no {axis_name} to join "
                          "along (use stack)")
    axis = integer(axis, axis_name, minimum=-len(first), maximum=len(first) - 1, owner=fn)
    axis %= len(first)
    for i, x in enumerate(xs[1:], 1):
        shape = tuple(x.shape)
        if len(shape) != len(first) or any(a != b for d, (a, b) in enumerate(zip(shape, first))
                                           if d != axis):
            raise OptionError(f"{fn}: {arg}[{i}] has shape {shape} but {arg}[0] has {first}; "
                              f"every dim but {axis_name} {axis} must match")
    return xs, axis


@dim_alias
def concatenate(xs, axis: int = 0):
    """Join tensors along an existing axis; backward splits the gradient at the seams.

    xs: (…, n_i, …) for i = 1..k, equal in every other dim → (…, Σ n_i, …). ``dim=`` works as
    ``axis=``; ``cat`` is PyTorch's spelling. Time and memory O(total size).
    """
    xs, axis = _joinable("concatenate", "xs", xs, axis, "axis")
    return Concatenate.apply(*xs, axis=axis)


def cat(tensors, dim: int = 0, *, axis: int = None):
    """PyTorch's ``torch.cat(tensors, dim=0)``: ``concatenate`` under PyTorch's names.

    ``axis=`` (NumPy's spelling) is taken too; giving both ``dim`` (other than its default)
    and ``axis`` is an ``OptionError`` naming both. Errors name ``cat`` and ``tensors``.
    """
    if axis is not None:
        if dim != 0:
            raise OptionError(f"cat: pass dim= or its NumPy spelling axis=, not both (got "
                              f"dim={dim!r} and axis={axis!r})")
        dim = axis
    xs, dim = _joinable("cat", "tensors", tensors, dim, "dim")
    return Concatenate.apply(*xs, axis=dim)


@dim_alias
def stack(xs, axis: int = 0):
    """Join same-shaped tensors along a new axis."""
    xs = list(xs)
    if not xs:
        raise ValueError("stack needs at least one tensor")
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"stack needs tensors of one shape, got {sorted(shapes)}")
    return Stack.apply(*xs, axis=axis)


@dim_alias(torch_differs=(
    "torch.split(x, size, dim=d) cuts pieces of length size, this split (NumPy's) "
    "cuts into that many sections; pass axis=d"))
def split(x, indices_or_sections, axis: int = 0):
    """Split along ``axis`` into equal sections (an int) or at the given indices (a list).

    Returns a list of tensors (each a differentiable slice). NumPy's ``split`` semantics.
    """
    n = x.shape[normalize_axis(axis, len(x.shape))]
    axis = normalize_axis(axis, len(x.shape))
    if isinstance(indices_or_sections, numbers.Integral):
        if indices_or_sections <= 0 or n % indices_or_sections:
            raise ValueError(f"indices_or_sections={indices_or_sections} does not divide "
                             f"axis {axis} of length {n} into equal sections")
        step = n // indices_or_sections
        cuts = list(range(step, n, step))
    else:
        cuts = list(indices_or_sections)
    edges = [0] + cuts + [n]
    lead = (slice(None),) * axis
    return [x[lead + (slice(lo, hi),)] for lo, hi in zip(edges[:-1], edges[1:])]


def _pad_pairs(pad_width, ndim: int) -> tuple:
    """NumPy's ``pad_width`` as one (before, after) pair of ints per axis: ``np.pad`` broadcasts
    it to shape (ndim, 2), so ``n``, ``(n,)``, ``(before, after)``, ``((before, after),)``,
    ``((n0,), (n1,), ...)`` and ``((b0, a0), (b1, a1), ...)`` are all accepted."""
    def fail():
        raise OptionError(
            f"pad: pad_width must be NumPy's: an int, (before, after) for every axis, or one "
            f"(before, after) pair per axis ({ndim} here), each >= 0, got {pad_width!r}. "
            f"PyTorch's F.pad(x, (left, right, top, bottom)) lists the last axis first; here "
            f"that is ((0, 0), ..., (top, bottom), (left, right))")

    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if getattr(pad_width, "ndim", None) == 0:                     # a 0-d NumPy array
        pad_width = pad_width.item()
    rows = [[pad_width]] if is_int(pad_width) else None          # shape () -> one row
    if rows is None:
        if isinstance(pad_width, (str, bytes)) or not hasattr(pad_width, "__iter__"):
            fail()
        items = list(pad_width)
        if items and all(is_int(v) for v in items):
            rows = [items]                                        # (n,) or (before, after)
        elif items and all(hasattr(v, "__iter__") and not isinstance(v, (str, bytes))
                           for v in items):
            rows = [list(v) for v in items]
        else:
            fail()
    if len(rows) not in (1, ndim) or any(len(r) not in (1, 2) or not all(is_int(v) for v in r)
                                         for r in rows):
        fail()
    pairs = [(int(r[0]), int(r[-1])) for r in rows]               # (n,) means (n, n)
    if any(v < 0 for pair in pairs for v in pair):
        fail()
    return tuple(pairs * ndim if len(pairs) == 1 else pairs)


def pad(x, pad_width, value: float = 0.0):
    """Constant padding with NumPy's ``pad_width`` (``np.pad(a, pad_width,
    constant_values=value)``): an int pads every axis by that much on both sides,
    ``(before, after)`` pads every axis so, ``((b0, a0), (b1, a1), ...)`` gives one pair per
    axis (and ``(n,)``, ``((n0,), (n1,), ...)``, ``((before, after),)``, every shape NumPy
    broadcasts to (ndim, 2)). Not PyTorch's ``F.pad`` tuple, which lists the last axis first
    and pads only the axes it names: ``F.pad(x, (0, 1))`` here pads *every* axis with 0
    before and 1 after; PyTorch's meaning, for the last axis only, is
    ``pad(x, ((0, 0),) * (x.ndim - 1) + ((0, 1),))``.

    x: (n_0, …, n_k) → (n_0 + b_0 + a_0, …). Backward: the gradient of the interior region.
    """
    return Pad.apply(x, _pad_pairs(pad_width, len(x.shape)), value)


def _diagonal(k, diagonal, who: str) -> int:
    """NumPy's ``k`` or PyTorch's ``diagonal=`` (the same offset), not both."""
    if diagonal is not None:
        if k != 0:
            raise OptionError(f"{who}: pass k= or its PyTorch spelling diagonal=, not both "
                              f"(got k={k!r} and diagonal={diagonal!r})")
        k = diagonal
    return integer(k, "k", owner=who)


def tril(x, k: int = 0, *, diagonal: int = None):
    """Lower triangle of the last two axes (elements with column − row ≤ k), the rest zero.
    ``diagonal=`` is PyTorch's name of ``k`` (``torch.tril(x, diagonal=1)``)."""
    return Triangle.apply(x, _diagonal(k, diagonal, "tril"), True)


def triu(x, k: int = 0, *, diagonal: int = None):
    """Upper triangle of the last two axes (column − row ≥ k), the rest zero.
    ``diagonal=`` is PyTorch's name of ``k``."""
    return Triangle.apply(x, _diagonal(k, diagonal, "triu"), False)


def flip(x, axis=None):
    """Reverse the order of elements along ``axis``."""
    return Flip.apply(x, axis)
