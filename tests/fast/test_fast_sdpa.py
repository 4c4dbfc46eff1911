"""The blocked SDPA (``minitx/fast/sdpa.py``) against the reference ``SDPAFunction``, float64.

The twin computes attention by blocks of heads × query rows, skips the causal future, may skip
the softmax's shift, keeps E unnormalised and may fold δ into a matmul; each of these must give
the reference's output and gradients for every size: N just below, at and above a block size,
Nq ≠ Nk (bottom-right causal alignment), grouped key/value heads, masks that leave a row with no
key at all (zeros, never NaN), a learned bias, dropout. Its tuning knobs are keywords of
``BlockedSDPAFunction.forward``, so small inputs cross every boundary here without touching a
module constant. Two references: the library's (``using_config(fast=False)``) and dense NumPy
written out below, independently of both.
"""
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import configuration
from minitx.fast import sdpa as fast_sdpa
from minitx.ops.sdpa import SDPAFunction
from attention_reference import block_case, dense_reference
from support import assert_close, qkv, tensor


def blocked(q, k, v, bias=None, *, allowed=None, causal=False, dropout_p=0.0, **knobs):
    """The twin called directly on 4-d tensors, with its knobs."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    allowed = None if allowed is None else tensor(allowed, dtype=None).data
    return fast_sdpa.BlockedSDPAFunction.apply(q, k, v, bias, allowed=allowed, causal=causal,
                                               scale=scale, dropout_p=dropout_p, **knobs)


def forward_backward(fn, arrays, do):
    """Output and the inputs' gradients of ``fn`` on float64 tensors (host arrays back)."""
    ts = [tensor(x, requires_grad=True) for x in arrays]
    out = fn(*ts)
    out.backward(tensor(do))
    return [out.numpy()] + [t.grad.numpy() for t in ts]


@settings(max_examples=60, deadline=None)
@given(block_case(), st.booleans(), st.sampled_from(["none", "bool", "bias"]),
       st.sampled_from(["rows", "heads", "all"]), st.sampled_from([0.0, 20.0, -1.0]),
       st.sampled_from([0, 2 ** 62]))
def test_blocked_equals_both_references_across_block_boundaries(case, causal, mask_kind,
                                                               grouping, limit, fold):
    """Blocks of r rows of one head ("rows"), of two whole heads ("heads") or one block for
    everything ("all"); the shift skipped whenever the bound allows (limit 20), never (−1) or
    only for all-zero scores (0); δ folded into the matmul always (0) or never."""
    r, b, h, hkv, nq, nk, seed = case
    rng = np.random.default_rng(seed)
    q, k, v = qkv(nq, nk, b=b, h=h, hkv=hkv, d=3, dv=2, rng=rng)
    do = rng.standard_normal((b, h, nq, 2))
    allowed = bias = None
    if mask_kind == "bool":                      # (B, 1, Nq, Nk), one query row with no key
        allowed = rng.random((b, 1, nq, nk)) < 0.7
        allowed[0, 0, rng.integers(nq)] = False
    elif mask_kind == "bias":                    # (1, H, Nq, Nk), learned: gets a gradient
        bias = rng.standard_normal((1, h, nq, nk))
    g = h // hkv
    scores, pack = {"rows": (r * g * nk, 1), "heads": (10 ** 9, 2 * g * nk * nq),
                    "all": (10 ** 9, 10 ** 9)}[grouping]
    knobs = dict(causal_rows=r, scores=scores, pack=pack, unshifted_limit=limit,
                 delta_in_matmul=fold)
    arrays = (q, k, v) if bias is None else (q, k, v, bias)
    got = forward_backward(lambda *t: blocked(*t, allowed=allowed, causal=causal, **knobs),
                           arrays, do)
    with minitx.using_config(fast=False):
        mask = bias if allowed is None else allowed

        def reference(q, k, v, *rest):
            m = rest[0] if rest else (None if mask is None else tensor(mask, dtype=None))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                  enable_gqa=True)
        library = forward_backward(reference, arrays, do)
    want, (dq, dk, dv, ds) = dense_reference(q, k, v, do, allowed, bias, causal)
    by_hand = [want, dq, dk, dv] + ([] if bias is None else [ds.sum(axis=0, keepdims=True)])
    for mine, lib, hand in zip(got, library, by_hand):
        assert np.all(np.isfinite(mine))
        assert_close(mine, lib, rtol=1e-12, atol=1e-13)
        assert_close(mine, hand, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("b,h,hkv,nq,nk,d,dv", [
    (2, 4, 2, 100, 100, 8, 5),      # GQA, ragged tail block
    (1, 2, 1, 130, 70, 4, 3),       # Nq > Nk: the first 60 rows see no key (zeros)
    (1, 2, 2, 70, 200, 4, 6),       # Nq < Nk: bottom-right alignment
    (2, 2, 2, 65, 65, 3, 3),        # one row past a block boundary
])
def test_the_causal_path_by_blocks_of_32_rows(b, h, hkv, nq, nk, d, dv):
    q, k, v = qkv(nq, nk, b=b, h=h, hkv=hkv, d=d, dv=dv, seed=7)
    do = np.random.default_rng(8).standard_normal((b, h, nq, dv))
    got = forward_backward(lambda *t: blocked(*t, causal=True, causal_rows=32), (q, k, v), do)
    want, refs = dense_reference(q, k, v, do, causal=True)
    for mine, ref in zip(got, [want, *refs[:3]]):
        assert np.all(np.isfinite(mine))
        assert_close(mine, ref, rtol=1e-10, atol=1e-12)


def test_gradcheck_of_the_blocked_causal_path():
    r = np.random.default_rng(3)
    q, k, v = (tensor(r.standard_normal((1, 2, 40, 3)), requires_grad=True) for _ in range(3))
    assert minitx.gradcheck(lambda a, b, c: blocked(a, b, c, causal=True, causal_rows=16,
                                                    delta_in_matmul=0), (q, k, v))


def test_gradcheck_of_the_blocked_path_with_a_bias_and_groups():
    q, k, v = qkv(5, 7, b=2, h=4, hkv=2, d=3, dv=2, seed=11)
    bias = np.random.default_rng(2).standard_normal((1, 4, 5, 7))
    ts = [tensor(a, requires_grad=True) for a in (q, k, v, bias)]
    for fold in (0, 2 ** 62):
        assert minitx.gradcheck(lambda *t: blocked(*t, causal=True, causal_rows=2,
                                                   delta_in_matmul=fold), tuple(ts))


def test_the_switch_chooses_the_function_at_call_time():
    q, k, v = (tensor(a) for a in qkv(6, b=1, h=2, d=4))
    q.requires_grad = True
    assert F.scaled_dot_product_attention(q, k, v)._ctx.fn is fast_sdpa.BlockedSDPAFunction
    assert configuration.why_not_fast("sdpa") is None
    with minitx.using_config(fast=False):
        assert F.scaled_dot_product_attention(q, k, v)._ctx.fn is SDPAFunction
        assert "fast is False" in configuration.why_not_fast("sdpa")
    assert F.scaled_dot_product_attention(q, k, v)._ctx.fn is fast_sdpa.BlockedSDPAFunction


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_draws_what_the_reference_draws(causal):
    """The same seed gives the twin and the reference the same dropout mask: the same output
    and gradients (a different order of draws would give entirely different numbers)."""
    q, k, v = qkv(9, 11, b=2, h=4, hkv=2, d=3, dv=2, seed=5)
    do = np.random.default_rng(6).standard_normal((2, 4, 9, 2))
    results = []
    for fast in (True, False):
        minitx.manual_seed(123)
        with minitx.using_config(fast=fast):
            results.append(forward_backward(
                lambda *t: F.scaled_dot_product_attention(*t, dropout_p=0.4, is_causal=causal,
                                                          enable_gqa=True), (q, k, v), do))
    for mine, ref in zip(*results):
        assert_close(mine, ref, rtol=1e-12, atol=1e-13)
    assert np.count_nonzero(results[0][0]) > 0


# ---- the softmax without its shift ---------------------------------------------------------

@given(scale=st.sampled_from([0.1, 1.0, 3.0, 6.0, 30.0]), nq=st.integers(1, 70),
       nk=st.integers(1, 70), causal=st.booleans(), seed=st.integers(0, 2 ** 16))
@example(scale=30.0, nq=44, nk=47, causal=False, seed=1)     # float64 error 2.6e-12: see below
def test_shifted_and_unshifted_softmax_agree_with_the_reference(scale, nq, nk, causal, seed):
    """Scores of every size (inputs ×0.1 … ×30: from bounds far below ``UNSHIFTED_LIMIT`` to
    far above, |S| up to a few thousand): the twin subtracts the row max exactly when the
    Cauchy–Schwarz bound says a score may pass the limit, the bound holds, and output and
    gradients match the reference and the twin with the shift forced, in float64 and float32.
    Whether it shifted is seen by a spy in the fast layer's table (the row max's twin)."""
    q, k, v = qkv(nq, nk, b=1, h=2, d=8, dv=3, scale=scale, seed=seed)
    qs = q / np.sqrt(8)
    bound = fast_sdpa.scores_bound(tensor(qs).data, tensor(k).data)
    assert bound >= np.abs(qs @ np.swapaxes(k, -1, -2)).max() * (1 - 1e-12)
    do = np.random.default_rng(seed).standard_normal((1, 2, nq, 3))
    want, _ = dense_reference(q, k, v, do, causal=causal)
    # each dtype rounds a score by about |S|·eps and the softmax passes that on to the
    # output (times |v|): the tolerance grows with the bound, as the rounding does — in
    # float64 too, from 1e-12 for small scores (hypothesis found scale 30, N = 44 × 47:
    # bound 6,943, |v| 85, an error of 2.6e-12 against the reference's matmul order)
    growth = (1 + bound) * (1 + np.abs(v).max())
    real = configuration.twins()["row_max"]
    for dtype, tol in (("float64", max(1e-12, 2e-15 * growth)), ("float32", 1e-6 * growth)):
        results = []
        for limit in (fast_sdpa.UNSHIFTED_LIMIT, -1.0):    # the twin's choice; always shift
            calls = []
            spy = {"row_max": lambda s: calls.append(1) or real(s)}
            ts = [tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v)]
            with mock.patch.dict(configuration._TWINS, spy):
                o = blocked(*ts, causal=causal, unshifted_limit=limit)
                o.backward(tensor(do, dtype=dtype))
            assert bool(calls) == (limit < 0 or bound > limit)
            results.append([o.numpy()] + [t.grad.numpy() for t in ts])
        assert np.all(np.isfinite(results[0][0]))
        assert_close(results[0][0], want, rtol=tol, atol=tol)
        for got, forced in zip(*results):
            assert_close(got, forced, rtol=tol, atol=tol * (1 + np.abs(forced).max()))


def test_scores_bound_is_nan_with_a_nan_input_and_the_twin_then_shifts():
    """A NaN in q makes the bound NaN; ``not bound <= limit`` then takes the shifted path,
    so the NaN spreads exactly as in the reference (no row max is skipped on a NaN)."""
    q, k, v = qkv(3, 4, b=1, h=1, d=2)
    q[0, 0, 1, 0] = np.nan
    assert np.isnan(fast_sdpa.scores_bound(tensor(q).data, tensor(k).data))
    out = blocked(*(tensor(a) for a in (q, k, v))).numpy()
    assert np.isnan(out[0, 0, 1]).all() and np.isfinite(out[0, 0, [0, 2]]).all()
    with minitx.using_config(fast=False):
        ref = F.scaled_dot_product_attention(*(tensor(a) for a in (q, k, v))).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 40),
       st.integers(0, 40), st.booleans(), st.integers(1, 400), st.integers(1, 12),
       st.integers(1, 2000), st.integers(1, 4), st.integers(0, 5000))
def test_block_plan_covers_every_visible_score_once(b, hkv, g, nq, nk, causal, scores, rows,
                                                    pack, parts, parallel):
    """``attention_blocks``: every (batch, head, query, visible key) in exactly one block, for
    any sizes (empty sequences too) and any block limits; packed heads leave at least
    ``parts`` groups of (batch, key head) for the cores when there are that many and more
    than ``parallel`` scores in all."""
    count = np.zeros((b, hkv * g, nq, nk), dtype=int)
    groups = set()
    for bs, hs, hq, i0, i1, kend in fast_sdpa.attention_blocks(
            b, hkv, g, nq, nk, causal, scores=scores, causal_rows=rows, pack=pack,
            parts=parts, parallel=parallel):
        assert (hq.start, hq.stop) == (hs.start * g, hs.stop * g)
        assert i1 > i0 and kend > 0
        if causal:                  # at most half the rows; a quarter past 8·parallel scores
            part = 4 if b * hkv * g * nk * nq > 8 * parallel else 2
            assert i1 - i0 <= max(1, -(-nq // part))
        count[bs, hq, i0:i1, :kend] += 1
        groups.add((bs.start, hs.start))
    visible = np.tri(nq, nk, nk - nq, dtype=bool) if causal else np.ones((nq, nk), bool)
    assert np.all(count[:, :, visible] == 1)
    assert np.all(count[:, :, ~visible] <= 1)           # the diagonal blocks' masked part
    if visible.any() and b * hkv * g * nk * nq > parallel:
        assert len(groups) >= min(parts, b * hkv)
