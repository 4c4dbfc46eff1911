"""scaled_dot_product_attention, attention_weights and the first forms (dot, additive, single head).

Each is checked against a direct NumPy formula, by float64 gradcheck, on fully masked rows
(zeros, zero gradients, never NaN) and on its error messages.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
import minitx.functional as F
from minitx.attention import (AdditiveAttention, CausalSelfAttention, SelfAttention,
                              attention_weights, causal_pattern, dense_attention_array,
                              dot_product_attention, scaled_dot_product_attention as sdpa)
from support import assert_close, qkv, tensor


def reference(q, k, v, allowed=None, bias=None, scale=None):
    """softmax(q kᵀ·scale + bias, masked) v in plain NumPy (rows with no key give 0)."""
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return p @ v, p


# ---- values ------------------------------------------------------------------------------

@pytest.mark.parametrize("h,hkv,nq,nk", [(2, 2, 4, 4), (4, 2, 3, 6), (3, 1, 5, 2), (2, 2, 1, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(rng, h, hkv, nq, nk, causal):
    q, k, v = qkv(nq, nk, b=2, h=h, hkv=hkv, d=4, dv=5, rng=rng)
    allowed = causal_pattern(nq, nk) if causal else None
    tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
    out, w = sdpa(tq, tk, tv, is_causal=causal, enable_gqa=True, return_weights=True)
    ref, p = reference(q, k, v, allowed)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), p, atol=1e-12)
    np.testing.assert_allclose(sdpa(tq, tk, tv, is_causal=causal, enable_gqa=True).numpy(),
                               ref, atol=1e-12)
    np.testing.assert_allclose(dense_attention_array(q, k, v, allowed), ref, atol=1e-12)


def test_bool_and_float_masks_and_scale(rng):
    q, k, v = qkv(3, 5, b=2, h=2, hkv=2, d=3, rng=rng)
    allowed = rng.random((2, 1, 3, 5)) > 0.4
    allowed[..., 0] = True
    bias = rng.standard_normal((3, 5))
    tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
    ref, _ = reference(q, k, v, allowed, scale=0.7)
    np.testing.assert_allclose(sdpa(tq, tk, tv, allowed, scale=0.7).numpy(), ref, atol=1e-12)
    ref, _ = reference(q, k, v, bias=bias)
    np.testing.assert_allclose(sdpa(tq, tk, tv, bias).numpy(), ref, atol=1e-12)


def test_causal_is_bottom_right_aligned(rng):
    # 2 queries against 5 keys: they are positions 3 and 4, so they see keys 0..3 and 0..4
    q, k, v = qkv(2, 5, b=1, h=1, hkv=1, d=3, rng=rng)
    _, w = sdpa(*(tensor(a, requires_grad=True) for a in (q, k, v)), is_causal=True,
                return_weights=True)
    np.testing.assert_array_equal(w.numpy()[0, 0] > 0, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_leading_batch_dims(rng):
    q, k, v = (rng.standard_normal((2, 3, 2, 4, 5)) for _ in range(3))

    def attend(*arrays):
        return sdpa(*(tensor(a, requires_grad=True) for a in arrays)).numpy()
    out = attend(q, k, v)
    flat = attend(q.reshape(6, 2, 4, 5), k.reshape(6, 2, 4, 5), v.reshape(6, 2, 4, 5))
    np.testing.assert_allclose(out, flat.reshape(out.shape), atol=1e-12)
    q3, k3, v3 = q[0, 0], k[0, 0], v[0, 0]                     # (2, 4, 5): heads, no batch
    np.testing.assert_allclose(attend(q3, k3, v3), out[0, 0], atol=1e-12)
    np.testing.assert_allclose(attend(q3[0], k3[0], v3[0]), out[0, 0, 0], atol=1e-12)  # (N, D)


def test_functional_reexport():
    assert F.scaled_dot_product_attention is sdpa
    assert F.attention_weights is attention_weights


# ---- gradients ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 33])
def test_gradcheck_lengths(rng, n):
    q, k, v = qkv(n, n, b=1, h=2, hkv=1, d=2, rng=rng)
    minitx.gradcheck(lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True),
                     tuple(tensor(a, requires_grad=True) for a in (q, k, v)))


@pytest.mark.parametrize("case", ["bool", "float", "gqa_cross", "scale", "weights"])
def test_gradcheck_options(rng, case):
    q, k, v = qkv(3, 5, b=2, h=4, hkv=2, d=2, dv=3, rng=rng)
    mask = rng.random((2, 1, 3, 5)) > 0.5
    bias = tensor(rng.standard_normal((4, 3, 5)), requires_grad=True)   # a learned bias: grads

    def fn(q, k, v, b):
        if case == "bool":
            return sdpa(q, k, v, mask, enable_gqa=True)
        if case == "float":
            return sdpa(q, k, v, b, enable_gqa=True)
        if case == "gqa_cross":
            return sdpa(q, k, v, is_causal=True, enable_gqa=True)
        if case == "scale":
            return sdpa(q, k, v, b, scale=0.3, enable_gqa=True)
        out, w = sdpa(q, k, v, b, enable_gqa=True, return_weights=True)
        return out, w
    minitx.gradcheck(fn, (*(tensor(a, requires_grad=True) for a in (q, k, v)), bias))


def test_gradcheck_attention_weights(rng):
    q, k, _ = qkv(3, 4, b=1, h=2, hkv=2, d=3, rng=rng)
    minitx.gradcheck(lambda q, k: attention_weights(q, k, is_causal=True),
                     (tensor(q, requires_grad=True), tensor(k, requires_grad=True)))


def test_gradcheck_dropout(rng):
    q, k, v = qkv(4, 4, b=1, h=2, hkv=2, d=3, rng=rng)

    def fn(q, k, v):
        minitx.manual_seed(3)                                   # the same keep-mask every call
        return sdpa(q, k, v, dropout_p=0.3)
    minitx.gradcheck(fn, tuple(tensor(a, requires_grad=True) for a in (q, k, v)))
    minitx.manual_seed(3)
    tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
    out = sdpa(tq, tk, tv, dropout_p=0.3).numpy()
    assert not np.allclose(out, sdpa(tq, tk, tv).numpy())


# ---- fully masked rows -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bool", "float", "causal_short_keys"])
def test_fully_masked_rows_are_zero_with_zero_grads(rng, kind):
    nq, nk = (5, 3) if kind == "causal_short_keys" else (4, 4)
    q, k, v = qkv(nq, nk, b=2, h=2, hkv=2, d=3, rng=rng)
    allowed = np.ones((2, 2, nq, nk), bool)
    allowed[0, :, 1] = False                                    # query 1 of batch 0 sees nothing
    allowed[1] = False                                          # batch 1 sees nothing at all
    mask = {"bool": allowed, "float": np.where(allowed, 0.0, -np.inf),
            "causal_short_keys": None}[kind]
    tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
    out, w = sdpa(tq, tk, tv, mask, is_causal=kind == "causal_short_keys",
                  return_weights=True)
    out2 = sdpa(tq, tk, tv, mask, is_causal=kind == "causal_short_keys")
    (out2.sum() + out.sum() + w.sum()).backward()
    for t in (out, w, out2, tq.grad, tk.grad, tv.grad):
        assert np.isfinite(t.numpy()).all()
    if kind == "causal_short_keys":                             # queries 0, 1 precede every key
        assert np.all(out2.numpy()[:, :, :2] == 0) and np.all(tq.grad.numpy()[:, :, :2] == 0)
        return
    assert np.all(out2.numpy()[0, :, 1] == 0) and np.all(out2.numpy()[1] == 0)
    assert np.all(w.numpy()[1] == 0)
    assert np.all(tq.grad.numpy()[1] == 0) and np.all(tq.grad.numpy()[0, :, 1] == 0)
    assert np.all(tk.grad.numpy()[1] == 0) and np.all(tv.grad.numpy()[1] == 0)


# ---- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes,kw,match", [
    (((2, 3), (2, 4), (2, 3)), {}, "key must have query's last dim"),
    (((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 5, 4)), {}, "value must match key"),
    (((1, 4, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), {}, "enable_gqa=True"),
    (((1, 4, 3, 4), (1, 3, 3, 4), (1, 3, 3, 4)), {"enable_gqa": True}, "must divide 4"),
    (((1, 2, 3, 4), (1, 2, 3), (1, 2, 3, 4)), {}, "same number of dims"),
    (((4,), (4,), (4,)), {}, "at least 2 dims"),
    (((2, 1, 3, 4), (3, 1, 3, 4), (3, 1, 3, 4)), {}, "batch dims differ"),
])
def test_shape_errors(shapes, kw, match):
    args = [tensor(np.zeros(s), requires_grad=True) for s in shapes]
    with pytest.raises(ValueError, match=match):
        sdpa(*args, **kw)


def test_mask_and_option_errors(rng):
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(3, 4, b=1, h=2, hkv=2, d=3, rng=rng))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 3\) does not broadcast"):
        sdpa(q, k, v, np.ones((3, 3), bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        sdpa(q, k, v, np.ones((3, 4), np.int64))
    with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
        sdpa(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="scale must be a positive"):
        sdpa(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="query must be a Tensor"):
        sdpa(q.numpy(), k, v)


# ---- the first forms ---------------------------------------------------------------------

def test_dot_product_attention_luong(rng):
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 6)), \
        rng.standard_normal((2, 5, 2))
    w = rng.standard_normal((4, 6))
    tq, tk, tv, tw = (tensor(x, requires_grad=True) for x in (q, k, v, w))
    ctx, a = dot_product_attention(tq, tk, tv, weight=tw)
    s = q @ w @ np.swapaxes(k, -1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(a.numpy(), p, atol=1e-12)
    np.testing.assert_allclose(ctx.numpy(), p @ v, atol=1e-12)
    mask = rng.random((2, 3, 5)) > 0.3
    minitx.gradcheck(lambda q, k, v, w: dot_product_attention(q, k, v, w, mask=mask),
                     tuple(tensor(x, requires_grad=True) for x in (q, k, v, w)))
    kk = rng.standard_normal((2, 5, 4))
    minitx.gradcheck(lambda q, k, v: dot_product_attention(q, k, v),
                     tuple(tensor(x, requires_grad=True) for x in (q, kk, v)))
    tq, tk, tv = (tensor(x, requires_grad=True) for x in (q, k, v))
    with pytest.raises(ValueError, match="'dot' scores need equal"):
        dot_product_attention(tq, tk, tv)
    with pytest.raises(ValueError, match=r"weight must be \(Dq, Dk\)"):
        dot_product_attention(tq, tk, tv, weight=tensor(w.T, requires_grad=True))


def test_additive_attention_bahdanau(rng):
    layer = AdditiveAttention(4, key_dim=6, hidden_dim=5).to(dtype="float64")
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 7, 6)), \
        rng.standard_normal((2, 7, 2))
    ctx, a = layer(*(tensor(x, requires_grad=True) for x in (q, k, v)))
    wq, wk, wv = (p.numpy() for p in (layer.W_q.weight, layer.W_k.weight, layer.v.weight))
    e = np.tanh((q @ wq.T)[:, :, None, :] + (k @ wk.T)[:, None, :, :]) @ wv[0]   # (B, Nq, Nk)
    p = np.exp(e - e.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(a.numpy(), p, atol=1e-12)
    np.testing.assert_allclose(ctx.numpy(), p @ v, atol=1e-12)
    assert set(layer.state_dict()) == {"W_q.weight", "W_k.weight", "v.weight"}
    mask = np.ones((2, 3, 7), bool)
    mask[0, 1] = False                                          # a fully masked row
    minitx.gradcheck(lambda q, k, v: layer(q, k, v, mask=mask),
                     tuple(tensor(x, requires_grad=True) for x in (q, k, v)))
    tq, tk, tv = (tensor(x, requires_grad=True) for x in (q, k, v))
    assert np.all(layer(tq, tk, tv, mask=mask)[0].numpy()[0, 1] == 0)
    with pytest.raises(ValueError, match="same length"):
        layer(tq, tk, tensor(v[:, :3], requires_grad=True))


@pytest.mark.parametrize("n", [1, 7])
def test_self_attention_single_head(rng, n):
    for layer in (SelfAttention(4), CausalSelfAttention(4)):
        layer.to(dtype="float64")
        layer.record_weights = True
        x = rng.standard_normal((2, n, 4))
        minitx.gradcheck(layer, (tensor(x, requires_grad=True),))
        q, k, v = (x @ lin.weight.numpy().T + lin.bias.numpy()
                   for lin in (layer.query, layer.key, layer.value))
        allowed = causal_pattern(n, n) if layer.causal else None
        ref, p = reference(q, k, v, allowed)
        np.testing.assert_allclose(layer(tensor(x, requires_grad=True)).numpy(), ref, atol=1e-12)
        assert_close(layer.last_attn_weights, p, atol=1e-12)     # a raw array of the backend
    with pytest.raises(ValueError, match=r"x must be \(B, N, 4\)"):
        SelfAttention(4)(tensor(np.zeros((2, 3, 5)), requires_grad=True))


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_forms_the_weights_only_when_recording(rng, causal):
    """Unrecorded, the layer is one fused node and keeps no map; recording gives the same
    output through the composed form and keeps the map."""
    def ops_in_graph(y):
        seen, stack = set(), [y._ctx]
        while stack:
            ctx = stack.pop()
            seen.add(ctx.fn)
            stack += [p._ctx for p in ctx.parents if isinstance(p, minitx.Tensor) and p._ctx]
        return seen

    maths = minitx.ops.attention_maths
    layer = SelfAttention(4, causal=causal).to(dtype="float64")
    x = tensor(rng.standard_normal((2, 5, 4)))
    with minitx.using_config(fast=False):
        fused = layer(x)
        assert layer.last_attn_weights is None
        layer.record_weights = True
        recorded = layer(x)
    assert maths.SDPAFunction in ops_in_graph(fused)
    assert maths.AttentionScoresFunction not in ops_in_graph(fused)
    assert maths.AttentionScoresFunction in ops_in_graph(recorded)
    assert layer.last_attn_weights.shape == (2, 5, 5)
    np.testing.assert_allclose(recorded.numpy(), fused.numpy(), rtol=1e-12, atol=1e-14)


def test_causal_self_attention_is_causal(rng):
    layer = CausalSelfAttention(4).to(dtype="float64")
    x = rng.standard_normal((1, 6, 4))
    y = layer(tensor(x, requires_grad=True)).numpy()
    x2 = x.copy()
    x2[:, 4:] += 1.0
    np.testing.assert_allclose(layer(tensor(x2, requires_grad=True)).numpy()[:, :4], y[:, :4],
                               atol=1e-12)


@given(st.permutations(list(range(6))))
def test_self_attention_is_permutation_equivariant(perm):
    rng = np.random.default_rng(0)
    layer = SelfAttention(4).to(dtype="float64")
    x = rng.standard_normal((1, 6, 4))
    y = layer(tensor(x)).numpy()
    np.testing.assert_allclose(layer(tensor(x[:, perm])).numpy(), y[:, perm], atol=1e-12)


# ---- one dense attention: the fused op and its composed twin --------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from([(2, 2), (4, 2), (4, 1)]),
       st.sampled_from(["none", "bool", "bias", "causal"]), st.integers(0, 2 ** 16))
def test_the_composed_form_equals_the_fused_reference(nq, nk, heads, mask_kind, seed):
    """``attention_scores`` → softmax → P V, one op at a time (what the hookable paths run),
    against ``SDPAFunction``, the one fused node (fast layer off): outputs and gradients of q,
    k, v and a learned bias agree to rounding, rows emptied by a mask included."""
    h, hkv = heads
    rng = np.random.default_rng(seed)
    q, k, v = qkv(nq, nk, b=2, h=h, hkv=hkv, d=3, dv=2, rng=rng)
    do = rng.standard_normal((2, h, nq, 2))
    mask = None
    if mask_kind == "bool":
        mask = rng.random((2, 1, nq, nk)) < 0.6
        mask[0, 0, 0] = False                            # a row with no key at all
    elif mask_kind == "bias":
        mask = rng.standard_normal((1, h, nq, nk))
    causal = mask_kind == "causal"
    results = []
    for composed in (True, False):
        ts = [tensor(a, requires_grad=True) for a in (q, k, v)]
        m = None if mask is None else tensor(mask, dtype=None if mask.dtype == bool else
                                             "float64", requires_grad=mask.dtype != bool)
        with minitx.using_config(fast=False):
            if composed:
                s = F.attention_scores(ts[0], ts[1], attn_mask=m, is_causal=causal,
                                       enable_gqa=True)
                p = F.softmax(s, axis=-1)
                vv = minitx.attention.repeat_kv(ts[2], h)
                out = p @ vv
            else:
                out = sdpa(*ts, attn_mask=m, is_causal=causal, enable_gqa=True)
                assert out._ctx.fn is minitx.ops.sdpa.SDPAFunction
        out.backward(tensor(do))
        grads = [t.grad.numpy() for t in ts]
        if m is not None and m.requires_grad:
            grads.append(m.grad.numpy())
        results.append([out.numpy()] + grads)
    for composed, fused in zip(*results):
        assert np.all(np.isfinite(fused))
        assert_close(composed, fused, rtol=1e-12, atol=1e-13)


def test_gradcheck_attention_scores_with_masks(rng):
    """The scores alone: dQ = dS K·scale and dK = dSᵀ Q·scale, zero through masked entries
    (their −inf is a constant), and the bias's gradient dS."""
    q, k = (tensor(rng.standard_normal((1, 2, 5, 3)), requires_grad=True) for _ in range(2))
    bias = tensor(rng.standard_normal((1, 2, 5, 5)), requires_grad=True)
    allowed = tensor(rng.random((1, 1, 5, 5)) < 0.7, dtype=None)

    def masked(a, b):
        s = F.attention_scores(a, b, attn_mask=allowed, is_causal=True)
        return F.where(minitx.tensor(np.isfinite(s.numpy())), s, 0.0)   # the −inf are constants
    assert minitx.gradcheck(masked, (q, k))
    assert minitx.gradcheck(lambda a, b, c: F.attention_scores(a, b, attn_mask=c), (q, k, bias))
