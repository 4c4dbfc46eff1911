"""The checks at the engine's boundaries, and the words of their errors.

``Function.apply`` and ``engine.backward`` (the course's engine chapter) call these; none of them
changes a result that is right. They turn what would be a wrong gradient, or a bare NumPy
message, into an error that names the op:

- ``in_op``: an error raised inside a ``forward``, re-raised with the op's name and its inputs'
  dtypes and shapes;
- ``check_grad``: each gradient a ``backward`` returns has its input's shape, and is cast to its
  input's dtype (the dtype rule, in one place for every op);
- ``check_node``: a node is not walked twice (its saved arrays are freed after the first
  backward), and nothing it saved was written in place since its forward (``versions``);
- ``output_grad``: the gradient that starts the walk, dL/dL = 1 for a one-element loss;
- ``unshared``: whether a gradient may become a leaf's ``.grad`` without a copy (memory only).
"""
from __future__ import annotations

import re

from .. import backend
from .tensor import Tensor
from .versions import SavedArrayModified, written_after

__all__ = ["describe", "input_index", "in_op", "NAMED", "check_grad", "check_node",
           "check_saved", "output_grad", "unshared"]

# An error that starts "name: …" was written by minitx and already says who refused
NAMED = re.compile(r"[A-Za-z_][\w.]*: ")     # "var: …", "Embedding: …"


def describe(a) -> str:
    """``float32(2, 3)`` for an array, ``(…, …)`` for a tuple of them, else the type's name."""
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"{a.dtype}{tuple(a.shape)}"
    if isinstance(a, (tuple, list)):
        return "(" + ", ".join(describe(v) for v in a) + ")"
    return type(a).__name__


def input_index(ctx, parent) -> int:
    """The position of ``parent`` among the inputs of ``ctx``, for an error message."""
    return next(i for i, p in enumerate(ctx.parents) if p is parent)


def in_op(fn, exc, arrays):
    """The error ``exc`` raised inside ``fn.forward``, re-raised once, here, with the op's name
    and its inputs' dtypes and shapes (so a user never reads a bare NumPy message)."""
    kind = next(k for k in (TypeError, IndexError, ValueError) if isinstance(exc, k))
    # keep the exact class of NumPy's errors and of minitx's OptionError; a subclass of
    # someone else's becomes its builtin base, which takes one message
    base = type(exc) if type(exc) in (ValueError, IndexError, TypeError) or \
        type(exc).__name__ == "OptionError" else kind
    inputs = ", ".join(describe(a) for a in arrays)
    return base(f"{fn.__name__}: {exc} (inputs: {inputs})")


def check_grad(ctx, parent, grad):
    """``grad``, the gradient ``ctx``'s backward returned for its input ``parent``: its shape
    must be the input's; its dtype is made the input's (the dtype rule: forward promotes like
    NumPy, each input's gradient comes back in that input's own dtype — cast here, in one
    place, for every op)."""
    shape, dtype = parent.data.shape, parent.data.dtype
    if getattr(grad, "shape", None) != shape:
        raise RuntimeError(
            f"{ctx.fn.__name__}.backward returned a gradient of shape "
            f"{getattr(grad, 'shape', None)} for input {input_index(ctx, parent)}, "
            f"expected {shape}")
    # float16/32/64 cast into one another (float32 x · float64 w: x's gradient is float32);
    # a float gradient for an integer input is a bug in the backward, not a cast to make
    if grad.dtype != dtype:
        if grad.dtype.kind != "f" or dtype.kind != "f":
            raise RuntimeError(
                f"{ctx.fn.__name__}.backward returned a gradient of dtype {grad.dtype} for "
                f"input {input_index(ctx, parent)}, expected {dtype}")
        grad = grad.astype(dtype)
    return grad


def check_node(ctx, stamp):
    """Raise if backward already ran through ``ctx`` (its saved arrays are freed) or if an
    array it saved was written in place after its forward (looked at only when some in-place
    write happened since then: ``stamp`` is the count of writes now)."""
    if ctx.freed:
        raise RuntimeError(
            f"trying to backward through {ctx.fn.__name__} a second time: its saved "
            "arrays were freed; call backward(retain_graph=True) the first time")
    if ctx.stamp != stamp:
        check_saved(ctx)


def check_saved(ctx):
    """Raise if an array ``ctx`` saved for its backward was written in place after its
    forward (see ``versions``)."""
    for i, saved in enumerate(ctx.saved_tensors or ()):
        if saved is not None and hasattr(saved, "shape") and written_after(saved, ctx.stamp):
            where = f"; its forward ran at {ctx.trace}" if getattr(ctx, "trace", None) else ""
            raise SavedArrayModified(
                f"{ctx.fn.__name__}: array {i} saved for its backward ({describe(saved)}) was "
                f"modified in place after the forward (by copy_, fill_, zero_, an in-place "
                f"op or an optimizer step){where}; the gradient would be wrong. Do the "
                "in-place change after backward(), or change a .clone() instead")


def output_grad(tensor, grad):
    """The gradient of ``tensor`` that starts the walk: ``grad`` as an array of the output's
    shape and dtype, or dL/dL = 1 for a one-element output L."""
    if not tensor.requires_grad:
        raise RuntimeError("backward() called on a tensor that does not require grad "
                           "(no input of the computation had requires_grad=True)")
    xp = backend.get_array_module(tensor.data)
    if grad is None:
        if tensor.data.size != 1:
            raise RuntimeError("backward() without a grad argument needs a one-element "
                               f"output, got shape {tensor.shape}")
        return xp.ones_like(tensor.data)
    # a Tensor, an array or a nested list: the vector v of the product vᵀ J that backward takes
    grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad)
    if grad.shape != tensor.shape:
        raise ValueError(f"grad must have the output's shape {tensor.shape}, got {grad.shape}")
    return grad.astype(tensor.dtype, copy=False)


def unshared(ig, g, ctx, given) -> bool:
    """Whether ``ig``, a gradient ``ctx``'s backward returned, may become a leaf's ``.grad``
    without a copy: it is not the incoming gradient ``g`` (which the caller or another input
    may hold), not a view (``base``: its memory belongs to another array), not an array the node
    saved, and not already given to a leaf in this backward (``given``: their ids). At the
    sizes where memory matters (q, k, v of a long sequence) the copy would double each leaf
    gradient at the peak."""
    return ig is not g and getattr(ig, "base", ig) is None and id(ig) not in given and \
        not any(ig is saved for saved in ctx.saved_tensors or ())
