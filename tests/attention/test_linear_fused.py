"""Bidirectional linear and Performer attention as one node (``KernelAttentionFunction``):
float64 gradient checks for every feature map, and the same numbers as the composed ops
that run when a φ hook is set (hooks must see φ, so they keep the composed path)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.linear import KernelAttentionFunction, linear_attention
from support import assert_close, qkv, tensor


@pytest.mark.parametrize("feature_map", ["elu", "relu", "identity"])
@pytest.mark.parametrize("normalize", [True, False])
def test_gradcheck(feature_map, normalize):
    q, k, v = (tensor(x, requires_grad=True) for x in qkv(7, b=1, h=2, d=3, dv=2, seed=4))
    fn = lambda a, b, c: linear_attention(a, b, c, feature_map, normalize=normalize)  # noqa
    assert fn(q, k, v)._ctx.fn is KernelAttentionFunction
    assert minitx.gradcheck(fn, (q, k, v))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.sampled_from(["elu", "relu", "identity"]),
       st.integers(0, 2 ** 16))
def test_fused_equals_composed_with_a_hook(n, d, feature_map, seed):
    """A layer with a pass-through φ hook runs the composed ops: same output, same grads."""
    rng = np.random.default_rng(seed)
    arrays = qkv(n, b=2, h=2, d=d, rng=rng)
    g = rng.standard_normal((2, 2, n, d))
    layer = REGISTRY["linear"](2 * d, 2, feature_map=feature_map)
    fused, composed = _fused_and_composed(layer, layer.hook_phi_q, arrays, g)
    for a, b in zip(fused, composed):
        assert_close(a, b, rtol=1e-10, atol=1e-12)


def _fused_and_composed(layer, hook_point, arrays, g):
    """[output, dq, dk, dv] of ``layer.attend`` without a hook (one fused node) and with a
    pass-through hook at ``hook_point`` (the composed ops)."""
    results = []
    for hooked in (False, True):
        hook_point.remove_hooks()
        if hooked:
            hook_point.add_hook(lambda x, hook=None: x)
        ts = [tensor(x, requires_grad=True) for x in arrays]
        out = layer.attend(*ts)
        assert (out._ctx.fn is KernelAttentionFunction) == (not hooked)
        out.backward(tensor(g))
        results.append([out] + [t.grad for t in ts])
    hook_point.remove_hooks()
    return results


def test_performer_gradcheck():
    from minitx.attention.performer import FavorFeatures, performer_attention
    minitx.manual_seed(0)
    w = REGISTRY["performer"](6, 2, num_features=5).features
    w = (w.data if hasattr(w, "data") else w).astype(np.float64)
    q, k, v = (tensor(x, requires_grad=True) for x in qkv(7, b=1, h=2, d=3, dv=2, seed=5))
    fn = lambda a, b, c: performer_attention(a, b, c, w)  # noqa: E731
    out = fn(q, k, v)
    assert out._ctx.fn is KernelAttentionFunction
    assert isinstance(out._ctx.features, FavorFeatures)
    assert minitx.gradcheck(fn, (q, k, v))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 9), st.integers(0, 2 ** 16),
       st.integers(1, 5))
def test_performer_fused_equals_composed_with_a_hook(n, d, m, seed, rows):
    """``rows``: FavorFeatures.vjp's block of rows (4,096 in use), small here so that N falls
    below, at and above a multiple of it."""
    from minitx.attention import performer
    rng = np.random.default_rng(seed)
    arrays = qkv(n, b=2, h=2, d=d, rng=rng, scale=2.0)     # scale: the stabilisers matter
    g = rng.standard_normal((2, 2, n, d))
    minitx.manual_seed(seed)
    layer = REGISTRY["performer"](2 * d, 2, num_features=m).to(dtype="float64")
    layer.eval()                                           # no redraw between the two runs
    saved, performer.ROWS = performer.ROWS, rows
    try:
        fused, composed = _fused_and_composed(layer, layer.hook_phi_k, arrays, g)
    finally:
        performer.ROWS = saved
    for a, b in zip(fused, composed):
        assert_close(a, b, rtol=1e-9, atol=1e-12)   # exp of shifted logits: 1e-9
