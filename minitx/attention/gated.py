r"""Softmax attention with a gate: an output gate (gated attention) or a forget gate (FoX).

Two 2025 changes to softmax attention put a sigmoid gate computed from the layer's input
x_t (B, N, E) into it. They differ in where the gate acts.

**Gated attention** (Qiu et al. 2025; the softmax layers of Qwen3-Next) multiplies the
attention output by a gate, after the softmax and before the output projection:

$$
Z = \mathrm{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + M \right) V, \qquad
G = \sigma\!\left( X W_g \right), \qquad
Y = \left( Z \odot G \right) W_O
$$

per head: G is (B, H, N, D) ("elementwise", one gate per channel: Qwen3-Next's choice) or
(B, H, N, 1) ("headwise", one per head and token, broadcast over its D channels). The paper
finds that the gate adds a non-linearity between W_V and W_O (the two are otherwise one
low-rank linear map) and makes the output sparse, so no head needs to park its softmax mass
on the first token (the "attention sink") to say nothing.

**Forgetting attention** (FoX, Lin et al. 2025) gives each head a scalar forget gate per
token, f_t = σ(w_hᵀ x_t + b_h) ∈ (0, 1), and adds to the score of query i and key j the log of
every gate between them:

$$
D_{ij} = \sum_{l=j+1}^{i} \log f_l = c_i - c_j, \quad c_t = \sum_{l \le t} \log f_l, \qquad
O = \mathrm{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + D + M \right) V
$$

(D_ii = 0; M is −inf above the diagonal.) The weight of key j is scaled by f_{j+1} ··· f_i:
a key fades with each gate below one, as the state of a gated recurrence does, while the
softmax still picks among the keys left. With every f_t = 1 the bias vanishes and FoX is
causal softmax attention; with a constant f it is ALiBi's linear distance bias (i − j) log f.
The bias is a difference of cumulative sums c (one ``cumsum`` over the tokens, no loop), and
a decoder needs to keep only c of each cached token: the query at t adds its own c_t.

**FoX by blocks of query rows.** The bias need never exist whole: ``forgetting_attention``
takes b query rows at a time, forms their scores S with the bias c_i − c_j (b × N), their
probabilities P and their outputs, and keeps per row only the output and the log-sum-exp
$\ell_i = \log \sum_j e^{S_{ij}}$. Backward rebuilds each block's $P = e^{S - \ell}$, takes
dQ, dK, dV and dS from the five equations of softmax attention's backward
(``ops/attention_maths.py``, applied to the block), and the gates' gradient from dS: D_ij
depends on c only through c_i − c_j, so with
$G_{ij} = dS_{ij}\, \partial D_{ij} / \partial (c_i - c_j)$

$$
\frac{\partial L}{\partial c_t} = \sum_j G_{tj} - \sum_i G_{it}, \qquad
G = dS \ \text{(causal)}, \qquad G = -\operatorname{sgn}(c_i - c_j) \odot dS
\ \text{(the symmetric bias)}
$$

the row sums of G minus its column sums. Memory O(N·(D + b)), where the composed form (the
formula op by op) holds several N × N arrays and their gradients.
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
# FoX's fused op reads heads as softmax attention's backward does (grouped, without copies)
from ..ops.attention_maths import grouped_key_grad, grouped_scores, grouped_values
from .base import (AttentionBase, causal_pattern, check_heads, dense_attention_array,
                   hookable_attention, hooked_heads, merge_heads, register, repeat_kv,
                   repeat_kv_array, softmax_rows_array)
from .kv_cache import KVCache

__all__ = ["GatedAttention", "ForgettingAttention", "ForgetCache", "forget_bias",
           "forgetting_attention", "ForgettingAttentionFunction"]

# where ``gated``'s gate acts: one value per channel of each head, or one per head
GATES = ("elementwise", "headwise")


def _check_input(layer, x):
    """x must be (B, N, E): the layer's own forward, so the base class's check is repeated."""
    if len(x.shape) != 3 or x.shape[-1] != layer.embed_dim:
        raise ValueError(f"{type(layer).__name__}: x must be (B, N, {layer.embed_dim}), got "
                         f"shape {tuple(x.shape)}")


def _heads_of(layer, x):
    """Project x (B, N, E) to q (B, H, N, D), k, v (B, Hkv, N, D) through the q/k/v hooks."""
    q, k, v = layer.project(x)
    return tuple(hooked_heads(h, t) for h, t in
                 ((layer.hook_q, q), (layer.hook_k, k), (layer.hook_v, v)))


# ---- gated attention ---------------------------------------------------------------------

@register("gated")
class GatedAttention(AttentionBase):
    r"""Gated attention: softmax attention whose output is multiplied by σ(x W_g) before the
    output projection (the formula is the module docstring's first).

    Formula: the module docstring's first (gated attention), per head: Z the softmax
    attention output, G = σ(X W_g) from ``gate_linear`` as (B, H, N, D) when ``gate`` is
    "elementwise" or (B, H, N, 1) when it is "headwise", Y = (Z ⊙ G) W_O.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, attn_mask=None,
    gate=None)``: q (B, H, Nq, D), k/v (B, Hkv, Nk, D), gate (B, H, Nq, D or 1) → Z ⊙ gate
    (B, H, Nq, D) (no gate: Z, softmax attention). ``gate_linear`` maps E → E (elementwise)
    or E → H (headwise). Hooks (besides hook_q/k/v/z, z being the gated output): ``hook_gate``
    the gate G (B, N, H, D or 1) and ``hook_ungated`` Z (B, N, H, D), both replaceable;
    ``hook_attn_scores`` and ``hook_pattern`` the N × N maps.

    Options: ``gate`` ("elementwise", the default and Qwen3-Next's, or "headwise"),
    ``causal`` (False), ``num_kv_heads``, ``bias`` (True; the projections', ``gate_linear``'s
    too). ``attn_mask`` bool or float; ``kv_cache`` a ``KVCache`` (decoding).

    Complexity: {complexity}; the gate adds O(B·N·E·E) (elementwise) or O(B·N·E·H).

    Exactness: ``attend`` without a gate is exact softmax attention; the layer is softmax
    attention times its own gate (``identities``).

    Left out or different: Qwen3-Next makes the gate with the queries, as the second half of
    each head's slice of a doubled q projection; minitx's ``gate_linear`` is that half on its
    own (the same map: ``tests/oracles/test_torch_parity_gated.py`` loads one into the
    other). Qwen3-Next's RMSNorm of q and k and its partial RoPE are model switches, not
    part of this layer.

    Reference: Qiu, Wang, Zheng, Huang et al. (2025), "Gated Attention for Large Language
    Models: Non-linearity, Sparsity, and Attention-Sink-Free"; Qwen3-Next (Qwen team, 2025).
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N²)"

    # attend without a gate is softmax attention itself; the gate comes from x, in forward
    kind = "exact"
    supports_attn_mask = True
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, gate: str = "elementwise",
                 **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.gate = validate.choice(gate, "gate", GATES, owner="gated")
        # W_g: E → H·D (a gate per channel) or E → H (a gate per head, broadcast over D)
        self.gate_dim = self.head_dim if self.gate == "elementwise" else 1
        bias = self.q_proj.bias is not None          # the projections' ``bias`` option
        self.gate_linear = Linear(embed_dim, self.num_heads * self.gate_dim, bias=bias)
        self.scale = self.head_dim ** -0.5
        self.hook_attn_scores = HookPoint()   # (B, H, Nq, Nk) Q Kᵀ/√D + M
        self.hook_pattern = HookPoint()       # (B, H, Nq, Nk) the softmax
        self.hook_ungated = HookPoint()       # (B, N, H, D) Z, before the gate
        self.hook_gate = HookPoint()          # (B, N, H, D or 1) G = σ(x W_g)

    def gates(self, x):
        """G = σ(x W_g): x (B, N, E) → (B, H, N, D) or (B, H, N, 1), through ``hook_gate``."""
        b, n, _ = x.shape
        g = F.sigmoid(F.reshape(self.gate_linear(x), (b, n, self.num_heads, self.gate_dim)))
        return F.transpose(self.hook_gate(g), (0, 2, 1, 3))         # (B, H, N, D or 1)

    def attend(self, q, k, v, attn_mask=None, gate=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D), gate (B, H, Nq, D or 1) or None →
        (B, H, Nq, D)."""
        check_heads(q, k, v, f"{self.name}.attend")
        z, _ = hookable_attention(self, q, k, v, scale=self.scale, causal=self.causal,
                                  mask=attn_mask)                      # (B, H, Nq, D)
        if gate is None:
            return z
        return hooked_heads(self.hook_ungated, z) * gate               # Z ⊙ G

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); ``kv_cache`` a ``KVCache`` (these tokens follow it)."""
        _check_input(self, x)
        q, k, v = _heads_of(self, x)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)                               # (B, Hkv, Nk, D)
        y = self.attend(q, k, v, attn_mask=attn_mask, gate=self.gates(x))
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    @classmethod
    def identities(cls, seed: int = 0):
        """Float64 checks of the gate's own identities: (claim, value, limit)."""
        hx = host_xp
        g = hx.random.default_rng(seed)
        x = g.standard_normal((2, 11, 8))
        layer = cls(8, 2, causal=True).to(dtype="float64").eval()
        out = layer(Tensor(x)).numpy()
        # by hand: mha of the same projections, times σ(x W_g), through W_O
        maps = {n: getattr(layer, f"{n}_proj") for n in ("q", "k", "v", "out")}
        maps["gate"] = layer.gate_linear
        w = {n: to_host(m.weight.data) for n, m in maps.items()}
        bias = {n: to_host(m.bias.data) for n, m in maps.items()}
        heads = [(x @ w[n].T + bias[n]).reshape(2, 11, 2, 4).transpose(0, 2, 1, 3)
                 for n in ("q", "k", "v")]
        z = dense_attention_array(*heads, causal_pattern(11))           # (B, H, N, D)
        gate = 1 / (1 + hx.exp(-(x @ w["gate"].T + bias["gate"])))    # (B, N, E)
        by_hand = (z.transpose(0, 2, 1, 3).reshape(2, 11, 8) * gate) @ w["out"].T + bias["out"]
        # a headwise gate is an elementwise one whose D rows per head are equal
        head = cls(8, 2, causal=True, gate="headwise").to(dtype="float64").eval()
        for name in ("q", "k", "v", "out"):
            getattr(head, f"{name}_proj").load_state_dict(
                getattr(layer, f"{name}_proj").state_dict())
        for p, q in ((layer.gate_linear.weight, head.gate_linear.weight),
                     (layer.gate_linear.bias, head.gate_linear.bias)):
            p.data = get_array_module(q.data).repeat(q.data, 4, axis=0)   # rows h·D … h·D + 3
        elementwise, headwise = layer(Tensor(x)).numpy(), head(Tensor(x)).numpy()
        # decoding one token at a time through a KVCache vs the full causal forward
        cache = layer.new_cache()
        full = layer(Tensor(x)).numpy()
        steps = hx.concatenate([layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy()
                                for t in range(11)], axis=1)
        return [("gated layer − (mha ⊙ σ(x W_g)) W_O by hand, max |Δ|",
                 float(hx.abs(out - by_hand).max()), 1e-12),
                ("headwise gate − elementwise gate with equal rows per head, max |Δ|",
                 float(hx.abs(headwise - elementwise).max()), 1e-12),
                ("decoding through a KVCache − full causal forward, max |Δ|",
                 float(hx.abs(steps - full).max()), 1e-12)]


# ---- forgetting attention ----------------------------------------------------------------

def forget_bias(cum_q, cum_k, causal: bool = True):
    """FoX's bias D_ij = c_i − c_j from cumulative log forget gates: cum_q (B, H, Nq) the
    queries' c, cum_k (B, H, Nk) the keys' → (B, H, Nq, Nk) Tensor. Causal: used only where
    j ≤ i (the product of the gates in between, in logs; the mask removes the rest).
    Non-causal: −|c_i − c_j|, the gates between the two tokens whichever comes first
    (minitx's extension)."""
    diff = F.expand_dims(cum_q, -1) - F.expand_dims(cum_k, -2)       # (B, H, Nq, Nk)
    return diff if causal else -F.abs(diff)


class ForgetCache(KVCache):
    """FoX's decode cache: the keys and values of a ``KVCache`` and, for each cached token,
    the cumulative log forget gate c_t = Σ_{l≤t} log f_l (B, H, length) — all a later query
    needs to form its bias c_i − c_j."""

    def reset(self) -> None:
        super().reset()
        self._cum = None

    @property
    def cumulative(self):
        """c of every cached token (B, H, length) as a Tensor (None when empty)."""
        return None if self._cum is None else Tensor._wrap(self._cum)

    def append_forget(self, log_forget):
        """Add the log forget gates (B, H, n) of the n newest tokens; return c of all cached
        ones (B, H, length) as a Tensor. The running sum continues from the last c, so it
        adds in the same order as the full forward's ``cumsum``."""
        raw = log_forget.data if isinstance(log_forget, Tensor) else log_forget
        xp = get_array_module(raw)
        last = 0.0 if self._cum is None else self._cum[..., -1:]
        new = xp.cumsum(xp.concatenate([xp.zeros_like(raw[..., :1]) + last, raw], -1),
                        axis=-1)[..., 1:]
        self._cum = new if self._cum is None else xp.concatenate([self._cum, new], axis=-1)
        return self.cumulative


# query rows per block of the fused op: a block's scores are (b, N), 2 MiB of float32 at N = 8,192
FOX_BLOCK = 64


def _block_scores(q, k, cum, r0, r1, causal, scale):
    """Rows [r0, r1) of the scores with FoX's bias, over the keys [0, end) that they may see.

    Returns (Q·scale (B, H, b, D), S (B, H, b, end) with −inf above the causal diagonal, the
    slope ∂D/∂(c_i − c_j) (B, H, b, end) of the symmetric bias or None when causal (where it
    is 1), end).
    """
    xp = get_array_module(q, k, cum)
    nq, nk = q.shape[2], k.shape[2]
    off = nk - nq                              # the queries are the last Nq of the Nk tokens
    end = min(nk, r1 + off) if causal else nk  # past it, every key is in each row's future
    qs = q[:, :, r0:r1] * scale
    s = grouped_scores(qs, k[:, :, :end])                                # (B, H, b, end)
    diff = cum[:, :, off + r0:off + r1, None] - cum[:, :, None, :end]    # c_i − c_j
    if not causal:
        s -= xp.abs(diff)
        return qs, s, -xp.sign(diff), end
    s += diff
    # query r0 + t sees key j iff j ≤ r0 + t + off (bottom-right aligned, as everywhere)
    xp.copyto(s, -xp.inf, where=~xp.tri(r1 - r0, end, r0 + off, dtype=bool))
    return qs, s, None, end


class ForgettingAttentionFunction(Function):
    """FoX's attention as one node, by blocks of query rows (the module docstring's last
    paragraph); inputs (q, k, v, cum).

    Shapes: q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv), Hkv | H, Nq ≤ Nk; cum (B, H, Nk) the
    cumulative log forget gates c of the keys, the queries being the last Nq of them. Saved:
    q, k, v, c, the output and the row log-sum-exp ℓ (B, H, Nq, 1); backward recomputes each
    block's P = exp(S − ℓ). Every row sees one key at least (key 0), so no row is empty.
    """

    @staticmethod
    def forward(ctx, q, k, v, cum, *, causal, scale, block):
        xp = get_array_module(q, k, v, cum)
        bsz, h, nq, _ = q.shape
        out = xp.empty((bsz, h, nq, v.shape[-1]), dtype=q.dtype)
        lse = xp.empty((bsz, h, nq, 1), dtype=q.dtype)
        for r0 in range(0, nq, block):
            r1 = min(r0 + block, nq)
            _, s, _, end = _block_scores(q, k, cum, r0, r1, causal, scale)
            m = s.max(axis=-1, keepdims=True)          # finite: key 0 is in every row
            s -= m
            p = xp.exp(s, out=s)                       # the block's P, in the scores' memory
            total = p.sum(axis=-1, keepdims=True)
            p /= total
            out[:, :, r0:r1] = grouped_values(p, v[:, :, :end])                # P V
            lse[:, :, r0:r1] = m + xp.log(total)                               # ℓ
        ctx.save_for_backward(q, k, v, cum, out, lse)
        ctx.options = (causal, scale, block)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, cum, out, lse = ctx.saved_tensors
        causal, scale, block = ctx.options
        xp = get_array_module(q, grad)
        nq, nk, hkv = q.shape[2], k.shape[2], k.shape[1]
        off = nk - nq
        dq, dk, dv, dcum = (xp.zeros_like(a) for a in (q, k, v, cum))   # filled block by block
        for r0 in range(0, nq, block):
            r1 = min(r0 + block, nq)
            qs, s, slope, end = _block_scores(q, k, cum, r0, r1, causal, scale)
            kj, vj = k[:, :, :end], v[:, :, :end]
            s -= lse[:, :, r0:r1]
            p = xp.exp(s, out=s)                                       # P recomputed
            do = grad[:, :, r0:r1]
            delta = (do * out[:, :, r0:r1]).sum(axis=-1, keepdims=True)   # δ = rowsum(dO ⊙ O)
            # Equations (1)–(5) of ops/attention_maths.py on the block, dS formed in dP's
            # memory (two b × N arrays at a time); a key's gradient sums over every block.
            dv[:, :, :end] += grouped_key_grad(p, do, hkv)             # (1) dV += Pᵀ dO
            ds = grouped_scores(do, vj)                                # (2) dP = dO Vᵀ
            ds -= delta
            ds *= p                                                    # (3) dS = P ⊙ (dP − δ)
            dq[:, :, r0:r1] = grouped_values(ds, kj) * scale           # (4) dQ = dS K·scale
            dk[:, :, :end] += grouped_key_grad(ds, qs, hkv)            # (5) dK += dSᵀ Q·scale
            g = ds if slope is None else ds * slope                    # G of the docstring
            dcum[:, :, off + r0:off + r1] += g.sum(axis=-1)            # + row sums (c_i)
            dcum[:, :, :end] -= g.sum(axis=-2)                         # − column sums (c_j)
        return dq, dk, dv, dcum


def forgetting_attention(q, k, v, cum, *, causal: bool = True, scale: float = None,
                         block: int = FOX_BLOCK):
    """softmax(Q Kᵀ·scale + D) V with FoX's bias D from c, by blocks of ``block`` query rows
    (``ForgettingAttentionFunction``): q (B, H, Nq, D), k/v (B, Hkv, Nk, D/Dv), cum (B, H, Nk)
    Tensors, Nq ≤ Nk (the queries are the last Nq tokens) → (B, H, Nq, Dv). ``causal``: the
    bias c_i − c_j under the causal mask; otherwise −|c_i − c_j| over every key. ``scale``
    None → 1/√D. Time O(B·H·Nq·Nk·D), memory O(B·H·(Nq + Nk)·D + B·H·block·Nk)."""
    fn = "forgetting_attention"
    _, h, _, nq, nk, d = check_heads(q, k, v, fn)
    if tuple(cum.shape) != (q.shape[0], h, nk):
        raise ValueError(f"{fn}: cum must be (B, H, Nk) = {(q.shape[0], h, nk)}, got "
                         f"{tuple(cum.shape)}")
    if nq > nk:
        raise ValueError(f"{fn}: the queries are the last Nq of the Nk tokens, so Nq ≤ Nk; got "
                         f"Nq = {nq}, Nk = {nk}")
    block = validate.positive_int(block, "block", owner=fn)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    return ForgettingAttentionFunction.apply(q, k, v, cum, causal=validate.boolean(
        causal, "causal", owner=fn), scale=scale, block=block)


@register("fox")
class ForgettingAttention(AttentionBase):
    r"""Forgetting attention (FoX): softmax attention whose scores get the bias c_i − c_j, the
    log of the forget gates between key j and query i (the module docstring's second formula).

    Formula: the module docstring's second (forgetting attention), per head: f_t =
    σ(w_hᵀ x_t + b_h) from ``forget_linear`` (E → H), c = cumsum(log f), the bias
    D_ij = c_i − c_j added to the scores before the softmax.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, log_forget=None)``:
    q (B, H, Nq, D), k/v (B, Hkv, Nk, D), log_forget (B, H, Nk) the keys' log f (None: all
    gates 1, softmax attention) → (B, H, Nq, D); the queries are the last Nq of the Nk
    tokens. Hooks (besides hook_q/k/v/z): ``hook_forget`` log f (B, H, N), ``hook_bias`` the
    bias D (B, H, Nq, Nk), ``hook_attn_scores`` S and ``hook_pattern`` softmax(S), all
    replaceable.

    Options: ``causal`` (False; FoX is a decoder: ``causal=False`` uses the symmetric bias
    −|c_i − c_j|, minitx's extension), ``num_kv_heads``, ``bias`` (True, the q/k/v/out
    projections'; ``forget_linear`` always has its bias b_h). Decoding: ``kv_cache`` a
    ``ForgetCache`` (``new_cache()``: keys, values and c).

    Complexity: {complexity}, by blocks of b = ``FOX_BLOCK`` query rows
    (``forgetting_attention``). With a hook on the bias, the scores or the pattern set, the
    composed form runs instead (``composed``: those N × N maps are formed, memory O(B·H·N²)).

    Exactness: a different score function (tested against its own dense formula,
    ``reference``); with every gate 1 it is exact causal softmax attention (``identities``).

    Left out or different: FoX's "Pro" block (an output gate, RMSNorm of q and k, the
    data-dependent token shift of k and v) and its flash kernel's ``seq_start`` for left
    padding; the official code computes the gates in float32, minitx in the layer's dtype.

    Reference: Lin, Nikishin, He & Courville (2025), "Forgetting Transformer: Softmax
    Attention with a Forget Gate" (ICLR).
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·N·(D + b))"

    kind = "score"
    supports_kv_cache = True

    def __init__(self, embed_dim, num_heads, causal=False, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.forget_linear = Linear(embed_dim, self.num_heads, bias=True)
        self.scale = self.head_dim ** -0.5
        self.hook_forget = HookPoint()        # (B, H, N) log f
        self.hook_bias = HookPoint()          # (B, H, Nq, Nk) c_i − c_j
        self.hook_attn_scores = HookPoint()   # (B, H, Nq, Nk) Q Kᵀ/√D + bias, −inf masked
        self.hook_pattern = HookPoint()       # (B, H, Nq, Nk) softmax of the scores

    def new_cache(self):
        """An empty ``ForgetCache``: keys, values and the cumulative log forget gates."""
        return ForgetCache()

    def log_forget(self, x):
        """log f = log σ(x W_f + b) = −softplus(−(x W_f + b)): x (B, N, E) → (B, H, N),
        through ``hook_forget``."""
        logits = F.transpose(self.forget_linear(x), (0, 2, 1))           # (B, H, N)
        return self.hook_forget(-F.softplus(-logits))

    def _attend(self, q, k, v, cum):
        """Attention with the bias from c (B, H, Nk) of the keys; the queries take the last Nq.
        By blocks of query rows, unless a hook must see (or replace) an N × N map."""
        if self.hook_bias.active or self.hook_attn_scores.active or self.hook_pattern.active:
            return self.composed(q, k, v, cum)
        return forgetting_attention(q, k, v, cum, causal=self.causal, scale=self.scale)

    def composed(self, q, k, v, cum):
        """The module's formula op by op, through the hooks: the bias D (B, H, Nq, Nk) from c
        (B, H, Nk), the scores, their softmax and the output (B, H, Nq, D) are each formed."""
        nq = q.shape[2]
        bias = self.hook_bias(forget_bias(cum[..., cum.shape[-1] - nq:], cum, self.causal))
        scores = F.attention_scores(q, k, is_causal=self.causal, scale=self.scale,
                                    enable_gqa=True) + bias             # −inf stays −inf
        pattern = self.hook_pattern(F.softmax(self.hook_attn_scores(scores), axis=-1))
        return F.matmul(pattern, repeat_kv(v, q.shape[1]))       # (B, H, Nq, Nk) @ (…, Nk, D)

    def attend(self, q, k, v, log_forget=None):
        """q (B, H, Nq, D), k/v (B, Hkv, Nk, D), log_forget (B, H, Nk) or None →
        (B, H, Nq, D)."""
        _, h, _, nq, nk, _ = check_heads(q, k, v, f"{self.name}.attend")
        if nq > nk:
            raise ValueError(f"{self.name}.attend: the queries are the last Nq of the Nk "
                             f"tokens, so Nq ≤ Nk; got Nq = {nq}, Nk = {nk}")
        if log_forget is None:
            xp = get_array_module(q.data)
            log_forget = Tensor._wrap(xp.zeros((q.shape[0], h, nk), dtype=q.dtype))
        elif tuple(log_forget.shape) != (q.shape[0], h, nk):
            raise ValueError(f"{self.name}.attend: log_forget must be (B, H, Nk) = "
                             f"{(q.shape[0], h, nk)}, got {tuple(log_forget.shape)}")
        return self._attend(q, k, v, F.cumsum(log_forget, axis=-1))

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); ``kv_cache`` a ``ForgetCache`` (these tokens follow it)."""
        _check_input(self, x)
        if attn_mask is not None:
            raise ValueError(f"{type(self).__name__} ({self.name}) does not take an attn_mask")
        q, k, v = _heads_of(self, x)
        log_f = self.log_forget(x)                                     # (B, H, N)
        if kv_cache is None:
            y = self.attend(q, k, v, log_forget=log_f)
        else:
            if not isinstance(kv_cache, ForgetCache):
                raise TypeError(f"{type(self).__name__} ({self.name}): kv_cache must be a "
                                f"ForgetCache (from new_cache()), got {type(kv_cache).__name__}")
            k, v = kv_cache.append(k, v)
            y = self._attend(q, k, v, kv_cache.append_forget(log_f))
        return self.out_proj(merge_heads(hooked_heads(self.hook_z, y)))

    def reference(self, q, k, v, log_forget=None):
        """Raw arrays: softmax(q kᵀ/√D + D) v with D_ij = Σ_{j<l≤i} log f_l summed term by
        term (an indicator tensor, not a cumulative sum); log_forget (B, H, N) or None (0)."""
        xp = get_array_module(q)
        b, h, n, d = q.shape
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        lf = xp.zeros((b, h, n), dtype=q.dtype) if log_forget is None else log_forget
        pos = xp.arange(n)
        i, j, l_ = pos[:, None, None], pos[None, :, None], pos[None, None, :]
        between = ((l_ > xp.minimum(i, j)) & (l_ <= xp.maximum(i, j))).astype(q.dtype)
        bias = xp.einsum("ijl,bhl->bhij", between, lf)                 # (B, H, N, N)
        s = xp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d) + bias
        allowed = causal_pattern(n, n, xp) if self.causal else None
        return softmax_rows_array(s, allowed) @ v

    @classmethod
    def identities(cls, seed: int = 0):
        """Float64 checks of forgetting attention's own identities: (claim, value, limit)."""
        hx = host_xp
        g = hx.random.default_rng(seed)
        layer = cls(8, 2, causal=True).to(dtype="float64").eval()
        q, k, v = (g.standard_normal((2, 2, 13, 4)) for _ in range(3))
        log_f = -g.uniform(0.0, 2.0, (2, 2, 13))
        qt, kt, vt = (Tensor(a) for a in (q, k, v))
        ones = layer.attend(qt, kt, vt, log_forget=Tensor(hx.zeros((2, 2, 13)))).numpy()
        softmax = dense_attention_array(q, k, v, causal_pattern(13))
        out = layer.attend(qt, kt, vt, log_forget=Tensor(log_f)).numpy()
        ref = layer.reference(q, k, v, log_f)
        # decoding one token at a time through a ForgetCache vs the full causal forward
        x = g.standard_normal((2, 9, 8))
        full = layer(Tensor(x)).numpy()
        cache = layer.new_cache()
        steps = hx.concatenate([layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy()
                                for t in range(9)], axis=1)
        return [("every forget gate 1 (log f = 0) − causal softmax attention, max |Δ|",
                 float(hx.abs(ones - softmax).max()), 1e-12),
                ("cumsum form c_i − c_j − dense bias Σ_{j<l≤i} log f_l, max |Δ|",
                 float(hx.abs(out - ref).max()), 1e-12),
                ("decoding through a ForgetCache − full causal forward, max |Δ|",
                 float(hx.abs(steps - full).max()), 1e-12)]
