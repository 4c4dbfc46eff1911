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
    @staticmethod
    def forward(ctx, x, weight, bias, axes, eps):
        xp = get_array_module(x)
        # μ accumulated in float64 (then rounded to x's dtype): a constant row is then exactly
        # its value, so it normalises to 0 — a float32 sum of 1e4 + 0.1 repeated is not exact
        mu = x.mean(axis=axes, keepdims=True, dtype="float64").astype(x.dtype, copy=False)
        xhat = x - mu                                      # x − μ, then x̂ in the same buffer
        rstd = 1.0 / xp.sqrt((xhat * xhat).mean(axis=axes, keepdims=True) + eps)
        xhat *= rstd                                       # x̂ = (x − μ)·rstd
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.axes, ctx.has_bias = axes, bias is not None
        out = xhat * weight if weight is not None else xhat.copy()
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.saved_tensors
        axes = ctx.axes
        batch = tuple(range(grad.ndim - len(axes)))
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = get_array_module(grad)
        scratch = grad * xhat                              # g ⊙ x̂, reused below
        gw = scratch.sum(axis=batch).astype(grad.dtype, copy=False) if nw else None
        gb = grad.sum(axis=batch).astype(grad.dtype, copy=False) if nb else None
        gx = None
        if nx:
            # x̂ = (x − μ)·rstd:  dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)),
            # computed in two buffers (dx̂, then dx in its place; scratch for x̂ · mean(…))
            if weight is not None:
                dxhat = grad * weight
                scratch = xp.multiply(dxhat, xhat, out=scratch)
            else:
                dxhat = grad.copy()
            m2 = scratch.mean(axis=axes, keepdims=True)    # mean(dx̂ ⊙ x̂)
            dxhat -= dxhat.mean(axis=axes, keepdims=True)
            dxhat -= xp.multiply(xhat, m2, out=scratch)
            dxhat *= rstd
            gx = dxhat
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
