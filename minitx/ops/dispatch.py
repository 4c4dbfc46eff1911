"""Which code computes attention: the hand-written CUDA flash kernel, or the array code.

One dispatcher, used by ``scaled_dot_product_attention`` and ``flash_attention``. On CuPy
arrays the kernel (``minitx.backend.flash_cuda``) runs whenever it applies; everywhere else the
array code runs (the same math, written against ``xp``). The decision is never hidden:

- ``decline_reason(...)`` returns ``None`` when the kernel will run, else the reason it does not
  (weights requested, dropout, a general mask, NumPy inputs, dtype, head dim, CuPy/NVRTC
  missing, ``MINITX_FLASH=off``) — ``F.why_not_flash(...)`` asks it with SDPA's arguments;
- every decision is logged at DEBUG level on the ``minitx.dispatch`` logger;
- ``MINITX_FLASH`` chooses the policy, read at every call:
  ``auto`` (default) — the kernel when it applies, else the array code;
  ``off`` — always the array code;
  ``require`` — the kernel or a ``RuntimeError`` that says why not (for benchmarks and GPU
  tests that must not silently measure the fallback);
- ``MINITX_FLASH_KERNEL`` chooses *which* kernel, also read at every call (in one place,
  ``flash_cuda.kernel_choice``): ``tiled`` (default: tensor cores for float16, the register-tiled
  CUDA-core kernel for float32), ``naive`` (one thread per row, float32 only: the kernel to read
  first; a float16 call is declined with the reason), ``tf32`` (float32 on the tensor cores) or
  one of the float16 levers in ``flash_cuda.LEVERS`` (a float32 call is declined). The full list
  is ``flash_cuda.KERNEL_CHOICES``. ``flash_cuda.chosen_kernel(dtype)`` says
  which family runs, and each launch is logged at DEBUG on ``minitx.flash_cuda`` with its name.
  An unknown value of either variable is a ``ValueError`` naming it, the allowed values and the
  value given.

What the kernel takes: float32/float16 q/k/v on the GPU, head dims ≤ 128, grouped key/value heads,
causal (bottom-right aligned) and key-padding masks, no dropout, no attention weights.
"""
from __future__ import annotations

import logging
import os

from ..autograd.function import Function
from ..backend import flash_cuda, get_array_module
from ..backend import host_xp

__all__ = ["MODES", "mode", "decline_reason", "choose_kernel", "FlashKernelFunction"]

MODES = ("auto", "off", "require")
log = logging.getLogger("minitx.dispatch")


def mode() -> str:
    """The policy from ``$MINITX_FLASH`` ("auto" when unset); an unknown value is an error."""
    value = os.environ.get("MINITX_FLASH", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"MINITX_FLASH must be one of {MODES}, got {value!r}")
    return value


def decline_reason(q, k, v, *, key_mask=None, general_mask: bool = False,
                   dropout_p: float = 0.0, need_weights: bool = False):
    """None when the CUDA flash kernel takes this call, else the reason (a short sentence).

    q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv) raw arrays; ``key_mask`` (B, Nk) bool or None;
    ``general_mask``: a mask other than causal/key padding is present. Checks the call's own
    reasons first, then the arrays and the kernel choice (``MINITX_FLASH_KERNEL=naive takes
    float32 only (got float16)``), then whether a GPU with NVRTC is there.
    """
    policy = mode()
    flash_cuda.kernel_choice()   # a mistyped MINITX_FLASH_KERNEL raises even where flash is off
    if policy == "off":
        return "MINITX_FLASH=off"
    if need_weights:
        return "the attention weights were requested (the kernel never forms them)"
    if dropout_p > 0:
        return f"dropout_p={dropout_p} (the kernel has no dropout)"
    if general_mask:
        return "a general attn_mask (the kernel takes causal and key-padding masks only)"
    if get_array_module(q, k, v) is host_xp:
        return "the inputs are NumPy arrays (the kernel runs on CuPy arrays)"
    return flash_cuda.decline_reason(q, k, v, key_mask=key_mask) or flash_cuda.unavailable_reason()


def choose_kernel(fn: str, q, k, v, **call) -> bool:
    """Decide for one call of ``fn``: True → run the kernel. Logs the decision; under
    ``MINITX_FLASH=require`` a declined call raises ``RuntimeError`` with the reason."""
    reason = decline_reason(q, k, v, **call)
    if reason is None:
        log.debug("%s: CUDA flash kernel", fn)
        return True
    log.debug("%s: array code (%s)", fn, reason)
    if mode() == "require":
        raise RuntimeError(f"{fn}: MINITX_FLASH=require, but the CUDA flash kernel cannot run "
                           f"this call: {reason}")
    return False


class FlashKernelFunction(Function):
    """The CUDA kernels as one autograd node: saves (q, k, v, O, lse); backward recomputes P.

    q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv) → O (B, H, Nq, Dv); see ``flash_cuda``. Forward and
    backward each run the kernel ``MINITX_FLASH_KERNEL`` names when they run; all kernels share
    the (O, lse) convention, so the backward is exact whichever forward produced them.
    """

    @staticmethod
    def forward(ctx, q, k, v, *, causal, scale, key_mask):
        o, lse = flash_cuda.flash_attention_forward(q, k, v, causal=causal, scale=scale,
                                                    key_mask=key_mask)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = dict(causal=causal, scale=scale, key_mask=key_mask)
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        do = get_array_module(grad).ascontiguousarray(grad)
        return flash_cuda.flash_attention_backward(q, k, v, o, lse, do, **ctx.options)
