"""The delta rule (Schlag et al. 2021; Yang et al. 2024): the chunkwise UT form equals the
token-by-token recurrence and a NumPy loop written here in the paper's convention; the
triangular solve and its gradient; the associative-recall fact that makes the rule worth having
(it overwrites, linear attention cannot); decoding through GPT with a constant-size state; the
hook identities. The registry contract runs in test_registry_contract.py."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY, linear_attention
from minitx.attention.delta_rule import delta_chunk, delta_rule_recurrent, unit_lower_solve
from minitx.attention.retention import RecurrentState, run_in_chunks
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["deltanet"](E, H, causal=causal, **options).double().eval()


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_delta(q, k, v, beta):
    """The paper's form, S (Dv, Dk): S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t.
    q, k unit (B, H, N, Dk), v (B, H, N, Dv), beta (B, H, N) → (O, S_N)."""
    b, h, n, dk = k.shape
    s = np.zeros((b, h, v.shape[-1], dk))
    out = np.zeros(v.shape)
    eye = np.eye(dk)
    for t in range(n):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        s = s @ (eye - bt * kt[..., :, None] * kt[..., None, :]) + \
            bt * v[:, :, t, :, None] * kt[..., None, :]
        out[:, :, t] = (s @ q[:, :, t, :, None])[..., 0]
    return out, s


def betas(lay, k):
    """β = σ(w_h·k̃ + b_h) from the layer's parameters, on the host (k̃ the raw key heads)."""
    w, b = to_host(lay.beta_weight), to_host(lay.beta_bias)
    return 1 / (1 + np.exp(-(np.einsum("bhnd,hd->bhn", k, w) + b[:, None])))


@given(n=st.integers(1, 40), chunk=st.sampled_from([1, 3, 4, 8, 16]), seed=st.integers(0, 999))
def test_chunkwise_recurrent_and_the_papers_loop_are_equal(n, chunk, seed):
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    q, k = unit(q), unit(k)
    beta = np.random.default_rng(seed).uniform(0.05, 1.0, (2, H, n))
    want, state = numpy_delta(q, k, v, beta)
    tq, tk, tv, tb = (tensor(a) for a in (q, k, v, beta))
    out, s = run_in_chunks(delta_chunk, tq, tk, tv, tb, None, chunk)
    assert_close(out, want, atol=1e-10, rtol=0)
    assert_close(s, np.swapaxes(state, -1, -2), atol=1e-10, rtol=0)       # stored as Sᵀ
    rec, _ = delta_rule_recurrent(tq, tk, tv, tb)
    assert_close(rec, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [None, 4, 16])
def test_the_layer_is_the_delta_rule_on_unit_heads(causal, chunk):
    n = 19
    q, k, v = qkv(n, b=2, h=H, d=D, seed=1)
    lay = layer(causal=causal, chunk_size=chunk)
    # the official kernel's default scale τ = 1/√D on the query
    want, state = numpy_delta(unit(q) / np.sqrt(D), unit(k), v, betas(lay, k))
    if not causal:                         # every query reads the memory after the last token
        want = np.einsum("bhed,bhnd->bhne", state, unit(q) / np.sqrt(D))
    assert_close(lay.attend(*(tensor(a) for a in (q, k, v))), want, atol=1e-10, rtol=0)


@given(n=st.integers(1, 20), d=st.sampled_from([2, 4, 8]), causal=st.booleans(),
       seed=st.integers(0, 999))
def test_scale_one_is_sqrt_d_times_the_official_scale(n, d, causal, seed):
    """``scale=1.0`` (o_t = S_t q̂_t) against the default τ = 1/√D of the official kernel: the
    state does not depend on τ, so the outputs differ by exactly the factor √D."""
    q, k, v = qkv(n, b=2, h=H, d=d, seed=seed)
    arrays = [tensor(a) for a in (q, k, v)]
    minitx.manual_seed(0)
    official = REGISTRY["deltanet"](H * d, H, causal=causal, chunk_size=4).double()
    minitx.manual_seed(0)
    unscaled = REGISTRY["deltanet"](H * d, H, causal=causal, chunk_size=4, scale=1.0).double()
    assert official.scale == 1 / np.sqrt(d)
    o_official, o_unscaled = to_host(official.attend(*arrays)), to_host(unscaled.attend(*arrays))
    assert_close(o_unscaled, np.sqrt(d) * o_official, rtol=1e-12, atol=1e-14)
    assert np.abs(o_official).max() > 1e-3                 # a factor of something non-zero


@given(c=st.integers(1, 9), m=st.integers(1, 4), seed=st.integers(0, 999))
def test_forward_substitution_solves_the_unit_lower_system_and_its_gradient(c, m, seed):
    """Forward substitution against a general solve of (I + tril(A, −1)) X = R; the gradient
    (back substitution with the transpose) by finite differences."""
    rng = np.random.default_rng(seed)
    a, r = rng.standard_normal((2, 3, c, c)) * 0.5, rng.standard_normal((2, 3, c, m))
    mat = np.eye(c) + np.tril(a, -1)                     # only the strictly lower part counts
    assert_close(unit_lower_solve(tensor(a), tensor(r)), np.linalg.solve(mat, r),
                 rtol=1e-12, atol=1e-12)
    minitx.gradcheck(unit_lower_solve, (tensor(a, requires_grad=True),
                                        tensor(r, requires_grad=True)))


def test_gradcheck_of_the_chunkwise_form_in_every_input():
    q, k, v = qkv(7, b=1, h=H, d=D, scale=0.7, seed=3)
    beta = np.random.default_rng(3).uniform(0.1, 0.9, (1, H, 7))

    def chunked(q, k, v, beta):
        qn, kn = (x / F.sqrt((x * x).sum(axis=-1, keepdims=True)) for x in (q, k))
        return run_in_chunks(delta_chunk, qn, kn, v, beta, None, 3)[0]

    minitx.gradcheck(chunked, tuple(tensor(a, requires_grad=True) for a in (q, k, v, beta)))


def test_gradcheck_of_a_chunked_layer_reaches_the_beta_parameters():
    lay = layer(chunk_size=3)
    arrays = qkv(7, b=1, h=H, d=D, scale=0.7, seed=4)
    minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))
    out = lay.attend(*(tensor(a) for a in arrays))
    out.sum().backward()
    assert np.any(to_host(lay.beta_weight.grad)) and np.any(to_host(lay.beta_bias.grad))


# ---- associative recall: why the delta rule --------------------------------------------------

def test_the_delta_rule_overwrites_an_association_and_linear_attention_mixes():
    """Write k→v1, then an unrelated k'→w, then k→v2, with β = 1; read with q = k. The delta
    rule returns v2 (and still w for k'); linear attention returns v1 + v2 (a mix)."""
    k_a, k_b = np.array([0.6, 0.8, 0, 0]), np.array([0, 0, 1.0, 0])       # unit, orthogonal
    v1, w, v2 = np.array([1.0, 0, 0, 2]), np.array([0, 5.0, 0, 0]), np.array([0, 0, 3.0, -1])
    keys = np.stack([k_a, k_b, k_a])[None, None]                           # (1, 1, 3, 4)
    values = np.stack([v1, w, v2])[None, None]
    queries = np.stack([k_a, k_b, k_a])[None, None]          # read k after each write
    beta = np.ones((1, 1, 3))
    out = to_host(run_in_chunks(delta_chunk, tensor(queries), tensor(keys), tensor(values),
                                tensor(beta), None, 2)[0])[0, 0]
    np.testing.assert_allclose(out[0], v1, atol=1e-14)
    np.testing.assert_allclose(out[1], w, atol=1e-14)
    np.testing.assert_allclose(out[2], v2, atol=1e-14)                     # overwritten
    rec = to_host(delta_rule_recurrent(tensor(queries), tensor(keys), tensor(values),
                                       tensor(beta))[0])[0, 0]
    np.testing.assert_allclose(rec[2], v2, atol=1e-14)
    # linear attention, identity features, unnormalised: o_3 = Σ_{j≤3} (k_a·k_j) v_j = v1 + v2
    lin = to_host(linear_attention(tensor(queries), tensor(keys), tensor(values),
                                   feature_map="identity", causal=True, normalize=False))[0, 0]
    np.testing.assert_allclose(lin[2], v1 + v2, atol=1e-14)
    assert np.abs(lin[2] - v2).max() >= 1.0                                # not v2: a mix


# ---- decoding ---------------------------------------------------------------------------------

def gpt(**options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention="deltanet", position="none", attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("options", [{}, {"chunk_size": 3}, {"chunk_size": None}])
def test_prefill_then_token_by_token_equals_the_full_forward(options):
    model = gpt(**options)
    idx = np.random.default_rng(5).integers(0, 11, (2, 13))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    assert all(isinstance(c, RecurrentState) for c in caches)
    parts = [model(tensor(idx[:, :6], dtype=None), kv_caches=caches)[0]]      # prefill 6
    size = caches[0].nbytes
    assert size == 2 * H * D * D * 8
    for t in range(6, 13):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
        assert len(caches[1]) == t + 1 and caches[1].nbytes == size
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("option,value", [("chunk_size", 0), ("chunk_size", -1),
                                          ("chunk_size", 2.5), ("chunk_size", "8"),
                                          ("eps", 0), ("eps", -1e-3), ("eps", float("nan")),
                                          ("eps", "1e-6"), ("scale", 0), ("scale", -1.0),
                                          ("scale", float("inf")), ("scale", "1")])
def test_options_are_validated(option, value):
    with pytest.raises(ValueError, match=option) as info:
        REGISTRY["deltanet"](E, H, **{option: value})
    assert str(value) in str(info.value)


# ---- hooks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_hooks_tie_beta_pattern_state_and_output(causal):
    n = 9
    lay = layer(causal=causal, chunk_size=4)
    x = np.random.default_rng(6).standard_normal((2, n, E))
    plain = lay(tensor(x))
    cache = {}
    with lay.hooks([(lambda nm: True, lambda t, hook: cache.__setitem__(hook.name, to_host(t)))]):
        hooked = lay(tensor(x))
    assert_close(hooked, plain, atol=1e-12)
    q, k, v = (np.swapaxes(cache[f"hook_{s}"], 1, 2) for s in "qkv")
    beta = betas(lay, k)
    assert_close(cache["hook_beta"], beta, rtol=1e-12)
    # P = (τQ̂ K̂ᵀ ⊙ M)(I + A)⁻¹ diag(β), A = tril(diag(β) K̂ K̂ᵀ, −1); z = P V; τ = 1/√D
    qn, kn = unit(q) / np.sqrt(D), unit(k)
    kk = kn @ np.swapaxes(kn, -1, -2)
    t_inv = np.linalg.inv(np.eye(n) + np.tril(beta[..., None] * kk, -1))
    scores = qn @ np.swapaxes(kn, -1, -2)
    pattern = (np.tril(scores) if causal else scores) @ t_inv * beta[:, :, None, :]
    assert_close(cache["hook_pattern"], pattern, rtol=1e-9, atol=1e-12)
    assert_close(np.swapaxes(cache["hook_z"], 1, 2), pattern @ v, rtol=1e-9, atol=1e-12)
    _, state = numpy_delta(qn, kn, v, beta)
    assert_close(cache["hook_state"], np.swapaxes(state, -1, -2), rtol=1e-9, atol=1e-12)


def test_beta_hook_replaces_the_write_strength():
    """β := 0 writes nothing: the memory stays empty and every output is zero."""
    lay = layer()
    x = tensor(np.random.default_rng(7).standard_normal((1, 6, E)))
    with lay.hooks([("hook_beta", lambda t, hook: t * 0.0),
                    ("hook_z", lambda t, hook: np.testing.assert_array_equal(to_host(t), 0))]):
        lay(x)


def test_identities_hold():
    rows = REGISTRY["deltanet"].identities()
    assert len(rows) == 2
    for claim, value, limit in rows:
        assert value <= limit, (claim, value)
