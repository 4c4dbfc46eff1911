"""MiniMax-M2 (MiniMax, 2025): Mixtral with RMSNorm over the whole projected q and k (OLMo
2's QK-norm), a share of each head rotated, and a sigmoid router whose correction bias
chooses the experts but does not weigh them (DeepSeek-V3's, in one group); every layer is
full.

HF's ``MiniMaxM2Config``: the released checkpoints give the rotated share as ``rotary_dim``
(dims per head), read as ``partial_rotary_factor`` = rotary_dim / head_dim when
``rope_parameters`` does not say it; the correction bias is ``block_sparse_moe.
e_score_correction_bias``, beside the router, not in it.
"""
from .base import Family
from .mixtral import Mixtral


class MiniMaxM2(Mixtral):
    model_type = "minimax_m2"
    switches = dict(qk_norm="proj")
    reads = {"rotary_dim"}
    defaults = dict(head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=196608,
                    num_local_experts=256, num_experts_per_tok=8)
    theta = 5_000_000.0
    partial_rotary = 1.0                      # every dim, unless rotary_dim says fewer
    correction_bias = "e_score_correction_bias"
    presets = {
        # MiniMax-M2 as HF's class defaults describe it: 8 of 256 experts, half of each
        # head rotated (rotary_dim 64 of 128), QK-norm over the projection
        "MiniMax-M2": ("transformers 5.24 MiniMaxM2Config defaults", dict(
            vocab_size=200064, hidden_size=3072, intermediate_size=1536, num_hidden_layers=62,
            num_attention_heads=48, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=196608, tie_word_embeddings=False,
            rotary_dim=64, rope_theta=5000000.0, num_local_experts=256,
            num_experts_per_tok=8)),
    }

    # HF's MiniMax-M2 slides no layer, whatever sliding_window says (Llama's rule)
    read_layers, write_layers = Family.read_layers, Family.write_layers

    def read_ropes(self, cfg, source):
        """Mixtral's, with ``rotary_dim`` as the rotated share where the rope does not say."""
        if cfg.get("rotary_dim") is not None:
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            share = {"partial_rotary_factor": cfg["rotary_dim"] / head_dim}
            cfg = {**cfg, "rope_parameters": {**share, **cfg["rope_parameters"]}} \
                if cfg.get("rope_parameters") else {**share, **cfg}
        return super().read_ropes(cfg, source)

    def read_moe_options(self, get, cfg, source):
        """σ scores, the top k chosen by score + bias, their scores renormalised."""
        return dict(router="sigmoid_grouped", norm_topk_prob=True)

    def write_moe_options(self, c):
        return {}
