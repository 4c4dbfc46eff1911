"""Gradient clipping, in place on ``p.grad``, with PyTorch's semantics.

``clip_grad_norm_`` treats all gradients as one long vector g = (g₁, ..., g_k):

    total = ‖g‖_p = (Σᵢ ‖gᵢ‖_pᵖ)^(1/p)        (p = ∞: maxᵢ ‖gᵢ‖_∞)
    c     = min(1, max_norm / (total + 1e-6))
    gᵢ ← c · gᵢ

so the direction is kept and the norm becomes (just under) ``max_norm`` when it was larger.
``clip_grad_value_`` clamps each element to [−v, v] instead (which changes the direction).
"""
from __future__ import annotations

import math

from .. import backend, validate
from ..autograd.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters) -> list:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"expected Tensors (parameters), got {type(p).__name__}")
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Rescale the gradients so their joint ``norm_type``-norm is at most ``max_norm``.

    ``parameters``: a Tensor or an iterable of Tensors (those without a grad are ignored).
    Returns the total norm *before* clipping, as a Python float (0.0 when there are no
    gradients). A NaN/inf total makes the gradients NaN, as in PyTorch; with
    ``error_if_nonfinite`` it raises instead (and leaves them alone).
    """
    max_norm = validate.nonnegative_real(max_norm, "max_norm", owner="clip_grad_norm_")
    norm_type = validate.real(norm_type, "norm_type", minimum=0.0, min_open=True, finite=False,
                              owner="clip_grad_norm_", expected="> 0 or inf")
    grads = _grads(parameters)
    if not grads:
        return 0.0
    xp = backend.get_array_module(grads[0].data)
    if norm_type == 2.0:        # ‖gᵢ‖₂² as one dot product each (np.linalg.norm's own formula
        # for a vector, without its checks and its square root): most calls are this one
        total = math.sqrt(math.fsum(float(xp.vdot(g.data, g.data)) for g in grads))
    else:
        norms = [float(xp.linalg.norm(g.data.reshape(-1), ord=norm_type)) for g in grads]
        if math.isinf(norm_type):
            total = max(norms)
        else:
            total = math.fsum(n ** norm_type for n in norms) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is {total}; "
                           "clipping would make them NaN (error_if_nonfinite=True)")
    coef = max_norm / (total + 1e-6)
    if coef < 1.0 or math.isnan(coef):       # clamped to 1: nothing to do; NaN spreads (PyTorch)
        for g in grads:
            g.data *= coef
    return total


def clip_grad_value_(parameters, clip_value: float) -> None:
    """Clamp every gradient element to [−clip_value, clip_value], in place."""
    clip_value = validate.nonnegative_real(clip_value, "clip_value", owner="clip_grad_value_")
    for g in _grads(parameters):
        xp = backend.get_array_module(g.data)
        xp.clip(g.data, -clip_value, clip_value, out=g.data)
