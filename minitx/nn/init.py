"""Parameter initialisers, in place, with PyTorch's names and formulas (``torch.nn.init``).

Every function fills ``tensor.data`` in place and returns the tensor. Random numbers come
from the generator seeded by ``minitx.manual_seed`` (drawn on the host in float64, then
moved to the tensor's device and cast to its dtype), so a seed reproduces an initialisation
exactly on NumPy and CuPy.

Fans. For a weight of shape (out, in, *kernel) the receptive field is r = Π kernel and

    fan_in = in · r,      fan_out = out · r.

For ``Linear``'s (out, in) weight, fan_in = in. The variance-preserving schemes:

    xavier_uniform_:   U(−a, a),  a = gain · √(6 / (fan_in + fan_out))   (Glorot & Bengio, 2010)
    xavier_normal_:    N(0, σ²),  σ = gain · √(2 / (fan_in + fan_out))
    kaiming_uniform_:  U(−b, b),  b = gain · √(3 / fan)                    (He et al., 2015)
    kaiming_normal_:   N(0, σ²),  σ = gain / √fan

with fan = fan_in (``mode="fan_in"``, preserves the forward variance) or fan_out (preserves
the backward variance), and ``gain = calculate_gain(nonlinearity, a)``.
"""
from __future__ import annotations

import contextlib
import math

from .. import backend, validate
from ..autograd.tensor import Tensor

__all__ = ["skipped", "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_",
           "zeros_",
           "ones_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
           "_calculate_fan_in_and_fan_out"]


def _check_tensor(tensor, fn: str) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fn} expects a minitx Tensor, got {type(tensor).__name__}")
    if tensor.dtype.kind != "f":
        raise TypeError(f"{fn} expects a floating-point tensor, got dtype {tensor.dtype}")


_SKIPPING = [0]                 # depth of open ``skipped()`` blocks


@contextlib.contextmanager
def skipped():
    """Inside this block every initialiser leaves its tensor as it is and draws nothing: a
    model about to receive a checkpoint's weights is built without filling them first
    (HuggingFace's ``no_init_weights``), which is most of the time a large model takes to
    build. The parameters keep the zeros or ones they were allocated with."""
    _SKIPPING[0] += 1
    try:
        yield
    finally:
        _SKIPPING[0] -= 1


def _fill(tensor: Tensor, draw) -> Tensor:
    """Write the host (NumPy) values ``draw()`` returns into ``tensor.data`` in place, on its
    device and dtype (nothing is drawn inside ``skipped()``)."""
    return tensor if _SKIPPING[0] else tensor.copy_(draw())


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table).

    linear/identity/sigmoid: 1;  tanh: 5/3;  relu: √2;  selu: 3/4;
    leaky_relu with negative slope s (``param``, default 0.01): √(2 / (1 + s²)).
    """
    if nonlinearity in ("linear", "identity", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "selu":
        return 3.0 / 4.0
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else validate.real(param, "param (negative_slope)",
                                                          owner="calculate_gain")
        return math.sqrt(2.0 / (1.0 + slope ** 2))
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}; expected one of linear, "
                     "identity, sigmoid, tanh, relu, leaky_relu, selu")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) = (shape[1]·r, shape[0]·r), r = Π shape[2:] (see module docstring)."""
    if tensor.ndim < 2:
        raise ValueError("fan in and fan out need a tensor with at least 2 dimensions, got "
                         f"shape {tuple(tensor.shape)}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


# ---- plain distributions ----------------------------------------------------------------------

def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with U(a, b)."""
    _check_tensor(tensor, "uniform_")
    if not a <= b:
        raise ValueError(f"uniform_ needs a <= b, got a={a}, b={b}")
    return _fill(tensor, lambda: backend.rng().uniform(a, b, size=tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with N(mean, std²)."""
    _check_tensor(tensor, "normal_")
    if std < 0:
        raise ValueError(f"normal_ needs std >= 0, got {std}")
    return _fill(tensor, lambda: backend.rng().normal(mean, std, size=tensor.shape))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0) -> Tensor:
    """Fill with N(mean, std²) conditioned on [a, b] (absolute bounds, as in PyTorch).

    Rejection sampling: draw from N(mean, std²) and redraw the entries outside [a, b] until
    none is left. Accepted draws are distributed exactly as the truncated normal. Each round
    keeps a fraction P(a ≤ X ≤ b) of the remaining entries, so an interval holding almost no
    probability mass is refused up front instead of looping for ever.
    """
    _check_tensor(tensor, "trunc_normal_")
    if not (std > 0 and a < b):
        raise ValueError(f"trunc_normal_ needs std > 0 and a < b, got std={std}, a={a}, b={b}")
    mass = 0.5 * (math.erf((b - mean) / (std * math.sqrt(2))) -
                  math.erf((a - mean) / (std * math.sqrt(2))))
    if mass < 1e-3:
        raise ValueError(f"trunc_normal_: [a, b] = [{a}, {b}] holds probability {mass:.2e} of "
                         f"N({mean}, {std}²); rejection sampling would not finish")
    # Redraw only the entries outside [a, b] until none is left; each round keeps a fraction
    # `mass` of them, so few rounds are needed.
    def draw():
        gen = backend.rng()
        values = gen.normal(mean, std, size=tensor.shape)
        outside = (values < a) | (values > b)
        while outside.any():
            values[outside] = gen.normal(mean, std, size=int(outside.sum()))
            outside = (values < a) | (values > b)
        return values
    return _fill(tensor, draw)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    _check_tensor(tensor, "constant_")
    return tensor if _SKIPPING[0] else tensor.fill_(val)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with 0."""
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    """Fill with 1."""
    return constant_(tensor, 1.0)


# ---- variance-preserving schemes --------------------------------------------------------------

def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """U(−a, a) with a = gain · √(6 / (fan_in + fan_out)): Var = gain² · 2 / (fan_in + fan_out)
    (a uniform on [−a, a] has variance a²/3)."""
    _check_tensor(tensor, "xavier_uniform_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return _fill(tensor, lambda: backend.rng().uniform(-bound, bound, size=tensor.shape))


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """N(0, σ²) with σ = gain · √(2 / (fan_in + fan_out))."""
    _check_tensor(tensor, "xavier_normal_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return _fill(tensor, lambda: backend.rng().normal(0.0, std, size=tensor.shape))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu") -> Tensor:
    """U(−b, b) with b = gain · √(3 / fan), gain = calculate_gain(nonlinearity, a).

    ``a`` is the negative slope of a leaky ReLU. ``Linear`` uses a = √5, giving
    gain = √(2/6) and b = 1/√fan_in.
    """
    _check_tensor(tensor, "kaiming_uniform_")
    fan = _calculate_correct_fan(tensor, mode)
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return _fill(tensor, lambda: backend.rng().uniform(-bound, bound, size=tensor.shape))


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu") -> Tensor:
    """N(0, σ²) with σ = gain / √fan, gain = calculate_gain(nonlinearity, a)."""
    _check_tensor(tensor, "kaiming_normal_")
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return _fill(tensor, lambda: backend.rng().normal(0.0, std, size=tensor.shape))
