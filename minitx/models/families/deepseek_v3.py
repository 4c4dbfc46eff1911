"""DeepSeek-V3 (DeepSeek-AI, 2024): Llama with multi-head latent attention (a cache of one
latent per token, ``models/latent_attention.py``) and, after the first
``first_k_dense_replace`` dense layers, k of n sigmoid-scored experts chosen within the best
groups, plus shared experts, their weights scaled by ρ (``routed_scaling_factor``).

HF's ``DeepseekV3Config``: the expert count is ``n_routed_experts``; its rotary dims are
stored as interleaved pairs unless ``rope_interleave`` is false. The router has no
load-balancing loss (its bias is the correction).
"""
from .base import fail
from .llama import Llama
from .mixtral import EXPERT_KEYS

# multi-head latent attention's sizes, by HF's names (the same as DecoderConfig's)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")
# the grouped sigmoid router's keys, by HF's names
ROUTER_KEYS = ("n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
               "norm_topk_prob", "topk_method", "scoring_func")


class DeepseekV3(Llama):
    model_type = "deepseek_v3"
    switches = dict(mlp="moe", attention="mla")
    keys = {"mlp_bias": None}                   # not a key of HF's DeepseekV3Config
    reads = {*MLA_KEYS, "rope_interleave", *EXPERT_KEYS, *ROUTER_KEYS,
             "first_k_dense_replace"}
    defaults = dict(num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    max_position_embeddings=4096, n_routed_experts=256,
                    num_experts_per_tok=8, moe_intermediate_size=2048, norm_topk_prob=True,
                    first_k_dense_replace=3, n_group=8, topk_group=4,
                    routed_scaling_factor=2.5, n_shared_experts=1)
    experts_key = "n_routed_experts"
    aux_key = None                              # no load-balancing loss (module docstring)
    shared_expert = "shared_experts"            # the shared experts' module, in the plural
    presets = {
        # DeepSeek-V3: latent attention, 3 dense layers, then 8 of 256 experts + 1 shared
        "DeepSeek-V3": ("deepseek-ai/DeepSeek-V3", dict(
            vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
            num_attention_heads=128, num_key_value_heads=128, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=163840, tie_word_embeddings=False,
            attention_bias=False, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, first_k_dense_replace=3,
            n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
            moe_intermediate_size=2048, n_group=8, topk_group=4, routed_scaling_factor=2.5,
            norm_topk_prob=True, topk_method="noaux_tc", scoring_func="sigmoid",
            rope_theta=10000.0,
            rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                          "original_max_position_embeddings": 4096})),
    }

    def read_extra(self, cfg, n, fields, source):
        """The latent attention's sizes, and whether the rotary dims are stored as interleaved
        pairs (HF's default: they are)."""
        return {**{k: cfg[k] for k in MLA_KEYS if k in cfg},
                "rope_interleave": cfg.get("rope_interleave", True)}

    def write_extra(self, c):
        return {**{k: getattr(c, k) for k in MLA_KEYS}, "rope_interleave": c.rope_interleave}

    def read_dense_layers(self, get, n, source):
        """The first ``first_k_dense_replace`` layers keep a dense MLP."""
        return tuple(range(min(get("first_k_dense_replace"), n)))

    def write_dense_layers(self, c):
        return {"first_k_dense_replace": len(c.dense_layers)}

    def read_moe_options(self, get, cfg, source):
        """The grouped sigmoid router, the only one HF's DeepSeek-V3 runs: another
        ``topk_method`` or ``scoring_func`` is refused."""
        for key, allowed in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
            if key in cfg and cfg[key] != allowed:
                fail(source, f"{key}={cfg[key]!r}: minitx's {self.model_type} router is "
                             f"{allowed!r}; refused")
        # norm_topk_prob may be written null; HF's ``if norm_topk_prob`` reads it as False
        return dict(router="sigmoid_grouped", norm_topk_prob=bool(cfg.get("norm_topk_prob",
                                                                          True)),
                    n_group=get("n_group"), topk_group=get("topk_group"),
                    routed_scaling_factor=float(get("routed_scaling_factor")),
                    n_shared_experts=get("n_shared_experts"))

    def write_moe_options(self, c):
        return {k: c.moe_options.get(k) for k in ("n_group", "topk_group",
                                                  "routed_scaling_factor", "n_shared_experts",
                                                  "norm_topk_prob")}
