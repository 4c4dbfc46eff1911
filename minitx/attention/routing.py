r"""Routing attention: online k-means clusters decide who attends to whom.

Roy, Saffar, Vaswani & Grangier (2021), "Efficient Content-Based Sparse Attention with
Routing Transformers".

Queries and keys are normalised to unit length, x̂ = x/‖x‖, and assigned to their nearest
of C centroids μ (per head, shared by queries and keys); query i attends only to keys in its
own cluster, and in training the centroids move (below):

$$
c(x) = \operatorname{argmax}_c \hat{x} \cdot \mu_c,
\qquad O_i = \sum_{j :\, c(k_j) = c(q_i)} \operatorname{softmax}_j\!\left(
\frac{q_i \cdot k_j}{\sqrt{D}} \right) v_j,
\qquad \mu_c \leftarrow \lambda \mu_c + (1 - \lambda)\, \overline{\hat{x}}_c
$$

To keep the cost fixed, each query takes the w keys of its cluster nearest to it in position
("equal-size sorted windows"): sort the keys by (cluster, position); query i finds its place
in that order (a binary search) and looks at the w sorted keys before it (causal: only keys
at positions ≤ i) or w on each side (bidirectional), masked to its cluster. Because every
choice depends only on keys at positions ≤ i, the causal form never sees the future.

Centroids are a buffer, not a parameter: in training (``update_centroids``) they move by an
exponential moving average towards the mean $\overline{\hat{x}}_c$ of the normalised vectors
assigned to them, then renormalised — *after* the output is computed, so a forward pass is
a function of its inputs only. With one cluster and w ≥ N it is exact
full attention. Time and memory O(N·w·D) (w ~ N/C; O(N^1.5) at C = √N). Approximate.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, rng, xp as active_xp
from ..nn.hooks import HookPoint
from .base import AttentionBase, check_heads, register, repeat_kv

__all__ = ["assign_clusters", "routing_attention", "RoutingAttention"]


def _unit(x):
    xp = get_array_module(x)
    return x / xp.sqrt((x * x).sum(axis=-1, keepdims=True) + 1e-12)


def assign_clusters(x, centroids):
    """x (B, H, N, D) raw, centroids (H, C, D) → (B, H, N) nearest-centroid indices."""
    xp = get_array_module(x)
    return (_unit(x) @ xp.swapaxes(centroids.astype(x.dtype), -1, -2)[None]).argmax(axis=-1)


def routing_attention(q, k, v, q_cluster, k_cluster, num_clusters: int, window: int,
                      causal: bool = False):
    """Cluster-restricted attention on gathered windows.

    q, k (B, H, N, D), v (B, H, N, Dv) Tensors; q_cluster, k_cluster (B, H, N) ints.
    Returns (B, H, N, Dv).
    """
    xp = get_array_module(q.data)
    bsz, h, n, d = q.shape
    g = bsz * h
    group = xp.arange(g).reshape(bsz, h, 1)
    pos = xp.arange(n)
    # One sortable code per key: (batch·head, cluster, position), flattened over batch·head.
    k_code = ((group * num_clusters + k_cluster) * n + pos).reshape(-1)             # (G·N,)
    order = xp.argsort(k_code, kind="stable")
    sorted_code = k_code[order]
    q_group = (group * num_clusters + q_cluster).reshape(g, n)                       # (G, N)
    q_code = q_group * n + pos
    # Each query finds its place r among the sorted keys by binary search on its own code; its
    # candidates are the w slots before r (causal) or w before and w after.
    if causal:          # the keys at positions ≤ i of my cluster end just before `r`
        r = xp.searchsorted(sorted_code, q_code.reshape(-1), side="right").reshape(g, n)
        offsets = xp.arange(-window, 0)
    else:               # w keys before and w after my place in the cluster
        r = xp.searchsorted(sorted_code, q_code.reshape(-1), side="left").reshape(g, n)
        offsets = xp.arange(-window, window)
    # Candidate slots outside the array, or holding a key of another head or cluster, are
    # masked; causal also masks keys at later positions.
    rank = r[..., None] + offsets                                                    # (G, N, c)
    inside = (rank >= 0) & (rank < g * n)
    rank = xp.clip(rank, 0, g * n - 1)
    key_flat = order[rank]                                                           # (G, N, c)
    allowed = inside & (sorted_code[rank] // n == q_group[..., None])   # same head and cluster
    if causal:
        allowed = allowed & (key_flat % n <= pos[None, :, None])

    # Gather each query's c candidate keys and values and attend over them: scores
    # (G, N, 1, c), never N × N.
    kf = F.reshape(k, (g * n, d))
    vf = F.reshape(v, (g * n, v.shape[-1]))
    kg = F.getitem(kf, key_flat)                                     # (G, N, c, D)
    vg = F.getitem(vf, key_flat)                                     # (G, N, c, Dv)
    qg = F.reshape(q, (g, n, 1, d))
    s = F.matmul(qg, F.swapaxes(kg, -1, -2)) * (1.0 / math.sqrt(d))   # (G, N, 1, c)
    s = F.masked_fill(s, ~allowed[:, :, None, :], -math.inf)
    out = F.matmul(F.softmax(s, axis=-1), vg)                        # (G, N, 1, Dv)
    return F.reshape(out, (bsz, h, n, v.shape[-1]))


@register("routing")
class RoutingAttention(AttentionBase):
    r"""Routing attention: online k-means clusters decide which keys each query attends to.

    Formula: the module docstring's, over the keys of i's cluster in i's window of the
    (cluster, position)-sorted keys: the w before i's place (causal: at positions ≤ i) or w
    before and w after (bidirectional); centroids μ per head, moved only in training.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); buffer ``centroids`` μ (H, C, D); clusters (B, H, N);
    gathered K/V (B·H, N, c, D) with c = w (causal) or 2w.

    Options: ``num_clusters`` C (default 2), ``window`` w (keys per query, default 16; each
    side when bidirectional), ``decay`` λ (0.999), ``update_centroids`` (True: update in
    training mode; never in eval mode), ``causal`` (False).

    Complexity: {complexity}; plus a sort of B·H·N codes; every query gathers its own keys and
    values.

    Exactness: approximate (content-based sparsity: equals full attention with C = 1 and
    w ≥ N; the centroids are learned by online k-means).

    Reference: Roy, Saffar, Vaswani & Grangier (2021), "Efficient Content-Based Sparse
    Attention with Routing Transformers".
    """

    complexity = "time O(B·H·N·(w + C)·D), memory O(B·H·N·w·D)"

    kind = "approximate"

    def __init__(self, embed_dim, num_heads, causal=False, num_clusters: int = 2,
                 window: int = 16, decay: float = 0.999, update_centroids: bool = True, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.hook_query_clusters = HookPoint()  # (B, H, N) int cluster of each query
        self.hook_key_clusters = HookPoint()    # (B, H, N) int cluster of each key
        self.num_clusters = validate.positive_int(num_clusters, "num_clusters", owner="routing")
        self.window = validate.positive_int(window, "window", owner="routing")
        self.decay = validate.probability(decay, "decay", owner="routing")
        self.update_centroids = bool(update_centroids)
        # Centroids: a buffer of random unit vectors per head, (H, C, D), moved by online k-means
        # (_update), never by gradients.
        init = rng().standard_normal((num_heads, num_clusters, self.head_dim))
        self.register_buffer("centroids", Tensor(_unit(active_xp().asarray(init))))

    def _centroids(self):
        return self.centroids.data if isinstance(self.centroids, Tensor) else self.centroids

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv)."""
        _, h, *_ = check_heads(q, k, v, self.name)
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        mu = self._centroids()
        qc, kc = assign_clusters(q.data, mu), assign_clusters(k.data, mu)
        if self.hook_query_clusters.active or self.hook_key_clusters.active:
            qc = self.hook_query_clusters(Tensor(qc)).data     # a hook may reassign them
            kc = self.hook_key_clusters(Tensor(kc)).data
        out = routing_attention(q, k, v, qc, kc, self.num_clusters, self.window, self.causal)
        if self.training and self.update_centroids:
            self._update(q.data, qc, k.data, kc)
        return out

    def _update(self, q, qc, k, kc):
        """μ_c ← λ μ_c + (1 − λ) mean of the unit vectors assigned to c (then renormalise)."""
        xp = get_array_module(q)
        mu = self._centroids()
        x = xp.concatenate([_unit(q), _unit(k)], axis=2).astype(mu.dtype)       # (B, H, 2N, D)
        c = xp.concatenate([qc, kc], axis=2)                                     # (B, H, 2N)
        onehot = (c[..., None] == xp.arange(self.num_clusters)).astype(mu.dtype)  # (B, H, 2N, C)
        finite = xp.isfinite(x).all(axis=-1, keepdims=True)  # a NaN/inf row must not poison μ
        onehot *= finite
        x = xp.where(finite, x, 0)
        total = xp.einsum("bhnc,bhnd->hcd", onehot, x)                           # (H, C, D)
        count = onehot.sum(axis=(0, 2))[..., None]                               # (H, C, 1)
        mean = total / xp.where(count > 0, count, 1)
        new = xp.where(count > 0, self.decay * mu + (1 - self.decay) * mean, mu)
        mu[...] = _unit(new)                 # in place: the buffer keeps its identity
