r"""Reverse-mode differentiation: walk the graph from the output back to the leaves.

The graph's nodes are the Function contexts (``tensor._ctx``); each is numbered, when it is
recorded, by a counter that only grows (``ctx.seq``). ``backward``

1. visits the nodes that receive a gradient in *decreasing* ``seq``: a node is created after
   every node it consumes, so all its consumers — the nodes that send it gradient — come
   before it, and its gradient is complete when it is visited (a topological order, found
   with a heap as the walk goes: no separate pass, no recursion, so a 100,000-op chain is
   fine);
2. calls each ``Function.backward`` with that summed gradient, and checks every returned
   gradient's shape and dtype against its input;
3. sums gradients that meet at a node (a tensor used twice) and accumulates into each
   leaf's ``.grad`` (so two backward calls add up);
4. frees what each node saved, unless ``retain_graph=True``.

Step 2 is the chain rule, one vector-Jacobian product per node: for y = f(x₁, …, x_k) and a
loss L, each input receives

$$
\frac{\partial L}{\partial x_i} \mathrel{+}=
\left( \frac{\partial y}{\partial x_i} \right)^{\!\top} \frac{\partial L}{\partial y}
$$

and the sum runs over every use of x_i (step 3).

Two debugging aids cost nothing when unused: a saved array changed in place after its
forward raises (``versions``), and under ``detect_anomaly()`` a NaN or infinite gradient
raises, naming the op and the line of user code where its forward ran (``anomaly``).
"""
from __future__ import annotations

from heapq import heappop, heappush

from .. import backend, configuration
from . import versions
from .anomaly import AnomalyError, _state as _anomaly
from .function import _describe
from .tensor import Tensor
from .versions import SavedArrayModified, written_after

__all__ = ["backward", "topological_order"]


def topological_order(root):
    """Contexts reachable from ``root`` (a context), each before all of its parents' contexts:
    the reachable nodes in decreasing creation number ``seq`` (see the module docstring)."""
    seen = {root}
    stack = [root]
    while stack:
        for p in stack.pop().parents:
            child = p._ctx if isinstance(p, Tensor) else None
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    return sorted(seen, key=lambda ctx: ctx.seq, reverse=True)


def _check(ctx, parent, grad):
    """``grad``, the gradient ``ctx``'s backward returned for its input ``parent``: its shape
    must be the input's; its dtype is made the input's (the dtype rule: forward promotes like
    NumPy, each input's gradient comes back in that input's own dtype — cast here, in one
    place, for every op)."""
    shape, dtype = parent.data.shape, parent.data.dtype
    if getattr(grad, "shape", None) != shape:
        raise RuntimeError(
            f"{ctx.fn.__name__}.backward returned a gradient of shape "
            f"{getattr(grad, 'shape', None)} for input {_index(ctx, parent)}, expected {shape}")
    if grad.dtype != dtype:
        if grad.dtype.kind != "f" or dtype.kind != "f":
            raise RuntimeError(
                f"{ctx.fn.__name__}.backward returned a gradient of dtype {grad.dtype} for "
                f"input {_index(ctx, parent)}, expected {dtype}")
        grad = grad.astype(dtype)
    return grad


def _index(ctx, parent):
    """The position of ``parent`` among the inputs of ``ctx``, for an error message."""
    return next(i for i, p in enumerate(ctx.parents) if p is parent)


def _check_node(ctx, stamp):
    """Raise if backward already ran through ``ctx`` (its saved arrays are freed) or if an
    array it saved was written in place after its forward (looked at only when some in-place
    write happened since then: ``stamp`` is the count of writes now)."""
    if ctx.freed:
        raise RuntimeError(
            f"trying to backward through {ctx.fn.__name__} a second time: its saved "
            "arrays were freed; call backward(retain_graph=True) the first time")
    if ctx.stamp != stamp:
        _check_saved(ctx)


def _check_saved(ctx):
    """Raise if an array ``ctx`` saved for its backward was written in place after its
    forward."""
    for i, saved in enumerate(ctx.saved_tensors or ()):
        if saved is not None and hasattr(saved, "shape") and written_after(saved, ctx.stamp):
            where = f"; its forward ran at {ctx.trace}" if getattr(ctx, "trace", None) else ""
            raise SavedArrayModified(
                f"{ctx.fn.__name__}: array {i} saved for its backward ({_describe(saved)}) was "
                f"modified in place after the forward (by copy_, fill_, zero_, an in-place "
                f"op or an optimizer step){where}; the gradient would be wrong. Do the "
                "in-place change after backward(), or change a .clone() instead")


def _check_finite(ctx, parent, grad):
    """Anomaly mode: a gradient with NaN or infinity raises, naming the op and its forward."""
    xp = backend.get_array_module(grad)
    if grad.dtype.kind == "f" and not bool(xp.isfinite(grad).all()):
        what = "nan" if bool(xp.isnan(grad).any()) else "inf"
        where = getattr(ctx, "trace", None) or "before anomaly mode was turned on"
        raise AnomalyError(
            f"{ctx.fn.__name__}.backward returned {what} in the gradient of input "
            f"{_index(ctx, parent)} "
            f"({_describe(grad)}); its forward ran at {where}")


def _accumulate_leaf(leaf, grad, owned=False):
    """Add ``grad`` into ``leaf.grad``. A first gradient is copied unless ``owned``: the engine
    knows that no one else holds it (see ``_unshared``), and the leaf can keep it as it is."""
    if leaf.grad is None:
        leaf.grad = Tensor._wrap(grad if owned else grad.copy(), False)
    else:
        leaf.grad = Tensor._wrap(leaf.grad.data + grad, False)


def _unshared(ig, g, ctx, given):
    """Whether ``ig``, a gradient ``ctx``'s backward returned, may become a leaf's ``.grad``
    without a copy: it is not the incoming gradient ``g`` (which the caller or another input
    may hold), not a view (``base``: its memory belongs to another array), not an array the node
    saved, and not already given to a leaf in this backward (``given``: their ids). At the
    sizes where memory matters (q, k, v of a long sequence) the copy would double each leaf
    gradient at the peak."""
    return ig is not g and getattr(ig, "base", ig) is None and id(ig) not in given and \
        not any(ig is saved for saved in ctx.saved_tensors or ())


def _output_grad(tensor, grad):
    """The gradient of ``tensor`` that starts the walk: ``grad`` as an array of the output's
    shape and dtype, or 1 for a one-element output."""
    if not tensor.requires_grad:
        raise RuntimeError("backward() called on a tensor that does not require grad "
                           "(no input of the computation had requires_grad=True)")
    xp = backend.get_array_module(tensor.data)
    if grad is None:
        if tensor.data.size != 1:
            raise RuntimeError("backward() without a grad argument needs a one-element "
                               f"output, got shape {tensor.shape}")
        return xp.ones_like(tensor.data)
    grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad)
    if grad.shape != tensor.shape:
        raise ValueError(f"grad must have the output's shape {tensor.shape}, got {grad.shape}")
    return grad.astype(tensor.dtype, copy=False)


def backward(tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``tensor`` (see the module docstring)."""
    fast = configuration.twin("backward")        # the fast layer's, when it is on
    if fast is not None:
        return fast(tensor, grad, retain_graph)
    grad = _output_grad(tensor, grad)
    if tensor._ctx is None:                       # backward on a leaf: d(leaf)/d(leaf) = 1
        _accumulate_leaf(tensor, grad)
        return
    stamp = versions.state["stamp"]   # in-place writes so far (see versions)
    anomaly = _anomaly["enabled"] and _anomaly.get("check_nan", True)
    root = tensor._ctx
    grads = {root: grad}              # node -> the gradient of its output, summed so far
    heap = [(-root.seq, root)]        # nodes with a gradient, the latest created on top
    given = set()                     # ids of the arrays handed to leaves (see _unshared)
    while heap:
        ctx = heappop(heap)[1]
        g = grads.pop(ctx)            # dL/dy, complete: every consumer of y came before
        _check_node(ctx, stamp)       # not freed yet; what it saved still as it was
        input_grads = ctx.fn.backward(ctx, g)          # dL/dx_i = (dy/dx_i)ᵀ dL/dy, each i
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.parents):
            raise RuntimeError(f"{ctx.fn.__name__}.backward returned {len(input_grads)} "
                               f"gradients for {len(ctx.parents)} inputs")
        for parent, need, ig in zip(ctx.parents, ctx.needs_input_grad, input_grads):
            if ig is None or not need:
                continue
            if getattr(ig, "shape", None) != parent.data.shape or ig.dtype != parent.data.dtype:
                ig = _check(ctx, parent, ig)           # a wrong shape, or a cast to make
            if anomaly:
                _check_finite(ctx, parent, ig)
            node = parent._ctx
            if node is None:                           # a leaf: into its .grad
                _accumulate_leaf(parent, ig, _unshared(ig, g, ctx, given))
                given.add(id(ig))
            elif node in grads:                        # x_i met again: the sum of step 3
                grads[node] = grads[node] + ig
            else:
                grads[node] = ig
                heappush(heap, (-node.seq, node))
        if not retain_graph:
            ctx.free()
