"""The gated delta rule (gated DeltaNet, Yang, Kautz & Hatamizadeh 2025; KDA, Kimi Linear 2025):
the chunkwise form equals the token-by-token recurrence and NumPy loops written here in each
paper's own orientation; the layer is that recurrence on its unit heads and learned gates; no
decay is the delta rule, a decay the same in every channel makes KDA gated DeltaNet, a total
decay leaves a memory of one token; gradients; decoding through GPT with a constant-size
state; options; the hook identities; the tour and bench rows. The registry contract runs in
test_registry_contract.py, PyTorch parity in tests/oracles/test_torch_parity_gated_delta.py."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY
from minitx.attention.gated_delta import (chunk_recomputed, gated_delta_chunk,
                                          gated_delta_recurrent, kda_chunk, run_gated_chunks)
from minitx.attention.retention import RecurrentState
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, peak_bytes, qkv, tensor, to_host

E, H = 8, 2
D = E // H
NAMES = ("gated_deltanet", "kda")
CHUNK = {"gated_deltanet": gated_delta_chunk, "kda": kda_chunk}


def layer(name, causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY[name](E, H, causal=causal, **options).double().eval()


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def softplus(x):
    return np.logaddexp(0, x)


def numpy_gated_deltanet(q, k, v, beta, alpha):
    """The gated DeltaNet paper's form, S (Dv, Dk): S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) +
    β_t v_t k_tᵀ, o_t = S_t q_t. q, k unit (B, H, N, Dk), v (B, H, N, Dv), beta, alpha
    (B, H, N) → (O, S_N (Dv, Dk))."""
    b, h, n, dk = k.shape
    s, out, eye = np.zeros((b, h, v.shape[-1], dk)), np.zeros(v.shape), np.eye(dk)
    for t in range(n):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        s = alpha[:, :, t, None, None] * s @ (eye - bt * kt[..., :, None] * kt[..., None, :]) \
            + bt * v[:, :, t, :, None] * kt[..., None, :]
        out[:, :, t] = (s @ q[:, :, t, :, None])[..., 0]
    return out, s


def numpy_kda(q, k, v, beta, alpha):
    """Kimi Linear's form, S (Dk, Dv): S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} +
    β_t k_t v_tᵀ, o_t = S_tᵀ q_t. alpha (B, H, N, Dk) → (O, S_N (Dk, Dv))."""
    b, h, n, dk = k.shape
    s, out, eye = np.zeros((b, h, dk, v.shape[-1])), np.zeros(v.shape), np.eye(dk)
    for t in range(n):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        s = (eye - bt * kt[..., :, None] * kt[..., None, :]) @ (alpha[:, :, t, :, None] * s) \
            + bt * kt[..., :, None] * v[:, :, t, None, :]
        out[:, :, t] = (np.swapaxes(s, -1, -2) @ q[:, :, t, :, None])[..., 0]
    return out, s


def gates(lay, k):
    """β and α from the layer's parameters on the host, the module docstring's formulas (k̃
    the raw key heads): β = σ(w·k̃ + b), log α = −e^A softplus(u·k̃ + δ) (KDA: U k̃ + δ)."""
    w, b = to_host(lay.beta_weight), to_host(lay.beta_bias)
    beta = 1 / (1 + np.exp(-(np.einsum("bhnd,hd->bhn", k, w) + b[:, None])))
    u, delta, rate = to_host(lay.alpha_weight), to_host(lay.dt_bias), np.exp(to_host(lay.A_log))
    if lay.name == "kda":
        pre = np.einsum("bhnd,hed->bhne", k, u) + delta[:, None, :]
        return beta, np.exp(-rate[:, None, None] * softplus(pre))
    return beta, np.exp(-rate[:, None] * softplus(np.einsum("bhnd,hd->bhn", k, u)
                                                  + delta[:, None]))


def paper(name, q, k, v, beta, alpha):
    """(O, S_N stored as the code stores it, (Dk, Dv))."""
    if name == "kda":
        return numpy_kda(q, k, v, beta, alpha)
    out, s = numpy_gated_deltanet(q, k, v, beta, alpha)
    return out, np.swapaxes(s, -1, -2)


@pytest.mark.parametrize("name", NAMES)
@given(n=st.integers(1, 40), chunk=st.sampled_from([1, 3, 4, 8, 16]), seed=st.integers(0, 999),
       low=st.sampled_from([1e-3, 0.5, 0.99]))
def test_chunkwise_recurrent_and_the_papers_loop_are_equal(name, n, chunk, seed, low):
    """Decays from strong (α down to 1e-3) to almost none, every chunk length."""
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    q, k = unit(q), unit(k)
    g = np.random.default_rng(seed)
    beta = g.uniform(0.05, 1.0, (2, H, n))
    alpha = g.uniform(low, 1.0, (2, H, n, D) if name == "kda" else (2, H, n))
    want, state = paper(name, q, k, v, beta, alpha)
    tq, tk, tv, tb, tl = (tensor(a) for a in (q, k, v, beta, np.log(alpha)))
    out, s = run_gated_chunks(CHUNK[name], tq, tk, tv, tb, tl, None, chunk)
    assert_close(out, want, atol=1e-10, rtol=0)
    assert_close(s, state, atol=1e-10, rtol=0)
    rec, s_rec = gated_delta_recurrent(tq, tk, tv, tb, tl)
    assert_close(rec, want, atol=1e-10, rtol=0)
    assert_close(s_rec, state, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [None, 4, 16])
def test_the_layer_is_the_gated_delta_rule_on_unit_heads(name, causal, chunk):
    n = 19
    q, k, v = qkv(n, b=2, h=H, d=D, seed=1)
    lay = layer(name, causal=causal, chunk_size=chunk)
    beta, alpha = gates(lay, k)
    assert alpha.min() < 0.9 and alpha.max() < 1          # the decay is there, and varies
    want, state = paper(name, unit(q) / np.sqrt(D), unit(k), v, beta, alpha)
    if not causal:                         # every query reads the memory after the last token
        want = np.einsum("bhde,bhnd->bhne", state, unit(q) / np.sqrt(D))
    assert_close(lay.attend(*(tensor(a) for a in (q, k, v))), want, atol=1e-10, rtol=0)


# ---- the special cases: no decay, one decay for every channel, total decay -------------------

def copy_shared(src, dst):
    """dst's projections and β weights := src's (the parameters both layers have)."""
    for (n, p), (m, r) in zip(src.named_parameters(), dst.named_parameters()):
        assert n == m
        r.copy_(to_host(p))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
def test_no_decay_is_the_delta_rule(name, causal):
    """log α := 0 through ``hook_log_alpha``: the layer is ``deltanet`` with the same weights."""
    lay, delta = layer(name, causal=causal, chunk_size=4), layer("deltanet", causal=causal,
                                                                 chunk_size=4)
    for attr in ("q_proj", "k_proj", "v_proj", "out_proj"):
        copy_shared(getattr(lay, attr), getattr(delta, attr))
    delta.beta_weight.copy_(to_host(lay.beta_weight))
    delta.beta_bias.copy_(to_host(lay.beta_bias))
    x = tensor(np.random.default_rng(2).standard_normal((2, 11, E)))
    want = delta(x)
    assert np.abs(to_host(lay(x)) - to_host(want)).max() > 1e-3      # the decay matters…
    with lay.hooks([("hook_log_alpha", lambda t, hook: t * 0.0)]):
        got = lay(x)
    assert_close(got, want, atol=1e-12, rtol=0)                       # …and without it: deltanet


@pytest.mark.parametrize("causal", [True, False])
@given(seed=st.integers(0, 999), chunk=st.sampled_from([None, 1, 4]))
def test_kda_with_the_same_gate_in_every_channel_is_gated_deltanet(causal, seed, chunk):
    """KDA with every row of U_h equal to u_h and δ_h the same in every channel computes the
    decay of gated DeltaNet with u_h, δ_h in each channel: the two layers are equal."""
    kda, gdn = layer("kda", causal=causal, chunk_size=chunk), \
        layer("gated_deltanet", causal=causal, chunk_size=chunk)
    g = np.random.default_rng(seed)
    u, delta = g.standard_normal((H, D)), g.standard_normal(H)
    gdn.alpha_weight.copy_(u)
    gdn.dt_bias.copy_(delta)
    kda.alpha_weight.copy_(np.repeat(u[:, None, :], D, axis=1))     # (H, D, D), equal rows
    kda.dt_bias.copy_(np.repeat(delta[:, None], D, axis=1))
    for attr in ("q_proj", "k_proj", "v_proj", "out_proj"):
        copy_shared(getattr(gdn, attr), getattr(kda, attr))
    for attr in ("beta_weight", "beta_bias", "A_log"):
        getattr(kda, attr).copy_(to_host(getattr(gdn, attr)))
    x = tensor(g.standard_normal((2, 9, E)))
    assert_close(kda(x), gdn(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_total_decay_leaves_a_memory_of_one_token(name):
    """log α = −800 (α = e^(−800) = 0 in float64): S_t = β_t k_t v_tᵀ, so
    o_t = τ β_t (q̂_t·k̂_t) v_t — each token reads only itself."""
    n = 7
    lay = layer(name, chunk_size=3)
    q, k, v = qkv(n, b=1, h=H, d=D, seed=3)
    with lay.hooks([("hook_log_alpha", lambda t, hook: t * 0.0 - 800.0)]):
        out = to_host(lay.attend(*(tensor(a) for a in (q, k, v))))
    beta, _ = gates(lay, k)
    dots = np.einsum("bhnd,bhnd->bhn", unit(q), unit(k)) / np.sqrt(D)
    assert_close(out, (beta * dots)[..., None] * v, atol=1e-14, rtol=1e-12)


# ---- gradients ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_of_the_chunkwise_form_in_every_input(name):
    q, k, v = qkv(7, b=1, h=H, d=D, scale=0.7, seed=3)
    g = np.random.default_rng(3)
    beta = g.uniform(0.1, 0.9, (1, H, 7))
    log_alpha = np.log(g.uniform(0.3, 1.0, (1, H, 7, D) if name == "kda" else (1, H, 7)))

    def chunked(q, k, v, beta, log_alpha):
        qn, kn = (x / F.sqrt((x * x).sum(axis=-1, keepdims=True)) for x in (q, k))
        return run_gated_chunks(CHUNK[name], qn, kn, v, beta, log_alpha, None, 3)[0]

    minitx.gradcheck(chunked, tuple(tensor(a, requires_grad=True)
                                    for a in (q, k, v, beta, log_alpha)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_of_a_chunked_layer_reaches_its_gate_parameters(name, causal):
    lay = layer(name, causal=causal, chunk_size=3)
    arrays = qkv(7, b=1, h=H, d=D, scale=0.7, seed=4)
    minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))
    lay.attend(*(tensor(a) for a in arrays)).sum().backward()
    for attr in ("beta_weight", "beta_bias", "alpha_weight", "dt_bias", "A_log"):
        assert np.any(to_host(getattr(lay, attr).grad)), attr


# ---- the recomputed chunk: only the states between chunks are kept ---------------------------

def random_gates(name, n, seed, b=1):
    g = np.random.default_rng(seed)
    beta = g.uniform(0.05, 1.0, (b, H, n))
    return beta, np.log(g.uniform(0.3, 1.0, (b, H, n, D) if name == "kda" else (b, H, n)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("with_state", [False, True])
def test_gradcheck_of_the_recomputed_chunk_in_every_input(name, with_state):
    q, k, v = qkv(5, b=1, h=H, d=D, scale=0.7, seed=6)
    beta, log_alpha = random_gates(name, 5, 6)
    arrays = [unit(q), unit(k), v, beta, log_alpha]
    if with_state:
        arrays.append(np.random.default_rng(7).standard_normal((1, H, D, D)))

    def both(*t):                            # the output and the state, one Tensor to check
        out, s = chunk_recomputed(CHUNK[name], *t)
        return F.concatenate([out, s], axis=2)

    minitx.gradcheck(both, tuple(tensor(a, requires_grad=True) for a in arrays))


@pytest.mark.parametrize("name", NAMES)
@given(n=st.integers(1, 30), chunk=st.sampled_from([None, 1, 4, 7]), seed=st.integers(0, 999))
def test_recomputing_each_chunk_gives_the_composed_values_and_gradients(name, n, chunk, seed):
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    beta, log_alpha = random_gates(name, n, seed, b=2)
    weights = np.random.default_rng(seed + 1).standard_normal((2, H, n + D, D))
    results = []
    for recompute in (False, True):
        t = [tensor(a, requires_grad=True) for a in (unit(q), unit(k), v, beta, log_alpha)]
        out, s = run_gated_chunks(CHUNK[name], *t, None, chunk, recompute=recompute)
        (F.concatenate([out, s], axis=2) * tensor(weights)).sum().backward()
        results.append([out, s] + [x.grad for x in t])
    for composed, recomputed in zip(*results):
        assert_close(recomputed, composed, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_the_recomputed_chunks_keep_no_in_chunk_terms(name):
    """N = 256 in chunks of 16: the composed chunks keep their c × c scores and solves (KDA
    its c × c × D decays too) for the backward; recomputed, forward + backward holds the
    inputs, N/C states and one chunk's terms at a time."""
    n, c = 256, 16
    arrays = (unit(a) if i < 2 else a for i, a in enumerate(qkv(n, b=1, h=H, d=D, seed=8)))
    arrays = list(arrays) + list(random_gates(name, n, 8))

    def run(recompute):
        t = [tensor(a, requires_grad=True) for a in arrays]
        out, s = run_gated_chunks(CHUNK[name], *t, None, c, recompute=recompute)
        (out.sum() + s.sum()).backward()

    composed, recomputed = peak_bytes(lambda: run(False)), peak_bytes(lambda: run(True))
    assert recomputed < composed / 2, (recomputed, composed)


# ---- decoding ---------------------------------------------------------------------------------

def gpt(name, **options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention=name, position="none", attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("options", [{}, {"chunk_size": 3}, {"chunk_size": None}])
def test_prefill_then_token_by_token_equals_the_full_forward(name, options):
    model = gpt(name, **options)
    idx = np.random.default_rng(5).integers(0, 11, (2, 13))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    assert all(isinstance(c, RecurrentState) for c in caches)
    parts = [model(tensor(idx[:, :6], dtype=None), kv_caches=caches)[0]]      # prefill 6
    size = caches[0].nbytes
    assert size == 2 * H * D * D * 8                  # one (D × D) state a head, float64
    for t in range(6, 13):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
        assert len(caches[1]) == t + 1 and caches[1].nbytes == size
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("option,value", [("chunk_size", 0), ("chunk_size", -1),
                                          ("chunk_size", 2.5), ("chunk_size", "8"),
                                          ("eps", 0), ("eps", -1e-3), ("eps", float("nan")),
                                          ("eps", "1e-6"), ("scale", 0), ("scale", -1.0),
                                          ("scale", float("inf")), ("scale", "1")])
def test_options_are_validated(name, option, value):
    with pytest.raises(ValueError, match=option) as info:
        REGISTRY[name](E, H, **{option: value})
    assert str(value) in str(info.value)


@pytest.mark.parametrize("name", NAMES)
@given(n=st.integers(1, 20), d=st.sampled_from([2, 4, 8]), causal=st.booleans(),
       seed=st.integers(0, 999))
def test_scale_one_is_sqrt_d_times_the_official_scale(name, n, d, causal, seed):
    """The state does not depend on τ, so ``scale=1.0`` gives √D times the default 1/√D."""
    arrays = [tensor(a) for a in qkv(n, b=2, h=H, d=d, seed=seed)]
    minitx.manual_seed(0)
    official = REGISTRY[name](H * d, H, causal=causal, chunk_size=4).double()
    minitx.manual_seed(0)
    unscaled = REGISTRY[name](H * d, H, causal=causal, chunk_size=4, scale=1.0).double()
    assert official.scale == 1 / np.sqrt(d)
    o_official, o_unscaled = to_host(official.attend(*arrays)), to_host(unscaled.attend(*arrays))
    assert_close(o_unscaled, np.sqrt(d) * o_official, rtol=1e-12, atol=1e-14)
    assert np.abs(o_official).max() > 1e-3


# ---- hooks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
def test_hooks_tie_gates_pattern_state_and_output(name, causal):
    """P = (W ⊙ M)(I + A)⁻¹ diag(β), A_ts = β_t Σ_d k_td k_sd e^{G_td − G_sd} (s < t),
    W_ts = Σ_d q_td k_sd e^{G_td − G_sd} (non-causal: every query reads S_N, so
    W_ts = Σ_d q_td k_sd e^{G_Nd − G_sd}); z = P V."""
    n = 9
    lay = layer(name, causal=causal, chunk_size=4)
    x = np.random.default_rng(6).standard_normal((2, n, E))
    plain = lay(tensor(x))
    cache = {}
    with lay.hooks([(lambda nm: True, lambda t, hook: cache.__setitem__(hook.name, to_host(t)))]):
        hooked = lay(tensor(x))
    assert_close(hooked, plain, atol=1e-12)
    q, k, v = (np.swapaxes(cache[f"hook_{s}"], 1, 2) for s in "qkv")
    beta, alpha = gates(lay, k)
    assert_close(cache["hook_beta"], beta, rtol=1e-12)
    assert_close(cache["hook_log_alpha"], np.log(alpha), rtol=1e-12)
    qn, kn = unit(q) / np.sqrt(D), unit(k)
    g = np.cumsum(np.log(alpha if name == "kda" else alpha[..., None] * np.ones(D)), axis=2)
    ts = g[:, :, :, None, :] - g[:, :, None, :, :]                    # G_t − G_s (…, t, s, d)
    below = np.tril(np.ones((n, n)))[..., None]
    decay = np.exp(np.where(below > 0, ts, -np.inf))                  # 0 above the diagonal
    a = np.tril(beta[..., None] * np.einsum("bhtd,bhsd,bhtsd->bhts", kn, kn, decay), -1)
    if causal:
        w = np.einsum("bhtd,bhsd,bhtsd->bhts", qn, kn, decay)
    else:
        w = np.einsum("bhtd,bhsd->bhts", qn, kn * np.exp(g[:, :, -1:] - g))
    pattern = w @ np.linalg.inv(np.eye(n) + a) * beta[:, :, None, :]
    assert_close(cache["hook_pattern"], pattern, rtol=1e-9, atol=1e-12)
    assert_close(np.swapaxes(cache["hook_z"], 1, 2), pattern @ v, rtol=1e-9, atol=1e-12)
    _, state = paper(name, qn, kn, v, beta, alpha)
    assert_close(cache["hook_state"], state, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_beta_hook_replaces_the_write_strength(name):
    """β := 0 writes nothing: the memory stays empty and every output is zero."""
    lay = layer(name)
    x = tensor(np.random.default_rng(7).standard_normal((1, 6, E)))
    with lay.hooks([("hook_beta", lambda t, hook: t * 0.0),
                    ("hook_z", lambda t, hook: np.testing.assert_array_equal(to_host(t), 0))]):
        lay(x)


@pytest.mark.parametrize("name", NAMES)
def test_identities_hold(name):
    rows = REGISTRY[name].identities()
    assert len(rows) == 3
    for claim, value, limit in rows:
        assert limit <= 1e-6 and value <= limit, (claim, value)


# ---- the tour's and bench's rows ----------------------------------------------------------------

def test_the_tour_counts_one_state_for_each():
    from minitx.tour import cache_section
    lines = cache_section(embed=16, heads=2, lengths=(4, 9))
    for name in NAMES:
        row = [line.split() for line in lines if line.split()[:1] == [name]]
        assert row and row[0][1:3] == [str(2 * 8 * 8)] * 2, (name, row)   # H·D·D, bounded


def test_bench_times_both():
    from minitx.cli import bench_rows
    rows = bench_rows(list(NAMES), [64], embed=16, heads=2)
    assert [r["variant"] for r in rows] == list(NAMES)
    for r in rows:
        assert r["error"] is None and r["time_s"] > 0 and r["peak_bytes"] > 0, r
