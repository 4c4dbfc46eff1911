"""Synthesizer, routing attention, and the FNet / AFT mixers."""
import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.mixers import fourier_mix
from support import assert_close, assert_equal, params_to_float64, qkv, tensor


# ---- Synthesizer -------------------------------------------------------------------------

@pytest.mark.parametrize("synthesis", ["dense", "random", "factorized", "mixture"])
@pytest.mark.parametrize("causal", [False, True])
def test_synthesizer_equals_softmax_of_its_logits(synthesis, causal):
    layer = params_to_float64(REGISTRY["synthesizer"](8, 2, causal=causal, synthesis=synthesis,
                                                      max_len=16))
    arrays = qkv(9)
    q, k, v = (tensor(a) for a in arrays)
    logits = np.broadcast_to(layer.logits(q, k).numpy(), (2, 2, 9, 9))
    allowed = np.tri(9, dtype=bool) if causal else None
    s = np.where(allowed, logits, -np.inf) if causal else logits
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert_close(layer.attend(q, k, v), p @ arrays[2], atol=1e-12)
    qs, ks, vs = (tensor(a, requires_grad=True) for a in qkv(5, b=1, seed=1))
    minitx.gradcheck(layer.attend, (qs, ks, vs))


def test_synthesizer_random_is_input_independent_and_trainable_flag():
    fixed = REGISTRY["synthesizer"](8, 2, synthesis="random", trainable=False, max_len=8)
    assert "R" in dict(fixed.named_buffers()) and "R" not in dict(fixed.named_parameters())
    trained = REGISTRY["synthesizer"](8, 2, synthesis="random", trainable=True, max_len=8)
    assert "R" in dict(trained.named_parameters())
    q, k, v = (tensor(a) for a in qkv(6, seed=2))
    q2, k2, _ = (tensor(a) for a in qkv(6, seed=3))
    assert_close(fixed.attend(q, k, v), fixed.attend(q2, k2, v))


def test_synthesizer_mixture_weights_are_learned():
    layer = REGISTRY["synthesizer"](8, 2, synthesis="mixture", max_len=8)
    x = tensor(np.random.default_rng(0).standard_normal((2, 6, 8)), dtype="float32")
    layer(x).sum().backward()
    assert layer.mix.grad is not None and np.abs(layer.mix.grad.numpy()).sum() > 0


def test_synthesizer_errors():
    with pytest.raises(ValueError, match="synthesis"):
        REGISTRY["synthesizer"](8, 2, synthesis="conv")
    layer = REGISTRY["synthesizer"](8, 2, max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        layer(tensor(np.zeros((1, 5, 8))))


# ---- Routing -----------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 9, 40])
def test_routing_one_cluster_equals_full_attention(causal, n):
    layer = REGISTRY["routing"](8, 2, causal=causal, num_clusters=1, window=64)
    arrays = qkv(n)
    out = layer.attend(*(tensor(a) for a in arrays))
    ref = dense_attention_array(*arrays, np.tri(n, dtype=bool) if causal else None)
    assert_close(out, ref, atol=1e-10)


def test_routing_attends_within_clusters_only():
    from minitx.attention.routing import assign_clusters
    layer = REGISTRY["routing"](8, 2, num_clusters=3, window=64)
    qa, ka, _ = qkv(30, seed=4)
    v = tensor(np.eye(30)[None, None].repeat(2, 0).repeat(2, 1))            # read off A
    a = layer.attend(tensor(qa), tensor(ka), v).numpy()
    mu = layer.centroids.numpy()
    qc, kc = assign_clusters(qa, mu), assign_clusters(ka, mu)                 # on the host
    outside = qc[..., :, None] != kc[..., None, :]
    assert np.all(a[outside] == 0)
    rows = (qc[..., :, None] == kc[..., None, :]).any(-1)
    np.testing.assert_allclose(a.sum(-1)[rows], 1.0, atol=1e-12)


def test_routing_centroids_move_only_in_training():
    layer = REGISTRY["routing"](8, 2, num_clusters=2)
    mu0 = layer.centroids.numpy().copy()
    assert "centroids" in dict(layer.named_buffers())
    assert "centroids" not in dict(layer.named_parameters())
    q, k, v = (tensor(a) for a in qkv(12))
    layer.eval()
    layer.attend(q, k, v)
    assert_equal(layer.centroids, mu0)
    layer.train()
    layer.attend(q, k, v)
    moved = layer.centroids.numpy()
    assert not np.allclose(moved, mu0)
    np.testing.assert_allclose(np.linalg.norm(moved, axis=-1), 1.0, atol=1e-12)


# ---- FNet and AFT ------------------------------------------------------------------------

def test_fnet_is_the_real_part_of_a_2d_dft():
    x = np.random.default_rng(0).standard_normal((2, 7, 8))
    layer = REGISTRY["fnet"](8, 2)
    assert_close(layer(tensor(x)), np.fft.fft2(x, axes=(1, 2)).real, atol=1e-12)
    t = tensor(np.random.default_rng(1).standard_normal((1, 5, 6)), requires_grad=True)
    minitx.gradcheck(lambda a: fourier_mix(a, (1, 2)), (t,))
    with pytest.raises(ValueError):
        REGISTRY["fnet"](8, 2, causal=True)


@pytest.mark.parametrize("variant", ["full", "simple"])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_matches_paper_formula(variant, causal):
    layer = params_to_float64(REGISTRY["aft"](8, 2, causal=causal, variant=variant, max_len=16))
    if variant == "full":
        layer.w.copy_(np.random.default_rng(9).standard_normal((16, 16)))
    q, k, v = (tensor(a) for a in qkv(11))
    # the reference reads the layer's (device) parameters: computed on the device, read back
    assert_close(layer.attend(q, k, v), layer.reference(q.data, k.data, v.data), atol=1e-10)
    qs, ks, vs = (tensor(a, requires_grad=True) for a in qkv(6, b=1, seed=2))
    minitx.gradcheck(layer.attend, (qs, ks, vs))
