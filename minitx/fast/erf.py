"""erf in float32 from two fitted polynomials evaluated in float32, in cache-sized pieces.

The reference (``minitx/ops/elementwise.py``'s ``erf_array``) computes every dtype in float64
by a series and a continued fraction, and rounds. GELU calls erf on every feed-forward
activation, and on the CPU the float64 work (its ``exp`` alone, the series' forty terms) costs
more than this whole float32 evaluation. Its measured gain is in ``benchmarks/README.md``.

The two polynomials were fitted for this file: minimax (Lawson's iteratively reweighted least
squares against ``math.erf`` on 4,000 Chebyshev nodes; ``tests/fast/test_erf.py`` reruns the
fit) in erf's relative error below 1 and its absolute error above, rounded to float32. Their
own error is below 4e-9; evaluating them in float32 adds rounding, and the tests measure the
whole: ≤ 1.4e-7 (2.3 ulp) from the true erf, and 1.7e-7 relative down to 1e-37.

- |x| < 1:  erf(x) = x · P(x²),  P(s) = 2/√π + p₁s + … + p₆s⁶ (p₀ pinned to 2/√π, so that
  erf(x) ≈ 2x/√π keeps its relative accuracy as x → 0);
- |x| ≥ 1:  erf(x) = 1 − e^(−x²) · R(1/x),  R(t) = r₀ + r₁t + … + r₆t⁶ ≈ e^(x²) erfc(x) on
  [1, 4] (beyond 4, erfc(x) < 1.6e-8 and 1 − erfc rounds to 1 in float32).
"""
from __future__ import annotations

import math

from .. import backend, configuration
from ..backend import get_array_module
from ..ops.elementwise import erf_float64

__all__ = ["erf", "erf_float32", "ERF_SMALL", "ERF_LARGE", "WHOLE", "CHUNK"]

ERF_SMALL = (1.1283792, -0.37612623, 0.11283529, -0.0268514, 0.0051838206, -0.0007971511,
             7.729088e-05)
ERF_LARGE = (-0.0016613121, 0.577875, -0.033942234, -0.3099706, 0.30865628, -0.13875197,
             0.025378387)

WHOLE, CHUNK = 2 ** 18, 2 ** 15     # host arrays above WHOLE values go in pieces of CHUNK

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _horner(coefficients, t):
    """c₀ + c₁t + … + cₖtᵏ in t's dtype, evaluated in place from the highest degree down."""
    out = t * coefficients[-1]
    for c in coefficients[-2:0:-1]:
        out += c
        out *= t
    out += coefficients[0]
    return out


def erf_float32(x):
    """erf of a 1-d array, in float32, from the two fitted polynomials above."""
    xp = get_array_module(x)
    # Every step after the first of each branch is written in place into one of five
    # float32 buffers (a fresh array per step would cost more than the arithmetic).
    a = xp.abs(x, dtype=xp.float32)
    t = xp.minimum(a, 1.0)                         # the |x| < 1 branch sees |x| ≤ 1
    s = xp.multiply(t, t)
    small = _horner(ERF_SMALL, s)
    small *= t                                     # |x| · P(x²)
    z = xp.clip(a, 1.0, 4.0, out=s)                # the |x| ≥ 1 branch sees 1 ≤ z ≤ 4
    large = _horner(ERF_LARGE, xp.reciprocal(z, out=t))
    xp.multiply(z, z, out=z)
    xp.negative(z, out=z)
    xp.exp(z, out=z)
    large *= z                                     # e^(−z²) R(1/z) ≈ erfc(z)
    xp.subtract(1.0, large, out=large)
    # small where |x| < 1, else large, as [|x| < 1]·small + [|x| ≥ 1]·large (exact: one
    # product is 0, the other the chosen value). NumPy's ``where`` branches per element, which
    # is slow on a mask with no pattern. NaN's mask is 0 and its large branch NaN.
    m = xp.less(a, 1.0, out=z)
    small *= m
    large *= xp.subtract(1.0, m, out=m)
    small += large
    xp.copysign(small, x, out=small)               # odd: erf(−x) = −erf(x); erf(±0) = ±0
    return small


def erf(x, *, whole: int = WHOLE, chunk: int = CHUNK):
    """Twin of ``ops.elementwise.erf_array`` for float32 arrays: the fitted polynomials above,
    which are within 1.4e-7 of erf where the reference is within half a float32 ulp (both
    approximate the same function to float32's precision). A host array of more than
    ``whole`` values goes in pieces of ``chunk`` (the five buffers of a piece stay in the
    core's cache; each element's value does not depend on the piece it is in). Other dtypes
    take the reference (float64, rounded to their dtype).
    """
    if x.dtype != "float32":
        return erf_float64(x).astype(x.dtype, copy=False)
    xp = get_array_module(x)
    flat = x.reshape(-1)              # 1-d: NumPy gives a 0-d result as a scalar, which out=
    if flat.size <= whole or backend.device_of(x) != "cpu":                      # cannot take
        return erf_float32(flat).reshape(x.shape)
    out = xp.empty(flat.shape, dtype=x.dtype)
    for i in range(0, flat.size, chunk):
        out[i:i + chunk] = erf_float32(flat[i:i + chunk])
    return out.reshape(x.shape)


configuration.register_twin("erf", erf)
