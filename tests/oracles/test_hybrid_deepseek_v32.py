"""DeepSeek-V3.2 loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle), on a tiny random checkpoint: logits in float64 and float32, with left padding too,
the indexer's choice of keys, greedy tokens (from padded prompts too), cached decoding, a training step's gradients,
the state and config.json round trips, ``interop.to_torch`` and back, the parameter count,
and the refusals.

The checkpoint (built as ``decoder_util.py`` builds the other families', every parameter
redrawn) has 2 layers, the second a mixture of experts, YaRN with its mscale on the scale,
and an indexer of 8 heads of 8 dims choosing k = 4 keys: fewer than the 11 tokens of the
test, so the choice matters. 8 heads keep exact ties of the scores (a key no head's ReLU
passes scores 0) unlikely, whose order torch's top-k does not fix. Tolerances as
``test_pretrained_decoders.py``'s: float64 within 1e-5 of HF's logits, relative to the
largest (HF computes its norms, rotary tables and the indexer's scores in float32 even in a
float64 model), float32 within 1e-4; cached decoding equals minitx's full forward to 1e-10.
"""
import dataclasses

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import SIZES, hf_model, relative, saved_tiny  # noqa: E402
from minitx import interop, validate  # noqa: E402
from minitx.models import count_parameters  # noqa: E402
from minitx.models.decoder import check_config  # noqa: E402
from minitx.ops.loss import cross_entropy  # noqa: E402
from minitx.ops.shape import reshape  # noqa: E402
from minitx.pretrained.decoders import decoder_config, hf_config_dict  # noqa: E402
from support import to_host  # noqa: E402

EXTRA = dict(num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
             qk_rope_head_dim=4, v_head_dim=5, first_k_dense_replace=1, n_routed_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=16, n_group=2, topk_group=1,
             index_topk=4, index_n_heads=8, index_head_dim=8,
             rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0,
                              "original_max_position_embeddings": 16, "mscale": 0.8,
                              "mscale_all_dim": 0.9})
IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.DeepseekV32Config(**{**SIZES, **EXTRA}),
                      32, "deepseek_v32")



@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    assert model.config.index_topk == 4 and model.blocks[1].attn.indexer is not None
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS)).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]
    # the indexer matters here: reading every key (plain MLA) gives other logits
    dense = pt.decoder_from_hf(dict(model.hf_config, index_topk=64),
                               pt.load_weights(folder, dtype), dtype=dtype)
    assert relative(dense(IDS).numpy(), ref) > 100 * TOL[dtype]


def test_the_indexer_chooses_hfs_keys(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref, theirs, mine, scores = hf_model(folder), {}, {}, {}
    for i in range(2):
        ref.model.layers[i].self_attn.indexer.register_forward_hook(
            lambda m, a, out, i=i: theirs.__setitem__(i, out.numpy()))
        model.blocks[i].attn.indexer.hook_topk_indices.add_hook(
            lambda t, h, i=i: mine.__setitem__(i, t.numpy()))
        model.blocks[i].attn.indexer.hook_index_scores.add_hook(
            lambda t, h, i=i: scores.__setitem__(i, t.numpy()))
    with torch.no_grad():
        ref(torch.tensor(IDS))
    model(IDS)
    for i in range(2):
        # HF scores in float32: no k-th and next key closer than that could swap
        ranked = -np.sort(-scores[i][:, 4:], axis=-1)          # rows with more than k keys
        gap = ranked[..., 3] - ranked[..., 4]
        assert gap.min() > 1e-5 * np.abs(ranked[np.isfinite(ranked)]).max()
        assert theirs[i].shape == mine[i].shape == (2, 11, 4)
        for b in range(2):
            for t in range(11):
                # HF fills a row with fewer than k visible keys with future (masked) ones
                hf = {int(s) for s in theirs[i][b, t] if s <= t}
                assert hf == {int(s) for s in mine[i][b, t] if s >= 0}, (i, b, t)


def test_left_padding_matches_transformers(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    mask = np.ones(IDS.shape, dtype=int)
    mask[0, :3] = 0
    with torch.no_grad():
        ref = hf_model(folder)(torch.tensor(IDS), attention_mask=torch.tensor(mask)).logits
    got = model(IDS, attention_mask=mask).numpy()
    rows = mask.astype(bool)                       # padding queries' rows mean nothing
    assert relative(got[rows], ref.numpy()[rows]) <= TOL["float64"]


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


def test_greedy_tokens_from_left_padded_prompts_match(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    prompt, mask = IDS[:, :7].copy(), np.ones((2, 7), dtype=int)
    prompt[0, :2], mask[0, :2] = 0, 0              # row 0: a shorter prompt, padded left
    with torch.no_grad():
        ref = hf_model(folder).generate(torch.tensor(prompt), max_new_tokens=9,
                                        attention_mask=torch.tensor(mask), do_sample=False,
                                        eos_token_id=None).numpy()
    assert np.array_equal(model.generate(prompt, 9, attention_mask=mask).numpy(), ref)


def test_cached_decoding_equals_the_full_forward(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    for cache in caches:       # the latent, the rotary key and the indexer's key per token
        assert cache.keys.shape == (2, 1, 11, 10) and cache.values.shape == (2, 1, 11, 4)
        assert cache.index_keys.shape == (2, 11, 8)


def test_a_training_step_has_torchs_gradients(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    out = ref(torch.tensor(IDS[:, :-1])).logits
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                      torch.tensor(IDS[:, 1:]).reshape(-1)).backward()
    logits = model(IDS[:, :-1])
    cross_entropy(reshape(logits, (-1, logits.shape[-1])), IDS[:, 1:].reshape(-1)).backward()
    # neither library trains the indexer through the output
    assert all(p.grad is None for k, p in ref.named_parameters() if ".indexer." in k)
    mine = dict(model.named_parameters())
    assert all(p.grad is None for k, p in mine.items() if ".indexer." in k)
    hf_grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    mapped = pt.decoder_state_from_hf(
        {**hf_grads, **{k: p.detach().numpy() for k, p in ref.named_parameters()
                        if ".indexer." in k},
         **{k: b.numpy() for k, b in ref.named_buffers() if "correction_bias" in k}}, model)
    for key, g in mapped.items():
        if ".indexer." not in key and "correction_bias" not in key:
            assert relative(mine[key].grad.numpy(), g) <= 1e-5, key


def test_state_and_config_round_trip(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    state = pt.decoder_state_to_hf(model.state_dict(), model)
    theirs = ref.state_dict()
    assert set(state) == set(theirs)
    for key, value in theirs.items():
        assert np.array_equal(np.asarray(state[key]), value.numpy()), key
    # the config back as config.json: read again it is the same model, and HF builds it
    cfg = hf_config_dict(model.config)
    assert cfg["model_type"] == "deepseek_v32" and cfg["index_topk"] == 4
    assert dataclasses.asdict(decoder_config(cfg)) == dataclasses.asdict(
        decoder_config(model.hf_config))
    again = transformers.AutoModelForCausalLM.from_config(
        transformers.DeepseekV32Config(**{k: v for k, v in cfg.items() if k != "model_type"}),
        experts_implementation="eager")
    again.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in state.items()})
    with torch.no_grad():
        logits = again.double().eval()(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), logits) <= TOL["float64"]


def test_count_parameters_is_hfs(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    total = count_parameters(model.config)["total"]
    assert total == sum(p.size for p in model.parameters())
    assert total == sum(p.numel() for p in hf_model(folder).parameters())


def test_refusals_name_the_key(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    cfg = dict(model.hf_config)
    with pytest.raises(validate.OptionError, match="layer_types must be 'indexed_attention'"):
        decoder_config(dict(cfg, layer_types=["full_attention", "indexed_attention"]))
    with pytest.raises(validate.OptionError, match="mlp_layer_types must give"):
        decoder_config(dict(cfg, mlp_layer_types=["dense"]))
    with pytest.raises(validate.OptionError, match="index_head_dim"):
        check_config(decoder_config(dict(cfg, index_head_dim=2)))
    # mlp_layer_types decides the dense layers where first_k_dense_replace disagrees
    c = decoder_config(dict(cfg, mlp_layer_types=["sparse", "dense"], first_k_dense_replace=1))
    assert c.dense_layers == (1,)


def test_to_torch_and_back(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    theirs = interop.to_torch(model)
    assert type(theirs).__name__ == "DeepseekV32ForCausalLM"
    with torch.no_grad():
        ref = theirs(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= TOL["float64"]
    back = interop.from_torch(theirs)
    assert back.config == model.config
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(to_host(back.state_dict()[key]), to_host(value))
