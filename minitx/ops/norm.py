r"""Normalisation layers as fused Functions: layer_norm and rms_norm.

Over the normalised (last) axes of each row x, with weight γ and bias β:

$$
\operatorname{LayerNorm}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \varepsilon}} + \beta,
\quad \mu = \frac{1}{d} \sum_i x_i, \quad \sigma^2 = \frac{1}{d} \sum_i (x_i - \mu)^2
$$

$$
\operatorname{RMSNorm}(x) = \gamma \odot \frac{x}{\sqrt{\frac{1}{d} \sum_i x_i^2 + \varepsilon}}
$$

Ba, Kiros & Hinton (2016), "Layer Normalization"; Zhang & Sennrich (2019), "Root Mean Square
Layer Normalization".
"""
from __future__ import annotations

import math

from ..autograd.function import Function
from ..backend import get_array_module
from ._util import as_tuple

__all__ = ["layer_norm", "rms_norm"]


def _norm_axes(x, normalized_shape, name):
    shape = as_tuple(normalized_shape)
    if tuple(x.shape[len(x.shape) - len(shape):]) != shape:
        raise ValueError(f"{name}: normalized_shape {shape} must match the last dimensions of "
                         f"the input, got input shape {tuple(x.shape)}")
    return shape, tuple(range(len(x.shape) - len(shape), len(x.shape)))


class LayerNorm(Function):
    """The formula above over the trailing axes, on the rows of a (rows, d) view of x.

    Every row reduction is a matrix-vector product (one BLAS call, where NumPy's ``mean`` is
    a slower pass of its own): μ = X·1/d, and the backward's column sums 1ᵀG, 1ᵀ(G ⊙ x̂) and
    row sums G·γ/d, (G ⊙ x̂)·γ/d. μ is corrected once by the mean of the residual,
    X − μ − mean(X − μ), so a constant row normalises to exactly 0 even when float32 rounding
    of its sum is not exact (a row of 1e4 + 0.1). Backward, with x̂ = (x − μ)·rstd,
    dx̂ = g ⊙ γ:  dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)), where
    mean(dx̂) = g·γ/d and mean(dx̂ ⊙ x̂) = (g ⊙ x̂)·γ/d reuse g ⊙ x̂ (also dγ's summand).
    Half precision is computed in float32.
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


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, axes, eps):
        xp = get_array_module(x)
        rinv = 1.0 / xp.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
        xhat = x * rinv
        ctx.save_for_backward(xhat, rinv, weight)
        ctx.axes = axes
        return xhat * weight if weight is not None else xhat

    @staticmethod
    def backward(ctx, grad):
        xhat, rinv, weight = ctx.saved_tensors
        batch = tuple(range(grad.ndim - len(ctx.axes)))
        nx, nw = ctx.needs_input_grad[:2]
        gw = (grad * xhat).sum(axis=batch).astype(grad.dtype, copy=False) if nw else None
        gx = None
        if nx:
            # x̂ = x / rms(x):  dx = (dx̂ − x̂ · mean(dx̂ ⊙ x̂)) / rms(x)
            dxhat = grad * weight if weight is not None else grad
            gx = rinv * (dxhat - xhat * (dxhat * xhat).mean(axis=ctx.axes, keepdims=True))
        return gx, gw, None, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Layer normalisation (Ba et al., 2016) over the last ``len(normalized_shape)`` axes.

    y = (x − μ) / √(σ² + eps) ⊙ weight + bias, with μ, σ² the mean and (biased) variance
    over those axes. Shapes: x (..., *normalized_shape); weight, bias normalized_shape.
    """
    _, axes = _norm_axes(x, normalized_shape, "layer_norm")
    return LayerNorm.apply(x, weight, bias, axes, eps)


def rms_norm(x, normalized_shape, weight=None, eps: float = 1e-6):
    """RMS normalisation (Zhang & Sennrich, 2019): y = x / √(mean(x²) + eps) ⊙ weight."""
    _, axes = _norm_axes(x, normalized_shape, "rms_norm")
    return RMSNorm.apply(x, weight, axes, eps)
