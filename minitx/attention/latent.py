r"""Multi-head latent attention (MLA): keys and values from one small latent per token.

DeepSeek-AI (2024), "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
Language Model", section 2.1.

A decoder's KV cache holds 2·H·D numbers per token and layer (a key and a value per head).
MLA caches one low-rank latent $c^{KV}$ of d_c numbers instead, and every head's key and value
are linear maps of it; the query goes through a low-rank latent $c^{Q}$ (d'_c) too, which
saves activations:

$$
\begin{array}{rcl}
c^{KV}_j & = & W^{DKV} x_j \\
k^C_{h,j} & = & W^{UK}_h c^{KV}_j \\
v_{h,j} & = & W^{UV}_h c^{KV}_j \\
c^{Q}_i & = & W^{DQ} x_i \\
q^C_{h,i} & = & W^{UQ}_h c^{Q}_i
\end{array}
$$

RoPE does not fit this scheme: a rotation that depends on the key's position sits between
W_UK and the query, so W_UK could no longer be folded into the query (below). MLA therefore
*decouples* positions: a few extra dimensions d_R per head carry them, with ONE RoPE key
shared by all heads (so it costs d_R numbers per token in the cache), rotated at absolute
positions i and j:

$$
\begin{array}{rcl}
q^R_{h,i} & = & \operatorname{RoPE}_i(W^{QR}_h c^{Q}_i) \\
k^R_j & = & \operatorname{RoPE}_j(W^{KR} x_j) \\
s_h(i, j) & = & \displaystyle\frac{q^C_{h,i} \cdot k^C_{h,j} + q^R_{h,i} \cdot k^R_j}
{\sqrt{D + d_R}} + M_{ij} \\
y_i & = & W^O \big[ \textstyle\sum_j \operatorname{softmax}_j(s_h(i, \cdot))\, v_{h,j}
\big]_{h=1}^{H}
\end{array}
$$

with M the mask (causal, bottom-right aligned, and any ``attn_mask``). So the per-token cache
is d_c + d_R numbers, against 2·H·D for multi-head attention (the paper: d_c = 4·D,
d_R = D/2, i.e. 4.5·D against 2·H·D; H = 128 there).

**The absorbed form** (inference). A key up-projection can move to the query side of a dot
product, and the value up-projection past the weighted sum into the output projection:

$$
\begin{array}{rcl}
\tilde{q}_{h,i} & = & (W^{UK}_h)^\top W^{UQ}_h c^{Q}_i \\
s_h(i, j) & = & \displaystyle\frac{\tilde{q}_{h,i} \cdot c^{KV}_j + q^R_{h,i} \cdot k^R_j}
{\sqrt{D + d_R}} + M_{ij} \\
\bar{o}_{h,i} & = & \textstyle\sum_j \operatorname{softmax}_j(s_h(i, \cdot))\, c^{KV}_j \\
y_i & = & \textstyle\sum_h (W^O_h W^{UV}_h)\, \bar{o}_{h,i}
\end{array}
$$

which is multi-query attention with ONE key head [c; k^R] of width d_c + d_R and ONE value
head c of width d_c: the per-head keys and values are never formed, and decoding reads only
the cached latents. ``absorbed_forward`` is this form; ``forward`` is the naive one (the
proof that they agree is ``identities()`` and ``tests/attention/test_latent.py``).
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import host_xp, manual_seed, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..ops.linalg import einsum
from ..ops.shape import broadcast_to, concatenate, expand_dims, reshape
from .base import (AttentionBase, check_heads, hookable_attention, hooked_heads, merge_heads,
                   register, repeat_kv, split_heads)

# MLA's cache keeps its latents in a KVCache's buffers (see LatentCache), and its decoupled
# key part is rotated with the same RoPE as the ``rope`` variant.
from .kv_cache import KVCache
from .positions import apply_rope

__all__ = ["LatentCache", "MultiHeadLatentAttention"]


class LatentCache:
    """MLA's decode cache: per token the latent c_KV (d_c numbers) and the shared, already
    rotated RoPE key k^R (d_R numbers) — nothing per head.

    ``append(latent, rope_k)`` with latent (B, n, d_c), rope_k (B, n, d_R) stores them after
    what is cached and returns all of them, (B, Nk, d_c) and (B, Nk, d_R) Tensors. The two are
    kept in a ``KVCache``'s two buffers as one "head", (B, 1, Nk, ·), so growth and device
    rules are KVCache's. ``len(cache)`` = tokens cached; ``reset()`` forgets them.
    """

    def __init__(self, max_len: int = None):
        self._store = KVCache(max_len)

    def reset(self) -> None:
        self._store.reset()

    def __len__(self) -> int:
        return len(self._store)

    def append(self, latent, rope_k):
        """Add latent (B, n, d_c) and rope_k (B, n, d_R); return all cached ones as Tensors."""
        if len(latent.shape) != 3 or len(rope_k.shape) != 3 or \
                tuple(latent.shape[:2]) != tuple(rope_k.shape[:2]):
            raise ValueError(f"LatentCache.append: latent must be (B, n, d_c) and rope_k "
                             f"(B, n, d_R) with the same B, n, got {tuple(latent.shape)} and "
                             f"{tuple(rope_k.shape)}")
        c, kr = (x.data if isinstance(x, Tensor) else x for x in (latent, rope_k))
        c, kr = self._store.append(c[:, None], kr[:, None])                   # (B, 1, Nk, ·)
        return c.reshape(c.shape[0], c.shape[2], c.shape[3]), \
            kr.reshape(kr.shape[0], kr.shape[2], kr.shape[3])

    @property
    def latent(self):
        """The cached latents c_KV (B, Nk, d_c) (None when empty)."""
        c = self._store.keys
        return None if c is None else c.reshape(c.shape[0], c.shape[2], c.shape[3])

    @property
    def rope_keys(self):
        """The cached rotated RoPE keys k^R (B, Nk, d_R) (None when empty)."""
        kr = self._store.values
        return None if kr is None else kr.reshape(kr.shape[0], kr.shape[2], kr.shape[3])

    def numbers_per_token(self) -> int:
        """d_c + d_R, read off what is stored (0 while empty)."""
        c, kr = self._store.keys, self._store.values
        return 0 if c is None else c.shape[3] + kr.shape[3]


def _default_rope_dim(head_dim: int) -> int:
    """The paper's d_R = D/2, rounded down to an even number, at least 2 (RoPE rotates pairs)."""
    return max(2, (head_dim // 2) // 2 * 2)


@register("mla")
class MultiHeadLatentAttention(AttentionBase):
    r"""Multi-head latent attention (DeepSeek-V2): keys and values read off one cached low-rank
    latent per token, positions carried by a decoupled RoPE part.

    Formula: the module docstring's, naive and absorbed, with heads h = 1 … H of width
    D = E/H; ``absorbed=True`` makes the absorbed form (``absorbed_forward``) ``forward``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); latent c_KV (B, N, d_c), k^R (B, N, d_R).
    ``attend(q, k, v)`` is the attention on the heads ``forward`` has formed, q = [q^C; q^R]
    (B, H, N, D + d_R), k = [k^C; k^R] (B, Hkv, Nk, D + d_R), v (B, Hkv, Nk, D) → (B, H, N, D):
    plain softmax attention with scale 1/√(width of q) (any matching widths are accepted).
    ``num_kv_heads`` Hkv < H makes W_UK, W_UV produce Hkv heads shared by groups of queries.
    Parameters: ``w_dq`` (d'_c × E), ``w_uq`` (H·D × d'_c), ``w_qr`` (H·d_R × d'_c), ``w_dkv``
    (d_c × E), ``w_uk``, ``w_uv`` (Hkv·D × d_c), ``w_kr`` (d_R × E), ``out_proj`` (E × E).
    The decode cache (``new_cache()``, a ``LatentCache``) holds c_KV and k^R only:
    ``cache_numbers_per_token()`` = d_c + d_R, against 2·H·D for ``mha``.

    Options: ``kv_rank`` d_c (default 4·D, the paper's), ``q_rank`` d'_c (default 3·d_c, the
    paper's 1536 = 3·512), ``rope_dim`` d_R (default D/2 rounded down to even, at least 2),
    ``base`` RoPE base (10000.0), ``absorbed`` (False), ``causal``, ``num_kv_heads``, ``bias``
    (on W_O only: the paper's down/up maps have none, which keeps the absorbed form a pure
    matrix product). DeepSeek-V2 also RMS-normalises c_Q and c_KV; left out here, it does not
    change the algebra.

    Complexity: {complexity}; the cache is (d_c + d_R) numbers a token (no per-head state).

    Exactness: exact — ``attend`` is exactly softmax(q kᵀ/√(D + d_R)) v on the formed heads
    under ``pattern(n)``; what makes MLA MLA (the low-rank maps, the decoupled RoPE applied at
    absolute positions, the shared k^R) happens in ``forward`` before ``attend``, as any
    projection does. kind "exact".

    Reference: DeepSeek-AI (2024), "DeepSeek-V2: A Strong, Economical, and Efficient
    Mixture-of-Experts Language Model".
    """

    complexity = ("time O(B·N·E·(d_c + d'_c) + B·H·N²·(D + d_R)), memory O(B·H·N²); "
                  "cache O(B·N·(d_c + d_R))")

    kind = "exact"
    projections = ("out",)          # q, k, v come from the latent maps below
    supports_attn_mask = True
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, num_kv_heads=None, bias=True,
                 kv_rank: int = None, q_rank: int = None, rope_dim: int = None,
                 base: float = 10000.0, absorbed: bool = False):
        super().__init__(embed_dim, num_heads, causal=causal, num_kv_heads=num_kv_heads,
                         bias=bias)
        # Ranks default to the paper's ratios (d_c = 4·D, d'_c = 3·d_c); RoPE rotates pairs of
        # coordinates, so d_R must be even.
        who, d = "mla", self.head_dim
        self.kv_rank = validate.positive_int(4 * d if kv_rank is None else kv_rank, "kv_rank",
                                             owner=who)
        self.q_rank = validate.positive_int(3 * self.kv_rank if q_rank is None else q_rank,
                                            "q_rank", owner=who)
        self.rope_dim = validate.positive_int(_default_rope_dim(d) if rope_dim is None
                                              else rope_dim, "rope_dim", owner=who)
        if self.rope_dim % 2:
            raise validate.OptionError(f"{who}: rope_dim must be even (RoPE rotates pairs), "
                                       f"got {self.rope_dim}")
        self.base = validate.positive_real(base, "base", owner=who)
        self.absorbed = validate.boolean(absorbed, "absorbed", owner=who)
        h, hkv, dc, dq, dr = (self.num_heads, self.num_kv_heads, self.kv_rank, self.q_rank,
                              self.rope_dim)
        # the paper's maps (Linear stores W as (out, in)); no bias, as in its equations
        self.w_dq = Linear(embed_dim, dq, bias=False)     # W_DQ: x → c_Q
        self.w_uq = Linear(dq, h * d, bias=False)         # W_UQ: c_Q → q^C (H heads)
        self.w_qr = Linear(dq, h * dr, bias=False)        # W_QR: c_Q → q^R (H heads)
        self.w_dkv = Linear(embed_dim, dc, bias=False)    # W_DKV: x → c_KV
        self.w_uk = Linear(dc, hkv * d, bias=False)       # W_UK: c_KV → k^C (Hkv heads)
        self.w_uv = Linear(dc, hkv * d, bias=False)       # W_UV: c_KV → v (Hkv heads)
        self.w_kr = Linear(embed_dim, dr, bias=False)     # W_KR: x → k^R (shared)
        self.hook_latent = HookPoint()        # (B, N, d_c) c_KV of this step's tokens
        self.hook_rope_k = HookPoint()        # (B, N, d_R) k^R after RoPE, this step's tokens
        self.hook_attn_scores = HookPoint()   # (B, H, N, Nk) s_h, −inf masked
        self.hook_pattern = HookPoint()       # (B, H, N, Nk) softmax of the scores

    # ---- the cache ------------------------------------------------------------------------
    def new_cache(self):
        """An empty ``LatentCache`` (c_KV and k^R per token) for ``forward(x, kv_cache=…)``."""
        return LatentCache()

    def cache_numbers_per_token(self) -> int:
        """Numbers cached per token and layer: d_c + d_R (``mha`` caches 2·H·D)."""
        return self.kv_rank + self.rope_dim

    # ---- the shared first steps: queries and the latent -----------------------------------
    def _check(self, x, kv_cache):
        who = type(self).__name__
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        if kv_cache is not None and not isinstance(kv_cache, LatentCache):
            raise ValueError(f"{who} (mla): kv_cache must be the LatentCache that new_cache() "
                             f"makes, got a {type(kv_cache).__name__}")
        return 0 if kv_cache is None else len(kv_cache)

    def _latents(self, x, offset, kv_cache):
        """c_Q (B, N, d'_c), q^R (B, H, N, d_R), and the latent c_KV (B, Nk, d_c) and rotated
        k^R (B, Nk, d_R) of every key (this step's appended to ``kv_cache`` when given).
        Token i of x sits at position offset + i."""
        c_q = self.w_dq(x)                                                    # (B, N, d'_c)
        q_r = split_heads(self.w_qr(c_q), self.num_heads)                     # (B, H, N, d_R)
        q_r = apply_rope(q_r, offset=offset, base=self.base)
        # the latent and the one shared RoPE key: all a token leaves in the cache
        c_kv = self.hook_latent(self.w_dkv(x))                                # (B, N, d_c)
        k_r = self.hook_rope_k(apply_rope(self.w_kr(x), offset=offset, base=self.base))
        if kv_cache is not None:
            c_kv, k_r = kv_cache.append(c_kv, k_r)                            # (B, Nk, d_c|d_R)
        return c_q, q_r, c_kv, k_r

    def _head_hooks_active(self) -> bool:
        return any(p.active for p in (self.hook_q, self.hook_k, self.hook_v, self.hook_z))

    # ---- the naive form: form every head's key and value ----------------------------------
    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E). ``attn_mask`` (bool True = may attend, or float added;
        broadcastable to (B, H, N, Nk)); ``kv_cache``: a ``LatentCache`` (this step's latents
        are appended, the queries attend to all cached tokens, bottom-right causal).

        With ``absorbed=True`` this runs ``absorbed_forward`` (equal values), unless one of
        ``hook_q/k/v/z`` is set: the absorbed form never forms those heads, so the naive form
        runs and the hooks see and may replace them (as the fused attention gives way to the
        composed one when a pattern hook is set)."""
        if self.absorbed and not self._head_hooks_active():
            return self.absorbed_forward(x, attn_mask=attn_mask, kv_cache=kv_cache)
        offset = self._check(x, kv_cache)
        c_q, q_r, c_kv, k_r = self._latents(x, offset, kv_cache)
        b, nk = c_kv.shape[0], c_kv.shape[1]
        # up-projections: every head's content query, key and value
        q_c = split_heads(self.w_uq(c_q), self.num_heads)                     # (B, H, N, D)
        k_c = split_heads(self.w_uk(c_kv), self.num_kv_heads)                 # (B, Hkv, Nk, D)
        v = split_heads(self.w_uv(c_kv), self.num_kv_heads)                   # (B, Hkv, Nk, D)
        # heads of width D + d_R: q = [q^C; q^R], k = [k^C; k^R] with k^R in every key head
        k_r = broadcast_to(expand_dims(k_r, 1), (b, self.num_kv_heads, nk, self.rope_dim))
        q = concatenate([q_c, q_r], axis=-1)                                  # (B, H, N, D + d_R)
        k = concatenate([k_c, k_r], axis=-1)                                  # (B, Hkv, Nk, D+d_R)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        y = self.attend(q, k, v, attn_mask=attn_mask)                         # (B, H, N, D)
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def attend(self, q, k, v, attn_mask=None):
        """Softmax attention on formed heads: q (B, H, Nq, Dqk), k (B, Hkv, Nk, Dqk),
        v (B, Hkv, Nk, Dv) → (B, H, Nq, Dv), scale 1/√Dqk (= 1/√(D + d_R) from ``forward``)."""
        check_heads(q, k, v, f"{self.name}.attend")
        out, _ = hookable_attention(self, q, k, v, scale=1.0 / math.sqrt(q.shape[-1]),
                                    causal=self.causal, mask=attn_mask)
        return out

    # ---- the absorbed form: attention over the latents ------------------------------------
    def absorbed_weights(self):
        """The absorbed form's two folded matrices (module docstring), as differentiable
        Tensors: W_QK (H, d_c, d'_c), the query's, and W_OV (H, E, d_c), the output's."""
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        # per-head blocks of the up-projections; W_UK, W_UV repeated over a query group
        w_uq = reshape(self.w_uq.weight, (h, d, self.q_rank))                 # (H, D, d'_c)
        w_uk = reshape(self.w_uk.weight, (1, hkv, d, self.kv_rank))
        w_uk = reshape(repeat_kv(w_uk, h), (h, d, self.kv_rank))              # (H, D, d_c)
        w_uv = reshape(self.w_uv.weight, (1, hkv, d, self.kv_rank))
        w_uv = reshape(repeat_kv(w_uv, h), (h, d, self.kv_rank))              # (H, D, d_c)
        w_o = reshape(self.out_proj.weight, (self.embed_dim, h, d))           # (E, H, D)
        # the two folds of the absorbed form (module docstring)
        w_qk = einsum("hdc,hdq->hcq", w_uk, w_uq)                             # (H, d_c, d'_c)
        w_ov = einsum("ehd,hdc->hec", w_o, w_uv)                              # (H, E, d_c)
        return w_qk, w_ov

    def absorbed_forward(self, x, attn_mask=None, kv_cache=None):
        """The inference form, equal to ``forward``: multi-query attention over the latents
        (one key head [c_KV; k^R], one value head c_KV); the per-head keys and values are never
        formed. Arguments as ``forward``. Hooks: ``hook_latent``, ``hook_rope_k``,
        ``hook_attn_scores``, ``hook_pattern`` see what they see in ``forward``;
        ``hook_q/k/v/z`` have no counterpart here, and setting one raises (``forward`` then
        takes the naive form instead)."""
        if self._head_hooks_active():
            raise ValueError("mla.absorbed_forward: hook_q/k/v/z are not formed in the absorbed "
                             "form; call forward (it takes the naive form when they are set)")
        offset = self._check(x, kv_cache)
        c_q, q_r, c_kv, k_r = self._latents(x, offset, kv_cache)
        w_qk, w_ov = self.absorbed_weights()
        # the query in latent space, q̃_h, then [q̃; q^R] against [c; k^R]
        q_lat = einsum("bnq,hcq->bhnc", c_q, w_qk)                            # (B, H, N, d_c)
        q = concatenate([q_lat, q_r], axis=-1)                                # (B, H, N, d_c+d_R)
        k = expand_dims(concatenate([c_kv, k_r], axis=-1), 1)                 # (B, 1, Nk, d_c+d_R)
        v = expand_dims(c_kv, 1)                                              # (B, 1, Nk, d_c)
        # the score is still over √(D + d_R): the same numbers as the naive form's
        o_lat, _ = hookable_attention(self, q, k, v, scale=1.0 / math.sqrt(
            self.head_dim + self.rope_dim), causal=self.causal, mask=attn_mask)  # (B,H,N,d_c)
        y = einsum("bhnc,hec->bne", o_lat, w_ov)                              # (B, N, E)
        return y if self.out_proj.bias is None else y + self.out_proj.bias

    # ---- the proofs the site shows --------------------------------------------------------
    @classmethod
    def identities(cls, seed=0):
        """(claim, value, limit): the absorbed form equals the naive one, decoding through the
        latent cache equals the full forward (both forms), and the cache size, in float64."""
        e, h, kv_rank, rope_dim = 32, 4, 16, 4
        manual_seed(seed)
        layer = cls(e, h, causal=True, kv_rank=kv_rank, q_rank=24, rope_dim=rope_dim).double()
        x_host = host_xp.random.default_rng(seed).standard_normal((2, 9, e))
        x = Tensor(active_xp().asarray(x_host))
        with no_grad():
            naive = to_host(layer(x).data)
            absorbed = to_host(layer.absorbed_forward(x).data)
            # a prefill of 4 tokens, then one at a time, through the latent cache (both forms)
            decoded = {}
            for form in ("naive", "absorbed"):
                layer.absorbed, cache = form == "absorbed", layer.new_cache()
                steps = [layer(x[:, :4], kv_cache=cache)] + \
                    [layer(x[:, t:t + 1], kv_cache=cache) for t in range(4, 9)]
                decoded[form] = host_xp.concatenate([to_host(s.data) for s in steps], axis=1)
            layer.absorbed = False
        # What ``mha`` caches per token, to compare: keys and values, H heads of D = E/H each.
        mha = 2 * h * (e // h)
        return [("absorbed form − naive form, max |Δ| (float64)",
                 float(abs(absorbed - naive).max()), 1e-12),
                ("decoding through the latent cache (naive) − full forward, max |Δ|",
                 float(abs(decoded["naive"] - naive).max()), 1e-12),
                ("decoding through the latent cache (absorbed) − full forward, max |Δ|",
                 float(abs(decoded["absorbed"] - naive).max()), 1e-12),
                (f"cache numbers per token d_c + d_R = {kv_rank} + {rope_dim} (mha: 2·H·D)",
                 float(layer.cache_numbers_per_token()), float(mha))]
