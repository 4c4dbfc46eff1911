"""Retention (Sun et al. 2023): the paper's decay schedule; the parallel, chunkwise and recurrent
forms equal each other and a NumPy formula written here; decoding through GPT with a
constant-size state equals the full forward; the hook points satisfy the identities that tie
them to the output. The registry contract (gradcheck, causality, GQA, scales) runs in
test_registry_contract.py."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.retention import (RecurrentState, decay_mask, decayed_recurrence,
                                        retention_decays)
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["retention"](E, H, causal=causal, **options).double().eval()


def numpy_retention(q, k, v, gammas, causal=True):
    """(Q Kᵀ/√D ⊙ D) V with D_nm = γ^(n−m) (n ≥ m) or γ^|n−m|, written with loops over (n, m)."""
    b, h, n, d = q.shape
    out = np.zeros_like(v)
    for head in range(h):
        for i in range(n):
            for j in range(n if not causal else i + 1):
                w = gammas[head] ** abs(i - j) * (q[:, head, i] * k[:, head, j]).sum(-1)
                out[:, head, i] += (w / math.sqrt(d))[:, None] * v[:, head, j]
    return out


def test_decays_are_the_papers_schedule():
    # γ = 1 − 2^(−5 − h): 31/32, 63/64, 127/128, 255/256
    assert retention_decays(4).tolist() == [31 / 32, 63 / 64, 127 / 128, 255 / 256]
    assert REGISTRY["retention"](16, 4).gammas.tolist() == [31 / 32, 63 / 64, 127 / 128,
                                                            255 / 256]


@given(n=st.integers(1, 40), chunk=st.sampled_from([1, 3, 4, 8, 16]), seed=st.integers(0, 999))
def test_parallel_chunkwise_and_recurrent_forms_are_equal(n, chunk, seed):
    """N around and across the chunk sizes (partial last chunks, one chunk, many)."""
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    want = numpy_retention(q, k, v, retention_decays(H))
    par, chk = layer(), layer(chunk_size=chunk)
    tq, tk, tv = (tensor(a) for a in (q, k, v))
    assert_close(par.attend(tq, tk, tv), want, atol=1e-10, rtol=0)
    assert_close(chk.attend(tq, tk, tv), want, atol=1e-10, rtol=0)
    rec, _ = decayed_recurrence(tq, tk / math.sqrt(D), tv, par.log_decay(n, tq))
    assert_close(rec, want, atol=1e-10, rtol=0)


def test_non_causal_is_the_symmetric_decay():
    q, k, v = qkv(9, b=2, h=H, d=D, seed=3)
    got = layer(causal=False).attend(*(tensor(a) for a in (q, k, v)))
    assert_close(got, numpy_retention(q, k, v, retention_decays(H), causal=False), atol=1e-12)


def test_the_chunkwise_form_takes_grouped_key_value_heads():
    q, k, v = qkv(11, b=1, h=H, hkv=1, d=D, seed=4)
    rep = [np.repeat(a, H, axis=1) for a in (k, v)]
    got = layer(chunk_size=4).attend(*(tensor(a) for a in (q, k, v)))
    assert_close(got, numpy_retention(q, *rep, retention_decays(H)), atol=1e-12)


def test_gradcheck_of_the_chunkwise_form():
    lay = layer(chunk_size=3)
    arrays = qkv(7, b=1, h=H, d=D, scale=0.7, seed=5)
    minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))


def test_decay_mask_is_gamma_to_the_distance():
    lay = layer()
    got = lay.decay_matrix(6)
    dist = np.arange(6)[:, None] - np.arange(6)[None, :]
    for h, g in enumerate([31 / 32, 63 / 64]):
        np.testing.assert_allclose(got[h], np.where(dist >= 0, g ** np.abs(dist), 0.0),
                                   rtol=1e-13)
    sym = layer(causal=False).decay_matrix(6)
    np.testing.assert_allclose(sym[0], (31 / 32) ** np.abs(dist), rtol=1e-13)


def test_decay_mask_of_a_long_constant_decay_stays_accurate():
    """Segment sums, not differences of prefix sums: at N = 400 and ℓ = −0.05 the corner entry
    exp(−0.05·399) is still right to ~1e-13 relative."""
    n = 400
    got = to_host(decay_mask(tensor(np.full((1, n), -0.05))))[0]
    dist = np.arange(n)[:, None] - np.arange(n)[None, :]
    want = np.where(dist >= 0, np.exp(-0.05 * np.maximum(dist, 0)), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# ---- decoding: a constant-size state through GPT ----------------------------------------------

def gpt(**options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention="retention", position="none", attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("options", [{}, {"chunk_size": 3}])
def test_prefill_then_token_by_token_equals_the_full_forward(options):
    model = gpt(**options)
    idx = np.random.default_rng(6).integers(0, 11, (2, 13))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    assert all(isinstance(c, RecurrentState) for c in caches)
    parts = [model(tensor(idx[:, :5], dtype=None), kv_caches=caches)[0]]      # prefill 5
    size = caches[0].nbytes
    assert size == 2 * H * D * D * 8                                         # (B, H, D, D) f64
    for t in range(5, 13):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
        assert len(caches[0]) == t + 1 and caches[0].nbytes == size         # constant size
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-10, rtol=0)


def test_generate_with_the_state_matches_generate_without():
    model = gpt()
    prompt = tensor(np.array([[1, 2, 3]]), dtype=None)
    with_state = model.generate(prompt, 6, temperature=0, use_cache=True)
    without = model.generate(prompt, 6, temperature=0, use_cache=False)
    np.testing.assert_array_equal(to_host(with_state), to_host(without))


def test_the_cache_refuses_what_it_cannot_do():
    x = tensor(np.zeros((1, 3, E)))
    with pytest.raises(ValueError, match="causal=True"):
        layer(causal=False)(x, kv_cache=RecurrentState())
    with pytest.raises(TypeError, match="RecurrentState"):
        layer()(x, kv_cache=minitx.attention.KVCache())
    cache = RecurrentState()
    layer()(x, kv_cache=cache)
    with pytest.raises(ValueError, match="shape"):
        layer()(tensor(np.zeros((2, 1, E))), kv_cache=cache)                # another batch
    cache.reset()
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.mark.parametrize("value", [0, -2, 1.5, "4", True])
def test_chunk_size_is_validated(value):
    with pytest.raises(ValueError, match="chunk_size") as info:
        REGISTRY["retention"](E, H, chunk_size=value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)


# ---- hook points and their identities ---------------------------------------------------------

def run_cached(lay, x):
    cache = {}
    with lay.hooks([(lambda n: True, lambda t, hook: cache.__setitem__(hook.name, to_host(t)))]):
        out = lay(tensor(x))
    return out, cache


@pytest.mark.parametrize("causal", [True, False])
def test_hooks_tie_decay_pattern_state_and_output(causal):
    n = 10
    lay = layer(causal=causal, chunk_size=4)
    x = np.random.default_rng(7).standard_normal((2, n, E))
    plain = lay(tensor(x))
    hooked, c = run_cached(lay, x)
    assert_close(hooked, plain, atol=1e-12)                # hooks force one chunk: same values
    q, k, v = (np.swapaxes(c[f"hook_{s}"], 1, 2) for s in "qkv")           # (B, H, N, D)
    dist = np.arange(n)[:, None] - np.arange(n)[None, :]
    g = np.array([31 / 32, 63 / 64])[:, None, None]
    decay = g ** np.abs(dist) * (dist >= 0 if causal else 1)
    assert_close(c["hook_decay"], decay[None], rtol=1e-12)
    pattern = np.einsum("bhnd,bhmd->bhnm", q, k) / math.sqrt(D) * decay
    assert_close(c["hook_pattern"], pattern, rtol=1e-10, atol=1e-14)
    assert_close(np.swapaxes(c["hook_z"], 1, 2), pattern @ v, rtol=1e-10, atol=1e-13)
    # the state after the last token: Σ_m γ^(N−1−m) k_mᵀ v_m / √D (the forward recurrence)
    w = g[..., 0] ** (n - 1 - np.arange(n))                                  # (H, N)
    state = np.einsum("hm,bhmd,bhme->bhde", w, k, v) / math.sqrt(D)
    assert_close(c["hook_state"], state, rtol=1e-10)


def test_replacing_the_decay_replaces_the_attention():
    """D := the causal all-ones mask turns retention into unnormalised causal linear attention
    with identity features: out = tril(Q Kᵀ)/√D V."""
    n = 7
    lay = layer()
    x = tensor(np.random.default_rng(8).standard_normal((1, n, E)))
    ones = tensor(np.tril(np.ones((1, H, n, n))))
    seen = {}
    hooks = [("hook_decay", lambda t, hook: ones),
             ("hook_q", lambda t, hook: seen.__setitem__("q", to_host(t))),
             ("hook_k", lambda t, hook: seen.__setitem__("k", to_host(t))),
             ("hook_v", lambda t, hook: seen.__setitem__("v", to_host(t))),
             ("hook_z", lambda t, hook: seen.__setitem__("z", to_host(t)))]
    with lay.hooks(hooks):
        lay(x)
    q, k, v = (np.swapaxes(seen[s], 1, 2) for s in "qkv")
    want = np.tril(np.einsum("bhnd,bhmd->bhnm", q, k)) / math.sqrt(D) @ v
    assert_close(np.swapaxes(seen["z"], 1, 2), want, rtol=1e-10, atol=1e-13)


def test_the_state_hook_replaces_the_cached_memory():
    """Zero the state after a prefill: the next token then sees an empty memory, as if it were
    the first token of a fresh sequence."""
    lay = layer()
    x = np.random.default_rng(9).standard_normal((1, 6, E))
    cache = RecurrentState()
    with lay.hooks([("hook_state", lambda t, hook: t * 0.0)]):
        lay(tensor(x[:, :5]), kv_cache=cache)
    assert not np.any(to_host(cache.state))
    after = lay(tensor(x[:, 5:]), kv_cache=cache)
    assert_close(after, lay(tensor(x[:, 5:])), atol=1e-13)


def test_identities_hold():
    rows = REGISTRY["retention"].identities()
    assert len(rows) == 3
    for claim, value, limit in rows:
        assert value <= limit, (claim, value)
