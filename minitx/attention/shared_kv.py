r"""Keys and values shared across layers: a later layer keeps its own queries but attends to
the keys and values an earlier layer computed (Gemma 4's last layers; Brandon et al. 2024,
"Reducing Transformer Key-Value Cache Size with Cross-Layer Attention").

Layer ℓ's own queries Q^{(ℓ)} read the keys and values of its *source* layer s(ℓ) ≤ ℓ, which
computed them from its own input (a producer is its own source, s(ℓ) = ℓ):

$$
O^{(\ell)} = \operatorname{softmax}\!\left( \frac{Q^{(\ell)} K^{(s(\ell))\top}}{\sqrt{D}} + M
\right) V^{(s(\ell))}, \qquad
K^{(s)} = X^{(s)} W_K^{(s)}, \quad V^{(s)} = X^{(s)} W_V^{(s)}
$$

with M the causal mask (bottom-right when keys are cached). A consumer has no key or value
projection at all; its gradient reaches the source's W_K and W_V through the shared K and V.

**The cache.** Only a producer caches keys and values, 2·Hkv·D numbers per token; a consumer
counts its tokens and holds nothing (``SharedKVCache``), and reads the producer's keys as they
stand after the producer's step. Sharing one producer among L_s consumers cuts a model's
cache by the consumers' share: Gemma 4 E2B shares 20 of its 35 layers' caches.

**Cost.** Each layer's attention is exact, O(B·H·N²·D) time and O(B·H·N²) for the scores; a
consumer saves the two projections, 2·E·Hkv·D multiply-adds a token.

**Use.** ``producer = SharedKVAttention(E, H, causal=True)`` is plain attention that also
keeps its last (K, V) in ``shared``; ``consumer = SharedKVAttention(E, H, causal=True,
source=producer)`` reads them, so the producer's forward must run first in each step (as
the layers of a model run in order). The decoder's ``kv_shared_layers`` does the same for its
last layers.
"""
from __future__ import annotations

from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import host_xp, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from .base import PROJECTIONS, dense_attention_array, hooked_heads, merge_heads, register, \
    split_heads
from .exact import ExactSelfAttention
from .kv_cache import KVCache

__all__ = ["SharedKVCache", "SharedKVAttention"]


class SharedKVCache:
    """The cache of a layer that borrows its keys and values: it counts the tokens seen and
    holds no number (``len()`` is the count, as every cache's; ``numbers`` is 0)."""

    numbers = 0
    keys = values = None         # what a cache of keys shows: here, none

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget the tokens seen."""
        self.length = 0
        self.offset = 0          # position of the first token of the last step

    def __len__(self) -> int:
        return self.length

    def advance(self, n: int) -> None:
        """Count n more tokens (the step's)."""
        self.offset, self.length = self.length, self.length + n


@register("shared_kv")
class SharedKVAttention(ExactSelfAttention):
    r"""Attention whose keys and values may be an earlier layer's (module docstring).

    Formula: the module docstring's. Without ``source`` the layer is a producer: plain exact
    attention (``mha``'s) that keeps its last keys and values, after its cache, in ``shared``
    ((K, V), each (B, Hkv, Nk, D)). With ``source`` (a producing ``SharedKVAttention`` of the
    same Hkv and D) it is a consumer: ``q_proj`` and ``out_proj`` only, attending to
    ``source.shared``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)`` as ``mha``'s. Hook
    points: ``hook_q``, ``hook_k``/``hook_v`` (a consumer's show the borrowed keys, (B, Nk,
    Hkv, D)), ``hook_z``, and ``hook_shared`` on a producer (its K as it is handed on).

    Options: ``source`` (None), ``causal`` (False), ``num_kv_heads``, ``bias``, ``dropout``.

    Complexity: {complexity}.

    Exactness: exact (a producer equals ``mha``; a consumer equals softmax attention of its
    queries over the source's keys and values).

    Reference: Brandon, Mishra, Nrusimha, Panda & Ragan-Kelley (2024), "Reducing Transformer
    Key-Value Cache Size with Cross-Layer Attention"; Gemma 4's ``num_kv_shared_layers``.
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²); a consumer caches nothing"

    def __init__(self, embed_dim, num_heads, causal=False, source=None, **options):
        who = type(self).__name__
        if source is not None and (not isinstance(source, SharedKVAttention) or
                                   source.source is not None):
            raise validate.OptionError(f"{who}: source must be a producing SharedKVAttention "
                                       f"(one without a source), got {type(source).__name__}"
                                       + (" with a source" if isinstance(
                                           source, SharedKVAttention) else ""))
        # a consumer owns no key or value projection (set before the base builds them)
        object.__setattr__(self, "projections", ("q", "out") if source is not None
                           else PROJECTIONS)
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        if source is not None and (source.num_kv_heads, source.head_dim) != \
                (self.num_kv_heads, self.head_dim):
            raise validate.OptionError(
                f"{who}: the source's keys are {source.num_kv_heads} heads of "
                f"{source.head_dim}; this layer needs num_kv_heads={self.num_kv_heads} heads of "
                f"{self.head_dim} (embed_dim / num_heads); give the same sizes")
        # the source in a tuple: not a submodule, so its parameters stay its own
        self._source = () if source is None else (source,)
        self.shared = None
        self.hook_shared = HookPoint()

    @property
    def source(self):
        """The producing layer, or None for a producer."""
        return self._source[0] if self._source else None

    def new_cache(self):
        """A ``KVCache`` for a producer, a ``SharedKVCache`` (nothing but a count) for a
        consumer."""
        return KVCache() if self.source is None else SharedKVCache()

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); with ``kv_cache`` (from ``new_cache()``) the N tokens
        follow the ones seen. A consumer's source must have run on the same step."""
        who = type(self).__name__
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        if self.source is None:
            q, k, v = self.project(x)
        else:
            q = split_heads(self.q_proj(x), self.num_heads)
            k, v = self._borrowed(x.shape[1], kv_cache)
        q, k, v = (hooked_heads(h, t) for h, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))
        if self.source is None:
            if kv_cache is not None:
                k, v = kv_cache.append(k, v)                       # (B, Hkv, Nk, D)
            self.shared = (self.hook_shared(k), v)
        y = self.attend(q, k, v) if attn_mask is None else \
            self.attend(q, k, v, attn_mask=attn_mask)
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def _borrowed(self, n, kv_cache):
        """The source's (K, V) for a step of n tokens, checked to cover exactly the tokens
        this layer has seen."""
        who = type(self).__name__
        if kv_cache is not None and not isinstance(kv_cache, SharedKVCache):
            raise validate.OptionError(f"{who}: a consumer's kv_cache must be a SharedKVCache "
                                       f"(from new_cache()), got {type(kv_cache).__name__}")
        if kv_cache is not None:
            kv_cache.advance(n)          # the consumer's cache only counts; the keys are lent
        seen = n if kv_cache is None else len(kv_cache)
        # keys of other tokens would be attended to silently: a stale source is an error
        if self.source.shared is None or self.source.shared[0].shape[2] != seen:
            held = None if self.source.shared is None else self.source.shared[0].shape[2]
            raise ValueError(f"{who}: the source layer must run first on the same tokens: "
                             f"this layer has seen {seen} tokens, the source holds keys for "
                             f"{held}")
        return self.source.shared

    def extra_repr(self) -> str:
        return super().extra_repr() + (", consumer" if self.source is not None else "")

    @classmethod
    def identities(cls, seed=0):
        """A consumer is softmax attention of its queries over the producer's keys and values;
        decoding through the two caches equals the full forward; the consumer's cache holds
        nothing (float64, B = 2, E = 12, H = 4, Hkv = 2, N = 9)."""
        g = host_xp.random.default_rng(seed)
        x, x2 = (Tensor(active_xp().asarray(g.standard_normal((2, 9, 12)))) for _ in range(2))
        producer = cls(12, 4, causal=True, num_kv_heads=2).to(dtype="float64").eval()
        consumer = cls(12, 4, causal=True, num_kv_heads=2,
                       source=producer).to(dtype="float64").eval()
        with no_grad():
            producer(x)
            out = to_host(consumer(x2).data)
            # the reference: the consumer's queries, the producer's keys and values
            w = {f"{who}.{k}": to_host(p.data) for who, layer in (("p", producer),
                                                                   ("c", consumer))
                 for k, p in layer.named_parameters()}
            xh, x2h = to_host(x.data), to_host(x2.data)

            def heads(t, h):
                return t.reshape(2, 9, h, 3).transpose(0, 2, 1, 3)
            q = heads(x2h @ w["c.q_proj.weight"].T + w["c.q_proj.bias"], 4)
            k = heads(xh @ w["p.k_proj.weight"].T + w["p.k_proj.bias"], 2)
            v = heads(xh @ w["p.v_proj.weight"].T + w["p.v_proj.bias"], 2)
            z = dense_attention_array(q, k, v, host_xp.tri(9, dtype=bool))
            ref = z.transpose(0, 2, 1, 3).reshape(2, 9, 12) @ w["c.out_proj.weight"].T + \
                w["c.out_proj.bias"]
            # through the caches, a prompt of 4 and then steps of 1 and 4
            caches = producer.new_cache(), consumer.new_cache()
            steps = []
            for a, b in ((0, 4), (4, 5), (5, 9)):
                producer(x[:, a:b], kv_cache=caches[0])
                steps.append(to_host(consumer(x2[:, a:b], kv_cache=caches[1]).data))
        steps = host_xp.concatenate(steps, axis=1)
        held = 2 * caches[0].keys.shape[1] * caches[0].keys.shape[2] * 3
        return [("consumer − softmax(Q_c K_pᵀ/√D) V_p in NumPy, max |Δ|",
                 float(host_xp.abs(out - ref).max()), 1e-12),
                ("decoding through the caches (4, 1, 4 tokens) − full forward, max |Δ|",
                 float(host_xp.abs(steps - out).max()), 1e-12),
                ("numbers the consumer's cache holds after 9 tokens (the producer's: "
                 f"{held})", float(caches[1].numbers), 0)]
