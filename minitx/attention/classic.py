r"""The forms of attention readers meet first, before the fused op and the variants.

- ``simple_attention``: the whole idea in five differentiable lines — start here;
- ``dot_product_attention``: Luong, Pham & Manning (2015), "dot" and "general" scores;
- ``AdditiveAttention``: Bahdanau, Cho & Bengio (2015), the MLP score;
- ``SelfAttention`` / ``CausalSelfAttention``: single-head self-attention, the smallest
  complete layer (projections + the fused ``scaled_dot_product_attention``).

Everything here is built from differentiable ops (no hand-written backward): read it next to
``ops/attention_maths.py``, which computes the same attention as one fused node.

The two older scores have no 1/√d_k; each is followed by the same softmax over keys and
weighted mean of the values, $c_i = \sum_j \alpha_{ij} v_j$ with
$\alpha_i = \operatorname{softmax}(e_i)$:

$$
\begin{array}{rcl}
e_{ij} & = & q_i^\top k_j \qquad \text{(Luong, dot)} \\
e_{ij} & = & q_i^\top W k_j \qquad \text{(Luong, general)} \\
e_{ij} & = & w^\top \tanh(W_q q_i + W_k k_j) \qquad \text{(Bahdanau, additive)}
\end{array}
$$
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.tensor import Tensor
from ..nn.layers import Linear
from ..nn.module import Module
from ..ops.activation import softmax
from ..ops.sdpa import scaled_dot_product_attention
from ..ops.elementwise import tanh
from ..ops.indexing import masked_fill
from ..ops.linalg import matmul
from ..ops.shape import expand_dims, reshape, swapaxes

__all__ = ["simple_attention", "dot_product_attention", "additive_scores", "AdditiveAttention",
           "SelfAttention", "CausalSelfAttention"]


def simple_attention(q, k, v, mask=None):
    r"""Attention in five lines — the formula, before any engineering.

    Each query scores every key (a dot product, divided by √d_k so the scores keep unit
    variance whatever d_k is), softmax turns a row of scores into weights that sum to 1, and
    the output is the weighted mean of the values (Vaswani et al. 2017):

    $$
    \operatorname{Attention}(Q, K, V) =
    \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{d_k}} + M \right) V
    $$

    M is 0 where a query may look and −∞ where it may not (``mask``).

    q (…, Nq, d_k), k (…, Nk, d_k), v (…, Nk, d_v) Tensors; ``mask`` broadcastable to
    (…, Nq, Nk), True = may attend. Differentiable through its ops. Time and memory
    O(Nq·Nk).
    """
    scores = matmul(q, swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))   # (…, Nq, Nk)
    if mask is not None:
        scores = masked_fill(scores, ~(mask.data if isinstance(mask, Tensor) else mask),
                             -math.inf)                                         # never look here
    weights = softmax(scores, axis=-1)                                           # rows sum to 1
    return matmul(weights, v)                                                    # (…, Nq, dv)


def _masked_softmax(scores, mask):
    """softmax over keys; ``mask`` True = may attend (fully masked rows give zeros)."""
    if mask is not None:
        m = mask.data if isinstance(mask, Tensor) else mask
        scores = masked_fill(scores, ~m, -math.inf)
    return softmax(scores, axis=-1)


def dot_product_attention(query, key, value, weight=None, mask=None):
    """Luong et al. (2015), "Effective Approaches to Attention-based NMT": the unscaled "dot"
    score of the module docstring, or "general" with ``weight`` W of shape (Dq, Dk).

    query (…, Nq, Dq), key (…, Nk, Dk), value (…, Nk, Dv); ``mask`` broadcastable to
    (…, Nq, Nk), True = may attend. Returns ``(context (…, Nq, Dv), weights (…, Nq, Nk))``.
    Time O(Nq·Nk·D).
    """
    if weight is None:
        if query.shape[-1] != key.shape[-1]:
            raise ValueError(f"dot_product_attention: 'dot' scores need equal query/key dims, "
                             f"got query {tuple(query.shape)} and key {tuple(key.shape)} "
                             "(pass weight for 'general')")
        qw = query
    else:
        if tuple(weight.shape) != (query.shape[-1], key.shape[-1]):
            raise ValueError(f"dot_product_attention: weight must be (Dq, Dk) = "
                             f"{(query.shape[-1], key.shape[-1])}, got {tuple(weight.shape)}")
        qw = matmul(query, weight)                              # (…, Nq, Dq) @ (Dq, Dk)
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"dot_product_attention: key and value must have the same length, "
                         f"got key {tuple(key.shape)} and value {tuple(value.shape)}")
    # the scores, unscaled (Luong's), then the same softmax and weighted mean as above
    scores = matmul(qw, swapaxes(key, -1, -2))                  # (…, Nq, Dk) @ (…, Dk, Nk)
    weights = _masked_softmax(scores, mask)                     # (…, Nq, Nk)
    return matmul(weights, value), weights                      # (…, Nq, Nk) @ (…, Nk, Dv)


def additive_scores(q, k, w_q, w_k, w):
    """The additive score e_ij of the module docstring, for every (i, j).

    q (…, Nq, Dq), k (…, Nk, Dk), W_q (A, Dq), W_k (A, Dk), w (A,) → (…, Nq, Nk).
    Memory O(Nq·Nk·A): the tanh of every pair is formed.
    """
    qa = expand_dims(matmul(q, swapaxes(w_q, 0, 1)), -2)         # (…, Nq, 1, A)
    ka = expand_dims(matmul(k, swapaxes(w_k, 0, 1)), -3)         # (…, 1, Nk, A)
    return matmul(tanh(qa + ka), w)                             # (…, Nq, Nk, A) @ (A,)


class AdditiveAttention(Module):
    """Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning to
    Align and Translate": additive (MLP) attention, the additive score of the module docstring
    with ``v`` as w.

    Parameters ``W_q.weight`` (A, Dq), ``W_k.weight`` (A, Dk), ``v.weight`` (1, A).
    ``forward(query (B, Nq, Dq), key (B, Nk, Dk), value (B, Nk, Dv), mask=None)`` with
    ``mask`` broadcastable to (B, Nq, Nk), True = may attend; returns
    ``(context (B, Nq, Dv), weights (B, Nq, Nk))``. Time and memory O(Nq·Nk·A).
    """

    def __init__(self, query_dim: int, key_dim: int = None, hidden_dim: int = None):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        for name, val in (("query_dim", query_dim), ("key_dim", key_dim),
                          ("hidden_dim", hidden_dim)):
            validate.positive_int(val, name, owner="AdditiveAttention")
        # W_q, W_k project into the hidden space A; v reads one score out of tanh(…)
        self.W_q = Linear(query_dim, hidden_dim, bias=False)
        self.W_k = Linear(key_dim, hidden_dim, bias=False)
        self.v = Linear(hidden_dim, 1, bias=False)

    def forward(self, query, key, value, mask=None):
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(f"AdditiveAttention: key and value must have the same length, "
                             f"got key {tuple(key.shape)} and value {tuple(value.shape)}")
        # the MLP scores, then softmax over keys and the weighted mean of the values
        scores = additive_scores(query, key, self.W_q.weight, self.W_k.weight,
                                 reshape(self.v.weight, (-1,)))     # (B, Nq, Nk)
        weights = _masked_softmax(scores, mask)
        return matmul(weights, value), weights


class SelfAttention(Module):
    """Single-head self-attention: the smallest complete example. Q, K and V are three linear
    maps of the same x (E → E, parameters ``query``, ``key``, ``value``), then attention as in
    ``simple_attention``, with d_k = E, run by the fused ``scaled_dot_product_attention``.

    x (B, N, E) → (B, N, E); ``mask`` broadcastable to (B, N, N), True = may attend.
    ``causal=True`` adds the causal mask (position i sees j ≤ i). Set ``record_weights = True``
    (or a model's ``record_attention(True)``) to keep each call's attention map in
    ``last_attn_weights`` (B, N, N), a detached Tensor, for visualisation: the weights are then
    formed by the composed form, which the fused op does not need. Time O(N²·E), memory O(N²).
    """

    def __init__(self, embed_dim: int, causal: bool = False, bias: bool = True):
        super().__init__()
        self.embed_dim = validate.positive_int(embed_dim, "embed_dim", owner=type(self).__name__)
        self.causal = validate.boolean(causal, "causal", owner=type(self).__name__)
        self.query = Linear(embed_dim, embed_dim, bias=bias)
        self.key = Linear(embed_dim, embed_dim, bias=bias)
        self.value = Linear(embed_dim, embed_dim, bias=bias)
        self.record_weights = False
        self.last_attn_weights = None

    def forward(self, x, mask=None):
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__}: x must be (B, N, {self.embed_dim}), got "
                             f"shape {tuple(x.shape)}")
        q, k, v = self.query(x), self.key(x), self.value(x)          # (B, N, E) each
        if not self.record_weights:
            return scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        y, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                            return_weights=True)     # (B, N, E), (B, N, N)
        self.last_attn_weights = w.detach()
        return y


class CausalSelfAttention(SelfAttention):
    """``SelfAttention`` with the causal mask: position i attends to positions j ≤ i only."""

    def __init__(self, embed_dim: int, bias: bool = True):
        super().__init__(embed_dim, causal=True, bias=bias)
