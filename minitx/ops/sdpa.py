r"""``scaled_dot_product_attention``: PyTorch's API around attention's maths.

The maths (the formula, its backward, the mask, grouped heads) is ``ops/attention_maths.py``.
This file is what a PyTorch user calls, and what it takes to get there:

- **the arguments**, checked as PyTorch would take them: any number of leading batch dims,
  (N, D) inputs without heads, grouped key/value heads with ``enable_gqa``; each error names
  the argument, the expected and the given value;
- **the mask**: a bool ``attn_mask`` (True = may attend, PyTorch's polarity for this function)
  becomes ``allowed``, a float one the additive ``bias``, both brought to 4-d and onto the
  data's device. ``is_causal`` is bottom-right aligned (query i sees key j iff
  j ≤ i + Nk − Nq), where PyTorch's is top-left (j ≤ i); the two agree when Nq = Nk;
- **the polarity warning**: a self-attention mask that hides every query's own position is
  almost always a mask of the other polarity (``MultiheadAttention``'s True = NOT allowed
  given here, or the reverse): it warns, at the caller's line, one rule for every caller; so
  does a float mask of only 0s and 1s, a "1 = attend" mask that, added, masks nothing;
- **which code runs**: the CUDA kernel, the fused reference ``SDPAFunction`` or its fast
  twin in ``minitx/fast/sdpa.py`` (the same maths by cache-sized blocks on every core), or the
  composed form (``attention_scores``, then softmax, then P V, each an op of its own: what
  ``attention_weights`` and the hookable path of the models build on, tested to agree) —
  decided in ``scaled_dot_product_attention``, at one point each.
"""
from __future__ import annotations

import math
import os
import sys
import warnings

from .. import configuration, validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from . import dispatch

# The maths, re-exported: ``minitx.ops.sdpa`` keeps offering every name it always has.
from .attention_maths import (AttentionScoresFunction, SDPAFunction,  # noqa: F401
                              attention_backward, attention_forward, grouped_key_grad,
                              grouped_scores, grouped_values, mask_scores)

# The differentiable ops the composed form (scores → softmax → dropout → P V) is built from.
from .activation import softmax
from .dropout import dropout
from .elementwise import astype
from .indexing import masked_fill
from .linalg import matmul
from .shape import broadcast_to, reshape

__all__ = ["scaled_dot_product_attention", "attention_weights", "attention_scores",
           "why_not_flash", "split_heads", "merge_heads", "repeat_kv", "check_heads",
           "mask_scores", "attention_forward", "attention_backward", "grouped_scores",
           "grouped_values", "grouped_key_grad", "SDPAFunction", "AttentionScoresFunction",
           "merge_masks", "check_scale", "hides_own_positions", "warn_if_polarity_inverted",
           "is_binary_float_mask", "warn_if_float_mask_is_binary"]


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
    if h % hk:                            # query head h reads key/value head h // (H/Hkv)
        raise ValueError(f"{name}: key/value head count {hk} must divide the query head "
                         f"count {h}")
    return b, h, hk, nq, nk, d



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
        warn_if_polarity_inverted(allowed if bias is None else bias, nq, nk)
        if bias is not None:
            warn_if_float_mask_is_binary(bias)
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


# The other trap: a float mask of 0s and 1s meant as "1 = attend" (HuggingFace's
# attention_mask as floats, a bool mask cast to float). A float mask is ADDED to the scores, so
# such a mask shifts some scores by 1 and masks nothing. PyTorch runs it silently.

BINARY_FLOAT_WARNING = (
    "a float mask of 0s and 1s (attn_mask, or a module's key_padding_mask) is added to the "
    "scores (0 = unchanged, -inf = may not attend), so it masks nothing. If 1 means \"may "
    "attend\", pass a bool mask: m.astype(bool) for scaled_dot_product_attention and the "
    "registry's variants (True = may attend), m == 0 for MultiheadAttention and the "
    "transformer layers (True = NOT allowed); or the additive form numpy.where(m == 1, 0.0, "
    "-numpy.inf). If +1 biases are meant: warnings.filterwarnings(\"ignore\", message=\"a float "
    "mask of 0s and 1s\").")


def is_binary_float_mask(bias) -> bool:
    """True when a float mask's finite entries are all 0 or 1 and at least one is 1: a "1 =
    attend" mask given where an additive one is read. Its −inf entries (where a bool mask was
    merged in) are left out; a real additive mask (0 / −inf, ALiBi's negative distances,
    learned biases) never holds only 0s and 1s. One reduction first (its largest finite
    entry is 1), the full check only then."""
    data = bias.data if isinstance(bias, Tensor) else bias
    if data.dtype.kind != "f" or data.size == 0:
        return False
    xp = get_array_module(data)
    finite = xp.where(xp.isfinite(data), data, 0)
    if float(finite.max()) != 1.0:
        return False
    return bool(((finite == 0) | (finite == 1)).all())


def warn_if_float_mask_is_binary(bias) -> None:
    """Warn (``UserWarning``, at the caller's line) when ``is_binary_float_mask``: the message
    names both readings and the fix."""
    if is_binary_float_mask(bias):
        warnings.warn(BINARY_FLOAT_WARNING, UserWarning, stacklevel=_first_frame_outside_minitx())


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
    """Attention, the formula of ``ops/attention_maths.py``, with the arguments of PyTorch's
    ``F.scaled_dot_product_attention``.

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
    ``SDPAFunction`` or, with the fast layer on (``minitx.config.fast``), its twin
    (``configuration.twin("sdpa")``; ``configuration.why_not_fast("sdpa")`` says when it does
    not run). Time O(Nq·Nk·D) per head, memory O(Nq·Nk) (the kernel: O(N·D)).
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
    """S of ``ops/attention_maths.py``'s formula: the scores before the softmax,
    (…, H, Nq, Nk), differentiable.

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
    """P of ``ops/attention_maths.py``'s formula: the attention map alone, (…, H, Nq, Nk),
    differentiable.

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
