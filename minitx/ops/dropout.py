"""Inverted dropout (Srivastava et al., 2014)."""
from __future__ import annotations

from .. import validate
from ..autograd.function import Function
from ..backend import device_of, rng, to_device
from .elementwise import mul

__all__ = ["dropout", "dropout_mask"]


def dropout_mask(shape, p: float, like):
    """A keep-mask scaled by 1/(1 − p), drawn from the seeded generator, on ``like``'s device.

    Drawn on the host so a seed gives the same mask on NumPy and CuPy. Its dtype is ``like``'s,
    except float16's becomes float32: 1/(1 − p) overflows float16 for p close to 1, and then a
    dropped zero times inf would be NaN.
    """
    keep = rng().random(shape, dtype="float32") >= p
    dtype = "float32" if like.dtype == "float16" else like.dtype
    mask = keep.astype(dtype) * (1.0 / (1.0 - p))
    return to_device(mask.astype(dtype, copy=False), device_of(like))


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = dropout_mask(x.shape, p, x)
        ctx.save_for_backward(mask)
        return (x * mask).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return (grad * mask).astype(grad.dtype, copy=False), None


def dropout(x, p: float = 0.5, training: bool = True):
    """Zero each element with probability p and scale the rest by 1/(1 − p).

    E[dropout(x)] = x, so evaluation (``training=False``) is the identity. p = 1 gives zeros.
    The mask comes from ``minitx.manual_seed``'s generator.
    """
    p = validate.probability(p, "p", allow_one=True, owner="dropout")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return mul(x, 0.0)
    return Dropout.apply(x, p)
