"""Qwen3-Next loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle): a tiny random checkpoint built by ``Qwen3NextForCausalLM`` itself — gated DeltaNet
layers around a gated attention layer, 4 value heads sharing 2 key heads, a convolution of
kernel 3, partial rotary (half of each head), a mixture of 4 experts with a sigmoid-gated
shared expert and one dense layer (``mlp_only_layers``) — every parameter redrawn
(``decoder_util.randomize``), eps = 0.05 so an eps error shows.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF runs its delta rule, its gated norm and its RMSNorms in float32 even in a
float64 model: about 1e-6 here), float32 within 1e-4; minitx's cached decoding equals its
full forward to 1e-10.
"""
import dataclasses

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import both_backward, hf_model, relative, saved_tiny  # noqa: E402
from minitx.models import Decoder, count_parameters  # noqa: E402
from minitx.models.decoder import check_config  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from minitx.validate import OptionError  # noqa: E402
from support import to_host  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=0.05,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6,
    linear_value_head_dim=5, linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=12, norm_topk_prob=True,
    mlp_only_layers=[1])
IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """HF's tiny float64 depthwise conv1d spends its time synchronising threads: on the
    2-core test machine its greedy generate took 11 s with torch's 2 threads, 0.2 s with
    one. One thread for this module, the previous count restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.Qwen3NextConfig(**CONFIG), 3,
                      "qwen3_next")



@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    assert model.config.layer_types == ("gated_deltanet", "full", "gated_deltanet")
    assert model.config.dense_layers == (1,)
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
    # the linear layers keep K − 1 = 2 convolution inputs and S (H_v, D_k, D_v)
    assert caches[0].conv.shape == (2, 2, 2 * 2 * 6 + 4 * 5)
    assert caches[0].state.shape == (2, 4, 6, 5)


def test_chunks_of_the_prompt_do_not_change_the_logits(folder):
    """HF runs the prompt in chunks of 64 (one here); chunks of 3 give the same logits."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    whole = model(IDS).numpy()
    for i in (0, 2):
        model.blocks[i].attn.chunk_size = 3
    assert relative(model(IDS).numpy(), whole) <= 1e-12


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_masked_as_transformers_masks_it(folder, side):
    """attention_mask as HF's forward reads it: the linear layers' inputs at padding are
    zeroed, the attention layers hide padding keys; logits at padding positions mean nothing
    to either library. Left-padded greedy decoding equals HF's ``generate``."""
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


def test_hooks_hold_transformers_gates_and_hidden_states(folder):
    """``hook_beta`` = σ(b) and ``hook_log_alpha`` = −e^A softplus(a + δ) from HF's own
    ``in_proj_ba`` output; each block's ``hook_resid_post`` is HF's hidden state. 1e-6: HF's
    input norm runs in float32, so its b and a differ from minitx's float64 ones by about
    1e-7."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    seen = {}
    layer = ref.model.layers[0].linear_attn
    layer.in_proj_ba.register_forward_hook(lambda m, i, o: seen.__setitem__("ba", o))
    with torch.no_grad():
        states = ref(torch.tensor(IDS), output_hidden_states=True).hidden_states
        ba = seen["ba"].view(2, 11, 2, 4)                    # per key head: [b (2), a (2)]
        b, a = ba[..., :2].reshape(2, 11, 4), ba[..., 2:].reshape(2, 11, 4)
        beta = torch.sigmoid(b).transpose(1, 2).numpy()
        log_alpha = (-layer.A_log.exp() * torch.nn.functional.softplus(a + layer.dt_bias))
        log_alpha = log_alpha.transpose(1, 2).numpy()
    _, cache = model.run_with_cache(IDS)
    assert relative(cache["blocks.0.attn.hook_beta"].numpy(), beta) <= 1e-6
    assert relative(cache["blocks.0.attn.hook_log_alpha"].numpy(), log_alpha) <= 1e-6
    assert cache["blocks.0.attn.hook_state"].shape == (2, 4, 6, 5)
    for i in range(len(model.blocks) - 1):
        mine = cache[f"blocks.{i}.hook_resid_post"].numpy()
        assert relative(mine, states[i + 1].numpy()) <= TOL["float64"], i


def test_a_training_step_has_torchs_gradients(folder):
    """Every parameter's gradient, the conv's, A_log's and dt_bias's included, as torch's.
    1e-4, not the dense families' 1e-5: HF runs the delta rule, the gated norm and the decay
    in float32 even in a float64 model, and their float32 rounding reaches the gradients
    (measured up to about 2e-5 relative on this checkpoint)."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS)
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(hf_grads, model)
    assert set(mapped) == set(mine)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-4, key


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
    assert d["model_type"] == "qwen3_next"
    assert dataclasses.asdict(check_config(decoder_config(d))) == \
        dataclasses.asdict(model.config)
    rebuilt = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3NextConfig(**{k: v for k, v in d.items() if k != "model_type"}),
        experts_implementation="eager").double()
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


def test_config_defaults_and_refusals():
    """A config.json without layer_types takes HF's default (every 4th layer full), without
    partial_rotary_factor HF's 0.25; no experts, or an unknown layer type, is refused."""
    cfg = {**CONFIG, "model_type": "qwen3_next", "num_hidden_layers": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    del cfg["layer_types"]
    hf = transformers.Qwen3NextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert hf.layer_types[3] == "full_attention" and \
        hf.rope_parameters["partial_rotary_factor"] == 0.25                 # HF's defaults
    c = decoder_config(cfg)
    assert c.layer_types == ("gated_deltanet",) * 3 + ("full",)
    assert c.rope["partial_rotary_factor"] == 0.25
    assert Decoder(c).blocks[3].attn.rotary.rotary_dim == 2
    with pytest.raises(OptionError, match="num_experts=0"):
        decoder_config({**cfg, "num_experts": 0})
    with pytest.raises(OptionError, match="layer_types"):
        decoder_config({**cfg, "layer_types": ["linear_attention", "sliding_attention",
                                                  "full_attention", "full_attention"]})
    with pytest.raises(OptionError, match="linear_num_value_heads|num_v_heads"):
        Decoder(decoder_config({**cfg, "linear_num_key_heads": 3}))


def test_to_torch_gives_qwen3_next_with_the_same_logits_and_back(folder):
    """``interop.to_torch`` builds HF's Qwen3-Next from the decoder's switches and tensors;
    ``from_torch`` brings it back unchanged."""
    import minitx.interop as interop
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "Qwen3NextForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        assert np.array_equal(to_host(back.state_dict()[key]), to_host(value)), key
