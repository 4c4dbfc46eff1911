"""Linear attention (Katharopoulos et al. 2020): feature maps, causal parallel form = RNN."""
import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY
from minitx.attention.linear import linear_attention, linear_attention_step
from support import assert_close, qkv, tensor


@pytest.mark.parametrize("feature_map", ["elu", "relu", "identity"])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_dense_formula(feature_map, causal):
    layer = REGISTRY["linear"](8, 2, causal=causal, feature_map=feature_map)
    arrays = qkv(11, dv=3)
    out = layer.attend(*(tensor(a) for a in arrays))
    assert_close(out, layer.reference(*arrays), atol=1e-10)       # reference on the host


def test_elu_plus_one_is_positive_and_rows_are_averages():
    # With φ > 0 and normalisation, each output is a convex combination of the values:
    # ones in -> ones out (up to ε).
    q, k, _ = (tensor(a) for a in qkv(11, dv=3))
    v = tensor(np.ones((2, 2, 11, 3)))
    out = linear_attention(q, k, v, "elu", causal=True, eps=0.0)
    assert_close(out, 1.0, atol=1e-12)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "identity"])
def test_recurrent_steps_equal_parallel_causal_form(feature_map):
    q, k, v = (tensor(a) for a in qkv(13, dv=3))
    parallel = linear_attention(q, k, v, feature_map, causal=True,
                                normalize=feature_map != "identity").numpy()
    state, outs = None, []
    for t in range(13):
        out, state = linear_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t], feature_map,
                                           normalize=feature_map != "identity")
        outs.append(out.numpy())
    np.testing.assert_allclose(np.stack(outs, axis=2), parallel, atol=1e-10)
    s, z = state
    assert s.shape == (2, 2, 4, 3) and z.shape == (2, 2, 4)     # O(1) in the position


def test_layer_step_with_grouped_kv_heads():
    layer = REGISTRY["linear"](8, 2, causal=True, num_kv_heads=1)
    q = tensor(qkv(6, dv=3)[0])
    k, _, v = (tensor(a) for a in qkv(6, h=1, dv=4, seed=1))
    parallel = layer.attend(q, k, v).numpy()
    state, outs = None, []
    for t in range(6):
        out, state = layer.step(state, q[:, :, t], k[:, :, t], v[:, :, t])
        outs.append(out.numpy())
    np.testing.assert_allclose(np.stack(outs, axis=2), parallel, atol=1e-10)


def test_gradcheck_causal_parallel_form():
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(6, b=1, dv=3))
    minitx.gradcheck(lambda a, b, c: linear_attention(a, b, c, "elu", causal=True), (q, k, v))


def test_bad_feature_map():
    with pytest.raises(ValueError, match="feature_map"):
        REGISTRY["linear"](8, 2, feature_map="softmax")
