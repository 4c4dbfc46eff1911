"""Reversible residual layers and chunked feed-forward: the Reformer's memory savings.

Gomez, Ren, Urtasun & Grosse (2017), "The Reversible Residual Network"; used for
transformers by Kitaev, Kaiser & Levskaya (2020), "Reformer".

A reversible block splits the activations in two halves and computes

    y₁ = x₁ + F(x₂)              x₂ = y₂ − G(y₁)
    y₂ = x₂ + G(y₁)      ⇔      x₁ = y₁ − F(x₂)

so a block's inputs can be *recomputed from its outputs*. ``ReversibleSequence`` runs a
stack of blocks as one Function that saves only the final outputs (y₁, y₂): in backward
it walks the blocks from last to first, reconstructs each block's inputs, re-runs F and G
with the graph on, and backpropagates through them. Saved activation memory is O(1) in the
depth (instead of O(depth)); the price is one extra forward of F and G per block. Gradients
equal the plain composition up to rounding (reconstruction is exact in exact arithmetic).

``chunked_feed_forward(ff, x, chunks)`` applies a position-wise layer to slices of the
sequence and concatenates: equal to ff(x) (forward and gradients), peak memory of the
hidden (B, N, 4E) activation divided by ``chunks`` (at the cost of keeping each chunk's
graph unless combined with checkpointing/reversibility).
"""
from __future__ import annotations

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.grad_mode import enable_grad, no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module
from .module import Module, ModuleList

__all__ = ["ReversibleBlock", "ReversibleSequence", "chunked_feed_forward"]


class ReversibleBlock(Module):
    """y₁ = x₁ + F(x₂), y₂ = x₂ + G(y₁); ``f`` and ``g`` are Modules mapping (..., E) → (..., E).

    ``forward(x1, x2)`` is the plain (graph-recording) form; ``inverse(y1, y2)`` recovers
    (x1, x2). Use inside ``ReversibleSequence`` for the memory savings.
    """

    def __init__(self, f: Module, g: Module):
        super().__init__()
        self.f, self.g = f, g

    def forward(self, x1, x2):
        y1 = x1 + self.f(x2)
        y2 = x2 + self.g(y1)
        return y1, y2

    def inverse(self, y1, y2):
        """(y1, y2) → (x1, x2), without a graph."""
        with no_grad():
            x2 = y2 - self.g(y1)
            x1 = y1 - self.f(x2)
        return x1, x2


class _ReversibleFunction(Function):
    """Runs the blocks without a graph; saves only (y₁, y₂); backward inverts block by block."""

    @staticmethod
    def forward(ctx, x1, x2, marker, *, blocks):
        with no_grad():
            y1, y2 = Tensor._wrap(x1), Tensor._wrap(x2)
            for block in blocks:
                y1, y2 = block(y1, y2)
        ctx.blocks = blocks
        ctx.save_for_backward(y1.data, y2.data)
        ctx.half = x1.shape[-1]
        xp = get_array_module(x1)
        return xp.concatenate([y1.data, y2.data], axis=-1)

    # Backward walks the blocks in reverse, rebuilding each input from its output,
    # x2 = y2 − G(y1), x1 = y1 − F(x2), with a graph, to get the gradients through G and F.
    @staticmethod
    def backward(ctx, grad):
        y1, y2 = ctx.saved_tensors
        dy1, dy2 = grad[..., :ctx.half], grad[..., ctx.half:]
        for block in reversed(ctx.blocks):
            # Recompute G(y1) with a graph: gives x2 and the gradient through G.
            with enable_grad():
                z1 = Tensor._wrap(y1, True)
                gz = block.g(z1)
            x2 = y2 - gz.data
            gz.backward(Tensor._wrap(dy2))          # params of G accumulate; z1.grad = Gᵀ dy2
            dz1 = dy1 + z1.grad.data if z1.grad is not None else dy1   # total gradient at y1
            with enable_grad():
                z2 = Tensor._wrap(x2, True)
                fz = block.f(z2)
            x1 = y1 - fz.data
            fz.backward(Tensor._wrap(dz1))          # params of F accumulate
            dy1, dy2 = dz1, (dy2 + z2.grad.data if z2.grad is not None else dy2)   # w.r.t. (x1, x2)
            y1, y2 = x1, x2
        return dy1, dy2, None


class ReversibleSequence(Module):
    """A stack of ``ReversibleBlock``s whose backward recomputes activations from outputs.

    ``forward(x1, x2)`` → (y1, y2), each (..., E). Parameters inside the blocks receive
    their gradients during the recomputation (as with ``minitx.checkpoint``).
    """

    def __init__(self, blocks):
        super().__init__()
        self.blocks = ModuleList(list(blocks))

    def forward(self, x1, x2):
        if tuple(x1.shape) != tuple(x2.shape):
            raise ValueError(f"ReversibleSequence: x1 and x2 must have the same shape, got "
                             f"{tuple(x1.shape)} and {tuple(x2.shape)}")
        xp = get_array_module(x1.data)
        marker = Tensor._wrap(xp.zeros((), dtype=x1.dtype), True)   # record even if x needs no grad
        y = _ReversibleFunction.apply(x1, x2, marker, blocks=list(self.blocks))
        half = x1.shape[-1]
        return F.getitem(y, (Ellipsis, slice(0, half))), F.getitem(y, (Ellipsis, slice(half, None)))


def chunked_feed_forward(ff, x, chunks: int, axis: int = 1):
    """Apply a position-wise ``ff`` to ``chunks`` slices of x along ``axis`` and concatenate.

    Equal to ff(x) when ff acts on each position independently; the hidden activation of
    only one chunk exists at a time in forward (Kitaev et al. 2020, §3 "Chunking").
    """
    chunks = validate.positive_int(chunks, "chunks", owner="chunked_feed_forward")
    n = x.shape[axis]
    size = -(-n // chunks)
    pieces = []
    for start in range(0, n, size):
        index = [slice(None)] * len(x.shape)
        index[axis] = slice(start, min(start + size, n))
        pieces.append(ff(F.getitem(x, tuple(index))))
    return pieces[0] if len(pieces) == 1 else F.concatenate(pieces, axis=axis)
