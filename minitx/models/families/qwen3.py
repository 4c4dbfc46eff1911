"""Qwen3 (Alibaba, 2025): Qwen2 with RMSNorm on each head's q and k before the rotation, and
one ``attention_bias`` for all four projections again.

HF's ``Qwen3Config`` (its attention is Qwen2's with ``q_norm`` and ``k_norm``).
"""
from .qwen2 import Qwen2


class Qwen3(Qwen2):
    model_type = "qwen3"
    switches = dict(qkv_bias=None, o_bias=None, qk_norm="head")
    defaults = dict(head_dim=128)
    presets = {
        # Qwen3: QK-norm, a head dim wider than E/H
        "Qwen3-0.6B": ("Qwen/Qwen3-0.6B", dict(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=40960, tie_word_embeddings=True,
            attention_bias=False, rope_theta=1000000.0, use_sliding_window=False,
            sliding_window=None, max_window_layers=28)),
    }
