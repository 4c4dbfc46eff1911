"""Synthesizer, routing attention, and the FNet / AFT mixers."""
import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.mixers import fourier_mix


def tensors(n, b=2, h=2, d=4, seed=0, requires_grad=False):
    rng = np.random.default_rng(seed)
    return [minitx.tensor(rng.standard_normal((b, h, n, d)), requires_grad=requires_grad,
                          dtype="float64") for _ in range(3)]


def f64(layer):
    for p in layer.parameters():
        p.data = p.data.astype(np.float64)
    return layer


# ---- Synthesizer -------------------------------------------------------------------------

@pytest.mark.parametrize("synthesis", ["dense", "random", "factorized", "mixture"])
@pytest.mark.parametrize("causal", [False, True])
def test_synthesizer_equals_softmax_of_its_logits(synthesis, causal):
    layer = f64(REGISTRY["synthesizer"](8, 2, causal=causal, synthesis=synthesis, max_len=16))
    q, k, v = tensors(9)
    logits = np.broadcast_to(layer.logits(q, k).data, (2, 2, 9, 9))
    allowed = np.tri(9, dtype=bool) if causal else None
    s = np.where(allowed, logits, -np.inf) if causal else logits
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(layer.attend(q, k, v).data, p @ v.data, atol=1e-12)
    qs, ks, vs = tensors(5, b=1, seed=1, requires_grad=True)
    minitx.gradcheck(layer.attend, (qs, ks, vs))


def test_synthesizer_random_is_input_independent_and_trainable_flag():
    fixed = REGISTRY["synthesizer"](8, 2, synthesis="random", trainable=False, max_len=8)
    assert "R" in dict(fixed.named_buffers()) and "R" not in dict(fixed.named_parameters())
    trained = REGISTRY["synthesizer"](8, 2, synthesis="random", trainable=True, max_len=8)
    assert "R" in dict(trained.named_parameters())
    q, k, v = tensors(6, seed=2)
    q2, k2, _ = tensors(6, seed=3)
    np.testing.assert_allclose(fixed.attend(q, k, v).data, fixed.attend(q2, k2, v).data)


def test_synthesizer_mixture_weights_are_learned():
    layer = REGISTRY["synthesizer"](8, 2, synthesis="mixture", max_len=8)
    x = minitx.tensor(np.random.default_rng(0).standard_normal((2, 6, 8)), dtype="float32")
    layer(x).sum().backward()
    assert layer.mix.grad is not None and np.abs(layer.mix.grad.data).sum() > 0


def test_synthesizer_errors():
    with pytest.raises(ValueError, match="synthesis"):
        REGISTRY["synthesizer"](8, 2, synthesis="conv")
    layer = REGISTRY["synthesizer"](8, 2, max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        layer(minitx.tensor(np.zeros((1, 5, 8))))


# ---- Routing -----------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 9, 40])
def test_routing_one_cluster_equals_full_attention(causal, n):
    layer = REGISTRY["routing"](8, 2, causal=causal, num_clusters=1, window=64)
    q, k, v = tensors(n)
    out = layer.attend(q, k, v).data
    ref = dense_attention_array(q.data, k.data, v.data, np.tri(n, dtype=bool) if causal else None)
    np.testing.assert_allclose(out, ref, atol=1e-10)


def test_routing_attends_within_clusters_only():
    from minitx.attention.routing import assign_clusters
    layer = REGISTRY["routing"](8, 2, num_clusters=3, window=64)
    q, k, _ = tensors(30, seed=4)
    v = minitx.tensor(np.eye(30)[None, None].repeat(2, 0).repeat(2, 1))      # read off A
    a = layer.attend(q, k, v).data
    mu = layer.centroids.data
    qc, kc = assign_clusters(q.data, mu), assign_clusters(k.data, mu)
    outside = qc[..., :, None] != kc[..., None, :]
    assert np.all(a[outside] == 0)
    rows = (qc[..., :, None] == kc[..., None, :]).any(-1)
    np.testing.assert_allclose(a.sum(-1)[rows], 1.0, atol=1e-12)


def test_routing_centroids_move_only_in_training():
    layer = REGISTRY["routing"](8, 2, num_clusters=2)
    mu0 = layer.centroids.data.copy()
    assert "centroids" in dict(layer.named_buffers())
    assert "centroids" not in dict(layer.named_parameters())
    q, k, v = tensors(12)
    layer.eval()
    layer.attend(q, k, v)
    np.testing.assert_array_equal(layer.centroids.data, mu0)
    layer.train()
    layer.attend(q, k, v)
    moved = layer.centroids.data
    assert not np.allclose(moved, mu0)
    np.testing.assert_allclose(np.linalg.norm(moved, axis=-1), 1.0, atol=1e-12)


# ---- FNet and AFT ------------------------------------------------------------------------

def test_fnet_is_the_real_part_of_a_2d_dft():
    x = np.random.default_rng(0).standard_normal((2, 7, 8))
    layer = REGISTRY["fnet"](8, 2)
    np.testing.assert_allclose(layer(minitx.tensor(x)).data, np.fft.fft2(x, axes=(1, 2)).real,
                               atol=1e-12)
    t = minitx.tensor(np.random.default_rng(1).standard_normal((1, 5, 6)), requires_grad=True)
    minitx.gradcheck(lambda a: fourier_mix(a, (1, 2)), (t,))
    with pytest.raises(ValueError):
        REGISTRY["fnet"](8, 2, causal=True)


@pytest.mark.parametrize("variant", ["full", "simple"])
@pytest.mark.parametrize("causal", [False, True])
def test_aft_matches_paper_formula(variant, causal):
    layer = f64(REGISTRY["aft"](8, 2, causal=causal, variant=variant, max_len=16))
    if variant == "full":
        layer.w.data = np.random.default_rng(9).standard_normal((16, 16))
    q, k, v = tensors(11)
    np.testing.assert_allclose(layer.attend(q, k, v).data,
                               layer.reference(q.data, k.data, v.data), atol=1e-10)
    qs, ks, vs = tensors(6, b=1, seed=2, requires_grad=True)
    minitx.gradcheck(layer.attend, (qs, ks, vs))
