"""State-space duality (Dao & Gu 2024): the selective SSM computed as masked attention
(L ⊙ C Bᵀ) X, as a linear scan and by the chunked algorithm gives the same numbers, and the
same as a NumPy loop written here; L is the products of the decays and is 1-semiseparable;
the Mamba-2 parameterisation (Δ, A); decoding through GPT with a constant-size state; the hook
identities. The registry contract runs in test_registry_contract.py."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.retention import RecurrentState, decayed_chunk, run_in_chunks
from minitx.attention.ssd import ssd_scan
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["ssd"](E, H, causal=causal, **options).double().eval()


def numpy_ssm(c, b, x, a):
    """h_t = a_t h_{t−1} + B_tᵀ x_t, y_t = C_t h_t, one token at a time. c, b (Bt, H, T, Ns),
    x (Bt, H, T, P), a (Bt, H, T) → (Y, h_T)."""
    h = np.zeros(b.shape[:2] + (b.shape[-1], x.shape[-1]))
    ys = []
    for t in range(x.shape[2]):
        h = a[:, :, t, None, None] * h + b[:, :, t, :, None] * x[:, :, t, None, :]
        ys.append(np.einsum("bhs,bhsp->bhp", c[:, :, t], h))
    return np.stack(ys, axis=2), h


def products(a, causal=True):
    """L_ts = a_{s+1} ··· a_t by explicit products (np.prod of the slice), (…, T) → (…, T, T)."""
    t_len = a.shape[-1]
    out = np.zeros(a.shape + (t_len,))
    for t in range(t_len):
        for s in range(t_len):
            if s <= t:
                out[..., t, s] = np.prod(a[..., s + 1:t + 1], axis=-1)
            elif not causal:
                out[..., t, s] = np.prod(a[..., t + 1:s + 1], axis=-1)
    return out


def mamba_steps(lay, v):
    """Δ = softplus(w_h·v + b_h), a = exp(−Δ·exp(A_log)), on the host from the parameters."""
    w, bias, a_log = (to_host(p) for p in (lay.dt_weight, lay.dt_bias, lay.A_log))
    dt = np.log1p(np.exp(np.einsum("bhnd,hd->bhn", v, w) + bias[:, None]))
    return dt, np.exp(-dt * np.exp(a_log)[:, None])


@given(n=st.integers(1, 40), chunk=st.sampled_from([1, 3, 4, 8, 16]), seed=st.integers(0, 999))
def test_masked_attention_scan_and_chunks_are_the_same_ssm(n, chunk, seed):
    c, b, x = qkv(n, b=2, h=H, d=D, seed=seed)
    a = np.random.default_rng(seed).uniform(0.3, 1.0, (2, H, n))
    want, state = numpy_ssm(c, b, x, a)
    tc, tb, tx, log_a = tensor(c), tensor(b), tensor(x), tensor(np.log(a))
    quadratic, s_q = decayed_chunk(tc, tb, tx, log_a)
    chunked, s_c = run_in_chunks(decayed_chunk, tc, tb, tx, log_a, None, chunk)
    scan, s_s = ssd_scan(tc, tb, tx, log_a)
    for got, s in ((quadratic, s_q), (chunked, s_c), (scan, s_s)):
        assert_close(got, want, atol=1e-10, rtol=0)
        assert_close(s, state, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_the_mask_is_the_products_of_the_decays_and_is_semiseparable(causal):
    n = 8
    lay = layer(causal=causal)
    v = np.random.default_rng(1).standard_normal((2, H, n, D))
    got = to_host(lay.decay_matrix(tensor(v)))
    _, a = mamba_steps(lay, v)
    assert_close(got, products(a, causal), rtol=1e-12)
    # 1-semiseparable: every block strictly below the diagonal has rank one
    for t in range(1, n):
        block = got[0, 0, t:, :t]
        s = np.linalg.svd(block, compute_uv=False)
        assert s[1:].max(initial=0.0) <= 1e-12 * s[0], (t, s)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [None, 5])
def test_the_layer_is_mamba2s_parameterised_ssm(causal, chunk):
    """(Non-causal has no chunked form: there the option is not read.)"""
    n = 13
    q, k, v = qkv(n, b=2, h=H, d=D, seed=2)
    lay = layer(causal=causal, chunk_size=chunk)
    dt, a = mamba_steps(lay, v)
    m = products(a, causal) * (q @ np.swapaxes(k * dt[..., None], -1, -2))    # L ⊙ C B̄ᵀ
    want = m @ v
    if causal:
        assert_close(want, numpy_ssm(q, k * dt[..., None], v, a)[0], atol=1e-12)
    assert_close(lay.attend(*(tensor(t) for t in (q, k, v))), want, atol=1e-10, rtol=0)


def test_initialisation_follows_mamba2():
    lay = REGISTRY["ssd"](64, 32)
    dt = np.log1p(np.exp(to_host(lay.dt_bias).astype(np.float64)))
    a = np.exp(to_host(lay.A_log).astype(np.float64))
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001
    assert a.min() >= 1 and a.max() <= 16


def test_gradcheck_of_the_chunked_form_and_the_parameters_learn():
    lay = layer(chunk_size=3)
    arrays = qkv(7, b=1, h=H, d=D, scale=0.7, seed=3)
    minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))
    lay.attend(*(tensor(a) for a in arrays)).sum().backward()
    for p in (lay.dt_weight, lay.dt_bias, lay.A_log):
        assert np.any(to_host(p.grad))


# ---- decoding ---------------------------------------------------------------------------------

def gpt(**options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention="ssd", position="none", attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("options", [{}, {"chunk_size": 4}])
def test_prefill_then_token_by_token_equals_the_full_forward(options):
    model = gpt(**options)
    idx = np.random.default_rng(4).integers(0, 11, (2, 14))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    parts = [model(tensor(idx[:, :7], dtype=None), kv_caches=caches)[0]]      # prefill 7
    size = caches[0].nbytes
    assert size == 2 * H * D * D * 8
    for t in range(7, 14):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
        assert len(caches[0]) == t + 1 and caches[0].nbytes == size
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-10, rtol=0)
    assert isinstance(caches[0], RecurrentState)


@pytest.mark.parametrize("value", [0, -3, 1.5, "16"])
def test_chunk_size_is_validated(value):
    with pytest.raises(ValueError, match="chunk_size") as info:
        REGISTRY["ssd"](E, H, chunk_size=value)
    assert str(value) in str(info.value)


# ---- hooks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_hooks_tie_step_mask_pattern_state_and_output(causal):
    n = 10
    lay = layer(causal=causal, chunk_size=4)
    x = np.random.default_rng(5).standard_normal((2, n, E))
    plain = lay(tensor(x))
    cache = {}
    with lay.hooks([(lambda nm: True, lambda t, hook: cache.__setitem__(hook.name, to_host(t)))]):
        hooked = lay(tensor(x))
    assert_close(hooked, plain, atol=1e-12)
    q, k, v = (np.swapaxes(cache[f"hook_{s}"], 1, 2) for s in "qkv")
    dt, a = mamba_steps(lay, v)
    assert_close(cache["hook_dt"], dt, rtol=1e-12)
    big_l = products(a, causal)
    assert_close(cache["hook_decay"], big_l, rtol=1e-11)
    bbar = k * dt[..., None]
    pattern = big_l * (q @ np.swapaxes(bbar, -1, -2))
    assert_close(cache["hook_pattern"], pattern, rtol=1e-10, atol=1e-14)
    assert_close(np.swapaxes(cache["hook_z"], 1, 2), pattern @ v, rtol=1e-10, atol=1e-13)
    assert_close(cache["hook_state"], numpy_ssm(q, bbar, v, a)[1], rtol=1e-10, atol=1e-14)


def test_replacing_the_mask_changes_the_output_as_the_duality_says():
    """L := the causal all-ones mask (a_t = 1: no forgetting): out = tril(C B̄ᵀ) X."""
    n = 6
    lay = layer()
    x = tensor(np.random.default_rng(6).standard_normal((1, n, E)))
    seen = {}

    def keep(name):
        return lambda t, hook: seen.__setitem__(name, to_host(t))

    hooks = [("hook_decay", lambda t, hook: tensor(np.tril(np.ones((1, H, n, n))))),
             ("hook_dt", keep("dt"))] + [(f"hook_{s}", keep(s)) for s in "qkvz"]
    with lay.hooks(hooks):
        lay(x)
    q, k, v = (np.swapaxes(seen[s], 1, 2) for s in "qkv")
    want = np.tril(q @ np.swapaxes(k * seen["dt"][..., None], -1, -2)) @ v
    assert_close(np.swapaxes(seen["z"], 1, 2), want, rtol=1e-10, atol=1e-13)


def test_identities_hold():
    rows = REGISTRY["ssd"].identities()
    assert len(rows) == 3
    for claim, value, limit in rows:
        assert value <= limit, (claim, value)


# ---- Mamba-2's grouped heads (share="bc") -----------------------------------------------------

@given(n=st.integers(1, 16), g=st.sampled_from([1, 2]), causal=st.booleans(),
       chunk=st.sampled_from([None, 3]), seed=st.integers(0, 999))
def test_share_bc_is_mamba2s_ngroups_c_and_b_per_group_x_per_head(n, g, causal, chunk, seed):
    """``share="bc"``: C (q) and B (k) have G group heads, X (v) has H heads; head h reads the
    C and B of group h // (H/G), as Mamba-2's ``ngroups``; Δ comes from the head's own X."""
    h = 4
    minitx.manual_seed(0)
    lay = REGISTRY["ssd"](h * D, h, causal=causal, num_kv_heads=g, share="bc",
                          chunk_size=chunk if causal else None).double()
    rng = np.random.default_rng(seed)
    c, b = (rng.standard_normal((2, g, n, D)) for _ in range(2))
    x = rng.standard_normal((2, h, n, D))
    got = lay.attend(*(tensor(a) for a in (c, b, x)))
    cr, br = (np.repeat(a, h // g, axis=1) for a in (c, b))             # group of each head
    dt, a = mamba_steps(lay, x)
    want = (products(a, causal) * (cr @ np.swapaxes(br * dt[..., None], -1, -2))) @ x
    assert_close(got, want, atol=1e-10, rtol=0)
    assert_close(got, to_host(lay.reference(*(tensor(a).data for a in (c, b, x)))), atol=1e-10,
                 rtol=0)


def test_the_two_layouts_agree_where_they_share_the_same_thing():
    """"bx" shares B and X, "bc" B and C: on inputs where C is the same across a group and X
    is too, the two compute the same SSM (max |Δ| ≤ 1e-12); their projections hold the same
    number of weights, split the other way round."""
    h, g, n = 4, 2, 9
    rng = np.random.default_rng(3)
    c, b, x = (rng.standard_normal((1, g, n, D)) for _ in range(3))
    rep = [np.repeat(a, h // g, axis=1) for a in (c, x)]
    layers = []
    for share in ("bx", "bc"):
        minitx.manual_seed(0)
        layers.append(REGISTRY["ssd"](h * D, h, causal=True, num_kv_heads=g,
                                      share=share).double())
    for name in ("dt_weight", "dt_bias", "A_log"):                    # the same SSM parameters
        getattr(layers[1], name).copy_(to_host(getattr(layers[0], name)))
    bx = to_host(layers[0].attend(tensor(rep[0]), tensor(b), tensor(x)))
    bc = to_host(layers[1].attend(tensor(c), tensor(b), tensor(rep[1])))
    assert np.abs(bx - bc).max() <= 1e-12
    # the layouts' projections: the same parameter count, split the other way round
    sizes = [{p: getattr(lay, f"{p}_proj").weight.shape[0] for p in "qkv"} for lay in layers]
    assert sizes == [{"q": h * D, "k": g * D, "v": g * D}, {"q": g * D, "k": g * D, "v": h * D}]


def test_share_bc_decodes_through_gpt_and_refuses_the_contracts_shapes():
    minitx.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=4, n_embd=E,
                          attention="ssd", position="none", num_kv_heads=2,
                          attention_options={"share": "bc", "chunk_size": 3})).double().eval()
    idx = np.random.default_rng(4).integers(0, 11, (2, 10))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    parts = [model(tensor(idx[:, :4], dtype=None), kv_caches=caches)[0]]
    parts += [model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0]
              for t in range(4, 10)]
    assert_close(np.concatenate([to_host(p) for p in parts], axis=1), full, atol=1e-10, rtol=0)
    lay = model.h[0].attn
    q, k, v = qkv(5, b=1, h=4, hkv=2, d=D // 2)              # the attention contract's shapes
    with pytest.raises(ValueError, match="share='bc'"):
        lay.attend(tensor(q), tensor(k), tensor(v))


@pytest.mark.parametrize("value", ["cb", "BC", 1, None])
def test_share_is_validated(value):
    with pytest.raises(ValueError, match="share") as info:
        REGISTRY["ssd"](E, H, share=value)
    assert str(value) in str(info.value)
