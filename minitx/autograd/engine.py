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
raises, naming the op and the line of user code where its forward ran (``anomaly``). Those
checks, and the words of every error here, live in ``checks.py``.
"""
from __future__ import annotations

from heapq import heappop, heappush

from . import versions
from .anomaly import _state as _anomaly, check_backward as _check_finite
from .checks import check_grad as _check, check_node as _check_node, \
    output_grad as _output_grad, unshared as _unshared
from .tensor import Tensor

__all__ = ["backward", "topological_order"]


def topological_order(root):
    """Contexts reachable from ``root`` (a context), each before all of its parents' contexts:
    the reachable nodes in decreasing creation number ``seq`` (see the module docstring).
    ``backward`` does not call it (its heap finds the same order as it goes); it is here to
    show that order, and to walk a graph (``for ctx in topological_order(loss._ctx)``)."""
    # a depth-first search with an explicit stack (no recursion: a long chain is fine) …
    seen = {root}
    stack = [root]
    while stack:
        for p in stack.pop().parents:
            child = p._ctx if isinstance(p, Tensor) else None
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)
    # … then the creation numbers: whoever consumes a tensor was created after it
    return sorted(seen, key=lambda ctx: ctx.seq, reverse=True)


def _accumulate_leaf(leaf, grad, owned=False):
    """Add ``grad`` into ``leaf.grad``. A first gradient is copied unless ``owned``: the engine
    knows that no one else holds it (see ``checks.unshared``), and the leaf can keep it."""
    # .grad accumulates across backward calls (PyTorch's rule): zero it between steps
    if leaf.grad is None:
        leaf.grad = Tensor._wrap(grad if owned else grad.copy(), False)
    else:
        leaf.grad = Tensor._wrap(leaf.grad.data + grad, False)


def backward(tensor, grad=None, retain_graph: bool = False) -> None:
    """Backpropagate from ``tensor`` (see the module docstring)."""
    # The walk starts with dL/dL: 1 for a one-element loss, else the grad given
    grad = _output_grad(tensor, grad)
    if tensor._ctx is None:                       # backward on a leaf: d(leaf)/d(leaf) = 1
        _accumulate_leaf(tensor, grad)
        return
    stamp = versions.state["stamp"]   # in-place writes so far (see versions)
    anomaly = _anomaly["enabled"] and _anomaly.get("check_nan", True)

    # The walk. `grads` holds, for each node met but not yet visited, the sum of the
    # gradients its consumers sent so far. The heap pops the node with the largest `seq`:
    # since a node's consumers were all created after it, they all have larger numbers and
    # were all visited before it — so when a node is popped its sum is complete.
    root = tensor._ctx
    grads = {root: grad}              # node -> the gradient of its output, summed so far
    heap = [(-root.seq, root)]        # nodes with a gradient, the latest created on top
    given = set()                     # ids of the arrays handed to leaves (see unshared)
    while heap:
        ctx = heappop(heap)[1]
        g = grads.pop(ctx)            # dL/dy, complete: every consumer of y came before
        _check_node(ctx, stamp)       # not freed yet; what it saved still as it was

        # The chain rule at this node: one vector-Jacobian product per input, written by
        # the op's backward on raw arrays; one gradient (or None) per positional input
        input_grads = ctx.fn.backward(ctx, g)          # dL/dx_i = (dy/dx_i)ᵀ dL/dy, each i
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.parents):
            raise RuntimeError(f"{ctx.fn.__name__}.backward returned {len(input_grads)} "
                               f"gradients for {len(ctx.parents)} inputs")

        # Send each input its gradient. A constant, or an input that needs none, is skipped;
        # a gradient of the wrong shape raises, one of another float dtype is cast back
        for parent, need, ig in zip(ctx.parents, ctx.needs_input_grad, input_grads):
            if ig is None or not need:
                continue
            if getattr(ig, "shape", None) != parent.data.shape or ig.dtype != parent.data.dtype:
                ig = _check(ctx, parent, ig)           # a wrong shape, or a cast to make
            if anomaly:
                _check_finite(ctx, parent, ig)
            # A leaf keeps its gradient in .grad; an inner node's gradient waits in `grads`,
            # summed with the other uses of the same tensor (the Σ of step 3), until popped
            node = parent._ctx
            if node is None:                           # a leaf: into its .grad
                _accumulate_leaf(parent, ig, _unshared(ig, g, ctx, given))
                given.add(id(ig))
            elif node in grads:                        # x_i met again: the sum of step 3
                grads[node] = grads[node] + ig
            else:
                grads[node] = ig
                heappush(heap, (-node.seq, node))

        # Done with this node: drop what it saved and its links to its inputs, so the
        # activations can be freed as the walk goes (a second backward then raises)
        if not retain_graph:
            ctx.free()
