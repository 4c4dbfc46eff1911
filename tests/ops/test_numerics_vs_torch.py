"""float32 and float16 accuracy of the element-wise ops, the softmax family and the norms,
forward and backward, against PyTorch's own accuracy, over the whole input range.

Each op runs on a wide grid of inputs (|x| from 1e-8 to 90, log-spaced, both signs, and 0;
for the row ops, rows of scales 1e-8 … 1e4 and rows 300 + N(0, 1)) in float32 and in
float16, in minitx and in PyTorch's CPU kernels, and both are measured against PyTorch in
float64 on the same (rounded) inputs. Backward is d(Σ w ⊙ f(x))/dx for random weights w.

The error of one element is relative, with a floor:

    err = |y − y₆₄| / max(scale, tiny),

where ``scale`` is |y₆₄|, or for results formed by adding terms of both signs (the row ops'
gradients, layer norm's centring) the float64 sum of the terms' magnitudes (the size of the
rounding any evaluation of the formula makes), and ``tiny`` the dtype's smallest normal number
(below it the dtype has only absolute resolution). Left out: elements whose true value
overflows the dtype (the answer there is ±inf), and those where PyTorch gives ±inf or NaN
(an intermediate overflowed; minitx is not asked to do better). The grid is cut into bands
(a decade of |x| and its sign; a row scale), so that an error in the tails (x < −16, say)
cannot hide behind a larger one elsewhere, and in every band

    max err(minitx) ≤ C · max err(PyTorch) + FLOOR,

C = 4 and FLOOR a few ulps of 1 in the dtype, for where PyTorch's band maximum happens to be
far below an ulp (near x = 0, σ(1 − σ) with σ ≈ ½ is nearly exact): in float32 two (2⁻²²: a
formula of a few float32 steps, each rounded, is off by about an ulp even where PyTorch's
fewer steps are not), in float16 one (2⁻¹⁰: minitx computes it in float32 and rounds once,
half an ulp, as PyTorch does). Every case runs with the fast layer on and off (the
references).
"""
from typing import Callable, NamedTuple

import numpy as np
import pytest

import minitx
import minitx.functional as F
from support import tensor, need

torch = need("torch")

C = 4.0
DTYPES = ["float32", "float16"]
FLOOR = {"float32": 2.0 ** -22, "float16": 2.0 ** -10}


def grid(count_per_decade=12, top=90.0):
    """0 and ±|x| from 1e-8 to ``top``, log-spaced, in float64."""
    decades = np.log10(top) + 8
    mags = np.logspace(-8, np.log10(top), int(decades * count_per_decade) + 1)
    return np.concatenate([-mags[::-1], [0.0], mags])


def bands_of(x):
    """Each element's band: its decade of |x| with x's sign (0 for x = 0)."""
    with np.errstate(divide="ignore"):
        decade = np.floor(np.log10(np.abs(x))) + 10
    return np.where(x == 0, 0, np.sign(x) * np.where(np.isfinite(decade), decade, 0))


# ---- the inputs ---------------------------------------------------------------------------
# Each returns (inputs, bands): float64 arrays whose values are exact in ``dtype``, and a band
# label for each element of the result.

def unary(dtype, low=None):
    x = grid()
    if low is not None:
        x = x[x > low]
    x = x.astype(dtype).astype(np.float64)
    return {"x": x}, bands_of(x)


def positive(dtype):
    return unary(dtype, low=0.0)


def binary(dtype):
    """Every pair of a coarser grid; a band per pair of bands."""
    x = grid(count_per_decade=3).astype(dtype).astype(np.float64)
    a, b = (m.ravel() for m in np.meshgrid(x, x, indexing="ij"))
    return {"a": a, "b": b}, bands_of(a) * 100 + bands_of(b)


def power(dtype):
    """a > 0 on the grid, p in a few exponents of both signs; bands by a's decade and p."""
    a = grid(count_per_decade=6)
    a = a[a > 0]
    p = np.array([-2.5, -1.0, -0.5, 0.5, 1.5, 2.0, 3.0])
    a, p = (m.ravel().astype(dtype).astype(np.float64) for m in np.meshgrid(a, p))
    return {"a": a, "p": p}, bands_of(a) * 100 + p * 2


ROW_SCALES = np.logspace(-8, 4, 13)


def rows(dtype, n=64, per_band=4, seed=0):
    """Rows of n standard-normal values times a scale from 1e-8 to 1e4 (softmax's tails:
    scores 1e4 apart), a band per scale (its log10); and rows 300 + N(0, 1), band 100 (the
    norms' centring cancels; x² overflows float16). With γ, β for the norms."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(ROW_SCALES, per_band)[:, None]
    x = np.concatenate([rng.standard_normal((scale.size, n)) * scale,
                        300 + rng.standard_normal((per_band, n))])
    bands = np.concatenate([np.log10(scale), np.full((per_band, 1), 100.0)])
    x = x.astype(dtype).astype(np.float64)
    gamma = rng.uniform(0.5, 2.0, n).astype(dtype).astype(np.float64)
    beta = rng.standard_normal(n).astype(dtype).astype(np.float64)
    return {"x": x, "gamma": gamma, "beta": beta}, np.broadcast_to(bands, x.shape)


# ---- the scales: what each error is measured against ---------------------------------------
# For results that add terms of both signs, the float64 sum of the terms' magnitudes; from the
# float64 inputs, the weights w and PyTorch's float64 results ``ref``.

def softmax_scales(x, w, ref, **_):
    """dx = s ⊙ (w − Σ w s): each element's terms s|w| and s|Σ w s|."""
    s = ref["y"]
    return {"y": np.abs(s), "x": s * (np.abs(w) + np.abs((w * s).sum(-1, keepdims=True)))}


def log_softmax_scales(x, w, ref, **_):
    """y = x − m − log Σ e^{x − m}; dx = w − eʸ Σ w."""
    y = ref["y"]
    m = x.max(-1, keepdims=True)
    return {"y": np.abs(x - m) + np.abs(y - (x - m)),
            "x": np.abs(w) + np.exp(y) * np.abs(w.sum(-1, keepdims=True))}


def layer_norm_scales(x, w, ref, gamma, beta):
    """y = (x − μ)·r·γ + β; dx = r(γw − mean(γw) − x̂ mean(γw x̂)); dγ = Σ w x̂; dβ = Σ w."""
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * r
    d = gamma * w
    return {"y": (np.abs(x) + np.abs(mu)) * r * gamma + np.abs(beta),
            "x": r * (np.abs(d) + np.abs(d.mean(-1, keepdims=True))
                      + np.abs(xhat) * np.abs((d * xhat).mean(-1, keepdims=True))),
            "gamma": np.abs(w * xhat).sum(0), "beta": np.abs(w).sum(0)}


def rms_norm_scales(x, w, ref, gamma, **_):
    """y = x·r·γ; dx = r(γw − x̂ mean(γw x̂)); dγ = Σ w x̂."""
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    xhat = x * r
    d = gamma * w
    return {"y": np.abs(ref["y"]),
            "x": r * (np.abs(d) + np.abs(xhat) * np.abs((d * xhat).mean(-1, keepdims=True))),
            "gamma": np.abs(w * xhat).sum(0)}


# ---- exact float64 references where PyTorch's float64 formula cancels ------------------------
# The same derivative written without the cancellation, with torch's float64 functions:
# - d tanh = 1 − tanh² is 0 in float64 from |x| = 19 on; it is 1/cosh² x;
# - dσ = σ(1 − σ) is 0 from x = 37 on; it is σ(x)σ(−x);
# - gelu = x(1 + erf(x/√2))/2 is 0 below x = −8.3 (erf rounds to −1), where x·Φ(x) is 1e-17
#   and more; Φ = ndtr (through erfc);
# - gelu_tanh = ½x(1 + tanh z) likewise, = x·σ(2z), with d/dx = σ(2z) + 2x σ(2z)σ(−2z) z'.

def gelu_exact(x, w):
    phi = torch.exp(-x * x / 2) / (2 * torch.pi) ** 0.5
    return {"y": x * torch.special.ndtr(x), "x": w * (torch.special.ndtr(x) + x * phi)}


def gelu_tanh_exact(x, w):
    z = (2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)
    dz = (2 / torch.pi) ** 0.5 * (1 + 3 * 0.044715 * x * x)
    s, s_neg = torch.sigmoid(2 * z), torch.sigmoid(-2 * z)
    return {"y": x * s, "x": w * (s + 2 * x * s * s_neg * dz)}


# ---- the cases -------------------------------------------------------------------------------

class Case(NamedTuple):
    ours: Callable            # minitx, on the inputs in their order
    theirs: Callable          # torch, the same
    inputs: Callable = unary
    grads: tuple = None       # the inputs differentiated (default: all)
    scales: Callable = None   # default: |y₆₄|
    exact: Callable = None    # float64 results that replace torch's


TF = torch.nn.functional
ROWS_X = dict(inputs=rows, grads=("x",))


def rowwise(ours, theirs, **options):
    """A row op of x alone (it ignores the γ, β that come with the rows)."""
    return Case(lambda x, gamma, beta: ours(x), lambda x, gamma, beta: theirs(x),
                **{**ROWS_X, **options})


def both(name, *args, **kwargs):
    """(minitx's op, torch's op) of the same name, called with the same arguments."""
    return Case(lambda *t: getattr(F, name)(*t, *args, **kwargs),
                lambda *t: getattr(torch, name)(*t, *args, **kwargs))


CASES = {
    **{name: both(name)._replace(inputs=binary)
       for name in ("add", "sub", "mul", "div", "maximum", "minimum")},
    "pow": both("pow")._replace(inputs=power),
    **{name: both(name) for name in ("neg", "abs", "exp", "erf", "relu")},
    **{name: both(name)._replace(inputs=positive) for name in ("log", "sqrt")},
    "tanh": both("tanh")._replace(exact=lambda x, w: {"x": w / torch.cosh(x) ** 2}),
    "sigmoid": both("sigmoid")._replace(
        exact=lambda x, w: {"x": w * torch.sigmoid(x) * torch.sigmoid(-x)}),
    "leaky_relu": Case(F.leaky_relu, TF.leaky_relu),
    "elu": Case(F.elu, TF.elu),
    # PyTorch's float64 softplus is x above its threshold 20: raised, for the exact log(1 + eˣ)
    "softplus": Case(F.softplus, lambda x: TF.softplus(x, threshold=20),
                     exact=lambda x, w: {"y": TF.softplus(x, threshold=1e4),
                                         "x": w * torch.sigmoid(x)}),
    "silu": Case(F.silu, TF.silu),
    "gelu": Case(F.gelu, TF.gelu, exact=gelu_exact),
    "gelu_tanh": Case(lambda x: F.gelu(x, approximate="tanh"),
                      lambda x: TF.gelu(x, approximate="tanh"), exact=gelu_tanh_exact),
    "clip": Case(lambda x: F.clip(x, -1.0, 2.0), lambda x: torch.clamp(x, -1.0, 2.0)),
    "softmax": rowwise(lambda x: F.softmax(x, -1), lambda x: torch.softmax(x, -1),
                       scales=softmax_scales),
    "log_softmax": rowwise(lambda x: F.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1),
                           scales=log_softmax_scales),
    "logsumexp": rowwise(lambda x: F.logsumexp(x, -1, keepdims=True),
                         lambda x: torch.logsumexp(x, -1, keepdim=True)),
    "layer_norm": Case(lambda x, gamma, beta: F.layer_norm(x, x.shape[-1:], gamma, beta),
                       lambda x, gamma, beta: TF.layer_norm(x, x.shape[-1:], gamma, beta),
                       inputs=rows, scales=layer_norm_scales),
    "rms_norm": Case(lambda x, gamma, beta: F.rms_norm(x, x.shape[-1:], gamma),
                     lambda x, gamma, beta: TF.rms_norm(x, x.shape[-1:], gamma, eps=1e-6),
                     inputs=rows, grads=("x", "gamma"), scales=rms_norm_scales),
}


def run(fn, make, arrays, grads, w):
    """fn on the inputs made by ``make`` (a tensor factory), its backward with weights w:
    {"y": the result, input name: its gradient} as float64 arrays."""
    ts = {n: make(a, n in grads) for n, a in arrays.items()}
    y = fn(*ts.values())
    y.backward(make(w, False))
    return {"y": y, **{n: ts[n].grad for n in grads}}


def run_torch(case, arrays, dtype, w):
    c = CASES[case]
    grads = c.grads or tuple(arrays)
    out = run(c.theirs, lambda a, g: torch.tensor(a, dtype=getattr(torch, dtype),
                                                  requires_grad=g), arrays, grads, w)
    return {k: v.detach().double().numpy() for k, v in out.items()}


def run_minitx(case, arrays, dtype, w):
    c = CASES[case]
    grads = c.grads or tuple(arrays)
    with np.errstate(all="ignore"):               # overflow to ±inf is part of the sweep
        out = run(c.ours, lambda a, g: tensor(a.astype(dtype), dtype=None, requires_grad=g),
                  arrays, grads, w)
    assert all(v.dtype == dtype for v in out.values()), {k: v.dtype for k, v in out.items()}
    return {k: v.numpy().astype(np.float64) for k, v in out.items()}


_ORACLE = {}


def oracle(case, dtype):
    """Inputs, weights, bands, PyTorch's float64 and ``dtype`` results and the scales (cached:
    they do not depend on minitx's fast switch)."""
    if (case, dtype) not in _ORACLE:
        c = CASES[case]
        arrays, bands = c.inputs(dtype)
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
        if case == "logsumexp":
            shape = shape[:-1] + (1,)
        w = np.random.default_rng(1).standard_normal(shape).astype(dtype).astype(np.float64)
        ref = run_torch(case, arrays, "float64", w)
        if c.exact is not None:
            exact = c.exact(*(torch.from_numpy(a) for a in arrays.values()), torch.from_numpy(w))
            ref.update({k: v.numpy() for k, v in exact.items()})
        theirs = run_torch(case, arrays, dtype, w)
        if c.scales is None:
            scale = {k: np.abs(v) for k, v in ref.items()}
        else:
            scale = c.scales(w=w, ref=ref, **arrays)
        _ORACLE[case, dtype] = arrays, w, bands, ref, theirs, scale
    return _ORACLE[case, dtype]


def band_errors(case, dtype, fast):
    """{result name: (bands, minitx's band max, torch's band max)} for one case."""
    arrays, w, bands, ref, theirs, scale = oracle(case, dtype)
    with minitx.using_config(fast=fast):
        ours = run_minitx(case, arrays, dtype, w)
    info = np.finfo(dtype)
    out = {}
    for name, exact in ref.items():
        denom = np.maximum(scale[name], info.tiny)
        keep = np.abs(exact) <= info.max                  # the true value is finite in dtype
        with np.errstate(invalid="ignore"):
            e_ours = np.where(keep, np.abs(ours[name] - exact) / denom, 0.0)
            e_theirs = np.where(keep, np.abs(theirs[name] - exact) / denom, 0.0)
        e_ours = np.where(np.isnan(e_ours), np.inf, e_ours)      # NaN counts as a failure
        e_ours[~np.isfinite(e_theirs)] = 0                       # PyTorch overflowed too
        e_theirs[~np.isfinite(e_theirs)] = 0
        if e_ours.shape == bands.shape:
            b = bands
        elif e_ours.shape == bands.shape[:-1] + (1,):            # one per row (logsumexp)
            b = bands[..., :1]
        else:                                                    # γ, β: one band
            b = np.zeros(e_ours.shape)
        labels, index = np.unique(b, return_inverse=True)
        mo = np.zeros(labels.size)
        mt = np.zeros(labels.size)
        np.maximum.at(mo, index.ravel(), e_ours.ravel())
        np.maximum.at(mt, index.ravel(), e_theirs.ravel())
        out[name] = labels, mo, mt
    return out


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_as_accurate_as_pytorch(case, dtype, fast):
    floor = FLOOR[dtype]
    bad = []
    for name, (labels, ours, theirs) in band_errors(case, dtype, fast).items():
        for label, o, t in zip(labels, ours, theirs):
            if not o <= C * t + floor:
                bad.append(f"{name} band {label:g}: minitx {o:.3g}, torch {t:.3g}")
    assert not bad, f"{case} {dtype}: " + "; ".join(bad)


# PyTorch's backward of tanh is written from the output, 1 − y², which is 0 once y rounds to
# ±1 (|x| > 9 in float32): there PyTorch's own error is 100%, so the comparison above would
# let minitx lose its tails again. minitx's is written from x without cancelling (sech²), and
# is held to a fixed bound over the whole grid: 4 ulps of 1 in float32 (a few rounded steps)
# and 1 in float16 (float32, rounded once).
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tanh_derivative_keeps_its_relative_accuracy_in_the_tails(dtype, fast):
    labels, ours, theirs = band_errors("tanh", dtype, fast)["x"]
    bound = {"float32": 2.0 ** -21, "float16": 2.0 ** -10}[dtype]
    assert ours.max() <= bound, dict(zip(labels, ours))
    assert theirs.max() > 0.5          # (PyTorch's tails: what the comparison could not see)
