"""Adam and AdamW on a param group's small parameters at once: one NumPy call per formula, not
one per parameter.

The reference (``minitx/optim/optimizers.py``'s ``Adam._update``) updates one parameter at a
time, as the paper writes it. A model has many small parameters (biases, norms), and for them
the Python and NumPy call overhead of each formula is most of a step. Here the moments m and v
of a group's small parameters live in one flat buffer each, and every formula is one call for
all of them; a large parameter is left to the reference (on its own its arrays stay in the
cache, which a pass over one long buffer loses). The measured gain is in
``benchmarks/README.md``.

The state stays the reference's: ``opt.state[p]["exp_avg"]`` and ``["exp_avg_sq"]`` are the
parameter's own arrays, of its shape, which here happen to be views of the flat buffers. The
reference updates them in place, so it reads and writes the very numbers this update does, and
``minitx.config.fast`` may change between any two steps. A state whose arrays are not views of
one such buffer (the first step, a ``load_state_dict``, a parameter left without a gradient)
has its buffers built again from its current arrays. This layer sits below ``optim``, so the
twin works on raw arrays and the optimizer's state dicts, never imports ``optim``, and hands
back the parameters it did not take.
"""
from __future__ import annotations

import math

import numpy

from .. import configuration
from ..backend import get_array_module

__all__ = ["adam", "adam_in_place", "flat_moments", "SMALL", "CHUNK"]


def flat_moments(datas, states, xp):
    """The flat m and v of a group whose parameters' arrays are ``datas``, with every state's
    ``exp_avg`` / ``exp_avg_sq`` a view of them. Kept from the last step when each state's
    arrays are still views of one buffer of the group's total size, in the parameters' dtype
    (they were built in the group's order, so the same buffer means the same layout); built
    again otherwise, from the states' current arrays (zeros where there are none), and the
    states pointed at views of the new buffers."""
    total = sum(d.size for d in datas)
    flats = []
    for name in ("exp_avg", "exp_avg_sq"):
        arrays = [state.get(name) for state in states]
        base = getattr(arrays[0], "base", None)
        if base is not None and type(base) is type(datas[0]) and base.dtype == datas[0].dtype \
                and base.ndim == 1 and base.size == total \
                and all(a is not None and a.base is base for a in arrays):
            flats.append(base)
            continue
        flat = xp.concatenate([a.reshape(-1) if a is not None else xp.zeros(d.size, d.dtype)
                               for a, d in zip(arrays, datas)]).astype(datas[0].dtype,
                                                                      copy=False)
        start = 0
        for d, state in zip(datas, states):
            state[name] = flat[start:start + d.size].reshape(d.shape)
            start += d.size
        flats.append(flat)
    return flats[0], flats[1]


SMALL = 2 ** 12    # parameters of at most this many values go into the flat buffers


def adam(datas, grads, states, *, lr, betas, eps, weight_decay, decoupled, amsgrad,
         small: int = SMALL) -> list:
    """Twin of ``optim.Adam._update`` (and AdamW's) applied to each parameter of a group:
    ``datas`` the parameters' arrays, ``grads`` their gradients, ``states`` their state dicts,
    updated in place. Adam's arithmetic is elementwise, so the same formulas on the
    concatenated arrays give each parameter exactly its own update, bit for bit.

    It takes the group's parameters of at most ``small`` values (for them the calls cost more
    than the arithmetic; a large parameter is faster on its own, while it fits in the cache)
    and returns the positions of those it left to the reference: the large ones, or all of them
    when the small ones are fewer than two, AMSGrad is on, they and their gradients are not all
    of one dtype and array type, or they are at different step counts.
    """
    taken = [i for i, d in enumerate(datas) if d.size <= small]
    left = [i for i, d in enumerate(datas) if d.size > small]
    datas, grads = [datas[i] for i in taken], [grads[i] for i in taken]
    states = [states[i] for i in taken]
    if len(taken) < 2 or amsgrad or \
            len({(type(a), a.dtype) for a in (*datas, *grads)}) != 1 or \
            len({state.get("step", 0) for state in states}) != 1:
        return sorted(taken + left)
    xp = get_array_module(datas[0])
    beta1, beta2 = betas
    m, v = flat_moments(datas, states, xp)
    t = states[0].get("step", 0) + 1
    for state in states:
        state["step"] = t
    grad = xp.concatenate([g.reshape(-1) for g in grads])
    if weight_decay != 0 and not decoupled:                   # Adam: L2 term in g
        grad = grad + weight_decay * xp.concatenate([d.reshape(-1) for d in datas])
    scratch = xp.multiply(grad, 1.0 - beta1)                  # the reference's formulas, in
    m *= beta1                                                # place where it makes a new
    m += scratch                                              # array (the same roundings)
    xp.multiply(grad, 1.0 - beta2, out=scratch)
    scratch *= grad
    v *= beta2
    v += scratch
    bias_correction1 = 1.0 - beta1 ** t
    bias_correction2 = 1.0 - beta2 ** t
    step = xp.sqrt(v, out=scratch)                            # the denominator, then
    step /= math.sqrt(bias_correction2)                       # m / it in place
    step += eps
    xp.divide(m, step, out=step)
    step *= lr / bias_correction1
    start = 0
    for d in datas:
        if weight_decay != 0 and decoupled:                   # AdamW: shrink θ first
            d *= 1.0 - lr * weight_decay
        d -= step[start:start + d.size].reshape(d.shape)
        start += d.size
    return left


CHUNK = 2 ** 14    # values per piece of a large parameter: the piece's scratch stays in cache


def adam_in_place(theta, grad, state, *, lr, betas, eps, weight_decay, decoupled, amsgrad,
                  chunk: int = CHUNK) -> bool:
    """Twin of ``optim.Adam._update`` (and AdamW's) on one parameter, for the large ones the
    group twin above leaves: the reference's formulas in its order, each written in place into
    the parameter, its moments and one scratch buffer, piece by piece (the reference makes a
    fresh array of the parameter's size for every product and sum: a dozen passes over memory
    where a mixture of experts' stacked weights hold millions of values). Elementwise, the
    same roundings: bit for bit the reference's update. Returns False, having changed
    nothing, where it declines (AMSGrad; arrays off the host, of different dtypes, or not
    contiguous): the reference then runs."""
    arrays = (theta, grad, state.get("exp_avg", theta), state.get("exp_avg_sq", theta))
    if amsgrad or any(a.__class__ is not numpy.ndarray or a.dtype != theta.dtype
                      or not a.flags.c_contiguous or a.shape != theta.shape for a in arrays):
        return False
    if not state:
        state["step"] = 0
        state["exp_avg"] = numpy.zeros_like(theta)
        state["exp_avg_sq"] = numpy.zeros_like(theta)
    state["step"] += 1
    t = state["step"]
    beta1, beta2 = betas
    bias_correction1 = 1.0 - beta1 ** t
    bias_correction2 = 1.0 - beta2 ** t
    flats = [a.reshape(-1) for a in (theta, grad, state["exp_avg"], state["exp_avg_sq"])]
    size = min(chunk, theta.size)
    scratch, decayed = numpy.empty(size, theta.dtype), numpy.empty(size, theta.dtype)
    for lo in range(0, theta.size, chunk):
        d, g, m, v = (f[lo:lo + chunk] for f in flats)
        s = scratch[:d.size]
        if weight_decay != 0 and decoupled:                   # AdamW: θ ← θ (1 − η λ)
            d *= 1.0 - lr * weight_decay
        elif weight_decay != 0:                               # Adam: g ← g + λ θ
            g = numpy.multiply(d, weight_decay, out=decayed[:d.size])
            g += flats[1][lo:lo + chunk]
        numpy.multiply(g, 1.0 - beta1, out=s)
        m *= beta1
        m += s                                                # m ← β₁ m + (1 − β₁) g
        numpy.multiply(g, 1.0 - beta2, out=s)
        s *= g
        v *= beta2
        v += s                                                # v ← β₂ v + (1 − β₂) g²
        numpy.sqrt(v, out=s)
        s /= math.sqrt(bias_correction2)
        s += eps                                              # √v / √(1 − β₂ᵗ) + ε
        numpy.divide(m, s, out=s)
        s *= lr / bias_correction1
        d -= s                                                # θ ← θ − η/(1 − β₁ᵗ) · m / it
    return True


configuration.register_twin("adam", adam)
configuration.register_twin("adam_in_place", adam_in_place)
