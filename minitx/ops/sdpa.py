r"""Scaled dot-product attention: the formula, its backward, PyTorch's API.

The one formula behind every transformer (Vaswani et al. 2017, "Attention Is All You Need"):

    S = Q Kᵀ · scale + M,     P = softmax(S) (over keys),     O = P V,     scale = 1/√D,

$$
O = \operatorname{softmax}\!\left( \frac{Q K^\top}{\sqrt{D}} + M \right) V
$$

Q (…, Nq, D), K (…, Nk, D), V (…, Nk, Dv); M is the mask: −inf where a query may not look, or
any additive bias (ALiBi, relative positions, padding). With dropout, O = P̃ V, P̃ = P ⊙ keep/(1−p).

**The backward, derived once.** Given dO = ∂L/∂O:

    (1) dV = P̃ᵀ dO                          O = P̃ V is linear in V
    (2) dP = (dO Vᵀ) ⊙ keep/(1 − p)         … and in P̃
    (3) dS = P ⊙ (dP − δ),  δ = rowsum(dP ⊙ P) = rowsum(dO ⊙ O)     softmax's VJP
    (4) dQ = dS K · scale                   S = (Q·scale) Kᵀ
    (5) dK = dSᵀ Q · scale

$$
dV = \tilde{P}^\top dO, \quad
dP = \frac{(dO\, V^\top) \odot \mathrm{keep}}{1 - p}, \quad
dS = P \odot (dP - \delta), \quad
dQ = \frac{dS\, K}{\sqrt{D}}, \quad
dK = \frac{dS^\top Q}{\sqrt{D}}
$$

with $\delta_i = \sum_j dP_{ij} P_{ij} = dO_i \cdot O_i$.

(3) is softmax's own backward (``ops.activation``); attention can use the cheaper
δ = rowsum(dO ⊙ O), an O(N·D) sum instead of O(N²), because rowsum(dP ⊙ P) =
Σⱼ Pᵢⱼ (dOᵢ · Vⱼ) = dOᵢ · Oᵢ. ``attention_backward`` below is these five lines, in this order;
``SDPAFunction`` calls it on whole matrices, the tiled FlashAttention (``ops/flash.py``) per tile
with P recomputed from the saved logsumexp.

**Masks.** A bool mask means True = may attend (PyTorch's polarity for this function); a float
mask is added to the scores. Causal masks are **bottom-right aligned** everywhere in minitx:
with Nq queries and Nk keys, query i may see key j iff j ≤ i + (Nk − Nq), i.e. the queries are
the *last* Nq positions (what a KV cache needs). PyTorch's ``is_causal`` is top-left aligned
(j ≤ i); the two agree when Nq = Nk. A row whose keys are *all* masked gives a zero output and
zero gradients, never NaN. ``mask_scores`` applies every mask, in one place. A self-attention
mask that hides every query's own position is almost always a mask of the other polarity
(``MultiheadAttention``'s True = NOT allowed given here, or the reverse): it warns, one rule
for every caller (``warn_if_polarity_inverted``).

**Grouped heads (MQA/GQA).** K and V may have Hkv heads, Hkv | H: query head h reads key/value
head h // G, G = H/Hkv. Query heads of a group are contiguous, so q viewed as (B, Hkv, G·Nq, D)
meets its shared key head in one matmul — no copy of K or V (``grouped_*`` helpers).

**One reference, two other ways to run it.** ``attention_forward`` is dense attention on raw
arrays, whole matrices at once; ``SDPAFunction`` (one autograd node), ``dense_attention_array``
and the site's proofs run it, and the composed form — ``attention_scores``, then softmax, then
P V, each an op of its own — is what ``attention_weights`` and the hookable path of the models
build on (tested to agree). When the fast layer is on (``minitx.config.fast``), the fused op runs
its twin in ``minitx/fast/sdpa.py`` instead: the same maths by cache-sized blocks on every core;
``configuration.why_not_fast("sdpa")`` says when it does not. On CuPy arrays, with at most
causal and key-padding masks, no dropout and no weights requested, the hand-written CUDA kernel
runs instead of either (``ops/dispatch.py``, ``why_not_flash``).
"""
from __future__ import annotations

import math
import os
import sys
import warnings

from .. import configuration, validate
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from . import dispatch
from ._util import unbroadcast

# The differentiable ops the composed form (scores → softmax → dropout → P V) is built from.
from .activation import softmax, softmax_array
from .dropout import dropout, dropout_mask
from .elementwise import astype
from .indexing import masked_fill
from .linalg import matmul
from .shape import broadcast_to, reshape

# The grouped_* helpers, mask_scores and attention_backward are public: the tiled flash,
# the sparse kernel and the fast twin reuse them instead of restating the maths.
__all__ = ["scaled_dot_product_attention", "attention_weights", "attention_scores",
           "why_not_flash", "split_heads", "merge_heads", "repeat_kv", "check_heads",
           "mask_scores", "attention_forward", "attention_backward", "grouped_scores",
           "grouped_values", "grouped_key_grad", "SDPAFunction", "AttentionScoresFunction",
           "merge_masks", "check_scale", "hides_own_positions", "warn_if_polarity_inverted"]


# ---- head bookkeeping --------------------------------------------------------------------

def split_heads(x, num_heads: int):
    """(B, N, H·D) → (B, H, N, D)."""
    b, n, e = x.shape
    return x.reshape(b, n, num_heads, e // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(B, H, N, D) → (B, N, H·D)."""
    b, h, n, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def repeat_kv(x, num_heads: int):
    """Repeat key/value heads so (B, Hkv, N, D) becomes (B, H, N, D) (for MQA/GQA).

    Head h of the query uses key/value head h // (H / Hkv), as in PyTorch's enable_gqa.
    Differentiable: the gradient of a shared head is the sum over the query heads using it.
    """
    b, hkv, n, d = x.shape
    if hkv == num_heads:
        return x
    group = num_heads // hkv
    x = reshape(x, (b, hkv, 1, n, d))
    x = broadcast_to(x, (b, hkv, group, n, d))
    return reshape(x, (b, num_heads, n, d))


def check_heads(q, k, v, name: str = "attend"):
    """Validate (B, H, Nq, D) / (B, Hkv, Nk, D) / (B, Hkv, Nk, Dv) and return the sizes.

    Raises ValueError naming the argument, the expected and the given shape.
    """
    for arg, t in (("query", q), ("key", k), ("value", v)):
        if len(t.shape) != 4:
            raise ValueError(f"{name}: {arg} must be 4-d (B, H, N, D), got shape {_shape(t)}")
    # Batch sizes equal, D shared by q and k, k and v of one head count and length, Hkv | H.
    b, h, nq, d = q.shape
    bk, hk, nk, dk = k.shape
    bv, hv, nv, _ = v.shape
    if bk != b or bv != b:
        raise ValueError(f"{name}: batch sizes differ: query {b}, key {bk}, value {bv}")
    if dk != d:
        raise ValueError(f"{name}: key head dim must equal query head dim {d}, got {dk}")
    if hk != hv or nk != nv:
        raise ValueError(f"{name}: key {_shape(k)} and value {_shape(v)} must share "
                         "heads and length")
    if h % hk:
        raise ValueError(f"{name}: key/value head count {hk} must divide the query head "
                         f"count {h}")
    return b, h, hk, nq, nk, d


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
    """M of the formula, applied in place to fresh scores ``s`` (…, Nq, Nk): add ``bias``, then
    −inf where ``allowed`` is False and, with ``causal``, where key j > i + Nk − Nq.

    ``bias`` and ``allowed`` broadcast to ``s`` (True = may attend). Every path of minitx's dense
    attention masks its scores here, so the mask rules are written once. Returns ``s``.
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
    """O = dropout(softmax(Q Kᵀ·scale + M)) V on raw arrays: the reference, whole matrices.

    q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` and ``allowed``
    broadcastable to (B, H, Nq, Nk) (see ``mask_scores``); ``scale`` None → 1/√D. Returns
    (O (B, H, Nq, Dv), P (B, H, Nq, Nk) before dropout, keep: the dropout mask or None).
    A row with no allowed key has P = 0, hence O = 0. Time O(B·H·Nq·Nk·D), memory O(B·H·Nq·Nk).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = grouped_scores(q * scale, k)                      # S = (Q·scale) Kᵀ   (B, H, Nq, Nk)
    mask_scores(s, bias, allowed, causal)                 #   + M
    p = softmax_array(s, inplace=True)                    # P = softmax(S); no key: P = 0
    keep = dropout_mask(p.shape, dropout_p, p) if dropout_p > 0 else None
    o = grouped_values(p if keep is None else p * keep, v)    # O = P̃ V   (B, H, Nq, Dv)
    return o, p, keep


def attention_backward(do, p, qs, k, v, delta, scale, keep=None):
    """The five equations of the module docstring, in order.

    do (B, H, n, Dv), p (B, H, n, m) the probabilities before dropout, qs = Q·scale
    (B, H, n, D), k (B, Hkv, m, D), v (B, Hkv, m, Dv), delta (B, H, n, 1) = rowsum(dO ⊙ O),
    ``keep`` the scaled dropout mask or None. Returns (dq (B, H, n, D), dk (B, Hkv, m, D),
    dv (B, Hkv, m, Dv), ds (B, H, n, m)); a bias's gradient is ds un-broadcast.
    """
    hkv = k.shape[1]
    dropped = p if keep is None else p * keep              # P̃
    dv = grouped_key_grad(dropped, do, hkv)                # (1) dV = P̃ᵀ dO
    dp = grouped_scores(do, v)                             # (2) dP = dO Vᵀ …
    if keep is not None:
        dp *= keep                                         #     … ⊙ keep/(1 − p)
    ds = p * (dp - delta)                                  # (3) dS = P ⊙ (dP − δ)
    dq = grouped_values(ds, k) * scale                     # (4) dQ = dS K · scale
    dk = grouped_key_grad(ds, qs, hkv)                     # (5) dK = dSᵀ (Q · scale)
    return dq, dk, dv, ds


class SDPAFunction(Function):
    """O = dropout(softmax(Q Kᵀ·scale + bias, masked)) V as one node; inputs (q, k, v, bias).

    Shapes: q (B, H, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv), Hkv | H; ``bias`` None or
    (B|1, H|1, Nq|1, Nk|1) (differentiable); ``allowed`` bool of the same form (True = may
    attend) or None; ``causal`` adds the bottom-right causal mask. Forward is
    ``attention_forward``; it saves Q·scale, K, V, O, P and the dropout mask, and backward is
    ``attention_backward`` with δ = rowsum(dO ⊙ O), dBias = dS un-broadcast. Masked entries
    have P = 0, hence dS = 0: fully masked rows get zero gradients.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, *, allowed, causal, scale, dropout_p):
        o, p, keep = attention_forward(q, k, v, bias, allowed, causal, scale, dropout_p)
        ctx.save_for_backward(q * scale, k, v, o, p, keep)
        ctx.scale = scale
        ctx.bias_meta = None if bias is None else (bias.shape, bias.dtype)
        return o

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, o, p, keep = ctx.saved_tensors
        delta = (grad * o).sum(axis=-1, keepdims=True)            # δ = rowsum(dO ⊙ O)
        dq, dk, dv, ds = attention_backward(grad, p, qs, k, v, delta, ctx.scale, keep)
        dbias = unbroadcast(ds, *ctx.bias_meta) if ctx.needs_input_grad[3] else None
        return dq, dk, dv, dbias


class AttentionScoresFunction(Function):
    """S = Q Kᵀ·scale + bias, −inf where masked, as one node; inputs (q, k, bias).

    The first stage of attention on its own, for the composed form (``attention_scores``):
    shapes as in ``SDPAFunction``, output (B, H, Nq, Nk). Backward: equations (4) and (5)
    with dS the incoming gradient, zero where a mask put −inf (those scores are constants);
    dBias = dS un-broadcast.
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

    # Backward: a masked score was the constant −inf, so it passes no gradient; then
    # equations (4) and (5).
    @staticmethod
    def backward(ctx, grad):
        qs, k, visible = ctx.saved_tensors
        ds = grad if visible is None else grad * visible
        dq = grouped_values(ds, k) * ctx.scale                         # (4) dQ = dS K · scale
        dk = grouped_key_grad(ds, qs, k.shape[1])                      # (5) dK = dSᵀ (Q · scale)
        dbias = unbroadcast(ds, *ctx.bias_meta) if ctx.needs_input_grad[2] else None
        return dq, dk, dbias


# ---- argument checking and mask plumbing -------------------------------------------------

def _shape(t):
    return tuple(t.shape)


def check_scale(fn: str, scale, d: int) -> float:
    """``scale`` None → 1/√D; else a finite number > 0 (not bool): one rule for SDPA and flash."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    return validate.positive_real(scale, "scale", owner=fn)


def _check_qkv(fn, query, key, value, enable_gqa):
    """Validate (…, H, Nq, D) / (…, Hkv, Nk, D) / (…, Hkv, Nk, Dv); return the 4-d sizes."""
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}: {arg} must be a Tensor, got {type(t).__name__}")
        if len(t.shape) < 2:
            raise ValueError(f"{fn}: {arg} must have at least 2 dims (…, N, D), got shape "
                             f"{_shape(t)}")
    # Shapes fit together: one rank for all three, q and k share D, k and v share all but
    # the last dim, equal batch dims.
    nd = len(query.shape)
    if len(key.shape) != nd or len(value.shape) != nd:
        raise ValueError(f"{fn}: query, key and value must have the same number of dims, got "
                         f"query {_shape(query)}, key {_shape(key)}, value {_shape(value)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"{fn}: key must have query's last dim (D={query.shape[-1]}), got key "
                         f"shape {_shape(key)}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"{fn}: value must match key in every dim but the last: expected "
                         f"{_shape(key)[:-1] + ('Dv',)}, got {_shape(value)}")
    if query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"{fn}: batch dims differ: query {_shape(query)[:-3]}, key "
                         f"{_shape(key)[:-3]}")
    # Heads: equal counts, or (enable_gqa) Hkv dividing H; the leading dims fold into one B.
    h = query.shape[-3] if nd >= 3 else 1
    hkv = key.shape[-3] if nd >= 3 else 1
    if h != hkv and not (enable_gqa and h % hkv == 0):
        hint = (" (pass enable_gqa=True to share key/value heads)" if h % hkv == 0 else
                f" (with enable_gqa the key/value head count must divide {h})")
        raise ValueError(f"{fn}: key/value have {hkv} heads but query has {h}{hint}")
    b = 1
    for n in query.shape[:-3]:
        b *= n
    return b, h, hkv, query.shape[-2], key.shape[-2]


def _mask_to_4d(fn, mask, lead, h, nq, nk):
    """Bring a mask broadcastable to (*lead, H, Nq, Nk) to (B or 1, H or 1, Nq or 1, Nk or 1).

    Works on raw arrays and on Tensors (through differentiable reshape/broadcast ops).
    """
    is_t = isinstance(mask, Tensor)
    data = mask.data if is_t else mask
    target = tuple(lead) + (h, nq, nk)
    shape = tuple(data.shape)
    # Each mask dim is 1 or the target's (broadcasting, right-aligned); then leading 1s pad the
    # shape to the target's rank.
    if len(shape) > len(target) or any(m not in (1, t) for m, t in
                                       zip(shape[::-1], target[::-1])):
        raise ValueError(f"{fn}: attn_mask of shape {shape} does not broadcast to "
                         f"(…batch, H, Nq, Nk) = {target}")
    shape = (1,) * (len(target) - len(shape)) + shape
    # No batch dims to keep: one leading 1. Otherwise the batch dims are broadcast, then folded
    # into B.
    if all(n == 1 for n in shape[:-3]):
        new = (1,) + shape[-3:]
        return reshape(mask, new) if is_t else data.reshape(new)
    full = tuple(lead) + shape[-3:]
    b = 1
    for n in lead:
        b *= n
    if is_t:
        return reshape(broadcast_to(reshape(mask, shape), full), (b,) + shape[-3:])
    xp = get_array_module(data)
    return xp.broadcast_to(data.reshape(shape), full).reshape((b,) + shape[-3:])


def _prepare(fn, query, key, value, attn_mask, scale, enable_gqa):
    """Shared checks: 4-d views of q/k/v, the bool ``allowed`` array and the float ``bias``."""
    b, h, hkv, nq, nk = _check_qkv(fn, query, key, value, enable_gqa)
    lead = tuple(query.shape[:-3])
    d, dv = query.shape[-1], value.shape[-1]
    q4 = reshape(query, (b, h, nq, d))
    k4 = reshape(key, (b, hkv, nk, d))
    v4 = reshape(value, (b, hkv, nk, dv))
    # A bool mask becomes `allowed` (True = may attend), a float mask the additive `bias`; both
    # are brought to 4-d and onto the data's device. An int mask is refused as ambiguous.
    allowed = bias = None
    if attn_mask is not None:
        mdata = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
        if not hasattr(mdata, "dtype"):
            raise TypeError(f"{fn}: attn_mask must be an array or Tensor, got "
                            f"{type(attn_mask).__name__}")
        if mdata.dtype == bool:                     # a host mask enters the device once, here
            allowed = _mask_to_4d(fn, to_device_of(mdata, query.data), lead, h, nq, nk)
        elif mdata.dtype.kind == "f":
            bias = _mask_to_4d(fn, to_device_of(attn_mask, query.data), lead, h, nq, nk)
        else:
            raise TypeError(f"{fn}: attn_mask must be bool (True = may attend) or float "
                            f"(added to the scores), got dtype {mdata.dtype} (an int 1/0 "
                            "mask is ambiguous: use mask.astype(bool))")
        # A self-attention mask hiding every query's own key is almost surely of the other
        # polarity: warn.
        warn_if_polarity_inverted(allowed if bias is None else bias, nq, nk)
    return q4, k4, v4, allowed, bias, check_scale(fn, scale, d), lead, (b, h, nq, dv)


# ---- mask polarity: the silent trap --------------------------------------------------------
# Two conventions meet in every PyTorch port: scaled_dot_product_attention's bool mask is
# True = may attend, nn.MultiheadAttention's is True = NOT allowed. A mask of the wrong one
# runs without error; in self-attention it shows as every query's own key being hidden (a
# causal mask turns anti-causal, a band turns into its complement). Every bool or float mask
# reaching attention (this op, the composed form, the models, the registry's variants) passes
# through ``_prepare``, so the rule below is checked there, once, for all of them.

POLARITY_WARNING = (
    "attn_mask hides every query's own position in self-attention (Nq = Nk = {n}): check its "
    "polarity. For scaled_dot_product_attention and the registry's variants a bool mask is "
    "True where attention is allowed (True = may attend); for MultiheadAttention and the "
    "transformer layers it is True where attention is NOT allowed (PyTorch's rule for "
    "modules). A mask of the other polarity is inverted: a lower-triangular causal mask "
    "becomes anti-causal. Pass ~mask, or is_causal=True instead of a causal mask.")


def hides_own_positions(allowed, nq: int, nk: int) -> bool:
    """True when a self-attention mask lets no query attend to its own position.

    ``allowed``: bool (True = may attend) or float (−inf = may not), of shape (…, Nq, Nk); an
    array or a Tensor. Only a mask whose last two dims are (Nq, Nk) with Nq = Nk ≥ 1 is
    judged: in cross-attention (Nq ≠ Nk), or for a mask broadcast along queries (a key-padding
    mask (…, 1, Nk)), the diagonal means nothing. (Cross-attention between sequences of one
    length looks like self-attention here; a mask hiding every (i, i) is odd there too.)
    O(…·N) reads. To silence it where it is meant (a strictly causal j < i mask):
    ``warnings.filterwarnings("ignore", message="attn_mask hides every query")``.
    """
    data = allowed.data if isinstance(allowed, Tensor) else allowed
    if nq != nk or nq == 0 or tuple(data.shape[-2:]) != (nq, nk):
        return False
    xp = get_array_module(data)
    own = xp.diagonal(data, axis1=-2, axis2=-1)             # (…, N): query i's own key i
    return not bool((own if own.dtype == bool else own != -xp.inf).any())


def _first_frame_outside_minitx() -> int:
    """The ``stacklevel`` that points a warning at the caller's line, not at minitx's code."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2                     # 1 is the function that warns
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_polarity_inverted(allowed, nq: int, nk: int) -> None:
    """Warn (``UserWarning``, at the caller's line) when ``hides_own_positions``: the message
    names both polarities, SDPA's and the modules'."""
    if hides_own_positions(allowed, nq, nk):
        warnings.warn(POLARITY_WARNING.format(n=nq), UserWarning,
                      stacklevel=_first_frame_outside_minitx())


def _key_mask(allowed, b, nk):
    """A bool (B|1, 1, 1, Nk) mask is a key-padding mask: as (B, Nk), the kernel takes it."""
    if allowed is None or allowed.shape[1] != 1 or allowed.shape[2] != 1 or \
            allowed.shape[3] != nk:
        return None
    xp = get_array_module(allowed)
    return xp.ascontiguousarray(xp.broadcast_to(allowed[:, 0, 0, :], (b, nk)))


def _widen_half(*tensors):
    """float16 tensors as float32 (differentiable casts), others as they are: the array code
    computes half-precision attention in float32 — scores of inputs of size 300 at D = 16
    already overflow float16's 65,504 — and casts the result back (PyTorch's CPU math path
    does the same). The CUDA kernel keeps float16 inputs and accumulates in float32 itself."""
    return [t if t is None or not isinstance(t, Tensor) or t.dtype != "float16"
            else astype(t, "float32") for t in tensors]


def _unflatten(t, lead, nd):
    """(B, H, N, X) back to the caller's layout (*lead, H, N, X), or (N, X) for 2-d inputs."""
    if nd == 4:
        return t
    h, n, x = t.shape[1:]
    return reshape(t, (n, x) if nd == 2 else tuple(lead) + (h, n, x))


# ---- the functional API ------------------------------------------------------------------

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float = None,
                                 enable_gqa: bool = False, return_weights: bool = False):
    """softmax(Q Kᵀ · scale + M) V — PyTorch's ``F.scaled_dot_product_attention``.

    Shapes: query (…, H, Nq, D), key (…, Hkv, Nk, D), value (…, Hkv, Nk, Dv) → (…, H, Nq, Dv),
    any number of leading batch dims (also (N, D) without heads). Hkv ≠ H needs
    ``enable_gqa=True`` and Hkv | H (query head h uses key/value head h // (H/Hkv)).

    ``attn_mask`` broadcastable to (…, H, Nq, Nk): bool, True = may attend (PyTorch's
    polarity for this function), or float, added to the scores (may be a Tensor requiring
    grad: learned biases get gradients). Beware: a 1/0 mask given as *float* is added (a bias
    of 0 or 1), not applied; an int mask is refused. ``is_causal``: query i sees key j iff
    j ≤ i + Nk − Nq (bottom-right aligned; PyTorch aligns top-left, the same when Nq = Nk);
    it may be combined with ``attn_mask`` (their AND). ``scale`` defaults to 1/√D.
    ``dropout_p`` drops attention probabilities (seeded by ``minitx.manual_seed``).

    Rows with every key masked give zeros and zero gradients (PyTorch gives NaN there).
    With ``return_weights=True`` returns ``(out, weights)``, weights (…, H, Nq, Nk) being the
    probabilities before dropout, differentiable (the composed form: ``attention_weights``,
    dropout, then P V).

    Which code runs is decided here, at one point each: the CUDA flash kernel on CuPy arrays
    with at most causal and key-padding masks (a bool mask of shape (B|1, 1, 1, Nk)), no
    dropout and no weights (``why_not_flash`` says why a call does not); else the fused op,
    ``SDPAFunction`` or, with the fast layer on, its twin (``configuration.twin("sdpa")``).
    Time O(Nq·Nk·D) per head, memory O(Nq·Nk) (the kernel: O(N·D)).
    """
    fn = "scaled_dot_product_attention"
    q4, k4, v4, allowed, bias, scale, lead, (b, h, nq, dv) = _prepare(
        fn, query, key, value, attn_mask, scale, enable_gqa)
    dropout_p = validate.probability(dropout_p, "dropout_p", owner=fn)
    is_causal = validate.boolean(is_causal, "is_causal", owner=fn)
    # The CUDA kernel takes causal and key-padding masks only (bool, (B|1, 1, 1, Nk)); any
    # other mask, dropout or a request for the weights runs the array code.
    nd, nk = len(query.shape), k4.shape[2]
    key_mask = _key_mask(allowed, b, nk)
    general = bias is not None or (allowed is not None and key_mask is None)
    if dispatch.choose_kernel(fn, q4.data, k4.data, v4.data, key_mask=key_mask,
                              general_mask=general, dropout_p=dropout_p,
                              need_weights=return_weights):
        o = dispatch.FlashKernelFunction.apply(q4, k4, v4, causal=is_causal, scale=scale,
                                               key_mask=key_mask)
        return _unflatten(o, lead, nd)
    # Array code: half precision widened to float32. With weights: the composed form
    # (scores → softmax → dropout → P V), so the weights are themselves differentiable.
    dtype = q4.dtype
    q4, k4, v4, bias = _widen_half(q4, k4, v4, bias)
    if return_weights:
        w = softmax(AttentionScoresFunction.apply(q4, k4, bias, allowed=allowed,
                                                  causal=is_causal, scale=scale), axis=-1)
        wd = dropout(w, dropout_p) if dropout_p > 0 else w
        hkv = k4.shape[1]
        # (B, Hkv, G·Nq, Nk) @ (B, Hkv, Nk, Dv) -> (B, Hkv, G·Nq, Dv) -> (B, H, Nq, Dv)
        o = reshape(matmul(reshape(wd, (b, hkv, (h // hkv) * nq, nk)), v4), (b, h, nq, dv))
        if o.dtype != dtype:
            o, w = astype(o, dtype), astype(w, dtype)
        return _unflatten(o, lead, nd), _unflatten(w, lead, nd)
    # Otherwise the fused node (or its fast twin): P saved, backward by the five equations.
    fused = configuration.twin("sdpa") or SDPAFunction          # the fast layer's, or the reference
    o = fused.apply(q4, k4, v4, bias, allowed=allowed, causal=is_causal, scale=scale,
                    dropout_p=dropout_p)
    return _unflatten(o if o.dtype == dtype else astype(o, dtype), lead, nd)


def why_not_flash(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float = None, enable_gqa: bool = False,
                  return_weights: bool = False):
    """None when ``scaled_dot_product_attention`` with these arguments runs the CUDA flash
    kernel, else the reason it runs the array code (a short sentence). Nothing is computed."""
    fn = "scaled_dot_product_attention"
    q4, k4, v4, allowed, bias, _, _, (b, _, _, _) = _prepare(
        fn, query, key, value, attn_mask, scale, enable_gqa)
    key_mask = _key_mask(allowed, b, k4.shape[2])
    return dispatch.decline_reason(
        q4.data, k4.data, v4.data, key_mask=key_mask, dropout_p=dropout_p,
        general_mask=bias is not None or (allowed is not None and key_mask is None),
        need_weights=return_weights)


def _scores(fn, query, key, attn_mask, is_causal, scale, enable_gqa):
    """The composed form's first stage for ``fn`` (which errors name): S (B, H, Nq, Nk),
    computed in float32 for float16 inputs; with the caller's dtype and leading dims."""
    q4, k4, _, allowed, bias, scale, lead, _ = _prepare(fn, query, key, key, attn_mask, scale,
                                                        enable_gqa)
    dtype = q4.dtype
    q4, k4, bias = _widen_half(q4, k4, bias)
    s = AttentionScoresFunction.apply(
        q4, k4, bias, allowed=allowed,
        causal=validate.boolean(is_causal, "is_causal", owner=fn), scale=scale)
    return s, dtype, lead


def attention_scores(query, key, attn_mask=None, is_causal: bool = False, scale: float = None,
                     enable_gqa: bool = False):
    """S = Q Kᵀ · scale + M: the scores before the softmax, (…, H, Nq, Nk), differentiable.

    Same arguments and mask semantics as ``scaled_dot_product_attention``; masked entries are
    −inf (softmax makes them 0, and a row of them a row of zeros). With ``softmax`` and a
    matmul it composes to attention, one stage at a time — the form a hook can look into.
    Time O(Nq·Nk·D) per head, memory O(Nq·Nk).
    """
    s, dtype, lead = _scores("attention_scores", query, key, attn_mask, is_causal, scale,
                             enable_gqa)
    return _unflatten(s if s.dtype == dtype else astype(s, dtype), lead, len(query.shape))


def attention_weights(query, key, attn_mask=None, is_causal: bool = False, scale: float = None,
                      enable_gqa: bool = False):
    """P = softmax(Q Kᵀ · scale + M): the attention map alone, (…, H, Nq, Nk), differentiable.

    Same arguments and mask semantics as ``scaled_dot_product_attention``: the softmax of
    ``attention_scores``.
    """
    s, dtype, lead = _scores("attention_weights", query, key, attn_mask, is_causal, scale,
                             enable_gqa)
    w = softmax(s, axis=-1)
    return _unflatten(w if w.dtype == dtype else astype(w, dtype), lead, len(query.shape))


def merge_masks(allowed=None, bias=None):
    """Combine a bool ``allowed`` mask (True = may attend) and a float ``bias`` into one
    float mask (bias, −inf where not allowed); returns whichever is given when only one is.
    """
    if allowed is None or bias is None:
        return bias if allowed is None else allowed
    a = allowed.data if isinstance(allowed, Tensor) else allowed
    if isinstance(bias, Tensor):
        return masked_fill(bias, ~a, -math.inf)
    xp = get_array_module(bias)
    return xp.where(a, bias, -xp.inf)
