"""minitx.patching on a tiny GPT trained to copy the previous token: activation patching finds
its previous-token head, attribution patching ranks the heads that matter the same way, and
ablation and patching do exactly what they say."""
from __future__ import annotations

import numpy as np
import pytest

import minitx
from minitx.models import GPT, GPTConfig
from minitx.optim import Adam
from minitx.patching import (ablate_heads, activation_patching, attribution_patching,
                             layer_count)
from support import assert_close, to_host

V, T, P = 8, 8, 3            # vocabulary, length, the corrupted position


@pytest.fixture(scope="module")
def trained():
    """2 layers × 2 heads, 150 Adam steps on y_t = x_{t−1} (loss ≈ 0.01 at the end)."""
    minitx.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16)).double()
    opt = Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(150):
        x = rng.integers(0, V, (32, T))
        y = np.concatenate([np.full((32, 1), -100), x[:, :-1]], axis=1)
        _, loss = model(minitx.tensor(x), minitx.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, "the model must have learned the task"
    return model


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(1)
    clean = rng.integers(0, V, (4, T))
    corrupted = clean.copy()
    corrupted[:, P] = (clean[:, P] + 1) % V
    rows = np.arange(4)

    def metric(logits):       # how much more the next position predicts the clean token
        return (logits[rows, P + 1, clean[:, P]] - logits[rows, P + 1, corrupted[:, P]]).mean()

    return minitx.tensor(clean), minitx.tensor(corrupted), metric


def _metric_of(model, tokens, metric):
    return float(metric(model(tokens)[0]).item())


def test_patching_the_whole_corrupted_token_restores_the_clean_metric(trained, pair):
    clean, corrupted, metric = pair
    table = activation_patching(trained, clean, corrupted, metric, "resid_pre", "position")
    assert table.shape == (2, T)
    clean_value = _metric_of(trained, clean, metric)
    corrupted_value = _metric_of(trained, corrupted, metric)
    assert clean_value > 1 and corrupted_value < -1
    assert table[0, P] == pytest.approx(clean_value, abs=1e-12)     # the only difference
    others = np.delete(table[0], P)
    assert_close(others, np.full(T - 1, corrupted_value), rtol=1e-12)
    # per layer (every position at once) the clean run comes back at every layer
    by_layer = activation_patching(trained, clean, corrupted, metric, "resid_pre", "layer")
    assert_close(by_layer, np.full(2, clean_value), rtol=1e-12)


def test_attribution_ranks_the_heads_that_matter_as_patching_does(trained, pair):
    clean, corrupted, metric = pair
    base = _metric_of(trained, corrupted, metric)
    real = activation_patching(trained, clean, corrupted, metric, "z", "head") - base
    estimate = attribution_patching(trained, clean, corrupted, metric, "z", "head") - base
    assert real.shape == estimate.shape == (layer_count(trained), 2)
    print("activation patching (effect per head)\n", real)
    print("attribution patching (first-order estimate)\n", estimate)
    matter = np.abs(real) > 0.05 * np.abs(real).max()          # the heads that matter
    assert matter.sum() >= 2
    order_real = np.argsort(-real[matter])
    order_est = np.argsort(-estimate[matter])
    assert list(order_real) == list(order_est)
    top = np.unravel_index(np.argmax(real), real.shape)
    assert top[0] == 0, "the previous-token head sits in the first layer"
    assert np.sign(estimate[top]) == np.sign(real[top])


def test_attribution_is_exact_for_an_activation_the_metric_is_linear_in(trained, pair):
    """The logits are linear in ln_final's normalized output: the first-order estimate at
    ``hook_normalized`` of ln_final equals real patching. (Checked by hand with hooks.)"""
    clean, corrupted, metric = pair
    _, clean_cache = trained.run_with_cache(clean, names_filter="ln_final.hook_normalized")
    logits, cache = trained.run_with_cache(corrupted, names_filter="ln_final.hook_normalized",
                                           incl_bwd=True, metric=metric)
    name = "ln_final.hook_normalized"
    estimate = float(metric(logits).item()) + float(
        ((to_host(clean_cache[name]) - to_host(cache[name])) * to_host(cache[name + "_grad"]))
        .sum())
    patched = trained.run_with_hooks(
        corrupted, fwd_hooks=[(name, lambda x, hook: clean_cache[name])])[0]
    assert estimate == pytest.approx(float(metric(patched).item()), rel=1e-10)


def test_zero_ablating_a_head_equals_zeroing_its_slice_of_out_proj(trained, pair):
    clean, _, metric = pair
    logits, _ = ablate_heads(trained, clean, heads=[(0, 1)], how="zero")
    attn = trained.h[0].attn
    w = to_host(attn.out_proj.weight).copy()
    saved = w.copy()
    w[:, 8:16] = 0.0                                     # head 1's D = 8 input columns
    attn.out_proj.weight.copy_(w)
    try:
        reference = trained(clean)[0]
    finally:
        attn.out_proj.weight.copy_(saved)
    assert_close(logits, reference, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="how"):
        ablate_heads(trained, clean, heads=[(0, 0)], how="random")


def test_ablation_hurts_most_at_the_head_patching_ranks_first(trained, pair):
    clean, corrupted, metric = pair
    real = activation_patching(trained, clean, corrupted, metric, "z", "head")
    top = tuple(int(i) for i in np.unravel_index(np.argmax(real), real.shape))
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    ablated = {h: float(metric(ablate_heads(trained, clean, heads=[h], how="zero")[0]).item())
               for h in heads}
    print("metric with one head zero-ablated", ablated)
    assert min(ablated, key=ablated.get) == top
    full = _metric_of(trained, clean, metric)
    both = float(metric(ablate_heads(trained, clean, heads=[(0, 0), (0, 1)])[0]).item())
    assert both < 0.5 * full          # without the first layer's heads the copy is gone


def test_patching_refuses_a_hook_without_the_axis():
    minitx.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=8))
    x = minitx.tensor(np.zeros((1, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="no head axis"):
        activation_patching(model, x, x, lambda lg: lg.sum(), "resid_pre", "head")
    with pytest.raises(ValueError, match="by must be"):
        activation_patching(model, x, x, lambda lg: lg.sum(), "z", "neuron")
