"""Qwen3.5, dense (``qwen3_5_text``) and mixture of experts (``qwen3_5_moe_text``), loaded by
``minitx.pretrained.load`` against ``transformers`` (the test-only oracle): tiny random
checkpoints built by ``Qwen3_5ForCausalLM`` and ``Qwen3_5MoeForCausalLM`` themselves — gated
DeltaNet layers with split projections around a gated attention layer, 4 value heads sharing
2 key heads, a convolution of kernel 3, half of each head rotated under an M-RoPE section
[1, 1, 0]; a dense SwiGLU, or 2 of 4 experts with a sigmoid-gated shared expert — every
parameter redrawn (``decoder_util.randomize``), eps = 0.05 so an eps error shows.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest, float32 within 1e-4. HF computes in float32 even in a float64 model: the
delta rule, the gated norm and the decay, its RMSNorms, the rotary tables, and the MoE
router's softmax; measured here 1.2e-6 (dense) and 4.0e-6 (MoE: the float32 rounding of
each layer adds up through the experts), float32 4.5e-6 and 1.2e-5. minitx's cached
decoding equals its full forward to 1e-10.
"""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.interop as interop  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import both_backward, hf_model, relative, saved_tiny  # noqa: E402
from minitx.models import PRESETS, Decoder, count_parameters  # noqa: E402
from minitx.models.decoder import check_config, kv_cache_bytes_per_token  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from minitx.validate import OptionError  # noqa: E402
from support import tensor, to_host  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=0.05,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6,
    linear_value_head_dim=5, linear_conv_kernel_dim=3)
MOE = dict({k: v for k, v in CONFIG.items() if k != "intermediate_size"}, num_experts=4,
           num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=12)
KINDS = {"qwen3_5_text": (transformers.Qwen3_5TextConfig, CONFIG),
         "qwen3_5_moe_text": (transformers.Qwen3_5MoeTextConfig, MOE)}
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
def folders(tmp_path_factory):
    return {kind: saved_tiny(tmp_path_factory, cls(**cfg), 5, kind)
            for kind, (cls, cfg) in KINDS.items()}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_logits_match_transformers(folders, kind, dtype):
    model, _ = pt.load(folders[kind], dtype=dtype, tokenizer=False)
    assert model.config.layer_types == ("gated_deltanet", "full", "gated_deltanet")
    assert model.config.mlp == ("moe" if "moe" in kind else "swiglu")
    assert model.config.mixer_options["gated_deltanet"]["projections"] == "split"
    with torch.no_grad():
        ref = hf_model(folders[kind], dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_greedy_tokens_match_transformers_generate(folders, kind):
    model, _ = pt.load(folders[kind], dtype="float64", tokenizer=False)
    prompt = IDS[:, :5]
    with torch.no_grad():
        ref = hf_model(folders[kind]).generate(
            torch.tensor(prompt), max_new_tokens=9, do_sample=False, eos_token_id=None,
            attention_mask=torch.ones(prompt.shape, dtype=int)).numpy()
    out = model.generate(prompt, max_new_tokens=9).numpy()
    assert ref.shape == out.shape == (2, 14)
    assert np.array_equal(out, ref)
    assert np.array_equal(model.generate(prompt, 9, use_cache=False).numpy(), out)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cached_decoding_equals_the_full_forward(folders, kind):
    model, _ = pt.load(folders[kind], dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    assert [len(c) for c in caches] == [11, 11, 11]
    # the linear layers keep K − 1 = 2 convolution inputs and S (H_v, D_k, D_v)
    assert caches[0].conv.shape == (2, 2, 2 * 2 * 6 + 4 * 5)
    assert caches[0].state.shape == (2, 4, 6, 5)
    # the one attention layer's K and V grow: 2·Hkv·D = 32 numbers a token
    assert kv_cache_bytes_per_token(model.config, 8) == 32 * 8


def test_left_padding_is_masked_as_transformers_masks_it(folders):
    """The linear layers' inputs at padding are zeroed, the attention layer hides padding
    keys; left-padded greedy decoding equals HF's ``generate``."""
    folder = folders["qwen3_5_text"]
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    mask = np.ones_like(IDS)
    mask[0, :3] = 0
    with torch.no_grad():
        expected = ref(torch.tensor(IDS), attention_mask=torch.tensor(mask)).logits.numpy()
        theirs = ref.generate(torch.tensor(IDS[:, :6]), max_new_tokens=6, do_sample=False,
                              attention_mask=torch.tensor(mask[:, :6]),
                              eos_token_id=None).numpy()
    got = model(IDS, attention_mask=mask).numpy()
    assert relative(got[mask.astype(bool)], expected[mask.astype(bool)]) <= TOL["float64"]
    assert np.array_equal(model.generate(IDS[:, :6], 6, attention_mask=mask[:, :6]).numpy(),
                          theirs)


def test_mrope_on_text_positions_is_the_one_dimensional_rope(folders):
    """HF's M-RoPE reads a time, a height and a width position id, interleaved over the
    rotated frequencies; for text the three are the token's position, and its tables are
    cos/sin(m·ω_j) with ω_j = θ^(−2j/R), R = D/2 here: the plain rope minitx runs. Given to
    HF's whole model as explicit (3, B, N) ids, equal ids give minitx's logits; height ids of
    their own move them (frequency 1 reads the height, section [1, 1, 0]: the sections do
    change the maths once the ids differ)."""
    folder = folders["qwen3_5_text"]
    ref = hf_model(folder)
    rope = ref.model.rotary_emb
    pos = torch.arange(11)[None].expand(2, 11)
    x = torch.zeros(1, dtype=torch.float64)
    cos, sin = rope(x, pos)
    omega = 500.0 ** (-np.arange(0, 4, 2) / 4)                           # R = 8 · 0.5 = 4
    angles = np.arange(11)[:, None] * omega                              # (N, R/2)
    assert relative(cos[0].numpy(), np.cos(np.concatenate([angles, angles], -1))) < 1e-6
    assert relative(sin[0].numpy(), np.sin(np.concatenate([angles, angles], -1))) < 1e-6
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    mine = model(IDS).numpy()
    with torch.no_grad():
        same = ref(torch.tensor(IDS), position_ids=pos[None].expand(3, 2, 11)).logits.numpy()
        apart = torch.stack([pos, 3 * pos, pos])          # heights of their own (a shift would
        # not do: every id moved alike leaves the offsets, and so the scores, as they were)
        moved = ref(torch.tensor(IDS), position_ids=apart).logits.numpy()
    assert relative(mine, same) <= TOL["float64"]
    assert relative(mine, moved) > 1e-3


def test_moe_training_step_has_torchs_gradients(folders):
    """Every parameter's gradient after a cross-entropy step, the experts', the router's,
    the shared expert's gate, the split projections', the conv's, A_log's and dt_bias's
    included, as torch's. 1e-4, not the dense families' 1e-5: HF runs the delta rule, the
    gated norm, the decay and the router in float32 even in a float64 model (measured up to
    3.0e-5 relative here, on ``blocks.0.ln1.weight``)."""
    folder = folders["qwen3_5_moe_text"]
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS)
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(hf_grads, model)
    assert set(mapped) == set(mine)
    assert {"blocks.0.attn.in_proj_qkv.weight", "blocks.0.mlp.experts.gate_proj"} <= set(mapped)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-4, key


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_state_and_config_round_trip_to_transformers(folders, kind):
    """``decoder_state_to_hf`` gives HF's state dict back, key for key and bit for bit (the
    files' per-expert spelling too); ``hf_config_dict`` a config.json that reads back to the
    same switches and that transformers builds into the same model."""
    model, _ = pt.load(folders[kind], dtype="float64", tokenizer=False)
    ref = hf_model(folders[kind])
    theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
    back = pt.decoder_state_to_hf(model.state_dict(), model)
    assert set(back) == set(theirs)
    for key, value in back.items():
        assert np.array_equal(np.asarray(value), theirs[key]), key
    files = pt.load_weights(folders[kind], dtype="float64")
    written = pt.decoder_state_to_hf(model.state_dict(), model, files=True)
    assert set(written) == set(files)
    d = hf_config_dict(model.config)
    assert d["model_type"] == kind
    assert dataclasses.asdict(check_config(decoder_config(d))) == \
        dataclasses.asdict(model.config)
    cls = KINDS[kind][0]
    rebuilt = transformers.AutoModelForCausalLM.from_config(
        cls(**{k: v for k, v in d.items() if k != "model_type"}),
        experts_implementation="eager").double()
    rebuilt.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in back.items()})
    with torch.no_grad():
        again = rebuilt.eval()(torch.tensor(IDS)).logits.numpy()
        first = ref(torch.tensor(IDS)).logits.numpy()
    assert np.array_equal(again, first)


def test_the_multimodal_files_text_model_loads_and_the_rest_is_skipped(folders):
    """The released checkpoints hold the text model under ``model.language_model.``, beside
    the vision tower and the multi-token prediction layers; HF's causal LM skips those, and
    so does minitx."""
    model, _ = pt.load(folders["qwen3_5_moe_text"], dtype="float64", tokenizer=False)
    files = pt.load_weights(folders["qwen3_5_moe_text"], dtype="float64")
    released = {k.replace("model.", "model.language_model.", 1): v for k, v in files.items()}
    released["model.visual.patch_embed.proj.weight"] = np.zeros((4, 3))
    released["mtp.fc.weight"] = np.zeros((4, 4))
    state = pt.decoder_state_from_hf(released, model)
    assert set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert np.array_equal(np.asarray(state[key]), to_host(value)), key


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_count_parameters_is_transformers_count(folders, kind):
    model, _ = pt.load(folders[kind], dtype="float64", tokenizer=False)
    counted = count_parameters(model.config)
    assert counted["total"] == sum(p.numel() for p in hf_model(folders[kind]).parameters())
    assert counted["total"] == sum(p.size for p in model.parameters())


def test_config_defaults_and_refusals():
    """Without layer_types HF's default (every 4th layer full), without partial_rotary_factor
    HF's 0.25; the keys HF's classes never read must hold what HF runs; a dense config with
    experts, a bad M-RoPE section, are refused by name."""
    cfg = {**CONFIG, "model_type": "qwen3_5_text", "num_hidden_layers": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    del cfg["layer_types"]
    hf = transformers.Qwen3_5TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert hf.layer_types[3] == "full_attention" and \
        hf.rope_parameters["partial_rotary_factor"] == 0.25                 # HF's defaults
    c = decoder_config(cfg)
    assert c.layer_types == ("gated_deltanet",) * 3 + ("full",)
    assert c.rope["partial_rotary_factor"] == 0.25
    assert Decoder(c).blocks[3].attn.rotary.rotary_dim == 2
    # the released files' extra keys, at the values HF's model runs anyway
    released = {"attn_output_gate": True, "mlp_only_layers": [], "mamba_ssm_dtype": "float32",
                "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}
    assert decoder_config({**cfg, **released}) == c
    for key, value in (("attn_output_gate", False), ("mlp_only_layers", [1]),
                       ("mamba_ssm_dtype", "bfloat16")):
        with pytest.raises(OptionError, match=key):
            decoder_config({**cfg, key: value})
    for key in ("num_experts", "sliding_window"):
        with pytest.raises(OptionError, match=key):
            decoder_config({**cfg, key: 4})
    with pytest.raises(OptionError, match="mrope_section"):
        decoder_config({**cfg, "rope_parameters": {"rope_theta": 500.0,
                                                   "mrope_section": [2, 2]}})
    moe = {**MOE, "model_type": "qwen3_5_moe_text"}
    assert decoder_config({**moe, "norm_topk_prob": True, "decoder_sparse_step": 1}) == \
        decoder_config(moe)
    assert decoder_config(moe).moe_options["norm_topk_prob"] is True
    for key, value in (("norm_topk_prob", False), ("decoder_sparse_step", 2),
                       ("mlp_only_layers", [0])):
        with pytest.raises(OptionError, match=key):
            decoder_config({**moe, key: value})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_to_torch_gives_qwen3_5_with_the_same_logits_and_back(folders, kind):
    """``interop.to_torch`` builds HF's Qwen3.5 from the decoder's switches and tensors;
    ``from_torch`` brings it back unchanged."""
    model, _ = pt.load(folders[kind], dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == ("Qwen3_5MoeForCausalLM" if "moe" in kind else
                                     "Qwen3_5ForCausalLM")
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        assert np.array_equal(to_host(back.state_dict()[key]), to_host(value)), key


def _by_hand(vocab, e, layers, heads, kv, d, hk, hv, dk, dv, conv, mlp):
    """Parameters of a Qwen3.5 of these sizes, written out: the untied embeddings; per
    attention layer q (with its gate), k, v, o and the two head norms; per DeltaNet layer
    W_qkv, W_z, W_b, W_a, the convolution, A_log, δ, the gated norm and out_proj; ``mlp``
    per layer; two norms a layer and the final one."""
    c = 2 * hk * dk + hv * dv
    attention = e * 2 * heads * d + 2 * e * kv * d + heads * d * e + 2 * d
    deltanet = e * c + e * hv * dv + 2 * e * hv + c * conv + 2 * hv + dv + hv * dv * e
    full = layers // 4
    return (2 * vocab * e + full * attention + (layers - full) * deltanet + layers * mlp
            + (2 * layers + 1) * e)


def test_the_presets_count_as_their_names_say():
    """Qwen3.5-35B-A3B: 34,660,610,688 parameters (35B), 3,454,988,928 active (A3B: each
    token skips 248 of 256 experts in 40 layers); Qwen3.5-27B: 26,895,998,464 (27B). Both
    counted by hand (``_by_hand``); only the full layers' K and V grow, 2·Hkv·D a token."""
    moe = PRESETS["Qwen3.5-35B-A3B"]
    assert moe.layer_types.count("full") == 10 and moe.layer_types[3] == "full"
    expert = 3 * 2048 * 512
    layer_mlp = 256 * expert + 256 * 2048 + expert + 2048          # experts, router, shared
    total = _by_hand(248320, 2048, 40, 16, 2, 256, 16, 32, 128, 128, 4, layer_mlp)
    counted = count_parameters(moe)
    assert counted["total"] == total == 34_660_610_688
    assert counted["active"] == total - 40 * 248 * expert == 3_454_988_928
    assert kv_cache_bytes_per_token(moe) == 10 * 2 * 2 * 256 * 2             # bfloat16
    dense = PRESETS["Qwen3.5-27B"]
    total = _by_hand(248320, 5120, 64, 24, 4, 256, 16, 48, 128, 128, 4, 3 * 5120 * 17408)
    assert count_parameters(dense)["total"] == count_parameters(dense)["active"] == total \
        == 26_895_998_464
    assert kv_cache_bytes_per_token(dense) == 16 * 2 * 4 * 256 * 2


@settings(deadline=None, max_examples=6)
@given(hk=st.integers(1, 2), r=st.integers(1, 3), dk=st.integers(2, 5), dv=st.integers(2, 5),
       kernel=st.integers(2, 4), n=st.integers(1, 9))
def test_the_mixer_equals_hfs_deltanet_module_step_by_step(hk, r, dk, dv, kernel, n):
    """HF's ``Qwen3_5GatedDeltaNet`` itself, every weight redrawn and copied by name into
    ``GatedDeltaNetMixer`` with ``projections="split"``: a prompt through both, then minitx
    one token at a time through its cache. 1e-5, as the logits': HF's delta rule and gated
    norm run in float32, whose rounding (6e-8 a step) accumulates over the recurrence (OLMo-
    Hybrid's same test measured up to 1.6e-6 relative)."""
    from minitx.models.mixers.gated_deltanet import GatedDeltaNetMixer
    sizes = dict(linear_num_key_heads=hk, linear_num_value_heads=hk * r, linear_key_head_dim=dk,
                 linear_value_head_dim=dv, linear_conv_kernel_dim=kernel)
    torch.manual_seed(n)
    theirs = transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5GatedDeltaNet(
        transformers.Qwen3_5TextConfig(**{**CONFIG, **sizes}), 0).double()
    mine = GatedDeltaNetMixer(decoder_config({**CONFIG, **sizes, "model_type": "qwen3_5_text"}))
    mine.to(dtype="float64")
    params = dict(mine.named_parameters())
    assert set(params) == {k for k, _ in theirs.named_parameters()}
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.4)
            params[name].copy_(p.numpy())
    x = np.random.default_rng(n).standard_normal((2, n, 32))
    with torch.no_grad():
        want = theirs(torch.tensor(x)).numpy()
    assert relative(mine(tensor(x)).numpy(), want) <= 1e-5
    cache = mine.new_cache()
    steps = [mine(tensor(x[:, i:i + 1]), kv_cache=cache).numpy() for i in range(n)]
    assert relative(np.concatenate(steps, axis=1), want) <= 1e-5
