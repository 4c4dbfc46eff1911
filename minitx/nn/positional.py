r"""Absolute position encodings: layers that add "where am I" to each token's embedding.

Self-attention is permutation-equivariant; these break the symmetry *before* attention, on the
embeddings (the schemes that act inside attention — relative, RoPE, ALiBi — are attention
variants, in ``attention/positions.py``):

1. **Sinusoidal** (Vaswani et al. 2017, §3.5): a fixed code,
   PE(pos, 2i) = sin(pos·ω_i), PE(pos, 2i+1) = cos(pos·ω_i), ω_i = base^(−2i/d);
2. **Learned absolute**: a trained vector per position (GPT-2's ``wpe``, BERT).

The sinusoidal code:

$$
\mathrm{PE}(\mathrm{pos}, 2i) = \sin(\mathrm{pos}\, \omega_i), \quad
\mathrm{PE}(\mathrm{pos}, 2i + 1) = \cos(\mathrm{pos}\, \omega_i), \quad
\omega_i = \mathrm{base}^{-2i/d}
$$
"""
from __future__ import annotations

from .. import validate
from ..backend import get_array_module, xp as active_xp
from ..ops.dropout import dropout
from ..ops.indexing import getitem
from . import init
from .module import Module, Parameter

__all__ = ["sinusoidal_positions", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding"]


def sinusoidal_positions(n: int, d: int, base: float = 10000.0, offset: int = 0, xp=None,
                         dtype="float32"):
    """The (n, d) table PE[pos, 2i] = sin(pos·ω_i), PE[pos, 2i+1] = cos(pos·ω_i),
    ω_i = base^(−2i/d), for pos = offset … offset + n − 1 (Vaswani et al. 2017, §3.5).

    Each pair is a clock of wavelength 2π/ω_i (from 2π to 2π·base): PE(pos + k) is a fixed
    linear (rotation) function of PE(pos). Odd d: the last column is a sine.
    """
    d = validate.positive_int(d, "d", owner="sinusoidal_positions")
    base = validate.positive_real(base, "base", owner="sinusoidal_positions")
    xp = xp or active_xp()
    pos = xp.arange(offset, offset + n, dtype="float64")[:, None]        # (n, 1)
    omega = base ** (-xp.arange(0, d, 2, dtype="float64") / d)           # (⌈d/2⌉,)
    angles = pos * omega                                                 # (n, ⌈d/2⌉)
    pe = xp.empty((n, d), dtype="float64")
    pe[:, 0::2] = xp.sin(angles)
    pe[:, 1::2] = xp.cos(angles[:, : d // 2])
    return pe.astype(dtype)


class SinusoidalPositionalEncoding(Module):
    """x + PE[offset : offset + N] (then dropout): fixed sinusoidal positions, no parameters.

    x (B, N, E) → (B, N, E). ``offset`` is the position of the first token (for cached
    decoding). No length limit: the table is computed on demand.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, base: float = 10000.0):
        super().__init__()
        who = "SinusoidalPositionalEncoding"
        self.d_model = validate.positive_int(d_model, "d_model", owner=who)
        self.p = validate.probability(dropout, "dropout", owner=who)
        self.base = validate.positive_real(base, "base", owner=who)

    def forward(self, x, offset: int = 0):
        if x.shape[-1] != self.d_model:
            raise ValueError(f"SinusoidalPositionalEncoding: x must end in d_model="
                             f"{self.d_model}, got shape {tuple(x.shape)}")
        xp = get_array_module(x.data)
        pe = sinusoidal_positions(x.shape[-2], self.d_model, self.base, offset, xp, x.dtype)
        return dropout(x + pe, self.p, self.training)


class LearnedPositionalEmbedding(Module):
    """x + W[offset : offset + N] with a trained table W (max_len, E) (GPT-2's ``wpe``).

    Parameter ``weight`` (max_len, E), initialised N(0, 0.02²). Positions ≥ max_len raise.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        who = "LearnedPositionalEmbedding"
        self.max_len = validate.positive_int(max_len, "max_len", owner=who)
        self.d_model = validate.positive_int(d_model, "d_model", owner=who)
        self.weight = Parameter(active_xp().zeros((max_len, d_model), dtype="float32"))
        init.normal_(self.weight, 0.0, 0.02)

    def positions(self, n: int, offset: int = 0):
        """The (n, E) slice of the table for positions offset … offset + n − 1."""
        if offset < 0 or offset + n > self.max_len:
            raise ValueError(f"LearnedPositionalEmbedding: positions {offset}…{offset + n - 1} "
                             f"exceed max_len={self.max_len}")
        return getitem(self.weight, slice(offset, offset + n))

    def forward(self, x, offset: int = 0):
        return x + self.positions(x.shape[-2], offset)
