"""Qwen3-MoE (Alibaba, 2025): Qwen3's attention with k of n narrow experts, their weights
renormalised over the chosen ones when ``norm_topk_prob``; layers in ``mlp_only_layers`` or
off the ``decoder_sparse_step`` stay dense. A window, when switched on, for every layer.

HF's ``Qwen3MoeConfig``.
"""
from .mixtral import EXPERT_KEYS
from .qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    model_type = "qwen3_moe"
    switches = dict(mlp="moe")
    reads = {*EXPERT_KEYS, "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}
    defaults = dict(num_key_value_heads=4, head_dim=None, router_aux_loss_coef=0.001,
                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                    norm_topk_prob=False, decoder_sparse_step=1)
    presets = {
        # Qwen3-MoE: 8 of 128 narrow experts in every layer
        "Qwen3-30B-A3B": ("Qwen/Qwen3-30B-A3B", dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=40960, tie_word_embeddings=False,
            attention_bias=False, rope_theta=1000000.0, use_sliding_window=False,
            sliding_window=None, max_window_layers=48, num_experts=128,
            num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[])),
    }

    def read_layers(self, cfg, n, source):
        """One window for every layer, and only when ``use_sliding_window`` says so."""
        return (cfg.get("sliding_window") if cfg.get("use_sliding_window", False)
                else None), None

    def write_layers(self, c):
        return {"use_sliding_window": c.sliding_window is not None,
                "sliding_window": c.sliding_window}

    def read_dense_layers(self, get, n, source):
        """HF's rule: layer i stays dense when in ``mlp_only_layers`` or when i + 1 is not a
        multiple of ``decoder_sparse_step``."""
        only, step = set(get("mlp_only_layers") or ()), get("decoder_sparse_step")
        return tuple(i for i in range(n) if i in only or (i + 1) % step)

    def write_dense_layers(self, c):
        return {"mlp_only_layers": list(c.dense_layers), "decoder_sparse_step": 1}

    def read_moe_options(self, get, cfg, source):
        return dict(norm_topk_prob=bool(get("norm_topk_prob")))

    def write_moe_options(self, c):
        return {"norm_topk_prob": c.moe_options.get("norm_topk_prob")}
