"""Today's decoders loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle), family by family, on tiny random checkpoints (``decoder_util.py``): logits in float64
and float32, greedy tokens, cached decoding, a training step's gradients, and the refusals.

Tolerances. float64 logits within 1e-5 of HF's, relative to the largest: even in a float64
model HF computes its RMSNorms and rotary tables in float32, which moves its own logits by
about 1e-7–1e-6 (docs/decoders.md has the measured figures); minitx computes in float64
throughout, and its cached decoding equals its full forward to 1e-10. float32 logits within
1e-4. The checkpoints' eps is large (``decoder_util.py``), so an eps error cannot hide under
these tolerances.
"""
import json
import os
import shutil

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import CASES, both_backward, hf_model, relative, tiny_decoder  # noqa: E402

IDS = np.random.default_rng(0).integers(3, 97, (2, 11))     # 11 tokens: past the window of 4
IDS[0, 3] = 0                                               # the padding row gets no gradient
TOL = {"float64": 1e-5, "float32": 1e-4}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("decoders")



@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(root, case, dtype):
    folder = tiny_decoder(root, case)
    model, tok = pt.load(folder, dtype=dtype, tokenizer=False)
    assert tok is None
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_match_transformers_generate(root, case):
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    prompt = IDS[:, :5]
    with torch.no_grad():
        # the prompt holds pad_token_id: HF would mask it unless told that every token counts
        ref = hf_model(folder).generate(torch.tensor(prompt), max_new_tokens=9,
                                        attention_mask=torch.ones(prompt.shape, dtype=int),
                                        do_sample=False, eos_token_id=None).numpy()
    out = model.generate(prompt, max_new_tokens=9).numpy()
    assert ref.shape == out.shape == (2, 14)
    assert np.array_equal(out, ref)
    assert np.array_equal(model.generate(prompt, 9, use_cache=False).numpy(), out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_decoding_equals_the_full_forward(root, case):
    model, _ = pt.load(tiny_decoder(root, case), dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    # a sliding layer's cache is bounded by its window: W − 1 keys kept after 11 tokens
    for block, cache in zip(model.blocks, caches):
        assert len(cache) == 11
        if block.attn.window is not None:
            assert cache._k.shape[2] == block.attn.window - 1
        # DeepSeek's cache holds the latent and the rotary key: r + D_r numbers per token
        if model.config.attention == "mla":
            c = model.config
            assert cache.keys.shape == (2, 1, 11, c.kv_lora_rank)
            assert cache.values.shape == (2, 1, 11, c.qk_rope_head_dim)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_step_has_torchs_gradients(root, case):
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS)
    if model.config.tie_embeddings:
        hf_grads.pop("lm_head.weight", None)       # the same tensor as the embedding
    # DeepSeek-V3's correction bias is a buffer, with no gradient: passed so the map is whole
    buffers = {k: b.numpy() for k, b in ref.named_buffers() if "correction_bias" in k}
    mine = dict(model.named_parameters())
    mapped = {k: g for k, g in pt.decoder_state_from_hf({**hf_grads, **buffers}, model).items()
              if "correction_bias" not in k}
    assert set(mapped) == set(mine)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-5, key
    if not model.config.tie_embeddings:        # (tied, the head's gradient reaches it)
        assert not np.any(mine["embed.weight"].grad.numpy()[0])  # pad_token_id's row


@pytest.mark.parametrize("case", sorted(CASES))
def test_hook_points_hold_what_transformers_calls_the_hidden_states(root, case):
    """HF's first hidden state is the first layer's input, ``blocks.0.hook_resid_pre``: the
    embeddings of ``hook_embed`` (Gemma's √E included), normalised where the family has an
    embedding norm (nanochat); each block's ``hook_resid_post`` the next (HF's last one is
    after the final norm)."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    with torch.no_grad():
        states = hf_model(folder)(torch.tensor(IDS), output_hidden_states=True).hidden_states
    _, cache = model.run_with_cache(IDS)
    first = cache["blocks.0.hook_resid_pre"].numpy()
    assert relative(first, states[0].numpy()) <= TOL["float64"]
    if not model.config.embed_norm:
        assert np.array_equal(cache["hook_embed"].numpy(), first)
    for i in range(len(model.blocks) - 1):
        mine = cache[f"blocks.{i}.hook_resid_post"].numpy()
        assert relative(mine, states[i + 1].numpy()) <= TOL["float64"], i


def test_gpt_oss_attention_with_sinks_equals_transformers():
    """gpt-oss's attention — a learned sink per head, biases on every projection, YaRN
    without truncation, sliding and full layers alternating — against HF's GptOss (eager
    attention, every parameter redrawn) whose experts are then zeroed, so each MLP adds
    nothing (the mixture of experts is ``nn.moe``'s, tested there); minitx's Decoder has
    gpt-oss's attention switches and a zeroed dense MLP."""
    from decoder_util import randomize
    from minitx.models import Decoder, DecoderConfig
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "rope_theta": 500.0, "truncate": False, "beta_fast": 32.0, "beta_slow": 1.0}
    cfg = transformers.GptOssConfig(
        vocab_size=97, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, rms_norm_eps=0.05, max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"], rope_parameters=dict(rope))
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                        experts_implementation="eager")
    randomize(ref, torch, seed=11)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if ".mlp.experts." in name:
                p.zero_()
    ref = ref.double().eval()
    model = Decoder(DecoderConfig(
        vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        ffn_hidden=16, norm_eps=0.05, qkv_bias=True, o_bias=True, attn_sinks=True,
        sliding_window=4, layer_types=("sliding", "full"), rope=rope,
        tie_embeddings=False)).to(dtype="float64")
    hf_state = {k: v.numpy() for k, v in ref.state_dict().items()}
    # which HF name each minitx parameter gets: each carries its index through the renaming
    mine = list(model.state_dict())
    named = pt.decoder_state_to_hf({k: np.array(i) for i, k in enumerate(mine)}, model)
    names = {theirs: mine[int(i)] for theirs, i in named.items()}
    model.load_state_dict({m: np.zeros(model.state_dict()[m].shape) if ".mlp." in m
                           else hf_state[theirs] for theirs, m in names.items()})
    with torch.no_grad():
        expected = ref(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), expected) <= TOL["float64"]
    # the sinks matter: without them the logits move
    for block in model.blocks:
        block.attn.sinks.copy_(np.full(4, -np.inf))
    assert relative(model(IDS).numpy(), expected) > 1e-3


def test_the_window_is_applied(root):
    """Mistral's window of 4 matters over 11 tokens: without it the logits move."""
    model, _ = pt.load(tiny_decoder(root, "mistral"), dtype="float64", tokenizer=False)
    windowed = model(IDS).numpy()
    for block in model.blocks:
        block.attn.window = None
    assert relative(model(IDS).numpy(), windowed) > 1e-3


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", ["gemma3_text", "mistral", "qwen3", "deepseek_v3"])
def test_padding_keys_are_masked_as_transformers_masks_them(root, case, side):
    """attention_mask (1 = token, 0 = padding) as HF's forward reads it: padding keys hidden,
    positions 0 … N − 1; logits at padding positions mean nothing to either library. Also
    through the caches, the mask growing with the tokens."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    mask = np.ones_like(IDS)
    mask[0, :4] = 0 if side == "left" else 1
    mask[0, -3:] = 0 if side == "right" else 1
    with torch.no_grad():
        ref = hf_model(folder)(torch.tensor(IDS), attention_mask=torch.tensor(mask)).logits
    real = mask.astype(bool)
    mine = model(IDS, attention_mask=mask).numpy()
    assert relative(mine[real], ref.numpy()[real]) <= TOL["float64"]
    if side == "left":                       # without the mask, row 0 would read the padding
        assert relative(model(IDS).numpy()[real], mine[real]) > 1e-3
    caches = model.new_caches()
    steps = [model(IDS[:, :5], kv_caches=caches, attention_mask=mask[:, :5]).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches, attention_mask=mask[:, :i + 1]).numpy()
              for i in range(5, 11)]
    assert relative(np.concatenate(steps, axis=1)[real], mine[real]) <= 1e-10


@pytest.mark.parametrize("case", ["gemma3_text", "llama-yarn", "olmo2", "deepseek_v3"])
def test_left_padded_prompts_generate_transformers_tokens(root, case):
    """Prompts of different lengths, padded on the left, in one batch: HF's generate counts
    each row's positions from its first real token; so does Decoder.generate."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    prompt = IDS[:, :6].copy()
    mask = np.ones_like(prompt)
    mask[0, :3] = 0
    prompt[0, :3] = 0                                        # pad_token_id
    with torch.no_grad():
        ref = hf_model(folder).generate(torch.tensor(prompt), max_new_tokens=7,
                                        attention_mask=torch.tensor(mask), do_sample=False,
                                        eos_token_id=None).numpy()
    out = model.generate(prompt, 7, attention_mask=mask).numpy()
    assert np.array_equal(out, ref)
    assert np.array_equal(model.generate(prompt, 7, attention_mask=mask,
                                         use_cache=False).numpy(), out)
    # row 1 has no padding: the same tokens as when it is generated alone
    alone = model.generate(prompt[1:], 7).numpy()
    assert np.array_equal(out[1:], alone)


# ---- refusals ---------------------------------------------------------------------------------

def _copy(root, case, name):
    dst = os.path.join(str(root), name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(tiny_decoder(root, case), dst)
    return dst


def _edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    cfg.update(changes)
    with open(path, "w") as fh:
        json.dump(cfg, fh)


@pytest.mark.parametrize("changes,match", [
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'dynamic' is not implemented"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "beta": 1.0}),
     "does not take 'beta'"),
    (dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (dict(some_new_switch=True), "'some_new_switch' are not known"),
    (dict(quantization_config={"quant_method": "bitsandbytes"}), "quantization_config"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 0.5}), "partial_rotary_factor=0.5"),
])
def test_config_options_that_change_the_maths_are_refused_by_name(root, changes, match):
    folder = _copy(root, "llama", "bad-config")
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=match):
        pt.load(folder, tokenizer=False)


def _edit_tensors(folder, fn):
    from minitx.pretrained.safetensors import load_file, save_file
    path = os.path.join(folder, "model.safetensors")
    tensors = fn(dict(load_file(path)))
    save_file(tensors, path)


@pytest.mark.parametrize("edit,match", [
    (lambda t: {k: v for k, v in t.items() if k != "model.layers.1.self_attn.k_proj.weight"},
     r"missing tensor\(s\): model.layers.1.self_attn.k_proj.weight"),
    (lambda t: {**t, "model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)},
     "unexpected tensor.*model.layers.0.mlp.extra.weight"),
    (lambda t: {**t, "model.norm.weight": np.ones(31, np.float32)},
     r"'model.norm.weight' has shape \(31,\), the model needs \(32,\)"),
])
def test_missing_extra_or_misshapen_tensors_are_refused_by_name(root, edit, match):
    folder = _copy(root, "qwen3", "bad-tensors")
    _edit_tensors(folder, edit)
    with pytest.raises(ValueError, match=match):
        pt.load(folder, tokenizer=False)


def test_a_folder_without_a_tokenizer_says_what_is_missing(root):
    folder = tiny_decoder(root, "olmo2")
    with pytest.raises(FileNotFoundError, match="no tokenizer file; expected tokenizer.json"):
        pt.load(folder)
    model, tok = pt.load(folder, tokenizer=False)
    assert tok is None and model.config.num_layers > 0
