"""OLMo-Hybrid loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle): tiny random checkpoints built by ``OlmoHybridForCausalLM`` itself — two pre-norm
gated DeltaNet layers (separate q, k, v, gate, b and a projections, 4 value heads sharing 2
key heads, a convolution of kernel 3, β = 2σ(b)) around an OLMo 3 post-norm attention layer
(QK-norm over the projection, GQA 4/2) — with a rope of θ = 500, without one (NoPE: the
released checkpoints' null θ), and with β = σ(b); every parameter redrawn
(``decoder_util.randomize``), eps = 0.05 so an eps error shows (the gated norm's stays 1e-5,
as HF's).

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF runs the delta rule, the gated norm, the decay, its RMSNorms and its rotary
tables in float32 even in a float64 model: measured 3.3e-6 with the rope, 1.6e-6 without,
1.1e-6 with β = σ(b)), float32 within 1e-4 (7.9e-6, 3.3e-6, 4.1e-6);
minitx's cached decoding equals its full forward to 1e-10.
"""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx  # noqa: E402
import minitx.interop as interop  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import both_backward, hf_model, relative, saved_tiny  # noqa: E402
from minitx.models import PRESETS, DecoderBlock, count_parameters  # noqa: E402
from minitx.models.block_features import PostNorm  # noqa: E402
from minitx.models.decoder import check_config, kv_cache_bytes_per_token  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from minitx.validate import OptionError  # noqa: E402
from support import tensor, to_host  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=0.05,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6,
    linear_value_head_dim=5, linear_conv_kernel_dim=3)
CASES = {"rope": {}, "nope": dict(rope_parameters={"rope_type": "default", "rope_theta": None}),
         "beta1": dict(linear_allow_neg_eigval=False)}
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
    return {name: saved_tiny(tmp_path_factory,
                             transformers.OlmoHybridConfig(**{**CONFIG, **extra}), 7, name)
            for name, extra in CASES.items()}


@pytest.mark.parametrize("case, dtype", [("rope", "float64"), ("rope", "float32"),
                                         ("nope", "float64"), ("nope", "float32"),
                                         ("beta1", "float64")])
def test_logits_match_transformers(folders, case, dtype):
    model, _ = pt.load(folders[case], dtype=dtype, tokenizer=False)
    c = model.config
    assert c.layer_types == ("gated_deltanet", "full", "gated_deltanet")
    assert c.positions == ("none" if case == "nope" else "rope")
    assert c.mixer_options["gated_deltanet"]["allow_neg_eigval"] is (case != "beta1")
    ref = hf_model(folders[case], dtype)
    assert (ref.model.rotary_emb is None) is (case == "nope")
    with torch.no_grad():
        want = ref(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == want.shape
    assert relative(logits.numpy(), want) <= TOL[dtype]


def test_deltanet_layers_are_pre_norm_and_attention_layers_post_norm(folders):
    """OLMo-Hybrid's two layers, each with the norms its formula names: Llama's h + F(Norm h)
    around the DeltaNet, OLMo 3's h + Norm(F(h)) around attention; the gated norm's eps is
    1e-5, not the config's 0.05."""
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    linear, attention = model.blocks[0], model.blocks[1]
    assert type(linear) is DecoderBlock and type(attention) is PostNorm
    assert linear.ln1 is not None and linear.ln2 is not None
    assert attention.ln1 is None and attention.ln2 is None
    assert linear.attn.norm.eps == 1e-5 and linear.ln1.eps == 0.05


def test_hooks_hold_transformers_beta_and_hidden_states(folders):
    """``hook_beta`` is 2σ(b) from HF's own ``b_proj`` output — above 1 somewhere, so the
    doubling shows — and σ(b) with ``linear_allow_neg_eigval`` false; each block's
    ``hook_resid_post`` is HF's hidden state. 1e-6: HF's input norm runs in float32."""
    for case, scale in (("rope", 2.0), ("beta1", 1.0)):
        model, _ = pt.load(folders[case], dtype="float64", tokenizer=False)
        ref = hf_model(folders[case])
        seen = {}
        ref.model.layers[0].linear_attn.b_proj.register_forward_hook(
            lambda m, i, o: seen.__setitem__("b", o))
        with torch.no_grad():
            states = ref(torch.tensor(IDS), output_hidden_states=True).hidden_states
        beta = scale * torch.sigmoid(seen["b"]).transpose(1, 2).numpy()
        _, cache = model.run_with_cache(IDS)
        mine = cache["blocks.0.attn.hook_beta"].numpy()
        assert relative(mine, beta) <= 1e-6
        assert bool(mine.max() > 1.0) is (scale == 2.0)
        for i in range(len(model.blocks) - 1):
            assert relative(cache[f"blocks.{i}.hook_resid_post"].numpy(),
                            states[i + 1].numpy()) <= TOL["float64"], i


def test_greedy_tokens_match_transformers_generate(folders):
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    prompt = IDS[:, :5]
    with torch.no_grad():
        ref = hf_model(folders["rope"]).generate(
            torch.tensor(prompt), max_new_tokens=9, do_sample=False, eos_token_id=None,
            attention_mask=torch.ones(prompt.shape, dtype=int)).numpy()
    out = model.generate(prompt, max_new_tokens=9).numpy()
    assert ref.shape == out.shape == (2, 14)
    assert np.array_equal(out, ref)
    assert np.array_equal(model.generate(prompt, 9, use_cache=False).numpy(), out)


@pytest.mark.parametrize("case", ["rope", "nope"])
def test_cached_decoding_equals_the_full_forward(folders, case):
    model, _ = pt.load(folders[case], dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    assert [len(c) for c in caches] == [11, 11, 11]
    # a DeltaNet layer keeps K − 1 = 2 convolution inputs and S (H_v, D_k, D_v)
    assert caches[0].conv.shape == (2, 2, 2 * 2 * 6 + 4 * 5)
    assert caches[0].state.shape == (2, 4, 6, 5)
    # the attention layer's K and V grow, 2·Hkv·D = 32 numbers a token
    assert kv_cache_bytes_per_token(model.config, 8) == 32 * 8


def test_left_padding_is_masked_as_transformers_masks_it(folders):
    """The DeltaNet layers' inputs at padding are zeroed, the attention layer hides padding
    keys; left-padded greedy decoding equals HF's ``generate``."""
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    ref = hf_model(folders["rope"])
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


def test_a_training_step_has_torchs_gradients(folders):
    """Every parameter's gradient, the stacked q, k, v projection's and the convolution's
    included, as torch's. 1e-4, as Qwen3-Next's: HF runs the delta rule, the gated norm and
    the decay in float32 even in a float64 model (measured up to 9.5e-6 relative here)."""
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folders["rope"]).train()
    hf_grads = both_backward(model, ref, IDS)
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(hf_grads, model)
    assert set(mapped) == set(mine)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-4, key


@pytest.mark.parametrize("case", ["rope", "nope"])
def test_the_tensors_and_config_go_back_as_transformers_holds_them(folders, case):
    """The files' spelling (three convolutions, ``attention_layer_norm``,
    ``feedforward_layer_norm``) bit for bit, and transformers 5's module's, which
    ``load_state_dict`` takes strictly; ``hf_config_dict`` reads back to the same switches
    and transformers builds it into the same model (no rotary module for NoPE).

    The three convolutions are cut at q's, k's and v's channels (H_k·D_k = 12, 12, H_v·D_v =
    20 here): HF's ``save_pretrained`` undoes its stacking by equal thirds (15, 15, 14), so
    its files' pieces differ from minitx's while their stack is the same."""
    model, _ = pt.load(folders[case], dtype="float64", tokenizer=False)
    state = {k: to_host(v) for k, v in model.state_dict().items()}
    files = pt.load_weights(folders[case], dtype="float64")
    back = pt.decoder_state_to_hf(state, model, files=True)
    assert set(back) == set(files)
    convs = [f"model.layers.{i}.linear_attn.{p}_conv1d.weight" for i in (0, 2) for p in "qkv"]
    for key, value in files.items():
        if key not in convs:
            assert np.array_equal(np.asarray(back[key]), value), key
    for stem in (convs[:3], convs[3:]):
        assert [np.shape(back[k])[0] for k in stem] == [12, 12, 20]
        assert [files[k].shape[0] for k in stem] == [15, 15, 14]
        assert np.array_equal(np.concatenate([back[k] for k in stem]),
                              np.concatenate([files[k] for k in stem]))
    ref = hf_model(folders[case])
    mods = pt.decoder_state_to_hf(state, model)
    assert set(mods) == set(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert np.array_equal(value.numpy(), np.asarray(mods[key])), key
    d = hf_config_dict(model.config)
    assert d["model_type"] == "olmo_hybrid"
    assert dataclasses.asdict(check_config(decoder_config(d))) == \
        dataclasses.asdict(model.config)
    rebuilt = transformers.AutoModelForCausalLM.from_config(transformers.OlmoHybridConfig(
        **{k: v for k, v in d.items() if k != "model_type"})).double().eval()
    assert (rebuilt.model.rotary_emb is None) is (case == "nope")
    rebuilt.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in mods.items()},
                            strict=True)
    with torch.no_grad():
        again = rebuilt(torch.tensor(IDS)).logits.numpy()
        first = ref(torch.tensor(IDS)).logits.numpy()
    assert np.array_equal(again, first)


def test_to_torch_gives_olmo_hybrid_with_the_same_logits_and_back(folders):
    """``interop.to_torch`` builds HF's OLMo-Hybrid from the decoder's switches and tensors;
    ``from_torch`` brings it back unchanged."""
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "OlmoHybridForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        assert np.array_equal(to_host(back.state_dict()[key]), to_host(value)), key


def test_count_parameters_is_transformers_count(folders):
    model, _ = pt.load(folders["rope"], dtype="float64", tokenizer=False)
    counted = count_parameters(model.config)
    assert counted["total"] == sum(p.numel() for p in hf_model(folders["rope"]).parameters())
    assert counted["total"] == sum(p.size for p in model.parameters())


def test_config_defaults_and_refusals():
    """Without layer_types HF's default (every 4th layer attends, else the last), without
    the DeltaNet's sizes HF's (the attention's heads, D_k = ⌊0.75·E/H_k⌋, D_v = 2·D_k);
    the initialisation keys change nothing; a model of one layer type, a sliding layer, a
    partial rotation are refused by name."""
    sizes = {k: v for k, v in CONFIG.items() if not k.startswith("linear_") and
             k != "layer_types"}
    cfg = {**sizes, "model_type": "olmo_hybrid"}
    for n, full in ((2, (1,)), (5, (3,)), (8, (3, 7))):
        hf = transformers.OlmoHybridConfig(**{**sizes, "num_hidden_layers": n})
        c = decoder_config({**cfg, "num_hidden_layers": n})
        assert [i for i, t in enumerate(c.layer_types) if t == "full"] == list(full) == \
            [i for i, t in enumerate(hf.layer_types) if t == "full_attention"]
    opts = c.mixer_options["gated_deltanet"]
    assert (opts["num_k_heads"], opts["num_v_heads"], opts["head_k_dim"], opts["head_v_dim"]) \
        == (hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
            hf.linear_value_head_dim) == (4, 4, 6, 12)
    init = {"linear_a_log_min": 1.0, "linear_dt_max": 0.5, "linear_dt_init_floor": 0.01}
    assert decoder_config({**cfg, **init}) == decoder_config(cfg)
    for types in (["linear_attention"] * 3, ["full_attention"] * 3):
        with pytest.raises(OptionError, match="layer_types"):
            decoder_config({**cfg, "layer_types": types})
    with pytest.raises(OptionError, match="layer_types"):
        decoder_config({**cfg, "layer_types": ["linear_attention", "sliding_attention",
                                               "full_attention"]})
    with pytest.raises(OptionError, match="partial_rotary_factor"):
        decoder_config({**cfg, "rope_parameters": {"rope_theta": 500.0,
                                                   "partial_rotary_factor": 0.5}})


def test_the_preset_counts_as_transformers_builds_it():
    """OLMo-Hybrid-7B (HF's class defaults): 7,430,870,688 parameters, counted by HF's own
    model built on the meta device (no memory); its 8 attention layers' K and V are the only
    cache that grows, 2·30·128 numbers a token each."""
    c = PRESETS["OLMo-Hybrid-7B"]
    assert c.layer_types.count("full") == 8 and c.layer_types[3] == "full"
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.OlmoHybridConfig())
    assert count_parameters(c)["total"] == sum(p.numel() for p in hf.parameters()) \
        == 7_430_870_688
    assert kv_cache_bytes_per_token(c) == 8 * 2 * 30 * 128 * 2                # bfloat16


def _mixer_pair(hk, r, dk, dv, kernel, neg):
    """HF's ``OlmoHybridGatedDeltaNet`` (float64, every weight redrawn) and minitx's mixer
    with its weights: q, k, v's projections stacked into ``in_proj_qkv``, the rest renamed
    (the family's table)."""
    from minitx.models.mixers.gated_deltanet import GatedDeltaNetMixer
    sizes = dict(linear_num_key_heads=hk, linear_num_value_heads=hk * r, linear_key_head_dim=dk,
                 linear_value_head_dim=dv, linear_conv_kernel_dim=kernel,
                 linear_allow_neg_eigval=neg, num_hidden_layers=2,
                 layer_types=["linear_attention", "full_attention"])
    cfg = transformers.OlmoHybridConfig(**{**CONFIG, **sizes})
    torch.manual_seed(hk * 100 + r * 10 + dk)
    theirs = transformers.models.olmo_hybrid.modeling_olmo_hybrid.OlmoHybridGatedDeltaNet(
        cfg, 0).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.4)
    mine = GatedDeltaNetMixer(decoder_config({**CONFIG, **sizes, "model_type": "olmo_hybrid"}))
    mine.to(dtype="float64")
    w = {k: v.detach().numpy() for k, v in theirs.named_parameters()}
    w["in_proj_qkv.weight"] = np.concatenate([w.pop(f"{p}_proj.weight") for p in "qkv"])
    for hf, ours in (("g_proj", "in_proj_z"), ("b_proj", "in_proj_b"), ("a_proj", "in_proj_a"),
                     ("o_proj", "out_proj"), ("o_norm", "norm")):
        w[f"{ours}.weight"] = w.pop(f"{hf}.weight")
    params = dict(mine.named_parameters())
    assert set(params) == set(w)
    for name, value in w.items():
        params[name].copy_(value)
    return theirs, mine


@settings(deadline=None, max_examples=6)
@given(hk=st.integers(1, 2), r=st.integers(1, 2), dk=st.integers(2, 5), dv=st.integers(2, 5),
       kernel=st.integers(2, 4), n=st.integers(1, 9), neg=st.booleans())
def test_the_mixer_equals_hfs_deltanet_module_step_by_step(hk, r, dk, dv, kernel, n, neg):
    """HF's ``OlmoHybridGatedDeltaNet`` itself against ``GatedDeltaNetMixer`` with the split
    projections, β = 2σ(b) or σ(b) and the gated norm's eps of 1e-5: a prompt through both,
    then minitx one token at a time through its cache. 1e-5, as the logits': HF's delta rule
    and gated norm run in float32, whose rounding (6e-8 a step) accumulates over the
    recurrence; measured up to 1.6e-6 relative (one head, D_k = 5, D_v = 3, four tokens)."""
    theirs, mine = _mixer_pair(hk, r, dk, dv, kernel, neg)
    x = np.random.default_rng(n).standard_normal((2, n, 32))
    with torch.no_grad():
        want = theirs(torch.tensor(x)).numpy()
    assert relative(mine(tensor(x)).numpy(), want) <= 1e-5
    cache = mine.new_cache()
    steps = [mine(tensor(x[:, i:i + 1]), kv_cache=cache).numpy() for i in range(n)]
    assert relative(np.concatenate(steps, axis=1), want) <= 1e-5


def test_the_split_mixer_with_negative_eigenvalues_has_its_gradients():
    """Float64 central differences through the split projections, β = 2σ(b) and the chunked
    rule (chunks of 2 over 5 tokens), for the input and for every parameter."""
    _, mine = _mixer_pair(2, 2, 3, 4, 3, True)
    mine.chunk_size = 2
    x = np.random.default_rng(1).standard_normal((1, 5, 32)) * 0.5
    minitx.gradcheck(lambda t: mine(t), (tensor(x, requires_grad=True),))
    params = [p for _, p in mine.named_parameters()]
    minitx.gradcheck(lambda *ps: mine(tensor(x)), tuple(params), fast=True)


@pytest.mark.parametrize("options, message", [
    (dict(projections="fused3"), "projections"), (dict(allow_neg_eigval="yes"),
                                                  "allow_neg_eigval"),
    (dict(norm_eps=0.0), "norm_eps")])
def test_bad_new_mixer_options_are_refused_by_name(options, message):
    from minitx.models import Decoder, DecoderConfig
    config = DecoderConfig(num_layers=1, layer_types=("gated_deltanet",),
                           mixer_options={"gated_deltanet": options})
    with pytest.raises(OptionError, match=message):
        Decoder(config)
