r"""The registered exact variants: multi-head attention and its key/value-sharing relatives.

Each is ``scaled_dot_product_attention`` (``ops/sdpa.py``) on heads, with its own
projections: ``mha`` (Vaswani et al. 2017), ``mqa`` (one key/value head, Shazeer 2019), ``gqa``
(grouped key/value heads, Ainslie et al. 2023), and two other score functions, ``dot``
(Luong's unscaled score) and ``additive`` (Bahdanau's MLP score, per head).
``ExactSelfAttention`` is also the base of the position variants (``positions.py``): they
change its hooks ``transform_qk`` (rotate q/k), ``score_bias`` (an additive bias) and
``value_term`` (a term added to the output).

Every one is softmax attention per head h, with Q, K, V = x W_qᵀ, x W_kᵀ, x W_vᵀ split into
heads, M the mask (0; −inf above the diagonal when causal, bottom-right aligned; plus any
``attn_mask``), and the heads merged by the output projection:

$$
\mathrm{head}_h = \operatorname{softmax}\!\left( \frac{Q_h K_{g(h)}^\top}{\sqrt{D}} + M
\right) V_{g(h)}, \qquad y = \left[ \mathrm{head}_1, \dots, \mathrm{head}_H \right] W_o^\top
$$

Query head h reads key/value head $g(h) = \lfloor h / (H / H_{kv}) \rfloor$: ``mha`` has
Hkv = H, so g(h) = h; ``mqa`` has Hkv = 1, one K and V shared by every head; ``gqa`` any Hkv
dividing H. ``dot`` and ``additive`` replace the scaled score $Q_h K^\top / \sqrt{D}$ by
one without 1/√D (softmax at temperature 1):

$$
\begin{array}{rcl}
s_{ij} & = & q_i \cdot k_j \qquad \text{(dot)} \\
s_{ij} & = & (q_i W_h) \cdot k_j \qquad \text{(general)} \\
s_{ij} & = & w^\top \tanh(W_q q_i + W_k k_j) \qquad \text{(additive)}
\end{array}
$$

with one W_h (D, D) per head, and W_q, W_k (A, D) and w (A,) shared by the heads.
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Parameter
# The ops a variant composes when it needs more than the fused attention (masks, dropout,
# the additive score's matmul).
from ..ops.sdpa import merge_masks
from ..ops.dropout import dropout
from ..ops.indexing import masked_fill
from ..ops.linalg import matmul
from ..ops.shape import reshape
from .base import (AttentionBase, causal_pattern, check_heads, hookable_attention,
                   register, repeat_kv, repeat_kv_array, softmax_rows_array)
from .classic import _masked_softmax, additive_scores

__all__ = ["ExactSelfAttention", "MultiQueryAttention", "GroupedQueryAttention",
           "DotProductSelfAttention", "AdditiveSelfAttention", "default_kv_heads"]


def _is_bool(mask):
    data = mask.data if isinstance(mask, Tensor) else mask
    return data.dtype == bool


# ---- registered variants -----------------------------------------------------------------

def default_kv_heads(num_heads: int) -> int:
    """The largest divisor of H that is at most H/2 (1 when H is 1 or prime)."""
    for g in range(num_heads // 2, 0, -1):
        if num_heads % g == 0:
            return g
    return 1


@register("mha")
class ExactSelfAttention(AttentionBase):
    r"""Multi-head self-attention, exact: scaled dot-product softmax attention on every head.

    Formula: the module docstring's, with Hkv = ``num_kv_heads`` (None → H).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D), D = E/H. Projections ``q_proj``/``out_proj`` E → E,
    ``k_proj``/``v_proj`` E → Hkv·D; probabilities P (B, H, N, Nk).

    Options: ``causal`` (False), ``num_kv_heads`` Hkv (None → H), ``bias`` (True),
    ``dropout`` (0.0; on the probabilities, training mode only).

    Complexity: {complexity}; the fused SDPA keeps P for backward (with the fast layer on, a
    causal layer's blocks skip the future keys: about half of both).

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser & Polosukhin (2017),
    "Attention Is All You Need".

    Beyond the registry contract it takes ``forward(x, attn_mask=None, kv_cache=None)``
    (``AttentionBase.forward``): ``attn_mask`` bool (True = may attend) or float (added),
    broadcastable to (B, H, N, Nk); ``kv_cache`` (a ``KVCache``) receives this step's
    keys/values and the queries attend to everything cached (bottom-right causal). Set
    ``record_weights = True`` to keep the last map in ``last_attn_weights`` (B, H, Nq, Nk), a
    detached Tensor.
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "exact"
    supports_kv_cache = True
    supports_attn_mask = True
    needs_weights = False          # True when value_term uses the attention weights

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, bias=True,
                 dropout: float = 0.0):
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         bias=bias)
        self.dropout = validate.probability(dropout, "dropout", owner=type(self).__name__)
        self.record_weights = False
        self.last_attn_weights = None
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_attn_scores = HookPoint()   # (B, H, N, Nk) Q Kᵀ·scale + bias, −inf masked
        self.hook_pattern = HookPoint()       # (B, H, N, Nk) softmax of the scores

    # hooks for position schemes ------------------------------------------------------------
    def transform_qk(self, q, k):
        return q, k

    def score_bias(self, q, k):
        return None

    def value_term(self, weights, nq, nk):
        return None

    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        check_heads(q, k, v, f"{self.name}.attend")
        nq, nk = q.shape[2], k.shape[2]
        # The position hooks: rotate q and k (RoPE), add a score bias (ALiBi, relative positions);
        # a float attn_mask and a float bias simply add up.
        q, k = self.transform_qk(q, k)
        bias = self.score_bias(q, k)
        if attn_mask is not None and bias is not None and not _is_bool(attn_mask):
            mask = attn_mask + bias                               # two float biases add up
        else:
            mask = merge_masks(attn_mask, bias)
        # Weights are formed only when recorded or when a value term needs them; otherwise the
        # fused attention never materialises them.
        need = self.record_weights or self.needs_weights
        dropout_p = self.dropout if self.training else 0.0
        out, w = hookable_attention(self, q, k, v, scale=self.scale, causal=self.causal,
                                    mask=mask, dropout_p=dropout_p, need_weights=need)
        if self.record_weights:
            self.last_attn_weights = w.detach()
        extra = self.value_term(w, nq, nk)
        return out if extra is None else out + extra


@register("mqa")
class MultiQueryAttention(ExactSelfAttention):
    r"""Multi-query attention: all H query heads share ONE key/value head (exact softmax).

    Formula: the module docstring's with Hkv = 1: one key and value head read by every query
    head.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, 1, N, D) (any Hkv dividing H is accepted) → (B, H, N, D). ``k_proj``/``v_proj``
    map E → D, so the KV cache shrinks H-fold.

    Options: ``num_kv_heads`` (must be 1; anything else raises ValueError — use "gqa"),
    ``causal`` (False), ``bias`` (True), ``dropout`` (0.0); the rest as ``mha``.

    Complexity: {complexity}; P, and the one key/value head.

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Shazeer (2019), "Fast Transformer Decoding: One Write-Head is All You Need".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N² + B·N·D)"

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=1, **options):
        if num_kv_heads != 1:
            raise ValueError(f"mqa uses num_kv_heads=1, got {num_kv_heads!r} (use 'gqa')")
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=1, **options)


@register("gqa")
class GroupedQueryAttention(ExactSelfAttention):
    r"""Grouped-query attention: Hkv key/value heads, each shared by a group of H/Hkv query heads.

    Formula: the module docstring's with Hkv key/value heads, each read by a group of H/Hkv
    query heads (Hkv = H is MHA, Hkv = 1 is MQA): exact softmax attention.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D). ``k_proj``/``v_proj`` map E → Hkv·D.

    Options: ``num_kv_heads`` Hkv (None → ``default_kv_heads(H)``: the largest divisor of H
    that is ≤ H/2, i.e. H/2 for even H, 1 for H = 1 or prime H), ``causal`` (False),
    ``bias`` (True), ``dropout`` (0.0).

    Complexity: {complexity}; P, and the shared keys/values.

    Exactness: exact (equals softmax attention under pattern(n)).

    Reference: Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebrón & Sanghai (2023), "GQA:
    Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N² + B·Hkv·N·D)"

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, **options):
        if num_kv_heads is None and isinstance(num_heads, int) and num_heads > 0:
            num_kv_heads = default_kv_heads(num_heads)
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         **options)


@register("dot")
class DotProductSelfAttention(ExactSelfAttention):
    r"""Luong's "dot" score per head, *unscaled* (optionally his "general" score with a learned W).

    Formula: the module docstring's with the "dot" or "general" score (no 1/√D: softmax
    attention at temperature 1 instead of √D).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); ``score_weight`` W (H, D, D) when general.

    Options: ``general`` (False; W initialised to the identity), ``causal`` (False),
    ``num_kv_heads`` (None → H), ``bias`` (True), ``dropout`` (0.0).

    Complexity: {complexity}.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Luong, Pham & Manning (2015), "Effective Approaches to Attention-based Neural
    Machine Translation".
    """

    complexity = "time O(B·H·N²·D) (+ O(B·H·N·D²) for general), memory O(B·H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, general: bool = False, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.scale = 1.0
        self.general = bool(general)
        if self.general:
            eye = active_xp().eye(self.head_dim, dtype="float32")
            self.score_weight = Parameter(active_xp().broadcast_to(
                eye, (num_heads, self.head_dim, self.head_dim)).copy())

    def transform_qk(self, q, k):
        if self.general:                                         # q W: (B, H, Nq, D) @ (H, D, D)
            q = matmul(q, self.score_weight)
        return q, k

    def reference(self, q, k, v):
        """Raw arrays: the "dot" or "general" formula, densely, (B, H, Nq, D)."""
        xp = get_array_module(q)
        k, v = repeat_kv_array(k, q.shape[1]), repeat_kv_array(v, q.shape[1])
        if self.general:
            q = xp.einsum("bhid,hde->bhie", q, self.score_weight.data.astype(q.dtype))
        s = xp.einsum("bhid,bhjd->bhij", q, k)                  # no 1/√D
        nq, nk = s.shape[-2:]
        return softmax_rows_array(s, causal_pattern(nq, nk, xp) if self.causal else None) @ v


@register("additive")
class AdditiveSelfAttention(ExactSelfAttention):
    r"""Bahdanau's additive (MLP) score inside multi-head self-attention.

    Formula: the module docstring's with the "additive" score (no 1/√D), then softmax over
    keys and the weighted values, as ``mha``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, attn_mask=None)``:
    q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D); the pairwise tanh features
    (B, H, N, Nk, A).

    Options: ``hidden_dim`` A (None → D), ``causal`` (False), ``num_kv_heads`` (None → H),
    ``bias`` (True), ``dropout`` (0.0).

    Complexity: {complexity}; the tanh of every (query, key) pair is formed and kept for
    backward.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning
    to Align and Translate".
    """

    complexity = "time O(B·H·N²·(A + D)), memory O(B·H·N²·A)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, hidden_dim: int = None, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        a = self.head_dim if hidden_dim is None else \
            validate.positive_int(hidden_dim, "hidden_dim", owner="additive")
        self.W_q = Linear(self.head_dim, a, bias=False)
        self.W_k = Linear(self.head_dim, a, bias=False)
        self.w = Linear(a, 1, bias=False)

    def attend(self, q, k, v, attn_mask=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, _, nq, nk, _ = check_heads(q, k, v, f"{self.name}.attend")
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        scores = additive_scores(q, k, self.W_q.weight, self.W_k.weight,
                                 reshape(self.w.weight, (-1,)))     # (B, H, Nq, Nk)
        # Masks: causal and bool masks combine into `allowed`, a float mask adds to the scores;
        # the score hook sees −inf where masked.
        xp = get_array_module(q.data)
        allowed = causal_pattern(nq, nk, xp) if self.causal else None
        if attn_mask is not None:
            if _is_bool(attn_mask):
                m = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
                allowed = m if allowed is None else allowed & m
            else:
                scores = scores + attn_mask
        if self.hook_attn_scores.active:                          # seen with −inf masked
            if allowed is not None:
                scores = masked_fill(scores, ~xp.broadcast_to(allowed, scores.shape), -math.inf)
            scores = self.hook_attn_scores(scores)
        # Softmax over the allowed keys (a row with none gives zeros), dropout in training, P V.
        w = self.hook_pattern(_masked_softmax(scores, allowed))  # (B, H, Nq, Nk)
        if self.training and self.dropout > 0:
            w = dropout(w, self.dropout)
        if self.record_weights:
            self.last_attn_weights = w.detach()
        return matmul(w, v)                                      # (B, H, Nq, Nk) @ (B, H, Nk, D)

    def reference(self, q, k, v):
        """Raw arrays: the "additive" formula, its (i, j) pairs formed by broadcasting,
        (B, H, Nq, D)."""
        xp = get_array_module(q)
        k, v = repeat_kv_array(k, q.shape[1]), repeat_kv_array(v, q.shape[1])
        w_q, w_k = self.W_q.weight.data.astype(q.dtype), self.W_k.weight.data.astype(q.dtype)
        w = self.w.weight.data.astype(q.dtype)[0]                 # (A,)
        hid = xp.tanh((q @ w_q.T)[:, :, :, None, :] + (k @ w_k.T)[:, :, None, :, :])
        e = (hid * w).sum(axis=-1)                                # (B, H, Nq, Nk)
        nq, nk = e.shape[-2:]
        return softmax_rows_array(e, causal_pattern(nq, nk, xp) if self.causal else None) @ v
