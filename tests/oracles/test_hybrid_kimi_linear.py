"""Kimi Linear loaded by ``minitx.pretrained.load`` against ``transformers``' own model (the
test-only oracle), on a tiny random checkpoint: KDA layers (``models/mixers/kda.py``) around
an MLA layer without rotation, a dense first layer then DeepSeek-V3's experts. Logits in
float64 and float32, greedy tokens, cached decoding, padding, a training step's gradients,
the tensors and config.json both ways, the counts, and the refusals.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF computes its KDA layers, RMSNorms and router in float32 even in a float64
model: 4.8e-7 here), float32 within 1e-4; minitx's cached decoding equals its full forward
to 1e-10. eps is 0.05, so an eps error cannot hide under them.
"""
import json
import os
import shutil

import numpy as np
import pytest

from support import INSTALL, need

torch = need("torch")
transformers = need("transformers")
if not hasattr(transformers, "KimiLinearConfig"):
    pytest.skip(f"needs transformers with Kimi Linear: {INSTALL['transformers']}",
                allow_module_level=True)

import minitx.interop as interop  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from decoder_util import hf_model, randomize, relative, saved_tiny  # noqa: E402
from minitx.backend import to_host  # noqa: E402
from minitx.models import count_parameters  # noqa: E402
from minitx.models.mixers.kda import KDACache  # noqa: E402
from minitx.ops.loss import cross_entropy  # noqa: E402
from minitx.ops.shape import reshape  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from minitx.validate import OptionError  # noqa: E402

IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
IDS[0, 3] = 0                                               # pad_token_id, as a plain token
TOL = {"float64": 1e-5, "float32": 1e-4}
# 4 layers: KDA, KDA, MLA, KDA (1-based in linear_attn_config, as the checkpoints write it);
# 3 KDA heads of 8 (not the MLA's 4), kernel 4; the MLA with a q latent; 8 experts in 4
# groups of which 2 are kept, 2 shared experts, layer 0 dense
CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=0.05, bos_token_id=1,
    eos_token_id=2, pad_token_id=0, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
    qk_rope_head_dim=4, v_head_dim=5, moe_intermediate_size=16, num_experts=8,
    num_experts_per_token=2, num_expert_group=4, topk_group=2, num_shared_experts=2,
    routed_scaling_factor=2.5, first_k_dense_replace=1,
    linear_attn_config={"head_dim": 8, "num_heads": 3, "short_conv_kernel_size": 4,
                        "kda_layers": [1, 2, 4], "full_attn_layers": [3]})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.KimiLinearConfig(**CONFIG), 11,
                      "kimi_linear")



def test_the_layers_are_read_as_the_checkpoint_says(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    c = model.config
    assert c.layer_types == ("kda", "kda", "full", "kda") and c.dense_layers == (0,)
    assert c.attention == "mla" and c.positions == "none"
    assert c.mixer_options == {"kda": {"num_heads": 3, "head_dim": 8, "conv_kernel": 4}}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


def test_queries_straight_from_x_kernel_3_and_hfs_default_layout(tmp_path):
    """The published model's shape of MLA (no q latent: ``q_proj``), a convolution of 3 taps
    and the layout HF derives when config.json lists no layers (MLA at layer 4 of 5)."""
    torch.manual_seed(0)
    cfg = dict(CONFIG, q_lora_rank=None, num_hidden_layers=5, linear_attn_config={
        "head_dim": 8, "num_heads": 3, "short_conv_kernel_size": 3})
    hf = transformers.AutoModelForCausalLM.from_config(transformers.KimiLinearConfig(**cfg))
    randomize(hf, torch, seed=12)
    hf.save_pretrained(tmp_path)
    model, _ = pt.load(tmp_path, dtype="float64", tokenizer=False)
    assert model.config.layer_types == ("kda",) * 4 + ("full",)
    assert model.config.q_lora_rank is None and hasattr(model.blocks[4].attn, "q_proj")
    with torch.no_grad():
        ref = hf_model(tmp_path)(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]


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
    steps = [model(IDS[:, :4], kv_caches=caches).numpy(),
             model(IDS[:, 4:6], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(6, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    # KDA layers keep a fixed state (3 heads' 8 × 8 memory, the 3 convolutions' last 3
    # inputs); the MLA layer its latents and shared keys, r + D_r numbers a token
    for t, cache in zip(model.config.layer_types, caches):
        assert len(cache) == 11
        if t == "kda":
            assert isinstance(cache, KDACache) and cache.state.shape == (2, 3, 8, 8)
            assert [a.shape for a in cache.conv] == [(2, 3, 24)] * 3
        else:
            assert cache.keys.shape == (2, 1, 11, 10) and cache.values.shape == (2, 1, 11, 4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_handled_as_transformers_handles_it(folder, side):
    """attention_mask (1 = token, 0 = padding): HF zeroes the KDA layers' input at padding
    and hides padding keys from the MLA layer; logits at padding positions mean nothing."""
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


def test_left_padded_prompts_generate_transformers_tokens(folder):
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
    # row 0's padding changes nothing: the same tokens as its 3 real ones alone
    alone = model.generate(prompt[:1, 3:], 7).numpy()
    assert np.array_equal(out[:1, 3:], alone)


def test_a_training_step_has_torchs_gradients(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    out = ref(torch.tensor(IDS[:, :-1])).logits
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                      torch.tensor(IDS[:, 1:]).reshape(-1)).backward()
    logits = model(IDS[:, :-1])
    cross_entropy(reshape(logits, (-1, logits.shape[-1])), IDS[:, 1:].reshape(-1)).backward()
    # HF's module names (forget_gate.*, one stacked conv1d, fused experts) are read too
    hf_grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    buffers = {k: b.numpy() for k, b in ref.named_buffers() if "correction_bias" in k}
    mine = dict(model.named_parameters())
    mapped = {k: g for k, g in pt.decoder_state_from_hf({**hf_grads, **buffers}, model).items()
              if "correction_bias" not in k}
    assert set(mapped) == set(mine)
    for key, g in mapped.items():
        assert relative(mine[key].grad.numpy(), g) <= 1e-5, key


def test_hook_points_hold_what_transformers_calls_the_hidden_states(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    with torch.no_grad():
        states = hf_model(folder)(torch.tensor(IDS), output_hidden_states=True).hidden_states
    _, cache = model.run_with_cache(IDS)
    for i in range(len(model.blocks) - 1):
        mine = cache[f"blocks.{i}.hook_resid_post"].numpy()
        assert relative(mine, states[i + 1].numpy()) <= TOL["float64"], i


def test_the_tensors_go_back_as_the_files_and_as_transformers_modules_hold_them(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    state = {k: to_host(v) for k, v in model.state_dict().items()}
    # the files: separate q/k/v convolutions, block_sparse_moe, one matrix per expert
    files = pt.load_weights(folder, dtype="float64")
    back = pt.decoder_state_to_hf(state, model, files=True)
    assert set(back) == set(files)
    for key, value in files.items():
        assert np.array_equal(np.asarray(back[key]), value), key
    # transformers 5's modules: load_state_dict takes them, every tensor accounted for
    ref = hf_model(folder)
    mods = pt.decoder_state_to_hf(state, model)
    ours = {k: torch.tensor(np.asarray(v)) for k, v in mods.items()}
    result = ref.load_state_dict(ours, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for key, value in ref.state_dict().items():
        assert np.array_equal(value.numpy(), np.asarray(mods[key])), key


def test_config_json_round_trips_and_counts_match(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    d = hf_config_dict(model.config)              # written from the switches alone
    assert d["model_type"] == "kimi_linear"
    assert decoder_config(d) == model.config
    # HF reads it as the same model: its model from it, with minitx's tensors, same logits
    ref = transformers.AutoModelForCausalLM.from_config(
        transformers.KimiLinearConfig(**{k: v for k, v in d.items() if k != "model_type"}),
        experts_implementation="eager").double().eval()
    state = {k: torch.tensor(np.asarray(v)) for k, v in pt.decoder_state_to_hf(
        {k: to_host(v) for k, v in model.state_dict().items()}, model).items()}
    ref.load_state_dict(state, strict=True)
    with torch.no_grad():
        assert relative(model(IDS).numpy(), ref(torch.tensor(IDS)).logits.numpy()) <= 1e-5
    # the parameter count from the configuration alone is HF's (buffers are not parameters)
    assert count_parameters(model.config)["total"] == sum(p.numel() for p in ref.parameters())


def test_to_torch_gives_transformers_kimi_linear_and_back(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "KimiLinearForCausalLM" and not theirs.training
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(to_host(back.state_dict()[key]), to_host(value))


def test_hf_default_layouts_are_derived_as_transformers_derives_them():
    cfg = {k: v for k, v in CONFIG.items() if k != "linear_attn_config"}
    cfg.update(model_type="kimi_linear", num_hidden_layers=6)
    c = decoder_config(cfg)
    hf = transformers.KimiLinearConfig(**CONFIG | {"num_hidden_layers": 6,
                                                   "linear_attn_config": {}})
    names = {"linear_attention": "kda", "full_attention": "full"}
    assert c.layer_types == tuple(names[t] for t in hf.layer_types)
    assert c.dense_layers == tuple(i for i, t in enumerate(hf.mlp_layer_types) if t == "dense")
    assert c.mixer_options["kda"] == {"num_heads": hf.linear_num_heads,
                                      "head_dim": hf.linear_head_dim,
                                      "conv_kernel": hf.linear_conv_kernel_dim}
    assert c.norm_eps == hf.rms_norm_eps and c.max_position == hf.max_position_embeddings


def _edit_config(folder, tmp_path, **changes):
    dst = str(tmp_path / "edited")
    shutil.copytree(folder, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    cfg.update(changes)
    with open(path, "w") as fh:
        json.dump(cfg, fh)
    return dst


@pytest.mark.parametrize("changes, match", [
    (dict(layer_types=None, linear_attn_config={"kda_layers": [1, 2, 5],
                                                "full_attn_layers": [3]}),
     "kda_layers holds layer 5"),
    (dict(layer_types=["linear_attention", "sliding_attention", "full_attention",
                       "linear_attention"]), "layer_types must give one of"),
    (dict(mlp_layer_types=["dense", "moe", "sparse", "sparse"]), "mlp_layer_types"),
    (dict(mla_use_output_gate=True), "'mla_use_output_gate'"),
    (dict(linear_attn_config={**CONFIG["linear_attn_config"], "gate_lower_bound": -5.0}),
     "linear_attn_config key.s. 'gate_lower_bound'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_config_options_that_are_not_kimis_are_refused_by_name(folder, tmp_path, changes,
                                                                match):
    with pytest.raises(OptionError, match=match):
        pt.load(_edit_config(folder, tmp_path, **changes), dtype="float64", tokenizer=False)
