"""Softmax attention with a gate: gated attention (an output gate, Qiu et al. 2025) and
forgetting attention (FoX, a forget-gate bias on the scores, Lin et al. 2025).

Each layer equals a NumPy formula written here (loops over query and key positions for FoX's
bias), over hypothesis grids of sizes; float64 gradients of the whole layer, the gate and the
forget gate included (the registry contract checks ``attend`` alone); decoding through GPT's
caches equals the full forward; the hooks see what the formulas say; bad options are named.
FoX's fused op (by blocks of query rows) equals its composed form, outputs and gradients, and
holds no N × N array."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx import functional as F
from minitx.attention import REGISTRY, ForgetCache, KVCache, forgetting_attention
from minitx.models.gpt import GPT, GPTConfig
from minitx.validate import OptionError
from support import assert_close, params_to_float64, peak_bytes, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def build(name, causal=True, **options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY[name](E, H, causal=causal, **options)).eval()


def weights(layer, names):
    """{name: (W, b)} of the projections (q, k, v, out) and the gate maps (gate, forget)."""
    maps = {n: getattr(layer, f"{n}_linear" if n in ("gate", "forget") else f"{n}_proj")
            for n in names}
    return {n: (to_host(m.weight.data), to_host(m.bias.data)) for n, m in maps.items()}


def heads(x, w, b, h):
    """(B, N, E) @ Wᵀ + b → (B, h, N, ·)."""
    y = x @ w.T + b
    return y.reshape(*x.shape[:2], h, -1).transpose(0, 2, 1, 3)


def softmax_attention(q, k, v, bias=None, causal=True):
    """softmax(q kᵀ/√D + bias) v on host arrays, causal: keys after the query left out."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if causal:
        s = np.where(np.tri(q.shape[2], dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ---- gated attention -----------------------------------------------------------------------

def numpy_gated(layer, x):
    w = weights(layer, ("q", "k", "v", "out", "gate"))
    hkv = layer.num_kv_heads
    z = softmax_attention(heads(x, *w["q"], H), heads(x, *w["k"], hkv), heads(x, *w["v"], hkv),
                          causal=layer.causal)                           # (B, H, N, D)
    g = sigmoid(heads(x, *w["gate"], H))                                 # (B, H, N, D or 1)
    y = (z * g).transpose(0, 2, 1, 3).reshape(*x.shape)
    return y @ w["out"][0].T + w["out"][1]


@settings(deadline=None, max_examples=12)
@given(n=st.integers(1, 17), gate=st.sampled_from(["elementwise", "headwise"]),
       causal=st.booleans(), hkv=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_gated_equals_its_numpy_formula(n, gate, causal, hkv, seed):
    layer = build("gated", causal=causal, gate=gate, num_kv_heads=hkv)
    x = np.random.default_rng(seed).standard_normal((2, n, E))
    assert_close(layer(tensor(x)), numpy_gated(layer, x), atol=1e-12, rtol=0)


def test_the_gate_has_the_shape_its_option_names():
    assert build("gated").gate_linear.weight.shape == (E, E)                  # one per channel
    assert build("gated", gate="headwise").gate_linear.weight.shape == (H, E)  # one per head


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_of_the_gated_layer(gate, causal):
    """The gate's own gradient: x and the gate projection's weights, through the layer."""
    layer = build("gated", causal=causal, gate=gate)
    x = tensor(np.random.default_rng(1).standard_normal((1, 5, E)), requires_grad=True)
    layer.gate_linear.weight.requires_grad = True
    minitx.gradcheck(lambda a, w: layer(a), (x, layer.gate_linear.weight))


def test_gradcheck_of_attend_with_a_gate():
    layer = build("gated")
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(6, b=1, seed=2, scale=0.7))
    g = tensor(np.random.default_rng(3).uniform(0.05, 1.0, (1, H, 6, D)), requires_grad=True)
    minitx.gradcheck(lambda *a: layer.attend(*a[:3], gate=a[3]), (q, k, v, g))


@pytest.mark.parametrize("value", ["channel", "", None, 1, True])
def test_the_gate_option_is_validated(value):
    with pytest.raises(OptionError, match="gate") as info:
        REGISTRY["gated"](E, H, gate=value)
    assert repr(value) in str(info.value)


def test_gated_hooks_tie_gate_ungated_and_output():
    layer = build("gated")
    x = np.random.default_rng(4).standard_normal((2, 6, E))
    seen = {}
    with layer.hooks([(lambda n: True, lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        out = layer(tensor(x))
    w = weights(layer, ("gate",))
    gate = sigmoid(x @ w["gate"][0].T + w["gate"][1]).reshape(2, 6, H, D)
    assert_close(seen["hook_gate"], gate, atol=1e-14)
    assert_close(seen["hook_z"], seen["hook_ungated"] * gate, atol=1e-14)
    assert seen["hook_pattern"].shape == (2, H, 6, 6)
    assert_close(out, layer(tensor(x)), atol=1e-14)    # the composed (hooked) path, same values


def test_replacing_the_gate_by_ones_leaves_softmax_attention():
    layer = build("gated")
    x = np.random.default_rng(5).standard_normal((1, 7, E))
    with layer.hooks([("hook_gate", lambda t, hook: t * 0.0 + 1.0)]):
        out = layer(tensor(x))
    w = weights(layer, ("q", "k", "v", "out"))
    z = softmax_attention(*(heads(x, *w[n], H) for n in "qkv"))
    want = z.transpose(0, 2, 1, 3).reshape(1, 7, E) @ w["out"][0].T + w["out"][1]
    assert_close(out, want, atol=1e-12)


# ---- forgetting attention ------------------------------------------------------------------

def loop_bias(log_f):
    """D_ij = Σ_{l=j+1}^{i} log f_l, summed over l for each (i, j ≤ i), 0 above the diagonal."""
    b, h, n = log_f.shape
    bias = np.zeros((b, h, n, n))
    for i in range(n):
        for j in range(i + 1):
            bias[:, :, i, j] = log_f[:, :, j + 1:i + 1].sum(-1)
    return bias


def numpy_fox(layer, x):
    w = weights(layer, ("q", "k", "v", "out", "forget"))
    hkv = layer.num_kv_heads
    log_f = np.log(sigmoid(x @ w["forget"][0].T + w["forget"][1])).transpose(0, 2, 1)
    o = softmax_attention(heads(x, *w["q"], H), heads(x, *w["k"], hkv),
                          heads(x, *w["v"], hkv), bias=loop_bias(log_f))
    return o.transpose(0, 2, 1, 3).reshape(*x.shape) @ w["out"][0].T + w["out"][1]


@settings(deadline=None, max_examples=12)
@given(n=st.integers(1, 17), hkv=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_fox_equals_its_numpy_formula(n, hkv, seed):
    layer = build("fox", num_kv_heads=hkv)
    x = np.random.default_rng(seed).standard_normal((2, n, E))
    assert_close(layer(tensor(x)), numpy_fox(layer, x), atol=1e-12, rtol=0)


def test_fox_with_gates_of_one_is_causal_softmax_attention():
    layer = build("fox")
    q, k, v = qkv(9, seed=6)
    out = layer.attend(*(tensor(a) for a in (q, k, v)), log_forget=tensor(np.zeros((2, H, 9))))
    assert_close(out, softmax_attention(q, k, v), atol=1e-13)


def test_a_constant_forget_gate_is_a_linear_distance_bias():
    """log f_t = log γ at every t: D_ij = (i − j) log γ (ALiBi's bias with slope −log γ)."""
    layer = build("fox")
    q, k, v = qkv(8, seed=7)
    gamma = 0.8
    out = layer.attend(*(tensor(a) for a in (q, k, v)),
                       log_forget=tensor(np.full((2, H, 8), math.log(gamma))))
    dist = np.arange(8)[:, None] - np.arange(8)[None, :]
    assert_close(out, softmax_attention(q, k, v, bias=dist * math.log(gamma)), atol=1e-13)


def test_non_causal_fox_uses_the_gates_between_either_way():
    layer = build("fox", causal=False)
    q, k, v = qkv(7, seed=8)
    log_f = -np.random.default_rng(9).uniform(0, 1, (2, H, 7))
    out = layer.attend(*(tensor(a) for a in (q, k, v)), log_forget=tensor(log_f))
    low = loop_bias(log_f)
    assert_close(out, softmax_attention(q, k, v, bias=low + low.swapaxes(-1, -2),
                                        causal=False), atol=1e-13)


def test_gradcheck_of_attend_with_forget_gates():
    layer = build("fox")
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(7, b=1, seed=10, scale=0.7))
    lf = tensor(-np.random.default_rng(11).uniform(0.05, 2.0, (1, H, 7)), requires_grad=True)
    minitx.gradcheck(lambda *a: layer.attend(*a[:3], log_forget=a[3]), (q, k, v, lf))


def test_gradcheck_of_the_fox_layer():
    layer = build("fox")
    x = tensor(np.random.default_rng(12).standard_normal((1, 6, E)), requires_grad=True)
    layer.forget_linear.weight.requires_grad = True
    minitx.gradcheck(lambda a, w: layer(a), (x, layer.forget_linear.weight))


def test_fox_refuses_what_it_cannot_take():
    layer = build("fox")
    q, k, v = (tensor(a) for a in qkv(5))
    with pytest.raises(ValueError, match="log_forget"):
        layer.attend(q, k, v, log_forget=tensor(np.zeros((2, H, 4))))
    x = tensor(np.zeros((1, 3, E)))
    with pytest.raises(TypeError, match="ForgetCache"):
        layer(x, kv_cache=KVCache())
    with pytest.raises(ValueError, match="attn_mask"):
        layer(x, attn_mask=np.ones((3, 3), dtype=bool))


def test_the_forget_cache_keeps_the_cumulative_log_gates():
    layer = build("fox")
    x = np.random.default_rng(13).standard_normal((1, 7, E))
    cache = layer.new_cache()
    assert isinstance(cache, ForgetCache)
    layer(tensor(x[:, :4]), kv_cache=cache)
    layer(tensor(x[:, 4:]), kv_cache=cache)
    w = weights(layer, ("forget",))
    log_f = np.log(sigmoid(x @ w["forget"][0].T + w["forget"][1])).transpose(0, 2, 1)
    assert len(cache) == 7
    assert_close(cache.cumulative, np.cumsum(log_f, -1), atol=1e-13)


def test_fox_hooks_see_forget_gates_and_bias():
    layer = build("fox")
    x = np.random.default_rng(14).standard_normal((2, 6, E))
    seen = {}
    with layer.hooks([(lambda n: True, lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        layer(tensor(x))
    w = weights(layer, ("forget",))
    log_f = np.log(sigmoid(x @ w["forget"][0].T + w["forget"][1])).transpose(0, 2, 1)
    assert_close(seen["hook_forget"], log_f, atol=1e-13)
    tril = np.tri(6, dtype=bool)
    assert_close(seen["hook_bias"][..., tril], loop_bias(log_f)[..., tril], atol=1e-13)
    assert_close(seen["hook_pattern"].sum(-1), np.ones((2, H, 6)), atol=1e-13)


def test_replacing_the_forget_gates_by_zero_logs_gives_softmax_attention():
    layer = build("fox")
    x = np.random.default_rng(15).standard_normal((1, 7, E))
    seen = {}
    hooks = [("hook_forget", lambda t, hook: t * 0.0)] + \
        [(f"hook_{s}", lambda t, hook, s=s: seen.__setitem__(s, to_host(t))) for s in "qkvz"]
    with layer.hooks(hooks):
        layer(tensor(x))
    q, k, v, z = (np.swapaxes(seen[s], 1, 2) for s in "qkvz")
    assert_close(z, softmax_attention(q, k, v), atol=1e-13)


# ---- forgetting attention by blocks of query rows ------------------------------------------

def fused_and_composed(q, k, v, log_f, upstream, block, causal, hkv):
    """[output, dq, dk, dv, d log f] of the fused op (by blocks of ``block`` rows) and of the
    composed form (bias, scores, softmax op by op), both from the same float64 inputs."""
    layer = build("fox", causal=causal, num_kv_heads=hkv)
    results = []
    for fused in (True, False):
        t = [tensor(a, requires_grad=True) for a in (q, k, v, log_f)]
        cum = F.cumsum(t[3], axis=-1)
        out = (forgetting_attention(*t[:3], cum, causal=causal, scale=layer.scale, block=block)
               if fused else layer.composed(*t[:3], cum))
        out.backward(tensor(upstream))
        results.append([to_host(out)] + [to_host(a.grad) for a in t])
    return results


@settings(deadline=None, max_examples=25)
@given(nk=st.integers(1, 19), drop=st.integers(0, 5), block=st.integers(1, 7),
       hkv=st.sampled_from([1, 2]), causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_blocked_fox_equals_the_composed_form(nk, drop, block, hkv, causal, seed):
    """Outputs and the gradients of q, k, v and log f, on sizes where N is rarely a multiple
    of the block, with grouped heads and with fewer queries than keys (the last Nq)."""
    nq = max(1, nk - drop)
    g = np.random.default_rng(seed)
    q, k, v = qkv(nq, nk, hkv=hkv, rng=g)
    log_f = -g.uniform(0.0, 2.0, (2, H, nk))
    upstream = g.standard_normal((2, H, nq, D))
    fused, composed = fused_and_composed(q, k, v, log_f, upstream, block, causal, hkv)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dlog_f"), fused, composed):
        assert_close(a, b, atol=1e-12, rtol=0, err_msg=name)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_of_blocked_fox(causal):
    """float64 central differences through q, k, v and c: 7 keys, the last 5 as queries, in
    blocks of 2 rows (the last block holds one), grouped heads."""
    g = np.random.default_rng(21)
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(5, 7, b=1, hkv=1, rng=g, scale=0.7))
    # c strictly decreasing, as a cumulative sum of log gates < 0 is; in the symmetric bias
    # no two c are equal, so |c_i − c_j| is differentiable at every pair i ≠ j
    cum = tensor(np.cumsum(-g.uniform(0.1, 1.5, (1, H, 7)), axis=-1), requires_grad=True)
    minitx.gradcheck(lambda a, b, c, d: forgetting_attention(a, b, c, d, causal=causal,
                                                             block=2), (q, k, v, cum))


def test_blocked_fox_keeps_no_n_by_n_array():
    """N = 1,024, one head, D = 4, float64: the layer's forward + backward by blocks holds
    less than one N × N array (8 MiB); the composed form (a hook on the pattern set) holds
    several."""
    n = 1024
    layer = REGISTRY["fox"](4, 1, causal=True).to(dtype="float64")
    x = np.random.default_rng(22).standard_normal((1, n, 4))

    def run():
        layer(tensor(x, requires_grad=True)).sum().backward()

    blocked = peak_bytes(run)
    assert blocked < n * n * 8, blocked
    with layer.hooks([("hook_pattern", lambda t, hook: None)]):
        composed = peak_bytes(run)
    assert composed > 2 * n * n * 8, composed


def test_blocked_fox_refuses_what_it_cannot_take():
    q, k, v = (tensor(a) for a in qkv(4, 6))
    cum = tensor(np.zeros((2, H, 6)))
    with pytest.raises(ValueError, match=r"cum must be \(B, H, Nk\) = \(2, 2, 6\), got"):
        forgetting_attention(q, k, v, tensor(np.zeros((2, H, 4))))
    with pytest.raises(ValueError, match="Nq ≤ Nk; got Nq = 6, Nk = 4"):
        forgetting_attention(k, q, q, tensor(np.zeros((2, H, 4))))
    with pytest.raises(OptionError, match="block"):
        forgetting_attention(q, k, v, cum, block=0)
    with pytest.raises(ValueError, match="Nq ≤ Nk"):
        build("fox").attend(k, q, q, log_forget=tensor(np.zeros((2, H, 4))))


# ---- decoding through GPT: the caches of both ------------------------------------------------

def gpt(attention, **options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention=attention, attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("attention,options,cache_type", [
    ("gated", {}, KVCache), ("gated", {"gate": "headwise"}, KVCache), ("fox", {}, ForgetCache)])
def test_prefill_then_token_by_token_equals_the_full_forward(attention, options, cache_type):
    model = gpt(attention, **options)
    idx = np.random.default_rng(16).integers(0, 11, (2, 13))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    assert all(type(c) is cache_type for c in caches)
    parts = [model(tensor(idx[:, :5], dtype=None), kv_caches=caches)[0]]
    for t in range(5, 13):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["gated", "fox"])
def test_identities_hold(name):
    rows = REGISTRY[name].identities()
    assert len(rows) >= 2
    for claim, value, limit in rows:
        assert limit <= 1e-6 and value <= limit, (claim, value)
