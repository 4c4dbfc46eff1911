"""Real decoders' published configurations, as ``DecoderConfig`` presets: their sizes cost
nothing to count (``count_parameters``, ``kv_cache_bytes``), and none is built at full size.

    from minitx.models import preset, count_parameters
    count_parameters(preset("gpt-oss-20b"))      # {"total": 20.9e9, ..., "active": 4.2e9}

Each preset is the translation of the model's ``config.json`` on the HuggingFace Hub (the
repository named in ``SOURCES``) into minitx's switches — the translation
``minitx.pretrained.decoders.decoder_config`` makes of that file. Only numbers that change
the forward pass are kept; token ids and training settings are not. ``max_position`` is the
file's ``max_position_embeddings``.
"""
from __future__ import annotations

import dataclasses

from .. import validate
from .decoder import DecoderConfig

__all__ = ["PRESETS", "SOURCES", "preset"]

# name → the Hub repository whose config.json the preset transcribes
SOURCES = {
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B",
    "Qwen3-0.6B": "Qwen/Qwen3-0.6B",
    "Gemma-3-270M": "google/gemma-3-270m",
    "OLMo-2-1B": "allenai/OLMo-2-0425-1B",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-v0.1",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
}

PRESETS = {
    # Llama 3.2: GQA (32 query heads, 8 key/value), Llama 3 rope scaling, tied embeddings
    "Llama-3.2-1B": DecoderConfig(
        vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
        head_dim=64, ffn_hidden=8192, norm_eps=1e-5, max_position=131072,
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}),
    # Qwen3: QK-norm per head, a head dim (128) above E/H (64), tied embeddings
    "Qwen3-0.6B": DecoderConfig(
        vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, ffn_hidden=3072, norm_eps=1e-6, qk_norm="head", max_position=40960,
        rope={"rope_type": "default", "rope_theta": 1000000.0}),
    # Gemma 3: sandwich norms with (1 + w), GeGLU, five local layers (window 512, base 10^4)
    # to one global (base 10^6), one key/value head, √E on the embeddings
    "Gemma-3-270M": DecoderConfig(
        vocab_size=262144, hidden_size=640, num_layers=18, num_heads=4, num_kv_heads=1,
        head_dim=256, ffn_hidden=2048, norm_eps=1e-6, mlp="geglu", qk_norm="head",
        norm_placement="sandwich", norm_unit_offset=True, norm_scale_in_float32=True,
        embed_scale=True, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(18)),
        rope={"rope_type": "default", "rope_theta": 1000000.0},
        local_rope={"rope_type": "default", "rope_theta": 10000.0}, padding_idx=0,
        max_position=32768),
    # OLMo 2: norms after each sublayer, QK-norm over the whole projection, untied head
    "OLMo-2-1B": DecoderConfig(
        vocab_size=100352, hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16,
        ffn_hidden=8192, norm_eps=1e-6, qk_norm="proj", norm_placement="post",
        norm_scale_in_float32=True, tie_embeddings=False, max_position=4096,
        rope={"rope_type": "default", "rope_theta": 500000.0}),
    # Mixtral: 8 SwiGLU experts of width 14336 in every layer, 2 per token, softmax router
    "Mixtral-8x7B": DecoderConfig(
        vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        ffn_hidden=14336, norm_eps=1e-5, tie_embeddings=False, max_position=32768,
        rope={"rope_type": "default", "rope_theta": 1000000.0}, mlp="moe", num_experts=8,
        top_k=2, expert_hidden=14336, router_aux_loss_coef=0.02),
    # gpt-oss: 32 clamped-SwiGLU experts with biases, 4 per token, router with a bias;
    # sinks; 128-token windows and full layers alternating; YaRN ×32
    "gpt-oss-20b": DecoderConfig(
        vocab_size=201088, hidden_size=2880, num_layers=24, num_heads=64, num_kv_heads=8,
        head_dim=64, ffn_hidden=2880, norm_eps=1e-5, qkv_bias=True, o_bias=True,
        attn_sinks=True, norm_scale_in_float32=True, tie_embeddings=False,
        sliding_window=128, padding_idx=199999,
        layer_types=tuple("full" if i % 2 else "sliding" for i in range(24)),
        rope={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
              "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
              "original_max_position_embeddings": 4096},
        max_position=131072, mlp="moe", num_experts=32, top_k=4, expert_hidden=2880,
        router_aux_loss_coef=0.9,
        moe_options=dict(router="topk_softmax", router_bias=True, expert="clamped_swiglu",
                         expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702)),
    # DeepSeek-V3: multi-head latent attention; 3 dense layers, then 58 MoE layers of 256
    # sigmoid-routed experts in 8 groups (4 kept), 8 per token, one shared expert, ρ = 2.5.
    # Its config.json also declares one multi-token-prediction module
    # (num_nextn_predict_layers = 1, about 14B parameters), which is not part of the forward
    # pass and not of this preset.
    "DeepSeek-V3": DecoderConfig(
        vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128,
        ffn_hidden=18432, norm_eps=1e-6, attention="mla", q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        rope_interleave=True, tie_embeddings=False, max_position=163840,
        rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
              "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
              "original_max_position_embeddings": 4096},
        mlp="moe", num_experts=256, top_k=8, expert_hidden=2048, dense_layers=(0, 1, 2),
        moe_options=dict(router="sigmoid_grouped", norm_topk_prob=True, n_group=8,
                         topk_group=4, routed_scaling_factor=2.5, n_shared_experts=1)),
}


def preset(name: str) -> DecoderConfig:
    """A fresh copy of ``PRESETS[name]`` (edit it freely)."""
    validate.choice(name, "name", tuple(PRESETS), owner="preset")
    return dataclasses.replace(PRESETS[name], rope=dict(PRESETS[name].rope),
                               moe_options=dict(PRESETS[name].moe_options))
