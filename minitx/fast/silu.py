"""SiLU, x·σ(x), and its backward, computed in place in cache-sized pieces, from one
exponential for the backward.

The reference (``minitx/ops/elementwise.py``'s ``Silu``, with ``sigmoid_array``'s
σ(x) = e^{min(x, 0)} / (1 + e^{−|x|})) makes a fresh array at every step: eight passes over
memory for the forward, and for the backward, σ(x)(1 + x·σ(−x)), two sigmoids of four
exponentials and about twenty passes. In a mixture of experts the activation spans every routed
token times the expert width, arrays far larger than the cache. Both twins below write each step
in place into a few buffers of ``CHUNK`` values that stay in the core's cache.

The backward needs only one exponential. With e = e^{−|x|} and q = 1 + e, the reference's
numerator e^{min(x, 0)} is exactly 1 where x ≥ 0 and exactly e where x < 0, so

    σ(x) = 1/q, σ(−x) = e/q   (x ≥ 0);        σ(x) = e/q, σ(−x) = 1/q   (x < 0).

Each is the reference's own division of the same two rounded numbers, chosen by the mask
m = [x < 0] as b·m + a·(1 − m) (exact: one product is 0, the other the chosen value). The
products and sums that follow are the reference's, in its order: both twins give the
reference's result bit for bit. Their measured gain is in ``benchmarks/README.md``.
"""
from __future__ import annotations

from .. import backend, configuration
from ..backend import get_array_module
from ..ops.elementwise import sigmoid_array

__all__ = ["silu", "silu_backward", "CHUNK"]

CHUNK = 2 ** 14                       # values per piece: a piece's buffers stay in the cache


def _takes(*arrays) -> bool:
    """float32 or float64 arrays of one dtype (float16 takes the reference, which computes
    in float32 and rounds once)."""
    dtype = arrays[0].dtype
    return dtype.kind == "f" and dtype.itemsize >= 4 and all(a.dtype == dtype for a in arrays)


def _pieces(flat, chunk):
    """(start, stop) of each piece of a 1-d array: one piece off the host (the cache argument
    is a CPU one)."""
    step = chunk if backend.device_of(flat) == "cpu" else max(flat.size, 1)
    return [(i, min(i + step, flat.size)) for i in range(0, flat.size, step)]


def silu(x, *, chunk: int = CHUNK):
    """Twin of ``Silu.forward``, x · e^{min(x, 0)} / (1 + e^{−|x|}): the reference's
    operations in its order, written in place piece by piece (bit for bit its result). Other
    dtypes take the reference."""
    if not _takes(x):
        xw = x.astype("float32") if x.dtype == "float16" else x
        return (xw * sigmoid_array(xw)).astype(x.dtype, copy=False)
    xp = get_array_module(x)
    flat = x.reshape(-1)
    out = xp.empty(flat.shape, dtype=x.dtype)
    pieces = _pieces(flat, chunk)
    q = xp.empty(pieces[0][1] if pieces else 0, dtype=x.dtype)     # the first is the longest
    for lo, hi in pieces:
        xs, o, qs = flat[lo:hi], out[lo:hi], q[:hi - lo]
        xp.abs(xs, out=qs)
        xp.negative(qs, out=qs)
        xp.exp(qs, out=qs)
        qs += 1                                        # q = 1 + e^{−|x|}
        xp.minimum(xs, 0, out=o)
        xp.exp(o, out=o)
        o /= qs                                        # σ(x)
        o *= xs
    return out.reshape(x.shape)


def silu_backward(x, grad, *, chunk: int = CHUNK):
    """Twin of ``Silu.backward``, grad · σ(x)(1 + x·σ(−x)), with σ(x) and σ(−x) both from one
    e = e^{−|x|} (the module docstring: bit for bit the reference's result). Other dtypes,
    or a gradient of another dtype, take the reference."""
    if not _takes(x, grad):
        xw = x.astype("float32") if x.dtype == "float16" else x
        return grad * (sigmoid_array(xw) * (1 + xw * sigmoid_array(-xw)))
    xp = get_array_module(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    out = xp.empty(flat.shape, dtype=x.dtype)
    pieces = _pieces(flat, chunk)
    size = pieces[0][1] if pieces else 0                             # the first is the longest
    e, a, m, s = (xp.empty(size, dtype=x.dtype) for _ in range(4))
    for lo, hi in pieces:
        n = hi - lo
        xs, es, as_, ms, ss = flat[lo:hi], e[:n], a[:n], m[:n], s[:n]
        xp.abs(xs, out=es)
        xp.negative(es, out=es)
        xp.exp(es, out=es)                             # e = e^{−|x|}
        xp.add(es, 1, out=as_)                         # q = 1 + e
        xp.divide(es, as_, out=es)                     # e/q
        xp.divide(1, as_, out=as_)                     # 1/q
        xp.less(xs, 0, out=ms)                         # m = [x < 0]
        xp.multiply(es, ms, out=ss)
        xp.subtract(1, ms, out=ms)                     # now 1 − m
        ss += as_ * ms                                 # σ(x): e/q where x < 0, else 1/q
        as_ *= 1 - ms                                  # (1/q)·m
        es *= ms                                       # (e/q)·(1 − m)
        es += as_                                      # σ(−x): 1/q where x < 0, else e/q
        es *= xs
        es += 1
        es *= ss                                       # σ(x)(1 + x·σ(−x))
        xp.multiply(gflat[lo:hi], es, out=out[lo:hi])
    return out.reshape(x.shape)


configuration.register_twin("silu", silu)
configuration.register_twin("silu_backward", silu_backward)
