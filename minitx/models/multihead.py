"""``nn.MultiheadAttention``: PyTorch's module, parameter names, state-dict keys and masks.

Multi-head attention (Vaswani et al. 2017, §3.2.2):

    head_h = softmax(Q_h K_hᵀ/√D + M) V_h,     Q_h = query W_Q,hᵀ + b,  K_h, V_h alike
    MultiHead(Q, K, V) = concat(head_1 … head_H) W_Oᵀ + b_O

with E = embed_dim, H = num_heads, D = E/H. Load a trained ``torch.nn.MultiheadAttention``::

    mha = nn.MultiheadAttention(E, H)
    mha.load_state_dict({k: v.numpy() for k, v in torch_mha.state_dict().items()})

**Mask polarity here is PyTorch's for this module: a bool mask is True where attention is NOT
allowed** (the opposite of ``scaled_dot_product_attention``'s bool masks); float masks are
added to the scores. Rows with every key masked give zeros (PyTorch gives NaN).

The attention itself is ``minitx.functional.scaled_dot_product_attention`` (one fused node):
``is_causal`` and a bool ``key_padding_mask`` reach it as the causal flag and a key mask, so on a
GPU the CUDA flash kernel runs them; any other ``attn_mask`` runs the array code.
"""
from __future__ import annotations

import math
import warnings

from .. import backend, validate
from ..attention import causal_pattern
from ..attention.base import hookable_attention, hooked_heads
from ..autograd.tensor import Tensor
from ..nn import init
from ..nn.layers import Linear
from ..nn.module import Module, Parameter
from ..nn.hooks import HookPoint
from ..ops.sdpa import merge_heads, split_heads
from ..ops.indexing import getitem
from ..ops.linalg import linear
from ..ops.shape import expand_dims, squeeze, transpose

# torch_masks_to_sdpa is public: the transformer layers convert their PyTorch-style masks
# with it too, so every module reads masks by one rule.
__all__ = ["MultiheadAttention", "torch_masks_to_sdpa", "is_causal_mask"]


def _raw(x):
    return x.data if isinstance(x, Tensor) else x


def _param(*shape):
    return Parameter(backend.xp().zeros(shape, dtype="float32"))


def torch_masks_to_sdpa(attn_mask, key_padding_mask, is_causal, n, num_heads, nq, nk,
                        dtype="float32", xp=None, owner="MultiheadAttention"):
    """Turn PyTorch-polarity module masks into ONE mask for ``scaled_dot_product_attention``.

    ``attn_mask`` (L, S) or (N·H, L, S) and ``key_padding_mask`` (N, S): bool True = NOT
    allowed, or float (added — the trap: HuggingFace's 1/0 ``attention_mask`` as floats masks
    nothing; such a mask of only 0s and 1s, and an ``attn_mask`` hiding every query's own
    position, warn when the result reaches attention). ``is_causal`` without
    ``attn_mask`` adds the causal mask. Returns None, a bool mask (True = MAY attend) or a
    float mask (−inf where not allowed), broadcastable to (N, H, L, S). A mask of another dtype
    or shape raises an ``OptionError`` naming ``owner`` (the module the caller called), the
    argument, and the dtype and shape expected and given.
    """
    xp = xp or backend.xp()
    allowed, bias = [], []
    if attn_mask is not None:
        m = xp.asarray(_raw(attn_mask))
        validate.mask(m, "attn_mask", shape=[(nq, nk), (n * num_heads, nq, nk)],
                      dims=["(L, S)", "(N·num_heads, L, S)"], owner=owner,
                      hint="True = NOT allowed (PyTorch's rule), float = added to the scores")
        m = m[None, None] if m.ndim == 2 else m.reshape(n, num_heads, nq, nk)  # (N|1, H|1, L, S)
        # a mask of the other polarity (SDPA's True = may attend) hides every query's own
        # position: the attention op warns about it, one rule for both (ops/sdpa.py,
        # warn_if_polarity_inverted), when the mask below reaches it
        (allowed if m.dtype == bool else bias).append(~m if m.dtype == bool else m)
    elif is_causal:
        allowed.append(causal_pattern(nq, nk, xp))
    if key_padding_mask is not None:
        m = xp.asarray(_raw(key_padding_mask))
        validate.mask(m, "key_padding_mask", shape=(n, nk), dims="(N, S)", owner=owner,
                      hint="True = padding (PyTorch's rule; HuggingFace's attention_mask "
                           "is the opposite: pass attention_mask == 0)")
        # a float mask of 0s and 1s masks nothing: the attention op warns about it, for every
        # caller (ops/sdpa.py, warn_if_float_mask_is_binary), when the mask below reaches it
        # HuggingFace's attention_mask given as is marks every sequence's first token True;
        # PyTorch-polarity padding leaves the first key of the longest sequence visible, however
        # much padding the batch has (short reviews padded to 48 are legitimate)
        if m.dtype == bool and nk > 1 and m.size and bool(m[:, 0].all()):
            warnings.warn("key_padding_mask hides the first key of every sequence: here True "
                          "means padding (PyTorch's rule). HuggingFace's attention_mask is the "
                          "opposite (1 = token): pass attention_mask == 0.",
                          UserWarning, stacklevel=4)
        m = m[:, None, None, :]                                   # (N, 1, 1, S)
        (allowed if m.dtype == bool else bias).append(~m if m.dtype == bool else m)
    ok = None
    for m in allowed:
        ok = m if ok is None else ok & m
    if not bias:
        return ok
    total = sum(b.astype(dtype) for b in bias)
    return total if ok is None else xp.where(ok, total, -xp.inf).astype(dtype)


def is_causal_mask(attn_mask, nq: int, nk: int, xp=None) -> bool:
    """True when ``attn_mask`` (PyTorch's polarity: bool True = NOT allowed, float added) is
    exactly the causal mask of (nq, nk): True (or −inf) strictly above the bottom-right aligned
    diagonal and False (or 0) elsewhere.

    Such a mask is then passed to attention as the causal *flag*, which skips the upper
    triangle instead of computing and masking it: the same result, about half the work.
    PyTorch does this only when told (``is_causal=True`` is a hint it trusts unchecked); here the
    mask is compared, in O(nq·nk), so a wrong hint cannot change a result. Anything else
    (another shape or dtype, a 3-d per-head mask) returns False and is left to the mask checks.
    """
    if attn_mask is None:
        return False
    xp = xp or backend.xp()
    m = _raw(attn_mask)
    if tuple(getattr(m, "shape", ())) != (nq, nk) or m.dtype.kind not in "bf":
        return False
    m, blocked = xp.asarray(m), ~causal_pattern(nq, nk, xp)
    if m.dtype == bool:
        return bool(xp.array_equal(m, blocked))
    return bool(xp.array_equal(m == -xp.inf, blocked) and not xp.any(m[~blocked]))


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention`` (same arguments, parameters and semantics).

    ``MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
    add_zero_attn=False, kdim=None, vdim=None, batch_first=False, num_kv_heads=None,
    device=None, dtype=None)``

    Parameters (PyTorch's names):
    - kdim = vdim = embed_dim: ``in_proj_weight`` (3E, E) = [W_Q; W_K; W_V];
    - otherwise ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight``
      (E, vdim);
    - ``in_proj_bias`` (3E,) when ``bias``; ``out_proj.weight`` (E, E), ``out_proj.bias`` (E,).
    - With ``num_kv_heads`` Hkv ≠ H (MQA when 1, GQA otherwise; a minitx extension) the
      projections are always separate: ``k_proj_weight``/``v_proj_weight`` are (Hkv·D, kdim/vdim)
      and ``in_proj_bias`` is (E + 2·Hkv·D,) = [b_Q; b_K; b_V].

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)``:
    query (L, N, E) (or (N, L, E) with ``batch_first``, or unbatched (L, E)), key (S, N, kdim),
    value (S, N, vdim). ``key_padding_mask`` (N, S): True (or −inf) = padding, ignored.
    ``attn_mask`` (L, S) or (N·H, L, S): True = not allowed, float = added. ``is_causal``
    without ``attn_mask`` applies the causal mask (bottom-right aligned); with one it is only a
    hint, as in PyTorch. An ``attn_mask`` that equals the causal mask (compared, whatever
    ``is_causal`` says) runs as the causal flag: the same result, the upper triangle skipped.
    Returns ``(output like query, weights)``: weights (N, L, S) averaged over heads, or
    (N, H, L, S) with ``average_attn_weights=False``, or None when ``need_weights=False``.
    Keyword ``kv_cache`` (a ``KVCache``) appends this call's keys/values and attends to all
    cached ones (incremental decoding).

    Set ``record_weights = True`` to keep the per-head map of every call in
    ``last_attn_weights`` (N, H, L, S) (a detached Tensor) for visualisation.

    Differences from PyTorch: returned weights are the probabilities *before* dropout
    (PyTorch returns them after, which only differs in training); rows with no allowed key give
    zeros instead of NaN; ``is_causal`` works without ``attn_mask``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int = None,
                 vdim: int = None, batch_first: bool = False, num_kv_heads: int = None,
                 device=None, dtype=None):
        super().__init__()
        # Arguments first: H divides E (D = E/H), Hkv divides H; PyTorch's add_bias_kv and
        # add_zero_attn are refused, not silently ignored.
        who = "MultiheadAttention"
        embed_dim = validate.positive_int(embed_dim, "embed_dim", owner=who)
        num_heads = validate.positive_int(num_heads, "num_heads", owner=who)
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible "
                             f"by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise ValueError("MultiheadAttention: add_bias_kv / add_zero_attn are not "
                             "supported by minitx (pass False)")
        dropout = validate.probability(dropout, "dropout", owner=who)
        num_kv_heads = num_heads if num_kv_heads is None else \
            validate.positive_int(num_kv_heads, "num_kv_heads", owner=who)
        if num_heads % num_kv_heads:
            raise ValueError(f"MultiheadAttention: num_heads ({num_heads}) must be divisible "
                             f"by num_kv_heads ({num_kv_heads})")
        # kv = Hkv·D, the width of the key and value projections (E unless GQA/MQA shares heads).
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        kv = num_kv_heads * self.head_dim
        self._qkv_same_embed_dim = (self.kdim == embed_dim and self.vdim == embed_dim
                                    and num_kv_heads == num_heads)
        # PyTorch's layout: one packed in_proj_weight [W_Q; W_K; W_V] (3E, E) when q, k and v all
        # have width E, else three matrices; the state-dict keys follow from these names.
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _param(3 * embed_dim, embed_dim)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = _param(embed_dim, embed_dim)
            self.k_proj_weight = _param(kv, self.kdim)
            self.v_proj_weight = _param(kv, self.vdim)
            self.register_parameter("in_proj_weight", None)
        # One packed bias [b_Q; b_K; b_V] (E + 2·kv,) either way; out_proj holds W_O and b_O.
        if bias:
            self.in_proj_bias = _param(embed_dim + 2 * kv)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.record_weights = False
        self.last_attn_weights = None
        # hook points (TransformerLens's names; see docs/look_inside.md)
        self.hook_q = HookPoint()             # (N, L, H, D)
        self.hook_k = HookPoint()             # (N, S, Hkv, D)
        self.hook_v = HookPoint()             # (N, S, Hkv, D)
        self.hook_attn_scores = HookPoint()   # (N, H, L, S) Q Kᵀ·scale + mask, −inf where masked
        self.hook_pattern = HookPoint()       # (N, H, L, S) softmax of the scores
        self.hook_z = HookPoint()             # (N, L, H, D) per-head outputs, before out_proj
        self._reset_parameters()
        self._factory(device, dtype)

    def _reset_parameters(self) -> None:
        """PyTorch's initialisation: Xavier-uniform projections, zero biases."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    # ---- projections ---------------------------------------------------------------------
    def _weights(self):
        """(W_Q, W_K, W_V) and (b_Q, b_K, b_V) (Nones without bias), slicing packed ones."""
        e, kv = self.embed_dim, self.num_kv_heads * self.head_dim
        cuts = ((0, e), (e, e + kv), (e + kv, e + 2 * kv))
        if self._qkv_same_embed_dim:
            ws = tuple(getitem(self.in_proj_weight, slice(a, b)) for a, b in cuts)
        else:
            ws = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        if self.in_proj_bias is None:
            return ws, (None, None, None)
        return ws, tuple(getitem(self.in_proj_bias, slice(a, b)) for a, b in cuts)

    # Shapes, checked before any projection: one rank for all three (3-d batched or 2-d),
    # then the widths, then key and value lengths and the batch sizes.
    def _check_inputs(self, query, key, value):
        nd = len(query.shape)
        if nd not in (2, 3) or len(key.shape) != nd or len(value.shape) != nd:
            raise ValueError(f"MultiheadAttention: query, key and value must all be 3-d "
                             f"(batched) or 2-d (unbatched), got query {tuple(query.shape)}, "
                             f"key {tuple(key.shape)}, value {tuple(value.shape)}")
        # Each input's width is its projection's: E for the query, kdim and vdim for the others.
        for name, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim),
                             ("value", value, self.vdim)):
            if t.shape[-1] != dim:
                raise ValueError(f"MultiheadAttention: {name} must have last dim {dim}, got "
                                 f"shape {tuple(t.shape)}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"MultiheadAttention: key and value must agree in every dim but "
                             f"the last, got key {tuple(key.shape)}, value {tuple(value.shape)}")
        b_axis = 0 if self.batch_first else 1
        if nd == 3 and query.shape[b_axis] != key.shape[b_axis]:
            raise ValueError(f"MultiheadAttention: query and key batch sizes differ "
                             f"({query.shape[b_axis]} vs {key.shape[b_axis]}; batch_first="
                             f"{self.batch_first})")

    # ---- forward -------------------------------------------------------------------------
    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False,
                *, kv_cache=None):
        self._check_inputs(query, key, value)
        # Work batch-first (N, L, E): give unbatched inputs a batch axis, or swap PyTorch's default
        # (L, N, E) layout.
        unbatched = len(query.shape) == 2
        if unbatched:                                   # (L, E) -> (1, L, E)
            query, key, value = (expand_dims(t, 0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _raw(key_padding_mask)[None]
        elif not self.batch_first:                      # (L, N, E) -> (N, L, E)
            query, key, value = (transpose(t, (1, 0, 2)) for t in (query, key, value))
        # Project and split heads: q (N, H, L, D), k and v (N, Hkv, S, D); a KV cache appends
        # this call's keys and values to the earlier ones.
        n, nq = query.shape[0], query.shape[1]
        (wq, wk, wv), (bq, bk, bv) = self._weights()
        q = hooked_heads(self.hook_q, split_heads(linear(query, wq, bq), self.num_heads))
        k = hooked_heads(self.hook_k, split_heads(linear(key, wk, bk), self.num_kv_heads))
        v = hooked_heads(self.hook_v, split_heads(linear(value, wv, bv), self.num_kv_heads))
        if kv_cache is not None:                                          # q (N, H, L, D)
            k, v = kv_cache.append(k, v)                                  # (N, Hkv, S_all, D)
        xp = backend.get_array_module(q.data)
        # is_causal without attn_mask goes to SDPA as a flag (the kernel takes it), not a mask;
        # so does an attn_mask that is exactly the causal mask (compared, not trusted)
        if is_causal_mask(attn_mask, nq, k.shape[2], xp):
            attn_mask, is_causal = None, True
        causal = bool(is_causal) and attn_mask is None
        mask = torch_masks_to_sdpa(attn_mask, key_padding_mask, False, n, self.num_heads,
                                   nq, k.shape[2], q.dtype, xp, owner=type(self).__name__)
        # Weights are formed only when asked for (need_weights or recording); otherwise the fused
        # attention never materialises the (L, S) map.
        want = bool(need_weights) or self.record_weights
        dropout_p = self.dropout if self.training else 0.0
        out, w = hookable_attention(self, q, k, v, scale=1.0 / math.sqrt(self.head_dim),
                                    causal=causal, mask=mask, dropout_p=dropout_p,
                                    need_weights=want)
        if self.record_weights:
            self.last_attn_weights = w.detach()
        # concat(head_1 … head_H) W_Oᵀ + b_O, then back to the caller's layout.
        out = hooked_heads(self.hook_z, out)                             # (N, H, L, D)
        out = self.out_proj(merge_heads(out))                             # (N, L, E)
        if unbatched:
            out = squeeze(out, 0)
        elif not self.batch_first:
            out = transpose(out, (1, 0, 2))
        # Weights averaged over heads by default, (N, L, S), as PyTorch's.
        if not need_weights:
            return out, None
        if average_attn_weights:
            w = w.mean(axis=1)                                            # (N, L, S)
        if unbatched:
            w = squeeze(w, 0)
        return out, w

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, kdim={self.kdim}, vdim={self.vdim}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
