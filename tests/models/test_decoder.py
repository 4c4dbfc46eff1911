"""The decoder of today's families (``minitx.models.decoder``) and its blocks
(``nn/decoder_layers.py``, ``nn/rotary.py``, ``attention/kv_cache.py``'s ``WindowKVCache``):
each block against its formula written out in NumPy, float64 gradient checks, every switch
combination causal and decoding through its caches as the full forward does, and bad options
refused by name. Equality with HuggingFace's models is
``tests/oracles/test_pretrained_decoders.py``.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import ChunkKVCache, KVCache, SharedKVCache, WindowKVCache
from minitx.models import Decoder, DecoderConfig, count_parameters
from minitx.nn.decoder_layers import DecoderRMSNorm, DenseMLP, GatedMLP, softcap
from minitx.nn.rotary import Rotary, apply_rotary, rope_frequencies
from support import assert_close, tensor, to_host, need

SWITCHES = dict(
    norm=st.sampled_from(["rmsnorm", "layernorm"]),
    mlp=st.sampled_from(["gelu", "relu2", "swiglu", "geglu"]),
    norm_placement=st.sampled_from(["pre", "post", "sandwich"]),
    qk_norm=st.sampled_from([None, "head", "proj", "after_rope"]),
    num_kv_heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([None, 6]),
    window=st.sampled_from([None, 1, 3]),
    pattern=st.sampled_from(["all", "alternate", "chunked"]),
    positions=st.sampled_from(["rope", "learned", "none"]),
    caps=st.booleans(),
    sinks=st.booleans(),
    tie=st.booleans(),
    bias=st.booleans(),
    # nanochat's weightless norms (the embeddings' too) and reversed rotation; Llama 4's
    # interleaved pairs, and a NoPE layer with its queries' temperature
    weightless=st.booleans(),
    interleave=st.booleans(),
    nope=st.booleans(),
    # Gemma 4's last layer reading the first one's keys and values (where both are alike)
    share=st.booleans(),
)


def _config(norm="rmsnorm", mlp="swiglu", norm_placement="pre", qk_norm=None, num_kv_heads=2,
            head_dim=None, window=None, pattern="all", positions="rope", caps=False, sinks=False,
            tie=True, bias=False, weightless=False, interleave=False, nope=False,
            share=False):
    types, chunk = None, None
    if window is not None and pattern == "alternate":
        types = ("sliding", "full")
    if pattern == "chunked":                   # a chunked layer before a full (or sliding) one
        types, chunk = ("chunked", "sliding" if window else "full"), 3
    weightless = weightless and norm == "rmsnorm"
    return DecoderConfig(
        attention_chunk_size=chunk, norm_weightless=weightless, embed_norm=weightless,
        kv_shared_layers=int(share and types is None),
        rope_reversed=weightless, rope_interleave=interleave,
        nope_layers=(1,) if nope else (), attn_temperature=(2, 0.5) if nope else None,
        vocab_size=31, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=num_kv_heads,
        head_dim=head_dim, norm=norm, mlp=mlp, norm_placement=norm_placement, qk_norm=qk_norm,
        sliding_window=window, layer_types=types, positions=positions, tie_embeddings=tie,
        qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=bias,
        attn_logit_softcap=2.0 if caps else None, final_logit_softcap=4.0 if caps else None,
        embed_scale=caps, query_pre_attn_scalar=5.0 if caps else None, attn_sinks=sinks,
        rope={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4}
        if caps else {"rope_type": "default", "rope_theta": 100.0})


def _model(seed=0, **switches):
    minitx.manual_seed(seed)
    model = Decoder(_config(**switches)).to(dtype="float64")
    # larger weights than GPT-2's init, so every term of the sum shows in the logits
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        p.copy_(rng.standard_normal(p.shape) * 0.3 + (1.0 if name.endswith("ln1.weight") else 0))
    return model


IDS = np.random.default_rng(7).integers(0, 31, (2, 9))


# ---- the blocks ---------------------------------------------------------------------------

def _rms_reference(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


@pytest.mark.parametrize("unit_offset", [False, True])
def test_rmsnorm_is_its_formula_and_its_gradient_checks(unit_offset):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8))
    layer = DecoderRMSNorm(8, eps=1e-3, unit_offset=unit_offset).to(dtype="float64")
    w = rng.standard_normal(8)
    layer.weight.copy_(w)
    g = 1 + w if unit_offset else w                     # Gemma stores g − 1
    assert_close(layer(tensor(x)), _rms_reference(x, g, 1e-3), rtol=1e-12)
    minitx.gradcheck(lambda t: layer(t), (tensor(x, requires_grad=True),))


def test_rmsnorm_hooks_see_the_scale_and_the_normalised_x():
    x = np.random.default_rng(1).standard_normal((2, 3, 8))
    layer = DecoderRMSNorm(8, eps=1e-5).to(dtype="float64")
    seen = {}
    layer.hook_scale.add_hook(lambda t, h: seen.__setitem__("scale", t.numpy()))
    layer.hook_normalized.add_hook(lambda t, h: seen.__setitem__("normalized", t.numpy()))
    out = layer(tensor(x))
    scale = np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(seen["scale"], scale, rtol=1e-12)
    np.testing.assert_allclose(seen["normalized"], x / scale, rtol=1e-12)
    assert_close(out, _rms_reference(x, 1.0, 1e-5), rtol=1e-12)


@pytest.mark.parametrize("scale_in_float32", [False, True])
def test_float16_rmsnorm_rounds_where_its_family_does(scale_in_float32):
    """Llama rounds the normalised x to float16 and then scales; Gemma and OLMo 2 scale in
    float32 and round the product. The two differ in the last bits, and each is exact."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)).astype(np.float16)
    w = (1 + rng.standard_normal(64) * 0.3).astype(np.float16)
    layer = DecoderRMSNorm(64, eps=1e-6, scale_in_float32=scale_in_float32, dtype="float16")
    layer.weight.copy_(w)
    out = to_host(layer(tensor(x, dtype=None)))
    x32 = x.astype(np.float32)
    normed = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + np.float32(1e-6))
    scaled_then_rounded = (normed * w.astype(np.float32)).astype(np.float16)
    rounded_then_scaled = normed.astype(np.float16) * w
    ref, other = (scaled_then_rounded, rounded_then_scaled) if scale_in_float32 else \
        (rounded_then_scaled, scaled_then_rounded)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, ref)               # bit for bit
    assert np.any(out != other)                           # and the order shows


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
def test_gated_mlp_is_its_formula_and_its_gradient_checks(activation):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 6))
    mlp = GatedMLP(6, 10, activation, bias=True).to(dtype="float64")
    p = {k: to_host(v) for k, v in mlp.state_dict().items()}
    gate = x @ p["gate_proj.weight"].T + p["gate_proj.bias"]
    up = x @ p["up_proj.weight"].T + p["up_proj.bias"]
    phi = {"silu": lambda z: z / (1 + np.exp(-z)),
           "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                         (z + 0.044715 * z ** 3))),
           "gelu": lambda z: 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))}
    ref = (phi[activation](gate) * up) @ p["down_proj.weight"].T + p["down_proj.bias"]
    assert_close(mlp(tensor(x)), ref, rtol=1e-10)
    minitx.gradcheck(lambda t: mlp(t), (tensor(x, requires_grad=True),))


def test_dense_mlp_and_softcap():
    x = np.random.default_rng(4).standard_normal((3, 5))
    mlp = DenseMLP(5, 7, "silu", bias=False).to(dtype="float64")
    w1, w2 = mlp.up_proj.weight.numpy(), mlp.down_proj.weight.numpy()
    h = x @ w1.T
    assert_close(mlp(tensor(x)), (h / (1 + np.exp(-h))) @ w2.T, rtol=1e-10)
    z = np.array([-100.0, -1.0, 0.0, 1e-3, 50.0])
    out = softcap(tensor(z), 5.0).numpy()
    np.testing.assert_allclose(out, 5.0 * np.tanh(z / 5.0), rtol=1e-14)
    assert np.all(np.abs(out) <= 5.0) and abs(out[3] - 1e-3) < 1e-9   # tanh(−20) rounds to −1


# ---- rotary ---------------------------------------------------------------------------

ROPES = [{"rope_type": "default", "rope_theta": 500.0},
         {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500.0},
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
          "rope_theta": 500.0},
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
          "rope_theta": 500.0, "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16,
          "truncate": False}]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"] + str(len(r)))
def test_rope_frequencies_equal_transformers(rope):
    transformers = need("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2,
                                   max_position_embeddings=128, rope_parameters=dict(rope))
    if rope["rope_type"] == "default":
        ref, factor = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding \
            .compute_default_rope_parameters(cfg)
    else:
        ref, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg)
    omega, a, dim = rope_frequencies(32, rope)
    assert dim == 32
    # HF computes ω in float32: agreement to float32's rounding
    np.testing.assert_allclose(omega, ref.double().numpy(), rtol=2e-6)
    assert a == pytest.approx(factor, rel=1e-12)


def test_rotation_keeps_norms_and_scores_depend_on_offsets_only():
    rng = np.random.default_rng(5)
    rot = Rotary(8, {"rope_type": "default", "rope_theta": 100.0})
    q, k = rng.standard_normal((1, 1, 1, 8)), rng.standard_normal((1, 1, 1, 8))

    def score(m, n):
        xp = np.arange
        rq = rot.rotate(tensor(q), minitx.backend.xp().asarray(xp(m, m + 1))).numpy()
        rk = rot.rotate(tensor(k), minitx.backend.xp().asarray(xp(n, n + 1))).numpy()
        assert np.isclose(np.linalg.norm(rq), np.linalg.norm(q))
        return float((rq * rk).sum())

    assert score(3, 1) == pytest.approx(score(12, 10), rel=1e-12)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)


def test_partial_rotary_dims_pass_unchanged_and_half_pairs_rotate():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 3, 8))
    rot = Rotary(8, {"rope_type": "default", "partial_rotary_factor": 0.5})
    assert rot.rotary_dim == 4
    pos = minitx.backend.xp().asarray(np.array([0, 5, 9]))
    out = rot.rotate(tensor(x), pos).numpy()
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
    angle = np.array([0, 5, 9])[:, None] * 10000.0 ** (-np.arange(0, 4, 2) / 4)
    c, s = np.cos(angle), np.sin(angle)
    np.testing.assert_allclose(out[..., :2], x[..., :2] * c - x[..., 2:4] * s, rtol=1e-12)
    np.testing.assert_allclose(out[..., 2:4], x[..., 2:4] * c + x[..., :2] * s, rtol=1e-12)
    cos, sin = (minitx.backend.xp().asarray(a) for a in (c, s))
    minitx.gradcheck(lambda t: apply_rotary(t, cos, sin, 4), (tensor(x, requires_grad=True),))


@pytest.mark.parametrize("rope,match", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic' is not implemented"),
    ({"rope_type": "linear"}, "needs factor"),
    ({"rope_type": "default", "factor": 2.0}, "does not take 'factor'"),
    ({"partial_rotary_factor": 0.375}, "positive even int"),      # R = 3
])
def test_bad_rope_options_are_refused_by_name(rope, match):
    with pytest.raises(ValueError, match=match):
        Rotary(8, rope)


# ---- the bounded cache --------------------------------------------------------------------

def test_window_cache_returns_the_visible_keys_and_keeps_w_minus_one():
    rng = np.random.default_rng(8)
    keys = rng.standard_normal((1, 2, 10, 4))
    cache = WindowKVCache(3)
    k, _ = cache.append(tensor(keys[:, :, :6]), tensor(keys[:, :, :6]))
    assert k.shape[2] == 6 and cache.first_position == 0 and len(cache) == 6
    for t in range(6, 10):
        k, v = cache.append(tensor(keys[:, :, t:t + 1]), tensor(keys[:, :, t:t + 1]))
        assert len(cache) == t + 1 and cache.first_position == t - 2
        np.testing.assert_array_equal(k.numpy(), keys[:, :, t - 2:t + 1])
        assert cache._k.shape[2] == 2                      # bounded: W − 1 kept
    with pytest.raises(ValueError, match="must be"):
        WindowKVCache(0)
    with pytest.raises(ValueError, match=r"expected k of shape"):
        cache.append(tensor(keys[:, :1, :1]), tensor(keys[:, :1, :1]))


# ---- the model ----------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(**SWITCHES)
def test_every_switch_combination_is_causal_and_decodes_through_its_caches(**switches):
    model = _model(**switches)
    full = model(IDS).numpy()
    # causal: the future does not reach the past
    changed = IDS.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % 31
    np.testing.assert_allclose(model(changed).numpy()[:, :6], full[:, :6], rtol=1e-12,
                               atol=1e-12)
    # the prompt at once, then a token at a time: the same logits
    caches = model.new_caches()
    steps = [model(IDS[:, :3], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(3, 9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    for block, cache in zip(model.blocks, caches):
        kind = SharedKVCache if block.attn.borrows else ChunkKVCache if block.attn.chunk else \
            WindowKVCache if block.attn.window else KVCache
        assert type(cache) is kind
        if block.attn.chunk:                     # the current chunk's tokens only: 9 mod 3
            assert len(cache.keys[0, 0]) == 0


def _attention_reference(model, ids):
    """The first block's attention output from the module docstring's formula in NumPy
    (pre-norm RMSNorm, default RoPE, no QK-norm before the rotation), for one batch row; with
    nanochat's and Llama 4's switches: no gains, the embeddings normalised, the rotation by
    −mω, pairs (2i, 2i + 1) rotated as complex numbers, q and k normalised after it, and
    chunks."""
    c = model.config
    p = {k: to_host(v) for k, v in model.state_dict().items()}
    x = p["embed.weight"][ids] * (math.sqrt(c.hidden_size) if c.embed_scale else 1)
    if c.embed_norm:
        x = _rms_reference(x, 1.0, c.norm_eps)
    h = _rms_reference(x, 1.0 if c.norm_weightless else p["blocks.0.ln1.weight"], c.norm_eps)
    n, d, hkv = len(ids), c.head_dim, c.num_kv_heads
    q = (h @ p["blocks.0.attn.q_proj.weight"].T).reshape(n, c.num_heads, d)
    k = (h @ p["blocks.0.attn.k_proj.weight"].T).reshape(n, hkv, d)
    v = (h @ p["blocks.0.attn.v_proj.weight"].T).reshape(n, hkv, d)
    ang = np.arange(n)[:, None] * c.rope["rope_theta"] ** (-np.arange(0, d, 2) / d)
    ang = -ang if c.rope_reversed else ang

    def rot(t):
        if c.rope_interleave:                      # (t_2i + i t_2i+1) e^{i m ω_i}
            z = (t[..., 0::2] + 1j * t[..., 1::2]) * np.exp(1j * ang)[:, None]
            return np.stack([z.real, z.imag], -1).reshape(t.shape)
        c_, s_ = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = t[..., :d // 2], t[..., d // 2:]
        return np.concatenate([a * c_ - b * s_, b * c_ + a * s_], -1)

    q, k = rot(q), rot(k)
    if c.qk_norm == "after_rope":
        q, k = _rms_reference(q, 1.0, c.norm_eps), _rms_reference(k, 1.0, c.norm_eps)
    out = np.zeros((n, c.num_heads, d))
    w = c.sliding_window if c.layer_types[0] == "sliding" else n
    scale = 1 / math.sqrt(c.query_pre_attn_scalar or d)
    for hh in range(c.num_heads):
        g = hh // (c.num_heads // hkv)
        s = q[:, hh] @ k[:, g].T * scale
        if c.attn_logit_softcap:
            s = c.attn_logit_softcap * np.tanh(s / c.attn_logit_softcap)
        i, j = np.indices((n, n))
        chunk = c.attention_chunk_size if c.layer_types[0] == "chunked" else n
        s = np.where((j <= i) & (j > i - w) & (j // chunk == i // chunk), s, -np.inf)
        e = np.exp(s)
        sink = np.exp(p["blocks.0.attn.sinks"][hh]) if c.attn_sinks else 0.0
        out[:, hh] = (e / (e.sum(-1, keepdims=True) + sink)) @ v[:, g]
    return out.reshape(n, -1) @ p["blocks.0.attn.o_proj.weight"].T


@pytest.mark.parametrize("window,cap,scalar,sinks", [
    (None, None, None, False), (3, None, None, False), (2, 1.5, 7.0, False),
    (None, 0.5, None, False), (None, None, None, True), (3, 2.0, None, True)])
@pytest.mark.parametrize("family", [None, "nanochat", "llama4"])
def test_attention_is_the_docstring_formula(window, cap, scalar, sinks, family):
    minitx.manual_seed(1)
    switches = {None: {}, "nanochat": dict(norm_weightless=True, embed_norm=True,
                                           rope_reversed=True, qk_norm="after_rope"),
                "llama4": dict(rope_interleave=True, qk_norm="after_rope",
                               layer_types=("chunked", "full"), attention_chunk_size=3)}[family]
    if window is not None and family == "llama4":
        switches["layer_types"] = ("chunked", "sliding")
    model = Decoder(DecoderConfig(
        vocab_size=31, hidden_size=16, num_heads=4, num_kv_heads=2, sliding_window=window,
        attn_logit_softcap=cap, query_pre_attn_scalar=scalar, embed_scale=cap is not None,
        attn_sinks=sinks, rope={"rope_theta": 50.0}, **switches)).to(dtype="float64")
    for p in model.parameters():
        p.copy_(np.random.default_rng(2).standard_normal(p.shape) * 0.5)
    seen = {}
    model.blocks[0].hook_attn_out.add_hook(lambda t, h: seen.__setitem__("a", t.numpy()))
    model(IDS)
    np.testing.assert_allclose(seen["a"][0], _attention_reference(model, IDS[0]), rtol=1e-10,
                               atol=1e-12)


def test_nope_queries_are_warmed_by_the_position_and_rotary_ones_not():
    """Llama 4's temperature (F = 2, α = 0.5): on the NoPE layer, the scores of query m are
    1 + α·ln(1 + ⌊(m + 1)/F⌋) times those of the same model without it; the rotary layer's
    are unchanged. Through the caches, the positions count on from the cached ones."""
    seen = {}

    def scores(temperature, ids=IDS, steps=None):
        minitx.manual_seed(3)
        model = Decoder(DecoderConfig(vocab_size=31, hidden_size=16, num_heads=4,
                                      nope_layers=(1,), attn_temperature=temperature,
                                      )).to(dtype="float64")
        for i, block in enumerate(model.blocks):
            block.attn.hook_attn_scores.add_hook(
                lambda t, h, i=i: seen.setdefault(i, []).append(t.numpy()))
        seen.clear()
        if steps is None:
            model(ids)
        else:
            caches = model.new_caches()
            for a, b in steps:
                model(ids[:, a:b], kv_caches=caches)
        return {i: v for i, v in seen.items()}

    plain, warm = scores(None), scores((2, 0.5))
    m = np.arange(IDS.shape[1])
    factor = 1 + 0.5 * np.log1p(np.floor((m + 1) / 2))
    assert factor[-1] > 1.5                                  # the test's tokens reach it
    np.testing.assert_array_equal(warm[0][0], plain[0][0])
    np.testing.assert_allclose(warm[1][0], plain[1][0] * factor[:, None], rtol=1e-12)
    stepped = scores((2, 0.5), steps=[(0, 4), (4, 9)])[1]
    np.testing.assert_allclose(stepped[1], warm[1][0][:, :, 4:9], rtol=1e-12)


def test_weightless_rmsnorm_and_the_squared_relu_mlp():
    """No parameter, x / √(mean x² + eps) (float64 and float16), and W_d max(W_u x, 0)²."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8))
    norm = DecoderRMSNorm(8, eps=0.1, affine=False).to(dtype="float64")
    assert list(norm.parameters()) == [] and norm.weight is None
    assert_close(norm(tensor(x)), _rms_reference(x, 1.0, 0.1), rtol=1e-14)
    half = norm(tensor(x.astype("float16"), dtype=None))
    assert half.dtype == np.float16
    assert_close(half, _rms_reference(x.astype("float16").astype("float32"), 1.0, 0.1)
                 .astype("float16"), rtol=0, atol=0)
    mlp = DenseMLP(8, 5, "relu2", bias=False).to(dtype="float64")
    up, down = to_host(mlp.up_proj.weight), to_host(mlp.down_proj.weight)
    assert (x @ up.T < 0).any()                           # the ReLU has something to cut
    assert_close(mlp(tensor(x)), np.maximum(x @ up.T, 0) ** 2 @ down.T, rtol=1e-13)
    assert minitx.gradcheck(lambda t: mlp(t), (tensor(x, requires_grad=True),))
    with pytest.raises(ValueError, match="unit_offset.*affine=False"):
        DecoderRMSNorm(8, unit_offset=True, affine=False)


def test_the_reversed_rotation_turns_by_minus_m_omega():
    """nanochat's rotation at position m is Llama's at −m."""
    x = tensor(np.random.default_rng(5).standard_normal((1, 2, 6, 8)))
    m = np.arange(6)
    back, ahead = Rotary(8, {"rope_theta": 30.0}, reverse=True), Rotary(8, {"rope_theta": 30.0})
    assert_close(back.rotate(x, m), ahead.rotate(x, -m), rtol=1e-14)
    assert not np.allclose(to_host(back.rotate(x, m)), to_host(ahead.rotate(x, m)))


def test_a_decoder_block_gradient_checks():
    minitx.manual_seed(2)
    c = _config(norm_placement="sandwich", qk_norm="head", window=2, caps=True, bias=True,
                sinks=True)
    model = Decoder(c).to(dtype="float64")
    x = np.random.default_rng(3).standard_normal((1, 5, 16))
    minitx.gradcheck(lambda t: model.blocks[0](t), (tensor(x, requires_grad=True),), fast=True)
    # and through the sink logits themselves (gradcheck perturbs the parameter in place)
    sinks = model.blocks[0].attn.sinks
    sinks.copy_(np.array([0.5, -1.0, 2.0, 0.0]))
    minitx.gradcheck(lambda s: model.blocks[0](tensor(x)), (sinks,))


def test_generate_is_greedy_through_the_caches():
    model = _model(window=3, pattern="alternate")
    out = model.generate(IDS[:, :4], max_new_tokens=5).numpy()
    tokens = IDS[:, :4]
    for _ in range(5):
        nxt = model(tokens).numpy()[:, -1].argmax(-1)[:, None]
        tokens = np.concatenate([tokens, nxt], axis=1)
    np.testing.assert_array_equal(out, tokens)
    minitx.manual_seed(3)
    a = model.generate(IDS[:, :4], 6, temperature=1.0, top_k=5).numpy()
    minitx.manual_seed(3)
    np.testing.assert_array_equal(model.generate(IDS[:, :4], 6, temperature=1.0,
                                                 top_k=5).numpy(), a)


def test_hook_points_carry_transformerlens_names():
    model = _model(norm_placement="sandwich", qk_norm="head")
    names = set(model.hook_names())
    for name in ("hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q",
                 "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_pattern",
                 "blocks.0.attn.hook_z", "blocks.1.hook_resid_post", "blocks.1.mlp.hook_pre",
                 "blocks.1.mlp.hook_pre_linear", "blocks.1.mlp.hook_post",
                 "blocks.0.ln1.hook_normalized", "blocks.0.ln2_post.hook_scale",
                 "ln_final.hook_normalized"):
        assert name in names, name
    logits, cache = model.run_with_cache(IDS)
    assert cache["pattern", 0].shape == (2, 4, 9, 9)
    np.testing.assert_allclose(cache["pattern", 0].numpy().sum(-1), 1.0, rtol=1e-12)
    assert_close(logits, model(IDS), rtol=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_head=4), "did you mean 'num_heads'"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(num_heads=4, num_kv_heads=3), "divisible by num_kv_heads"),
    (dict(layer_types=("sliding", "full")), "sliding_window is None"),
    (dict(layer_types=("full",)), "for each of the 2 layers"),
    (dict(mlp="moe"), "needs num_experts and top_k"),
    (dict(rope={"rope_type": "longrope"}), "rope_type 'longrope' is not implemented"),
    (dict(layer_types=("chunked", "full")), "attention_chunk_size is None"),
    (dict(attention_chunk_size=0), "attention_chunk_size"),
    (dict(norm="layernorm", norm_weightless=True), "norm_weightless.*layernorm"),
    (dict(norm_unit_offset=True, norm_weightless=True), "norm_weightless.*norm_unit_offset"),
    (dict(embed_norm="yes"), "embed_norm"),
    (dict(rope_reversed=1), "rope_reversed"),
    (dict(attn_temperature=8192), "attn_temperature must be"),
    (dict(attn_temperature=(0, 0.1)), r"attn_temperature\[0\]"),
    (dict(qk_norm="l2"), "qk_norm must be one of"),
    (dict(kv_shared_layers=2), "kv_shared_layers"),
    (dict(num_layers=3, layer_types=("full", "sliding", "sliding"), sliding_window=2,
          kv_shared_layers=2), r"layer 1 \('sliding'\) must be an attention layer with an "
                               r"earlier 'sliding'"),
])
def test_bad_switches_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Decoder(DecoderConfig(**kwargs))


def test_mlp_moe_builds_the_mixture_of_experts_the_interface_names(monkeypatch):
    """``mlp="moe"`` builds ``nn.moe.MoE(E, expert_hidden, num_experts, top_k,
    **moe_options)`` in every layer but the ``dense_layers``, which keep a SwiGLU of width F
    (a stand-in MoE records its arguments: the real one is tested in its own file)."""
    import minitx.models.decoder_block as decoder_block      # where a layer's MLP is built
    built = []

    class StandIn(minitx.nn.Module):
        def __init__(self, dim, hidden, num_experts, top_k, **options):
            super().__init__()
            built.append((dim, hidden, num_experts, top_k, options))
            self.inner = GatedMLP(dim, hidden)

        def forward(self, x):
            return self.inner(x)

    monkeypatch.setattr(decoder_block, "MoE", StandIn)
    model = Decoder(DecoderConfig(vocab_size=31, hidden_size=16, num_layers=3, mlp="moe",
                                  ffn_hidden=40, expert_hidden=8, num_experts=4, top_k=2,
                                  dense_layers=(0,), moe_options={"norm_topk_prob": True}))
    assert built == [(16, 8, 4, 2, {"norm_topk_prob": True})] * 2
    dense = model.blocks[0].mlp
    assert isinstance(dense, GatedMLP) and dense.up_proj.out_features == 40
    assert all(isinstance(b.mlp, StandIn) for b in model.blocks[1:])
    assert model(IDS).shape == (2, 9, 31)
    with pytest.raises(ValueError, match="dense_layers"):
        Decoder(DecoderConfig(mlp="moe", num_experts=4, top_k=2, dense_layers=(5,)))


@pytest.mark.parametrize("written_out", [False, True])
def test_attention_mask_hides_padding_keys_and_bad_masks_are_refused(written_out):
    # written_out: soft-caps and sinks, the composed path (padding query rows give zeros)
    model = _model(window=3, pattern="alternate", caps=written_out, sinks=written_out)
    mask = np.ones_like(IDS)
    mask[1, :3] = 0                                     # row 1 left-padded by three
    padded = model(IDS, attention_mask=mask).numpy()
    # row 1's real tokens read only real keys: changing the padding tokens changes nothing
    other = IDS.copy()
    other[1, :3] = (other[1, :3] + 5) % 31
    np.testing.assert_allclose(model(other, attention_mask=mask).numpy()[1, 3:],
                               padded[1, 3:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(padded[0], model(IDS).numpy()[0], rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(padded))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, 9\)"):
        model(IDS, attention_mask=mask[:, :5])
    with pytest.raises(ValueError, match="not an additive bias"):
        model(IDS, attention_mask=np.where(mask == 1, 0.0, -np.inf))


@settings(max_examples=15, deadline=None)
@given(**SWITCHES)
def test_count_parameters_counts_what_the_model_has(**switches):
    model = _model(**switches)
    count = count_parameters(model.config)
    assert count["total"] == sum(p.size for p in model.parameters())
    assert count["embedding"] == model.embed.weight.size * (1 if model.unembed is None else 2)


@settings(max_examples=10, deadline=None)
@given(q_lora=st.sampled_from([None, 6]), interleave=st.booleans(), bias=st.booleans(),
       yarn=st.booleans())
def test_latent_attention_is_causal_caches_latents_and_counts(q_lora, interleave, bias, yarn):
    """attention="mla": causal, decoding through the latent cache as the full forward does,
    the cache holding r + D_r numbers per token, and count_parameters exact. (Equality with
    HF's DeepSeek-V3 is tests/oracles/test_pretrained_decoders.py.)"""
    minitx.manual_seed(4)
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4,
            "mscale_all_dim": 1.0} if yarn else {"rope_type": "default", "rope_theta": 50.0}
    model = Decoder(DecoderConfig(
        vocab_size=31, hidden_size=16, num_heads=4, attention="mla", q_lora_rank=q_lora,
        kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2,
        rope_interleave=interleave, qkv_bias=bias, o_bias=bias, rope=rope)).to(dtype="float64")
    for p in model.parameters():
        p.copy_(np.random.default_rng(5).standard_normal(p.shape) * 0.4)
    assert count_parameters(model.config)["total"] == sum(p.size for p in model.parameters())
    full = model(IDS).numpy()
    changed = IDS.copy()
    changed[:, 5:] = (changed[:, 5:] + 3) % 31
    np.testing.assert_allclose(model(changed).numpy()[:, :5], full[:, :5], rtol=1e-12,
                               atol=1e-12)
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    assert caches[0].keys.shape == (2, 1, 9, 5) and caches[0].values.shape == (2, 1, 9, 4)


def test_latent_attention_refuses_what_deepseek_does_not_have():
    with pytest.raises(ValueError, match="kv_lora_rank"):
        Decoder(DecoderConfig(attention="mla"))
    with pytest.raises(ValueError, match="attention='mla' is DeepSeek's"):
        Decoder(DecoderConfig(attention="mla", kv_lora_rank=4, qk_nope_head_dim=2,
                              qk_rope_head_dim=2, v_head_dim=2, qk_norm="head"))


def test_the_plain_attention_carries_no_familys_additions():
    """A Llama-style layer is ``DecoderAttention`` itself: no norm, gate, cap or sink in it.
    Each switch adds exactly its own class, and they compose (Qwen3-Next: a gate and
    QK-norm)."""
    from minitx.models import DecoderAttention
    from minitx.models import attention_features as af
    base = dict(vocab_size=11, hidden_size=8, num_layers=1, num_heads=2, ffn_hidden=8)
    plain = Decoder(DecoderConfig(**base)).blocks[0].attn
    assert type(plain) is DecoderAttention
    assert not any(hasattr(plain, a) for a in ("q_norm", "sinks", "logit_softcap",
                                                "hook_out_gate", "hook_q_normed"))
    for switch, cls in ((dict(qk_norm="head"), af.QKNorm), (dict(attn_sinks=True), af.Sinks),
                        (dict(attn_logit_softcap=5.0), af.SoftCapped),
                        (dict(attn_output_gate=True), af.OutputGate)):
        assert type(Decoder(DecoderConfig(**base, **switch)).blocks[0].attn) is cls
    both = type(Decoder(DecoderConfig(**base, qk_norm="head",
                                      attn_output_gate=True)).blocks[0].attn)
    assert issubclass(both, af.QKNorm) and issubclass(both, af.OutputGate)
    assert set(Decoder(DecoderConfig(**base, qk_norm="head", attn_output_gate=True))
               .state_dict()) >= {"blocks.0.attn.q_norm.weight", "blocks.0.attn.q_proj.weight"}


def test_the_plain_block_is_pre_norm_and_each_placement_is_its_own_class():
    """A Llama-style layer is ``DecoderBlock`` itself, two norms and no scales; OLMo 2's
    post-norm, Gemma 3's sandwich and MiniMax's weighted residual are each their own
    subclass, with exactly the norms their formula names."""
    from minitx.models import DecoderBlock
    from minitx.models import block_features as bf
    base = dict(vocab_size=11, hidden_size=8, num_layers=1, num_heads=2, ffn_hidden=8)
    plain = Decoder(DecoderConfig(**base)).blocks[0]
    assert type(plain) is DecoderBlock
    assert {n.split(".")[0] for n, _ in plain.named_parameters()} == {"ln1", "attn", "ln2",
                                                                       "mlp"}
    norms = {"post": (bf.PostNorm, {"ln1_post", "ln2_post"}),
             "sandwich": (bf.Sandwich, {"ln1", "ln2", "ln1_post", "ln2_post"})}
    for placement, (cls, names) in norms.items():
        block = Decoder(DecoderConfig(**base, norm_placement=placement)).blocks[0]
        assert type(block) is cls
        assert {n.split(".")[0] for n, _ in block.named_parameters()} - {"attn", "mlp"} == names
    scaled = Decoder(DecoderConfig(**base, residual_scales=((0.5, 2.0, 3.0, 0.25),))).blocks[0]
    assert type(scaled) is bf.ScaledResidual and scaled.scales == (0.5, 2.0, 3.0, 0.25)
