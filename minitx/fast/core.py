"""The engine's two hot loops, with their per-op costs pared: twins of ``Function.apply`` and
``engine.backward``.

Every op of a small model passes through ``Function.apply`` once and through the backward loop
once, and at the sizes of a character GPT the op itself takes about as long as the Python
around it. These twins run the same steps as their references (``minitx/autograd/function.py``
and ``engine.py``) in the same order, with the same checks and the same errors — so they give
the same graph and the same gradients, bit for bit — but write them the way CPython runs
fastest: a class test before ``isinstance``, the context and the output Tensor made without
their constructors' calls, a Python number met in + − × ÷ cast once and kept
(``fast/numbers.py``), the grad-mode and version counters read from their dicts, a gradient's
shape and dtype compared inline before the checking function is called. What they
buy is measured in ``benchmarks/README.md``; ``tests/fast/test_core.py`` checks them against the
references.
"""
from __future__ import annotations

from heapq import heappop, heappush

import numpy

from .. import backend, configuration
from ..autograd import engine, function, versions
from ..autograd.anomaly import _state as _anomaly, check_forward
from ..autograd.function import Context
from ..autograd.grad_mode import _state as _grad_mode
from ..autograd.tensor import Tensor
from ..ops.elementwise import Add, Div, Mul, Sub
from .numbers import _PY_NUMBERS as _NUMBERS, cached_operand

__all__ = ["apply", "backward"]

_new = object.__new__
_ndarray, _generic = numpy.ndarray, numpy.generic
_cupy, _versions = backend._cupy, versions.state
_ARITHMETIC = frozenset((Add, Sub, Mul, Div))


def apply(cls, inputs, kwargs):
    """Fast twin of ``Function.apply`` (``cls.apply(*inputs, **kwargs)``): the same steps, the
    context and the result Tensor filled in place, so the node and the output are the
    reference's."""
    if cls in _ARITHMETIC:             # a Python number in + − × ÷: cast once, kept
        a, b = inputs
        if b.__class__ in _NUMBERS:
            inputs = (a, cached_operand(a, b))
        elif a.__class__ in _NUMBERS:
            inputs = (cached_operand(b, a), b)
    ctx = _new(Context)                # Context(), without the call: what __init__ sets, here
    ctx.saved_tensors = ()
    arrays, needs = [], []
    for a in inputs:                   # Tensors first; an ndarray constant skips isinstance
        if a.__class__ is Tensor or (a.__class__ is not _ndarray and isinstance(a, Tensor)):
            arrays.append(a.data)
            needs.append(a.requires_grad)
        else:
            arrays.append(a)
            needs.append(False)
    record = True in needs and _grad_mode["enabled"]
    if _cupy["module"] is not None:
        arrays, kwargs = function._one_device(cls, inputs, arrays, kwargs)
    try:
        out = cls.forward(ctx, *arrays, **kwargs) if kwargs else cls.forward(ctx, *arrays)
    except (ValueError, IndexError, TypeError) as exc:
        if function._NAMED.match(str(exc)):
            raise
        raise function._in_op(cls, exc, arrays) from exc
    if out.__class__ is not _ndarray and isinstance(out, _generic):
        out = numpy.asarray(out)                             # NumPy reductions return scalars
    if _anomaly["enabled"]:
        ctx.trace = check_forward(cls, arrays, kwargs, out)
    result = _new(Tensor)
    result.data = out
    result.grad = result._ctx = None
    result.requires_grad = record
    if record:
        ctx.fn = cls
        ctx.parents = inputs
        ctx.needs_input_grad = needs
        ctx.seq = next(function._sequence)
        ctx.stamp = _versions["stamp"]
        result._ctx = ctx
    return result


def backward(tensor, grad, retain_graph):
    """Fast twin of ``engine.backward``: the same walk, the same checks and errors, each
    gradient's shape and dtype compared inline (``engine._check`` is called only to cast or to
    raise), each node freed as ``ctx.free()`` frees it."""
    grad = engine._output_grad(tensor, grad)
    if tensor._ctx is None:
        engine._accumulate_leaf(tensor, grad)
        return
    stamp = _versions["stamp"]
    anomaly = _anomaly["enabled"] and _anomaly.get("check_nan", True)
    root = tensor._ctx
    grads = {root: grad}
    heap = [(-root.seq, root)]
    given = set()
    while heap:
        ctx = heappop(heap)[1]
        g = grads.pop(ctx)
        parents = ctx.parents
        if parents is None or ctx.stamp != stamp:             # freed, or written since
            engine._check_node(ctx, stamp)
        input_grads = ctx.fn.backward(ctx, g)
        if input_grads.__class__ is not tuple:
            input_grads = (input_grads,)
        if len(input_grads) != len(parents):
            raise RuntimeError(f"{ctx.fn.__name__}.backward returned {len(input_grads)} "
                               f"gradients for {len(parents)} inputs")
        for parent, need, ig in zip(parents, ctx.needs_input_grad, input_grads):
            if ig is None or not need:
                continue
            data = parent.data
            if ig.__class__ is not data.__class__ or ig.shape != data.shape or \
                    (ig.dtype is not data.dtype and ig.dtype != data.dtype):
                ig = engine._check(ctx, parent, ig)
            if anomaly:
                engine._check_finite(ctx, parent, ig)
            node = parent._ctx
            if node is None:
                engine._accumulate_leaf(parent, ig, engine._unshared(ig, g, ctx, given))
                given.add(id(ig))
            elif node in grads:
                grads[node] = grads[node] + ig
            else:
                grads[node] = ig
                heappush(heap, (-node.seq, node))
        if not retain_graph:           # ctx.free(), without the call
            ctx.saved_tensors = ctx.parents = None
            ctx.__dict__.clear()


configuration.register_twin("apply", apply)
configuration.register_twin("backward", backward)
