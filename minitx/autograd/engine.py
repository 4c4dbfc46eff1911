r"""Reverse-mode differentiation: walk the graph from the output back to the leaves.

The graph's nodes are the Function contexts (``tensor._ctx``). ``backward``

1. orders the nodes reachable from the output topologically with an explicit stack (no
   recursion, so a 100,000-op chain is fine);
2. visits them output-first, calling each ``Function.backward`` with the summed gradient of
   its output, and checks every returned gradient's shape and dtype against its input;
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
"""
from __future__ import annotations

from .. import backend
from .tensor import Tensor

__all__ = ["backward", "topological_order"]


def topological_order(root):
    """Contexts reachable from ``root`` (a context), each before all of its parents' contexts."""
    order = []
    seen = {root}
    stack = [(root, iter(root.parents))]
    while stack:
        node, parents = stack[-1]
        for p in parents:
            child = p._ctx if isinstance(p, Tensor) else None
            if child is not None and child not in seen:
                seen.add(child)
                stack.append((child, iter(child.parents)))
                break
        else:                      # every parent done: node can be placed
            stack.pop()
            order.append(node)
    order.reverse()                # output first
    return order


def _check(fn, index, parent, grad):
    """The gradient for input ``index`` of ``fn``: its shape must be the input's; its dtype is
    made the input's (the dtype rule: forward promotes like NumPy, each input's gradient comes
    back in that input's own dtype — cast here, in one place, for every op)."""
    shape, dtype = parent.data.shape, parent.data.dtype
    if getattr(grad, "shape", None) != shape:
        raise RuntimeError(
            f"{fn.__name__}.backward returned a gradient of shape {getattr(grad, 'shape', None)} "
            f"for input {index}, expected {shape}")
    if grad.dtype != dtype:
        if grad.dtype.kind != "f" or dtype.kind != "f":
            raise RuntimeError(
                f"{fn.__name__}.backward returned a gradient of dtype {grad.dtype} for input "
                f"{index}, expected {dtype}")
        grad = grad.astype(dtype)
    return grad


def _accumulate_leaf(leaf, grad):
    if leaf.grad is None:
        leaf.grad = Tensor._wrap(grad.copy(), False)   # copy: a grad may be shared by inputs
    else:
        leaf.grad = Tensor._wrap(leaf.grad.data + grad, False)


def backward(tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``tensor`` (see the module docstring)."""
    if not tensor.requires_grad:
        raise RuntimeError("backward() called on a tensor that does not require grad "
                           "(no input of the computation had requires_grad=True)")
    xp = backend.get_array_module(tensor.data)
    if grad is None:
        if tensor.data.size != 1:
            raise RuntimeError("backward() without a grad argument needs a one-element "
                               f"output, got shape {tensor.shape}")
        grad = xp.ones_like(tensor.data)
    else:
        grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad)
        if grad.shape != tensor.shape:
            raise ValueError(f"grad must have the output's shape {tensor.shape}, got {grad.shape}")
        grad = grad.astype(tensor.dtype, copy=False)

    if tensor._ctx is None:                       # backward on a leaf: d(leaf)/d(leaf) = 1
        _accumulate_leaf(tensor, grad)
        return

    grads = {tensor._ctx: grad}
    for ctx in topological_order(tensor._ctx):
        g = grads.pop(ctx, None)
        if g is None:
            continue
        if ctx.freed:
            raise RuntimeError(
                f"trying to backward through {ctx.fn.__name__} a second time: its saved "
                "arrays were freed; call backward(retain_graph=True) the first time")
        input_grads = ctx.fn.backward(ctx, g)
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.parents):
            raise RuntimeError(f"{ctx.fn.__name__}.backward returned {len(input_grads)} "
                               f"gradients for {len(ctx.parents)} inputs")
        for i, (parent, need, ig) in enumerate(zip(ctx.parents, ctx.needs_input_grad,
                                                   input_grads)):
            if not need or ig is None:
                continue
            ig = _check(ctx.fn, i, parent, ig)
            node = parent._ctx
            if node is None:
                _accumulate_leaf(parent, ig)
            elif node in grads:
                grads[node] = grads[node] + ig
            else:
                grads[node] = ig
        if not retain_graph:
            ctx.free()
