r"""Position schemes: how attention, which is permutation-equivariant, learns about order.

Without positions, self-attention treats its input as a *set*: permuting the tokens permutes
the outputs the same way. Five ways to break the symmetry:

1. **Sinusoidal** (Vaswani et al. 2017): add a fixed code to each embedding,
   PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)).
2. **Learned absolute**: add a trained vector per position (GPT-2, BERT).

(1 and 2 act on the embeddings, before attention: they are layers, in ``nn/positional.py``.
3–5 act inside attention: they are the registered variants below.)
3. **Relative position representations** (Shaw, Uszkoreit & Vaswani 2018): learned vectors
   for the clipped distance between query and key, added on the key side of the score and to
   the values.
4. **RoPE** (Su et al. 2021, "RoFormer"): rotate each pair (x_{2i}, x_{2i+1}) of q and k by
   an angle proportional to the token's position; the score then depends only on the offset.
5. **ALiBi** (Press, Smith & Lewis 2021, "Train Short, Test Long"): no embeddings at all; a
   penalty linear in the distance is added to the scores, with one fixed slope per head.

All three use bottom-right alignment: with Nq queries and Nk keys, query i sits at position
$\mathrm{pos}_i = i + N_k - N_q$ (so they work with a KV cache), and M is the mask.

**Relative** (``relative``): a^K, a^V are the learned tables, k the largest distance told
apart:

$$
\begin{array}{rcl}
r_{ij} & = & \operatorname{clip}(j - \mathrm{pos}_i, -k, k) \\
e_{ij} & = & \displaystyle\frac{q_i \cdot k_j + q_i \cdot a^K_{r_{ij}}}{\sqrt{D}} + M_{ij} \\
\alpha_i & = & \operatorname{softmax}(e_i) \\
z_i & = & \textstyle\sum_j \alpha_{ij} \left( v_j + a^V_{r_{ij}} \right)
\end{array}
$$

**RoPE** (``rope``): the rotation R_m of one pair at position m, why only the offset
matters, and the attention on rotated queries and keys:

$$
\begin{pmatrix} x'_{2i} \\ x'_{2i+1} \end{pmatrix} =
\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
\begin{pmatrix} x_{2i} \\ x_{2i+1} \end{pmatrix},
\qquad \theta_i = \mathrm{base}^{-2i/D}
$$

$$
\langle R_m q, R_n k \rangle = \langle q, R_{n-m} k \rangle, \qquad
O = \operatorname{softmax}\!\left( \frac{(R Q)(R K)^\top}{\sqrt{D}} + M \right) V
$$

**ALiBi** (``alibi``): the slopes m_h, a geometric sequence over the heads, are
``alibi_slopes``:

$$
O = \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}}
- m_h \left| \mathrm{pos}_i - j \right| + M \right) V
$$
"""
from __future__ import annotations

import math

from .. import validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, xp as active_xp
from ..nn import init
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from ..ops.indexing import embedding
from ..ops.linalg import matmul
from ..ops.shape import expand_dims, squeeze, swapaxes

# The variants below subclass the exact layer and change only the scores (a bias, or rotated
# q and k); the softmax, the weighted sum of values and the heads are inherited.
from .base import causal_pattern, hooked_heads, register, repeat_kv_array, softmax_rows_array
from .exact import ExactSelfAttention

__all__ = ["relative_position_index", "RelativePositionAttention", "rope_angles", "apply_rope",
           "RoPEFunction", "RoPEAttention", "alibi_slopes", "alibi_bias", "ALiBiAttention"]


def _query_positions(nq: int, nk: int, xp):
    """Absolute positions of the queries: the last Nq of Nk (bottom-right alignment)."""
    return xp.arange(nk - nq, nk)


# ---- 3. relative position representations (Shaw et al. 2018) -----------------------------

def relative_position_index(nq: int, nk: int, max_distance: int, xp=None):
    """(Nq, Nk) ints in [0, 2k]: clip(j − pos_i, −k, k) + k, pos_i = i + Nk − Nq."""
    xp = xp or active_xp()
    rel = xp.arange(nk)[None, :] - _query_positions(nq, nk, xp)[:, None]   # j − i
    return xp.clip(rel, -max_distance, max_distance) + max_distance


@register("relative")
class RelativePositionAttention(ExactSelfAttention):
    r"""Multi-head attention with learned relative position representations on keys and values.

    Formula: the module docstring's "Relative", with k = ``max_relative_position``.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D). Parameters ``rel_k``, ``rel_v`` (2k + 1, D), shared by
    the heads (as in the paper); gathered a^K, a^V (N, Nk, D).

    Options: ``max_relative_position`` k (default 8), plus ``mha``'s (``causal``,
    ``num_kv_heads``, ``bias``, ``dropout``).

    Complexity: {complexity}; P is kept, and the gathered embeddings once, shared by batch and
    heads. The key term enters ``scaled_dot_product_attention`` as a differentiable float bias.

    Hook points (besides ``mha``'s): ``hook_rel_key_term`` (B, H, Nq, Nk), q_i · a^K_ij/√D,
    the part of ``hook_attn_scores`` the relative keys add (scores = q·k/√D + this term);
    ``hook_rel_value_term`` (B, Nq, H, D), Σ_j α_ij a^V_ij, the part of ``hook_z`` the
    relative values add (z = pattern · v + this term). Both may be replaced.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position
    Representations".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N² + N²·D)"

    kind = "score"
    needs_weights = True

    def __init__(self, embed_dim, num_heads, causal=False, max_relative_position: int = 8,
                 **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.max_relative_position = validate.nonnegative_int(
            max_relative_position, "max_relative_position", owner="relative")
        # One learned D-vector per clipped distance −k..k (2k + 1 rows), for keys and for values,
        # shared by all heads; small random init so positions differ from the first step.
        r = 2 * max_relative_position + 1
        self.rel_k = Parameter(active_xp().zeros((r, self.head_dim), dtype="float32"))
        self.rel_v = Parameter(active_xp().zeros((r, self.head_dim), dtype="float32"))
        init.normal_(self.rel_k, 0.0, 0.1)
        init.normal_(self.rel_v, 0.0, 0.1)
        self.hook_rel_key_term = HookPoint()     # (B, H, Nq, Nk) q_i · a^K_ij / √D
        self.hook_rel_value_term = HookPoint()   # (B, Nq, H, D)  Σ_j α_ij a^V_ij (hook_z layout)

    def _index(self, nq, nk, like):
        return relative_position_index(nq, nk, self.max_relative_position,
                                       get_array_module(like.data))

    def score_bias(self, q, k):
        nq, nk = q.shape[2], k.shape[2]
        a_k = embedding(self._index(nq, nk, q), self.rel_k)        # (Nq, Nk, D): a^K_{r_ij}
        # q_i · a^K_ij, scaled like q·k: one (1, D) @ (D, Nk) product per query, a batched
        # matmul (BLAS; einsum's loop for "bhqd,qkd->bhqk" is about 3× slower)
        # (B, H, Nq, 1, D) @ (Nq, D, Nk) -> (B, H, Nq, 1, Nk) -> (B, H, Nq, Nk)
        term = squeeze(matmul(expand_dims(q, -2), swapaxes(a_k, -1, -2)), -2)
        return self.hook_rel_key_term(term * self.scale)

    def value_term(self, weights, nq, nk):
        a_v = embedding(self._index(nq, nk, weights), self.rel_v)  # (Nq, Nk, D): a^V_{r_ij}
        # Σ_j α_ij a^V_ij, batched over the queries as the key term is
        # (B, H, Nq, 1, Nk) @ (Nq, Nk, D) -> (B, H, Nq, 1, D) -> (B, H, Nq, D)
        term = squeeze(matmul(expand_dims(weights, -2), a_v), -2)
        return hooked_heads(self.hook_rel_value_term, term)

    def reference(self, q, k, v):
        """Raw arrays: Shaw's formula with an explicit clipped-distance table, (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        pos = xp.arange(nq)[:, None] + (nk - nq)                 # query i sits at i + Nk − Nq
        r = xp.clip(xp.arange(nk)[None, :] - pos, -self.max_relative_position,
                    self.max_relative_position)                  # clip(j − pos_i, −k, k)
        a_k = self.rel_k.data.astype(q.dtype)[r + self.max_relative_position]   # (Nq, Nk, D)
        a_v = self.rel_v.data.astype(q.dtype)[r + self.max_relative_position]
        e = (xp.einsum("bhid,bhjd->bhij", q, k)
             + xp.einsum("bhid,ijd->bhij", q, a_k)) / math.sqrt(d)
        p = softmax_rows_array(e, causal_pattern(nq, nk, xp) if self.causal else None)
        return p @ v + xp.einsum("bhij,ijd->bhid", p, a_v)       # Σ_j α_ij (v_j + a^V_ij)


# ---- 4. RoPE (Su et al. 2021) ------------------------------------------------------------

def rope_angles(positions, d: int, base: float = 10000.0):
    """(N, D/2) angles m·θ_i (module docstring) for positions m (N,), i = 0 … D/2 − 1."""
    if isinstance(d, bool) or not isinstance(d, int) or d <= 0 or d % 2:
        raise validate.OptionError(f"rope: head dim D must be a positive even int, got {d!r}")
    base = validate.positive_real(base, "base", owner="rope")
    xp = get_array_module(positions)
    theta = base ** (-xp.arange(0, d, 2, dtype="float64") / d)            # (D/2,)
    return xp.asarray(positions, dtype="float64")[:, None] * theta[None, :]


def _rotate_pairs(x, cos, sin):
    """Rotate each pair (x_{2i}, x_{2i+1}) by the angle whose cos/sin are given (…, N, D/2)."""
    xp = get_array_module(x)
    out = xp.empty_like(x)
    even, odd = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


class RoPEFunction(Function):
    """y = R_m x: rotate pairs of the last axis of x (…, N, D) by m·θ_i.

    R is orthogonal, so the backward is the inverse rotation: dx = R_mᵀ dy = R_{−m} dy
    (same cos, negated sin). O(N·D).
    """

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate_pairs(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate_pairs(grad, cos, -sin), None, None


def apply_rope(x, positions=None, offset: int = 0, base: float = 10000.0):
    """Rotary position embedding of x (…, N, D) at positions (N,) (default offset … offset+N−1):
    each pair (x_{2i}, x_{2i+1}) rotated by R_m of the module docstring, m the token's position.
    """
    xp = get_array_module(x.data if isinstance(x, Tensor) else x)
    n, d = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = xp.arange(offset, offset + n)
    positions = xp.asarray(positions)
    if positions.shape != (n,):
        raise ValueError(f"apply_rope: positions must have shape ({n},), got {positions.shape}")
    angles = rope_angles(positions, d, base)
    cos, sin = xp.cos(angles).astype(x.dtype), xp.sin(angles).astype(x.dtype)
    if isinstance(x, Tensor):
        return RoPEFunction.apply(x, cos, sin)
    return _rotate_pairs(x, cos, sin)


@register("rope")
class RoPEAttention(ExactSelfAttention):
    r"""Multi-head attention with rotary position embeddings (RoPE) applied to q and k.

    Formula: the module docstring's "RoPE". Keys sit at positions 0 … Nk − 1, queries at the
    last Nq of them, so cached decoding (unrotated keys in the cache) gives the same result as
    the full forward.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); angles (N, D/2). Needs an even head dim D.

    Options: ``base`` (default 10000.0), plus ``mha``'s (``causal``, ``num_kv_heads``,
    ``bias``, ``dropout``).

    Complexity: {complexity}.

    Hook points (besides ``mha``'s): ``hook_rot_q`` (B, Nq, H, D) and ``hook_rot_k``
    (B, Nk, Hkv, D), the rotated R q and R k (TransformerLens's names and layout, as
    ``hook_q``/``hook_k``); the scores are hook_rot_q · hook_rot_k / √D. Both may be replaced.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Su, Lu, Pan, Murtadha, Wen & Liu (2021), "RoFormer: Enhanced Transformer with
    Rotary Position Embedding".
    """

    complexity = "time O(B·H·N²·D) (+ O(B·H·N·D) for the rotations), memory O(B·H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, base: float = 10000.0, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        if self.head_dim % 2:
            raise ValueError(f"rope: head dim embed_dim/num_heads must be even, got "
                             f"{self.head_dim}")
        self.base = validate.positive_real(base, "base", owner="rope")
        self.hook_rot_q = HookPoint()        # (B, Nq, H, D)   R_m q at query positions m
        self.hook_rot_k = HookPoint()        # (B, Nk, Hkv, D) R_n k at key positions n

    # Rotate each query at its bottom-right aligned position m and each key at n = 0..Nk−1:
    # ⟨R_m q, R_n k⟩ then depends only on n − m.
    def transform_qk(self, q, k):
        nq, nk = q.shape[2], k.shape[2]
        xp = get_array_module(q.data)
        q = apply_rope(q, _query_positions(nq, nk, xp), base=self.base)   # (B, H, Nq, D)
        k = apply_rope(k, xp.arange(nk), base=self.base)                   # (B, Hkv, Nk, D)
        return hooked_heads(self.hook_rot_q, q), hooked_heads(self.hook_rot_k, k)

    def reference(self, q, k, v):
        """Raw arrays: each pair (x_{2i}, x_{2i+1}) as the complex number x_{2i} + i·x_{2i+1},
        multiplied by e^{i·m·θ_i} (a rotation by m·θ_i); then Re⟨R q, conj(R k)⟩ is the real
        dot product of the rotated vectors, and a dense softmax. (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        theta = self.base ** (-2.0 * xp.arange(d // 2) / d)              # θ_i, (D/2,)
        rot_q = xp.exp(1j * (xp.arange(nq) + (nk - nq))[:, None] * theta)   # (Nq, D/2)
        rot_k = xp.exp(1j * xp.arange(nk)[:, None] * theta)                 # (Nk, D/2)
        qc = (q[..., 0::2] + 1j * q[..., 1::2]) * rot_q
        kc = (k[..., 0::2] + 1j * k[..., 1::2]) * rot_k
        s = xp.einsum("bhid,bhjd->bhij", qc, kc.conj()).real / math.sqrt(d)
        return softmax_rows_array(s, causal_pattern(nq, nk, xp) if self.causal else None) @ v


# ---- 5. ALiBi (Press et al. 2021) --------------------------------------------------------

def alibi_slopes(num_heads: int):
    """The head slopes m_h of ALiBi, as a list of floats.

    For H = 2^k heads: m_h = 2^(−8h/H), h = 1 … H (a geometric sequence from 2^(−8/H) to
    2^(−8)). Otherwise: the slopes for the closest power of two 2^⌊log₂H⌋, then every other
    slope of the sequence for 2^(⌊log₂H⌋+1) until H slopes are listed (the paper's rule).
    """
    num_heads = validate.positive_int(num_heads, "num_heads", owner="alibi_slopes")

    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    if closest == num_heads:
        return power_of_two(num_heads)
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def alibi_bias(num_heads: int, nq: int, nk: int, xp=None, dtype="float32"):
    """(H, Nq, Nk) bias −m_h·|pos_i − j| with pos_i = i + Nk − Nq (bottom-right).

    Causal models only ever see j ≤ pos_i, where this is the paper's −m_h·(pos_i − j).
    """
    xp = xp or active_xp()
    dist = xp.abs(xp.arange(nk)[None, :] - _query_positions(nq, nk, xp)[:, None])  # (Nq, Nk)
    slopes = xp.asarray(alibi_slopes(num_heads), dtype="float64")[:, None, None]
    return (-slopes * dist[None]).astype(dtype)


@register("alibi")
class ALiBiAttention(ExactSelfAttention):
    r"""Attention with linear biases (ALiBi): a fixed per-head distance penalty, no position
    parameters.

    Formula: the module docstring's "ALiBi". The paper is causal (j ≤ pos_i); bidirectional
    use here penalises |pos_i − j| on both sides.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); bias (1, H, N, Nk).

    Options: none of its own; ``mha``'s (``causal``, ``num_kv_heads``, ``bias``, ``dropout``).

    Complexity: {complexity}; the second term is the bias. Extrapolates to lengths longer than
    those seen in training.

    Hook point (besides ``mha``'s): ``hook_alibi_bias`` (1, H, Nq, Nk), −m_h·|pos_i − j|,
    the same for every batch row; ``hook_attn_scores`` = q·k/√D + this bias (−inf where
    masked). A replacement changes the scores by the difference.

    Exactness: a different score function (tested against its own dense formula). kind "score".

    Reference: Press, Smith & Lewis (2021; ICLR 2022), "Train Short, Test Long: Attention with
    Linear Biases Enables Input Length Extrapolation".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N² + H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, **options):
        super().__init__(embed_dim, num_heads, causal=causal, **options)
        self.hook_alibi_bias = HookPoint()   # (1, H, Nq, Nk) −m_h·|pos_i − j|

    def score_bias(self, q, k):
        xp = get_array_module(q.data)
        bias = alibi_bias(self.num_heads, q.shape[2], k.shape[2], xp, q.dtype)[None]
        if self.hook_alibi_bias.active:                  # a Tensor only when someone looks
            bias = self.hook_alibi_bias(Tensor(bias))
        return bias                                      # (1, H, Nq, Nk)

    def reference(self, q, k, v):
        """Raw arrays: scores q·kᵀ/√D − m_h·|pos_i − j| per head, dense softmax. (B, H, Nq, D)."""
        xp = get_array_module(q)
        k = repeat_kv_array(k, q.shape[1])
        v = repeat_kv_array(v, q.shape[1])
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        slopes = xp.asarray(alibi_slopes(q.shape[1]), dtype=q.dtype)          # m_h, (H,)
        dist = xp.abs(xp.arange(nq)[:, None] + (nk - nq) - xp.arange(nk)[None, :])
        s = xp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d) - slopes[:, None, None] * dist
        return softmax_rows_array(s, causal_pattern(nq, nk, xp) if self.causal else None) @ v
