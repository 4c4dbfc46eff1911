"""The contract every attention variant follows, and the registry that names them.

``REGISTRY`` maps a name to a Module class. Every class is constructed as

    layer = REGISTRY[name](embed_dim, num_heads, causal=False, **options)

and offers

- ``layer(x)``: self-attention, (B, N, E) → (B, N, E): project to heads, ``attend``,
  merge heads, project out;
- ``layer.attend(q, k, v)``: the variant's own attention on heads,
  q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D), where Hkv divides H (MQA/GQA share
  key/value heads; equal counts always work);
- ``layer.kind``: "exact" | "masked" | "approximate" | "score" (see below);
- ``layer.pattern(n)``: the (n, n) boolean mask of allowed (query, key) pairs (True = may
  attend), for "exact" and "masked" variants (and "score" variants where it applies).

Kinds:
- "exact": equals softmax(q kᵀ/√D) v under ``pattern(n)`` (all-true, or causal);
- "masked": the same under a sparse ``pattern(n)``;
- "approximate": approximates the exact one (Performer, Linformer, ...);
- "score": a different score function, tested against its own dense formula.

A variant that cannot honour an option (e.g. causal Linformer) raises ValueError at
construction.
"""
from __future__ import annotations

import math

from ..backend import get_array_module, host_xp, to_device_of
from ..nn.layers import Linear
from ..nn.module import Module

__all__ = ["REGISTRY", "register", "AttentionBase", "split_heads", "merge_heads",
           "repeat_kv", "check_heads", "dense_attention_array", "causal_pattern",
           "softmax_rows_array"]

REGISTRY: dict = {}


def register(name: str):
    """Class decorator: add an attention Module to ``REGISTRY`` under ``name``."""
    def deco(cls):
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise ValueError(f"attention variant {name!r} is already registered "
                             f"({REGISTRY[name].__name__})")
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


# ---- head bookkeeping --------------------------------------------------------------------

def split_heads(x, num_heads: int):
    """(B, N, H·D) → (B, H, N, D)."""
    b, n, e = x.shape
    return x.reshape(b, n, num_heads, e // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, D) → (B, N, H·D)."""
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def repeat_kv(x, num_heads: int):
    """Repeat key/value heads so (B, Hkv, N, D) becomes (B, H, N, D) (for MQA/GQA).

    Head h of the query uses key/value head h // (H / Hkv), as in PyTorch's enable_gqa.
    Differentiable: the gradient of a shared head is the sum over the query heads using it.
    """
    from ..ops.shape import broadcast_to, reshape
    b, hkv, n, d = x.shape
    if hkv == num_heads:
        return x
    group = num_heads // hkv
    x = reshape(x, (b, hkv, 1, n, d))
    x = broadcast_to(x, (b, hkv, group, n, d))
    return reshape(x, (b, num_heads, n, d))


def check_heads(q, k, v, name: str = "attend"):
    """Validate (B, H, Nq, D) / (B, Hkv, Nk, D) / (B, Hkv, Nk, Dv) and return the sizes.

    Raises ValueError naming the argument, the expected and the given shape.
    """
    for arg, t in (("query", q), ("key", k), ("value", v)):
        if len(t.shape) != 4:
            raise ValueError(f"{name}: {arg} must be 4-d (B, H, N, D), got shape {tuple(t.shape)}")
    b, h, nq, d = q.shape
    bk, hk, nk, dk = k.shape
    bv, hv, nv, _ = v.shape
    if bk != b or bv != b:
        raise ValueError(f"{name}: batch sizes differ: query {b}, key {bk}, value {bv}")
    if dk != d:
        raise ValueError(f"{name}: key head dim must equal query head dim {d}, got {dk}")
    if hk != hv or nk != nv:
        raise ValueError(f"{name}: key {tuple(k.shape)} and value {tuple(v.shape)} must share "
                         "heads and length")
    if h % hk:
        raise ValueError(f"{name}: key/value head count {hk} must divide the query head "
                         f"count {h}")
    return b, h, hk, nq, nk, d


# ---- the reference every exact/masked variant is tested against -------------------------

def causal_pattern(nq: int, nk: int = None, xp=host_xp):
    """(nq, nk) bool: query i may see key j iff j ≤ i + (nk − nq) (bottom-right aligned).

    Built with ``xp`` (default NumPy, on the host: pass the data's array module for a mask
    that meets device arrays)."""
    nk = nq if nk is None else nk
    return xp.tri(nq, nk, nk - nq, dtype=bool)


def dense_attention_array(q, k, v, allowed=None, scale=None):
    """softmax(q kᵀ · scale, masked to ``allowed``) v on raw arrays — the reference.

    q (B, H, Nq, D), k/v (B, Hkv, Nk, D); ``allowed`` broadcastable to (B, H, Nq, Nk),
    True = may attend. Rows with no allowed key give zeros. Not differentiable.
    """
    xp = get_array_module(q, k, v)
    h, hk = q.shape[1], k.shape[1]
    if hk != h:
        k = xp.repeat(k, h // hk, axis=1)
        v = xp.repeat(v, h // hk, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ xp.swapaxes(k, -1, -2)) * scale
    return softmax_rows_array(s, allowed) @ v


def softmax_rows_array(s, allowed=None):
    """Raw arrays: softmax over the last axis of scores ``s``, keys outside ``allowed``
    (broadcastable to ``s``, True = may attend) get probability 0; rows with no allowed key
    give zeros. The dense softmax ``dense_attention_array`` and the "score" variants'
    ``reference`` methods share."""
    from ..ops.activation import softmax_array      # the one raw-array safe softmax
    if allowed is not None:
        xp = get_array_module(s)
        s = xp.where(to_device_of(allowed, s), s, -xp.inf)
    return softmax_array(s, axis=-1)


# ---- the Module base ---------------------------------------------------------------------

class AttentionBase(Module):
    """Shared projections and head plumbing for every registered variant.

    Parameters: ``embed_dim`` E, ``num_heads`` H (E divisible by H; D = E/H),
    ``causal``, ``num_kv_heads`` Hkv (default H; H divisible by Hkv), ``bias``.
    Subclasses implement ``attend(q, k, v)`` and set ``kind``; they may set
    ``supports_causal = False`` to refuse ``causal=True`` at construction.
    """

    kind = "exact"
    supports_causal = True
    name = "base"

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False,
                 num_kv_heads: int = None, bias: bool = True):
        super().__init__()
        if not isinstance(embed_dim, int) or embed_dim <= 0:
            raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(num_kv_heads, int) or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads "
                             f"({num_kv_heads})")
        if causal and not self.supports_causal:
            raise ValueError(f"{type(self).__name__} ({self.name}) does not support causal=True")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = bool(causal)
        kv_dim = self.head_dim * num_kv_heads
        self.q_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = Linear(embed_dim, kv_dim, bias=bias)
        self.v_proj = Linear(embed_dim, kv_dim, bias=bias)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x):
        """Self-attention: x (B, N, E) → (B, N, E)."""
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__}: x must be (B, N, {self.embed_dim}), "
                             f"got shape {tuple(x.shape)}")
        q = split_heads(self.q_proj(x), self.num_heads)        # (B, H, N, D)
        k = split_heads(self.k_proj(x), self.num_kv_heads)     # (B, Hkv, N, D)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        return self.out_proj(merge_heads(self.attend(q, k, v)))

    def attend(self, q, k, v):  # pragma: no cover - abstract
        raise NotImplementedError

    def pattern(self, n: int):
        """(n, n) bool allowed-positions mask, a host NumPy array (a picture and a test
        reference): all True, or lower-triangular when causal."""
        return causal_pattern(n, n, host_xp) if self.causal else host_xp.ones((n, n), dtype=bool)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}, kind={self.kind!r}")
