r"""The block indexer: Qwen4-Exp's sparse attention, where each query picks the key blocks it
reads by scoring their mean-pooled keys, and always reads its own incomplete block.

Qwen (2026), Qwen4-Exp's indexed attention ("QSA"); HuggingFace's ``Qwen4ExpTextQSAIndexer``.
The keys are cut into blocks of c consecutive positions,
$\mathcal{B}_i = \{ic, \dots, ic + c - 1\}$. A small indexer — h_I query heads $q^I_{t,j}$
and one key head $k^I_s$, both of width $d_I$ — pools each block's keys to their mean,
normalised, and scores it for query t by its ReLU'd dot products summed over the indexer
heads. Query t attends, by softmax, to the
keys of its k best complete blocks and to its *tail*, the keys after the last complete block:

$$
\bar k_i = \mathrm{RMSNorm}\Big( \frac{1}{c} \sum_{s \in \mathcal{B}_i} k^I_s \Big),
\qquad
I_{t,i} = \frac{1}{\sqrt{d_I}} \sum_{j=1}^{h_I} \mathrm{ReLU}\big( q^I_{t,j} \cdot \bar k_i
\big)
\qquad (i < m_t = \lfloor (t + 1) / c \rfloor)
$$

$$
S_t = \bigcup_{i \,\in\, \operatorname{top-}k_{\,i < m_t} I_{t,i}} \mathcal{B}_i
\;\cup\; \{ m_t c, \dots, t \},
\qquad
o_t = \sum_{s \in S_t} \operatorname{softmax}_{s \in S_t}\!\left( \frac{q_t \cdot k_s}{\sqrt{D}}
\right) v_s
$$

A block is *complete* for t when all its c keys are at or before t. Only complete blocks
compete; the tail $\{m_t c, \dots, t\}$ (between 0 and c − 1 keys) is always read. The query's
own block is read whole through the tail while it is incomplete; once complete (t + 1 a
multiple of c) it competes like the others, so a query may then skip its own key. With
k ≥ m_t every key up to t is read: causal softmax attention. The choice is shared by every
head, and Qwen4-Exp calls its token budget k·c (``indexer_budget``, with
``indexer_compress_ratio`` c). Without ``causal`` (minitx's extension for an encoder: HF's
rule under an all-true mask) every complete block of the sequence competes and the tail is
the last, incomplete block.

A top-k is piecewise constant, so the output's gradient reaches q, k and v through the
softmax over $S_t$ only; the indexer learns from a loss of its own (DeepSeek-V3.2's device,
``selection.py``'s DSA): the KL divergence from the attention's mass on each chosen block
(summed over heads, renormalised over the chosen blocks) to the indexer's softmax over them,
attached to the output in training mode (``AttachLoss``).

**Cost.** The indexer scores ⌊N/c⌋ pooled keys per query: time O(B·N²·h_I·d_I / c), memory
O(B·h_I·N²/c). The attention reads k·c + c − 1 keys per query, each chosen block's keys once
for all the queries that chose it (``selection.block_attention``): time O(B·H·N·k·c·D),
memory O(B·H·N·(k + 1)·(c + D)). No N × N map is formed unless a pattern hook asks for it.

**Decoding.** A plain ``KVCache`` of keys and values (Hkv·D numbers each per token); the
index keys and their block means are recomputed from the cached keys at each step (a query's
choice reads only keys up to its own position, so any split of the sequence gives the same
output as one call).
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Parameter
from ..ops.activation import log_softmax
from ..ops.indexing import getitem, masked_fill, take_along_axis
from ..ops.norm import rms_norm
from ..ops.shape import reshape, transpose
from .base import (AttentionBase, causal_pattern, check_heads, dense_attention_array,
                   materialized_attention, merge_heads, register, repeat_kv, repeat_kv_array)
# the selection family's shared steps (selection.py): block means, top-k, the attentions
from .selection import (AttachLoss, _read_only, block_attention, block_means,
                        gathered_attention, index_mask, lightning_scores, top_k_indices,
                        top_k_mask)

__all__ = ["pooled_block_keys", "block_index_scores", "complete_blocks", "indexed_blocks",
           "indexed_mask", "BlockIndexerAttention"]


# ---- the indexer's steps, each a function of its inputs ----------------------------------

def pooled_block_keys(keys, block: int):
    """The mean of each complete block of ``block`` index keys: (B, Nk, d_I) Tensor →
    (B, ⌊Nk/c⌋, d_I) (a last, incomplete block is left out: it is the tail)."""
    b, nk, d = keys.shape
    nb = nk // block
    head = getitem(keys, (slice(None), slice(0, nb * block)))
    if nb == 0:                                   # no complete block: (B, 0, d_I)
        return head
    return reshape(block_means(reshape(head, (b, 1, nb * block, d)), block), (b, nb, d))


def block_index_scores(qi, kbar, scale: float):
    """I_{t,i} = scale · Σ_j ReLU(q^I_{t,j} · k̄_i) (module docstring): qi (B, h_I, Nq, d_I),
    kbar (B, nb, d_I) Tensors → (B, Nq, nb). The lightning indexer's sum (``selection``) with
    every head weighted by the scale."""
    b, hi, nq, _ = qi.shape
    xp = get_array_module(qi.data)
    w = Tensor._wrap(xp.full((b, nq, hi), scale, dtype=qi.dtype))
    return lightning_scores(qi, kbar, w)


def complete_blocks(nq: int, nk: int, block: int, causal: bool, xp=host_xp):
    """(Nq, ⌊Nk/c⌋) bool: the blocks query t may choose, those complete at its position
    (queries at the last Nq of Nk positions; every complete block when not causal)."""
    nb = nk // block
    if not causal:
        return xp.ones((nq, nb), dtype=bool)
    pos = xp.arange(nk - nq, nk)
    return (xp.arange(nb)[None, :] + 1) * block <= pos[:, None] + 1


def indexed_blocks(chosen, ok, nq: int, nk: int, block: int, causal: bool):
    """The blocks each query reads and which of their keys: the chosen (…, Nq, k) block
    numbers with their validity, and the tail as one more slot → (blocks (…, Nq, k + 1),
    allowed (…, Nq, k + 1, c)), raw arrays. The tail slot is block m_t with keys m_t·c … t
    (the last, incomplete block of the Nk keys when not causal); empty when t + 1 is a
    multiple of c."""
    xp = get_array_module(chosen)
    pos = xp.arange(nk - nq, nk)
    end = pos + 1 if causal else xp.full(nq, nk)            # the keys a query may see: < end
    # an empty tail (end a multiple of c) points at a block that exists, reading none of it
    last = -(-nk // block) - 1
    tail = xp.broadcast_to(xp.minimum(end // block, last)[:, None], chosen.shape[:-1] + (1,))
    has_tail = xp.broadcast_to((end % block != 0)[:, None], tail.shape)
    blocks = xp.concatenate([chosen, tail], axis=-1)
    valid = xp.concatenate([ok, has_tail], axis=-1)
    keys = blocks[..., None] * block + xp.arange(block)                  # (…, Nq, k + 1, c)
    return blocks, valid[..., None] & (keys < end[:, None, None])


def indexed_mask(blocks, allowed, nk: int, block: int):
    """The dense form of ``indexed_blocks``: (…, Nq, c', b) → bool (…, Nq, Nk), key s read
    by query t (for hooks, pictures and references; O(Nq·Nk))."""
    xp = get_array_module(blocks)
    keys = blocks[..., None] * block + xp.arange(block)                  # (…, Nq, c', b)
    hit = (keys[..., None] == xp.arange(nk)) & allowed[..., None]        # (…, Nq, c', b, Nk)
    return hit.any(axis=(-3, -2))


def _rms_norm_array(x, weight, eps):
    """Raw arrays: x / √(mean(x²) + eps) ⊙ (1 + weight), Qwen's zero-centred RMSNorm."""
    xp = get_array_module(x)
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * (1 + weight)


@register("block_indexer")
class BlockIndexerAttention(AttentionBase):
    r"""Block-indexed attention (Qwen4-Exp): each query reads its k best complete key blocks,
    scored by an indexer on their pooled keys, and its own incomplete block.

    Formula: the module docstring's. The indexer reads the attention's own heads:
    q^I = RMSNorm(W_q^I [q_1 … q_H]) (B, Nq, h_I, d_I), per indexer head, and
    k^I = W_k^I · mean_h k_h (B, Nk, d_I); the pooled keys are RMS-normalised with their own
    weight; both norms multiply by 1 + γ (Qwen's zero-centred weight).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D) (queries at the last Nq positions). Parameters:
    ``indexer_q`` (E → h_I·d_I), ``indexer_k`` (D → d_I), no biases; ``q_norm_weight``,
    ``k_norm_weight`` (d_I), zeros. Hooks: ``hook_pooled_keys`` k̄ (B, ⌊Nk/c⌋, d_I) and
    ``hook_block_scores`` I (B, Nq, ⌊Nk/c⌋), −inf on blocks not complete for the query (each
    may be replaced: the choice follows); ``hook_selection`` (B, Nq, ⌊Nk/c⌋) bool, the blocks
    chosen, and ``hook_keys_read`` (B, Nq, Nk) bool, the keys read (both read-only);
    ``hook_attn_scores``, ``hook_pattern`` (B, H, Nq, Nk), formed while one is set (dense
    attention under the same mask, same values to rounding).

    Options: ``block`` c, keys per block (default 4; Qwen4-Exp's ``indexer_compress_ratio``),
    ``top_k`` k, blocks chosen (4; ``indexer_budget`` / c), ``indexer_heads`` h_I (4),
    ``indexer_dim`` d_I (16), ``indexer_loss_weight`` (1.0; 0 leaves the indexer untrained),
    ``norm_eps`` (1e-6), ``causal``, ``num_kv_heads``, ``bias``. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a plain ``KVCache``).

    Complexity: {complexity}; each query reads at most k·c + c − 1 keys.

    Exactness: exact under its own, data-dependent selection: softmax attention masked to the
    chosen blocks and the tail, its own dense formula (``reference``, kind "score"); with
    k ≥ ⌊N/c⌋, causal softmax attention.

    Reference: Qwen Team (2026), Qwen4-Exp (HuggingFace ``transformers``,
    ``models/qwen4_exp``: ``Qwen4ExpTextQSAIndexer``).

    What minitx leaves out or does differently: the indexer reads the attention's query and
    key heads (Qwen4-Exp's projects the hidden state, one ``index_qk_proj``); no RoPE on the
    indexer's queries and pooled keys (Qwen4-Exp rotates each pooled key at its block's first
    position: the oracle test applies HF's rotation between pooling and scoring); the
    indexer learns from the KL objective above (HF's code is inference only); the data's
    precision throughout (HF pools and scores in float32); ties in the top-k go to the lower
    block (torch's top-k leaves them unspecified); no padding-aware blocks (HF forms blocks
    from each query's visible keys, which with padding need not be consecutive).
    """

    complexity = ("time O(B·N²·h_I·d_I/c) for the indexer + O(B·H·N·k·c·D), "
                  "memory O(B·h_I·N²/c + B·H·N·(k + 1)·(c + D))")

    kind = "score"          # checked against its own dense formula, under its own choice
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, block: int = 4, top_k: int = 4,
                 indexer_heads: int = 4, indexer_dim: int = 16,
                 indexer_loss_weight: float = 1.0, norm_eps: float = 1e-6, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        who = self.name
        self.block = validate.positive_int(block, "block", owner=who)
        self.top_k = validate.positive_int(top_k, "top_k", owner=who)
        self.indexer_heads = validate.positive_int(indexer_heads, "indexer_heads", owner=who)
        self.indexer_dim = validate.positive_int(indexer_dim, "indexer_dim", owner=who)
        self.indexer_loss_weight = validate.nonnegative_real(
            indexer_loss_weight, "indexer_loss_weight", owner=who)
        self.norm_eps = validate.positive_real(norm_eps, "norm_eps", owner=who)
        hi, di = self.indexer_heads, self.indexer_dim
        self.indexer_q = Linear(embed_dim, hi * di, bias=False)     # q^I from the query heads
        self.indexer_k = Linear(self.head_dim, di, bias=False)      # k^I from the mean key head
        self.q_norm_weight = Parameter(active_xp().zeros((di,), dtype="float32"))
        self.k_norm_weight = Parameter(active_xp().zeros((di,), dtype="float32"))
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_pooled_keys = HookPoint()    # (B, nb, d_I) k̄
        self.hook_block_scores = HookPoint()   # (B, Nq, nb) I, −inf where not complete
        self.hook_selection = HookPoint()      # (B, Nq, nb) bool, the chosen blocks
        self.hook_keys_read = HookPoint()      # (B, Nq, Nk) bool, the keys read
        self.hook_attn_scores = HookPoint()    # (B, H, Nq, Nk) scores under the mask
        self.hook_pattern = HookPoint()        # (B, H, Nq, Nk) probabilities

    # -- the indexer ---------------------------------------------------------------------

    def index_scores(self, q, k, hooked: bool = True):
        """I (B, Nq, ⌊Nk/c⌋) as a Tensor (differentiable in the indexer's weights), −inf on
        blocks not complete for the query. q (B, H, Nq, D), k (B, Hkv, Nk, D)."""
        b, _, nq, _ = q.shape
        nk = k.shape[2]
        hi, di = self.indexer_heads, self.indexer_dim
        xp = get_array_module(q.data)
        qi = reshape(self.indexer_q(merge_heads(q)), (b, nq, hi, di))
        qi = transpose(rms_norm(qi, (di,), self.q_norm_weight + 1.0, self.norm_eps),
                       (0, 2, 1, 3))                                     # (B, h_I, Nq, d_I)
        ki = self.indexer_k(k.mean(axis=1))                              # (B, Nk, d_I)
        kbar = rms_norm(pooled_block_keys(ki, self.block), (di,), self.k_norm_weight + 1.0,
                        self.norm_eps)                                   # (B, nb, d_I)
        if hooked:
            kbar = self.hook_pooled_keys(kbar)
        scores = block_index_scores(qi, kbar, 1.0 / math.sqrt(di))      # (B, Nq, nb)
        seen = complete_blocks(nq, nk, self.block, self.causal, xp)
        return masked_fill(scores, ~seen, -math.inf)

    def select(self, q, k):
        """The blocks each query reads and which of their keys (``indexed_blocks``): raw
        (B, Nq, k + 1) and (B, Nq, k + 1, c); also the chosen blocks and their validity,
        (B, Nq, min(k, nb)) each."""
        nq, nk = q.shape[2], k.shape[2]
        with no_grad():
            scores = self.hook_block_scores(self.index_scores(q, k)).data
        chosen, ok = top_k_indices(scores, self.top_k)
        _read_only(self.hook_selection, lambda: index_mask(chosen, ok, scores.shape[-1]))
        blocks, allowed = indexed_blocks(chosen, ok, nq, nk, self.block, self.causal)
        return blocks, allowed, chosen, ok

    # -- the attention -------------------------------------------------------------------

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D)."""
        _, h, *_ = check_heads(q, k, v, f"{self.name}.attend")
        xp = get_array_module(q.data)
        b, _, nq, _ = q.shape
        nk = k.shape[2]
        blocks, allowed, chosen, ok = self.select(q, k)                  # (B, Nq, k + 1, …)
        _read_only(self.hook_keys_read, lambda: indexed_mask(blocks, allowed, nk, self.block))
        k, v = repeat_kv(k, h), repeat_kv(v, h)                          # (B, H, Nk, D)
        if self.hook_attn_scores.active or self.hook_pattern.active:
            # a hook wants the Nq × Nk maps: dense attention under the same keys
            mask = indexed_mask(blocks, allowed, nk, self.block)[:, None]   # (B, 1, Nq, Nk)
            out = materialized_attention(q, k, v, scale=self.scale, mask=mask,
                                         hook_scores=self.hook_attn_scores,
                                         hook_pattern=self.hook_pattern)[0]
        else:
            shape = (b, h) + blocks.shape[1:]
            out = block_attention(q, k, v, xp.broadcast_to(blocks[:, None], shape),
                                  xp.broadcast_to(allowed[:, None], shape + (self.block,)),
                                  self.block, self.scale)
        if self.training and self.indexer_loss_weight and is_grad_enabled() and ok.any():
            # the indexer learns from its own loss, whose gradient joins the output's backward
            loss = self.indexer_loss(q, k, blocks, allowed, chosen, ok)
            out = AttachLoss.apply(out, loss * self.indexer_loss_weight)
        return out

    def indexer_loss(self, q, k, blocks, allowed, chosen, ok):
        """The indexer's objective (module docstring): the mean over batch and queries of
        KL(p_t ‖ softmax_{i chosen} I_{t,i}), p_t the attention's mass on each chosen block,
        summed over heads and renormalised over the chosen blocks (a constant: no gradient;
        a query with no complete block adds 0). q (B, H, Nq, D), k (B, H, Nk, D); the
        selection as ``select`` returns it. A scalar Tensor whose gradient reaches only the
        indexer's weights."""
        xp = get_array_module(q.data)
        b, h, nq, _ = q.shape
        c, kk = self.block, chosen.shape[-1]
        with no_grad():
            # the attention's probabilities on the keys of each slot, (B, H, Nq, (k + 1)·c)
            keys = blocks[..., None] * c + xp.arange(c)
            index = xp.minimum(keys, k.shape[2] - 1).reshape(b, 1, nq, -1)
            _, p = gathered_attention(Tensor._wrap(q.data), Tensor._wrap(k.data),
                                      Tensor._wrap(k.data), index,
                                      allowed.reshape(b, 1, nq, -1), self.scale)
        mass = p.data.sum(axis=1).reshape(b, nq, kk + 1, c).sum(axis=-1)[..., :kk]
        target = xp.where(ok, mass, 0.0)                                 # (B, Nq, k)
        total = target.sum(axis=-1, keepdims=True)
        target = target / xp.where(total > 0, total, 1.0)
        # the indexer at the chosen blocks, from detached heads
        scores = self.index_scores(Tensor._wrap(q.data), Tensor._wrap(k.data), hooked=False)
        at = take_along_axis(scores, xp.where(ok, chosen, 0), axis=-1)   # (B, Nq, k)
        logq = log_softmax(masked_fill(at, ~ok, -math.inf), axis=-1)
        logq = masked_fill(logq, ~ok, 0.0)                               # 0 · log 0 = 0
        entropy = xp.where(target > 0, target * xp.log(xp.where(target > 0, target, 1.0)), 0)
        kl = Tensor._wrap(entropy.sum(axis=-1)) - (logq * Tensor._wrap(target)).sum(axis=-1)
        return kl.mean()

    def reference(self, q, k, v):
        """Raw arrays: the indexer written as einsums, the top-k as a rank mask
        (``top_k_mask``), the tail as an interval, softmax attention under the keys read.
        (B, H, Nq, D)."""
        xp = get_array_module(q)
        b, h, nq, d = q.shape
        nk, c = k.shape[2], self.block
        hi, di, eps = self.indexer_heads, self.indexer_dim, self.norm_eps
        wq, wk = self.indexer_q.weight.data, self.indexer_k.weight.data
        gq, gk = self.q_norm_weight.data, self.k_norm_weight.data
        qi = (q.transpose(0, 2, 1, 3).reshape(b, nq, h * d) @ wq.T).reshape(b, nq, hi, di)
        qi = _rms_norm_array(qi, gq, eps)                                # (B, Nq, h_I, d_I)
        ki = k.mean(axis=1) @ wk.T                                       # (B, Nk, d_I)
        nb = nk // c
        kbar = _rms_norm_array(xp.stack([ki[:, i * c:(i + 1) * c].mean(axis=1)
                                         for i in range(nb)], axis=1), gk, eps) \
            if nb else xp.zeros((b, 0, di), dtype=q.dtype)
        scores = xp.maximum(xp.einsum("btjd,bid->btji", qi, kbar), 0).sum(axis=2) / math.sqrt(di)
        # which blocks compete, the choice as a rank mask, spread over each block's keys
        pos = xp.arange(nk - nq, nk)
        end = pos + 1 if self.causal else xp.full(nq, nk)
        complete = (xp.arange(nb) + 1) * c <= end[:, None]               # (Nq, nb)
        chosen = top_k_mask(xp.where(complete, scores, -math.inf), self.top_k)
        s = xp.arange(nk)
        read = xp.zeros((b, nq, nk), dtype=bool)
        read[..., :nb * c] = chosen[..., xp.arange(nb * c) // c]
        # the tail: from the end of the last complete block to the last key the query sees
        read |= (s[None, :] >= (end // c * c)[:, None]) & (s[None, :] < end[:, None])
        if self.causal:
            read &= causal_pattern(nq, nk, xp)
        return dense_attention_array(q, repeat_kv_array(k, h), repeat_kv_array(v, h),
                                     read[:, None])

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks: a top-k that keeps every block is causal softmax attention;
        ``attend`` equals its dense formula; decoding through the cache equals the full
        forward. (claim, value, limit)."""
        g = host_xp.random.default_rng(seed)
        q, k, v = (g.standard_normal((2, 2, 19, 4)) for _ in range(3))
        rows = []
        with no_grad():
            # a top-k that keeps every block reads every visible key: causal softmax attention
            every = cls(8, 2, causal=True, block=3, top_k=8).to(dtype="float64").eval()
            out = to_host(every.attend(*(Tensor(active_xp().asarray(a)) for a in (q, k, v))).data)
            causal = dense_attention_array(q, k, v, causal_pattern(19, 19))
            rows.append(("top_k ≥ blocks − causal softmax attention, max |Δ|",
                         float(host_xp.abs(out - causal).max()), 1e-12))
            # a top-k of 2: attend against the dense formula under the blocks it chose
            layer = cls(8, 2, causal=True, block=3, top_k=2).to(dtype="float64").eval()
            heads = [Tensor(active_xp().asarray(a)) for a in (q, k, v)]
            out = to_host(layer.attend(*heads).data)
            ref = to_host(layer.reference(*(t.data for t in heads)))
            rows.append(("attend (blocks it chose) − dense softmax under its own selection, "
                         "max |Δ|", float(host_xp.abs(out - ref).max()), 1e-12))
            # the whole text at once, then through one cache in steps of 5, 1, 7 and 6
            x = Tensor(active_xp().asarray(g.standard_normal((1, 19, 8))))
            whole = to_host(layer(x).data)
            cache = layer.new_cache()
            steps = [to_host(layer(x[:, a:z], kv_cache=cache).data)
                     for a, z in ((0, 5), (5, 6), (6, 13), (13, 19))]
            rows.append(("decoding through the cache (5, 1, 7, 6 tokens) − full forward, "
                         "max |Δ|", float(host_xp.abs(host_xp.concatenate(steps, axis=1)
                                                      - whole).max()), 1e-12))
        return rows

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", block={self.block}, top_k={self.top_k}, "
                f"indexer_heads={self.indexer_heads}, indexer_dim={self.indexer_dim}")

