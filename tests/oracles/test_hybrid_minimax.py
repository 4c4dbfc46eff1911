"""MiniMax-Text-01 (HF ``model_type`` "minimax": lightning-attention layers between softmax
layers, Mixtral's experts, residual weights α, β per layer kind) loaded by
``minitx.pretrained.load`` against ``transformers`` (the test-only oracle), on tiny random
checkpoints with every parameter redrawn: logits in float64 and float32, greedy tokens, cached
decoding, padding, a training step's gradients, the hidden states, the state and config.json
written back, and the refusals.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's, relative
to the largest (HF computes its RMSNorms, rotary tables, router softmax and the lightning
decays in float32 even in a float64 model; here the residual is the normalised input, so
those roundings stay in the stream: about 3e-6), float32 within 1e-4.
"""
import json
import os
import shutil

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import SIZES, hf_model, randomize, relative  # noqa: E402
from minitx.models import DecoderConfig, count_parameters  # noqa: E402
from minitx.models.decoder import check_config  # noqa: E402
from minitx.models.mixers.lightning import LightningMixer  # noqa: E402
from minitx.ops.loss import cross_entropy  # noqa: E402
from minitx.ops.shape import reshape  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from minitx.pretrained.safetensors import load_file, save_file  # noqa: E402
from minitx.validate import OptionError  # noqa: E402
from support import to_host  # noqa: E402

IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}
MOE = dict(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
# each α, β its own value, so a factor read for the wrong kind of layer shows
FACTORS = dict(full_attn_alpha_factor=0.7, full_attn_beta_factor=1.3,
               linear_attn_alpha_factor=1.1, linear_attn_beta_factor=0.9,
               mlp_alpha_factor=0.8, mlp_beta_factor=1.2)
# 11 tokens: 3 lightning blocks of 4; a window of 4 over HF's default alternation (full,
# lightning) and a head dim other than E/H, blocks of 3
CASES = {
    "minimax": dict(num_hidden_layers=4, block_size=4, layer_types=[
        "linear_attention", "full_attention", "linear_attention", "linear_attention"]),
    "minimax-window": dict(block_size=3, sliding_window=4, head_dim=16),
}
_BUILT = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("minimax")


def tiny(root, case):
    if case not in _BUILT:
        torch.manual_seed(0)
        cfg = transformers.MiniMaxConfig(**{**SIZES, **MOE, **FACTORS, **CASES[case]})
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        randomize(model, torch, seed=sorted(CASES).index(case) + 11)
        _BUILT[case] = os.path.join(str(root), case)
        model.save_pretrained(_BUILT[case])
    return _BUILT[case]



def test_the_config_is_read_as_hf_builds_the_layers(root):
    model, _ = pt.load(tiny(root, "minimax"), dtype="float64", tokenizer=False)
    c = model.config
    assert c.layer_types == ("lightning", "full", "lightning", "lightning")
    assert c.mixer_options == {"lightning": {"block": 4}}
    assert c.residual_scales == ((1.1, 0.9, 0.8, 1.2), (0.7, 1.3, 0.8, 1.2),
                                 (1.1, 0.9, 0.8, 1.2), (1.1, 0.9, 0.8, 1.2))
    assert c.mlp == "moe" and (c.num_experts, c.top_k, c.expert_hidden) == (4, 2, 16)
    window = pt.load(tiny(root, "minimax-window"), dtype="float64", tokenizer=False)[0]
    assert window.config.layer_types == ("sliding", "lightning")     # HF's default order
    assert window.config.sliding_window == 4 and window.config.head_dim == 16
    # every parameter as HF counts its own (its decays are buffers, not parameters)
    hf = hf_model(tiny(root, "minimax"))
    assert count_parameters(c)["total"] == sum(p.numel() for p in hf.parameters()) == \
        sum(int(p.data.size) for p in model.parameters())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(root, case, dtype):
    folder = tiny(root, case)
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_match_transformers_generate(root, case):
    folder = tiny(root, case)
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


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_decoding_equals_the_full_forward(root, case):
    model, _ = pt.load(tiny(root, case), dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :5], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(5, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    c = model.config
    for block, cache in zip(model.blocks, caches):
        assert len(cache) == 11
        if isinstance(block.attn, LightningMixer):        # a state of H·D² per sequence
            assert cache.state.shape == (2, c.num_heads, c.head_dim, c.head_dim)


@pytest.mark.parametrize("case", sorted(CASES))
def test_left_padding_is_handled_as_transformers_does(root, case):
    """Padding's q, k, v are zeroed in the lightning layers, masked as keys in the softmax
    ones: the real tokens' logits are HF's, and so are the tokens generated from a padded
    batch — those of HF's ``generate(use_cache=False)``, and those of each row alone.

    Not HF's cached ``generate`` when layer 0 is a lightning layer ("minimax"): HF reads the
    cached length off layer 0's key cache, which a lightning layer leaves empty, so from the
    first cached step its padding mask for the softmax layers is misplaced (its cached and
    uncached tokens then differ, here from the second new token of the padded row)."""
    folder = tiny(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    mask = np.ones_like(IDS)
    mask[0, :3] = 0
    ref = hf_model(folder)
    with torch.no_grad():
        theirs = ref(torch.tensor(IDS), attention_mask=torch.tensor(mask)).logits.numpy()
        tokens = ref.generate(torch.tensor(IDS[:, :6]), max_new_tokens=6,
                              attention_mask=torch.tensor(mask[:, :6]), do_sample=False,
                              eos_token_id=None, use_cache=False).numpy()
    mine = model(IDS, attention_mask=mask).numpy()
    real = mask.astype(bool)
    assert relative(mine[real], theirs[real]) <= TOL["float64"]
    out = model.generate(IDS[:, :6], 6, attention_mask=mask[:, :6]).numpy()
    assert np.array_equal(out, tokens)
    alone = model.generate(IDS[:1, 3:6], 6).numpy()
    assert np.array_equal(out[:1, 3:], alone)


def test_a_training_step_has_torchs_gradients(root):
    folder = tiny(root, "minimax")
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    out = ref(torch.tensor(IDS[:, :-1])).logits
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                      torch.tensor(IDS[:, 1:]).reshape(-1)).backward()
    logits = model(IDS[:, :-1])
    cross_entropy(reshape(logits, (-1, logits.shape[-1])), IDS[:, 1:].reshape(-1)).backward()
    grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    # the decay buffers have no gradient: passed as they are, so the map is whole
    grads.update({k: b.numpy() for k, b in ref.named_buffers() if "decay" in k or "slope" in k})
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(grads, model)
    assert set(mapped) == set(mine)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-5, key


def test_the_blocks_outputs_are_transformers_hidden_states(root):
    folder = tiny(root, "minimax")
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    with torch.no_grad():
        states = hf_model(folder)(torch.tensor(IDS), output_hidden_states=True).hidden_states
    _, cache = model.run_with_cache(IDS)
    for i in range(len(model.blocks) - 1):
        mine = cache[f"blocks.{i}.hook_resid_post"].numpy()
        assert relative(mine, states[i + 1].numpy()) <= TOL["float64"], i
    # the lightning layers' hooks: the gate in (0, 1), the state after the last token
    assert cache["blocks.0.attn.hook_gate"].shape == (2, 11, 32)
    assert cache["blocks.0.attn.hook_state"].shape == (2, 4, 8, 8)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_state_and_config_are_written_back(root, case):
    """The checkpoint's tensors come back key for key (the parameters bit for bit, the decay
    buffers to float32's rounding), transformers 5's module keys load into HF's model, and
    ``hf_config_dict`` gives a config.json that HF builds into the same model."""
    folder = tiny(root, case)
    model, _ = pt.load(folder, dtype="float32", tokenizer=False)
    files = load_file(os.path.join(folder, "model.safetensors"))
    state = {k: to_host(v) for k, v in model.state_dict().items()}
    back = pt.decoder_state_to_hf(state, model, files=True)
    assert sorted(back) == sorted(files)
    for key, value in files.items():
        if key.endswith(("decay", "slope_rate")):
            np.testing.assert_allclose(back[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
        else:
            np.testing.assert_array_equal(back[key], value, err_msg=key)
    # config.json from the DecoderConfig alone, then HF's model of it with our tensors
    cfg = hf_config_dict(model.config)
    assert cfg["model_type"] == "minimax"
    assert check_config(decoder_config(cfg)) == model.config
    hf = transformers.MiniMaxConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    ref = transformers.MiniMaxForCausalLM(hf).eval()
    modules = pt.decoder_state_to_hf(state, model)
    ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in modules.items()},
                        strict=True)
    with torch.no_grad():
        theirs = ref(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), theirs) <= TOL["float32"]


def _copy(root, name, config=None, tensors=None):
    dst = os.path.join(str(root), name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(tiny(root, "minimax"), dst)
    if config:
        path = os.path.join(dst, "config.json")
        with open(path) as fh:
            cfg = json.load(fh)
        cfg.update(config)
        with open(path, "w") as fh:
            json.dump(cfg, fh)
    if tensors:
        path = os.path.join(dst, "model.safetensors")
        save_file(tensors(dict(load_file(path))), path)
    return dst


def _scaled(t):
    t["model.layers.2.self_attn.slope_rate"] = t["model.layers.2.self_attn.slope_rate"] * 2
    return t


@pytest.mark.parametrize("config,tensors,match", [
    (None, _scaled, r"'model.layers.2.self_attn.slope_rate' \(shape \(4, 1, 1\)\) is not "
                    "MiniMax's decay for layer 2 of 4, block_size=4"),
    ({"block_size": 8}, None, r"query_decay' \(shape \(4, 4, 1\)\) is not MiniMax's decay "
                              r"for layer 0 of 4, block_size=8 \(shape \(4, 8, 1\)\)"),
    (None, lambda t: {k: v for k, v in t.items() if not k.endswith("3.self_attn.key_decay")},
     "missing tensor: model.layers.3.self_attn.key_decay"),
    ({"layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]}, None,
     r"layer_types may hold only \['full_attention', 'linear_attention'\], got \['full_"
     r"attention', 'linear_attention', 'mamba'\]"),
    ({"router_jitter_noise": 0.1}, None, "router_jitter_noise=0.1"),
    ({"linear_attn_gamma": 1.0}, None, "'linear_attn_gamma' are not known"),
])
def test_what_minitx_cannot_run_as_hf_does_is_refused_by_name(root, config, tensors, match):
    folder = _copy(root, "refused", config, tensors)
    with pytest.raises(OptionError, match=match):
        pt.load(folder, dtype="float64", tokenizer=False)


def test_a_decoder_without_residual_scales_is_not_minimax():
    """Without ``residual_scales`` a lightning decoder is minitx's own: no family runs it."""
    c = DecoderConfig(
        vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
        layer_types=("full", "lightning"), mlp="moe", num_experts=4, top_k=2)
    with pytest.raises(ValueError, match="no HuggingFace family runs this DecoderConfig"):
        hf_config_dict(c)


def test_to_torch_and_back(root):
    """``interop.to_torch`` builds HF's ``MiniMaxForCausalLM`` from the decoder alone (its
    config.json from ``hf_config_dict``, the decays rewritten), and ``from_torch`` reads it
    back to the same switches and logits."""
    import minitx.interop as interop
    model, _ = pt.load(tiny(root, "minimax"), dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "MiniMaxForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    mine = model(IDS).numpy()
    assert relative(mine, ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    assert relative(back(IDS).numpy(), mine) <= 1e-12
