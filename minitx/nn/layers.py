"""The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout and activations.

Each layer owns its Parameters and calls one op of ``minitx.functional`` in ``forward``;
the op holds the math and its gradient. Shapes use ``...`` for any leading batch axes.
Defaults (initialisation, eps, layouts) follow PyTorch, so a state dict carries over.
"""
from __future__ import annotations

import math

from .. import backend, validate
from .. import functional as F
from ..autograd.tensor import Tensor
from . import init
from .hooks import HookPoint
from .module import Module, Parameter

__all__ = ["Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "Identity", "ReLU",
           "GELU", "SiLU", "Tanh", "Sigmoid"]


# Parameters are floating point (the default float dtype unless one is given): gradient
# descent needs a continuous dtype.
def _float_dtype(dtype, layer: str):
    dt = backend.default_float() if dtype is None else backend.as_dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{layer}: dtype must be floating point, got {dt}")
    return dt


def _empty_parameter(shape, dtype) -> Parameter:
    """A Parameter of zeros on the active backend (filled by the layer's initialiser)."""
    return Parameter(backend.xp().zeros(shape, dtype=dtype))


def _as_shape(normalized_shape, layer: str) -> tuple:
    if isinstance(normalized_shape, (tuple, list)):
        shape = validate.int_tuple(normalized_shape, "normalized_shape", minimum=1, owner=layer)
        if not shape:
            raise validate.OptionError(f"{layer}: normalized_shape must be a positive int or a "
                                       "non-empty tuple of positive ints, got ()")
        return shape
    return (validate.positive_int(normalized_shape, "normalized_shape", owner=layer),)


class Linear(Module):
    """y = x Wᵀ + b.   x (..., in_features) → y (..., out_features).

    ``weight`` (out_features, in_features) and ``bias`` (out_features,), PyTorch's layout.
    Initialisation (PyTorch's default): W ~ kaiming_uniform_(a=√5), i.e. U(−1/√in, 1/√in),
    and b ~ U(−1/√in, 1/√in).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.in_features = validate.positive_int(in_features, "in_features", owner="Linear")
        self.out_features = validate.positive_int(out_features, "out_features", owner="Linear")
        dt = _float_dtype(dtype, "Linear")
        self.weight = _empty_parameter((out_features, in_features), dt)
        if bias:
            self.bias = _empty_parameter((out_features,), dt)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._factory(device)

    # kaiming_uniform_(a=√5) has bound √(2/(1 + 5))·√(3/in) = 1/√in: PyTorch's default
    # U(−1/√in, 1/√in), the bias drawn from the same range.
    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    # Integer input is refused: token ids belong in an Embedding, and a silent cast would hide
    # the mistake.
    def forward(self, x: Tensor) -> Tensor:
        dtype = getattr(x, "dtype", None)
        if dtype is not None and getattr(dtype, "kind", "f") not in "fc":
            raise TypeError(f"Linear: input must be floating point like its weight "
                            f"({self.weight.dtype}), got dtype {dtype}; token ids go through "
                            "nn.Embedding, numbers through x.astype('float32')")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices (...,) → rows of ``weight`` (..., embedding_dim).

    ``weight`` (num_embeddings, embedding_dim) ~ N(0, 1) (PyTorch's default). With
    ``padding_idx`` (negative counts from the end) that row starts at zero and never
    receives a gradient, so it stays zero under any optimizer without weight decay.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 device=None, dtype=None):
        super().__init__()
        who = "Embedding"
        self.num_embeddings = validate.positive_int(num_embeddings, "num_embeddings", owner=who)
        self.embedding_dim = validate.positive_int(embedding_dim, "embedding_dim", owner=who)
        if padding_idx is not None:
            n = self.num_embeddings
            padding_idx = validate.integer(padding_idx, "padding_idx", minimum=-n, maximum=n - 1,
                                           owner=who) % n
        self.padding_idx = padding_idx
        self.weight = _empty_parameter((num_embeddings, embedding_dim),
                                       _float_dtype(dtype, "Embedding"))
        self.reset_parameters()
        self._factory(device)

    # N(0, 1) rows (PyTorch's default); the padding row at zero, and F.embedding gives it no
    # gradient.
    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True,
                        padding_idx: int | None = None) -> "Embedding":
        """An Embedding holding a copy of ``embeddings`` (V, E); frozen unless ``freeze=False``."""
        table = embeddings.data if isinstance(embeddings, Tensor) else embeddings
        if len(table.shape) != 2:
            raise ValueError(f"Embedding.from_pretrained expects a 2-D (V, E) table, got shape "
                             f"{tuple(table.shape)}")
        layer = cls(table.shape[0], table.shape[1], padding_idx=padding_idx, dtype=table.dtype)
        layer.weight.copy_(table)
        layer.weight.requires_grad = not freeze
        return layer

    def forward(self, indices) -> Tensor:
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """y = (x − μ) / √(σ² + eps) ⊙ weight + bias  (Ba, Kiros & Hinton, 2016).

    μ and σ² (biased) are taken over the last ``len(normalized_shape)`` axes of x
    (..., *normalized_shape). ``weight`` starts at ones and ``bias`` at zeros; neither exists
    when ``elementwise_affine=False``, and ``bias=False`` drops only the bias.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape, "LayerNorm")
        self.eps = validate.positive_real(eps, "eps", owner="LayerNorm")
        self.elementwise_affine = validate.boolean(elementwise_affine, "elementwise_affine",
                                                   owner="LayerNorm")
        dt = _float_dtype(dtype, "LayerNorm")
        # γ starts at ones and β at zeros, so a fresh layer only normalises.
        if elementwise_affine:
            self.weight = Parameter(backend.xp().ones(self.normalized_shape, dtype=dt))
            if bias:
                self.bias = _empty_parameter(self.normalized_shape, dt)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.hook_scale = HookPoint()          # √(σ² + eps)   (..., 1)
        self.hook_normalized = HookPoint()     # (x − μ) / √(σ² + eps), before weight and bias
        self._factory(device)

    # No hook set: the fused op, one node with its own backward (ops/norm.py).
    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.active or self.hook_normalized.active):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        # a hook is set: the same formula composed, so its two intermediates can be seen
        axes = tuple(range(-len(self.normalized_shape), 0))
        centred = x - x.mean(axis=axes, keepdims=True)
        scale = self.hook_scale(((centred * centred).mean(axis=axes, keepdims=True)
                                 + self.eps).sqrt())
        y = self.hook_normalized(centred / scale)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    """y = x / √(mean(x²) + eps) ⊙ weight  (Zhang & Sennrich, 2019): LayerNorm without the
    centring and the bias.

    The mean is over the last ``len(normalized_shape)`` axes. ``eps=None`` means 1e-6 (PyTorch
    uses the dtype's machine epsilon there). ``weight`` starts at ones.
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape, "RMSNorm")
        self.eps = validate.positive_real(1e-6 if eps is None else eps, "eps", owner="RMSNorm")
        self.elementwise_affine = validate.boolean(elementwise_affine, "elementwise_affine",
                                                   owner="RMSNorm")
        if elementwise_affine:
            self.weight = Parameter(backend.xp().ones(self.normalized_shape,
                                                      dtype=_float_dtype(dtype, "RMSNorm")))
        else:
            self.register_parameter("weight", None)
        self._factory(device)

    # One fused op: x / √(mean(x²) + eps) ⊙ γ, with its own backward (ops/norm.py).
    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Dropout(Module):
    """Inverted dropout while training: zero each element with probability p, scale the rest
    by 1/(1 − p), so E[y] = x; the identity in ``eval()`` mode. p = 1 gives zeros."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = validate.probability(p, "p", allow_one=True, owner="Dropout")

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ---- activations ------------------------------------------------------------------------------

class Identity(Module):
    """y = x (any constructor arguments are ignored, as in PyTorch)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class ReLU(Module):
    """y = max(x, 0)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class GELU(Module):
    """y = x·Φ(x); ``approximate="tanh"`` uses ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """y = x·σ(x) (a.k.a. swish)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Tanh(Module):
    """y = tanh(x)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    """y = σ(x) = 1 / (1 + e^(−x))."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)
