"""The Mamba-2 layer (``attention/mamba2.py``, the registry variant ``mamba2``, and the decoder
layer type ``mamba2`` of ``models/mixers/mamba2.py``): both equal the module docstring's
formulas written here in NumPy token by token (the projection split, a convolution loop, the
recurrence h_t = e^{Δ_t A} h_{t−1} + Δ_t B_t x_tᵀ, y_t = h_tᵀ C_t + D x_t, the grouped gated
RMSNorm) over a grid of sizes; ``attend`` equals the SSD's dense matrix built here from
explicit products of decays (causal and symmetric); decoding through the cache in any split
equals the full forward; float64 gradients of every input and parameter; the hooks see the
reference's own intermediates and may replace them; left padding leaves no trace; the counts
from the configuration equal the built layer's; bad options are named. The registry contract
runs in test_registry_contract.py; HF's ``NemotronHMamba2Mixer`` is the oracle in
tests/oracles/test_torch_parity_mamba2.py."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.mamba2 import GatedRMSNorm, Mamba2State
from minitx.models import Decoder, DecoderConfig, count_parameters
from minitx.models.decoder import kv_cache_bytes
from minitx.models.mixers import MIXERS
from minitx.validate import OptionError
from support import assert_close, qkv, tensor, to_host


def _softplus(x):
    return np.logaddexp(0, x)


def _silu(x):
    return x / (1 + np.exp(-x))


def reference(w, x, sizes, limit=(0.0, math.inf), eps=1e-5, lookahead=0, keep=None):
    """The module docstring's layer on host arrays, token by token. ``w``: HF's layout —
    ``in_proj`` (2HP + 2GN + H, E) with rows [z, x̃, B̃, C̃, δ] (and ``in_bias``), ``conv``
    (HP + 2GN, K), ``conv_bias``, ``dt_bias``, ``A_log``, ``D`` (H,), ``norm`` (HP,),
    ``out_proj`` (E, HP) (and ``out_bias``). Returns (output, {intermediates}); the state is
    kept as (N, P) per head. Causal only (``lookahead`` > 0: the centred taps, no state)."""
    h, p, n, g = sizes
    b, t, _ = x.shape
    if keep is not None:
        x = x * keep[:, :, None]
    proj = x @ w["in_proj"].T + w.get("in_bias", 0.0)
    z, u, dt = proj[..., :h * p], proj[..., h * p:2 * h * p + 2 * g * n], proj[..., -h:]
    kernel = w["conv"].shape[1]
    conv = np.zeros_like(u) + w.get("conv_bias", 0.0)
    for i in range(t):                                   # output i reads i − K + 1 + s + j
        for j in range(kernel):
            src = i - kernel + 1 + lookahead + j
            if 0 <= src < t:
                conv[:, i] += w["conv"][:, j] * u[:, src]
    act = _silu(conv)
    if keep is not None:
        act = act * keep[:, :, None]
    xs = act[..., :h * p].reshape(b, t, h, p)
    bs = act[..., h * p:h * p + g * n].reshape(b, t, g, n)
    cs = act[..., h * p + g * n:].reshape(b, t, g, n)
    delta = np.clip(_softplus(dt + w["dt_bias"]), limit[0], limit[1])         # (B, T, H)
    a = -np.exp(w["A_log"])
    y = np.zeros((b, t, h, p))
    state = np.zeros((b, h, n, p))
    for bi in range(b):
        for hi in range(h):
            gi = hi * g // h                                  # the head's group
            s = np.zeros((n, p))
            for i in range(t):
                s = np.exp(delta[bi, i, hi] * a[hi]) * s + \
                    delta[bi, i, hi] * np.outer(bs[bi, i, gi], xs[bi, i, hi])
                y[bi, i, hi] = s.T @ cs[bi, i, gi] + w["D"][hi] * xs[bi, i, hi]
            state[bi, hi] = s
    gated = (y.reshape(b, t, h * p) * _silu(z)).reshape(b, t, g, h * p // g)
    normed = gated / np.sqrt((gated ** 2).mean(-1, keepdims=True) + eps)
    o = normed.reshape(b, t, h * p) * w["norm"]
    out = o @ w["out_proj"].T + w.get("out_bias", 0.0)
    return out, {"conv": conv, "v": xs, "k": bs, "q": cs, "dt": delta.transpose(0, 2, 1),
                 "state": state, "y": y, "gate": z.reshape(b, t, h, p),
                 "z": o.reshape(b, t, h, p)}


# ---- the registry variant ------------------------------------------------------------------

def variant(e=8, h=2, seed=0, **options):
    """A float64 ``mamba2`` layer with every parameter redrawn (A_log near 0: decays that
    matter over a few tokens)."""
    minitx.manual_seed(seed)
    layer = REGISTRY["mamba2"](e, h, **options).double().eval()
    g = np.random.default_rng(seed + 1)
    for _, prm in layer.named_parameters():
        prm.copy_(g.standard_normal(prm.shape) * 0.5)
    return layer


def variant_weights(layer):
    """The variant's five input maps stacked as HF's ``in_proj`` [z, x̃, B̃, C̃, δ]: the
    reference reads one matrix, so this also checks that they are that matrix's row blocks."""
    p = {k: to_host(v.data) for k, v in layer.named_parameters()}
    maps = ("gate_linear", "v_proj", "k_proj", "q_proj", "dt_linear")
    w = {"in_proj": np.concatenate([p[f"{m}.weight"] for m in maps]),
         "conv": p["conv_weight"], "dt_bias": p["dt_bias"], "A_log": p["A_log"],
         "D": p["D"], "norm": p["norm.weight"], "out_proj": p["out_proj.weight"]}
    if "q_proj.bias" in p:
        w["in_bias"] = np.concatenate([p[f"{m}.bias"] for m in maps])
        w["out_bias"] = p["out_proj.bias"]
    if "conv_bias" in p:
        w["conv_bias"] = p["conv_bias"]
    return w


@settings(deadline=None, max_examples=25)
@given(heads=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2)]), p=st.sampled_from([1, 3]),
       n=st.sampled_from([1, 2, 5]), kernel=st.sampled_from([1, 2, 4]),
       chunk=st.sampled_from([None, 1, 3]), t=st.integers(1, 9), bias=st.booleans(),
       clamp=st.booleans())
def test_the_variant_is_its_formula(heads, p, n, kernel, chunk, t, bias, clamp):
    h, g = heads
    limit = (0.3, 0.9) if clamp else (0.0, math.inf)     # a clip that binds on some Δ
    layer = variant(h * p, h, state_size=n, n_groups=g, conv_kernel=kernel, causal=True,
                    chunk_size=chunk, bias=bias, conv_bias=bias, time_step_limit=limit,
                    norm_eps=0.01)
    x = np.random.default_rng(t).standard_normal((2, t, h * p))
    want, _ = reference(variant_weights(layer), x, (h, p, n, g), limit, eps=0.01)
    assert_close(layer(tensor(x)), want, rtol=1e-10, atol=1e-12)


def test_the_non_causal_variant_centres_its_taps_and_uses_the_symmetric_mask():
    """Non-causal: the convolution of the reference with lookahead ⌊(K − 1)/2⌋, and the SSM
    with L_ts = L_st — checked through ``attend`` against the dense form built here."""
    layer = variant(8, 2, state_size=3, conv_kernel=4, causal=False)
    x = np.random.default_rng(0).standard_normal((2, 7, 8))
    seen = {}
    for name in ("q", "k", "v", "dt"):
        getattr(layer, f"hook_{name}").add_hook(
            lambda a, hook, name=name: seen.__setitem__(name, a.numpy()))
    layer(tensor(x))
    _, mid = reference(variant_weights(layer), x, (2, 4, 3, 1), lookahead=1)
    for name in ("q", "k", "v", "dt"):             # the centred convolution's outputs, and Δ
        assert_close(seen[name], mid[name], rtol=1e-12, atol=1e-13)
    heads = [tensor(a.transpose(0, 2, 1, 3)) for a in (mid["q"], mid["k"], mid["v"])]
    got = layer.attend(*heads, dt=tensor(np.zeros((2, 2, 7))))
    c, b, v = (a.transpose(0, 2, 1, 3) for a in (mid["q"], mid["k"], mid["v"]))
    assert_close(got, dense_form(layer, c, b, v, np.zeros((2, 2, 7)), causal=False),
                 rtol=1e-11, atol=1e-12)


def dense_form(layer, c, b, x, dt, causal=True):
    """Y = M X + D X with M_ts = (C_t · B_s) Δ_s ∏_{r=s+1}^{t} a_r, a_r = e^{Δ_r A} (s ≤ t;
    symmetric M_ts = (C_t · B_s) Δ_s ∏_{r=min+1}^{max} a_r when not causal): every product
    taken term by term. c, b (B, G, T, N), x (B, Gx, T, P), dt δ (B, H, T)."""
    p = {k: to_host(v.data) for k, v in layer.named_parameters()}
    h = layer.num_heads
    c, b, x = (np.repeat(a, h // a.shape[1], axis=1) for a in (c, b, x))
    delta = np.clip(_softplus(dt + p["dt_bias"][:, None]), *layer.time_step_limit)
    decay = np.exp(delta * -np.exp(p["A_log"])[:, None])                   # a (B, H, T)
    t = x.shape[2]
    m = np.zeros((*x.shape[:2], t, t))
    for i in range(t):
        for s in range(t):
            if causal and s > i:
                continue
            lo, hi = min(i, s), max(i, s)
            prod = np.prod(decay[..., lo + 1:hi + 1], axis=-1)
            m[..., i, s] = (c[..., i, :] * b[..., s, :]).sum(-1) * delta[..., s] * prod
    return m @ x + p["D"][:, None, None] * x


@settings(deadline=None, max_examples=20)
@given(heads=st.sampled_from([((2, 2, 2), 2), ((1, 1, 2), 2), ((2, 1, 1), 2), ((1, 2, 4), 4)]),
       n=st.sampled_from([1, 4]), t=st.integers(1, 12), chunk=st.sampled_from([None, 1, 5]),
       causal=st.booleans(), seed=st.integers(0, 99))
def test_attend_equals_the_dense_matrix_form(heads, n, t, chunk, causal, seed):
    """``attend`` (C = q, B = k, X = v, each head count dividing H) and ``reference`` both
    equal the dense form built from explicit products here."""
    (gq, gk, gv), h = heads
    layer = variant(4 * h, h, state_size=n, causal=causal,
                    chunk_size=chunk if causal else None)
    rng = np.random.default_rng(seed)
    c, b = rng.standard_normal((2, gq, t, n)), rng.standard_normal((2, gk, t, n))
    x, dt = rng.standard_normal((2, gv, t, 4)), rng.standard_normal((2, h, t))
    want = dense_form(layer, c, b, x, dt, causal)
    got = layer.attend(tensor(c), tensor(b), tensor(x), dt=tensor(dt))
    assert_close(got, want, rtol=1e-10, atol=1e-12)
    raw = layer.reference(*(tensor(a).data for a in (c, b, x, dt)))
    assert_close(to_host(raw), want, rtol=1e-10, atol=1e-12)


def test_gradients_of_every_input_and_parameter():
    layer = variant(6, 2, state_size=2, conv_kernel=3, causal=True, chunk_size=2,
                    time_step_limit=(0.2, 1.5))
    rng = np.random.default_rng(0)
    x = tensor(rng.standard_normal((2, 5, 6)) * 0.7, requires_grad=True)
    minitx.gradcheck(layer, (x,))
    # every parameter, element by element (central differences of the whole layer)
    params = [prm for _, prm in layer.named_parameters()]
    assert len(params) == 18               # six maps with biases, the conv's two, b, A, D, g
    minitx.gradcheck(lambda *ps: layer(tensor(x.numpy())), tuple(params))
    # attend: C, B, X and δ, in Mamba-2's grouped layout and non-causal too
    c, b = (tensor(rng.standard_normal((1, 1, 7, 2)), requires_grad=True) for _ in range(2))
    v = tensor(rng.standard_normal((1, 2, 7, 3)), requires_grad=True)
    dt = tensor(rng.standard_normal((1, 2, 7)), requires_grad=True)
    minitx.gradcheck(lambda *a: layer.attend(*a[:3], dt=a[3]), (c, b, v, dt))
    layer.causal, layer.chunk_size = False, None
    minitx.gradcheck(lambda *a: layer.attend(*a[:3], dt=a[3]), (c, b, v, dt))


def _split_points(t):
    """Lengths that add up to t: a prompt, then steps and chunks."""
    return st.lists(st.integers(1, t), min_size=1, max_size=6).map(
        lambda parts: _fit(parts, t))


def _fit(parts, t):
    out, left = [], t
    for part in parts:
        if left == 0:
            break
        out.append(min(part, left))
        left -= out[-1]
    return out + ([left] if left else [])


@settings(deadline=None, max_examples=30)
@given(data=st.data(), t=st.integers(1, 11), heads=st.sampled_from([(2, 1), (4, 2), (3, 3)]),
       kernel=st.sampled_from([1, 2, 4]), chunk=st.sampled_from([None, 1, 3]))
def test_decoding_in_any_split_equals_the_full_forward(data, t, heads, kernel, chunk):
    h, g = heads
    layer = variant(2 * h, h, state_size=3, n_groups=g, conv_kernel=kernel, causal=True,
                    chunk_size=chunk)
    parts = data.draw(_split_points(t))
    x = np.random.default_rng(t).standard_normal((2, t, 2 * h))
    full = layer(tensor(x)).numpy()
    cache, outs, start = layer.new_cache(), [], 0
    for part in parts:
        outs.append(layer(tensor(x[:, start:start + part]), kv_cache=cache).numpy())
        start += part
    assert_close(np.concatenate(outs, axis=1), full, rtol=1e-11, atol=1e-12)
    assert len(cache) == t and isinstance(cache, Mamba2State)
    _, mid = reference(variant_weights(layer), x, (h, 2, 3, g), eps=1e-5)
    assert_close(cache.state, mid["state"], rtol=1e-11, atol=1e-12)      # (B, H, N, P)
    assert cache.conv.shape == (2, kernel - 1, 2 * h + 2 * g * 3)
    assert cache.nbytes == 8 * 2 * ((kernel - 1) * (2 * h + 6 * g) + h * 3 * 2)


def test_the_hooks_see_the_references_intermediates_and_may_replace_them():
    layer = variant(8, 2, state_size=3, n_groups=2, conv_kernel=3, causal=True,
                    time_step_limit=(0.7, math.inf))
    x = np.random.default_rng(1).standard_normal((2, 6, 8))
    want, mid = reference(variant_weights(layer), x, (2, 4, 3, 2), (0.7, math.inf))
    seen = {}
    names = ("conv", "q", "k", "v", "dt", "state", "y", "gate", "z")
    for name in names:
        getattr(layer, f"hook_{name}").add_hook(
            lambda a, hook, name=name: seen.__setitem__(name, a.numpy()))
    assert_close(layer(tensor(x)), want, rtol=1e-10, atol=1e-12)
    for name in names:
        assert_close(seen[name], mid[name], rtol=1e-10, atol=1e-12, err_msg=name)
    assert np.any(seen["dt"] == 0.7) and np.all(seen["dt"] >= 0.7)      # the clip binds
    # replacing X by zeros: y = 0, the gated norm of 0 is 0, the output out_proj's bias
    fresh = variant(8, 2, state_size=3, n_groups=2, conv_kernel=3, causal=True)
    fresh.hook_v.add_hook(lambda a, hook: a * 0.0)
    bias = to_host(fresh.out_proj.bias.data)
    assert_close(fresh(tensor(x)), np.broadcast_to(bias, (2, 6, 8)), atol=1e-15)
    # replacing Δ: the reference with that Δ (a clip range pinning it to 0.5 everywhere)
    pinned = variant(8, 2, state_size=3, n_groups=2, conv_kernel=3, causal=True)
    pinned.hook_dt.add_hook(lambda a, hook: a * 0.0 + 0.5)
    want, _ = reference(variant_weights(pinned), x, (2, 4, 3, 2), (0.5, 0.5))
    assert_close(pinned(tensor(x)), want, rtol=1e-10, atol=1e-12)


def test_the_hook_on_the_decay_matrix_sees_the_products_of_decays():
    layer = variant(8, 2, state_size=3, causal=True, chunk_size=2)
    seen = {}
    layer.hook_decay.add_hook(lambda a, hook: seen.__setitem__("L", a.numpy()))
    layer.hook_pattern.add_hook(lambda a, hook: seen.__setitem__("M", a.numpy()))
    c, b, v = qkv(6, b=1, h=2, d=3, seed=2)
    dt = np.random.default_rng(3).standard_normal((1, 2, 6))
    layer.attend(tensor(c), tensor(b), tensor(v[..., :3]), dt=tensor(dt))
    p = {k: to_host(t.data) for k, t in layer.named_parameters()}
    delta = _softplus(dt + p["dt_bias"][:, None])
    a = np.exp(-delta * np.exp(p["A_log"])[:, None])
    want = np.zeros((1, 2, 6, 6))
    for i in range(6):
        for s in range(i + 1):
            want[..., i, s] = np.prod(a[..., s + 1:i + 1], axis=-1)
    assert seen["L"].shape == (1, 2, 6, 6)                 # one chunk while a hook is set
    assert_close(seen["L"], want, rtol=1e-12, atol=1e-15)
    assert_close(seen["M"], want * (c @ b.swapaxes(-1, -2)) * delta[..., None, :],
                 rtol=1e-11, atol=1e-14)


def test_bad_options_and_inputs_are_named():
    make = REGISTRY["mamba2"]
    with pytest.raises(OptionError, match=r"n_groups \(3\)"):
        make(8, 2, n_groups=3)
    with pytest.raises(OptionError, match="n_groups .* and num_kv_heads .* give one"):
        make(8, 2, n_groups=1, num_kv_heads=2)
    assert make(8, 2, num_kv_heads=2).n_groups == 2          # the contract's name for G
    with pytest.raises(OptionError, match=r"time_step_limit\[1\] must be .*> 0.5"):
        make(8, 2, time_step_limit=(0.5, 0.1))
    with pytest.raises(OptionError, match="time_step_limit must be a pair"):
        make(8, 2, time_step_limit=0.1)
    with pytest.raises(OptionError, match="norm_eps must be a positive finite number, got 0"):
        make(8, 2, norm_eps=0)
    with pytest.raises(OptionError, match="state_size must be a positive int, got 0"):
        make(8, 2, state_size=0)
    with pytest.raises(OptionError, match="conv_kernel must be a positive int, got 2.5"):
        make(8, 2, conv_kernel=2.5)
    layer = make(8, 2, causal=False)
    with pytest.raises(ValueError, match="decoding with a state needs causal=True"):
        layer(tensor(np.zeros((1, 3, 8))), kv_cache=layer.new_cache())
    causal = make(8, 2, causal=True)
    with pytest.raises(TypeError, match="kv_cache must be a Mamba2State"):
        causal(tensor(np.zeros((1, 3, 8))), kv_cache=minitx.attention.KVCache())
    with pytest.raises(ValueError, match="does not take an attn_mask"):
        causal(tensor(np.zeros((1, 3, 8))), attn_mask=np.ones((3, 3), dtype=bool))
    q = tensor(np.zeros((1, 2, 5, 4)))
    with pytest.raises(ValueError, match="v must be .*dividing H = 2"):
        causal.attend(q, q, tensor(np.zeros((1, 3, 5, 4))))
    with pytest.raises(ValueError, match="share the state size N_s, got 4 and 3"):
        causal.attend(q, tensor(np.zeros((1, 2, 5, 3))), q)
    with pytest.raises(ValueError, match=r"dt must be \(B, H, N\) = \(1, 2, 5\)"):
        causal.attend(q, q, q, dt=tensor(np.zeros((1, 5, 2))))
    with pytest.raises(OptionError, match=r"channels \(6\) must be divisible by groups"):
        GatedRMSNorm(6, 4)


# ---- the decoder layer type ------------------------------------------------------------------

SIZES = dict(vocab_size=31, hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4,
             norm_eps=0.05)


def _config(h=4, p=3, n=5, g=2, kernel=3, chunk=4, bias=False, conv_bias=True,
            limit=(0.0, math.inf), layers=("mamba2", "full")):
    return DecoderConfig(num_layers=len(layers), layer_types=layers, **SIZES, mixer_options={
        "mamba2": dict(num_heads=h, head_dim=p, state_size=n, n_groups=g, conv_kernel=kernel,
                       chunk_size=chunk, bias=bias, conv_bias=conv_bias,
                       time_step_limit=limit)})


def mixer(config, seed=0):
    """The layer type built from ``config``, float64, every parameter redrawn."""
    layer = MIXERS["mamba2"](config, 0).to(dtype="float64")
    g = np.random.default_rng(seed)
    for _, prm in layer.named_parameters():
        prm.copy_(g.standard_normal(prm.shape) * 0.5)
    return layer


def mixer_weights(layer):
    p = {k: to_host(v.data) for k, v in layer.named_parameters()}
    w = {"in_proj": p["in_proj.weight"], "conv": p["conv1d.weight"][:, 0], "dt_bias":
         p["dt_bias"], "A_log": p["A_log"], "D": p["D"], "norm": p["norm.weight"],
         "out_proj": p["out_proj.weight"]}
    for mine, theirs in (("in_bias", "in_proj.bias"), ("out_bias", "out_proj.bias"),
                         ("conv_bias", "conv1d.bias")):
        if theirs in p:
            w[mine] = p[theirs]
    return w


@settings(deadline=None, max_examples=20)
@given(heads=st.sampled_from([(1, 1), (4, 1), (4, 2), (6, 3)]), p=st.sampled_from([1, 3]),
       n=st.sampled_from([1, 5]), kernel=st.sampled_from([1, 4]), chunk=st.sampled_from([1, 3, 64]),
       t=st.integers(1, 9), bias=st.booleans(), clamp=st.booleans())
def test_the_layer_type_is_its_formula(heads, p, n, kernel, chunk, t, bias, clamp):
    h, g = heads
    limit = (0.3, 0.9) if clamp else (0.0, math.inf)
    config = _config(h, p, n, g, kernel, chunk, bias, bias, limit)
    layer = mixer(config)
    x = np.random.default_rng(t).standard_normal((2, t, 16))
    want, _ = reference(mixer_weights(layer), x, (h, p, n, g), limit, eps=0.05)
    assert_close(layer(tensor(x)), want, rtol=1e-10, atol=1e-12)


def test_the_layer_type_zeroes_padding_and_left_padding_leaves_no_trace():
    layer = mixer(_config(bias=False))
    x = np.random.default_rng(3).standard_normal((2, 7, 16))
    keep = np.ones((2, 7), dtype=bool)
    keep[0, :3] = keep[1, 4] = False
    from minitx.backend import xp
    got = layer(tensor(x), keep=xp().asarray(keep))
    want, _ = reference(mixer_weights(layer), x, (4, 3, 5, 2), eps=0.05,
                        keep=keep.astype(float))
    assert_close(got, want, rtol=1e-10, atol=1e-12)
    # row 0's four real tokens see what they would see with no padding before them
    alone = layer(tensor(x[:1, 3:])).numpy()
    assert_close(got.numpy()[:1, 3:], alone, rtol=1e-10, atol=1e-12)


def test_the_layer_type_has_its_gradients():
    layer = mixer(_config(h=2, p=2, n=2, g=1, kernel=3, chunk=2, bias=True,
                          limit=(0.2, math.inf)))
    x = tensor(np.random.default_rng(4).standard_normal((2, 5, 16)) * 0.5, requires_grad=True)
    minitx.gradcheck(lambda t: layer(t), (x,))
    params = [prm for _, prm in layer.named_parameters()]
    assert len(params) == 10
    minitx.gradcheck(lambda *ps: layer(tensor(x.numpy())), tuple(params))


@settings(deadline=None, max_examples=15)
@given(data=st.data(), t=st.integers(1, 10), chunk=st.sampled_from([1, 3, 64]),
       kernel=st.sampled_from([1, 3]))
def test_the_layer_type_decodes_in_any_split_as_the_full_forward(data, t, chunk, kernel):
    layer = mixer(_config(chunk=chunk, kernel=kernel, bias=True))
    parts = data.draw(_split_points(t))
    x = np.random.default_rng(t).standard_normal((2, t, 16))
    full = layer(tensor(x)).numpy()
    cache, outs, start = layer.new_cache(), [], 0
    for part in parts:
        outs.append(layer(tensor(x[:, start:start + part]), kv_cache=cache).numpy())
        start += part
    assert_close(np.concatenate(outs, axis=1), full, rtol=1e-11, atol=1e-12)
    assert len(cache) == t


@settings(deadline=None, max_examples=15)
@given(h=st.sampled_from([2, 4]), p=st.integers(1, 4), n=st.integers(1, 6),
       g=st.sampled_from([1, 2]), kernel=st.integers(1, 5), bias=st.booleans(),
       conv_bias=st.booleans(), tokens=st.integers(0, 40))
def test_the_counts_from_the_configuration_equal_the_built_layer(h, p, n, g, kernel, bias,
                                                                 conv_bias, tokens):
    config = _config(h, p, n, g, kernel, 4, bias, conv_bias, layers=("mamba2",))
    layer = MIXERS["mamba2"](config, 0).to(dtype="float64")
    built = sum(int(np.prod(prm.shape)) for _, prm in layer.named_parameters())
    assert MIXERS["mamba2"].parameter_count(config) == built
    model = Decoder(config)
    assert count_parameters(config)["total"] == sum(
        int(np.prod(prm.shape)) for _, prm in model.named_parameters())
    cache = layer.new_cache()
    if tokens:
        layer(tensor(np.zeros((1, tokens, 16))), kv_cache=cache)
    assert kv_cache_bytes(config, tokens, bytes_per_number=8) == cache.nbytes


def test_the_layer_types_bad_options_are_named():
    for options, pattern in (({"n_grups": 2}, "unknown option 'n_grups'; did you mean "
                              "'n_groups'"),
                             ({"n_groups": 3}, r"num_heads \(4\) must be a multiple of "
                              r"n_groups \(3\)"),
                             ({"state_size": 0}, "state_size must be a positive int, got 0"),
                             ({"conv_bias": "yes"}, "conv_bias"),
                             ({"time_step_limit": (-1, 1)}, r"time_step_limit\[0\]"),
                             ({"norm_eps": -1.0}, "norm_eps")):
        config = DecoderConfig(**SIZES, num_layers=1, layer_types=("mamba2",),
                               mixer_options={"mamba2": options})
        with pytest.raises(OptionError, match=pattern):
            MIXERS["mamba2"](config, 0)
    layer = mixer(_config())
    with pytest.raises(TypeError, match="kv_cache must be a Mamba2State"):
        layer(tensor(np.zeros((1, 2, 16))), kv_cache=[])


def test_a_hybrid_decoder_decodes_through_its_mamba2_layers_as_its_full_forward():
    """Mamba-2 layers among attention layers (Nemotron-H's pattern): the decoder's caches,
    a prompt then one token at a time, equal its full forward."""
    config = _config(layers=("mamba2", "full", "mamba2"), chunk=3, bias=True)
    model = Decoder(config).to(dtype="float64")
    g = np.random.default_rng(7)
    for _, prm in model.named_parameters():
        prm.copy_(g.standard_normal(prm.shape) * 0.4)
    ids = np.random.default_rng(8).integers(0, 31, (2, 10))
    full = model(ids).numpy()
    caches = model.new_caches()
    assert isinstance(caches[0], Mamba2State) and isinstance(caches[2], Mamba2State)
    steps = [model(ids[:, :4], kv_caches=caches).numpy()]
    steps += [model(ids[:, t:t + 1], kv_caches=caches).numpy() for t in range(4, 10)]
    assert_close(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    per_row = MIXERS["mamba2"].state_numbers(config, 10) * 8           # float64 numbers
    assert caches[0].nbytes == caches[2].nbytes == 2 * per_row and len(caches[0]) == 10
