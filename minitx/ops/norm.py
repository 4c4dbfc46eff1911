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

from .. import configuration
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
    """The formula above over the trailing axes ``axes``. Backward, with x̂ = (x − μ)·rstd,
    rstd = 1/√(σ² + ε) and dx̂ = g ⊙ γ:

        dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)),   dγ = Σ g ⊙ x̂,   dβ = Σ g

    (means over the normalised axes, sums over the others). Half precision is computed in
    float32 and rounded once at the end; γ and β are taken in the dtype computed in.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, axes, eps):
        xp = get_array_module(x)
        work = x.dtype if x.dtype.itemsize >= 4 else xp.dtype("float32")
        xw = x.astype(work, copy=False)
        # μ accumulated in float64 (then rounded): a constant float32 or float16 row is then
        # exactly its value, so it normalises to 0 (a float32 sum of 1e4 + 0.1 repeated is not)
        mu = xw.mean(axis=axes, keepdims=True, dtype="float64").astype(work, copy=False)
        centered = xw - mu                                         # x − μ
        var = (centered * centered).mean(axis=axes, keepdims=True)  # σ²
        rstd = 1.0 / xp.sqrt(var + eps)
        xhat = centered * rstd                                     # x̂ = (x − μ)·rstd
        w = None if weight is None else weight.astype(work, copy=False)
        ctx.save_for_backward(xhat, rstd, w)
        ctx.axes = axes
        out = xhat * w if w is not None else xhat                  # γ ⊙ x̂
        if bias is not None:
            out = out + bias.astype(work, copy=False)              # + β
        return out.astype(x.dtype, copy=False)

    # Backward: dγ = Σ g ⊙ x̂ and dβ = Σ g over the axes γ is shared across; dx by the formula
    # in the docstring, whose two means carry the paths through μ and σ².
    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, w = ctx.saved_tensors
        axes = ctx.axes
        batch = tuple(range(grad.ndim - len(axes)))                # the axes γ was shared over
        nx, nw, nb = ctx.needs_input_grad[:3]
        g = grad.astype(xhat.dtype, copy=False)     # in the dtype computed in; the engine
        gw = (g * xhat).sum(axis=batch) if nw else None   # rounds each gradient to its input's
        gb = g.sum(axis=batch) if nb else None            # dtype
        gx = None
        if nx:
            dxhat = g * w if w is not None else g
            gx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                         - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
        return gx, gw, gb, None, None


# RMSNorm: x̂ = x / rms(x), no centring and no β (one reduction instead of two); forward
# saves x̂ and 1/rms(x). Half precision is computed in float32 and rounded once, as LayerNorm
# (in float16, x² overflows from |x| = 256 on); γ is taken in the dtype computed in.
class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, axes, eps):
        xp = get_array_module(x)
        work = x.dtype if x.dtype.itemsize >= 4 else xp.dtype("float32")
        xw = x.astype(work, copy=False)
        rinv = 1.0 / xp.sqrt((xw * xw).mean(axis=axes, keepdims=True) + eps)
        xhat = xw * rinv
        w = None if weight is None else weight.astype(work, copy=False)
        ctx.save_for_backward(xhat, rinv, w)
        ctx.axes = axes
        out = xhat * w if w is not None else xhat
        return out.astype(x.dtype, copy=False)

    # dγ = Σ g ⊙ x̂; dx is LayerNorm's without the mean(dx̂) term, since nothing was centred.
    @staticmethod
    def backward(ctx, grad):
        xhat, rinv, w = ctx.saved_tensors
        batch = tuple(range(grad.ndim - len(ctx.axes)))
        nx, nw = ctx.needs_input_grad[:2]
        g = grad.astype(xhat.dtype, copy=False)     # in the dtype computed in; the engine
        gw = (g * xhat).sum(axis=batch) if nw else None   # rounds to the inputs' dtypes
        gx = None
        if nx:
            # x̂ = x / rms(x):  dx = (dx̂ − x̂ · mean(dx̂ ⊙ x̂)) / rms(x)
            dxhat = g * w if w is not None else g
            gx = rinv * (dxhat - xhat * (dxhat * xhat).mean(axis=ctx.axes, keepdims=True))
        return gx, gw, None, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Layer normalisation (Ba et al., 2016) over the last ``len(normalized_shape)`` axes.

    y = (x − μ) / √(σ² + eps) ⊙ weight + bias, with μ, σ² the mean and (biased) variance
    over those axes. Shapes: x (..., *normalized_shape); weight, bias normalized_shape.
    """
    _, axes = _norm_axes(x, normalized_shape, "layer_norm")
    fast = configuration.twin("layer_norm")
    if fast is not None:
        return fast(x, weight, bias, axes, eps)
    return LayerNorm.apply(x, weight, bias, axes, eps)


def rms_norm(x, normalized_shape, weight=None, eps: float = 1e-6):
    """RMS normalisation (Zhang & Sennrich, 2019): y = x / √(mean(x²) + eps) ⊙ weight."""
    _, axes = _norm_axes(x, normalized_shape, "rms_norm")
    return RMSNorm.apply(x, weight, axes, eps)
