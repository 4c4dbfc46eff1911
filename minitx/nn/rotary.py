r"""Rotary position embeddings as today's decoders use them: the half-split rotation, the
frequency scalings that stretch a trained context (linear, Llama 3, YaRN), and partial rotary
dimensions.

RoPE (Su et al. 2021) rotates pairs of coordinates of each query and key by an angle that
grows with the position m, so that a query–key score depends only on their offset. Llama and
the families after it pair coordinate i with coordinate i + R/2 of the rotated part (the
"rotate half" layout), not 2i with 2i + 1 as the paper (and ``attention/positions.py``) does;
the two are the same maths on permuted coordinates, but a checkpoint is trained for one.
With x₁ = x[:R/2], x₂ = x[R/2:R] and the rest passed through:

$$
\operatorname{rope}_m(x) =
\bigl[\, x_1 \cos m\omega - x_2 \sin m\omega,\;\; x_2 \cos m\omega + x_1 \sin m\omega,\;\;
x_{R:} \,\bigr] \cdot a
$$

where $a$ is YaRN's attention factor (1 otherwise; applied to q and to k, the scores grow by
$a^2$). The inverse frequencies, with base θ (``rope_theta``) and R rotated dims:

$$
\omega_i = \theta^{-2i/R}, \qquad i = 0, \dots, R/2 - 1, \qquad R = \lfloor D \cdot p \rfloor
$$

with p the ``partial_rotary_factor`` (1: every dim rotates). The scalings change ω only:

- **linear** (position interpolation, Chen et al. 2023): $\omega_i / s$, every frequency
  slowed by the factor s.
- **llama3**: wavelengths λ = 2π/ω longer than $L/f_{lo}$ are slowed by s, those shorter than
  $L/f_{hi}$ kept, those between blended with $\gamma = (L/\lambda - f_{lo})/(f_{hi} - f_{lo})$
  (L the original context):

$$
\omega'_i = (1 - \gamma)\,\frac{\omega_i}{s} + \gamma\,\omega_i
$$

- **yarn** (Peng et al. 2023): the same blend, but the ramp γ runs over dimension indices
  between the dims that turn β_fast and β_slow times within L, and $a = 0.1 \ln s + 1$
  (or the ratio of two such terms with ``mscale`` and ``mscale_all_dim``):

$$
d(\beta) = \frac{R \ln\!\bigl(L / (2\pi\beta)\bigr)}{2 \ln \theta}, \qquad
\gamma_i = \operatorname{clip}\!\Bigl(\frac{i - d(\beta_f)}{d(\beta_s) - d(\beta_f)}, 0, 1\Bigr),
\qquad \omega'_i = \gamma_i \frac{\omega_i}{s} + (1 - \gamma_i)\,\omega_i
$$

- **proportional** (Gemma 4's global layers): every dim takes part in the pairs (i, i + D/2),
  but only the first ⌊p·D/2⌋ frequencies turn, at θ^{−2i/D} (counted over the whole head,
  not over the rotated share), each divided by ``factor``; the other pairs have ω = 0 and
  pass unchanged. Where a partial rotary factor rotates a block of the first R dims, this
  rotates the low-index coordinates of both halves.

A rope option is HuggingFace's ``rope_parameters`` dict (``rope_type``, ``rope_theta``,
``factor`` …). A ``rope_type`` minitx does not compute (``dynamic``, ``longrope`` …) or an
unknown key is refused by name: an ignored scaling would change every position silently.
"""
from __future__ import annotations

import math

from .. import validate
from ..backend import get_array_module, host_xp
from ..ops.shape import concatenate

__all__ = ["ROPE_TYPES", "check_rope", "rope_frequencies", "yarn_mscale", "Rotary",
           "apply_rotary"]

# rope_type → the keys it reads besides rope_type, rope_theta and partial_rotary_factor.
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "proportional": ("factor",),
}
_COMMON = ("rope_type", "rope_theta", "partial_rotary_factor")
_REQUIRED = {"linear": ("factor",), "llama3": ROPE_TYPES["llama3"],
             "yarn": ("factor", "original_max_position_embeddings")}


def check_rope(rope: dict, owner: str = "rope") -> dict:
    """``rope`` (HuggingFace's ``rope_parameters`` dict) checked: a known ``rope_type``, only
    keys that type reads, the keys it needs. Returns a copy with ``rope_type`` filled in."""
    if not isinstance(rope, dict):
        raise validate.OptionError(f"{owner}: rope must be a dict like HuggingFace's "
                                   f"rope_parameters, got {type(rope).__name__}")
    # a known type, then only the keys it reads, then the ones it cannot do without
    rope = dict(rope)
    kind = rope.setdefault("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise validate.OptionError(f"{owner}: rope_type {kind!r} is not implemented by minitx "
                                   f"(implemented: {', '.join(ROPE_TYPES)})")
    unknown = sorted(set(rope) - set(_COMMON) - set(ROPE_TYPES[kind]))
    if unknown:
        raise validate.OptionError(f"{owner}: rope_type {kind!r} does not take "
                                   f"{', '.join(map(repr, unknown))} (it reads "
                                   f"{', '.join(_COMMON + ROPE_TYPES[kind])})")
    missing = [k for k in _REQUIRED.get(kind, ()) if rope.get(k) is None]
    if missing:
        raise validate.OptionError(f"{owner}: rope_type {kind!r} needs {', '.join(missing)}")
    return rope


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's temperature term, 0.1·m·ln s + 1 (1 when nothing is stretched, s ≤ 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(head_dim: int, rope: dict = None):
    """``(omega (R/2,) float64 NumPy, attention_factor a, R)`` for heads of ``head_dim`` dims
    under ``rope`` (module docstring's formulas; default: θ = 10000, no scaling)."""
    rope = check_rope({} if rope is None else rope)
    theta = float(rope.get("rope_theta", 10000.0))
    if rope["rope_type"] == "proportional":    # all D dims paired, the first few turning
        turning = int(float(rope.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        omega = host_xp.zeros(head_dim // 2)
        omega[:turning] = theta ** (-host_xp.arange(0, 2 * turning, 2,
                                                    dtype=host_xp.float64) / head_dim)
        return omega / float(rope.get("factor", 1.0)), 1.0, head_dim
    dim = int(head_dim * float(rope.get("partial_rotary_factor", 1.0)))
    if dim <= 0 or dim % 2:
        raise validate.OptionError(f"rope: the rotated dims R = head_dim · partial_rotary_factor"
                                   f" must be a positive even int, got {dim}")
    omega = theta ** (-host_xp.arange(0, dim, 2, dtype=host_xp.float64) / dim)      # (R/2,)
    kind, a = rope["rope_type"], 1.0
    if kind == "linear":
        omega = omega / rope["factor"]
    elif kind == "llama3":
        s, old = rope["factor"], rope["original_max_position_embeddings"]
        lo, hi = rope["low_freq_factor"], rope["high_freq_factor"]
        wavelen = 2 * math.pi / omega
        # long waves slowed by s, short ones kept, the band between blended by γ
        scaled = host_xp.where(wavelen > old / lo, omega / s, omega)
        gamma = (old / wavelen - lo) / (hi - lo)
        blended = (1 - gamma) * scaled / s + gamma * scaled
        middle = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        omega = host_xp.where(middle, blended, scaled)
    elif kind == "yarn":
        s, old = rope["factor"], rope["original_max_position_embeddings"]
        fast, slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

        # d(β): the dim index whose wave turns β times within the original context L
        def turns_dim(beta):
            return dim * math.log(old / (beta * 2 * math.pi)) / (2 * math.log(theta))

        # the ramp γ runs from the fast dim to the slow one (rounded outward by default)
        low, high = turns_dim(fast), turns_dim(slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high = high + 0.001 if low == high else high           # no zero-width ramp
        gamma = host_xp.clip((host_xp.arange(dim // 2) - low) / (high - low), 0, 1)
        omega = gamma * omega / s + (1 - gamma) * omega
        # a: given, or YaRN's temperature (a ratio of two when mscale_all_dim is set)
        a = rope.get("attention_factor")
        if a is None:
            m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
            a = yarn_mscale(s, m) / yarn_mscale(s, m_all) if m and m_all else \
                yarn_mscale(s)
    return omega, float(a), dim


def apply_rotary(x, cos, sin, rotary_dim: int):
    """rope_m(x) for x (…, N, D) Tensor, ``cos``/``sin`` (N, R/2) arrays holding
    a·cos mω, a·sin mω; the last D − R dims pass unchanged. Differentiable (composed ops);
    O(N·D)."""
    half = rotary_dim // 2
    x1, x2 = x[..., :half], x[..., half:rotary_dim]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]                # rotate each (i, i + R/2)
    if rotary_dim < x.shape[-1]:
        parts.append(x[..., rotary_dim:])                               # partial: the rest as is
    return concatenate(parts, axis=-1)


_TABLES = {}          # (ω, a, dtype, positions) → (cos, sin) on the host → (cos, sin), oldest first
_TABLES_KEPT = 8      # a model's kinds of layer (Gemma 3: two) for a step or two


class Rotary:
    """The rotary table of one kind of layer: ``Rotary(head_dim, rope)``.

    ``rotate(x, positions)`` rotates x (B, H, N, D) (a Tensor) at ``positions``, (N,) ints
    or (B, N) (each batch row its own, as left-padded prompts need);
    ``omega`` (R/2,), ``attention_factor`` a and ``rotary_dim`` R are the module docstring's.
    ``reverse``: every pair turns the other way, by −mω (nanochat's rotation, whose
    "rotate half" has its signs flipped). The angles are formed in float64 and cast to x's
    dtype.
    """

    def __init__(self, head_dim: int, rope: dict = None, reverse: bool = False):
        self.head_dim = validate.positive_int(head_dim, "head_dim", owner="Rotary")
        self.rope = check_rope({} if rope is None else rope, owner="Rotary")
        self.omega, self.attention_factor, self.rotary_dim = rope_frequencies(head_dim,
                                                                              self.rope)
        self.reverse = validate.boolean(reverse, "reverse", owner="Rotary")
        if reverse:                            # cos(−mω) = cos mω, sin(−mω) = −sin mω
            self.omega = -self.omega

    def tables(self, positions, dtype):
        """(cos, sin), each (…, N, R/2): a·cos(m ω_i), a·sin(m ω_i) for positions (…, N), on
        the positions' device. Every layer of a forward asks for the same tables, twice (q
        and k): the last few are kept (``_TABLES``), and must not be written to."""
        xp = get_array_module(positions)
        positions = xp.asarray(positions)
        if xp is not host_xp:                  # on a device, a key would cost a transfer
            return self._tables(positions, dtype, xp)
        key = (self.omega.tobytes(), self.attention_factor, str(dtype), positions.shape,
               positions.tobytes())
        if key not in _TABLES:
            _TABLES[key] = self._tables(positions, dtype, xp)
            while len(_TABLES) > _TABLES_KEPT:
                _TABLES.pop(next(iter(_TABLES)))
        return _TABLES[key]

    def _tables(self, positions, dtype, xp):
        angles = positions.astype("float64")[..., None] * xp.asarray(self.omega)
        a = self.attention_factor
        return (a * xp.cos(angles)).astype(dtype), (a * xp.sin(angles)).astype(dtype)

    def rotate(self, x, positions):
        cos, sin = self.tables(positions, x.dtype)
        if cos.ndim == 3:                      # one row of positions per batch row: (B, 1, N, ·)
            cos, sin = cos[:, None], sin[:, None]
        return apply_rotary(x, cos, sin, self.rotary_dim)

    def __repr__(self) -> str:
        return (f"Rotary(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"rope={self.rope}" + (", reverse=True)" if self.reverse else ")"))
