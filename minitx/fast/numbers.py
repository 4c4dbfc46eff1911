"""Python numbers meeting a Tensor in + − × ÷, converted once and kept (a part of the fast
``apply``, ``fast/core.py``).

In ``t * 0.5`` the reference passes the Python number on as it is, and NumPy casts it to the
array's dtype at every use: in the forward and again where the backward reads it (the other
factor of a product). A training loop meets the same few numbers at every step, so the fast
layer converts each one once into a read-only 0-d array of the tensor's dtype and hands that
array out again.
"""
from __future__ import annotations

import numpy


__all__ = ["cached_operand"]

_NUMBERS = {}                   # float dtype -> {number: its read-only 0-d array}
_PY_NUMBERS = (float, int)      # exactly these classes: bool, an int subclass, passes as it is
_LIMIT = 1024                   # numbers kept per dtype; a loop over ever new numbers restarts


def cached_operand(tensor, other):
    """``other`` as the reference passes it on (as it is), or — a Python float or int meeting a
    float host Tensor — a cached read-only 0-d array of the tensor's dtype.

    The same values: under NEP 50 NumPy casts a Python number to the array's dtype anyway, so
    the op sees the same number, now cast once instead of at every use.
    """
    if other.__class__ not in _PY_NUMBERS:
        return other                        # a bool, an array, a Tensor, …
    data = getattr(tensor, "data", None)
    if data.__class__ is not numpy.ndarray:
        return other                        # a device tensor (or no Tensor at all)
    cache = _NUMBERS.get(data.dtype)
    if cache is None:
        if data.dtype.kind != "f":          # an int tensor: NumPy's own rule applies
            return other
        cache = _NUMBERS[data.dtype] = {}
    array = cache.get(other)
    if array is None:
        if not other:                       # 0.0 == -0.0 as dict keys: zeros are not kept
            return numpy.asarray(other, dtype=data.dtype)
        if len(cache) >= _LIMIT:
            cache.clear()
        array = cache[other] = numpy.asarray(other, dtype=data.dtype)
        array.flags.writeable = False       # shared by every op that meets this number
    return array
