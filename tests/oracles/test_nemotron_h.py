"""Nemotron-H loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle): a tiny random checkpoint built by HF's ``NemotronHForCausalLM`` — five layers of one
sublayer each: Mamba-2 (4 heads of 8, 2 groups of state 8, chunks of 4), an MoE (4 ReLU²
experts of 16 in a latent space of 8, 2 chosen by σ scores in 2 groups of which 1 is kept, a
shared expert of 12), attention without positions (GQA 4/2), a ReLU² MLP of 40, Mamba-2
again — every parameter redrawn (``decoder_util.randomize``), the router's correction bias
too, eps = 0.05 so an eps error shows.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF computes its RMSNorms, its gated norm, the SSM and the router in float32
even in a float64 model), float32 within 1e-4; minitx's cached decoding equals its full
forward to 1e-10.
"""

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import (assert_round_trip, both_backward, hf_model, relative,  # noqa: E402
                          saved_tiny)
from minitx.attention import SharedKVCache  # noqa: E402
from minitx.models.decoder import kv_cache_bytes  # noqa: E402
from minitx.pretrained.decoders import decoder_config  # noqa: E402
from minitx.validate import OptionError  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=40, layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                                             "linear_attention"],
    mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4,
    chunk_size=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=12, moe_latent_size=8, n_group=2, topk_group=1,
    routed_scaling_factor=1.5, layer_norm_epsilon=0.05, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2)
IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.NemotronHConfig(**CONFIG), 11,
                      "nemotron_h")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    assert model.config.layer_types == ("mamba2", "moe", "full", "mlp", "mamba2")
    assert model.blocks[1].attn is None and model.blocks[2].mlp is None
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
    assert np.array_equal(out, ref)


def test_cached_decoding_equals_the_full_forward(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    assert isinstance(caches[1], SharedKVCache) and isinstance(caches[3], SharedKVCache)
    assert [len(c) for c in caches] == [11] * 5
    # only the attention layer grows, 2·Hkv·D = 32 numbers a token; each Mamba-2 layer holds
    # its conv inputs (K − 1)(HP + 2G·N_s) = 3·64 and its state H·N_s·P = 256, whatever T is
    assert kv_cache_bytes(model.config, 11, 1) == 11 * 32 + 2 * (3 * 64 + 256)


def test_a_training_step_has_torchs_gradients(folder):
    """Every parameter's gradient, the Mamba-2 layers', the latent projections' and the
    shared expert's included, as torch's within the hybrids' 1e-4 (HF's float32 SSM)."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS)
    hf_grads.update({k: b.numpy() for k, b in ref.named_buffers()
                     if k.endswith("e_score_correction_bias")})
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf(hf_grads, model)
    assert set(mine) <= set(mapped)
    assert {"blocks.1.mlp.fc1_latent_proj.weight", "blocks.0.attn.A_log"} <= set(mine)
    for key in mine:
        assert relative(mine[key].grad.numpy(), mapped[key]) <= 1e-4, key


def test_state_and_config_round_trip_to_transformers(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    assert_round_trip(model, ref, "nemotron_h")


def test_the_older_pattern_reads_as_the_layer_list():
    cfg = {**CONFIG, "model_type": "nemotron_h"}
    del cfg["layers_block_type"]
    cfg["hybrid_override_pattern"] = "ME*-M"
    assert decoder_config(cfg).layer_types == ("mamba2", "moe", "full", "mlp", "mamba2")


@pytest.mark.parametrize("changes, match", [
    (dict(mamba_hidden_act="gelu"), "mamba_hidden_act='gelu'"),
    (dict(layers_block_type=["linear_attention", "conv"]), "layers_block_type must give"),
    (dict(hybrid_override_pattern="M?", layers_block_type=None), "hybrid_override_pattern"),
    (dict(mlp_hidden_act="silu"), "mlp_hidden_act='silu'"),
])
def test_what_minitx_does_not_implement_is_refused_by_name(changes, match):
    cfg = {**CONFIG, **changes, "model_type": "nemotron_h"}
    with pytest.raises(OptionError, match=match):
        decoder_config(cfg)
