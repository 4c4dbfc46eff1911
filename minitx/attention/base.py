"""The contract every attention variant follows, and the registry that names them.

``REGISTRY`` maps a name to a Module class. Every class is constructed as

    layer = REGISTRY[name](embed_dim, num_heads,
                           causal=False, **options)

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

from .. import validate
from ..backend import get_array_module, host_xp
from ..nn.hooks import HookPoint
from .kv_cache import KVCache
from ..nn.layers import Linear
from ..nn.module import Module
from ..ops.activation import softmax, softmax_array
from ..ops.attention_maths import attention_forward, mask_scores   # the one dense reference
from ..ops.sdpa import (attention_scores, check_heads, merge_heads, repeat_kv,
                        scaled_dot_product_attention, split_heads)
from ..ops.dropout import dropout
from ..ops.indexing import masked_fill
from ..ops.linalg import matmul
from ..ops.shape import transpose

# The head plumbing (split_heads, merge_heads, repeat_kv, check_heads) is re-exported:
# every variant file takes it from here.
__all__ = ["REGISTRY", "register", "AttentionBase", "hooked_heads", "materialized_attention",
           "hookable_attention",
           "kernel_feature_hooks", "split_heads", "merge_heads", "repeat_kv", "repeat_kv_array",
           "check_heads", "dense_attention_array", "causal_pattern", "softmax_rows_array",
           "PROJECTIONS"]


class _Registry(dict):
    """{name: attention class}; an unknown name raises a KeyError naming the close ones."""

    def __missing__(self, name):
        raise KeyError(f"no attention variant named {name!r}" + validate.did_you_mean(name, self)
                       + f" (registered: {', '.join(sorted(self))})")


REGISTRY: dict = _Registry()
PROJECTIONS = ("q", "k", "v", "out")


def register(name: str):
    """Class decorator: add an attention Module to ``REGISTRY`` under ``name``.

    The class docstring shows the ``complexity`` attribute where it says ``{complexity}``
    (the fact is stated once, in the attribute)."""
    def deco(cls):
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise ValueError(f"attention variant {name!r} is already registered "
                             f"({REGISTRY[name].__name__})")
        cls.name = name
        if cls.__doc__ and "{complexity}" in cls.__doc__:
            cls.__doc__ = cls.__doc__.replace("{complexity}", vars(cls)["complexity"])
        REGISTRY[name] = cls
        return cls
    return deco


# ---- the reference every exact/masked variant is tested against -------------------------

def causal_pattern(nq: int, nk: int = None, xp=host_xp):
    """(nq, nk) bool: query i may see key j iff j ≤ i + (nk − nq) (bottom-right aligned).

    Built with ``xp`` (default NumPy, on the host: pass the data's array module for a mask
    that meets device arrays)."""
    nk = nq if nk is None else nk
    return xp.tri(nq, nk, nk - nq, dtype=bool)


def repeat_kv_array(x, num_heads: int):
    """Raw arrays: (B, Hkv, N, D) → (B, H, N, D), head h reading key/value head h // (H/Hkv)
    (``repeat_kv`` for the dense ``reference`` formulas)."""
    if x.shape[1] == num_heads:
        return x
    return get_array_module(x).repeat(x, num_heads // x.shape[1], axis=1)


def dense_attention_array(q, k, v, allowed=None, scale=None):
    """Dense attention on raw arrays, the reference every variant is tested against:
    ``ops.attention_maths.attention_forward``, minitx's one dense attention.

    q (B, H, Nq, D), k/v (B, Hkv, Nk, D); ``allowed`` broadcastable to (B, H, Nq, Nk),
    True = may attend (a host mask is moved to the data's device). Rows with no allowed key
    give zeros. Not differentiable.
    """
    return attention_forward(q, k, v, allowed=allowed, scale=scale)[0]


def softmax_rows_array(s, allowed=None):
    """Raw arrays: softmax over the last axis of scores ``s``, keys outside ``allowed``
    (broadcastable to ``s``, True = may attend) get probability 0; rows with no allowed key
    give zeros. The "score" variants' ``reference`` methods use it on their own scores; the
    mask is applied by ``ops.attention_maths.mask_scores``, as in every dense attention."""
    return softmax_array(mask_scores(s.copy(), allowed=allowed), axis=-1)


# ---- the Module base ---------------------------------------------------------------------

def hooked_heads(hook, heads):
    """Run (B, H, N, D) heads through ``hook`` as (B, N, H, D) (TransformerLens's layout of
    hook_q/k/v/z); no reshuffle at all when the hook is idle."""
    if not hook.active:
        return heads
    return transpose(hook(transpose(heads, (0, 2, 1, 3))), (0, 2, 1, 3))


def materialized_attention(q, k, v, *, scale, causal=False, mask=None, dropout_p=0.0,
                           hook_scores=None, hook_pattern=None):
    """Softmax attention (``ops/attention_maths.py``) in its composed form, so hooks can read
    and replace its two N × N stages: the scores S (``ops.sdpa.attention_scores``; −inf where
    not allowed) go through ``hook_scores``, the probabilities P (``softmax``; 0 on rows with
    no allowed key) through ``hook_pattern``, both (B, H, Nq, Nk); then Z = dropout(P) V
    (B, H, Nq, D), a matmul.

    q (B, H, Nq, D), k/v (B, Hkv, Nk, D); ``mask`` None, bool (True = may attend) or float
    (added; −inf = not allowed), broadcastable to (B, H, Nq, Nk); ``causal`` adds the
    bottom-right causal mask. The models take this path instead of the fused
    ``scaled_dot_product_attention`` only when a scores or pattern hook is set (same values to
    rounding). Returns (Z, P).
    """
    scores = attention_scores(q, k, attn_mask=mask, is_causal=causal, scale=scale,
                              enable_gqa=True)                         # (B, H, Nq, Nk)
    if hook_scores is not None:
        scores = hook_scores(scores)
    pattern = softmax(scores, axis=-1)
    if hook_pattern is not None:
        pattern = hook_pattern(pattern)
    v = repeat_kv(v, q.shape[1])                                       # (B, H, Nk, D)
    return matmul(dropout(pattern, dropout_p, training=dropout_p > 0), v), pattern


def hookable_attention(layer, q, k, v, *, scale, causal=False, mask=None, dropout_p=0.0,
                       need_weights=False):
    """Softmax attention for a layer with the hook points ``hook_attn_scores`` and
    ``hook_pattern``: the composed form when either hook is set (``materialized_attention``,
    so the hooks see and may replace the N × N maps), the fused op otherwise (same values to
    rounding). Shapes and masks as ``materialized_attention``'s. Returns (out, weights), the
    weights None unless a hook is set or ``need_weights``."""
    if layer.hook_attn_scores.active or layer.hook_pattern.active:
        return materialized_attention(q, k, v, scale=scale, causal=causal, mask=mask,
                                      dropout_p=dropout_p, hook_scores=layer.hook_attn_scores,
                                      hook_pattern=layer.hook_pattern)
    res = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                       is_causal=causal, scale=scale, enable_gqa=True,
                                       return_weights=need_weights)
    return res if need_weights else (res, None)


#: the largest N for which a kernel variant forms its implied N × N pattern for a hook
IMPLIED_PATTERN_MAX_N = 4096


def kernel_feature_hooks(layer, fq, fk, causal: bool, eps: float, normalize: bool = True):
    """The hooks of a kernel (feature-map) variant — Performer, linear attention:

    ``hook_phi_q`` / ``hook_phi_k`` see φ(Q), φ(K) (B, H, N, m) and may replace them;
    ``hook_pattern`` (read-only: its return value is ignored) sees the N × N pattern the
    variant implies but never forms, A_ij = φ(q_i)·φ(k_j) / (Σ_j' φ(q_i)·φ(k_j') + eps)
    (j, j' ≤ i when causal; unnormalized: A = φ(Q) φ(K)ᵀ), so that out = A V. It is formed
    only when that hook is set,
    and refused beyond N = ``IMPLIED_PATTERN_MAX_N`` (it is O(B·H·N²) memory). Returns the
    (possibly replaced) φ(Q), φ(K)."""
    fq, fk = layer.hook_phi_q(fq), layer.hook_phi_k(fk)
    if layer.hook_pattern.active:
        n = fq.shape[2]
        if max(n, fk.shape[2]) > IMPLIED_PATTERN_MAX_N:
            raise ValueError(f"{layer.name}: hook_pattern forms the implied N × N pattern; N = "
                             f"{max(n, fk.shape[2])} exceeds IMPLIED_PATTERN_MAX_N = "
                             f"{IMPLIED_PATTERN_MAX_N}")
        a = matmul(fq, transpose(fk, (0, 1, 3, 2)))                     # (B, H, N, Nk)
        if causal:
            xp = get_array_module(a.data)
            a = masked_fill(a, ~causal_pattern(n, fk.shape[2], xp), 0.0)
        layer.hook_pattern(a / (a.sum(axis=-1, keepdims=True) + eps) if normalize else a)
    return fq, fk


class AttentionBase(Module):
    """Shared projections and head plumbing for every registered variant.

    Parameters: ``embed_dim`` E, ``num_heads`` H (E divisible by H; D = E/H),
    ``causal``, ``num_kv_heads`` Hkv (default H; H divisible by Hkv), ``bias``.

    A subclass implements ``attend(q, k, v)`` and declares:

    - ``kind`` ("exact" | "masked" | "approximate" | "score") and ``complexity``;
    - ``projections``: the input/output maps it owns, a subset of ("q", "k", "v", "out") →
      ``q_proj`` (E → E), ``k_proj``/``v_proj`` (E → Hkv·D), ``out_proj`` (E → E). A variant
      that ignores q or k (Reformer's shared-QK, a synthesizer without dot products) leaves
      it out, so it carries no parameter that never learns; ``forward`` then hands ``attend``
      the values in that place (they are not read);
    - ``supports_causal = False`` to refuse ``causal=True`` at construction;
    - ``supports_attn_mask`` / ``supports_kv_cache`` when ``attend`` takes ``attn_mask`` and
      ``forward`` may take a ``kv_cache``; ``new_cache()`` makes the cache ``forward`` takes
      (a ``KVCache``, or a variant's own state: anything with ``len()`` = tokens seen);
    - ``model_options``: constructor options a model fills in when it builds the variant,
      from ("layer_index", "context_length"): the block's 0-based depth and the model's
      context length (GPT's ``block_size``). Options given explicitly win.
    """

    kind = "exact"
    name = "base"
    projections = PROJECTIONS
    supports_causal = True
    supports_attn_mask = False
    supports_kv_cache = False
    head_hooks = True       # False for a variant whose forward has no q/k/v (FNet)
    model_options = ()      # e.g. ("layer_index",): filled in by GPT and the blocks

    # Checks first: H divides E (D = E/H), and causal=True only where the variant supports it.
    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False,
                 num_kv_heads: int = None, bias: bool = True):
        super().__init__()
        who = type(self).__name__
        embed_dim = validate.positive_int(embed_dim, "embed_dim", owner=who)
        num_heads = validate.positive_int(num_heads, "num_heads", owner=who)
        if embed_dim % num_heads:
            raise ValueError(f"{who}: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        # Hkv < H shares each key/value head among H/Hkv query heads (MQA when Hkv = 1, else GQA).
        num_kv_heads = num_heads if num_kv_heads is None else \
            validate.positive_int(num_kv_heads, "num_kv_heads", owner=who)
        if num_heads % num_kv_heads:
            raise ValueError(f"{who}: num_heads ({num_heads}) must be divisible by num_kv_heads "
                             f"({num_kv_heads})")
        if validate.boolean(causal, "causal", owner=who) and not self.supports_causal:
            raise ValueError(f"{who} ({self.name}) does not support causal=True")
        # Projections: q and out map E → E, k and v map E → Hkv·D; only those the variant owns are
        # built.
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = bool(causal)
        kv_dim = self.head_dim * num_kv_heads
        sizes = {"q": embed_dim, "k": kv_dim, "v": kv_dim, "out": embed_dim}
        for p in self.projections:
            setattr(self, f"{p}_proj", Linear(embed_dim, sizes[p], bias=bias))
        if self.head_hooks:   # hook points of every q/k/v variant (docs/look_inside.md)
            self.hook_q = HookPoint()        # (B, N, H, D)
            self.hook_k = HookPoint()        # (B, Nk, Hkv, D)
            self.hook_v = HookPoint()        # (B, Nk, Hkv, D)
            self.hook_z = HookPoint()        # (B, N, H, D) what attend returns, before out_proj

    def project(self, x):
        """x (B, N, E) → q (B, H, N, D), k, v (B, Hkv, N, D) through the owned projections
        (a projection the variant does not own is stood in for by the values)."""
        v = split_heads(self.v_proj(x), self.num_kv_heads)               # (B, Hkv, N, D)
        k = split_heads(self.k_proj(x), self.num_kv_heads) if "k" in self.projections else v
        q = split_heads(self.q_proj(x), self.num_heads) if "q" in self.projections else \
            repeat_kv(v, self.num_heads)                                 # (B, H, N, D)
        return q, k, v

    def forward(self, x, attn_mask=None, kv_cache=None):
        """Self-attention: x (B, N, E) → (B, N, E): project, ``attend`` on heads, merge, project.

        ``attn_mask`` (bool True = may attend, or float added; broadcastable to
        (B, H, N, Nk)) and ``kv_cache`` (a ``KVCache``: this step's keys/values are appended
        and the queries attend to all cached ones, bottom-right causal) are taken by the
        variants that declare ``supports_attn_mask`` / ``supports_kv_cache``.
        """
        who = type(self).__name__
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        if attn_mask is not None and not self.supports_attn_mask:
            raise ValueError(f"{who} ({self.name}) does not take an attn_mask")
        if kv_cache is not None and not self.supports_kv_cache:
            raise ValueError(f"{who} ({self.name}) does not take a kv_cache")
        # Project to heads and let hooks see (and replace) q, k, v; a KV cache appends this step's
        # keys and values to the earlier ones before attend.
        q, k, v = self.project(x)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)                                 # (B, Hkv, Nk, D)
        if attn_mask is None:
            y = self.attend(q, k, v)
        else:
            y = self.attend(q, k, v, attn_mask=attn_mask)
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def new_cache(self):
        """An empty cache for incremental decoding through ``forward(x, kv_cache=…)``."""
        return KVCache()

    def attend(self, q, k, v):  # pragma: no cover - abstract
        raise NotImplementedError

    def pattern(self, n: int):
        """(n, n) bool allowed-positions mask, a host NumPy array (a picture and a test
        reference): all True, or lower-triangular when causal."""
        return causal_pattern(n, n, host_xp) if self.causal else host_xp.ones((n, n), dtype=bool)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}, kind={self.kind!r}")
