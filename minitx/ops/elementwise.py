"""Elementwise ops: arithmetic with broadcasting, and the activation functions.

Each op is a Function whose backward sits right below its forward. Binary ops broadcast
like NumPy; their backward sums the gradient back to each input's shape with
``unbroadcast``. Python scalars are constants (NumPy's weak-scalar rules keep the tensor's
dtype: ``float32_tensor * 2.0`` is float32).

Accuracy, as PyTorch's CPU kernels: each formula is evaluated in a form that keeps its relative
accuracy over the whole line (σ from e^{−|x|}, not ½(1 + tanh(x/2)); α(eˣ − 1) as α·expm1(x);
tanh's derivative from x, not 1 − tanh²), and an op of several steps computes float16 in
float32 and rounds once (``_widened``; the engine rounds each gradient to its input's dtype).
``tests/ops/test_numerics_vs_torch.py`` sweeps every op against PyTorch's own error.
"""
from __future__ import annotations

import math

from ..autograd.function import Function
from .. import backend, configuration
from ..backend import as_dtype, get_array_module
from ._util import unbroadcast

__all__ = ["add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "abs", "tanh",
           "sigmoid", "relu", "gelu", "elu", "silu", "maximum", "minimum", "clip", "erf",
           "erf_array", "clone", "astype", "to_device", "leaky_relu", "softplus"]


def _widened(x):
    """x, or x as float32 when it is float16: an op of several steps computes half precision in
    float32 and rounds once (in float16, e^{−x} overflows from x < −11 and x³ from x > 40)."""
    return x.astype("float32") if getattr(x, "dtype", None) == "float16" else x


# ---- arithmetic --------------------------------------------------------------------------

class Add(Function):
    # Nothing to save: the gradient is the output's, summed back to each input's shape, read
    # from the graph node's inputs (an input that needs a gradient is a Tensor); the engine
    # casts it to the input's dtype.
    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.parents
        na, nb = ctx.needs_input_grad
        return (unbroadcast(grad, a.shape) if na else None,
                unbroadcast(grad, b.shape) if nb else None)


# a − b: as for Add, each input receives the output's gradient, b's with its sign flipped.
class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a - b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.parents
        na, nb = ctx.needs_input_grad
        return (unbroadcast(grad, a.shape) if na else None,
                unbroadcast(-grad, b.shape) if nb else None)


# a ⊙ b: the product rule; each factor's gradient is the other factor times the upstream one.
class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        return (unbroadcast(grad * b, a.shape, a.dtype) if na else None,   # d(ab)/da = b
                unbroadcast(grad * a, b.shape, b.dtype) if nb else None)   # d(ab)/db = a


# a / b: the quotient rule, d/da = 1/b and d/db = −a/b², each summed back to its input's shape.
class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a / b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(grad / b, a.shape, a.dtype) if na else None        # d(a/b)/da = 1/b
        gb = None
        if nb:   # −a/b² as −(a/b)/b: b² under- or overflows long before a/b² does
            aw, bw = _widened(a), _widened(b)
            gb = unbroadcast(-grad * (aw / bw) / bw, b.shape, b.dtype)
        return ga, gb


# −a: the gradient is negated too.
class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, grad):
        return -grad


# aᵖ with a and p both differentiable; the output is saved, since d/dp = aᵖ log a reuses it.
class Pow(Function):
    @staticmethod
    def forward(ctx, a, p):
        xp = get_array_module(a, p)
        out = xp.power(a, p) if hasattr(a, "shape") else a ** p
        ctx.save_for_backward(a, p, out)
        return out

    # Only the inputs that need a gradient get one (a Python-number exponent needs none).
    @staticmethod
    def backward(ctx, grad):
        a, p, out = ctx.saved_tensors
        xp = get_array_module(a, p)
        na, np_ = ctx.needs_input_grad
        ga = gp = None
        if na:   # d(a^p)/da = p a^(p-1)
            ga = unbroadcast(grad * p * xp.power(a, p - 1), a.shape, a.dtype)
        if np_:  # d(a^p)/dp = a^p log a   (taken as 0 where a <= 0)
            safe = xp.where(a > 0, a, 1)
            gp = unbroadcast(grad * out * xp.log(safe), p.shape, p.dtype)
        return ga, gp


# ---- unary math --------------------------------------------------------------------------

# eˣ is its own derivative, so forward saves its output and backward multiplies by it.
class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = get_array_module(x).exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y                       # d exp(x) = exp(x)


# log x: the derivative 1/x needs the input, not the output.
class Log(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return get_array_module(x).log(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / x                       # d log(x) = 1/x


# √x: the derivative 1/(2√x) is written with the saved output y = √x.
class Sqrt(Function):
    @staticmethod
    def forward(ctx, x):
        y = get_array_module(x).sqrt(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad / (2 * y)                 # d √x = 1/(2√x)


# |x|: the derivative is sign(x), taken as 0 at the kink x = 0.
class Abs(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return get_array_module(x).abs(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * get_array_module(x).sign(x)   # sign(x), 0 at 0 (as PyTorch)


# tanh: its derivative 1 − tanh²(x) = sech²(x) = 4u/(1 + u)² with u = e^{−2|x|}, written from
# x: from the output, 1 − tanh² cancels to 0 once tanh rounds to ±1 (|x| > 9 in float32).
class Tanh(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return get_array_module(x).tanh(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xp = get_array_module(x)
        u = xp.exp(-2 * xp.abs(_widened(x)))
        d = 1 + u
        return grad * (4 * u / d / d)                  # d tanh = sech² = 4u/(1 + u)²


def sigmoid_array(x):
    """σ(x) = 1/(1 + e⁻ˣ) on a raw array, in x's dtype (float16 computed in float32), as

        σ(x) = e^{min(x, 0)} / (1 + e^{−|x|}),

    that is 1/(1 + e⁻ˣ) for x ≥ 0 and eˣ/(1 + eˣ) for x < 0 in one expression: no exp
    overflows and nothing cancels, so σ keeps its relative accuracy in the tails (through
    ½(1 + tanh(x/2)) it is 0 below x = −17 in float32). σ(−inf) = 0 exactly.
    """
    xp = get_array_module(x)
    xw = _widened(x)
    y = xp.exp(xp.minimum(xw, 0)) / (1 + xp.exp(-xp.abs(xw)))
    return y.astype(x.dtype, copy=False)


# σ(x) = 1/(1 + e⁻ˣ) (sigmoid_array). Its derivative σ(1 − σ) from the saved output, as
# PyTorch: no other array is kept alive (in sigmoid attention, the N × N scores). Its relative
# error is an ulp for x ≤ 0 and grows as eˣ ulps above (0 from x = 17 in float32), as PyTorch's.
class Sigmoid(Function):
    @staticmethod
    def forward(ctx, x):
        y = sigmoid_array(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        y = _widened(y)
        return grad * (y * (1 - y))                  # dσ = σ(1 − σ)


# SiLU x·σ(x); its derivative σ(x) + xσ(x)σ(−x) = σ(x)(1 + x·σ(−x)), from x. One Function
# rather than x·sigmoid(x), so that float16 is computed in float32 and rounded once.
class Silu(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        fast = configuration.twin("silu")
        if fast is not None:
            return fast(x)
        xw = _widened(x)
        return (xw * sigmoid_array(xw)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        fast = configuration.twin("silu_backward")
        if fast is not None:
            return fast(x, grad)
        xw = _widened(x)
        return grad * (sigmoid_array(xw) * (1 + xw * sigmoid_array(-xw)))


class Relu(Function):
    # max(x, 0) against an array of zeros, not the number 0: NumPy's vectorised loop for
    # maximum needs both operands as arrays (against a broadcast scalar it runs element by
    # element). NaN stays NaN, −inf becomes 0, as with 0. The mask is saved as bool (a
    # quarter of the memory) and cast once for the product.
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        positive = x > 0
        ctx.save_for_backward(positive)
        out = xp.zeros_like(x)
        return xp.maximum(x, out, out=out)

    @staticmethod
    def backward(ctx, grad):
        (positive,) = ctx.saved_tensors
        return grad * positive.astype(grad.dtype)


# Leaky ReLU: slope 1 for x > 0, negative_slope otherwise; the same mask selects both ways.
class LeakyRelu(Function):
    @staticmethod
    def forward(ctx, x, negative_slope):
        positive = x > 0
        ctx.save_for_backward(positive)
        ctx.slope = negative_slope
        xp = get_array_module(x)
        return xp.where(positive, x, x * negative_slope)

    @staticmethod
    def backward(ctx, grad):
        (positive,) = ctx.saved_tensors
        xp = get_array_module(grad)
        return xp.where(positive, grad, grad * ctx.slope), None


# ELU: α(eˣ − 1) below zero, as α·expm1(x) (eˣ − 1 cancels to 0 for |x| < 6e-8 in float32);
# its derivative there, α eˣ, from x (the branch value + α cancels to 0 for x ≪ 0).
class Elu(Function):
    @staticmethod
    def forward(ctx, x, alpha):
        xp = get_array_module(x)
        xw = _widened(x)
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        neg = alpha * xp.expm1(xp.minimum(xw, 0))
        return xp.where(xw > 0, xw, neg).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xp = get_array_module(x)
        xw = _widened(x)
        return xp.where(xw > 0, grad, grad * (ctx.alpha * xp.exp(xp.minimum(xw, 0)))), None


# softplus log(1 + eˣ), a smooth ReLU; its derivative is the sigmoid σ(x).
class Softplus(Function):
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        return xp.logaddexp(0, x).astype(x.dtype, copy=False)          # log(1 + eˣ), stable

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * sigmoid_array(_widened(x))                      # σ(x)


# ---- erf (NumPy has none) and GELU -------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def erf_array(x):
    """The error function erf(x) = 2/√π ∫₀ˣ e^(−t²) dt, elementwise on a raw array.

    Computed in float64 (``erf_float64``) and rounded once to x's dtype: within half an ulp of
    the true erf in float32 and float16. The fast layer may stand in for it
    (``minitx/fast/erf.py``).
    """
    fast = configuration.twin("erf")
    if fast is not None:
        return fast(x)
    return erf_float64(x).astype(x.dtype, copy=False)


def erf_float64(x):
    """erf of every element of ``x``, in float64 (a float64 array of x's shape), accurate to a
    few ulp on the whole line, from two classical expansions:

    - |x| < 3: the series erf(x) = 2/√π e^(−x²) Σₙ 2ⁿ x^(2n+1) / (1·3·5···(2n+1)),
      whose terms are all positive (no cancellation);
    - |x| ≥ 3: erfc(x) = e^(−x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + …))))),
      the continued fraction, evaluated bottom-up with 60 levels; erf = 1 − erfc.

    Both are written for z = |x|; erf is odd, erf(−x) = −erf(x), so x's sign is put back last.
    """
    xp = get_array_module(x)
    z = xp.abs(x).astype(xp.float64)
    out = xp.empty_like(z)
    # Below 3: sum the positive series term by term, each term the last times 2z²/(2n + 1),
    # until a term no longer changes the total in float64 (asked every 8 terms: on a GPU each
    # question waits for the device).
    small = z < 3.0
    zs = z[small]
    term = zs.copy()
    total = zs.copy()
    n = 0
    while term.size and n < 200:
        n += 1
        term = term * (2.0 * zs * zs) / (2 * n + 1)
        total += term
        if n % 8 == 0 and not (term > 1e-17 * total).any():
            break
    out[small] = _TWO_OVER_SQRT_PI * xp.exp(-zs * zs) * total
    # From 3 up: the continued fraction for erfc, evaluated from its deepest level outward.
    zl = z[~small]
    frac = xp.zeros_like(zl)
    for k in range(60, 0, -1):            # continued fraction, innermost level first
        frac = (k / 2.0) / (zl + frac)
    erfc = xp.exp(-zl * zl) / math.sqrt(math.pi) / (zl + frac)
    out[~small] = 1.0 - erfc
    return xp.copysign(out, x, out=out)   # erf(−x) = −erf(x) (out=: an array even if 0-d)


# erf's derivative is the Gaussian bump 2/√π e^(−x²).
class Erf(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return erf_array(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (_TWO_OVER_SQRT_PI * get_array_module(x).exp(-x * x))   # 2/√π e^(−x²)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# GELU, x·Φ(x). The tanh form approximates Φ with ½(1 + tanh(√(2/π)(x + 0.044715x³)));
# forward saves what its backward needs: t = tanh(·) for the tanh form, Φ(x) for the exact one
# (float16 in float32, then x·Φ rounded once: in float16 Φ(−4) is subnormal, x³ overflows).
class Gelu(Function):
    @staticmethod
    def forward(ctx, x, approximate):
        xp = get_array_module(x)
        ctx.approximate = approximate
        dtype, x = x.dtype, _widened(x)
        if approximate == "tanh":
            inner = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
            t = xp.tanh(inner)
            ctx.save_for_backward(x, t)
            return (0.5 * x * (1 + t)).astype(dtype, copy=False)
        cdf = erf_array(x * _INV_SQRT_2)                     # Φ(x) = (1 + erf(x/√2))/2,
        cdf += 1                                             # in place
        cdf *= 0.5
        ctx.save_for_backward(x, cdf)
        return (x * cdf).astype(dtype, copy=False)

    # tanh form: product rule on ½x(1 + t), with dt/dx = (1 − t²)·d(inner)/dx.
    # Exact form: d[xΦ(x)]/dx = Φ(x) + xφ(x), φ the normal density.
    @staticmethod
    def backward(ctx, grad):
        x, aux = ctx.saved_tensors
        xp = get_array_module(x)
        if ctx.approximate == "tanh":
            t = aux
            d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
            return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner), None
        pdf = _INV_SQRT_2PI * xp.exp(-0.5 * x * x)           # φ(x) = e^(−x²/2)/√(2π)
        return grad * (aux + x * pdf), None                  # d[xΦ(x)] = Φ(x) + xφ(x)


# ---- binary selections -------------------------------------------------------------------

class _Select(Function):
    """maximum / minimum: the chosen input takes the gradient; a tie splits it evenly
    (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, b, larger):
        xp = get_array_module(a, b)
        ctx.save_for_backward(a, b)
        ctx.larger = larger
        return xp.maximum(a, b) if larger else xp.minimum(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        wins = (a > b) if ctx.larger else (a < b)
        share = wins + 0.5 * (a == b)                 # a's share of the gradient
        na, nb = ctx.needs_input_grad[:2]
        return (unbroadcast(grad * share, a.shape, a.dtype) if na else None,
                unbroadcast(grad * (1 - share), b.shape, b.dtype) if nb else None, None)


# Clip: the gradient is 1 where x lies inside [lo, hi] and 0 where it was clipped; a missing
# bound clips nothing on that side.
class Clip(Function):
    @staticmethod
    def forward(ctx, x, lo, hi):
        xp = get_array_module(x)
        inside = xp.ones(x.shape, dtype=bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        ctx.save_for_backward(inside)
        return xp.clip(x, lo, hi).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None     # gradient passes only where x was not clipped


# ---- identity-like -----------------------------------------------------------------------

class Clone(Function):
    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, grad):
        return grad


# A dtype cast: the gradient is cast back to the input's dtype.
class AsType(Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.astype(ctx.dtype), None


# A move between host and device: the gradient takes the way back.
class ToDevice(Function):
    @staticmethod
    def forward(ctx, x, device):
        ctx.source = backend.device_of(x)
        return backend.to_device(x, device)

    @staticmethod
    def backward(ctx, grad):
        return backend.to_device(grad, ctx.source), None


# ---- the public functions ----------------------------------------------------------------

def add(a, b):
    """a + b, broadcasting. Shapes: broadcast(a, b)."""
    return Add.apply(a, b)


def sub(a, b):
    """a − b, broadcasting."""
    return Sub.apply(a, b)


def mul(a, b):
    """a ⊙ b (elementwise), broadcasting. d/da = b, d/db = a."""
    return Mul.apply(a, b)


def div(a, b):
    """a / b, broadcasting. d/da = 1/b, d/db = −a/b²."""
    return Div.apply(a, b)


def neg(a):
    """−a."""
    return Neg.apply(a)


def pow(a, p):  # noqa: A001 - mirrors the operator's name
    """aᵖ, broadcasting; p may be a scalar or a tensor. d/da = p aᵖ⁻¹, d/dp = aᵖ log a."""
    return Pow.apply(a, p)


def exp(x):
    """eˣ elementwise."""
    return Exp.apply(x)


def log(x):
    """Natural logarithm, elementwise (x > 0)."""
    return Log.apply(x)


def sqrt(x):
    """√x elementwise."""
    return Sqrt.apply(x)


def abs(x):  # noqa: A001
    """|x|; gradient sign(x) (0 at 0)."""
    return Abs.apply(x)


def tanh(x):
    """tanh(x); gradient 1 − tanh²(x)."""
    return Tanh.apply(x)


def sigmoid(x):
    """σ(x) = 1/(1 + e⁻ˣ); gradient σ(1 − σ)."""
    return Sigmoid.apply(x)


def relu(x):
    """max(x, 0); gradient 1 where x > 0, else 0."""
    return Relu.apply(x)


def leaky_relu(x, negative_slope: float = 0.01):
    """x for x > 0, negative_slope·x otherwise."""
    return LeakyRelu.apply(x, negative_slope)


def elu(x, alpha: float = 1.0):
    """ELU: x for x > 0, α(eˣ − 1) otherwise (Clevert et al., 2015)."""
    return Elu.apply(x, alpha)


def softplus(x):
    """log(1 + eˣ), computed stably; gradient σ(x)."""
    return Softplus.apply(x)


def silu(x):
    """SiLU / swish: x·σ(x) (Elfwing et al., 2017; Ramachandran et al., 2017); gradient
    σ(x)(1 + x·σ(−x))."""
    return Silu.apply(x)


def erf(x):
    """The error function (see ``erf_array`` for the method); gradient 2/√π e^(−x²)."""
    return Erf.apply(x)


def gelu(x, approximate: str = "none"):
    """GELU (Hendrycks & Gimpel, 2016): x·Φ(x), Φ the standard normal CDF.

    ``approximate="none"``: Φ(x) = ½(1 + erf(x/√2)) exactly;
    ``approximate="tanh"``: ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (the GPT-2 form).
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x, approximate)


def maximum(a, b):
    """Elementwise max of a and b, broadcasting; ties share the gradient equally."""
    return _Select.apply(a, b, True)


def minimum(a, b):
    """Elementwise min of a and b, broadcasting; ties share the gradient equally."""
    return _Select.apply(a, b, False)


def clip(x, min=None, max=None):  # noqa: A002 - NumPy/PyTorch names
    """x limited to [min, max]; gradient 1 inside the interval (inclusive), 0 outside."""
    if min is None and max is None:
        raise ValueError("clip needs at least one of min, max")
    return Clip.apply(x, min, max)


def clone(x):
    """A copy of x that stays in the graph."""
    return Clone.apply(x)


def astype(x, dtype):
    """x cast to ``dtype``; the gradient is cast back to x's dtype."""
    return AsType.apply(x, as_dtype(dtype))


def to_device(x, device: str):
    """x moved to "cpu" or "cuda"; the gradient moves back."""
    return ToDevice.apply(x, device)
