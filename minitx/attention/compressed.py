r"""Compressed attention: DeepSeek-V4's two long-context layers, keys pooled into blocks.

DeepSeek-AI (2026), DeepSeek-V4 (§2.3). Each layer has one key/value head of D dims that is
both the key and the value (K = V), a sliding window of the last n_win raw keys, one learned
sink logit per head, and a second set of keys made by *compressing* the sequence: every m
consecutive tokens become one entry. Two kinds of layer:

- **CSA**, compressed sparse attention: m = 4, each entry pooled over an overlapping window of
  2m tokens, and a lightning indexer picks the k entries each query reads;
- **HCA**, heavily compressed attention: m' = 128, non-overlapping blocks, every entry read.

**The compressor.** A source stream x_s (DeepSeek's layer input) gives each token a content
c_s = W^C x_s and a gate z_s = W^Z x_s; b_r is a learned bias for slot r = s mod m of a block.
Entry w of HCA pools block w (tokens wm … wm + m − 1) by a softmax over its m slots, per
channel:

$$
\hat c_w = \sum_{r=0}^{m-1} \operatorname{softmax}_r\!\left( z_{wm+r} + b_r \right)
\odot c_{wm+r}, \qquad
C_w = \operatorname{RoPE}_{wm}\!\left( \operatorname{RMSNorm}(\hat c_w) \right)
$$

CSA's content and gate have 2D channels, two halves [c^a; c^b] (and [z^a; z^b], [b^a; b^b]):
entry w pools the a-halves of block w − 1 and the b-halves of block w, 2m slots in one
softmax (entry 0 has only its m b-slots):

$$
\hat c_w = \sum_{r<m} \alpha_{w,r}\, c^a_{(w-1)m+r} + \sum_{r<m} \beta_{w,r}\, c^b_{wm+r},
\qquad
(\alpha_w, \beta_w) = \operatorname{softmax}_{2m}\!\left( z^a_{(w-1)m+r} + b^a_r,\;
z^b_{wm+r} + b^b_r \right)
$$

so consecutive entries overlap by m tokens (width 2m, stride m). RoPE rotates the last R dims
(``rope_dim``) in pairs, by the position of the block's first token.

**Who sees what** (causal). Query t may read entry w only once its block is complete,
(w + 1)m − 1 ≤ t, i.e. w < ⌊(t + 1)/m⌋; the window is W_t = {s : t − n_win < s ≤ t}. CSA's
indexer scores the entries it may read, with h_I heads of d_I dims, q^I_{t,j} =
RoPE_t(W^{IQ}_j y_t), weights ω_t = W^ω u_t (y_t, u_t streams of the query token, below) and
keys K^I_w from a compressor of its own (d_I dims, the same overlap):

$$
I_{t,w} = \frac{1}{\sqrt{h_I d_I}} \sum_{j=1}^{h_I} \omega_{t,j}\,
\operatorname{ReLU}\!\left( q^I_{t,j} \cdot K^I_w \right),
\qquad
S_t = \operatorname{top-}k_{\;w < \lfloor (t+1)/m \rfloor}\; I_{t,w}
$$

(HCA: S_t = every w < ⌊(t + 1)/m⌋). **The attention**, per head h with sink σ_h, keys
k_s = RoPE_s(kv_s) serving as values too, and the output's rotary dims turned back by −t:

$$
o_t = \operatorname{RoPE}_{-t}\!\left( \frac{\sum_{s \in W_t} e^{\ell_{ts}} k_s
+ \sum_{w \in S_t} e^{\ell_{tw}} C_w}{\sum_{s \in W_t} e^{\ell_{ts}}
+ \sum_{w \in S_t} e^{\ell_{tw}} + e^{\sigma_h}} \right),
\qquad \ell_{ts} = \frac{q_t \cdot k_s}{\sqrt{D}},\ \ell_{tw} = \frac{q_t \cdot C_w}{\sqrt{D}}
$$

Turning the output back makes each value's rotary part count by its distance to the query, as
its key does (the value carries the key's rotation, K = V). The sink has no value: it only takes
probability mass.

**Shapes and cost.** q (B, H, N, D), kv (B, Hkv, N, D); entries (B, Hkv, ⌊N/m⌋, D); index
scores (B, N, ⌊N/m⌋). The reference form here scores each query against all N raw keys and
all ⌊N/m⌋ entries under the masks (W_t, S_t): time O(B·H·N·(N + N/m)·D) = O(B·H·N²·D),
memory O(B·H·N²), plus the indexer's O(B·h_I·N²·d_I/m). A query *reads* n_win + k keys
(CSA) or n_win + N/m (HCA), what a gathering kernel would cost.

**The cache** (``CompressedCache``) keeps, per layer, what the next tokens read: the last n_win − 1
rotated keys; every entry made so far (⌊t/m⌋ · D per head); the content and gate rows of the
partial block awaiting compression (< m rows of (1 + o)·D each); for CSA the a-halves of the
last complete block (m rows, the next entry's first slots) and the same three for the
indexer's compressor at d_I (its keys K^I_w). Decoding any split of a text through it equals
the full forward.

**Non-causal** (``causal=False``): every complete block's entry may be read and the window is
two-sided, |t − s| < n_win (minitx's extension for an encoder; DeepSeek's layers are causal).

**The standalone variant and the model.** On the registry's contract the variant sees only
heads, so its compressor reads the key/value head (per head, shared weights), its indexer's
q^I and ω read the merged query heads [q_1 … q_H] and its key compressor the mean key/value
head. DeepSeek-V4 feeds them the layer input x (compressors, ω) and the query latent (q^I):
a model builds ``Compressor`` and ``CompressedIndexer`` on its own streams and calls
``CompressedAttention.compressed_attend`` with them; the maths is the same code. The variant
holds the attention maths — the rotary slices (queries, keys, entries, the output turned
back), compression, selection, window and sinks; the model keeps its projections — the
low-rank query with its norms, the key/value projection and its norm, and DeepSeek's grouped
low-rank output projection.
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.tensor import Tensor
# positions and masks are built on the host, then moved beside the scores they mask
from ..backend import get_array_module, host_xp, to_device_of, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Identity, Linear, RMSNorm
from ..nn.module import Module, Parameter
from ..ops.activation import log_softmax, softmax
from ..ops.indexing import getitem, masked_fill
from ..ops.linalg import matmul
from ..ops.shape import concatenate, reshape, swapaxes, transpose
from .base import (AttentionBase, check_heads, dense_attention_array, hooked_heads, merge_heads,
                   register, repeat_kv, repeat_kv_array, softmax_rows_array)
from .positions import apply_rope
# the lightning indexer and its top-k are DSA's (selection.py), read over entries, not keys
from .selection import AttachLoss, index_mask, lightning_scores, top_k_indices, top_k_mask

__all__ = ["rope_tail", "pool_blocks", "CompressorState", "Compressor", "CompressedIndexer",
           "CompressedCache", "CompressedAttention", "CompressedSparseAttention",
           "HeavilyCompressedAttention"]


# ---- the pieces: rotary tail, pooling, the compressor ------------------------------------

def rope_tail(x, positions, rope_dim: int, base: float):
    """RoPE on the last ``rope_dim`` dims of x (…, N, D) at ``positions`` (N,) (pairs, as
    ``positions.apply_rope``), the first D − R passed through; x a Tensor or a raw array."""
    if not rope_dim:
        return x
    d = x.shape[-1]
    head, tail = (Ellipsis, slice(0, d - rope_dim)), (Ellipsis, slice(d - rope_dim, d))
    if not isinstance(x, Tensor):
        xp = get_array_module(x)
        return xp.concatenate([x[head], apply_rope(x[tail], positions, base=base)], axis=-1)
    return concatenate([getitem(x, head), apply_rope(getitem(x, tail), positions, base=base)],
                       axis=-1)


def pool_blocks(content, gate, overlap: bool, before=None):
    """The module docstring's ĉ_w: content and biased gate (B, G, M, m, C) Tensors, one row
    per block and slot, C = D (HCA) or 2D (CSA: halves a, b) → (B, G, M, D), a softmax over
    the slots per channel. ``before``: None, or raw (content, gate) a-halves (B, G, m, D) of
    the block before the first (a cache's); without it entry 0 reads its b-slots only."""
    if overlap:
        b, g, nb, m, c = content.shape
        d = c // 2
        xp = get_array_module(content.data)
        if before is None:      # nothing before block 0: zero content, gate −∞ (weight 0)
            first_c = xp.zeros((b, g, 1, m, d), dtype=content.dtype)
            first_z = xp.full((b, g, 1, m, d), -math.inf, dtype=content.dtype)
        else:
            first_c, first_z = before[0][:, :, None], before[1][:, :, None]
        a_half, b_half = (Ellipsis, slice(0, d)), (Ellipsis, slice(d, c))
        earlier = (slice(None), slice(None), slice(0, nb - 1))
        # slots of entry w: the a-halves of block w − 1, then the b-halves of block w
        prev_c = concatenate([Tensor._wrap(first_c), getitem(getitem(content, a_half),
                                                             earlier)], axis=2)
        prev_z = concatenate([Tensor._wrap(first_z), getitem(getitem(gate, a_half), earlier)],
                             axis=2)
        content = concatenate([prev_c, getitem(content, b_half)], axis=3)   # (B, G, M, 2m, D)
        gate = concatenate([prev_z, getitem(gate, b_half)], axis=3)
    return (softmax(gate, axis=3) * content).sum(axis=3)


class CompressorState:
    """What a compressor keeps between decoding steps, raw arrays: ``pending`` (content,
    gate) rows of the partial block (B, G, < m, C); ``before`` the a-halves (content, biased
    gate) of the last complete block (B, G, m, D), CSA only; ``entries`` (B, G, M, D) made so
    far, rotated; ``count`` M."""

    def __init__(self):
        self.pending = self.before = self.entries = None
        self.count = 0


class Compressor(Module):
    """The module docstring's compressor: a source (B, G, N, S) → entries C_w (B, G, ⌊N/m⌋,
    D), rotated at their blocks' first positions (G streams share the weights).

    Layers (HF's names after them): ``content`` W^C (``kv_proj``) and ``gate`` W^Z
    (``gate_proj``), S → (1 + o)·D without bias, o = 1 with ``overlap``; ``position_bias`` b
    (m, (1 + o)·D, zeros at first); ``kv_norm`` (RMSNorm over D, with gain).
    ``forward(source, state=None)``: without a state, the complete blocks of the source (the
    tokens after the last complete block are not read); with a ``CompressorState``, the
    source continues the state's tokens and all entries so far are returned (the state is
    updated). Time O(B·G·N·S·D)."""

    def __init__(self, source_dim: int, dim: int, rate: int, overlap: bool, rope_dim: int = 0,
                 rope_base: float = 10000.0, eps: float = 1e-6):
        super().__init__()
        self.dim, self.rate, self.overlap = dim, rate, overlap
        self.rope_dim, self.rope_base = rope_dim, rope_base
        width = (2 if overlap else 1) * dim
        self.content = Linear(source_dim, width, bias=False)
        self.gate = Linear(source_dim, width, bias=False)
        self.position_bias = Parameter(active_xp().zeros((rate, width), dtype="float32"))
        self.kv_norm = RMSNorm(dim, eps=eps)

    def forward(self, source, state=None):
        b, g = source.shape[:2]
        m, d = self.rate, self.dim
        content, gate = self.content(source), self.gate(source)          # (B, G, n, C)
        first = 0 if state is None else state.count
        if state is not None and state.pending is not None:
            content = concatenate([Tensor._wrap(state.pending[0]), content], axis=2)
            gate = concatenate([Tensor._wrap(state.pending[1]), gate], axis=2)
        nb = content.shape[2] // m
        blocks = (slice(None), slice(None), slice(0, nb * m))
        if state is not None:          # the rows after the last complete block wait
            state.pending = (content.data[:, :, nb * m:], gate.data[:, :, nb * m:])
        xp = get_array_module(content.data)
        new = Tensor._wrap(xp.zeros((b, g, 0, d), dtype=content.dtype))
        if nb:
            c = reshape(getitem(content, blocks), (b, g, nb, m, content.shape[-1]))
            z = reshape(getitem(gate, blocks), (b, g, nb, m, gate.shape[-1])) + \
                self.position_bias
            pooled = pool_blocks(c, z, self.overlap, None if state is None else state.before)
            if state is not None and self.overlap:
                state.before = (c.data[:, :, -1, :, :d], z.data[:, :, -1, :, :d])
            new = rope_tail(self.kv_norm(pooled), (first + host_xp.arange(nb)) * m,
                            self.rope_dim, self.rope_base)                      # (B, G, nb, D)
        if state is None:
            return new
        if state.entries is not None:
            new = concatenate([Tensor._wrap(state.entries), new], axis=2)
        state.entries, state.count = new.data, first + nb
        return new


class CompressedIndexer(Module):
    """CSA's lightning indexer (module docstring's I_{t,w} and top-k): the entries each query
    reads, bool (B, Nq, M).

    ``forward(query_source (B, Nq, Sq), weight_source (B, Nq, Sw), key_source (B, N, Sk),
    positions (Nq,), visible (Nq, M) bool, state=None)``: q^I = RoPE_t(``query`` y) (h_I
    heads of d_I; HF's ``q_b_proj``), ω = ``weights`` u (HF's ``scorer.weights_proj``), keys
    K^I from ``compressor`` (a ``Compressor`` at
    d_I with overlap; ``state`` its ``CompressorState``). Runs without gradient (the top-k
    is piecewise constant); it learns from ``loss``, its own objective. Hooks:
    ``hook_index_scores`` I (B, Nq, M), −inf where not visible (may be replaced: the choice
    follows); ``hook_topk_indices`` (B, Nq, min(k, M)) the chosen entries, best first, −1
    where fewer were visible (read-only). Time O(B·Nq·M·h_I·d_I)."""

    def __init__(self, query_dim: int, weight_dim: int, key_dim: int, heads: int, dim: int,
                 top_k: int, rate: int, rope_dim: int = 0, rope_base: float = 10000.0,
                 eps: float = 1e-6):
        super().__init__()
        self.heads, self.dim, self.top_k = heads, dim, top_k
        self.rope_dim, self.rope_base = rope_dim, rope_base
        self.query = Linear(query_dim, heads * dim, bias=False)
        self.weights = Linear(weight_dim, heads, bias=False)
        self.compressor = Compressor(key_dim, dim, rate, True, rope_dim, rope_base, eps)
        self.hook_index_scores = HookPoint()     # (B, Nq, M) I, −inf where not visible
        self.hook_topk_indices = HookPoint()     # (B, Nq, c) chosen entries, −1: none

    def scores(self, query_source, weight_source, keys, positions):
        """I (B, Nq, M) as a Tensor, differentiable in the indexer's weights: q^I and ω from
        the query token's streams, the keys K^I (B, 1, M, d_I) given."""
        b, nq, _ = query_source.shape
        hi, di = self.heads, self.dim
        qi = transpose(reshape(self.query(query_source), (b, nq, hi, di)), (0, 2, 1, 3))
        qi = rope_tail(qi, positions, self.rope_dim, self.rope_base)      # (B, h_I, Nq, d_I)
        w = self.weights(weight_source) * (1.0 / math.sqrt(hi * di))       # (B, Nq, h_I)
        return lightning_scores(qi, reshape(keys, (b, keys.shape[2], di)), w)

    def forward(self, query_source, weight_source, key_source, positions, visible, state=None):
        b, nq, _ = query_source.shape
        with no_grad():
            keys = self.compressor(reshape(key_source, (b, 1) + tuple(key_source.shape[1:])),
                                   state)
            m = keys.shape[2]
            xp = get_array_module(keys.data)
            if m == 0:
                return xp.zeros((b, nq, 0), dtype=bool)
            scores = self.scores(query_source, weight_source, keys, positions)  # (B, Nq, M)
            scores = masked_fill(scores, ~to_device_of(visible, scores.data), -math.inf)
            scores = self.hook_index_scores(scores).data
        index, valid = top_k_indices(scores, self.top_k)                   # (B, Nq, c)
        if self.hook_topk_indices.active:
            self.hook_topk_indices(Tensor._wrap(xp.where(valid, index, -1)))
        return index_mask(index, valid, m)

    def loss(self, query_source, weight_source, key_source, positions, read, probs):
        """The indexer's own objective, as DeepSeek-V3.2's (``dsa``'s ``indexer_loss``), on
        the entries read: the mean over batch and queries of KL(p_t ‖ softmax_{w ∈ S_t}
        I_{t,w}), p_t the attention's probabilities on those entries (raw ``probs``
        (B, H, Nq, M)) summed over heads and renormalised, a constant; a query that reads
        nothing counts 0. The streams are detached: a scalar Tensor whose gradient reaches
        only the indexer. ``read`` (B, Nq, M) bool, raw."""
        b = query_source.shape[0]
        xp = get_array_module(probs)
        query_source, weight_source, key_source = (Tensor._wrap(t.data) for t in
                                                   (query_source, weight_source, key_source))
        keys = self.compressor(reshape(key_source, (b, 1) + tuple(key_source.shape[1:])))
        scores = self.scores(query_source, weight_source, keys, positions)     # (B, Nq, M)
        rows = read.any(axis=-1, keepdims=True)
        target = xp.where(read, probs.sum(axis=1), 0.0)
        target = target / xp.where(rows, target.sum(axis=-1, keepdims=True), 1.0)
        # a row that reads nothing keeps its scores (target 0 there): no −inf-only softmax
        logq = log_softmax(masked_fill(scores, ~(read | ~rows), -math.inf), axis=-1)
        logq = masked_fill(logq, ~read, 0.0)                                # 0 · log 0 = 0
        entropy = xp.where(target > 0, target * xp.log(xp.where(target > 0, target, 1.0)), 0)
        kl = Tensor._wrap(entropy.sum(axis=-1)) - (logq * Tensor._wrap(target)).sum(axis=-1)
        return kl.mean()


class CompressedCache:
    """The decoding cache of one compressed layer (module docstring): ``keys`` the last
    n_win − 1 rotated key/value rows (B, Hkv, ≤ n_win − 1, D) and their ``positions``;
    ``compressor`` and ``index`` (CSA; else None) the two ``CompressorState``s. ``len()`` is
    the tokens seen. Holds raw arrays: for inference."""

    def __init__(self, window: int, indexed: bool):
        self.window = validate.positive_int(window, "window", owner="CompressedCache")
        self.indexed = bool(indexed)
        self.reset()

    def reset(self) -> None:
        """Forget everything cached."""
        self.keys, self.seen = None, 0
        self.positions = host_xp.zeros(0, dtype=host_xp.int64)
        self.compressor = CompressorState()
        self.index = CompressorState() if self.indexed else None

    def __len__(self) -> int:
        return self.seen

    def update(self, kv):
        """kv (B, Hkv, n, D) Tensor of the n new tokens, rotated → (the held rows then the new
        ones (B, Hkv, ·, D), their positions); then keep the last n_win − 1."""
        n = kv.shape[2]
        positions = host_xp.concatenate([self.positions, host_xp.arange(self.seen,
                                                                        self.seen + n)])
        keys = kv if self.keys is None else concatenate([Tensor._wrap(self.keys), kv], axis=2)
        keep = max(0, positions.shape[0] - (self.window - 1))
        self.keys, self.positions = keys.data[:, :, keep:], positions[keep:]
        self.seen += n
        return keys, positions


def _visible(qpos, count: int, rate: int, causal: bool):
    """(Nq, M) host bool: entry w may be read by the query at t iff w < ⌊(t + 1)/m⌋."""
    w = host_xp.arange(count)[None, :]
    if not causal:
        return host_xp.ones((len(qpos), count), dtype=bool)
    return w < ((host_xp.asarray(qpos) + 1) // rate)[:, None]


def _window(qpos, kpos, window: int, causal: bool):
    """(Nq, Nk) host bool: t − n_win < s ≤ t (|t − s| < n_win when not causal)."""
    near = host_xp.asarray(qpos)[:, None] - host_xp.asarray(kpos)[None, :]
    return ((near >= 0) & (near < window)) if causal else (host_xp.abs(near) < window)


# ---- the variants ------------------------------------------------------------------------

class CompressedAttention(AttentionBase):
    r"""The shared body of CSA and HCA (module docstring): a sliding window of raw keys, the
    compressed entries each query may read (all, or the indexer's top-k), a sink per head,
    one key/value head read as both key and value.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    v (B, Hkv, Nk, D) → (B, H, Nq, D), queries at the last Nq positions; k is not read (K = V:
    the layer owns no key projection and hands its values in k's place). Hooks (besides
    hook_q/k/v/z): ``hook_compressed`` C (B, Hkv, M, D), rotated (may be replaced);
    ``hook_selection`` (B, Nq, M) bool, the entries each query reads (read-only);
    ``hook_pattern`` (B, H, Nq, Nk + M) the probabilities on the raw keys then the entries
    (the sink's share is what is missing from 1; may be replaced); CSA adds the indexer's
    ``indexer.hook_index_scores`` and ``indexer.hook_topk_indices``.

    Options: ``compress`` m, ``window`` n_win (counting the query), ``sinks`` (True: a
    learned logit per head, zeros at first), ``rope_dim`` R (even, ≤ D; default 2·max(1, ⌊D/16⌋),
    DeepSeek's 64 of 512), ``rope_base`` (160000.0, DeepSeek-V4's compressed layers'),
    ``eps`` (1e-6, the compressors' RMSNorm), ``causal``, ``num_kv_heads``, ``bias``.
    Decoding: ``forward(x, kv_cache=layer.new_cache())`` (a ``CompressedCache``; causal).

    Complexity: time O(B·H·N²·D), memory O(B·H·N²) in the reference form (each query scores
    N raw keys and ⌊N/m⌋ entries under the masks); the subclasses state theirs.
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    kind = "score"
    supports_kv_cache = True
    projections = ("q", "v", "out")     # K = V: one key/value head
    # HCA's; CSA sets True: overlapping blocks, and the indexer's top-k of the entries
    sparse = False
    indexer_loss_weight = 0.0

    def __init__(self, embed_dim, num_heads, causal=False, compress: int = 4, window: int = 8,
                 sinks: bool = True, rope_dim: int = None, rope_base: float = 160000.0,
                 eps: float = 1e-6, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        who, d = self.name, self.head_dim
        self.compress = validate.positive_int(compress, "compress", owner=who)
        self.window = validate.positive_int(window, "window", owner=who)
        self.rope_base = validate.positive_real(rope_base, "rope_base", owner=who)
        self.eps = validate.positive_real(eps, "eps", owner=who)
        if rope_dim is None:
            rope_dim = 2 * max(1, d // 16) if d >= 2 else 0     # DeepSeek's 64 of 512
        self.rope_dim = validate.nonnegative_int(rope_dim, "rope_dim", owner=who)
        if self.rope_dim % 2 or self.rope_dim > d:
            raise validate.OptionError(f"{who}: rope_dim must be even and at most the head dim "
                                       f"{d}, got {rope_dim!r}")
        # the sink: a learned logit per head, zero at first; it takes mass, adds no value
        self.sinks = Parameter(active_xp().zeros(num_heads, dtype="float32")) \
            if validate.boolean(sinks, "sinks", owner=who) else None
        self.scale = 1.0 / math.sqrt(d)
        self.compressor = Compressor(d, d, self.compress, self.sparse, self.rope_dim,
                                     self.rope_base, self.eps)
        self.hook_compressed = HookPoint()     # (B, Hkv, M, D) entries C_w, rotated
        self.hook_selection = HookPoint()      # (B, Nq, M) bool, the entries read
        self.hook_pattern = HookPoint()        # (B, H, Nq, Nk + M) probabilities

    # -- the streams of the standalone variant: heads only
    def sources(self, q, kv):
        """The standalone streams (class docstring): the compressor reads the key/value
        heads; the indexer's q^I and ω the merged query heads, its keys the mean head."""
        merged = merge_heads(q)                                          # (B, Nq, H·D)
        return {"source": kv, "index_query": merged, "index_weights": merged,
                "index_keys": kv.mean(axis=1)}

    def attend(self, q, k, v):
        """q (B, H, Nq, D), v (B, Hkv, Nk, D) → (B, H, Nq, D); k is not read (K = V)."""
        check_heads(q, k, v, f"{self.name}.attend")
        return self.compressed_attend(q, v, **self.sources(q, v))

    def compressed_attend(self, q, kv, source, index_query=None, index_weights=None,
                          index_keys=None, cache=None):
        """The module docstring's o_t. q (B, H, Nq, D) and kv (B, Hkv, n, D) un-rotated;
        ``source`` (B, Hkv or 1, n, S) the compressor's stream; the indexer's streams (CSA)
        as ``CompressedIndexer.forward`` takes them. Without ``cache`` the n tokens are the
        whole text and the queries its last Nq; with a ``CompressedCache`` they continue it
        (n = Nq) and it is updated. → (B, H, Nq, D)."""
        nq, n = q.shape[2], kv.shape[2]
        start = 0 if cache is None else len(cache)
        qpos = host_xp.arange(start + n - nq, start + n)
        q = rope_tail(q, qpos, self.rope_dim, self.rope_base)
        kv = rope_tail(kv, host_xp.arange(start, start + n), self.rope_dim, self.rope_base)
        keys, kpos = (kv, host_xp.arange(n)) if cache is None else cache.update(kv)
        # the entries, and those each query reads
        entries = self.compressor(source, None if cache is None else cache.compressor)
        entries = self.hook_compressed(entries)                          # (B, G, M, D)
        visible = _visible(qpos, entries.shape[2], self.compress, self.causal)
        if self.sparse:
            read = self.indexer(index_query, index_weights, index_keys, qpos, visible,
                                None if cache is None else cache.index)  # (B, Nq, M)
        else:
            read = to_device_of(visible, q.data)[None]                   # (1, Nq, M)
        if self.hook_selection.active:
            xp = get_array_module(q.data)
            self.hook_selection(Tensor._wrap(xp.broadcast_to(read, (q.shape[0],) +
                                                            read.shape[1:]).copy()))
        out, probs = self._attend_union(q, keys, entries, qpos, kpos, read)
        if self.sparse and self.training and self.indexer_loss_weight and is_grad_enabled() \
                and cache is None and entries.shape[2]:
            # the indexer learns from its own loss, whose gradient joins the output's backward
            loss = self.indexer.loss(index_query, index_weights, index_keys, qpos, read,
                                     probs) * self.indexer_loss_weight
            out = AttachLoss.apply(out, loss)
        return rope_tail(out, -qpos, self.rope_dim, self.rope_base)

    def _attend_union(self, q, keys, entries, qpos, kpos, read):
        """Softmax over [window keys ∪ read entries ∪ sink], keys serving as values → (out,
        the probabilities on the entries as a raw array (B, H, Nq, M))."""
        h = q.shape[1]
        keys, entries = repeat_kv(keys, h), repeat_kv(entries, h)       # (B, H, ·, D)
        window = to_device_of(_window(qpos, kpos, self.window, self.causal), q.data)
        s_win = masked_fill(matmul(q, swapaxes(keys, -1, -2)) * self.scale, ~window,
                            -math.inf)                                   # (B, H, Nq, Nk)
        s_cmp = masked_fill(matmul(q, swapaxes(entries, -1, -2)) * self.scale,
                            ~read[:, None], -math.inf)                   # (B, H, Nq, M)
        parts = [s_win, s_cmp]
        if self.sinks is not None:      # the sink: one more logit per head, no value
            b = q.shape[0]
            sink = reshape(self.sinks, (1, h, 1, 1)) + Tensor._wrap(
                get_array_module(q.data).zeros((b, h, q.shape[2], 1), dtype=q.dtype))
            parts.append(sink)
        p = softmax(concatenate(parts, axis=-1), axis=-1)
        nk, m = keys.shape[2], entries.shape[2]
        pattern = self.hook_pattern(getitem(p, (Ellipsis, slice(0, nk + m))))
        out = matmul(pattern, concatenate([keys, entries], axis=2))     # (B, H, Nq, D)
        return out, pattern.data[..., nk:]

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); with ``kv_cache`` (a ``CompressedCache``) the N new tokens
        continue the cached ones."""
        if kv_cache is None:
            return super().forward(x, attn_mask)      # the whole text at once: the base's path
        who = type(self).__name__
        # only a cache of this window, indexed as this layer is, can continue its text
        if not isinstance(kv_cache, CompressedCache) or kv_cache.indexed != self.sparse or \
                kv_cache.window != self.window:
            given = type(kv_cache).__name__ + (
                f" of window {kv_cache.window}, indexed={kv_cache.indexed}"
                if isinstance(kv_cache, CompressedCache) else "")
            raise validate.OptionError(f"{who}: kv_cache must be a CompressedCache of window "
                                       f"{self.window}, indexed={self.sparse} (from "
                                       f"new_cache()), got a {given}")
        if not self.causal or attn_mask is not None:
            raise validate.OptionError(f"{who}: decoding through a CompressedCache needs "
                                       f"causal=True and no attn_mask, got causal={self.causal}")
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        # the base's forward, but with the cache handed to the compressed attention
        q, k, v = self.project(x)
        q, k, v = (hooked_heads(hk, t) for hk, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        y = self.compressed_attend(q, v, **self.sources(q, v), cache=kv_cache)
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def new_cache(self):
        """An empty ``CompressedCache`` for this layer's window (and indexer, CSA)."""
        return CompressedCache(self.window, self.sparse)

    # -- the dense formula on raw arrays
    def _entries_array(self, comp, src, rope=True):
        """Raw arrays: a ``Compressor``'s entries of src (B, G, N, S), block by block."""
        xp = get_array_module(src)
        m, d = comp.rate, comp.dim
        c = src @ comp.content.weight.data.astype(src.dtype).T
        z = src @ comp.gate.weight.data.astype(src.dtype).T
        bias = comp.position_bias.data.astype(src.dtype)
        out = []
        for w in range(src.shape[2] // m):
            blk = slice(w * m, (w + 1) * m)
            cs, zs = c[:, :, blk, -d:], z[:, :, blk, -d:] + bias[:, -d:]
            if comp.overlap and w:
                prev = slice((w - 1) * m, w * m)
                cs = xp.concatenate([c[:, :, prev, :d], cs], axis=2)
                zs = xp.concatenate([z[:, :, prev, :d] + bias[:, :d], zs], axis=2)
            e = xp.exp(zs - zs.max(axis=2, keepdims=True))
            pooled = (e / e.sum(axis=2, keepdims=True) * cs).sum(axis=2)     # (B, G, D)
            g = comp.kv_norm.weight.data.astype(src.dtype)
            normed = pooled / xp.sqrt((pooled ** 2).mean(-1, keepdims=True) + comp.kv_norm.eps)
            out.append(rope_tail((normed * g)[:, :, None], host_xp.asarray([w * m]),
                                 comp.rope_dim, comp.rope_base)[:, :, 0])
        b, g_ = src.shape[:2]
        return xp.stack(out, axis=2) if out else xp.zeros((b, g_, 0, d), dtype=src.dtype)

    def reference(self, q, k, v):
        """Raw arrays: the module docstring's o_t written densely — entries block by block,
        the choice as a rank mask (``top_k_mask``), one softmax over [keys, entries, sink]
        under the masks. (B, H, Nq, D); k is not read."""
        xp = get_array_module(q)
        b, h, nq, _ = q.shape
        nk = v.shape[2]
        qpos, kpos = host_xp.arange(nk - nq, nk), host_xp.arange(nk)
        rq = rope_tail(q, qpos, self.rope_dim, self.rope_base)
        keys = rope_tail(v, kpos, self.rope_dim, self.rope_base)
        entries = self._entries_array(self.compressor, v)                  # (B, G, M, D)
        m = entries.shape[2]
        read = xp.asarray(_visible(qpos, m, self.compress, self.causal))[None]  # (1, Nq, M)
        if self.sparse and m:
            ix = self.indexer
            merged = q.transpose(0, 2, 1, 3).reshape(b, nq, -1)
            qi = (merged @ ix.query.weight.data.astype(q.dtype).T).reshape(b, nq, ix.heads,
                                                                           ix.dim)
            qi = rope_tail(qi.transpose(0, 2, 1, 3), qpos, ix.rope_dim, ix.rope_base)
            ki = self._entries_array(ix.compressor, v.mean(axis=1)[:, None])[:, 0]
            w = merged @ ix.weights.weight.data.astype(q.dtype).T / math.sqrt(
                ix.heads * ix.dim)
            scores = xp.einsum("btj,bjtw->btw", w,
                               xp.maximum(xp.einsum("bjtd,bwd->bjtw", qi, ki), 0))
            read = top_k_mask(xp.where(read, scores, -math.inf), ix.top_k)    # (B, Nq, M)
        # one softmax over [window keys, entries, sink], each column masked by who may read it
        keys, entries = repeat_kv_array(keys, h), repeat_kv_array(entries, h)
        s = xp.concatenate([rq @ keys.swapaxes(-1, -2), rq @ entries.swapaxes(-1, -2)],
                           axis=-1) * self.scale
        allowed = xp.concatenate([xp.broadcast_to(xp.asarray(_window(
            qpos, kpos, self.window, self.causal)), (b, nq, nk)),
            xp.broadcast_to(read, (b, nq, m))], axis=-1)[:, None]
        if self.sinks is not None:      # the sink: one more logit per head, always allowed
            sink = xp.broadcast_to(self.sinks.data.astype(q.dtype)[None, :, None, None],
                                   (b, h, nq, 1))
            s = xp.concatenate([s, sink], axis=-1)
            allowed = xp.concatenate([xp.broadcast_to(allowed, (b, h, nq, nk + m)),
                                      xp.ones((b, h, nq, 1), dtype=bool)], axis=-1)
        p = softmax_rows_array(s, allowed)[..., :nk + m]     # the sink's column dropped: no value
        out = p @ xp.concatenate([keys, entries], axis=2)
        return rope_tail(out, -qpos, self.rope_dim, self.rope_base)

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of the variant's own identities: (claim, value, limit)."""
        g = host_xp.random.default_rng(seed)
        n, e, heads = 21, 8, 2
        d = e // heads
        sparse = {"top_k": 2} if cls.sparse else {}
        # a small causal layer with random weights, and random heads for attend
        layer = cls(e, heads, causal=True, compress=3, window=4, num_kv_heads=1,
                    **sparse).to(dtype="float64").eval()
        for p in layer.parameters():
            p.data = active_xp().asarray(g.standard_normal(p.shape) * 0.7)
        x = g.standard_normal((1, n, e))
        q, v = (g.standard_normal((1, heads, n, d)) for _ in range(2))
        with no_grad():
            # the whole text at once, then through one cache in steps of 5, 1, 7 and 8
            full = layer(Tensor(x)).numpy()
            cache = layer.new_cache()
            steps = host_xp.concatenate([layer(Tensor(x[:, a:b]), kv_cache=cache).numpy()
                                         for a, b in ((0, 5), (5, 6), (6, 13), (13, n))], 1)
            held = cache.keys.shape[2]          # raw keys kept: the window's, no more
            out = layer.attend(Tensor(q), Tensor(v), Tensor(v)).numpy()
            ref = to_host(layer.reference(*(Tensor(a).data for a in (q, v, v))))
            # m = 1, every entry and key read, the content map the identity, no norm, rope
            # or sink: each key twice (raw and as its own entry), a softmax unchanged
            exact = cls(e, heads, causal=True, compress=1, window=n, sinks=False, rope_dim=0,
                        **({"top_k": n} if cls.sparse else {})).to(dtype="float64")
            comp = exact.compressor
            comp.kv_norm = Identity()
            eye = host_xp.eye(d) if not cls.sparse else \
                host_xp.concatenate([host_xp.zeros((d, d)), host_xp.eye(d)])
            comp.content.weight.data = active_xp().asarray(eye)
            if cls.sparse:          # the a-halves (the previous token) get weight 0
                bias = host_xp.zeros((1, 2 * d))
                bias[:, :d] = -math.inf
                comp.position_bias.data = active_xp().asarray(bias)
            twice = exact.attend(Tensor(q), Tensor(v), Tensor(v)).numpy()
        # what reading each key twice must equal: causal softmax attention on the same heads
        causal = dense_attention_array(q, v, v, host_xp.tri(n, dtype=bool))
        return [(f"decoding {n} tokens through a CompressedCache (5, 1, 7, 8) − full forward, "
                 "max |Δ|", float(host_xp.abs(steps - full).max()), 1e-12),
                ("raw keys the cache holds after 21 tokens, window 4 (≤ n_win − 1 = 3)",
                 float(held), 3.0),
                ("attend − its dense formula (reference), max |Δ|",
                 float(host_xp.abs(out - ref).max()), 1e-12),
                ("m = 1, every entry read, window ≥ N − causal softmax attention, max |Δ|",
                 float(host_xp.abs(twice - causal).max()), 1e-12)]

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", compress={self.compress}, window={self.window}, "
                f"rope_dim={self.rope_dim}, sinks={self.sinks is not None}")


@register("compressed_sparse")
class CompressedSparseAttention(CompressedAttention):
    r"""Compressed sparse attention (DeepSeek-V4's CSA): entries over overlapping windows of
    2m tokens, stride m, the indexer's top-k of them, the sliding window and the sinks.

    Formula: the module docstring's, with CSA's overlapping ĉ_w and S_t the top-k of I_{t,w}.

    Shapes: as ``CompressedAttention``'s, its hooks too.

    Options: ``CompressedAttention``'s, and ``compress`` m (default 4, DeepSeek's), ``top_k``
    k (4; DeepSeek's 512), ``window`` n_win (8; DeepSeek's 128), ``indexer_heads`` h_I (4;
    DeepSeek's 64), ``indexer_dim`` d_I (default max(16, R); DeepSeek's 128),
    ``indexer_loss_weight`` (1.0; 0 leaves the indexer untrained). The indexer (``indexer``,
    a ``CompressedIndexer``) runs without gradient and learns from its own loss
    (``CompressedIndexer.loss``, the KL objective of DeepSeek-V3.2's sparse stage), whose
    gradient joins the output's backward in training mode.

    Complexity: {complexity}; a query reads n_win raw keys and k entries.

    Exactness: exact under its own data-dependent selection: softmax over the window, the
    chosen entries and the sink, its own dense formula (``reference``, kind "score"); with
    m = 1, k ≥ N, n_win ≥ N, an identity content map and no norm, rope or sink it reads every
    key twice (raw, and as its own entry), which leaves a softmax unchanged: causal softmax
    attention (the tests).

    Reference: DeepSeek-AI (2026), "DeepSeek-V4" (§2.3.1, compressed sparse attention);
    HuggingFace's ``DeepseekV4CSACompressor`` / ``DeepseekV4Indexer``.

    What minitx leaves out or does differently: the FP8 and the Hadamard rotation of the
    indexer's inference kernel; the indexer's score in the data's precision (HF's in float32);
    ties to the earlier entry (a stable sort); no gathering kernel (the reference form masks
    dense scores). The standalone streams are the heads (module docstring).
    """

    complexity = "time O(B·H·N²·D + B·h_I·N²·d_I/m), memory O(B·H·N²)"
    sparse = True

    def __init__(self, embed_dim, num_heads, causal=False, compress: int = 4, top_k: int = 4,
                 window: int = 8, indexer_heads: int = 4, indexer_dim: int = None,
                 indexer_loss_weight: float = 1.0, **options):
        super().__init__(embed_dim, num_heads, causal=causal, compress=compress, window=window,
                         **options)
        who = self.name
        self.top_k = validate.positive_int(top_k, "top_k", owner=who)
        self.indexer_loss_weight = validate.nonnegative_real(
            indexer_loss_weight, "indexer_loss_weight", owner=who)
        heads = validate.positive_int(indexer_heads, "indexer_heads", owner=who)
        # d_I: the indexer's queries and keys rotate their last rope_dim dims, as the layer's
        dim = max(16, self.rope_dim) if indexer_dim is None else \
            validate.positive_int(indexer_dim, "indexer_dim", owner=who)
        if dim < self.rope_dim:
            raise validate.OptionError(f"{who}: indexer_dim must be at least rope_dim "
                                       f"({self.rope_dim}): its last rope_dim dims rotate, got "
                                       f"{indexer_dim!r}")
        # the standalone streams: q^I and ω read the merged query heads (E dims), the
        # indexer's key compressor the mean key/value head (D dims)
        d = self.head_dim
        self.indexer = CompressedIndexer(embed_dim, embed_dim, d, heads, dim, self.top_k,
                                         self.compress, self.rope_dim, self.rope_base,
                                         self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", top_k={self.top_k}"


@register("heavily_compressed")
class HeavilyCompressedAttention(CompressedAttention):
    r"""Heavily compressed attention (DeepSeek-V4's HCA): one entry per block of m tokens,
    every complete block read, the sliding window and the sinks.

    Formula: the module docstring's, with HCA's ĉ_w and S_t every complete block.

    Shapes: as ``CompressedAttention``'s, its hooks too.

    Options: ``CompressedAttention``'s; ``compress`` m defaults to 8 here (DeepSeek's 128: a
    small default lets short texts have entries), ``window`` n_win to 8 (DeepSeek's 128).

    Complexity: {complexity}; a query reads n_win raw keys and ⌊(t + 1)/m⌋ entries.

    Exactness: a different attention, exact under its masks (window, complete blocks), its
    own dense formula (``reference``, kind "score"); with m = 1, n_win ≥ N, an identity content
    map and no norm, rope or sink it reads every key twice, raw and as its own entry: causal
    softmax attention (the tests).

    Reference: DeepSeek-AI (2026), "DeepSeek-V4" (§2.3.2, heavily compressed attention);
    HuggingFace's ``DeepseekV4HCACompressor``.

    What minitx leaves out or does differently: no gathering kernel (the reference form
    masks dense scores); FP8 storage of the entries is left out. The standalone streams are
    the heads (module docstring).
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    def __init__(self, embed_dim, num_heads, causal=False, compress: int = 8, window: int = 8,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, compress=compress, window=window,
                         **options)
