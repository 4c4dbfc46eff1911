r"""The layers today's decoders put where GPT-2 had LayerNorm and a GELU MLP: RMSNorm with each
family's details, gated MLPs (SwiGLU, GeGLU), and the tanh soft-cap.

**RMSNorm** (Zhang & Sennrich 2019) drops LayerNorm's centring and bias; every family here puts
eps inside the root. Gemma stores w − 1 (its weights start at zero) and scales by (1 + w):

$$
\operatorname{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac{1}{E}\sum_j x_j^2 + \epsilon}} \odot g,
\qquad g = w \;\text{(Llama, Qwen, Mistral, OLMo)}, \quad g = 1 + w \;\text{(Gemma)}
$$

In float16 every family normalises in float32; they differ in where they round back:
Llama, Qwen and Mistral round the normalised x to float16 and then multiply by g (in float16),
Gemma and OLMo 2 multiply in float32 and round the product (``scale_in_float32``). In float32
and float64 the two are the same. nanochat's norms, and Llama 4's norm on q and k, have no
gain at all (g = 1, ``affine=False``).

**Gated MLPs** (Shazeer 2020, "GLU Variants Improve Transformer"): one projection, put through
an activation, gates another, elementwise; SwiGLU uses SiLU (Llama, Qwen, Mistral, OLMo),
GeGLU GELU (Gemma: its tanh approximation). Three matrices instead of two, so a family keeps
the parameter count of a 4E MLP with a hidden width near 8E/3:

$$
\operatorname{MLP}(x) = W_{down}\,\bigl(\phi(W_{gate}\, x) \odot W_{up}\, x\bigr),
\qquad \phi = \operatorname{SiLU}\;\text{or}\;\operatorname{GELU}
$$

nanochat and Nemotron-H keep GPT-2's two matrices with the squared ReLU of Primer (So et al.
2021), $W_{down}\,\max(W_{up} x, 0)^2$ (``DenseMLP`` with ``"relu2"``).

**Soft-capping** (Gemma 2's logits): a smooth clip into (−c, c) that is the identity near 0:

$$
\operatorname{softcap}_c(z) = c \tanh(z / c)
$$
"""
from __future__ import annotations

from .. import backend, validate
from .. import functional as F
from ..ops.elementwise import astype
from .hooks import HookPoint
from .layers import Linear, _as_shape, _empty_parameter, _float_dtype
from .module import Module, Parameter

__all__ = ["DecoderRMSNorm", "GatedMLP", "DenseMLP", "softcap", "MLP_ACTIVATIONS"]


# The activations a decoder's MLP may use, by the names the config gives them.
MLP_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,                                             # exact: x·Φ(x)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),       # HF's gelu_pytorch_tanh
    "relu2": lambda x: F.relu(x) ** 2,                          # Primer's squared ReLU
}


def softcap(z, cap: float):
    """c·tanh(z / c): ``z`` squashed into (−c, c), unchanged to first order near 0."""
    return F.tanh(z / cap) * cap


def _activation(name, owner):
    if name not in MLP_ACTIVATIONS:
        raise validate.OptionError(f"{owner}: activation must be one of "
                                   f"{sorted(MLP_ACTIVATIONS)}, got {name!r}")
    return MLP_ACTIVATIONS[name]


class DecoderRMSNorm(Module):
    """RMSNorm with the families' details (module docstring's formula). x (…, E) → (…, E).

    Options: ``eps``; ``unit_offset`` (Gemma: scale by 1 + w, w starting at zero);
    ``scale_in_float32`` (Gemma, OLMo 2: in float16, multiply before rounding back);
    ``affine`` (False: no gain, g = 1, nanochat's and Llama 4's QK-norm).
    Parameter ``weight`` (E,), None without ``affine``. Hook points (TransformerLens's):
    ``hook_scale``
    √(mean(x²) + eps) (…, 1) and ``hook_normalized`` x / scale (…, E); when one is set the
    formula runs composed so they can be seen. O(N·E).
    """

    def __init__(self, normalized_shape, eps: float = 1e-6, unit_offset: bool = False,
                 scale_in_float32: bool = False, affine: bool = True, dtype=None):
        super().__init__()
        who = "DecoderRMSNorm"
        self.normalized_shape = _as_shape(normalized_shape, who)
        self.eps = validate.positive_real(eps, "eps", owner=who)
        self.unit_offset = validate.boolean(unit_offset, "unit_offset", owner=who)
        self.scale_in_float32 = validate.boolean(scale_in_float32, "scale_in_float32",
                                                 owner=who)
        self.affine = validate.boolean(affine, "affine", owner=who)
        if unit_offset and not affine:
            raise validate.OptionError(f"{who}: unit_offset scales by 1 + w, which needs a "
                                       "weight; got affine=False")
        # Gemma's stored weight is g − 1, so a fresh layer (g = 1) starts at zero.
        dt = _float_dtype(dtype, who)
        if not affine:
            self.register_parameter("weight", None)
        elif unit_offset:
            self.weight = _empty_parameter(self.normalized_shape, dt)
        else:
            self.weight = Parameter(backend.xp().ones(self.normalized_shape, dtype=dt))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def gain(self):
        """g: the weight, or 1 + weight with ``unit_offset``; None without ``affine``."""
        return self.weight + 1.0 if self.unit_offset else self.weight

    def _normalize(self, x, g):
        # the fused op unless a hook wants the two intermediates
        if not (self.hook_scale.active or self.hook_normalized.active):
            return F.rms_norm(x, self.normalized_shape, g, self.eps)
        axes = tuple(range(-len(self.normalized_shape), 0))
        scale = self.hook_scale(((x * x).mean(axis=axes, keepdims=True) + self.eps).sqrt())
        y = self.hook_normalized(x / scale)
        return y if g is None else y * g

    def forward(self, x):
        g = self.gain()
        if x.dtype.itemsize >= 4:                        # float32, float64: one formula
            return self._normalize(x, g)
        # float16: normalise in float32; round before (Llama) or after (Gemma, OLMo 2) scaling
        x32 = astype(x, "float32")
        if self.scale_in_float32 or g is None:
            return astype(self._normalize(x32, None if g is None else astype(g, "float32")),
                          x.dtype)
        return astype(self._normalize(x32, None), x.dtype) * g

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, unit_offset={self.unit_offset}, "
                f"scale_in_float32={self.scale_in_float32}" +
                ("" if self.affine else ", affine=False"))


class GatedMLP(Module):
    """W_down (φ(W_gate x) ⊙ W_up x) (module docstring): SwiGLU with ``activation="silu"``,
    GeGLU with "gelu_tanh" or "gelu". x (…, E) → (…, E); hidden width F.

    Linear layers ``gate_proj``, ``up_proj`` (E → F), ``down_proj`` (F → E), biases when
    ``bias``. Hook points (TransformerLens's): ``hook_pre`` W_gate x, ``hook_pre_linear``
    W_up x, ``hook_post`` φ(W_gate x) ⊙ W_up x, all (…, F). O(3·N·E·F).
    """

    def __init__(self, dim: int, hidden: int, activation: str = "silu", bias: bool = False):
        super().__init__()
        self.activation = activation
        self.act = _activation(activation, "GatedMLP")
        # three matrices: the gate and the up projection side by side, then down
        self.gate_proj = Linear(dim, hidden, bias=bias)
        self.up_proj = Linear(dim, hidden, bias=bias)
        self.down_proj = Linear(hidden, dim, bias=bias)
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    # φ(gate) ⊙ up, elementwise: the gate decides how much of each hidden unit passes.
    def forward(self, x):
        gate = self.hook_pre(self.gate_proj(x))                          # (…, F)
        up = self.hook_pre_linear(self.up_proj(x))                       # (…, F)
        return self.down_proj(self.hook_post(self.act(gate) * up))       # (…, E)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class DenseMLP(Module):
    """GPT-2's MLP, W_down φ(W_up x): x (…, E) → (…, E), hidden width F, φ by name.

    Linear layers ``up_proj`` (E → F), ``down_proj`` (F → E). Hook points ``hook_pre``
    W_up x and ``hook_post`` φ(W_up x), (…, F). O(2·N·E·F).
    """

    def __init__(self, dim: int, hidden: int, activation: str = "gelu_tanh",
                 bias: bool = True):
        super().__init__()
        self.activation = activation
        self.act = _activation(activation, "DenseMLP")
        self.up_proj = Linear(dim, hidden, bias=bias)
        self.down_proj = Linear(hidden, dim, bias=bias)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x):
        return self.down_proj(self.hook_post(self.act(self.hook_pre(self.up_proj(x)))))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
