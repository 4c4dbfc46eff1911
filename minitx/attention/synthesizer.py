r"""Synthesizer: attention weights synthesised without query–key dot products.

Tay, Bahri, Metzler, Juan, Zhao & Zheng (2021), "Synthesizer: Rethinking Self-Attention
for Transformer Models".

Instead of the dot-product logits Q Kᵀ/√D, the (N × N) logits S of each head come from one
of four ``synthesis`` rules, then the softmax as usual (M: causal masks the synthesised
logits above the diagonal):

$$
\begin{array}{rcl}
S^{\mathrm{dense}} & = & \operatorname{relu}(Q W_1 + b_1)\, W_2 + b_2 \\
S^{\mathrm{random}} & = & R_{:N, :N} \\
S^{\mathrm{factorized}} & = & R^{(1)}_{:N} \big( R^{(2)}_{:N} \big)^\top \\
S^{\mathrm{mixture}} & = & \alpha_1 S^{\mathrm{dense}}
+ \alpha_2 \displaystyle\frac{Q K^\top}{\sqrt{D}} \\
\alpha & = & \operatorname{softmax}(a) \\
O & = & \operatorname{softmax}(S + M)\, V
\end{array}
$$

- "dense": a per-token MLP D → max_len (per head; the head's query vector plays the token),
  its columns cut to N;
- "random": R (max_len, max_len) per head, input-independent; ``trainable=True`` (a
  parameter) or False (a fixed buffer);
- "factorized": R⁽¹⁾, R⁽²⁾ (max_len, k): a low-rank random R;
- "mixture": a learned (2,) mixes the synthetic logits with ordinary dot-product attention.

Time O(N·max_len·D) (dense) or O(N²·D); memory O(N²). A different score function: kind
"score". Sequences longer than ``max_len`` raise ValueError.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, rng, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import (AttentionBase, check_heads, register, repeat_kv, repeat_kv_array,
                   softmax_rows_array)

__all__ = ["SYNTHESES", "SynthesizerAttention"]

SYNTHESES = ("dense", "random", "factorized", "mixture")


# Gaussian tables drawn from the library's seeded generator, then moved to the active array
# module: the same initial weights on CPU and GPU.
def _normal(shape, std):
    return active_xp().asarray(rng().standard_normal(shape) * std).astype("float32")


@register("synthesizer")
class SynthesizerAttention(AttentionBase):
    r"""Synthesizer: attention logits synthesised without (or besides) query–key dot products.

    Formula: the module docstring's, with S chosen by ``synthesis``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D), N ≤ L = max_len; parameters w1 (H, D, D), b1
    (H, 1, D), w2 (H, D, L), b2 (H, 1, L) (dense, mixture); R (H, L, L) (random); R1, R2
    (H, L, k) (factorized); mix a (2,) (mixture); logits S (B or 1, H, N, N).

    Options: ``synthesis`` ("dense" default, "random", "factorized", "mixture"), ``max_len``
    L (default 128), ``trainable`` (random: parameter or fixed buffer, default True),
    ``rank`` k (factorized, default 8), ``causal`` (False).

    Complexity: {complexity}; L = max_len: the dense logits are formed for all L positions
    before the cut.

    Hook points (besides q/k/v/z): ``hook_synthetic_logits`` (B or 1, H, N, N), the
    synthesised S before the causal mask and, for "mixture", before it is mixed with the dot
    products (scores = α₁ S + α₂ Q Kᵀ/√D; otherwise scores = S); ``hook_attn_scores`` (the
    logits attended with, −inf where masked) and ``hook_pattern`` (their softmax). (1, …)
    for random/factorized: input-free. Each may be replaced.

    Exactness: learned: a different score function (tested against its own dense formula).

    Reference: Tay, Bahri, Metzler, Juan, Zhao & Zheng (2021), "Synthesizer: Rethinking
    Self-Attention for Transformer Models".
    """

    complexity = ("time O(B·H·N·(L + N)·D), memory O(B·H·N·L) (dense, mixture); random, "
                  "factorized: time O(B·H·N²·D), memory O(B·H·N²)")

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, synthesis: str = "dense",
                 max_len: int = 128, trainable: bool = True, rank: int = 8, **base):
        validate.choice(synthesis, "synthesis", SYNTHESES, owner="synthesizer")
        # dense reads the queries, mixture also the keys, random/factorized only the values
        self.projections = {"dense": ("q", "v", "out"), "mixture": ("q", "k", "v", "out")}.get(
            synthesis, ("v", "out"))
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        # the synthesised logits S; the logits attended with (S, or S mixed with the dot
        # products; −inf above the diagonal when causal); their softmax:
        # (B, H, N, N) for dense/mixture, (1, H, N, N) for random/factorized (input-free)
        self.hook_synthetic_logits = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.synthesis = synthesis
        # Then the tables each synthesis needs, per head (h heads, head dim d, L = max_len).
        self.max_len = validate.positive_int(max_len, "max_len", owner="synthesizer")
        self.rank = validate.positive_int(rank, "rank", owner="synthesizer")
        self.trainable = validate.boolean(trainable, "trainable", owner="synthesizer")
        h, d = num_heads, self.head_dim
        # dense: a two-layer MLP per head maps a query (D) to a row of L logits; std 1/√d keeps the
        # logits O(1) at the start.
        if synthesis in ("dense", "mixture"):
            self.w1 = Parameter(_normal((h, d, d), 1 / math.sqrt(d)))
            self.b1 = Parameter(active_xp().zeros((h, 1, d), dtype="float32"))
            self.w2 = Parameter(_normal((h, d, max_len), 1 / math.sqrt(d)))
            self.b2 = Parameter(active_xp().zeros((h, 1, max_len), dtype="float32"))
        # random: one (L, L) table of logits per head, shared by every input; a buffer (no gradient)
        # when not trainable.
        if synthesis == "random":
            table = _normal((h, max_len, max_len), 1.0)
            if trainable:
                self.R = Parameter(table)
            else:
                self.register_buffer("R", Tensor(table))
        # factorized: the (L, L) table as R₁ R₂ᵀ of rank k, 2·L·k numbers per head instead of L².
        if synthesis == "factorized":
            self.R1 = Parameter(_normal((h, max_len, rank), rank ** -0.5))
            self.R2 = Parameter(_normal((h, max_len, rank), rank ** -0.5))
        # mixture: two mixing logits a, zero so that α = softmax(a) = (½, ½) at the start.
        if synthesis == "mixture":
            self.mix = Parameter(active_xp().zeros(2, dtype="float32"))

    def logits(self, q, k):
        """The (B, H, N, N) or (1, H, N, N) logits attended with, before masking: the
        synthesised S (seen by ``hook_synthetic_logits``), mixed with the dot products for
        "mixture"."""
        s = self.hook_synthetic_logits(self.synthetic_logits(q))
        if self.synthesis == "mixture":
            alpha = F.softmax(self.mix, axis=0)
            dot = F.matmul(q, F.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
            s = s * F.getitem(alpha, 0) + dot * F.getitem(alpha, 1)
        return s

    def synthetic_logits(self, q):
        """The synthesised S: (B, H, N, N) for dense/mixture, (1, H, N, N) otherwise."""
        n = q.shape[2]
        if self.synthesis in ("dense", "mixture"):
            hidden = F.relu(F.matmul(q, self.w1) + self.b1)         # (B, H, N, D) @ (H, D, D)
            s = F.matmul(hidden, self.w2) + self.b2                 # (B, H, N, max_len)
            return F.getitem(s, (Ellipsis, slice(0, n)))            # (B, H, N, N)
        if self.synthesis == "random":
            table = self.R if isinstance(self.R, Tensor) else Tensor._wrap(self.R)
            if not table.requires_grad:
                table = Tensor._wrap(table.data.astype(q.dtype))
            return F.expand_dims(F.getitem(table, (slice(None), slice(0, n), slice(0, n))), 0)
        r1 = F.getitem(self.R1, (slice(None), slice(0, n)))         # (H, N, k)
        r2 = F.getitem(self.R2, (slice(None), slice(0, n)))
        return F.expand_dims(F.matmul(r1, F.swapaxes(r2, -1, -2)), 0)   # (1, H, N, N)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv); N ≤ max_len."""
        _, h, _, nq, nk, _ = check_heads(q, k, v, self.name)
        if nq > self.max_len or nk != nq:
            raise ValueError(f"synthesizer: sequence length must be ≤ max_len={self.max_len} "
                             f"and equal for queries and keys, got {nq} and {nk}")
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        s = self.logits(q, k)
        if self.causal:
            xp = get_array_module(q.data)
            s = F.masked_fill(s, ~xp.tri(nq, dtype=bool), -math.inf)
        pattern = self.hook_pattern(F.softmax(self.hook_attn_scores(s), axis=-1))
        return F.matmul(pattern, v)                                 # (B, H, N, N) @ (B, H, N, Dv)

    def reference(self, q, k, v):
        """Raw arrays: the synthesised logits per ``synthesis`` written out, then a dense
        softmax (lower-triangular mask when causal). (B, H, N, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        n = q.shape[2]
        par = {name: p.data.astype(q.dtype) for name, p in self.named_parameters(recurse=False)}
        # Raw arrays of q's dtype; each branch writes S with einsum, as in the docstring's formula.
        if self.synthesis in ("dense", "mixture"):
            hidden = xp.maximum(xp.einsum("bhid,hde->bhie", q, par["w1"]) + par["b1"], 0)
            s = (xp.einsum("bhie,hel->bhil", hidden, par["w2"]) + par["b2"])[..., :n]
            if self.synthesis == "mixture":
                a = xp.exp(par["mix"] - par["mix"].max())
                a = a / a.sum()                                      # softmax of the 2 weights
                s = a[0] * s + a[1] * xp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
        elif self.synthesis == "random":
            table = self.R.data if isinstance(self.R, Tensor) else self.R
            s = table.astype(q.dtype)[None, :, :n, :n]
        else:
            s = xp.einsum("hik,hjk->hij", par["R1"][:, :n], par["R2"][:, :n])[None]
        # Causal keeps j ≤ i (lower triangle); then a row softmax and the weighted sum of values.
        allowed = xp.tri(n, dtype=bool) if self.causal else None
        return softmax_rows_array(s, allowed) @ v
