"""gpt-oss (OpenAI, 2025): Mixtral's mixture with a learned sink logit per head (a head may
attend to nothing), biases on every projection, sliding and full layers alternating, YaRN,
and clamped SwiGLU experts with biases under a softmax over the top k router logits.

HF's ``GptOssConfig``. Its experts are stored stacked and transposed, gate and up
interleaved (docs/moe.md); its router is ``mlp.router``.
"""
from .mixtral import Mixtral


class GptOss(Mixtral):
    model_type = "gpt_oss"
    switches = dict(attn_sinks=True, norm_scale_in_float32=True)
    bias_key = "attention_bias"                    # unlike Mistral's, read (HF's default: on)
    reads = {"swiglu_limit", "swiglu_alpha"}
    defaults = dict(head_dim=64, attention_bias=True, sliding_window=128,
                    num_experts=128, num_experts_per_tok=4, num_local_experts=None,
                    swiglu_limit=7.0, swiglu_alpha=1.702,
                    rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False,
                                     "original_max_position_embeddings": 4096,
                                     "rope_theta": 150000.0})
    theta = defaults["rope_parameters"]["rope_theta"]
    expert_layout = "interleaved"              # gate and up columns alternate, (in, out)
    router_module = "router"
    expert_files = ("gate_proj", "up_proj", "down_proj")
    moe_files_module = "mlp"
    presets = {
        # gpt-oss: sinks, biases, alternating windows, YaRN, clamped SwiGLU experts
        "gpt-oss-20b": ("openai/gpt-oss-20b", dict(
            vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
            num_attention_heads=64, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=131072, tie_word_embeddings=False,
            attention_bias=True, sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 12, rope_theta=150000.0,
            rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "truncate": False,
                          "original_max_position_embeddings": 4096},
            num_local_experts=32, num_experts_per_tok=4, swiglu_limit=7.0,
            router_aux_loss_coef=0.9, pad_token_id=199999)),
    }

    def read_layers(self, cfg, n, source):
        """``layer_types``, else HF's default: sliding, full, sliding, …"""
        types = cfg.get("layer_types") or ["full_attention" if i % 2 else "sliding_attention"
                                           for i in range(n)]
        return self.typed_layers(types, cfg.get("sliding_window"), source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window,
                "layer_types": [f"{t}_attention" for t in c.layer_types]}

    def read_moe_options(self, get, cfg, source):
        return dict(router="topk_softmax", router_bias=True, expert="clamped_swiglu",
                    expert_bias=True, swiglu_limit=float(get("swiglu_limit")),
                    swiglu_alpha=float(get("swiglu_alpha")))

    def write_moe_options(self, c):
        o = c.moe_options
        return {"swiglu_limit": o.get("swiglu_limit"), "swiglu_alpha": o.get("swiglu_alpha")}
