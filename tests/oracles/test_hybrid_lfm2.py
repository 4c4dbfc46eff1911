"""LFM2 loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only oracle): a
tiny random checkpoint built by ``Lfm2ForCausalLM`` itself — convolution layers around an
attention layer (``full_attn_idxs`` [1]), a kernel of 4 with every bias on, per-head QK-norm,
GQA 4/2, the MLP's width derived (2/3 of 48, × 1.5, rounded up to a multiple of 20: 60), an
untied head — every parameter redrawn (``decoder_util.randomize``), eps = 0.05 so an eps error
shows.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF computes its RMSNorms in float32 even in a float64 model: about 4e-7
here), float32 within 1e-4; minitx's cached decoding equals its full forward to 1e-10.
"""
import dataclasses

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import both_backward, hf_model, relative, saved_tiny  # noqa: E402
from minitx.models import PRESETS, count_parameters  # noqa: E402
from minitx.models.decoder import kv_cache_bytes, kv_cache_bytes_per_token  # noqa: E402
from minitx.models.decoder import check_config  # noqa: E402
from minitx.models.families.lfm2 import ffn_width  # noqa: E402
from minitx.pretrained.decoders import HF_DEFAULTS, decoder_config, hf_config_dict  # noqa: E402
from minitx.validate import OptionError  # noqa: E402
from support import tensor, to_host  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, norm_eps=0.05, full_attn_idxs=[1],
    conv_L_cache=4, conv_bias=True, block_ffn_dim_multiplier=1.5, block_multiple_of=20,
    tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """HF's tiny float64 depthwise conv1d spends its time synchronising threads (as
    Qwen3-Next's, ``test_hybrid_qwen3_next.py``): one thread for this module, the previous
    count restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.Lfm2Config(**CONFIG), 5, "lfm2")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    assert model.config.layer_types == ("short_conv", "full", "short_conv")
    assert model.config.ffn_hidden == 60 == hf_model(folder).model.layers[0].feed_forward.w1 \
        .out_features
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


def test_greedy_tokens_match_transformers_generate(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    prompt = IDS[:, :5]
    with torch.no_grad():
        ref = hf_model(folder).generate(torch.tensor(prompt), max_new_tokens=9,
                                        attention_mask=torch.ones(prompt.shape, dtype=int),
                                        do_sample=False, eos_token_id=None).numpy()
    out = model.generate(prompt, max_new_tokens=9).numpy()
    assert ref.shape == out.shape == (2, 14)
    assert np.array_equal(out, ref)
    assert np.array_equal(model.generate(prompt, 9, use_cache=False).numpy(), out)


def test_cached_decoding_equals_the_full_forward(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    assert [len(c) for c in caches] == [11, 11, 11]
    # a convolution layer keeps its last K − 1 = 3 products b ⊙ x̃, E each
    assert caches[0].state.shape == (2, 3, 32)
    # the one attention layer's K and V grow, 2·Hkv·D = 32 numbers a token; the two
    # convolution layers hold (K − 1)·E = 96 numbers each, whatever the length
    assert kv_cache_bytes_per_token(model.config, 8) == 32 * 8
    assert kv_cache_bytes(model.config, 11, 8) == (11 * 32 + 2 * 96) * 8
    assert caches[1].keys.shape == (2, 2, 11, 8)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_masked_as_transformers_masks_it(folder, side):
    """attention_mask as HF's forward reads it: the convolution layers' inputs at padding
    are zeroed, the attention layer hides padding keys; logits at padding positions mean
    nothing to either library. Left-padded greedy decoding equals HF's ``generate``."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    mask = np.ones_like(IDS)
    if side == "left":
        mask[0, :3] = 0
    else:
        mask[0, -3:] = 0
    real = mask.astype(bool)
    with torch.no_grad():
        expected = ref(torch.tensor(IDS), attention_mask=torch.tensor(mask)).logits.numpy()
    got = model(IDS, attention_mask=mask).numpy()
    assert relative(got[real], expected[real]) <= TOL["float64"]
    if side == "left":
        with torch.no_grad():
            theirs = ref.generate(torch.tensor(IDS[:, :6]), max_new_tokens=6,
                                  attention_mask=torch.tensor(mask[:, :6]), do_sample=False,
                                  eos_token_id=None).numpy()
        mine = model.generate(IDS[:, :6], 6, attention_mask=mask[:, :6]).numpy()
        assert np.array_equal(mine, theirs)


def test_hooks_hold_transformers_streams_and_hidden_states(folder):
    """``hook_b``, ``hook_c``, ``hook_x`` are the three thirds of HF's ``in_proj`` output, in
    HF's order [B; C; x]; each block's ``hook_resid_post`` is HF's hidden state. 1e-6: HF's
    input norm runs in float32, so its projections differ from minitx's float64 ones by
    about 1e-7."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    seen = {}
    ref.model.layers[0].conv.in_proj.register_forward_hook(
        lambda m, i, o: seen.__setitem__("bcx", o))
    with torch.no_grad():
        states = ref(torch.tensor(IDS), output_hidden_states=True).hidden_states
    b, c, x = seen["bcx"].chunk(3, dim=-1)
    _, cache = model.run_with_cache(IDS)
    for name, theirs in (("b", b), ("c", c), ("x", x)):
        assert relative(cache[f"blocks.0.attn.hook_{name}"].numpy(), theirs.numpy()) <= 1e-6
    assert cache["blocks.0.attn.hook_state"].shape == (2, 3, 32)
    for i in range(len(model.blocks) - 1):
        mine = cache[f"blocks.{i}.hook_resid_post"].numpy()
        assert relative(mine, states[i + 1].numpy()) <= TOL["float64"], i


def test_a_training_step_has_torchs_gradients(folder):
    """Every parameter's gradient, the convolution's weights and biases included, as
    torch's, within the dense families' 1e-5."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS)
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(hf_grads, model)
    assert set(mapped) == set(mine)
    assert "blocks.0.attn.conv.bias" in mapped
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-5, key


def test_state_and_config_round_trip_to_transformers(folder):
    """``decoder_state_to_hf`` gives HF's state dict back, key for key and bit for bit;
    ``hf_config_dict`` a config.json that reads back to the same switches and that
    transformers builds into the same model."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
    back = pt.decoder_state_to_hf(model.state_dict(), model)
    assert set(back) == set(theirs)
    for key, value in back.items():
        assert np.array_equal(np.asarray(value), theirs[key]), key
    d = hf_config_dict(model.config)
    assert d["model_type"] == "lfm2"
    assert dataclasses.asdict(check_config(decoder_config(d))) == \
        dataclasses.asdict(model.config)
    rebuilt = transformers.AutoModelForCausalLM.from_config(
        transformers.Lfm2Config(**{k: v for k, v in d.items() if k != "model_type"})).double()
    rebuilt.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in back.items()})
    with torch.no_grad():
        again = rebuilt.eval()(torch.tensor(IDS)).logits.numpy()
        first = ref(torch.tensor(IDS)).logits.numpy()
    assert np.array_equal(again, first)


def test_count_parameters_is_transformers_count(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    counted = count_parameters(model.config)
    assert counted["total"] == sum(p.numel() for p in hf_model(folder).parameters())
    assert counted["total"] == sum(p.size for p in model.parameters())


@pytest.mark.parametrize("sizes", [
    dict(intermediate_size=12288), dict(intermediate_size=6656),
    dict(intermediate_size=100, block_ffn_dim_multiplier=2),
    dict(intermediate_size=100, block_auto_adjust_ff_dim=False),
    dict(intermediate_size=90, block_ffn_dim_multiplier=1.3, block_multiple_of=7)])
def test_the_mlp_width_is_hfs(sizes):
    """``ffn_width`` against the width HF's ``Lfm2MLP`` builds."""
    cfg = transformers.Lfm2Config(hidden_size=8, num_attention_heads=2, **sizes)
    width = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(cfg).w1.out_features
    assert ffn_width({**HF_DEFAULTS["lfm2"], **sizes}) == width


def test_config_defaults_spellings_and_refusals():
    """Without layer_types or full_attn_idxs every layer attends (HF's default); the older
    spellings ``block_ff_dim`` and ``tie_embedding`` win over the new ones, as in HF; Liquid's
    own keys, which HF never reads, are accepted; an unknown layer type or a bias switch HF's
    LFM2 does not have is refused by name."""
    cfg = {**CONFIG, "model_type": "lfm2"}
    del cfg["full_attn_idxs"]
    hf = transformers.Lfm2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert hf.layer_types == ["full_attention"] * 3                       # HF's default
    assert decoder_config(cfg).layer_types == ("full",) * 3
    old = {**cfg, "block_ff_dim": 96, "tie_embedding": True}
    hf = transformers.Lfm2Config(**{k: v for k, v in old.items() if k != "model_type"})
    c = decoder_config(old)
    assert (c.ffn_hidden, c.tie_embeddings) == (ffn_width({**HF_DEFAULTS["lfm2"], **cfg,
                                                               "intermediate_size": 96}),
                                                hf.tie_word_embeddings) == (100, True)
    assert hf.intermediate_size == 96
    decoder_config({**cfg, "block_dim": 32, "theta": 1e6, "use_pos_enc": True})
    with pytest.raises(OptionError, match="layer_types"):
        decoder_config({**cfg, "layer_types": ["conv", "sliding_attention", "conv"]})
    for key in ("attention_bias", "mlp_bias"):
        with pytest.raises(OptionError, match=key):
            decoder_config({**cfg, key: True})


def test_to_torch_gives_lfm2_with_the_same_logits_and_back(folder):
    """``interop.to_torch`` builds HF's LFM2 from the decoder's switches and tensors;
    ``from_torch`` brings it back unchanged."""
    import minitx.interop as interop
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "Lfm2ForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        assert np.array_equal(to_host(back.state_dict()[key]), to_host(value)), key


def test_the_mixer_equals_hfs_short_conv_module_step_by_step():
    """HF's ``Lfm2ShortConv`` itself, its weights copied into ``ShortConvMixer``: a prompt
    through both, then one token at a time through each one's cache (HF's ``DynamicCache``,
    minitx's ``RecurrentState``), float64, equal to 1e-12."""
    from minitx.models.mixers.short_conv import ShortConvMixer
    cfg = transformers.Lfm2Config(**{**CONFIG, "num_hidden_layers": 1,
                                     "layer_types": ["conv"]})
    cfg.full_attn_idxs = []
    torch.manual_seed(3)
    theirs = transformers.models.lfm2.modeling_lfm2.Lfm2ShortConv(cfg, 0).double()
    mine = ShortConvMixer(decoder_config({**CONFIG, "model_type": "lfm2",
                                          "full_attn_idxs": [], "num_hidden_layers": 1}))
    mine.to(dtype="float64")
    for name, p in theirs.named_parameters():
        dict(mine.named_parameters())[name].data[...] = tensor(p.detach().numpy()).data
    x = np.random.default_rng(4).standard_normal((2, 7, 32))
    with torch.no_grad():
        want = theirs(torch.tensor(x)).numpy()
    got = mine(minitx.tensor(x)).numpy()
    assert relative(got, want) <= 1e-12
    cache, steps = mine.new_cache(), []
    for lo, hi in ((0, 3), (3, 4), (4, 5), (5, 7)):
        steps.append(mine(minitx.tensor(x[:, lo:hi]), kv_cache=cache).numpy())
    assert relative(np.concatenate(steps, axis=1), want) <= 1e-12


def test_a_preset_counts_as_its_name_says():
    """LFM2-1.2B, counted from its configuration: 1,170,340,608 parameters (the name's 1.2B),
    by hand: the tied embedding 65536·2048; sixteen SwiGLU MLPs 3·2048·8192; ten convolution
    layers 4·2048² + 3·2048; six attention layers 2·2048² + 2·2048·512 + 2·64; 33 norms of
    2048. Its six attention layers' K and V are the only cache that grows."""
    c = PRESETS["LFM2-1.2B"]
    assert c.layer_types.count("full") == 6 and c.layer_types.count("short_conv") == 10
    assert c.ffn_hidden == 8192
    by_hand = (65536 * 2048 + 16 * 3 * 2048 * 8192 + 10 * (4 * 2048 ** 2 + 3 * 2048)
               + 6 * (2 * 2048 ** 2 + 2 * 2048 * 512 + 2 * 64) + 33 * 2048)
    assert count_parameters(c)["total"] == by_hand == 1_170_340_608
    assert kv_cache_bytes_per_token(c) == 6 * 2 * 8 * 64 * 2          # bfloat16
