r"""Attention's maths on raw arrays: the formula, its one backward, the mask, grouped heads.

The one formula behind every transformer (Vaswani et al. 2017, "Attention Is All You Need"),
for queries Q (…, Nq, D), keys K (…, Nk, D), values V (…, Nk, Dv) and a mask M (…, Nq, Nk):

$$
S = \frac{Q K^\top}{\sqrt{D}} + M, \qquad P = \operatorname{softmax}(S), \qquad O = \tilde{P} V
$$

The softmax runs over keys; a ``scale`` given replaces the default $1/\sqrt{D}$. M is −inf
where a query may not look, or any additive bias (ALiBi, relative positions, padding).
Dropout with probability p keeps each weight by a mask $\mathrm{keep} \in \{0, 1\}$ and
rescales: $\tilde{P} = P \odot \mathrm{keep} / (1 - p)$; without dropout $\tilde{P} = P$.

**The backward, derived once.** Given $dO = \partial L / \partial O$:

$$
\begin{array}{rcll}
dV & = & \tilde{P}^\top dO & \qquad (1) \\
dP & = & (dO\, V^\top) \odot \mathrm{keep} / (1 - p) & \qquad (2) \\
dS & = & P \odot (dP - \delta) & \qquad (3) \\
dQ & = & dS\, K / \sqrt{D} & \qquad (4) \\
dK & = & dS^\top Q / \sqrt{D} & \qquad (5)
\end{array}
$$

$$
\delta_i = \sum_j dP_{ij} P_{ij} = dO_i \cdot O_i
$$

(1) and (2): O is linear in V and in P̃. (3) is softmax's own backward (``ops.activation``),
with one saving: the row sum δ costs O(N²) as written, but
$\sum_j P_{ij}\, dP_{ij} = \sum_j \tilde{P}_{ij} (dO_i \cdot V_j) = dO_i \cdot O_i$, an O(N·D)
sum. (4) and (5): S is bilinear in Q and K. ``attention_backward`` below is these five
equations, in this order; ``SDPAFunction`` calls it on whole matrices, the tiled
FlashAttention (``ops/flash.py``) per tile, with P recomputed from the saved logsumexp.

**The mask, in one place.** ``mask_scores`` applies M. A bool mask means True = may attend; a
float mask is added to the scores. Causal masks are **bottom-right aligned** everywhere in
minitx: with Nq queries and Nk keys, query i may see key j iff j ≤ i + (Nk − Nq), i.e. the
queries are the *last* Nq positions (what a KV cache needs). A row whose keys are *all* masked
gets P = 0, so a zero output and zero gradients, never NaN.

**Grouped heads (MQA/GQA).** K and V may have Hkv heads, Hkv | H: query head h reads
key/value head h // G, G = H/Hkv. Query heads of a group are contiguous, so q viewed as
(B, Hkv, G·Nq, D) meets its shared key head in one matmul, with no copy of K or V (the
``grouped_*`` helpers).

PyTorch's API around this maths (argument checks, mask conversion, the choice between the
CUDA kernel, this reference and its fast twin) is ``ops/sdpa.py``.
"""
from __future__ import annotations

import math

from ..autograd.function import Function
from ..backend import get_array_module, to_device_of
from ._util import unbroadcast
from .activation import softmax_array
from .dropout import dropout_mask

# The tiled flash, the sparse kernel and the fast twin reuse these instead of restating them.
__all__ = ["mask_scores", "attention_forward", "attention_backward", "grouped_scores",
           "grouped_values", "grouped_key_grad", "SDPAFunction", "AttentionScoresFunction"]


# ---- grouped heads: H query heads against Hkv key/value heads, without copying K or V --------

def grouped_scores(qs, k):
    """(B, H, n, D) · (B, Hkv, m, D) → (B, H, n, m): query head h against key head h // G."""
    b, h, n, d = qs.shape
    hkv, m = k.shape[1], k.shape[2]
    xp = get_array_module(qs, k)
    # (B, Hkv, G·n, D) @ (B, Hkv, D, m) -> (B, Hkv, G·n, m) ≡ (B, H, n, m)
    return (qs.reshape(b, hkv, (h // hkv) * n, d) @ xp.swapaxes(k, -1, -2)).reshape(b, h, n, m)


def grouped_values(p, v):
    """(B, H, n, m) · (B, Hkv, m, Dv) → (B, H, n, Dv): weights of head h applied to V[h // G]
    (also dQ = dS K, with K in V's place)."""
    b, h, n, m = p.shape
    hkv, dv = v.shape[1], v.shape[3]
    # (B, Hkv, G·n, m) @ (B, Hkv, m, Dv) -> (B, Hkv, G·n, Dv) ≡ (B, H, n, Dv)
    return (p.reshape(b, hkv, (h // hkv) * n, m) @ v).reshape(b, h, n, dv)


def grouped_key_grad(ds, x, hkv: int):
    """(B, H, n, m), (B, H, n, X) → (B, Hkv, m, X) = Σ over each group of dsᵀ x: the gradient
    of a shared key/value head is the sum over the query heads that read it — the matmul over
    the group's G·n rows does the sum."""
    b, h, n, m = ds.shape
    xp = get_array_module(ds, x)
    rows = (h // hkv) * n
    # (B, Hkv, m, G·n) @ (B, Hkv, G·n, X) -> (B, Hkv, m, X)
    return xp.swapaxes(ds.reshape(b, hkv, rows, m), -1, -2) @ x.reshape(b, hkv, rows, x.shape[-1])


# ---- the reference: forward and backward on raw arrays -----------------------------------

def mask_scores(s, bias=None, allowed=None, causal=False):
    """M of the module's formula, applied in place to fresh scores ``s`` (…, Nq, Nk).

    ``bias`` (float) and ``allowed`` (bool, True = may attend) broadcast to ``s``; ``causal``
    hides key j > i + Nk − Nq. Every dense attention of minitx masks its scores here, so the
    mask rules are written once. Returns ``s``.
    """
    xp = get_array_module(s)
    if bias is not None:
        s += bias.astype(s.dtype, copy=False)
    if causal:
        nq, nk = s.shape[-2:]
        xp.copyto(s, -xp.inf, where=~xp.tri(nq, nk, nk - nq, dtype=bool))
    if allowed is not None:
        xp.copyto(s, -xp.inf, where=~to_device_of(allowed, s))
    return s


def attention_forward(q, k, v, bias=None, allowed=None, causal=False, scale=None,
                      dropout_p=0.0):
    """The module's formula on raw arrays, whole matrices at once: the reference.

    q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` and ``allowed``
    broadcastable to (B, H, Nq, Nk) (see ``mask_scores``); ``scale`` None → 1/√D. Returns
    (O (B, H, Nq, Dv), P (B, H, Nq, Nk) before dropout, ``keep_scaled``: the dropout mask
    already divided by 1 − p, or None). Time O(B·H·Nq·Nk·D), memory O(B·H·Nq·Nk).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = grouped_scores(q * scale, k)                      # S before M   (B, H, Nq, Nk)
    mask_scores(s, bias, allowed, causal)
    p = softmax_array(s, inplace=True)                    # a row with no key: P = 0
    keep_scaled = dropout_mask(p.shape, dropout_p, p) if dropout_p > 0 else None
    o = grouped_values(p if keep_scaled is None else p * keep_scaled, v)   # (B, H, Nq, Dv)
    return o, p, keep_scaled


def attention_backward(do, p, qs, k, v, delta, scale, keep_scaled=None):
    """Equations (1)–(5) of the module docstring, in order.

    do (B, H, n, Dv), p (B, H, n, m) the probabilities before dropout, qs = Q·scale
    (B, H, n, D), k (B, Hkv, m, D), v (B, Hkv, m, Dv), delta (B, H, n, 1) the δ of (3),
    ``keep_scaled`` the dropout mask already divided by 1 − p (``attention_forward``'s), or
    None. Returns (dq (B, H, n, D), dk (B, Hkv, m, D), dv (B, Hkv, m, Dv), ds (B, H, n, m));
    a bias's gradient is ds un-broadcast.
    """
    hkv = k.shape[1]
    dropped = p if keep_scaled is None else p * keep_scaled    # P̃
    dv = grouped_key_grad(dropped, do, hkv)                # (1)
    dp = grouped_scores(do, v)                             # (2), without dropout
    if keep_scaled is not None:
        dp *= keep_scaled                                  # (2): the 1/(1 − p) is inside
    ds = p * (dp - delta)                                  # (3)
    dq = grouped_values(ds, k) * scale                     # (4)
    dk = grouped_key_grad(ds, qs, hkv)                     # (5): qs carries the scale
    return dq, dk, dv, ds


class SDPAFunction(Function):
    """The module's formula as one autograd node; inputs (q, k, v, bias).

    Shapes: q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` None or
    (B|1, H|1, Nq|1, Nk|1) (differentiable); ``allowed`` bool of the same form (True = may
    attend) or None; ``causal`` adds the bottom-right causal mask. Forward is
    ``attention_forward``, saving Q·scale, K, V, O, P and the dropout mask (memory
    O(B·H·Nq·Nk)); backward is ``attention_backward``, and the bias's gradient is dS
    un-broadcast. Masked entries have P = 0, hence dS = 0: fully masked rows get zero
    gradients.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, *, allowed, causal, scale, dropout_p):
        o, p, keep_scaled = attention_forward(q, k, v, bias, allowed, causal, scale, dropout_p)
        ctx.save_for_backward(q * scale, k, v, o, p, keep_scaled)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return o

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, o, p, keep_scaled = ctx.saved_tensors
        delta = (grad * o).sum(axis=-1, keepdims=True)            # δ of (3), O(N·D)
        dq, dk, dv, ds = attention_backward(grad, p, qs, k, v, delta, ctx.scale, keep_scaled)
        dbias = unbroadcast(ds, *ctx.bias_meta) if ctx.needs_input_grad[3] else None
        return dq, dk, dv, dbias


class AttentionScoresFunction(Function):
    """S of the module's formula as one node (−inf where masked); inputs (q, k, bias).

    The first stage of attention on its own, for the composed form (``attention_scores``):
    shapes as in ``SDPAFunction``, output (B, H, Nq, Nk). Backward: equations (4) and (5)
    with dS the incoming gradient, zero where a mask put −inf (those scores are constants);
    the bias's gradient is dS un-broadcast.
    """

    @staticmethod
    def forward(ctx, q, k, bias, *, allowed, causal, scale):
        qs = q * scale
        s = mask_scores(grouped_scores(qs, k), bias, allowed, causal)
        masked = allowed is not None or causal or bias is not None
        ctx.save_for_backward(qs, k, get_array_module(s).isfinite(s) if masked else None)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return s

    @staticmethod
    def backward(ctx, grad):
        qs, k, visible = ctx.saved_tensors
        ds = grad if visible is None else grad * visible      # a masked score passes nothing
        dq = grouped_values(ds, k) * ctx.scale                         # (4)
        dk = grouped_key_grad(ds, qs, k.shape[1])                      # (5)
        dbias = unbroadcast(ds, *ctx.bias_meta) if ctx.needs_input_grad[2] else None
        return dq, dk, dbias
