"""Kimi Linear's KDA layer type (``minitx/models/mixers/kda.py``) and the hybrid decoder it
makes with MLA without rotation: the layer against its module docstring's formulas written
out token by token in NumPy, float64 gradient checks, decoding through its cache as the full
forward does, padding, hooks, counts, bad options refused by name, and the published
Kimi-Linear-48B-A3B read from its config.json alone (counts, caches). Equality with
HuggingFace's Kimi Linear is ``tests/oracles/test_hybrid_kimi_linear.py``.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.models import Decoder, DecoderConfig, count_parameters
from minitx.models.decoder import kv_cache_bytes
from minitx.models.mixers import MIXERS
from minitx.models.mixers.kda import KDACache, KimiDeltaLayer
from minitx.pretrained import decoders, families
from minitx.validate import OptionError
from support import assert_close, tensor


def _config(h=2, d=3, kernel=3, chunk=2, e=8, **extra):
    return DecoderConfig(vocab_size=23, hidden_size=e, num_layers=1, num_heads=2,
                         layer_types=("kda",), norm_eps=0.05,
                         mixer_options={"kda": {"num_heads": h, "head_dim": d,
                                                "conv_kernel": kernel, "chunk_size": chunk}},
                         **extra)


def _layer(seed=0, **sizes):
    minitx.manual_seed(seed)
    layer = KimiDeltaLayer(_config(**sizes)).to(dtype="float64")
    rng = np.random.default_rng(seed)
    for name, p in layer.named_parameters():        # every weight drawn, gains near 1
        p.copy_(rng.standard_normal(p.shape) * 0.5 + (1.0 if name == "o_norm.weight" else 0))
    return layer


def _reference(layer, x, eps=0.05):
    """The module docstring's formulas, token by token, in NumPy (float64)."""
    p = {k: v.numpy() for k, v in layer.named_parameters()}
    b, n, _ = x.shape
    h, d = layer.num_heads, layer.head_dim

    def lin(name, a):
        return a @ p[f"{name}.weight"].T

    def conv_silu(name, a):
        w = p[f"{name}.weight"][:, 0, :]                           # (C, K)
        kernel = w.shape[1]
        out = np.zeros_like(a)
        for t in range(n):
            for j in range(kernel):                                # tap j meets x_{t−K+1+j}
                s = t - kernel + 1 + j
                if s >= 0:
                    out[:, t] += w[:, j] * a[:, s]
        return out / (1 + np.exp(-out))

    def heads(a):
        return a.reshape(b, n, h, d)

    q, k, v = (heads(conv_silu(f"{c}_conv1d", lin(f"{c}_proj", x))) for c in "qkv")
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(d)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    f = heads(lin("f_b_proj", lin("f_a_proj", x)) + p["dt_bias"])
    log_alpha = -np.exp(p["A_log"]) * np.logaddexp(0, f)          # (B, N, H, D)
    beta = 1 / (1 + np.exp(-lin("b_proj", x)))                     # (B, N, H)
    s = np.zeros((b, h, d, d))
    o = np.zeros((b, n, h, d))
    for t in range(n):
        s = np.exp(log_alpha[:, t])[..., None] * s                 # Diag(α_t) S
        error = v[:, t] - np.einsum("bhd,bhde->bhe", k[:, t], s)
        s = s + beta[:, t, :, None, None] * k[:, t, :, :, None] * error[:, :, None, :]
        o[:, t] = np.einsum("bhd,bhde->bhe", q[:, t], s)
    gate = 1 / (1 + np.exp(-heads(lin("g_b_proj", lin("g_a_proj", x)))))
    o = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * p["o_norm.weight"] * gate
    return lin("o_proj", o.reshape(b, n, h * d)), s


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 9), h=st.integers(1, 3), d=st.integers(1, 4),
       kernel=st.integers(1, 4), chunk=st.integers(1, 5), b=st.integers(1, 2))
def test_the_layer_is_its_formula_token_by_token(n, h, d, kernel, chunk, b):
    layer = _layer(h=h, d=d, kernel=kernel, chunk=chunk)
    x = np.random.default_rng(n).standard_normal((b, n, 8))
    want, state = _reference(layer, x)
    seen = {}
    layer.hook_state.add_hook(lambda t, hook: seen.__setitem__("s", t.numpy()))
    assert_close(layer(tensor(x)), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(seen["s"], state, rtol=1e-10, atol=1e-12)


def test_the_layer_gradient_checks_through_x_and_every_kind_of_weight():
    layer = _layer(1, h=2, d=2, kernel=3, chunk=2, e=6)
    x = np.random.default_rng(1).standard_normal((1, 5, 6))        # 5 tokens: 3 chunks
    minitx.gradcheck(lambda t: layer(t), (tensor(x, requires_grad=True),))
    # the decay's rate and bias, a convolution, the gate's and the norm's weights
    params = (layer.A_log, layer.dt_bias, layer.k_conv1d.weight, layer.g_b_proj.weight,
              layer.o_norm.weight, layer.b_proj.weight)
    minitx.gradcheck(lambda *_: layer(tensor(x)), params)


@pytest.mark.parametrize("first", [1, 3, 4])
def test_decoding_through_the_cache_equals_the_full_forward(first):
    layer = _layer(2, chunk=2)
    x = np.random.default_rng(2).standard_normal((2, 9, 8))
    full = layer(tensor(x)).numpy()
    cache = layer.new_cache()
    assert isinstance(cache, KDACache) and len(cache) == 0
    # a prompt, then a two-token continuation, then one token at a time
    steps = [layer(tensor(x[:, :first]), kv_cache=cache).numpy(),
             layer(tensor(x[:, first:first + 2]), kv_cache=cache).numpy()]
    size = cache.nbytes
    steps += [layer(tensor(x[:, i:i + 1]), kv_cache=cache).numpy()
              for i in range(first + 2, 9)]
    assert_close(np.concatenate(steps, axis=1), full, rtol=1e-11, atol=1e-13)
    assert len(cache) == 9
    # a recurrent state: the cache does not grow with the tokens, and is what is counted
    # (per sequence: the batch holds two)
    assert cache.nbytes == size == 2 * KimiDeltaLayer.state_numbers(_config(), 9) * 8
    assert 2 * kv_cache_bytes(_config(), 9, bytes_per_number=8) == size


def test_left_padding_leaves_the_real_tokens_as_if_alone():
    """Padding zeroes the layer's input (HF's rule): zeros write nothing into a zero memory
    and a zero convolution history, so left padding changes no real token's output."""
    layer = _layer(3)
    x = np.random.default_rng(3).standard_normal((1, 6, 8))
    padded = np.concatenate([np.random.default_rng(4).standard_normal((1, 3, 8)), x], axis=1)
    keep = np.array([[False] * 3 + [True] * 6])
    out = layer(tensor(padded), keep=keep).numpy()
    assert_close(out[:, 3:], layer(tensor(x)).numpy(), rtol=1e-11, atol=1e-13)
    assert np.abs(layer(tensor(padded)).numpy()[:, 3:] - out[:, 3:]).max() > 1e-3


def test_hooks_see_and_replace_the_decay_the_write_strength_and_the_gate():
    layer = _layer(4)
    x = tensor(np.random.default_rng(5).standard_normal((2, 5, 8)))
    seen = {}
    for name in ("log_alpha", "beta", "gate", "q", "z"):
        getattr(layer, f"hook_{name}").add_hook(
            lambda t, hook, name=name: seen.__setitem__(name, t.numpy()))
    base = layer(x).numpy()
    assert seen["log_alpha"].shape == (2, 2, 5, 3) and (seen["log_alpha"] <= 0).all()
    assert seen["beta"].shape == (2, 2, 5) and ((0 < seen["beta"]) & (seen["beta"] < 1)).all()
    assert seen["gate"].shape == seen["q"].shape == seen["z"].shape == (2, 5, 2, 3)
    # no decay at all (log α = 0) is a different layer
    layer.hook_log_alpha.add_hook(lambda t, hook: t * 0.0)
    assert np.abs(layer(x).numpy() - base).max() > 1e-3


def test_the_counts_are_the_built_models():
    c = DecoderConfig(vocab_size=29, hidden_size=16, num_layers=3, num_heads=4,
                      positions="none", attention="mla", q_lora_rank=6, kv_lora_rank=5,
                      qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=4,
                      layer_types=("kda", "full", "kda"),
                      mixer_options={"kda": {"num_heads": 3, "head_dim": 5, "conv_kernel": 2}},
                      mlp="moe", num_experts=4, top_k=2, expert_hidden=8, dense_layers=(0,),
                      moe_options=dict(router="sigmoid_grouped", n_group=2, topk_group=1,
                                       n_shared_experts=1, routed_scaling_factor=2.0))
    model = Decoder(c)
    assert count_parameters(c)["total"] == sum(p.size for p in model.parameters())
    assert KimiDeltaLayer.parameter_count(model.config) == \
        sum(p.size for p in model.blocks[0].attn.parameters())
    # after 7 tokens: two KDA layers' fixed states, one MLA layer's 7 latents and keys
    caches = model.new_caches()
    model(np.arange(7)[None] % 29, kv_caches=caches)
    numbers = 2 * (3 * 5 * 5 + 3 * 1 * 15) + 7 * (5 + 2)
    held = caches[0].nbytes + caches[2].nbytes + sum(
        t.data.nbytes for t in (caches[1].keys, caches[1].values))
    assert kv_cache_bytes(c, 7, bytes_per_number=4) == numbers * 4 == held


def test_a_fresh_decoder_keeps_the_official_decay_initialisation():
    """e^A uniform in [1, 16] and softplus(δ) in [0.001, 0.1] (flash-linear-attention's and
    HF's): slow decays at first; the decoder's own init must not zero δ as a bias."""
    minitx.manual_seed(6)
    layer = Decoder(_config(h=4, d=8)).blocks[0].attn
    rate = np.exp(layer.A_log.numpy())
    step = np.logaddexp(0, layer.dt_bias.numpy())
    assert rate.shape == (1, 1, 4, 1) and ((1 <= rate) & (rate <= 16)).all()
    assert ((1e-3 <= step * (1 + 1e-6)) & (step <= 0.1 * (1 + 1e-6))).all()
    assert step.std() > 0


def test_mla_without_rotation_ignores_the_positions():
    c = DecoderConfig(vocab_size=29, hidden_size=16, num_layers=1, num_heads=2,
                      positions="none", attention="mla", kv_lora_rank=5, qk_nope_head_dim=3,
                      qk_rope_head_dim=2, v_head_dim=4)
    minitx.manual_seed(5)
    model = Decoder(c).to(dtype="float64")
    ids = np.array([[3, 1, 4, 1, 5]])
    out = model(ids).numpy()
    assert_close(model(ids, position_ids=np.array([[7, 9, 2, 0, 30]])), out, rtol=1e-13)
    rope = Decoder(DecoderConfig(**{**c.__dict__, "positions": "rope"}))
    assert rope.blocks[0].attn.rotary is not None and model.blocks[0].attn.rotary is None


@pytest.mark.parametrize("options, match", [
    ({"num_head": 2}, "unknown option 'num_head'; did you mean 'num_heads'"),
    ({"head_dim": 0}, "head_dim"),
    ({"conv_kernel": 2.5}, "conv_kernel"),
    ({"chunk_size": -1}, "chunk_size"),
])
def test_bad_options_are_refused_by_name(options, match):
    with pytest.raises(OptionError, match=match):
        Decoder(DecoderConfig(vocab_size=11, hidden_size=8, num_layers=1, num_heads=2,
                              layer_types=("kda",), mixer_options={"kda": options}))


def test_kda_is_a_registered_layer_type_and_mla_refuses_learned_positions():
    assert MIXERS["kda"] is KimiDeltaLayer
    with pytest.raises(OptionError, match="attention='mla'"):
        Decoder(DecoderConfig(vocab_size=11, hidden_size=8, num_layers=1, num_heads=2,
                              positions="learned", attention="mla", kv_lora_rank=4,
                              qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2))


# ---- the published model, from its config.json alone ------------------------------------------

def test_the_published_kimi_linear_reads_as_its_model_card_says():
    """Kimi-Linear-48B-A3B: 27 layers, KDA and MLA 3 : 1 (the last layer MLA too), 8 of 256
    experts + 1 shared. Its card's "48B total, 3B activated" is the count without the
    embedding table and the head (0.75 B together); the KV cache grows only in the 7 MLA
    layers, the 20 KDA layers keep a fixed state."""
    c = families.family_config("kimi_linear")
    assert c.layer_types.count("kda") == 20 and c.layer_types[3::4] + c.layer_types[-1:] == \
        ("full",) * 7
    assert families.family_row("kimi_linear")["window pattern"] == "20 kda, 7 full"
    assert families.kv_cache_bytes_per_token(c) == 7 * (512 + 64) * 2
    assert kv_cache_bytes(c, 1000) - kv_cache_bytes(c, 999) == 7 * (512 + 64) * 2
    assert kv_cache_bytes(c, 0) == 20 * (32 * 128 * 128 + 3 * 3 * 32 * 128) * 2
    # two counters that share no code: the hand count and the decoder's own
    r, counted = families.expert_counts("kimi_linear"), count_parameters(c)
    assert (r["total"], r["active"]) == (counted["total"], counted["active"])
    assert round(counted["non_embedding"] / 1e9) == 48
    assert round((counted["active"] - counted["embedding"]) / 1e9) == 3


@pytest.mark.parametrize("key, value", [("mla_use_nope", False),
                                        ("moe_router_activation_func", "softmax"),
                                        ("moe_layer_freq", 2)])
def test_moonshot_keys_hf_does_not_read_must_say_what_hf_runs(key, value):
    name, cfg = families.REPRESENTATIVE["kimi_linear"]
    with pytest.raises(OptionError, match=f"{key}={value!r}: HuggingFace's Kimi Linear runs"):
        decoders.decoder_config(dict(cfg, model_type="kimi_linear", **{key: value}))
