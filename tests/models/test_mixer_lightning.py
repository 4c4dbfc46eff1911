"""MiniMax's lightning-attention mixer (``models/mixers/lightning.py``) and the decoder's
``residual_scales`` switch: the layer against its formula written out densely in NumPy (with
the decays from the paper's formula, not from the code), float64 gradient checks, blocks of
any length and decoding through the state equal to the full forward, padding, the hooks, the
counts, and bad options refused by name. Equality with HuggingFace's MiniMax is
``tests/oracles/test_hybrid_minimax.py``.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention.retention import RecurrentState
from minitx.models import Decoder, DecoderConfig, count_parameters
from minitx.models.decoder import check_config, kv_cache_bytes
from minitx.models.mixers import MIXERS
from minitx.models.mixers.lightning import LightningMixer
from minitx.validate import OptionError
from support import assert_close, tensor, to_host


def _config(num_layers=2, heads=2, head_dim=4, block=2, types=None, scales=None, **extra):
    return DecoderConfig(vocab_size=23, hidden_size=8, num_layers=num_layers, num_heads=heads,
                         num_kv_heads=1, head_dim=head_dim,
                         layer_types=types or ("lightning",) * num_layers,
                         mixer_options={"lightning": {"block": block}},
                         residual_scales=scales, **extra)


def _mixer(index=0, seed=0, **options):
    c = check_config(_config(**options))
    minitx.manual_seed(seed)
    mixer = LightningMixer(c, index).to(dtype="float64")
    rng = np.random.default_rng(seed)
    for name, p in mixer.named_parameters():
        p.copy_(rng.standard_normal(p.shape) * 0.4 + (1.0 if name == "norm.weight" else 0.0))
    return mixer


def _params(mixer):
    return {k: to_host(p.data) for k, p in mixer.named_parameters()}


def _reference(mixer, x, index, num_layers, keep=None):
    """The module docstring's layer, densely: o_t = Σ_{s ≤ t} λ^{t−s} (q_t·k_s) v_s."""
    w = _params(mixer)
    h, d = mixer.num_heads, mixer.head_dim
    b, n, _ = x.shape
    z = x @ w["qkv_proj.weight"].T
    qkv = z / (1 + np.exp(-z))                                         # SiLU
    if keep is not None:
        qkv = qkv * keep[:, :, None]
    qkv = qkv.reshape(b, n, h, 3 * d)
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]       # (B, N, H, D)
    # MiniMax's decays: ALiBi's slopes 2^(−8(h+1)/H), scaled by the layer's depth
    rate = 2.0 ** (-8.0 * np.arange(1, h + 1) / h) * \
        (1 - index / (num_layers - 1 + 1e-5) + 1e-5)
    t = np.arange(n)
    dist = t[:, None] - t[None, :]
    lam = np.where(dist >= 0, np.exp(-rate[:, None, None] * np.maximum(dist, 0)), 0.0)
    o = np.einsum("bihd,bjhd,hij,bjhe->bihe", q, k, lam, v).reshape(b, n, h * d)
    normed = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-6) * w["norm.weight"]
    gate = 1 / (1 + np.exp(-(x @ w["output_gate.weight"].T)))
    return (gate * normed) @ w["out_proj.weight"].T


@settings(max_examples=20, deadline=None)
@given(heads=st.sampled_from([1, 2, 4]), head_dim=st.sampled_from([1, 2, 3]),
       n=st.integers(1, 9), block=st.sampled_from([1, 2, 3, 16]),
       layer=st.sampled_from([(0, 1), (0, 3), (2, 3), (1, 4)]))
def test_the_mixer_is_its_formula_for_any_block_length(heads, head_dim, n, block, layer):
    index, num_layers = layer
    mixer = _mixer(index, heads=heads, head_dim=head_dim, block=block, num_layers=num_layers)
    x = np.random.default_rng(n).standard_normal((2, n, 8))
    assert_close(mixer(tensor(x)), _reference(mixer, x, index, num_layers), rtol=1e-10,
                 atol=1e-12)


def test_the_mixer_and_a_residual_scaled_block_gradient_check():
    mixer = _mixer(1, num_layers=3, block=2)
    x = np.random.default_rng(1).standard_normal((1, 5, 8))
    minitx.gradcheck(lambda t: mixer(t), (tensor(x, requires_grad=True),))
    for p in (mixer.qkv_proj.weight, mixer.output_gate.weight, mixer.norm.weight):
        minitx.gradcheck(lambda _: mixer(tensor(x)), (p,), fast=True)
    # a whole block: α·Norm(h) + β·F(Norm h) twice, lightning then softmax layers
    minitx.manual_seed(3)
    c = _config(types=("lightning", "full"), scales=((0.7, 1.3, 1.1, 0.9),) * 2)
    model = Decoder(c).to(dtype="float64")
    for block in model.blocks:
        minitx.gradcheck(lambda t: block(t), (tensor(x, requires_grad=True),), fast=True)


def test_residual_scales_weigh_the_normalised_input_and_the_sublayer():
    """hook_resid_mid = α₁·LN₁(h) + β₁·attn, hook_resid_post = α₂·LN₂(mid) + β₂·mlp."""
    minitx.manual_seed(4)
    scales = ((0.5, 2.0, 3.0, 0.25), (1.5, -1.0, 0.0, 1.0))
    model = Decoder(_config(types=("lightning", "full"), scales=scales)).to(dtype="float64")
    ids = np.random.default_rng(2).integers(0, 23, (2, 6))
    _, cache = model.run_with_cache(ids)
    for i, (a1, b1, a2, b2) in enumerate(scales):
        block, get = model.blocks[i], (lambda n: to_host(cache[f"blocks.{i}.{n}"].data))
        ln1 = to_host(block.ln1(tensor(get("hook_resid_pre"))).data)
        assert_close(get("hook_resid_mid"), a1 * ln1 + b1 * get("hook_attn_out"), rtol=1e-12)
        ln2 = to_host(block.ln2(tensor(get("hook_resid_mid"))).data)
        assert_close(get("hook_resid_post"), a2 * ln2 + b2 * get("hook_mlp_out"), rtol=1e-12)


@pytest.mark.parametrize("prefill", [1, 4, 7])
def test_decoding_through_the_state_equals_the_full_forward(prefill):
    minitx.manual_seed(5)
    c = _config(num_layers=3, types=("lightning", "full", "lightning"), block=3,
                scales=((0.7, 1.3, 1.1, 0.9),) * 3)
    model = Decoder(c).to(dtype="float64")
    ids = np.random.default_rng(3).integers(0, 23, (2, 10))
    full = to_host(model(ids).data)
    caches = model.new_caches()
    steps = [to_host(model(ids[:, :prefill], kv_caches=caches).data)]
    steps += [to_host(model(ids[:, i:i + 1], kv_caches=caches).data)
              for i in range(prefill, 10)]
    assert_close(np.concatenate(steps, axis=1), full, rtol=1e-11, atol=1e-12)
    assert [len(cache) for cache in caches] == [10, 10, 10]
    assert isinstance(caches[0], RecurrentState) and caches[0].state.shape == (2, 2, 4, 4)
    # and greedy generation with and without the caches
    assert np.array_equal(to_host(model.generate(ids[:, :3], 5).data),
                          to_host(model.generate(ids[:, :3], 5, use_cache=False).data))


def test_left_padding_leaves_the_real_tokens_as_without_it():
    """Padding's q, k, v are zeroed, so the state before the first real token stays 0: the
    lightning layer's outputs at the real tokens do not see the padding."""
    mixer = _mixer(0, block=2)
    x = np.random.default_rng(4).standard_normal((1, 7, 8))
    keep = np.array([[False, False, False, True, True, True, True]])
    out = to_host(mixer(tensor(x), keep=minitx.backend.xp().asarray(keep)).data)
    alone = to_host(mixer(tensor(x[:, 3:])).data)
    assert_close(out[:, 3:], alone, rtol=1e-12, atol=1e-14)
    assert_close(out, _reference(mixer, x, 0, 2, keep=keep.astype(float)), rtol=1e-10,
                 atol=1e-12)


def test_the_hooks_see_and_replace_the_decay_the_state_and_the_gate():
    mixer = _mixer(0, block=2)
    x = np.random.default_rng(5).standard_normal((2, 5, 8))
    seen = {}
    for name in ("decay", "state", "gate", "q", "z"):
        getattr(mixer, f"hook_{name}").add_hook(
            lambda t, h, name=name: seen.__setitem__(name, to_host(t.data)))
    mixer(tensor(x))
    assert seen["decay"].shape == (1, 2, 5, 5)              # one block while hooked
    lam = np.exp(-2.0 ** (-8.0 * np.arange(1, 3) / 2) * (1 + 1e-5))
    assert_close(seen["decay"][0, :, 4, 1], lam ** 3, rtol=1e-12)
    assert not seen["decay"][0, :, 1, 4].any()              # causal
    assert seen["state"].shape == (2, 2, 4, 4) and seen["gate"].shape == (2, 5, 8)
    assert seen["q"].shape == (2, 5, 2, 4) and seen["z"].shape == (2, 5, 2, 4)
    assert ((seen["gate"] > 0) & (seen["gate"] < 1)).all()
    # Λ replaced by the identity: each token reads only its own key, o_t = (q_t · k_t) v_t
    mixer2, got = _mixer(0, block=2), {}
    mixer2.hook_decay.add_hook(lambda t, h: tensor(np.ones((1, 2, 1, 1)) * np.eye(5)))
    for name in ("q", "k", "v", "z"):
        getattr(mixer2, f"hook_{name}").add_hook(
            lambda t, h, name=name: got.__setitem__(name, to_host(t.data)))
    mixer2(tensor(x))
    own = (got["q"] * got["k"]).sum(-1, keepdims=True) * got["v"]
    assert_close(got["z"], own, rtol=1e-12)
    assert not np.allclose(got["z"], seen["z"])


def test_counts_are_the_built_models():
    c = _config(num_layers=3, types=("lightning", "full", "lightning"),
                scales=((1.0, 1.0, 1.0, 1.0),) * 3)
    model = Decoder(c)
    assert count_parameters(c)["total"] == sum(int(p.data.size) for p in model.parameters())
    assert LightningMixer.parameter_count(check_config(c)) == 5 * 8 * 2 * 4 + 2 * 4
    # two lightning states H·D² (whatever the length) and one softmax cache 2·Hkv·D per token
    for tokens in (1, 10):
        assert kv_cache_bytes(c, tokens, 1) == 2 * 2 * 4 * 4 + tokens * 2 * 1 * 4
    assert kv_cache_bytes(c, 0, 1) == 0
    assert MIXERS["lightning"] is LightningMixer


@pytest.mark.parametrize("change,match", [
    (dict(mixer_options={"lightning": {"blocks": 4}}), r"unknown option 'blocks'.*'block'"),
    (dict(mixer_options={"lightning": {"block": 0}}), "block must be a positive int, got 0"),
    (dict(residual_scales=((1.0, 1.0, 1.0, 1.0),)),
     r"residual_scales must give \(α₁, β₁, α₂, β₂\) for each of the 2 layers"),
    (dict(residual_scales=((1.0, 1.0, 1.0),) * 2), "residual_scales must give"),
    (dict(residual_scales=0.5), r"residual_scales must give .* got 0\.5"),
    (dict(residual_scales=((1.0, "a", 1.0, 1.0),) * 2), "residual_scales must be a finite"),
    (dict(residual_scales=((1.0,) * 4,) * 2, norm_placement="post"),
     "with norm_placement='pre', got .* \\('post'\\)"),
])
def test_bad_options_are_refused_by_name(change, match):
    c = _config()
    for key, value in change.items():
        setattr(c, key, value)
    with pytest.raises(OptionError, match=match):
        Decoder(c)


def test_a_cache_of_another_kind_is_refused():
    mixer = _mixer(0)
    with pytest.raises(TypeError, match="kv_cache must be a RecurrentState"):
        mixer(tensor(np.zeros((1, 2, 8))), kv_cache=[])


def test_minimax_text_01_counts_match_its_model_card():
    """MiniMax-Text-01's card: 456 B parameters, 45.9 B activated per token (without the
    embedding table and the head); only its 10 softmax layers of 80 grow a cache."""
    from minitx.pretrained import families
    r = families.expert_counts("minimax")
    assert round(r["total"] / 1e9) == 456
    assert round((r["active"] - 2 * r["lookup"]) / 1e9, 1) == 45.9
    assert count_parameters(families.family_config("minimax"))["total"] == r["total"]
    c = families.family_config("minimax")
    assert c.layer_types.count("lightning") == 70
    assert families.kv_cache_bytes_per_token(c) == 10 * 2 * 8 * 128 * 2
