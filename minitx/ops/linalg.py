"""Linear algebra: batched broadcasting ``matmul``, ``linear`` (x Wᵀ + b) and ``einsum``."""
from __future__ import annotations

import functools

from ..autograd.function import Function
from ..backend import get_array_module, host_xp
from ._util import unbroadcast

__all__ = ["matmul", "linear", "einsum"]


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        xp = get_array_module(a, b)
        na, nb = ctx.needs_input_grad
        # Treat 1-d operands as matrices: a (k,) -> (1, k), b (k,) -> (k, 1).
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g = grad
        if b.ndim == 1:                          # first: a vector·vector grad is 0-d
            g = xp.expand_dims(g, -1)
        if a.ndim == 1:
            g = xp.expand_dims(g, -2)
        # On the 2-d views: dA = G Bᵀ and dB = Aᵀ G, summed over the batch axes an operand was
        # broadcast along, then reshaped back to a 1-d operand's shape.
        ga = gb = None
        if na:                                   # dL/dA = G Bᵀ   (..., n, m) @ (..., m, k)
            ga = unbroadcast(g @ xp.swapaxes(b2, -1, -2), a2.shape, a.dtype).reshape(a.shape)
        if nb:                                   # dL/dB = Aᵀ G   (..., k, n) @ (..., n, m)
            if b2.ndim == 2 and a2.ndim > 2:     # shared weight: fold the batch into rows
                k = a2.shape[-1]
                gb = (a2.reshape(-1, k).T @ g.reshape(-1, g.shape[-1])).astype(b.dtype, copy=False)
            else:
                gb = unbroadcast(xp.swapaxes(a2, -1, -2) @ g, b2.shape, b.dtype)
            gb = gb.reshape(b.shape)
        return ga, gb


# y = x Wᵀ + b in PyTorch's layout, weight (out, in): the layer every model calls most.
class Linear(Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        # (..., in) @ (in, out) -> (..., out), as one 2-d product: NumPy's batched matmul
        # would loop over the leading axes calling one small GEMM each.
        out = (x.reshape(-1, x.shape[-1]) @ weight.T).reshape(x.shape[:-1] + weight.shape[:1])
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        nx, nw, nb = ctx.needs_input_grad
        # Every batch axis is folded into rows: dx = G W, dW = Gᵀ x (summed over all rows at once),
        # db = Σ_rows G.
        g2 = grad.reshape(-1, grad.shape[-1])   # (rows, out)
        gx = (g2 @ weight).reshape(x.shape) if nx else None     # (..., out) @ (out, in)
        gw = (g2.T @ x.reshape(-1, x.shape[-1])).astype(weight.dtype, copy=False) if nw else None
        gb = None
        if nb and ctx.has_bias:              # Σ over rows as 1ᵀ G: one BLAS call, ~3× a sum
            xp = get_array_module(g2)
            gb = (xp.ones(g2.shape[0], dtype=g2.dtype) @ g2).astype(grad.dtype, copy=False)
        return gx, gw, gb


def _parse_einsum(subscripts, operands):
    """Explicit ``'ij,jk->ik'`` form with '...' expanded to letters; validates the operands."""
    subscripts = subscripts.replace(" ", "")
    if "->" in subscripts:
        lhs, rhs = subscripts.split("->")
    else:
        lhs, rhs = subscripts, None
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum subscripts name {len(terms)} operands, got {len(operands)}")
    # '...' becomes spare capital letters, as many as the most batch axes any operand has; an
    # operand with fewer takes the rightmost ones (broadcasting aligns axes from the right).
    used = set(c for c in subscripts if c.isalpha())
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    ell_ndim = 0
    for t, op in zip(terms, operands):
        if "..." in t:
            ell_ndim = max(ell_ndim, op.ndim - (len(t) - 3))
    ell = "".join(spare[:ell_ndim])
    # Each term must name every axis of its operand exactly once (a repeat would be a diagonal).
    fixed = []
    for t, op in zip(terms, operands):
        if "..." in t:
            k = op.ndim - (len(t) - 3)
            t = t.replace("...", ell[ell_ndim - k:] if k else "")
        if len(t) != op.ndim:
            raise ValueError(f"einsum term {t!r} has {len(t)} indices for an operand with "
                             f"{op.ndim} dimensions")
        if len(set(t)) != len(t):
            raise ValueError(f"einsum with a repeated index inside one operand ({t!r}, a "
                             "diagonal) is not supported")
        fixed.append(t)
    # Implicit output (no '->'): the '...' axes, then the indices that appear exactly once, in
    # alphabetical order — numpy.einsum's rule.
    if rhs is None:
        counts = {}
        for t in fixed:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    return fixed, rhs


@functools.lru_cache(maxsize=512)
def _contraction_order(subscripts: str, shapes: tuple) -> list:
    """NumPy's order of pairwise contractions for ``subscripts`` on operands of ``shapes``: it
    depends on the shapes alone, and finding it is Python work that can cost more than a small
    contraction itself, so it is found once per (subscripts, shapes)."""
    shells = [host_xp.broadcast_to(host_xp.empty((), dtype="float32"), s) for s in shapes]
    return host_xp.einsum_path(subscripts, *shells, optimize="greedy")[0]


def _einsum(xp, subscripts, operands):
    """``xp.einsum``; with three or more operands in an order of pairwise contractions."""
    optimize = len(operands) > 2
    if optimize and xp is host_xp:
        optimize = _contraction_order(subscripts, tuple(op.shape for op in operands))
    return xp.einsum(subscripts, *operands, optimize=optimize)


# The forward is numpy.einsum itself; with three or more operands an order of pairwise
# contractions (optimize=) replaces one loop over every index.
class Einsum(Function):
    @staticmethod
    def forward(ctx, *operands, terms, out_term):
        xp = get_array_module(*operands)
        ctx.save_for_backward(*operands)
        ctx.terms, ctx.out_term = terms, out_term
        return _einsum(xp, ",".join(terms) + "->" + out_term, operands)

    # Backward: each operand's gradient is another einsum, of the output gradient with the other
    # operands; operands that need no gradient are skipped.
    @staticmethod
    def backward(ctx, grad):
        operands = ctx.saved_tensors
        xp = get_array_module(grad)
        grads = []
        for i, (op, term) in enumerate(zip(operands, ctx.terms)):
            if not ctx.needs_input_grad[i]:
                grads.append(None)
                continue
            # dL/dX_i = einsum(grad, other operands -> indices of X_i). Indices of X_i found
            # nowhere else were summed away inside X_i alone: its gradient is constant along
            # them, so compute without them and broadcast back.
            others = [(o, t) for j, (o, t) in enumerate(zip(operands, ctx.terms)) if j != i]
            available = set(ctx.out_term).union(*[set(t) for _, t in others])
            kept = "".join(c for c in term if c in available)
            spec = ",".join([ctx.out_term] + [t for _, t in others]) + "->" + kept
            g = _einsum(xp, spec, [grad] + [o for o, _ in others])
            shape = [op.shape[term.index(c)] if c in kept else 1 for c in term]
            g = xp.broadcast_to(g.reshape(shape), op.shape)
            grads.append(g.astype(op.dtype, copy=False))
        return tuple(grads)


def matmul(a, b):
    """Matrix product with NumPy's rules: (..., n, k) @ (..., k, m) -> (..., n, m).

    Batch axes broadcast; 1-d operands act as a row (left) or column (right) vector.
    Backward: dA = G Bᵀ, dB = Aᵀ G, each summed over broadcast batch axes.
    """
    if len(a.shape) == 0 or len(b.shape) == 0:
        raise ValueError("matmul needs operands with at least one dimension, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    ka = a.shape[-1]
    kb = b.shape[-2] if len(b.shape) > 1 else b.shape[0]
    if ka != kb:
        raise ValueError(f"matmul: inner dimensions differ: a {tuple(a.shape)} @ b "
                         f"{tuple(b.shape)} ({ka} != {kb})")
    return MatMul.apply(a, b)


def linear(x, weight, bias=None):
    """y = x Wᵀ + b, PyTorch's layout: x (..., in), weight (out, in), bias (out,) → (..., out).

    One fused Function: dx = G W, dW = Gᵀ x (rows of all batch axes), db = Σ G.
    """
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: x has {x.shape[-1]} features but weight expects "
                         f"{weight.shape[-1]} (weight shape {tuple(weight.shape)})")
    return Linear.apply(x, weight, bias)


def einsum(subscripts: str, *operands):
    """Einstein summation (``numpy.einsum``), differentiable in every operand.

    ``'bhqd,bhkd->bhqk'`` contracts d. Backward for operand i contracts the output gradient
    with the other operands onto operand i's indices. '...' is supported; a repeated index
    within one operand (a diagonal) is not.
    """
    terms, out_term = _parse_einsum(subscripts, operands)
    return Einsum.apply(*operands, terms=terms, out_term=out_term)
