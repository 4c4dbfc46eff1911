r"""Multi-head latent attention (DeepSeek-V2/V3, ``attention="mla"``) compresses each token to a
normalised latent c_j = Norm(W^{KV}_a x_j) of r numbers and one rotary key k^R_j shared by
every head; head h's key is [W^K_h c_j, R_j k^R_j] and its value W^V_h c_j, so the cache
keeps (c_j, R_j k^R_j), r + D_r numbers per token, instead of 2·H·D:

$$
s_{ij} = \frac{q^C_{h,i} \cdot W^K_h c_j + (R_i q^R_{h,i}) \cdot (R_j k^R_j)}
{\sqrt{D_n + D_r}}, \qquad o_{h,i} = \sum_{j \le i} \operatorname{softmax}_j(s_{ij})\,
W^V_h c_j
$$

DeepSeek-V3's family file (``models/families/deepseek_v3.py``) switches it on with
``attention="mla"``; the lightning indexer of V3.2 (``models/indexer.py``) narrows each
query's keys on top of it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math

from .. import backend
from ..attention import KVCache
from ..attention.base import causal_pattern, hookable_attention, hooked_heads
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Module
from ..nn.rotary import Rotary, yarn_mscale
from ..ops.sdpa import merge_heads, split_heads
from ..ops.shape import broadcast_to, concatenate, reshape
from .decoder_attention import norm_layer
from .indexer import IndexedLatentCache, LightningIndexer

if TYPE_CHECKING:                       # a type only: decoder.py imports this module
    from .decoder import DecoderConfig

__all__ = ["LatentDecoderAttention"]


class LatentDecoderAttention(Module):
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values come from one small
    latent per token, and the cache keeps the latent, not the keys and values.

    The formula is the module docstring's. Sizes: r = ``kv_lora_rank``,
    D_n = ``qk_nope_head_dim``, D_r = ``qk_rope_head_dim``, D_v = ``v_head_dim``; the query
    comes from x directly or through a low-rank q latent (``q_lora_rank``). The cache (a
    ``KVCache`` holding (c, R k^R), (B, 1, L, r) and (B, 1, L, D_r)) costs r + D_r numbers
    per token and layer instead of 2·H·D. ``rope_interleave``: the rotary
    dims are stored as interleaved pairs (DeepSeek's checkpoints) and read as two halves.
    ``positions="none"`` (Kimi Linear's MLA layers): R is the identity, and k^R one more key
    shared by every head.
    YaRN's ``mscale_all_dim`` multiplies the scale by its temperature squared, as DeepSeek
    does. Linear layers as HF names them: ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/
    ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj`` (the
    latents' norms use eps 1e-6, as HF's). Hook points: ``hook_q``, ``hook_k``, ``hook_v``
    (B, N, H, ·), ``hook_latent`` c (B, N, r), ``hook_attn_scores``, ``hook_pattern``,
    ``hook_z``. Time O(B·H·N·Nk·(D_n + D_r)) plus O(B·Nk·r·H·(D_n + D_v)) to expand the
    latents.

    ``index_topk`` (DeepSeek-V3.2): a ``LightningIndexer`` (``indexer``, ``models/indexer.py``)
    chooses the keys each query reads, and the scores of the others are masked; the cache is
    then an ``IndexedLatentCache``, which keeps the indexer's keys too.
    """

    def __init__(self, c: DecoderConfig):
        super().__init__()
        e, h = c.hidden_size, c.num_heads
        dn, dr, dv, r = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        self.num_heads, self.dims = h, (dn, dr, dv, r)
        self.window = None
        # queries: straight from x, or through a normalised low-rank latent
        if c.q_lora_rank is None:
            self.q_proj = Linear(e, h * (dn + dr), bias=False)
        else:
            self.q_a_proj = Linear(e, c.q_lora_rank, bias=c.qkv_bias)
            self.q_a_layernorm = norm_layer(dataclasses.replace(c, norm_eps=1e-6),
                                            c.q_lora_rank)
            self.q_b_proj = Linear(c.q_lora_rank, h * (dn + dr), bias=False)
        # keys and values: the latent c and the shared rotary key, then c expanded per head
        self.kv_a_proj_with_mqa = Linear(e, r + dr, bias=c.qkv_bias)
        self.kv_a_layernorm = norm_layer(dataclasses.replace(c, norm_eps=1e-6), r)
        self.kv_b_proj = Linear(r, h * (dn + dv), bias=False)
        self.o_proj = Linear(h * dv, e, bias=c.o_bias)
        # Kimi Linear's MLA rotates nothing (positions="none"): k^R is then one more shared key
        self.rotary = Rotary(dr, c.rope) if c.positions == "rope" else None
        self.interleaved = c.rope_interleave
        # 1/√(D_n + D_r), times YaRN's temperature squared when mscale_all_dim is set
        scale = 1.0 / math.sqrt(dn + dr)
        m_all = c.rope.get("mscale_all_dim")
        if c.rope["rope_type"] != "default" and m_all:
            scale *= yarn_mscale(c.rope["factor"], m_all) ** 2
        self.scale = scale
        self.indexer = None if c.index_topk is None else LightningIndexer(c)
        for name in ("q", "k", "v", "latent", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """The latent cache: a ``KVCache`` of (c, R k^R) per token; with the indexer an
        ``IndexedLatentCache``, which adds its keys k^I."""
        return KVCache() if self.indexer is None else IndexedLatentCache()

    def _rotate(self, x, pos):
        if self.rotary is None:
            return x
        if self.interleaved:                   # pairs (0, 1), (2, 3) … as two halves
            x = concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        return self.rotary.rotate(x, pos)

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` and ``positions`` as ``DecoderAttention``'s."""
        b, n, _ = x.shape
        h, (dn, dr, dv, r) = self.num_heads, self.dims
        xp = backend.get_array_module(x.data)
        offset = 0 if kv_cache is None else len(kv_cache)
        pos = xp.arange(offset, offset + n) if positions is None else positions
        # queries (B, H, N, D_n + D_r), split into the plain part and the rotary part
        q_latent = None if hasattr(self, "q_proj") else self.q_a_layernorm(self.q_a_proj(x))
        q = split_heads(self.q_proj(x) if q_latent is None else self.q_b_proj(q_latent), h)
        q_pass, q_rot = q[..., :dn], self._rotate(q[..., dn:], pos)
        # this step's latents c (B, 1, N, r) and rotary keys (B, 1, N, D_r), then the cache
        ckv = self.kv_a_proj_with_mqa(x)                                  # (B, N, r + D_r)
        latent = self.hook_latent(self.kv_a_layernorm(ckv[..., :r]))
        latent = reshape(latent, (b, 1, n, r))
        k_rot = self._rotate(reshape(ckv[..., r:], (b, 1, n, dr)), pos)
        if kv_cache is not None:
            latent, k_rot = kv_cache.append(latent, k_rot)                # (B, 1, L, ·)
        # expand the latents per head: keys [W^K c, R k^R], values W^V c
        nk = latent.shape[2]
        kv = split_heads(reshape(self.kv_b_proj(latent), (b, nk, h * (dn + dv))), h)
        k = concatenate([kv[..., :dn], broadcast_to(k_rot, (b, h, nk, dr))], axis=-1)
        q = concatenate([q_pass, q_rot], axis=-1)
        q, k, v = (hooked_heads(hk, t) for hk, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, kv[..., dn:])))
        # the cache holds every key from position 0: causality is bottom-right aligned
        allowed = None
        if keep is not None:
            allowed = causal_pattern(n, nk, xp) & keep[:, None, None, :]
        if self.indexer is not None:          # DSA: only the keys the indexer chooses
            if allowed is None:
                allowed = causal_pattern(n, nk, xp)
            seen = allowed if allowed.ndim == 2 else allowed[:, 0]    # (N, Nk) or (B, N, Nk)
            allowed = allowed & self.indexer(x, q_latent, seen, pos, kv_cache)[:, None]
        z, _ = hookable_attention(self, q, k, v, scale=self.scale, causal=allowed is None,
                                  mask=allowed)
        return self.o_proj(merge_heads(hooked_heads(self.hook_z, z)))   # (B, N, E)
