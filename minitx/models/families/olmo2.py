"""OLMo 2 (AI2, 2024): Llama with each sublayer's output normalised inside the residual,
h + Norm(F(h)), and RMSNorm over the whole projected q and k; the norms' scale applied in
float32, as HF's.

HF's ``Olmo2Config``: its norms are ``post_attention_layernorm`` and
``post_feedforward_layernorm``, and every layer is full.
"""
from .llama import Llama


class Olmo2(Llama):
    model_type = "olmo2"
    switches = dict(qk_norm="proj", norm_placement="post", norm_scale_in_float32=True)
    keys = {"mlp_bias": None}
    defaults = dict(rms_norm_eps=1e-5)
    tensors = {
        "model.layers.{i}.input_layernorm.weight": None,
        "model.layers.{i}.post_attention_layernorm.weight": "blocks.{i}.ln1_post.weight",
        "model.layers.{i}.post_feedforward_layernorm.weight": "blocks.{i}.ln2_post.weight"}
    presets = {
        # OLMo 2: norms after each sublayer, QK-norm over the projection
        "OLMo-2-1B": ("allenai/OLMo-2-0425-1B", dict(
            vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=4096, tie_word_embeddings=False,
            attention_bias=False, rope_theta=500000.0)),
    }
