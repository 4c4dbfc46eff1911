"""``Function`` and its context: the unit of differentiation.

Every differentiable operation is a subclass with two static methods working on *raw
arrays* (``numpy`` or ``cupy``), never on Tensors::

    class Exp(Function):
        @staticmethod
        def forward(ctx, x):              # x: raw array
            y = get_array_module(x).exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):          # grad: dL/dy, same shape as y
            (y,) = ctx.saved_tensors
            return grad * y               # dL/dx = dL/dy * exp(x)

and is called as ``Exp.apply(tensor)``. ``apply`` unwraps the inputs, runs ``forward``,
wraps the result in a Tensor and, when some input requires a gradient and grad mode is on,
records the context as the output's graph node. ``backward`` returns one gradient per
positional input (``None`` where there is none to give); the engine checks their shapes and
dtypes. Keyword arguments of ``apply`` are passed to ``forward`` and are not differentiated.

``backward`` reads ``grad`` and never writes into it (it may be shared: returned for two inputs,
or already some leaf's ``.grad``), and returns new arrays, ``grad`` itself, or views: the engine
hands a new array that nobody else holds to a leaf as its ``.grad`` without copying it.
"""
from __future__ import annotations

import itertools
import re

import numpy

from .. import backend, configuration
from . import versions
from .anomaly import _state as _anomaly, user_frame
from .grad_mode import _state as _grad_mode
from .tensor import Tensor

__all__ = ["Function", "Context"]


class Context:
    """What one Function call remembers for its backward: the graph node.

    Attributes, set when the node is recorded: ``fn`` (the Function class), ``parents`` (the
    positional inputs; Tensors or constants), ``needs_input_grad`` (a list of one bool per
    input), ``saved_tensors`` (what forward saved), ``seq`` (its
    creation number: the engine visits nodes in decreasing ``seq``), ``stamp`` (the in-place
    write counter at the forward, see ``versions``), ``trace`` (where the forward ran, under
    anomaly mode) and any attribute forward sets (``ctx.axis = axis``).
    """

    __slots__ = ("fn", "parents", "needs_input_grad", "saved_tensors", "seq", "stamp",
                 "trace", "__dict__")

    def __init__(self):
        self.saved_tensors = ()

    def save_for_backward(self, *arrays) -> None:
        """Keep ``arrays`` (raw arrays or None) for ``backward``; freed after backward. If one
        is changed in place through minitx before the backward, the backward raises
        (``minitx.autograd.versions``)."""
        self.saved_tensors = arrays

    @property
    def freed(self) -> bool:
        """Whether backward already ran through this node and freed it."""
        return self.parents is None

    def free(self) -> None:
        """Drop everything saved for backward, and the links to the inputs (called by the
        engine unless retain_graph): after backward the graph holds no array any more — the
        intermediate tensors are freed as soon as the caller lets go of them."""
        self.saved_tensors = self.parents = None
        self.__dict__.clear()


class Function:
    """Base class of every differentiable operation (see the module docstring)."""

    @staticmethod
    def forward(ctx, *arrays, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs, **kwargs):
        """Run ``forward`` on the inputs' arrays and record the graph node when needed.

        ``arrays = [a.data if Tensor else a]``; ``out = forward(ctx, *arrays)``; ``ctx`` is
        recorded as ``out``'s node iff grad mode is on and some input requires grad.
        """
        fast = configuration.twin("apply")          # the fast layer's, when it is on
        if fast is not None:
            return fast(cls, inputs, kwargs)
        arrays, needs = [], []                     # each input's array; needs its gradient?
        for a in inputs:
            is_tensor = isinstance(a, Tensor)
            arrays.append(a.data if is_tensor else a)
            needs.append(is_tensor and a.requires_grad)
        record = _grad_mode["enabled"] and any(needs)        # grad mode on (no_grad off)
        if backend._cupy["module"] is not None:    # the device rule: once CuPy is loaded
            arrays, kwargs = _one_device(cls, inputs, arrays, kwargs)
        ctx = Context()
        try:
            out = cls.forward(ctx, *arrays, **kwargs)
        except (ValueError, IndexError, TypeError) as exc:
            if _NAMED.match(str(exc)):                           # already says who refused
                raise
            raise _in_op(cls, exc, arrays) from exc              # NumPy's words, with the op
        if isinstance(out, numpy.generic):         # NumPy reductions return scalars
            out = numpy.asarray(out)
        result = Tensor._wrap(out, record)
        if record:
            ctx.fn, ctx.parents, ctx.needs_input_grad = cls, inputs, needs
            ctx.seq = next(_sequence)              # creation order: the engine's walk order
            ctx.stamp = versions.state["stamp"]    # in-place writes so far (see versions)
            if _anomaly["enabled"]:
                ctx.trace = user_frame()           # where the forward ran, for the message
            result._ctx = ctx
        return result


_sequence = itertools.count()
_NAMED = re.compile(r"[A-Za-z_][\w.]*: ")     # "var: …", "Embedding: …" — minitx's own errors


def _describe(a) -> str:
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return f"{a.dtype}{tuple(a.shape)}"
    if isinstance(a, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in a) + ")"
    return type(a).__name__


def _in_op(fn, exc, arrays):
    """The error ``exc`` raised inside ``fn.forward``, re-raised once, here, with the op's name
    and its inputs' dtypes and shapes (so a user never reads a bare NumPy message)."""
    kind = next(k for k in (TypeError, IndexError, ValueError) if isinstance(exc, k))
    base = type(exc) if type(exc) in (ValueError, IndexError, TypeError) or \
        type(exc).__name__ == "OptionError" else kind
    inputs = ", ".join(_describe(a) for a in arrays)
    return base(f"{fn.__name__}: {exc} (inputs: {inputs})")


def _one_device(fn, inputs, arrays, kwargs):
    """The device rule, enforced here for every op: Tensors of one call live on one device;
    a NumPy array given with device Tensors (a mask, an index array, a constant) is copied to
    the device once; a device array given with host Tensors is an error."""
    devices = {a.device for a in inputs if isinstance(a, Tensor)}
    if len(devices) > 1:
        where = ", ".join(f"input {i} on {a.device}" for i, a in enumerate(inputs)
                          if isinstance(a, Tensor))
        raise RuntimeError(f"{fn.__name__}: expected all tensors on one device, got {where}; "
                           "move them with .to('cuda') or .to('cpu')")
    if devices == {"cuda"}:
        move = backend.to_device_of
        like = next(a for a in arrays if backend.device_of(a) == "cuda")
        arrays = [_deep(move, a, like) for a in arrays]
        kwargs = {k: _deep(move, v, like) for k, v in kwargs.items()}
    elif devices == {"cpu"}:
        for a in list(arrays) + list(kwargs.values()):
            if backend.device_of(a) == "cuda":
                raise RuntimeError(f"{fn.__name__}: a CUDA array was given with CPU tensors; "
                                   "move it with minitx.backend.to_host(...) or the tensors "
                                   "with .to('cuda')")
    return arrays, kwargs


def _deep(move, value, like):
    """``move`` applied to ``value`` and to the arrays inside a tuple/list (an index)."""
    if isinstance(value, tuple):
        return tuple(_deep(move, v, like) for v in value)
    if isinstance(value, list):
        return [_deep(move, v, like) for v in value]
    return move(value, like)
