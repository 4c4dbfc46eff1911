"""Real decoders at their published sizes, counted from the configuration alone
(``minitx.models.PRESETS``, ``count_parameters``, ``kv_cache_bytes``): the totals and the
parameters active per token are the model cards' figures, to the precision each card
publishes. Nothing is built at full size; the counting itself is checked against models
built small."""
import dataclasses

import numpy as np
import pytest

import minitx
from minitx.models import (PRESETS, Decoder, DecoderConfig, count_parameters, kv_cache_bytes,
                           preset)
from minitx.pretrained.decoders import decoder_config

B = 1e9


def counts(name):
    return count_parameters(preset(name))


def test_llama_3_2_1b():
    # the card's 1.23B: 1.2358B, truncated (as Meta's table truncates); the head is tied
    n = counts("Llama-3.2-1B")
    assert int(n["total"] / B * 100) == 123 and n["active"] == n["total"]


def test_qwen3_0_6b():
    # the card: 0.6B, 0.44B of them not embeddings
    n = counts("Qwen3-0.6B")
    assert round(n["total"] / B, 1) == 0.6 and round(n["non_embedding"] / B, 2) == 0.44


def test_gemma_3_270m():
    # the card: 270M, of which 170M embedding and 100M in the transformer blocks
    n = counts("Gemma-3-270M")
    assert round(n["total"] / 1e7) * 10 == 270
    assert round(n["embedding"] / 1e7) * 10 == 170 and round(n["non_embedding"] / 1e8) == 1


def test_olmo_2_1b():
    # OLMo-2-0425-1B's card: 1.5B (the "1B" of its name counts no embeddings: 1.07B)
    n = counts("OLMo-2-1B")
    assert round(n["total"] / B, 1) == 1.5 and round(n["non_embedding"] / B, 2) == 1.07


def test_mixtral_8x7b():
    # Mistral's figures: 46.7B parameters, 12.9B used per token (both count the embeddings)
    n = counts("Mixtral-8x7B")
    assert round(n["total"] / B, 1) == 46.7 and round(n["active"] / B, 1) == 12.9


def test_gpt_oss_20b():
    # OpenAI's card: 20.91B total, 3.61B active; its active count includes the unembedding
    # but not the embedding table (a lookup), so the table is taken off here
    c = preset("gpt-oss-20b")
    n = count_parameters(c)
    assert round(n["total"] / B, 2) == 20.91
    assert round((n["active"] - c.vocab_size * c.hidden_size) / B, 2) == 3.61


def test_deepseek_v3():
    # the card: 671B total, 37B activated per token. The card's 671B is the main model: the
    # Hub's 685B adds the multi-token-prediction module (14B), not part of the forward pass.
    # Its 37B is the active count without the embedding table, as gpt-oss counts (36.6B;
    # with the table, 37.6B)
    c = preset("DeepSeek-V3")
    n = count_parameters(c)
    assert round(n["total"] / B) == 671
    assert round((n["active"] - c.vocab_size * c.hidden_size) / B) == 37


def test_kv_cache_bytes_per_token_mha_gqa_mla_and_windows():
    """Per token, bfloat16: GQA keeps 2·Hkv·D per layer, MLA r + D_r; a sliding layer stops
    growing at W − 1 tokens."""
    llama, ds, gemma = (preset(k) for k in ("Llama-3.2-1B", "DeepSeek-V3", "Gemma-3-270M"))
    assert kv_cache_bytes(llama) == 16 * 2 * 8 * 64 * 2                  # 32 KiB
    mha = dataclasses.replace(llama, num_kv_heads=32)
    assert kv_cache_bytes(mha) == 4 * kv_cache_bytes(llama)              # 32 heads, not 8
    assert kv_cache_bytes(ds) == 61 * (512 + 64) * 2                     # 70 KB
    # the keys (128 heads of 128 + 64) and values (128 heads of 128) MLA expands, if cached
    expanded = 61 * 128 * (192 + 128) * 2
    assert 71 * kv_cache_bytes(ds) < expanded < 72 * kv_cache_bytes(ds)
    # Gemma 3: 15 sliding layers stop at 511 tokens, 3 full layers keep growing
    per_layer_token = 2 * 1 * 256 * 2
    assert kv_cache_bytes(gemma, 32768) == per_layer_token * (15 * 511 + 3 * 32768)
    assert kv_cache_bytes(gemma, 100) == 18 * 100 * per_layer_token


# the counting, checked where a model can be built: tiny decoders with each family's switches
TINY = dict(vocab_size=31, hidden_size=16, num_layers=3, num_heads=4, num_kv_heads=2)
SWITCHES = {
    "mixtral": dict(mlp="moe", num_experts=4, top_k=2, expert_hidden=8),
    "qwen3_moe": dict(mlp="moe", num_experts=4, top_k=2, expert_hidden=8, dense_layers=(1,),
                      qk_norm="head", moe_options={"norm_topk_prob": True}),
    "gpt_oss": dict(mlp="moe", num_experts=4, top_k=2, expert_hidden=8, qkv_bias=True,
                    o_bias=True, attn_sinks=True, tie_embeddings=False,
                    moe_options=dict(router="topk_softmax", router_bias=True,
                                     expert="clamped_swiglu", expert_bias=True)),
    "deepseek_v3": dict(mlp="moe", num_experts=8, top_k=2, expert_hidden=8, dense_layers=(0,),
                        attention="mla", q_lora_rank=6, kv_lora_rank=5, qk_nope_head_dim=4,
                        qk_rope_head_dim=2, v_head_dim=3, tie_embeddings=False,
                        moe_options=dict(router="sigmoid_grouped", n_group=4, topk_group=2,
                                         n_shared_experts=2, routed_scaling_factor=2.5)),
    "qwen2_moe-like": dict(mlp="moe", num_experts=4, top_k=2, expert_hidden=8,
                           moe_options=dict(shared_intermediate_size=12,
                                            shared_expert_gate=True)),
}


@pytest.mark.parametrize("family", sorted(SWITCHES))
def test_the_count_is_the_built_models(family):
    minitx.manual_seed(0)
    model = Decoder(DecoderConfig(**TINY, **SWITCHES[family]))
    params = dict(model.named_parameters())
    n = count_parameters(model.config)
    assert n["total"] == sum(int(np.prod(p.shape)) for p in params.values())
    # active: all but the n − k experts a token skips, in each MoE layer
    skipped = 0
    for block in model.blocks:
        experts = getattr(block.mlp, "experts", None)
        if experts is not None:
            one = sum(int(np.prod(p.shape[1:])) for p in experts.parameters())
            skipped += (experts.num_experts - block.mlp.top_k) * one
    assert skipped > 0 and n["active"] == n["total"] - skipped


def test_gpt_oss_20b_preset_is_its_config_json():
    """The preset is what decoder_config reads from gpt-oss-20b's config.json (its
    forward-pass keys, as the Hub's file writes them)."""
    cfg = {"model_type": "gpt_oss", "attention_bias": True, "head_dim": 64,
           "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
           "layer_types": ["full_attention" if i % 2 else "sliding_attention"
                           for i in range(24)],
           "max_position_embeddings": 131072, "num_attention_heads": 64,
           "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
           "num_local_experts": 32, "pad_token_id": 199999, "rms_norm_eps": 1e-05,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                            "original_max_position_embeddings": 4096, "rope_type": "yarn",
                            "truncate": False},
           "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
           "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088}
    got = decoder_config(cfg)
    assert count_parameters(got) == counts("gpt-oss-20b")
    assert dataclasses.asdict(got) == dataclasses.asdict(
        minitx.models.decoder.check_config(preset("gpt-oss-20b")))


def test_an_unknown_preset_is_refused_by_name():
    with pytest.raises(ValueError, match="name.*Llama-3.2-1B"):
        preset("Llama-4")
    assert {"Llama-3.2-1B", "Qwen3-0.6B", "Gemma-3-270M", "OLMo-2-1B", "Mixtral-8x7B",
            "gpt-oss-20b", "DeepSeek-V3"} <= set(PRESETS)
