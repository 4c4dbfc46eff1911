r"""Linformer: project the length-N keys and values down to k rows, then attend.

Wang, Li, Khabsa, Fang & Ma (2020), "Linformer: Self-Attention with Linear Complexity".

The attention matrix is approximately low rank, so learned projections E, F (k × N) compress
the sequence axis of keys and values:

$$
O = \operatorname{softmax}\!\left( \frac{Q (E K)^\top}{\sqrt{D}} \right) (F V),
\qquad E, F \in \mathbb{R}^{k \times N}
$$

— scores (N, k), output (N, Dv).

Time O(N·k·D), memory O(N·k): linear in N for a fixed k. E and F are parameters of shape
(k, max_len); a sequence of length N ≤ max_len uses their first N columns. Approximate
(learned). Causal masking is impossible — every projected row mixes future positions — so
``causal=True`` raises ValueError at construction.

Initialisation (``init``): "gaussian" draws N(0, 1/k) entries (the paper's
Johnson–Lindenstrauss argument), "pool" makes row r the mean over the r-th of k equal
segments of the max_len positions (mean pooling, one of the paper's listed alternatives;
with k = N it is the identity and Linformer is exact).
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..backend import rng, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import AttentionBase, check_heads, register, repeat_kv

__all__ = ["linformer_projection", "LinformerAttention"]


def linformer_projection(k: int, max_len: int, init: str = "gaussian"):
    """(k, max_len) initial projection (see the module docstring for ``init``)."""
    xp = active_xp()
    if init == "gaussian":
        return xp.asarray(rng().standard_normal((k, max_len)) / math.sqrt(k)).astype("float32")
    if init == "pool":
        seg = xp.arange(max_len) * k // max_len                  # segment of each position
        onehot = (seg[None, :] == xp.arange(k)[:, None]).astype("float32")
        return onehot / onehot.sum(axis=1, keepdims=True)
    raise ValueError(f"init must be 'gaussian' or 'pool', got {init!r}")


@register("linformer")
class LinformerAttention(AttentionBase):
    r"""Linformer: learned projections compress the sequence axis of keys and values to k rows.

    Formula: the module docstring's, E, F (k, N) being the first N columns of learned
    (k, max_len) parameters (F = E when ``share_kv``).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D), N ≤ max_len; parameters E, F (k, max_len); E K, F V
    (B, Hkv, k, D); scores (B, H, N, k).

    Options: ``proj_dim`` k (default 16), ``max_len`` (256), ``share_kv`` (False), ``init``
    ("gaussian": N(0, 1/k) entries; "pool": mean over k equal segments of max_len). Raises
    ValueError for causal=True (every projected row mixes future positions), and for
    N > max_len at call time.

    Complexity: {complexity}; linear in N for a fixed k.

    Exactness: approximate (a learned rank-k projection of the length-N attention; the error
    falls as k grows, and with k = N = max_len and init="pool" (the identity) it is exact).

    Reference: Wang, Li, Khabsa, Fang & Ma (2020), "Linformer: Self-Attention with Linear
    Complexity".
    """

    complexity = "time O(B·H·N·k·D), memory O(B·H·N·k)"

    kind = "approximate"
    supports_causal = False

    def __init__(self, embed_dim, num_heads, causal=False, proj_dim: int = 16,
                 max_len: int = 256, share_kv: bool = False, init: str = "gaussian", **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.proj_dim = validate.positive_int(proj_dim, "proj_dim", owner="linformer")
        self.max_len = validate.positive_int(max_len, "max_len", owner="linformer")
        self.share_kv = validate.boolean(share_kv, "share_kv", owner="linformer")
        validate.choice(init, "init", ("gaussian", "pool"), owner="linformer")
        # E, F (k, max_len) project the N keys and values onto k rows (their first N columns are
        # used); share_kv uses E for both, halving the parameters.
        self.E = Parameter(linformer_projection(proj_dim, max_len, init))
        self.F = None if share_kv else Parameter(linformer_projection(proj_dim, max_len, init))
        self.hook_k_projected = HookPoint()   # (B, H, k, D) E·K: the k keys attended to
        self.hook_v_projected = HookPoint()   # (B, H, k, D) F·V
        self.hook_attn_scores = HookPoint()   # (B, H, N, k) Q (E K)ᵀ/√D
        self.hook_pattern = HookPoint()       # (B, H, N, k) softmax over the k projected keys

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv); N ≤ max_len."""
        _, h, _, nq, nk, d = check_heads(q, k, v, self.name)
        if nk > self.max_len:
            raise ValueError(f"linformer: sequence length {nk} exceeds max_len={self.max_len}; "
                             "construct the layer with a larger max_len")
        cols = (slice(None), slice(0, nk))
        e = F.getitem(self.E, cols)                                 # (k, N)
        f = e if self.F is None else F.getitem(self.F, cols)
        k_low = F.matmul(e, k)                                      # (k, N) @ (B, Hkv, N, D)
        v_low = F.matmul(f, v)                                      # -> (B, Hkv, k, Dv)
        k_low = self.hook_k_projected(repeat_kv(k_low, h))          # (B, H, k, D)
        v_low = self.hook_v_projected(repeat_kv(v_low, h))
        s = F.matmul(q, F.swapaxes(k_low, -1, -2)) * (1.0 / math.sqrt(d))   # (B, H, N, k)
        pattern = self.hook_pattern(F.softmax(self.hook_attn_scores(s), axis=-1))
        return F.matmul(pattern, v_low)                                     # (B, H, N, Dv)
