"""Sigmoid attention: σ(QKᵀ/√D − log n) V against a hand computation and its reference, the
key-tiled sum (no online rescaling, unlike softmax), masks (σ of a masked score is exactly 0,
empty rows give zeros and zero gradients), gradients, KVCache decoding through GPT in float64,
hooks and option errors."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, KVCache, causal_pattern
from minitx.attention.sigmoid import SigmoidAttention
from minitx.models.gpt import GPT, GPTConfig
from minitx.validate import OptionError
from support import assert_close, params_to_float64, qkv, tensor, to_host

E, H, D = 8, 2, 4


def layer(causal=False, **options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY["sigmoid"](E, H, causal=causal, **options)).eval()


def by_hand(q, k, v, n, allowed=None):
    """σ(q·k/√D − log n) v, masked pairs left out, written without minitx."""
    k, v = (np.repeat(a, q.shape[1] // a.shape[1], axis=1) for a in (k, v))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) - math.log(n)
    with np.errstate(over="ignore"):                  # e^{−s} = inf for s ≪ 0: σ = 1/inf = 0
        p = 1.0 / (1.0 + np.exp(-s))
    if allowed is not None:
        p = np.where(allowed, p, 0.0)
    return p @ v


@settings(max_examples=20)
@given(nk=st.integers(1, 40), dq=st.integers(0, 39), causal=st.booleans(),
       hkv=st.sampled_from([1, 2]), n=st.integers(1, 4096), seed=st.integers(0, 2 ** 16))
def test_attend_equals_the_formula_and_the_reference(nk, dq, causal, hkv, n, seed):
    nq = max(1, nk - dq)                                         # bottom-right causal when Nq < Nk
    lay = layer(causal, context_length=n)
    assert lay.score_bias == -math.log(n)
    q, k, v = qkv(nq, nk, b=2, h=H, hkv=hkv, d=D, seed=seed)
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    allowed = causal_pattern(nq, nk) if causal else None
    assert_close(out, by_hand(q, k, v, n, allowed), rtol=1e-12, atol=1e-14)
    qt, kt, vt = tensor(q), tensor(k), tensor(v)
    assert_close(out, lay.reference(qt.data, kt.data, vt.data), rtol=1e-12, atol=1e-14)


@given(nk=st.integers(1, 40), tile=st.integers(1, 16), seed=st.integers(0, 2 ** 16))
def test_a_sum_over_key_tiles_equals_the_whole(nk, tile, seed):
    # each σ entry depends on its own score only: tile the keys, add the tiles' P_t V_t, done
    lay = layer(context_length=64)
    q, k, v = qkv(5, nk, b=1, h=H, d=D, seed=seed)
    whole = to_host(lay.attend(tensor(q), tensor(k), tensor(v)))
    tiled = sum(to_host(lay.attend(tensor(q), tensor(k[:, :, t:t + tile]),
                                   tensor(v[:, :, t:t + tile])))
                for t in range(0, nk, tile))
    assert_close(tiled, whole, rtol=1e-12, atol=1e-14)


def test_softmax_does_not_tile_that_way():
    # the contrast: softmax tiles summed without a running max and rescaling are wrong
    q, k, v = qkv(5, 12, b=1, h=H, d=D, seed=1)
    mha = params_to_float64(REGISTRY["mha"](E, H)).eval()
    whole = to_host(mha.attend(tensor(q), tensor(k), tensor(v)))
    tiled = sum(to_host(mha.attend(tensor(q), tensor(k[:, :, t:t + 4]), tensor(v[:, :, t:t + 4])))
                for t in range(0, 12, 4))
    assert np.abs(tiled - whole).max() > 0.1


def test_masked_entries_give_exact_zeros_and_no_nan():
    lay = layer()
    q, k, v = qkv(4, 6, b=1, h=H, d=D, scale=30.0, seed=2)       # large scores: σ saturates
    allowed = np.ones((1, 1, 4, 6), dtype=bool)
    allowed[..., 1, :] = False                                    # row 1: every key masked
    allowed[..., 2, :3] = False
    qt, kt, vt = (tensor(a, requires_grad=True) for a in (q, k, v))
    seen = []
    with lay.hooks([("hook_pattern", lambda t, hook: seen.append(to_host(t)))]):
        out = lay.attend(qt, kt, vt, attn_mask=allowed)
    assert np.all(seen[0][..., ~allowed[0, 0]] == 0) and np.all(to_host(out)[:, :, 1] == 0)
    assert_close(out, by_hand(q, k, v, 1024, allowed), rtol=1e-12, atol=1e-14)
    out.sum().backward()
    for t in (qt, kt, vt):
        assert np.all(np.isfinite(t.grad.numpy()))
    assert np.all(qt.grad.numpy()[:, :, 1] == 0)                  # the empty row: no gradient
    # a float mask with −inf is the same mask
    fmask = np.where(allowed, 0.0, -np.inf)
    assert_close(lay.attend(tensor(q), tensor(k), tensor(v), attn_mask=fmask), out, rtol=1e-15)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_with_masks_and_grouped_heads(causal):
    lay = layer(causal, context_length=8)
    for n in (1, 5, 9):
        arrays = qkv(n, b=1, h=H, hkv=1, d=D, scale=0.8, seed=n)
        minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))
    mask = np.random.default_rng(0).random((1, 1, 6, 6)) > 0.4
    mask[..., 3, :] = False                                       # an empty row
    arrays = qkv(6, b=1, h=H, d=D, seed=3)
    minitx.gradcheck(lambda a, b, c: lay.attend(a, b, c, attn_mask=mask),
                     tuple(tensor(a, requires_grad=True) for a in arrays))


def tiny_gpt(**kw):
    cfg = {"vocab_size": 13, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8,
           "attention": "sigmoid"}
    cfg.update(kw)
    minitx.manual_seed(0)
    return params_to_float64(GPT(GPTConfig(**cfg))).eval()


@pytest.mark.parametrize("position", ["learned", "none"])
def test_gpt_decoding_through_a_kv_cache_equals_the_full_forward(rng, position):
    model = tiny_gpt(position=position)
    assert all(b.attn.context_length == 16 for b in model.h)     # GPT fills in block_size
    idx = rng.integers(0, 13, (2, 16))
    full = model(idx)[0].numpy()
    caches = model.new_caches()
    assert all(isinstance(c, KVCache) for c in caches)
    got = [model(idx[:, :5], kv_caches=caches)[0].numpy()]       # prefill 5, then one by one
    got += [model(idx[:, t:t + 1], kv_caches=caches)[0].numpy() for t in range(5, 16)]
    assert_close(np.concatenate(got, axis=1), full, atol=1e-12)
    greedy = to_host(model.generate(idx[:, :3], 20, top_k=1, use_cache=False))
    np.testing.assert_array_equal(to_host(model.generate(idx[:, :3], 20, top_k=1)), greedy)


def test_an_explicit_context_length_wins():
    model = tiny_gpt(attention_options={"context_length": 100})
    assert model.h[0].attn.context_length == 100
    assert model.h[0].attn.score_bias == -math.log(100)


def test_hooks_show_scores_and_the_unnormalised_sigmoid_map(rng):
    lay = layer(causal=True)
    x = tensor(rng.standard_normal((2, 7, E)))
    seen = {}
    with lay.hooks([(lambda name: True, lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        y = lay(x)
    assert_close(y, lay(x), rtol=1e-14)
    scores, pattern = seen["hook_attn_scores"], seen["hook_pattern"]
    mask = causal_pattern(7)
    assert np.all(np.isneginf(scores[..., ~mask]))
    assert_close(pattern[..., mask], 1 / (1 + np.exp(-scores[..., mask])), rtol=1e-12)
    assert np.all(pattern[..., ~mask] == 0)
    assert np.abs(pattern.sum(-1) - 1).max() > 0.5                # rows are not distributions
    assert_close(seen["hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, seen["hook_v"]),
                 rtol=1e-10, atol=1e-14)


def test_bad_options_are_refused_by_name():
    with pytest.raises(OptionError, match="sigmoid: context_length must be a positive int, got 0"):
        REGISTRY["sigmoid"](E, H, context_length=0)
    with pytest.raises(OptionError, match="context_length must be a positive int, got True"):
        REGISTRY["sigmoid"](E, H, context_length=True)


def test_identities_hold():
    for claim, value, limit in SigmoidAttention.identities():
        assert value <= limit, (claim, value, limit)


@pytest.mark.parametrize("n", [4096, 65536])
def test_float32_error_does_not_grow_with_the_context(n):
    # With b = −log n every weight is about 1/n. σ must keep its relative accuracy there: one
    # rounded to an absolute float32 step (as ½(1 + tanh(s/2)) is) errs by about n·2⁻²⁴ of
    # itself, 2e-5 of the output at n = 4,096 and 2e-4 at 65,536. Stable, the error stays at
    # the rounding of the scores and of the n-term sums: 2⁻¹⁸ (32 float32 ulps) of the output.
    minitx.manual_seed(0)
    lay = REGISTRY["sigmoid"](16, 1, context_length=n).eval()
    q, k, v = (np.random.default_rng(n).standard_normal((1, 1, m, 16)) for m in (8, n, n))
    ours = to_host(lay.attend(*(tensor(a, dtype="float32") for a in (q, k, v))))
    exact = by_hand(q, k, v, n)                                           # float64
    assert np.abs(ours - exact).max() <= 2.0 ** -18 * np.abs(exact).max()
