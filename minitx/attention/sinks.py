r"""Attention sinks (StreamingLLM): the first few tokens and a sliding window, in a bounded cache.

Xiao et al. (2023) noticed that trained language models put a large share of every row's
attention on the first few tokens of the text, whatever those tokens say: softmax must put its
mass somewhere, and the first tokens, seen by every later query, become the place ("attention
sinks"). Plain window attention evicts them once the text outgrows the window, and the model
falls apart. Keeping the first s tokens *and* the last w ones fixes it, so a model can decode
an unbounded stream with a bounded cache.

**The pattern** (the training-time form, causal): query i may see key j iff j ≤ i and (j < s
or i − j < w), s = ``num_sinks``, w = ``window`` (the window counts the query itself) —
``sink_rule``, built on ``masks.local_rule``. Without ``causal`` the window is two-sided,
|i − j| < w, and the sinks are seen by every query.

**The rolling cache** (``SinkCache``): after t tokens it holds the positions
[0, s) ∪ [t − w + 1, t) — never more than s + w − 1 entries. The next query, at position t,
needs exactly those and itself: every evicted key is outside its pattern.

**Positions inside the cache.** The paper applies RoPE by the slot a token holds *in the
cache*, not by its place in the text: with s = 4, w = 4 and the cache [0 1 2 3 | 6 7 8]
decoding token 9, the positions used are 0 … 7. So the keys are cached un-rotated and rotated
at attention time by their slot; the query by its own slot, c(i) = min(i, s + w − 1). A RoPE
score depends only on the difference of the two slots (``positions.py``:
⟨R_a q, R_b k⟩ = ⟨q, R_{b−a} k⟩), d_ij, so the layer computes, with R_d the rotation by d:

$$
O = \operatorname{softmax}\!\left( S + M \right) V, \quad
S_{ij} = \frac{\langle q_i, R_{-d_{ij}}\, k_j \rangle}{\sqrt{D}}, \quad
M_{ij} = \begin{cases} 0 & j \le i \ \text{and}\ \left( j < s \ \text{or}\ i - j < w \right) \\
-\infty & \text{otherwise} \end{cases}
$$

$$
d_{ij} = c(i) - \mathrm{slot}_i(j) =
\begin{cases} \min(i,\ s + w - 1) - j & j < s \ \text{(a sink, slot } j) \\
i - j & j \ge s \ \text{(a window key)} \end{cases}
$$

The training-time form uses the same d_ij, so it computes two blocks of scores: the sink
columns with the query rotated by c(i) and key j by j; the window columns with both rotated by
their position (only i − j counts; the positions are shifted so that the last query sits at its
slot s + w − 1: in one-token decoding every angle is then a cache slot, bounded by s + w).
Row i of that form uses exactly the keys and the rotations the cache holds when token i is
decoded, so decoding through the cache equals the full forward at every length — not only
while the window still holds every token (tested through GPT in float64, 8× the window past
``block_size``).

``rope=False`` leaves the positions out (S = Q Kᵀ/√D): then the layer is exact under
``pattern(n)`` (kind "masked"), and a model needs positions of its own.

**Differences from the official code** (StreamingLLM's ``StartRecentKVCache`` and its
position-shifted attention):

- ``window`` w is StreamingLLM's ``recent_size`` + 1: minitx counts the query itself, so a
  decoded token sees the s sinks, the w − 1 tokens before it and itself, s + w keys in all
  (``start_size`` + ``recent_size`` + 1 there).
- Adopted: between steps the cache holds at most s + w − 1 entries, the sinks and the last
  w − 1 tokens, as StreamingLLM's after its eviction (``start_size`` + ``recent_size``);
  nothing it holds goes unread by the next query.
- A prompt of several tokens (a prefill through the cache) applies the sink and window
  pattern inside the chunk by default (``prefill="pattern"``), so that any split into chunks
  gives the full forward's numbers. StreamingLLM runs the prompt densely: each of its tokens
  sees every earlier token of the prompt and the cache, RoPE by cache slot.
  ``prefill="dense"`` does that. The two are the same for one-token steps and for a first
  chunk of at most s + w tokens, and differ beyond (tested: max |Δ| from 0.16 to 0.57 in the
  outputs of a small float64 layer, s = 2, w = 3).
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.tensor import Tensor
from ..backend import device_of, get_array_module, host_xp, to_device_of, to_host
from ..nn.hooks import HookPoint
from ..ops.activation import softmax
from ..ops.indexing import getitem, masked_fill
from ..ops.linalg import matmul
from ..ops.shape import concatenate, swapaxes
from .base import (AttentionBase, check_heads, hooked_heads, merge_heads, register, repeat_kv,
                   repeat_kv_array, softmax_rows_array)
from .masks import grid_mask, local_rule
from .positions import apply_rope

__all__ = ["sink_rule", "sink_mask", "sink_distances", "SinkCache", "SinkAttention"]


# ---- the pattern and the distances -------------------------------------------------------

def sink_rule(i, j, num_sinks: int, window: int, causal: bool = True):
    """StreamingLLM's pattern on broadcast position arrays: the first ``num_sinks`` keys and
    the last ``window`` ones, i − j < window (two-sided when not causal); j ≤ i when causal."""
    near = local_rule(i, j, window - 1, causal)          # 0 ≤ i − j ≤ w − 1 (or |i − j| ≤ w − 1)
    sink = (j < num_sinks) & (j <= i) if causal else (j < num_sinks)
    return near | sink


def sink_mask(n: int, num_sinks: int = 4, window: int = 16, causal: bool = True):
    """(n, n) host bool mask of ``sink_rule`` (True = may attend): tests and pictures."""
    validate.nonnegative_int(num_sinks, "num_sinks", owner="sink_mask")
    validate.positive_int(window, "window", owner="sink_mask")
    return grid_mask(n, sink_rule, num_sinks=num_sinks, window=window, causal=causal)


def sink_distances(i, j, num_sinks: int, window: int):
    """The module docstring's d_ij = c(i) − slot_i(j), the RoPE distance of the cache
    convention, on broadcast position arrays."""
    xp = get_array_module(i, j)
    return xp.where(j < num_sinks, xp.minimum(i, num_sinks + window - 1) - j, i - j)


def _keys_t(k):
    """(B, H, Nk, D) → (B, H, D, Nk): keys ready for q @ kᵀ."""
    return swapaxes(k, -1, -2)


def _columns(k, start, stop):
    """Keys start … stop − 1 of (B, H, Nk, D), differentiable."""
    return getitem(k, (slice(None), slice(None), slice(start, stop)))


# ---- the rolling cache -------------------------------------------------------------------

class SinkCache:
    """The rolling key/value cache of one sink-attention layer: the first ``num_sinks`` tokens
    and the last ``window`` − 1, at most s + w − 1 entries (all the next query reads besides
    itself), keys un-rotated (RoPE is applied at attention time, by cache slot).

    ``update(k, v)`` with k (B, Hkv, n, D), v (B, Hkv, n, Dv) returns what the n new queries
    may see — the held entries then the new ones, as Tensors (B, Hkv, m + n, ·), and their
    text positions (a host int array) — and then evicts all but the sinks and the last
    ``window`` − 1. ``len(cache)`` is the number of tokens seen (the position the next token
    takes); ``size`` the entries held (≤ s + w − 1); ``positions`` their text positions. Each
    update copies O(B·Hkv·(s + w + n)·D) (a ring buffer would avoid the copy; this is the
    reference). Holds raw arrays: for inference, no gradients flow through it.
    """

    def __init__(self, num_sinks: int = 4, window: int = 16):
        self.num_sinks = validate.nonnegative_int(num_sinks, "num_sinks", owner="SinkCache")
        self.window = validate.positive_int(window, "window", owner="SinkCache")
        self.reset()

    def reset(self) -> None:
        """Forget everything cached."""
        self._k = self._v = None
        self.seen = 0
        self.positions = host_xp.zeros(0, dtype=host_xp.int64)

    def __len__(self) -> int:
        return self.seen

    @property
    def size(self) -> int:
        """Entries held: min(tokens seen, num_sinks + window − 1)."""
        return int(self.positions.shape[0])

    @property
    def keys(self):
        """The held keys (B, Hkv, size, D), un-rotated, as a Tensor (None when empty)."""
        return None if self._k is None else Tensor._wrap(self._k)

    @property
    def values(self):
        """The held values (B, Hkv, size, Dv) as a Tensor (None when empty)."""
        return None if self._v is None else Tensor._wrap(self._v)

    def _check(self, k, v):
        """Refuse badly shaped keys/values; move host arrays to the cache's device (once)."""
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"SinkCache.update: k and v must be (B, Hkv, n, D) with the same "
                             f"first three dims, got k {tuple(k.shape)}, v {tuple(v.shape)}")
        if self._k is None:
            return k, v
        # later keys must live where the first did and match their (B, Hkv, ·, D)
        k, v = to_device_of(k, self._k), to_device_of(v, self._k)
        if device_of(k) != device_of(self._k):
            raise ValueError(f"SinkCache.update: the cache is on the {device_of(self._k)}, "
                             f"the new keys on the {device_of(k)}")
        if k.shape[:2] != self._k.shape[:2] or k.shape[3] != self._k.shape[3] or \
                v.shape[3] != self._v.shape[3]:
            raise ValueError(f"SinkCache.update: expected k of shape (B, Hkv, n, D) = "
                             f"{self._k.shape[:2] + ('n', self._k.shape[3])}, got "
                             f"{tuple(k.shape)}")
        return k, v

    def update(self, k, v):
        """Add k (B, Hkv, n, D), v (B, Hkv, n, Dv); return (keys, values, positions) of the
        held entries followed by the new ones; then keep only the sinks and the last w − 1."""
        k, v = (a.data if isinstance(a, Tensor) else a for a in (k, v))
        k, v = self._check(k, v)
        xp = get_array_module(k)
        n = k.shape[2]
        # what this step's queries may see: held entries, then the new ones (positions ascend)
        positions = host_xp.concatenate([self.positions,
                                         host_xp.arange(self.seen, self.seen + n)])
        keys = k if self._k is None else xp.concatenate([self._k, k], axis=2)
        values = v if self._v is None else xp.concatenate([self._v, v], axis=2)
        self.seen += n
        # evict: keep the sinks and the last w − 1 of the rest, all that the next query reads
        total = positions.shape[0]
        ns = min(self.num_sinks, total)
        start = max(ns, total - (self.window - 1))
        self._k = xp.concatenate([keys[:, :, :ns], keys[:, :, start:]], axis=2)
        self._v = xp.concatenate([values[:, :, :ns], values[:, :, start:]], axis=2)
        self.positions = host_xp.concatenate([positions[:ns], positions[start:]])
        return Tensor._wrap(keys), Tensor._wrap(values), positions


# ---- the registered variant --------------------------------------------------------------

@register("sink")
class SinkAttention(AttentionBase):
    r"""Attention sinks (StreamingLLM): causal softmax attention to the first s tokens and the
    last w, RoPE by cache slot, decoded through a cache of at most s + w − 1 entries.

    Formula: the module docstring's O = softmax(S + M) V, the sink and window mask M and the
    RoPE score S at the cache-slot distance d_ij (``rope=False``: S = Q Kᵀ/√D); its
    differences from the official code are listed there.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, Nq, D),
    k/v (B, Hkv, Nk, D) → (B, H, Nq, D) (queries at the last Nq positions); scores
    (B, H, Nq, Nk) as two blocks, sink columns then window columns; cache
    (B, Hkv, ≤ s + w − 1, D). Hooks: ``hook_mask`` (Nq, Nk) bool, ``hook_attn_scores`` S
    (−inf outside the pattern), ``hook_pattern`` the softmax, with O = pattern · V. RoPE needs
    an even head dim D.

    Options: ``num_sinks`` s (default 4), ``window`` w (16, counting the token itself),
    ``rope`` (True), ``base`` (RoPE's, 10000.0), ``prefill`` ("pattern": a chunk through the
    cache is attended under the sink pattern, as the full forward; "dense": StreamingLLM's
    dense prompt), ``causal`` (False; the cache needs True), ``num_kv_heads``, ``bias``.

    Complexity: {complexity}; the training-time form is dense under its mask.

    Exactness: exact under its sparsity mask with ``rope=False`` (equals dense softmax under
    ``pattern(n)``, kind "masked"); with RoPE (the default) a different score function, tested
    against its own dense formula (``reference``), kind "score".

    Reference: Xiao, Tian, Chen, Han & Lewis (2023), "Efficient Streaming Language Models with
    Attention Sinks".

    Beyond the registry contract: ``new_cache()`` gives a ``SinkCache``, and
    ``forward(x, kv_cache=cache)`` decodes through it (causal only). ``bounded_cache = True``
    (a class attribute a model may read): the cache never holds more than s + w − 1 entries,
    so ``GPT.generate`` keeps decoding through it past ``block_size`` instead of cropping the
    context (with ``position`` "none" or "sinusoidal").
    """

    complexity = ("time O(B·H·N²·D), memory O(B·H·N²); decoding O(B·H·(s + w)·D) per token, "
                  "cache O(B·Hkv·(s + w)·D)")

    # "masked" for an instance with rope=False; the cache never outgrows s + w − 1 entries
    kind = "score"
    supports_kv_cache = True
    bounded_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, num_sinks: int = 4, window: int = 16,
                 rope: bool = True, base: float = 10000.0, prefill: str = "pattern",
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        # the options, each checked by name
        self.num_sinks = validate.nonnegative_int(num_sinks, "num_sinks", owner="sink")
        self.window = validate.positive_int(window, "window", owner="sink")
        self.rope = validate.boolean(rope, "rope", owner="sink")
        self.base = validate.positive_real(base, "base", owner="sink")
        self.prefill = validate.choice(prefill, "prefill", ("pattern", "dense"), owner="sink")
        if self.rope and self.head_dim % 2:
            raise validate.OptionError(f"sink: rope=True needs an even head dim "
                                       f"embed_dim/num_heads, got {self.head_dim}")
        if not self.rope:
            self.kind = "masked"              # plain softmax under pattern(n)
        # the hook points: the mask on these positions, the scores, the softmax map
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.hook_mask = HookPoint()          # (Nq, Nk) bool, True = may attend
        self.hook_attn_scores = HookPoint()   # (B, H, Nq, Nk) S, −inf outside the pattern
        self.hook_pattern = HookPoint()       # (B, H, Nq, Nk) softmax(S), 0 outside

    def pattern(self, n: int):
        """(n, n) host bool mask of the sink pattern (True = may attend)."""
        return grid_mask(n, sink_rule, num_sinks=self.num_sinks, window=self.window,
                         causal=self.causal)

    def new_cache(self):
        """An empty ``SinkCache`` with this layer's sinks and window."""
        return SinkCache(self.num_sinks, self.window)

    def attend(self, q, k, v):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D) → (B, H, Nq, D); keys at positions 0 … Nk − 1,
        queries at the last Nq of them."""
        nk, nq = k.shape[2], q.shape[2]
        return self._attend(q, k, v, host_xp.arange(nk - nq, nk), host_xp.arange(nk))

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); with ``kv_cache`` (a ``SinkCache``) the N new tokens attend
        to the held sinks and window and to each other, and the cache is updated."""
        if kv_cache is None:
            return super().forward(x, attn_mask)
        # decoding: only a causal layer with its own rolling cache
        if not isinstance(kv_cache, SinkCache):
            raise validate.OptionError(f"sink: kv_cache must be a SinkCache (layer.new_cache()),"
                                       f" got a {type(kv_cache).__name__}")
        if not self.causal or attn_mask is not None:
            raise validate.OptionError("sink: decoding through a SinkCache needs causal=True "
                                       f"and no attn_mask, got causal={self.causal}, "
                                       f"attn_mask {'given' if attn_mask is not None else None}")
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"SinkAttention: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        # project and hook as AttentionBase.forward does
        q, k, v = self.project(x)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        # keys/values the new queries may see, and their text positions (host ints)
        k, v, kpos = kv_cache.update(k, v)                           # (B, Hkv, m + N, D)
        if self.prefill == "dense" and x.shape[1] > 1:
            # StreamingLLM's prompt: causal over everything held, text positions → cache slots
            slots = host_xp.arange(kpos.shape[0])
            y = self._attend(q, k, v, slots[-x.shape[1]:], slots, dense=True)
        else:
            y = self._attend(q, k, v, kpos[-x.shape[1]:], kpos)
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def _rotated(self, q, k, qpos, kpos):
        """(q rotated by ``qpos``, kᵀ rotated by ``kpos``), or unrotated with ``rope=False``."""
        if self.rope:
            q, k = apply_rope(q, qpos, base=self.base), apply_rope(k, kpos, base=self.base)
        return q, _keys_t(k)

    def _scores(self, q, k, qpos, kpos):
        """The module docstring's S (B, H, Nq, Nk), RoPE at the cache-slot distances d_ij;
        ``kpos`` ascending, so the sink keys (positions < s) are its first columns."""
        if not self.rope:
            return matmul(q, _keys_t(k)) * self.scale                   # (B, H, Nq, Nk)
        s, last = self.num_sinks, self.num_sinks + self.window - 1
        ns = int((kpos < s).sum())
        blocks = []
        # sink columns: the query at its slot c(i) = min(i, s + w − 1), sink key j at slot j
        if ns:
            q_sink = apply_rope(q, host_xp.minimum(qpos, last), base=self.base)
            k_sink = apply_rope(_columns(k, 0, ns), kpos[:ns], base=self.base)
            blocks.append(matmul(q_sink, _keys_t(k_sink)))              # (B, H, Nq, ns)
        # window columns: only i − j matters; shift so that the last query is at slot s + w − 1
        if ns < kpos.shape[0]:
            off = max(0, int(qpos[-1]) - last)
            q_win = apply_rope(q, qpos - off, base=self.base)
            k_win = apply_rope(_columns(k, ns, None), kpos[ns:] - off, base=self.base)
            blocks.append(matmul(q_win, _keys_t(k_win)))                # (B, H, Nq, Nk − ns)
        scores = blocks[0] if len(blocks) == 1 else concatenate(blocks, axis=-1)
        return scores * self.scale

    def _attend(self, q, k, v, qpos, kpos, dense: bool = False):
        """Softmax attention under the sink pattern for queries at text positions ``qpos``
        (Nq,) and keys at ``kpos`` (Nk,), both host int arrays, ascending. ``dense``: causal
        attention to every key instead, ``qpos`` and ``kpos`` being cache slots (RoPE by
        them), StreamingLLM's prompt."""
        _, h, _, _, _, _ = check_heads(q, k, v, f"{self.name}.attend")
        k, v = repeat_kv(k, h), repeat_kv(v, h)                         # (B, H, Nk, D)
        # the pattern on these positions, moved once to the data's device
        if dense:
            allowed = qpos[:, None] >= kpos[None, :]
            scores = matmul(*self._rotated(q, k, qpos, kpos)) * self.scale
        else:
            allowed = sink_rule(qpos[:, None], kpos[None, :], self.num_sinks, self.window,
                                self.causal)
            scores = self._scores(q, k, qpos, kpos)
        allowed = self.hook_mask(Tensor._wrap(to_device_of(allowed, q.data))).data   # (Nq, Nk)
        scores = masked_fill(scores, ~allowed, -math.inf)
        scores = self.hook_attn_scores(scores)                          # (B, H, Nq, Nk)
        pattern = self.hook_pattern(softmax(scores, axis=-1))           # a row: sums to 1
        return matmul(pattern, v)                             # (B, H, Nq, Nk) @ (B, H, Nk, D)

    def reference(self, q, k, v):
        """Raw arrays: the dense formula, each score written with its distance d_ij as a
        phase: pairs as complex numbers, S_ij = Re Σ_t q_it conj(k_jt) e^{i d_ij θ_t}/√D,
        θ_t = base^(−2t/D); softmax under the sink pattern. (B, H, Nq, D)."""
        xp = get_array_module(q)
        k, v = repeat_kv_array(k, q.shape[1]), repeat_kv_array(v, q.shape[1])
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        i, j = xp.arange(nk - nq, nk)[:, None], xp.arange(nk)[None, :]
        # RoPE at distance d as a phase: ⟨R_a q, R_b k⟩ = Re Σ_t q_t conj(k_t) e^{i(a − b)θ_t}
        if self.rope:
            dist = sink_distances(i, j, self.num_sinks, self.window)     # (Nq, Nk)
            theta = self.base ** (-2.0 * xp.arange(d // 2) / d)           # (D/2,)
            qc, kc = q[..., 0::2] + 1j * q[..., 1::2], k[..., 0::2] + 1j * k[..., 1::2]
            phase = xp.exp(1j * dist[:, :, None] * theta)                # (Nq, Nk, D/2)
            s = xp.einsum("bhit,bhjt,ijt->bhij", qc, kc.conj(), phase).real / math.sqrt(d)
        else:
            s = xp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
        # the softmax under the sink pattern
        allowed = sink_rule(i, j, self.num_sinks, self.window, self.causal)
        return softmax_rows_array(s, allowed) @ v

    @classmethod
    def identities(cls, seed: int = 0):
        """Small float64 checks of the sink variant's own identities: (claim, value, limit)."""
        g = host_xp.random.default_rng(seed)
        s, w, n = 2, 4, 18
        layer = cls(8, 2, causal=True, num_sinks=s, window=w).to(dtype="float64").eval()
        # decode n = 3(s + w) tokens one at a time through the rolling cache
        x = g.standard_normal((1, n, 8))
        full = layer(Tensor(x)).numpy()
        cache, steps, held = layer.new_cache(), [], 0
        for t in range(n):
            steps.append(layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy())
            held = max(held, cache.size)
        steps = host_xp.concatenate(steps, axis=1)
        # the last query by hand: keys rotated by their cache slot 0 … s + w − 1, query by
        # s + w − 1, a plain softmax over the s + w held keys
        q, k, v = (g.standard_normal((1, 2, n, 4)) for _ in range(3))
        out = layer.attend(*(Tensor(a) for a in (q, k, v))).numpy()
        # the last query reads positions [0, s) ∪ [n − w, n): the cache then itself
        held_pos = host_xp.r_[0:s, n - w:n]
        kr = apply_rope(k[:, :, held_pos], host_xp.arange(s + w))
        qr = apply_rope(q[:, :, -1:], host_xp.asarray([s + w - 1]))
        e = host_xp.exp(qr @ kr.swapaxes(-1, -2) / 2.0)                # 1/√D = 1/2
        by_slot = (e / e.sum(-1, keepdims=True)) @ v[:, :, held_pos]
        ref = to_host(layer.reference(*(Tensor(a).data for a in (q, k, v))))
        return [(f"decoding {n} tokens through the rolling cache − full forward, max |Δ|",
                 float(host_xp.abs(steps - full).max()), 1e-12),
                (f"most entries the cache held over {n} tokens (s + w − 1 = {s + w - 1})",
                 float(held), float(s + w - 1)),
                ("last row with keys rotated by cache slot − the training-time form, max |Δ|",
                 float(host_xp.abs(by_slot[:, :, 0] - out[:, :, -1]).max()), 1e-12),
                ("attend − dense formula (reference), max |Δ|",
                 float(host_xp.abs(out - ref).max()), 1e-12)]
