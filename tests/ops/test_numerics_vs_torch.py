"""float32 and float16 accuracy of the element-wise ops, the softmax family and the norms,
forward and backward, against PyTorch's own accuracy, over the whole input range.

Each op runs on a wide grid of inputs (|x| from 1e-8 to 90, log-spaced, both signs, and 0;
rows of scales 1e-8 … 1e4 for the row ops) in float32 and in float16, in minitx and in
PyTorch's CPU kernels, and both are measured against PyTorch in float64 on the same (rounded)
inputs. Backward is d(Σ w ⊙ f(x))/dx for random weights w.

The error of one element is relative, with a floor:

    err = |y − y₆₄| / max(scale, tiny),

where ``scale`` is |y₆₄|, or for results formed by adding terms of both signs (the row ops'
gradients, layer norm's centring) the float64 sum of the terms' magnitudes (the size of the
rounding any evaluation of the formula makes), and ``tiny`` the dtype's smallest normal number
(below it the dtype has only absolute resolution). Elements whose true value overflows the
dtype are left out (both give ±inf there). The grid is cut into bands (a decade of |x| and
its sign; a row scale) and in every band

    max err(minitx) ≤ C · max err(PyTorch) + FLOOR,

C = 4 and FLOOR a few ulps of 1 in the dtype, for where PyTorch's band maximum happens to be
far below an ulp (near x = 0, σ(1 − σ) with σ ≈ ½ is nearly exact): in float32 two (2⁻²²: a
formula of a few float32 steps, each rounded, is off by about an ulp even where PyTorch's fewer
steps are not), in float16 one (2⁻¹⁰: minitx computes it in float32 and rounds once, half an
ulp, as PyTorch does). The bands keep an error in the tails (x < −16, say) from hiding behind a larger one
elsewhere. Every case runs with the fast layer on and off (the references).
"""
import numpy as np
import pytest

import minitx
import minitx.functional as F
from support import tensor

torch = pytest.importorskip("torch", reason="needs PyTorch (the oracle)")

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


# ---- the ops: minitx and torch on the same inputs ----------------------------------------
# Each case: (minitx function, torch function, inputs(dtype) -> (arrays, bands), scales).
# ``arrays`` are float64 values exactly representable in the dtype; ``bands`` labels the
# output's elements. ``scales`` (optional) gives, from the float64 inputs, weights and torch's
# float64 results, the magnitude each error is measured against (default |y₆₄|).


def unary(dtype, low=None, top=90.0):
    x = grid(top=top)
    if low is not None:
        x = x[x > low]
    x = x.astype(dtype).astype(np.float64)
    return [x], bands_of(x)


def positive(dtype):
    return unary(dtype, low=0.0)


def binary(dtype, low=None):
    """Every pair of a coarser grid; a band per pair of bands."""
    x = grid(count_per_decade=3)
    if low is not None:
        x = x[x > low]
    x = x.astype(dtype).astype(np.float64)
    a, b = np.meshgrid(x, x, indexing="ij")
    return [a.ravel(), b.ravel()], bands_of(a.ravel()) * 100 + bands_of(b.ravel())


def power(dtype):
    """a > 0 on the grid, p in a few exponents of both signs; bands by a's decade and p."""
    a = grid(count_per_decade=6)
    a = a[a > 0]
    p = np.array([-2.5, -1.0, -0.5, 0.5, 1.5, 2.0, 3.0])
    a, p = (m.ravel().astype(dtype).astype(np.float64) for m in np.meshgrid(a, p))
    return [a, p], bands_of(a) * 100 + p * 2


ROW_SCALES = np.logspace(-8, 4, 13)


def rows(dtype, n=64, per_scale=4, seed=0):
    """Rows of n standard-normal values times a scale from 1e-8 to 1e4 (the tails of softmax:
    scores 1e4 apart); a band per scale. Plus γ, β for the norms."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(ROW_SCALES, per_scale)[:, None]
    x = (rng.standard_normal((scale.size, n)) * scale).astype(dtype).astype(np.float64)
    gamma = rng.uniform(0.5, 2.0, n).astype(dtype).astype(np.float64)
    beta = rng.standard_normal(n).astype(dtype).astype(np.float64)
    return [x, gamma, beta], np.broadcast_to(np.log10(scale), x.shape)


def softmax_scales(x, w, ref):
    """dx = s ⊙ (w − Σ w s): each element's terms s|w| and s|Σ w s|."""
    s = ref["y"]
    return {"y": np.abs(s), "x": s * (np.abs(w) + np.abs((w * s).sum(-1, keepdims=True)))}


def log_softmax_scales(x, w, ref):
    """dx = w − eʸ Σ w."""
    y = ref["y"]
    return {"y": np.abs(y), "x": np.abs(w) + np.exp(y) * np.abs(w.sum(-1, keepdims=True))}


def layer_norm_scales(x, gamma, beta, w, ref):
    """y = (x − μ)·r·γ + β; dx = r(γw − mean(γw) − x̂ mean(γw x̂)); dγ = Σ w x̂; dβ = Σ w."""
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * r
    d = gamma * w
    return {"y": (np.abs(x) + np.abs(mu)) * r * gamma + np.abs(beta),
            "x": r * (np.abs(d) + np.abs(d.mean(-1, keepdims=True))
                      + np.abs(xhat) * np.abs((d * xhat).mean(-1, keepdims=True))),
            "gamma": np.abs(w * xhat).sum(0), "beta": np.abs(w).sum(0)}


def rms_norm_scales(x, gamma, w, ref):
    """y = x·r·γ; dx = r(γw − x̂ mean(γw x̂)); dγ = Σ w x̂."""
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    xhat = x * r
    d = gamma * w
    return {"y": np.abs(ref["y"]),
            "x": r * (np.abs(d) + np.abs(xhat) * np.abs((d * xhat).mean(-1, keepdims=True))),
            "gamma": np.abs(w * xhat).sum(0)}


def clip_m(x):
    return F.clip(x, -1.0, 2.0)


def clip_t(x):
    return torch.clamp(x, -1.0, 2.0)


def softplus_t(x):
    # float64 is the reference: its exact log(1 + eˣ) rather than PyTorch's x above 20
    return torch.nn.functional.softplus(x, threshold=20 if x.dtype != torch.float64 else 1e4)


TF = torch.nn.functional
CASES = {
    "add": (F.add, torch.add, binary, None),
    "sub": (F.sub, torch.sub, binary, None),
    "mul": (F.mul, torch.mul, binary, None),
    "div": (F.div, torch.div, binary, None),
    "maximum": (F.maximum, torch.maximum, binary, None),
    "minimum": (F.minimum, torch.minimum, binary, None),
    "pow": (F.pow, torch.pow, power, None),
    "neg": (F.neg, torch.neg, unary, None),
    "abs": (F.abs, torch.abs, unary, None),
    "exp": (F.exp, torch.exp, unary, None),
    "log": (F.log, torch.log, positive, None),
    "sqrt": (F.sqrt, torch.sqrt, positive, None),
    "tanh": (F.tanh, torch.tanh, unary, None),
    "sigmoid": (F.sigmoid, torch.sigmoid, unary, None),
    "relu": (F.relu, torch.relu, unary, None),
    "leaky_relu": (F.leaky_relu, TF.leaky_relu, unary, None),
    "elu": (F.elu, TF.elu, unary, None),
    "softplus": (F.softplus, softplus_t, unary, None),
    "silu": (F.silu, TF.silu, unary, None),
    "erf": (F.erf, torch.erf, unary, None),
    "gelu": (F.gelu, TF.gelu, unary, None),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: TF.gelu(x, approximate="tanh"), unary, None),
    "clip": (clip_m, clip_t, unary, None),
    "softmax": (lambda x, g, b: F.softmax(x, -1), lambda x, g, b: torch.softmax(x, -1),
                rows, softmax_scales),
    "log_softmax": (lambda x, g, b: F.log_softmax(x, -1),
                    lambda x, g, b: torch.log_softmax(x, -1), rows, log_softmax_scales),
    "logsumexp": (lambda x, g, b: F.logsumexp(x, -1, keepdims=True),
                  lambda x, g, b: torch.logsumexp(x, -1, keepdim=True), rows, None),
    "layer_norm": (lambda x, g, b: F.layer_norm(x, x.shape[-1:], g, b),
                   lambda x, g, b: TF.layer_norm(x, x.shape[-1:], g, b),
                   rows, layer_norm_scales),
    "rms_norm": (lambda x, g, b: F.rms_norm(x, x.shape[-1:], g),
                 lambda x, g, b: TF.rms_norm(x, x.shape[-1:], g, eps=1e-6),
                 rows, rms_norm_scales),
}


# Where PyTorch's float64 formula itself cancels, the float64 reference is the same derivative
# written without the cancellation (with torch's float64 functions):
# - d tanh = 1 − tanh² is 0 in float64 from |x| = 19 on; it is 1/cosh² x;
# - dσ = σ(1 − σ) is 0 from x = 37 on; it is σ(x)σ(−x);
# - gelu = x(1 + erf(x/√2))/2 is 0 below x = −8.3 (erf rounds to −1), where x·Φ(x) is 1e-17
#   and more; Φ = ndtr (through erfc);
# - gelu_tanh = ½x(1 + tanh z) likewise, = x·σ(2z), with d/dx = σ(2z) + 2x σ(2z)σ(−2z) z'.
def _gelu_tanh_exact(x, w):
    z = (2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)
    dz = (2 / torch.pi) ** 0.5 * (1 + 3 * 0.044715 * x * x)
    s, s_neg = torch.sigmoid(2 * z), torch.sigmoid(-2 * z)
    return {"y": x * s, "x": w * (s + 2 * x * s * s_neg * dz)}


EXACT = {
    "tanh": lambda x, w: {"x": w / torch.cosh(x) ** 2},
    "sigmoid": lambda x, w: {"x": w * torch.sigmoid(x) * torch.sigmoid(-x)},
    "gelu": lambda x, w: {"y": x * torch.special.ndtr(x),
                          "x": w * (torch.special.ndtr(x)
                                    + x * torch.exp(-x * x / 2) / (2 * torch.pi) ** 0.5)},
    "gelu_tanh": _gelu_tanh_exact,
}
INPUT_NAMES = {"rows": ("x", "gamma", "beta"), "binary": ("a", "b"), "power": ("a", "p")}
# the inputs each row op differentiates (softmax and friends take γ, β only to share rows)
ROW_GRADS = {"layer_norm": ("x", "gamma", "beta"), "rms_norm": ("x", "gamma")}


def _names(case):
    return INPUT_NAMES.get(CASES[case][2].__name__, ("x",))


def _differentiated(case):
    names = _names(case)
    return ROW_GRADS.get(case, ("x",)) if names[0] == "x" and len(names) == 3 else names


def _weights(like, seed=1):
    return np.random.default_rng(seed).standard_normal(like.shape)


def run_torch(case, arrays, dtype, w):
    """torch's result and gradients (float64 arrays) for inputs in ``dtype``."""
    _, fn, _, _ = CASES[case]
    grads = _differentiated(case)
    tdtype = getattr(torch, dtype)
    ts = {n: torch.tensor(a, dtype=tdtype, requires_grad=n in grads)
          for n, a in zip(_names(case), arrays)}
    y = fn(*ts.values())
    y.backward(torch.tensor(w, dtype=tdtype))
    out = {"y": y.detach().double().numpy()}
    out.update({n: ts[n].grad.double().numpy() for n in grads})
    return out


def run_minitx(case, arrays, dtype, w):
    fn, _, _, _ = CASES[case]
    grads = _differentiated(case)
    ts = {n: tensor(a.astype(dtype), dtype=None, requires_grad=n in grads)
          for n, a in zip(_names(case), arrays)}
    with np.errstate(all="ignore"):               # overflow to ±inf is part of the sweep
        y = fn(*ts.values())
        assert y.dtype == dtype
        y.backward(tensor(w.astype(dtype), dtype=None))
    out = {"y": y.numpy().astype(np.float64)}
    for n in grads:
        assert ts[n].grad.dtype == dtype, (n, ts[n].grad.dtype)
        out[n] = ts[n].grad.numpy().astype(np.float64)
    return out


_ORACLE = {}


def oracle(case, dtype):
    """Inputs, weights, bands, scales and torch's results in float64 and ``dtype`` (cached:
    they do not depend on minitx's fast switch)."""
    key = case, dtype
    if key not in _ORACLE:
        _, _, inputs, scales = CASES[case]
        arrays, bands = inputs(dtype)
        w_shape = np.broadcast_shapes(*(a.shape for a in arrays[:2])) \
            if len(_names(case)) == 2 else arrays[0].shape
        if case == "logsumexp":
            w_shape = arrays[0].shape[:-1] + (1,)
        w = _weights(np.empty(w_shape)).astype(dtype).astype(np.float64)
        ref = run_torch(case, arrays, "float64", w)
        if case in EXACT:
            exact = EXACT[case](*(torch.from_numpy(a) for a in arrays), torch.from_numpy(w))
            ref.update({k: v.numpy() for k, v in exact.items()})
        theirs = run_torch(case, arrays, dtype, w)
        if scales is None:
            scale = {k: np.abs(v) for k, v in ref.items()}
        else:
            scale = scales(*_scale_args(case, arrays), w, ref)
        _ORACLE[key] = arrays, w, bands, ref, theirs, scale
    return _ORACLE[key]


def _scale_args(case, arrays):
    x, gamma, beta = arrays
    return {"softmax": (x,), "log_softmax": (x,), "layer_norm": (x, gamma, beta),
            "rms_norm": (x, gamma)}[case]


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
        e_theirs = np.where(np.isnan(e_theirs), np.inf, e_theirs)
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


# PyTorch's backward of tanh and σ is written from the output, 1 − y² and y(1 − y), which are 0
# once y rounds to ±1 (|x| > 9 and x > 17 in float32): there PyTorch's own error is 100%, so
# the comparison above would let minitx lose its tails again. minitx's derivatives are
# written from x without cancelling: they are held to a fixed bound over the whole grid,
# 4 ulps of 1 in float32 (a few rounded steps) and 1 in float16 (float32, rounded once).
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["tanh", "sigmoid"])
def test_derivatives_keep_their_relative_accuracy_in_the_tails(case, dtype, fast):
    labels, ours, theirs = band_errors(case, dtype, fast)["x"]
    bound = {"float32": 2.0 ** -21, "float16": 2.0 ** -10}[dtype]
    assert ours.max() <= bound, dict(zip(labels, ours))
    assert theirs.max() > 0.5          # (PyTorch's tails: what the comparison could not see)
