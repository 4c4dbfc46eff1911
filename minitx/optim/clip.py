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

from .. import backend
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
    max_norm, norm_type = float(max_norm), float(norm_type)
    if max_norm < 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    grads = _grads(parameters)
    if not grads:
        return 0.0
    norms = []
    for g in grads:
        xp = backend.get_array_module(g.data)
        norms.append(float(xp.linalg.norm(g.data.reshape(-1), ord=norm_type)))
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
    clip_value = float(clip_value)
    if clip_value < 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for g in _grads(parameters):
        xp = backend.get_array_module(g.data)
        xp.clip(g.data, -clip_value, clip_value, out=g.data)
