r"""Chunked attention: Llama 4's local layers, where a key is visible iff it is in the query's
chunk.

Meta (2025), "The Llama 4 herd"; HuggingFace's ``Llama4TextAttention`` with
``attention_chunk_size``. The sequence is cut into chunks of C consecutive positions and each
query attends, causally, to the keys of its own chunk only:

$$
O = \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + M \right) V, \qquad
M_{ij} = \begin{cases} 0 & \lfloor i / C \rfloor = \lfloor j / C \rfloor \text{ and } j \le i \\
-\infty & \text{otherwise} \end{cases}
$$

Exact softmax attention under a block-diagonal mask (``masks.chunked_rule``). Where a sliding
window of W lets every query see its last W tokens, a chunk boundary forgets everything
before it: the first query of a chunk sees only itself. What crosses chunks in Llama 4 is the
layers without the mask (its NoPE layers attend globally).

**Cost.** Each query block is one chunk and reads its own C keys (``sparse.py``'s
``blocked_sparse_attention``, never N × N): time O(N·C·D), memory O(N·C) for the scores.

**Decoding.** A query at position p reads keys ⌊p/C⌋·C … p, so the cache
(``kv_cache.ChunkKVCache``) drops every key at each chunk boundary and never holds more than
C − 1 between steps: Hkv·D·(C − 1) numbers per row for keys, as many for values.

**Non-causal** (``causal=False``) is the block-diagonal mask alone (each query sees its
whole chunk): minitx's extension for an encoder, not Llama 4's.
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import host_xp, to_device_of, to_host, xp as active_xp
from .base import (dense_attention_array, hooked_heads, materialized_attention, merge_heads,
                   register, repeat_kv)
from .kv_cache import ChunkKVCache
from .masks import chunked_rule, grid_mask
from .sparse import SparseAttentionBase, _window_index

__all__ = ["ChunkedAttention"]


@register("chunked")
class ChunkedAttention(SparseAttentionBase):
    r"""Chunked attention: each query sees the keys of its own chunk of C positions.

    Formula: the module docstring's, the block-diagonal mask ⌊i/C⌋ = ⌊j/C⌋ (and j ≤ i when
    causal). Computed one chunk of queries at a time on the chunk's own keys, never N × N.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); key table (⌈N/C⌉, C), scores (B, H, ⌈N/C⌉, C, C).
    Hook points (besides hook_q/k/v/z): ``hook_mask`` (N, Nk) bool, ``hook_attn_scores`` and
    ``hook_pattern`` (B, H, N, Nk), formed when a hook is set (dense under the same mask).

    Options: ``chunk_size`` C (8; Llama 4 Scout's is 8192), ``causal`` (False),
    ``num_kv_heads``, ``bias`` (``block_size`` is not used: a query block is a chunk).
    Decoding: ``forward(x, kv_cache=layer.new_cache())`` (a ``ChunkKVCache``: the current
    chunk's keys and values only; causal only).

    Complexity: {complexity}; decoding O(B·H·C·D) per token, at most C − 1 keys cached.

    Exactness: exact under its sparsity mask (``chunked_mask`` / ``pattern(n)``).

    Reference: Meta AI (2025), "The Llama 4 herd: the beginning of a new era of natively
    multimodal AI innovation" (chunked attention in its local layers).
    """

    complexity = "time O(B·H·N·C·D), memory O(B·H·N·C)"

    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, chunk_size: int = 8, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.chunk_size = validate.positive_int(chunk_size, "chunk_size", owner=self.name)

    def _rule(self, n):
        return lambda i, j: chunked_rule(i, j, self.chunk_size, self.causal)

    def _layout(self, n):
        # a query block is one chunk; its keys are the chunk's own positions
        return self.chunk_size, _window_index(n, self.chunk_size, 0, 0), None

    def new_cache(self):
        """An empty ``ChunkKVCache`` of this layer's chunk."""
        return ChunkKVCache(self.chunk_size)

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); with ``kv_cache`` (a ``ChunkKVCache``) the N new tokens
        continue the ones the cache has seen, each reading its own chunk."""
        if kv_cache is None:
            return super().forward(x, attn_mask)
        # decoding: only a causal layer, with a cache of its own chunk length
        who = type(self).__name__
        if not isinstance(kv_cache, ChunkKVCache) or kv_cache.chunk != self.chunk_size:
            given = type(kv_cache).__name__ + (f" of chunk {kv_cache.chunk}" if
                                               isinstance(kv_cache, ChunkKVCache) else "")
            raise validate.OptionError(f"{who}: kv_cache must be a ChunkKVCache of chunk "
                                       f"{self.chunk_size} (from new_cache()), got {given}")
        if not self.causal or attn_mask is not None:
            raise validate.OptionError(f"{who}: decoding through a ChunkKVCache needs "
                                       f"causal=True and no attn_mask, got causal={self.causal}")
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        # project and hook as AttentionBase.forward does; the cache adds the chunk so far
        q, k, v = self.project(x)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        k, v = kv_cache.append(k, v)                         # (B, Hkv, kept + N, D)
        # the rule on the tokens' positions: queries at offset …, keys from first_position
        i = host_xp.arange(kv_cache.offset, kv_cache.length)[:, None]
        j = host_xp.arange(kv_cache.first_position, kv_cache.length)[None, :]
        allowed = self.hook_mask(Tensor(to_device_of(chunked_rule(i, j, self.chunk_size),
                                                     q.data)))
        # at most C − 1 + N keys: the dense form under the rule is the cheap one here
        h = self.num_heads
        y = materialized_attention(q, repeat_kv(k, h), repeat_kv(v, h),
                                   scale=1.0 / math.sqrt(self.head_dim), mask=allowed.data,
                                   hook_scores=self.hook_attn_scores,
                                   hook_pattern=self.hook_pattern)[0]
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def pattern(self, n: int):
        """(n, n) bool mask of the chunks (True = may attend)."""
        return grid_mask(n, self._rule(n))

    @classmethod
    def identities(cls, seed=0):
        """Decoding agrees with the full forward; one chunk is causal attention; chunks of one
        token give each query its own value (float64, B = 2, E = 12, H = 3, N = 14)."""
        # a prompt, then steps of 1 and 5 tokens across chunk boundaries, against one call
        g = host_xp.random.default_rng(seed)
        x = Tensor(active_xp().asarray(g.standard_normal((2, 14, 12))))
        layer = cls(12, 3, causal=True, chunk_size=4).to(dtype="float64")
        q, k, v = (Tensor(active_xp().asarray(g.standard_normal((2, 3, 14, 4))))
                   for _ in range(3))
        with no_grad():
            full = to_host(layer(x).data)
            cache = layer.new_cache()
            steps = host_xp.concatenate([to_host(layer(x[:, a:b], kv_cache=cache).data)
                                         for a, b in ((0, 3), (3, 4), (4, 9), (9, 14))], axis=1)
            held = cache._k.shape[2]
            # the two limits: one chunk over everything, and a chunk per token
            layer.chunk_size = 14
            one = to_host(layer.attend(q, k, v).data)
            layer.chunk_size = 1
            alone = to_host(layer.attend(q, k, v).data)
        # each an exact equality: only float64 rounding separates the two sides
        qh, kh, vh = (to_host(t.data) for t in (q, k, v))
        causal = dense_attention_array(qh, kh, vh, host_xp.tri(14, dtype=bool))
        return [("decoding through a ChunkKVCache (a prompt of 3, then 1, 5, 5) − full "
                 "causal forward, max |Δ|", float(host_xp.abs(steps - full).max()), 1e-12),
                ("keys the cache holds after 14 tokens, chunks of 4 (≤ C − 1 = 3)",
                 float(held), 3),
                ("one chunk of 14 − causal dense attention, max |Δ|",
                 float(host_xp.abs(one - causal).max()), 1e-12),
                ("chunks of 1 − the values themselves, max |Δ|",
                 float(host_xp.abs(alone - vh).max()), 1e-12)]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", chunk_size={self.chunk_size}"
