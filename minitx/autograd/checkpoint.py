"""Gradient checkpointing: trade compute for memory by recomputing activations in backward."""
from __future__ import annotations

from .. import backend
from .function import Function
from .grad_mode import enable_grad, no_grad
from .tensor import Tensor

__all__ = ["checkpoint"]


class _Checkpoint(Function):
    """Runs ``fn`` without recording its graph; backward re-runs it with the graph on.

    Only the inputs are saved, so the activations inside ``fn`` are not held between the
    forward and the backward pass. The RNG state is saved and restored so that dropout
    inside ``fn`` draws the same mask both times.
    """

    @staticmethod
    def forward(ctx, *arrays, fn, n_tensors):
        # Forward: fn once under no_grad, so none of its intermediate arrays is kept; what
        # is kept is the inputs and the RNG state that fn's dropout will draw from
        arrays = arrays[:n_tensors]      # the last input is the `_requires` marker
        ctx.fn_ = fn
        ctx.rng_state = backend.rng().bit_generator.state
        ctx.save_for_backward(*arrays)
        with no_grad():
            out = fn(*[Tensor._wrap(a) for a in arrays])
        return out.data

    @staticmethod
    def backward(ctx, grad):
        # Backward: fn again, from the saved inputs and with the same random draws, this
        # time recording its graph — the activations exist again, for this backward only
        arrays = ctx.saved_tensors
        inputs = [Tensor._wrap(a, need) for a, need in zip(arrays, ctx.needs_input_grad)]
        n = len(inputs)
        saved_state = backend.rng().bit_generator.state
        backend.rng().bit_generator.state = ctx.rng_state
        try:
            with enable_grad():
                out = ctx.fn_(*inputs)
        finally:
            backend.rng().bit_generator.state = saved_state    # the caller's stream goes on
        grads = [None] * n
        if out.requires_grad:
            # The recomputed graph is private: backprop through it and collect the input grads.
            out.backward(Tensor._wrap(grad))
            grads = [t.grad.data if t.grad is not None else None for t in inputs]
        return (*grads[:n], None)


def checkpoint(fn, *args):
    """Compute ``fn(*args)`` without storing its intermediate activations.

    In backward, ``fn`` is run again (with the same random state) to rebuild them. Gradients
    are identical to calling ``fn(*args)`` directly; the memory saved for backward is only
    the inputs. ``fn`` must return one Tensor and must be a pure function of ``args`` and of
    parameters it closes over.

    Parameters that ``fn`` closes over receive their gradients during the recomputation.
    """
    tensors = [a if isinstance(a, Tensor) else Tensor(a) for a in args]
    # A marker input that requires grad, so the node is recorded even when only the
    # parameters inside fn (invisible from here) need gradients.
    xp = backend.get_array_module(*[t.data for t in tensors])
    marker = Tensor._wrap(xp.zeros(()), True)
    return _Checkpoint.apply(*tensors, marker, fn=fn, n_tensors=len(tensors))
