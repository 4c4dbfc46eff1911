"""The plain attention of a decoder layer, full, sliding or chunked, with the one
normalisation layer every family chooses from (``norm_layer``); the formula is
``decoder.py``'s. What a family adds to it lives in ``attention_features.py``."""
from __future__ import annotations

from typing import TYPE_CHECKING

import math

from .. import backend
from ..attention import ChunkKVCache, KVCache, SharedKVCache, WindowKVCache
from ..attention.base import hookable_attention, hooked_heads
from ..nn.decoder_layers import DecoderRMSNorm
from ..nn.hooks import HookPoint
from ..nn.layers import LayerNorm, Linear
from ..nn.module import Module
from ..nn.rotary import Rotary
from ..ops.sdpa import merge_heads, split_heads
from ..ops.shape import concatenate

if TYPE_CHECKING:                       # a type only: decoder.py imports this module
    from .decoder import DecoderConfig

__all__ = ["DecoderAttention", "norm_layer", "kv_source", "kv_sources", "layer_heads"]


def layer_heads(c: DecoderConfig, index: int) -> tuple:
    """(Hkv, D) of layer ``index``: Gemma 4's "full" layers may have their own."""
    full = c.layer_types is not None and c.layer_types[index] == "full"
    return (c.full_kv_heads if full and c.full_kv_heads else c.num_kv_heads,
            c.full_head_dim if full and c.full_head_dim else c.head_dim)


def kv_source(c: DecoderConfig, index: int):
    """The layer whose keys and values layer ``index`` reads (``kv_shared_layers``: each of
    the last n layers reads the last earlier layer of its own type), or None: its own."""
    first = c.num_layers - (c.kv_shared_layers or 0)
    if index < first:
        return None
    own = [j for j in range(first) if c.layer_types[j] == c.layer_types[index]]
    return own[-1] if own else None


def kv_sources(c: DecoderConfig) -> set:
    """The layers whose keys and values later layers read."""
    return {kv_source(c, i) for i in range(c.num_layers)} - {None}


def norm_layer(c: DecoderConfig, dim: int):
    """The family's normalisation over the last axis of size ``dim``."""
    if c.norm == "layernorm":
        return LayerNorm(dim, eps=c.norm_eps, bias=c.norm_bias)
    return DecoderRMSNorm(dim, eps=c.norm_eps, unit_offset=c.norm_unit_offset,
                          scale_in_float32=c.norm_scale_in_float32,
                          affine=not c.norm_weightless)


class DecoderAttention(Module):
    """Causal self-attention of one decoder layer (module docstring's formula), full or
    sliding, in its plain form: what a family adds to it (QK-norm, an output gate, soft-capped
    scores, sinks) is a subclass in ``attention_features.py``. x (B, N, E) → (B, N, E); H
    query heads of D dims, Hkv key/value heads.

    Linear layers ``q_proj`` (E → H·D), ``k_proj``/``v_proj`` (E → Hkv·D), ``o_proj``
    (H·D → E). With a cache, x's tokens follow the cached ones. Hook points as the
    registry's variants (TransformerLens's names, heads as (B, N, H, D)):
    ``hook_q``/``hook_k``/``hook_v`` (the projections, before the rotation),
    ``hook_rot_q``/``hook_rot_k``, ``hook_attn_scores``/``hook_pattern`` (B, H, Nq, Nk),
    ``hook_z``. Time O(B·H·N·Nk·D), Nk ≤ W with a window.
    """
    query_width = 1          # q_proj's rows per query row (a gate may ride along with q)
    needs_scores = False     # the scores written out, with an explicit mask (else fused)

    def __init__(self, c: DecoderConfig, sliding: bool = False, index: int = 0):
        super().__init__()
        (hkv, d), e, h = layer_heads(c, index), c.hidden_size, c.num_heads
        self.num_heads, self.num_kv_heads, self.head_dim = h, hkv, d
        self.q_proj = Linear(e, h * d * self.query_width, bias=c.qkv_bias)
        # a layer that borrows an earlier layer's keys and values (``kv_shared_layers``) has
        # no projection of its own for them; ``Decoder`` hands it its source
        self.borrows = kv_source(c, index) is not None
        self.stores = index in kv_sources(c)
        self._source, self.shared_kv = (), None
        # Gemma 4's global layers take their values from the keys' projection
        self.k_eq_v = c.attention_k_eq_v and c.layer_types[index] == "full"
        if not self.borrows:
            self.k_proj = Linear(e, hkv * d, bias=c.qkv_bias)
            if not self.k_eq_v:
                self.v_proj = Linear(e, hkv * d, bias=c.qkv_bias)
        self.o_proj = Linear(h * d, e, bias=c.o_bias)
        self.v_norm = DecoderRMSNorm(d, eps=c.norm_eps, affine=False) \
            if c.v_norm and not self.borrows else None
        # A sliding layer sees W keys and may have its own rotary base (Gemma 3's local
        # layers), a chunked one its chunk's keys; a NoPE layer (``nope_layers``) rotates
        # nothing, and may warm its queries with the position (Llama 4's temperature).
        self.window = c.sliding_window if sliding else None
        chunked = index < len(c.layer_types or ()) and c.layer_types[index] == "chunked"
        self.chunk = c.attention_chunk_size if chunked else None
        rope = c.local_rope if sliding and c.local_rope is not None else c.rope
        nope = index in c.nope_layers
        self.rotary = Rotary(d, rope, reverse=c.rope_reversed) \
            if c.positions == "rope" and not nope else None
        self.interleaved = c.rope_interleave
        self.temperature = c.attn_temperature if nope else None
        self.scale = 1.0 / math.sqrt(c.query_pre_attn_scalar or d)
        for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """A ``WindowKVCache`` for a sliding layer, a ``ChunkKVCache`` for a chunked one (both
        bounded), a ``SharedKVCache`` (a count) for one that borrows its keys, else a
        ``KVCache``."""
        if self.borrows:
            return SharedKVCache()
        if self.chunk is not None:
            return ChunkKVCache(self.chunk)
        return KVCache() if self.window is None else WindowKVCache(self.window)

    def _allowed(self, offset, n, first, nk, xp, always=False):
        """(Nq, Nk) bool, True = may attend: causal, and within the window or the chunk; None
        when plain bottom-right causality says it (full layer, keys from position 0) unless
        ``always``."""
        if self.window is None and self.chunk is None and first == 0 and not always:
            return None
        qpos = xp.arange(offset, offset + n)[:, None]
        kpos = xp.arange(first, first + nk)[None, :]
        allowed = kpos <= qpos
        if self.window is not None:
            allowed &= kpos > qpos - self.window                  # the last W positions
        if self.chunk is not None:
            allowed &= kpos // self.chunk == qpos // self.chunk   # the query's own chunk
        return allowed

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` (B, cached + N) bool, False = a padding key;
        ``positions`` (B, N) the rotary positions (default: cached … cached + N − 1)."""
        return self.o_proj(self.heads(x, self.q_proj(x), kv_cache, keep, positions))

    def heads(self, x, q, kv_cache=None, keep=None, positions=None):
        """The heads' outputs merged, (B, N, H·D), for x (B, N, E) and its queries q
        (B, N, H·D)."""
        n = x.shape[1]
        xp = backend.get_array_module(x.data)
        offset = 0 if kv_cache is None else len(kv_cache)
        # Split into heads (B, H, N, D), then rotate at the tokens' own positions (after the
        # cached ones) and cache the keys.
        q = hooked_heads(self.hook_q, split_heads(q, self.num_heads))
        k = v = None                           # a borrowing layer makes neither
        if not self.borrows:
            k = hooked_heads(self.hook_k, split_heads(self.k_proj(x), self.num_kv_heads))
            v = k if self.k_eq_v else split_heads(self.v_proj(x), self.num_kv_heads)
            v = hooked_heads(self.hook_v, v)
            if self.v_norm is not None:        # Gemma 4: each value head to unit RMS
                v = self.v_norm(v)
        q, k = self.normed(q, k)
        if self.rotary is not None:
            pos = xp.arange(offset, offset + n) if positions is None else positions
            q = hooked_heads(self.hook_rot_q, self._rotate(q, pos))
            if k is not None:
                k = hooked_heads(self.hook_rot_k, self._rotate(k, pos))
            q, k = self.rotated(q, k)
        elif self.temperature is not None:
            q = q * self.query_temperature(offset, n, q.dtype, xp)
        if self.borrows:
            k, v, first = self._borrowed(offset, n, kv_cache)
        else:
            first = 0
            if kv_cache is not None:
                k, v = kv_cache.append(k, v)                           # (B, Hkv, Nk, D)
                first = getattr(kv_cache, "first_position", 0)
            if self.stores:                    # handed on, to the layers that borrow them
                self.shared_kv = (k, v, first, offset + n)
        # The mask: causal and the window, and the padding keys (Nq, Nk) & (B, 1, 1, Nk).
        allowed = self._allowed(offset, n, first, k.shape[2], xp,
                                always=self.needs_scores or keep is not None)
        if keep is not None:
            allowed = allowed & keep[:, None, None, first:first + k.shape[2]]
        return merge_heads(hooked_heads(self.hook_z, self.attend(q, k, v, allowed)))

    def _rotate(self, t, pos):
        if self.interleaved:                   # pairs (0, 1), (2, 3) … read as two halves
            t = concatenate([t[..., 0::2], t[..., 1::2]], axis=-1)
        return self.rotary.rotate(t, pos)

    def borrow_from(self, source: DecoderAttention) -> None:
        """Read keys and values from ``source`` (an earlier layer of the same kind)."""
        self._source = (source,)               # a tuple: not a submodule

    def _borrowed(self, offset, n, kv_cache):
        """The source's keys, values and first key position, checked to be this step's."""
        if kv_cache is not None:
            kv_cache.advance(n)
        shared = self._source[0].shared_kv if self._source else None
        if shared is None or shared[3] != offset + n:
            raise ValueError(f"DecoderAttention: a layer that borrows its keys needs its "
                             f"source to have run on the same {offset + n} tokens first, got "
                             f"{'none' if shared is None else shared[3]}")
        return shared[:3]

    def normed(self, q, k):
        """q and k between projection and rotation: as projected (``QKNorm`` normalises);
        k is None in a layer that borrows its keys."""
        return q, k

    def rotated(self, q, k):
        """q and k after the rotation: as rotated (``QKNorm`` "after_rope" normalises)."""
        return q, k

    def query_temperature(self, offset, n, dtype, xp):
        """(N, 1): 1 + α·ln(1 + ⌊(m + 1)/F⌋) at the positions m = offset … offset + N − 1
        (``decoder.py``'s ``attn_temperature``); HF counts m from its cache, not from
        ``position_ids``, and so does this."""
        floor, alpha = self.temperature
        m = xp.arange(offset, offset + n, dtype="float64")
        return (1.0 + alpha * xp.log1p(xp.floor((m + 1.0) / floor)))[:, None].astype(dtype)

    def attend(self, q, k, v, allowed):
        """(B, H, Nq, D): softmax attention, fused (composed when a hook is set)."""
        z, _ = hookable_attention(self, q, k, v, scale=self.scale, causal=allowed is None,
                                  mask=allowed)
        return z

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, window={self.window}" +
                ("" if self.chunk is None else f", chunk={self.chunk}"))
