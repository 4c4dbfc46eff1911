"""Layer normalisation with every row reduction as a matrix-vector product.

The reference (``minitx/ops/norm.py``'s ``LayerNorm``) takes μ, σ² and the backward's three
means with NumPy's ``mean`` and ``sum`` over the normalised axes. Here each of them is one BLAS
call on a (rows, d) view of the input, which NumPy runs faster than its own reductions along a
short last axis, and the backward reuses two buffers instead of making a fresh array per term.
Its measured gain is in ``benchmarks/README.md``.
"""
from __future__ import annotations

import math

from .. import configuration
from ..autograd.function import Function
from ..backend import get_array_module

__all__ = ["FastLayerNorm", "layer_norm"]


class FastLayerNorm(Function):
    """The reference's formulas on the rows of a (rows, d) view of x, with every row reduction
    a matrix-vector product: μ = X·1/d, σ² = rowwise (x − μ)·(x − μ)/d, and the backward's
    column sums 1ᵀG, 1ᵀ(G ⊙ x̂) and row sums G·γ/d, (G ⊙ x̂)·γ/d.

    μ is corrected once by the mean of the residual, X − μ − mean(X − μ), so a constant row
    normalises to exactly 0 even when float32 rounding of its sum is not exact (a row of
    1e4 + 0.1), as the reference's float64 mean does. Backward, with x̂ = (x − μ)·rstd and
    dx̂ = g ⊙ γ:  dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)), where mean(dx̂) = g·γ/d and
    mean(dx̂ ⊙ x̂) = (g ⊙ x̂)·γ/d reuse g ⊙ x̂ (also dγ's summand). Half precision is computed
    in float32, as in the reference.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, axes, eps):
        xp = get_array_module(x)
        d = math.prod(x.shape[len(x.shape) - len(axes):])
        work = x.dtype if x.dtype.itemsize >= 4 else xp.dtype("float32")
        rows = x.reshape(-1, d).astype(work, copy=False)            # (rows, d)
        ones = xp.ones(d, dtype=work)
        mu = rows @ ones
        mu /= d
        xhat = rows - mu[:, None]                                  # x − μ, then x̂ in place
        mu = xhat @ ones                                           # the residual's mean
        mu /= d
        xhat -= mu[:, None]
        var = xp.einsum("ij,ij->i", xhat, xhat)
        var /= d
        rstd = 1.0 / xp.sqrt(var + eps)
        xhat *= rstd[:, None]                                      # x̂ = (x − μ)·rstd
        w = None if weight is None else weight.reshape(d).astype(work, copy=False)
        ctx.save_for_backward(xhat, rstd, w)
        ctx.shapes = x.shape, x.shape[len(x.shape) - len(axes):]     # x, normalized_shape
        out = xhat * w if w is not None else xhat.copy()
        if bias is not None:
            out += bias.reshape(d)
        return out.reshape(x.shape).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, w = ctx.saved_tensors
        (x_shape, norm_shape), d = ctx.shapes, xhat.shape[1]
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = get_array_module(grad)
        g = grad.reshape(-1, d).astype(xhat.dtype, copy=False)       # (rows, d)
        down = xp.ones(g.shape[0], dtype=g.dtype)                  # sums over the rows
        gb = (down @ g).reshape(norm_shape).astype(grad.dtype, copy=False) if nb else None
        gw = gx = None
        if nx or nw:
            scratch = g * xhat                                     # g ⊙ x̂
            if nw:
                gw = (down @ scratch).reshape(norm_shape).astype(grad.dtype, copy=False)
        if nx:
            gamma = w if w is not None else xp.ones(d, dtype=g.dtype)
            mean_dxhat = g @ gamma                                 # mean(dx̂) = g·γ/d
            mean_dxhat /= d
            mean_dxhat_xhat = scratch @ gamma                      # mean(dx̂ ⊙ x̂) = (g ⊙ x̂)·γ/d
            mean_dxhat_xhat /= d
            gx = g * gamma                                         # dx̂, then dx in place
            gx -= xp.multiply(xhat, mean_dxhat_xhat[:, None], out=scratch)
            gx -= mean_dxhat[:, None]
            gx *= rstd[:, None]
            gx = gx.reshape(x_shape).astype(grad.dtype, copy=False)
        return gx, gw, gb, None, None


def layer_norm(x, weight, bias, axes, eps):
    """Twin of ``ops.norm.LayerNorm`` (what ``ops.norm.layer_norm`` applies): the same means,
    taken as matrix-vector products, which sum the same numbers in another order (equal within
    float rounding). ``axes`` are the trailing normalised axes."""
    return FastLayerNorm.apply(x, weight, bias, axes, eps)


configuration.register_twin("layer_norm", layer_norm)
