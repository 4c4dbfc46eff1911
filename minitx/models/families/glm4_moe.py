"""GLM-4.5 (Zhipu AI, 2025): DeepSeek-V3's experts and router under grouped-query attention
instead of latents: biases on q, k and v (not on o), half of each head rotated (in halves,
not interleaved), RMSNorm on each head's q and k when ``use_qk_norm``.

HF's ``Glm4MoeConfig``: its attention is Cohere's with GQA's projections, its MoE DeepSeek-V3's
(the router's logits in float32, ``e_score_correction_bias`` under ``mlp.gate``). The class
has no ``head_dim`` field, but HF's attention reads one when the file has it (the released
ones do). The multi-token-prediction layer a released file carries after the last layer
(``num_nextn_predict_layers``) is not part of the forward: HF skips its tensors on load, and
so does minitx.
"""
from .base import fresh
from .deepseek_v3 import ROUTER_KEYS, DeepseekV3
from .mixtral import EXPERT_KEYS


class Glm4Moe(DeepseekV3):
    model_type = "glm4_moe"
    switches = dict(attention="gqa", o_bias=False)          # o_proj never has a bias
    reads = fresh.of("sliding_window", "layer_types", "partial_rotary_factor", *EXPERT_KEYS,
                     *ROUTER_KEYS, "first_k_dense_replace", "use_qk_norm")
    # no latents; the rest HF's Glm4MoeConfig's (100B-A10B-like)
    defaults = dict(q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None,
                    qk_rope_head_dim=None, v_head_dim=None, num_key_value_heads=8,
                    max_position_embeddings=131072, rms_norm_eps=1e-5,
                    n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408,
                    first_k_dense_replace=1, n_group=1, topk_group=1,
                    routed_scaling_factor=1.0, n_shared_experts=1, use_qk_norm=False)
    partial_rotary = 0.5                     # HF's default share, unless the file says
    presets = {
        # GLM-4.5-Air ("106B-A12B"): 8 of 128 experts + 1 shared after one dense layer, 96
        # query heads of 128 dims on 8 KV heads, half of each head rotated
        "GLM-4.5-Air": ("zai-org/GLM-4.5-Air", dict(
            vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
            num_attention_heads=96, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=131072, tie_word_embeddings=False,
            attention_bias=True, partial_rotary_factor=0.5, rope_theta=1000000.0,
            use_qk_norm=False, first_k_dense_replace=1, n_routed_experts=128,
            n_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=1408,
            n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
            num_nextn_predict_layers=1)),
    }

    def read_extra(self, cfg, n, fields, source):
        """Per-head QK-norm before the rotation when ``use_qk_norm`` (Qwen3's)."""
        return {"qk_norm": "head" if cfg.get("use_qk_norm") else None}

    def write_extra(self, c):
        return {"use_qk_norm": c.qk_norm == "head"}

    def tensors_from_hf(self, tensors, model, source):
        """Without the multi-token-prediction layers (layer index ≥ the layer count)."""
        n = len(model.blocks)
        return {k: v for k, v in tensors.items() if not _beyond(k, n)}


def _beyond(key, n):
    parts = key.split(".")
    return parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= n
