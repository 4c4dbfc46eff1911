"""Llama (Meta, 2023–24): GPT-2 with RMSNorm, SwiGLU, rotary positions and grouped-query
attention, no biases — the plain family every later one changes.

HF's ``LlamaConfig`` and ``LlamaForCausalLM``; Llama 3's rope scaling is a ``rope_type``
(``nn/rotary.py``). Every layer is full: HF's Llama reads no ``sliding_window``.
"""
from .base import SIZE_KEYS, Family, fresh
from .gpt2 import GPT2


class Llama(GPT2):
    model_type = "llama"
    switches = fresh(norm="rmsnorm", mlp="swiglu", positions="rope")
    keys = fresh({
        "vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
        "intermediate_size": "ffn_hidden", "rms_norm_eps": "norm_eps", "mlp_bias": "mlp_bias",
        "pad_token_id": "padding_idx", "max_position_embeddings": "max_position"})
    # HF reads no window for Llama: the keys are accepted and change nothing, as in HF
    reads = fresh.of("sliding_window", "layer_types", "partial_rotary_factor")
    defaults = fresh(rms_norm_eps=1e-6, max_position_embeddings=2048)
    # L. = model.layers.{i}.; attention and MLP keep their inner names
    tensors = fresh({
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "ln_final.weight",
        "lm_head.weight": "unembed.weight",
        "model.layers.{i}.self_attn.*": "blocks.{i}.attn.*",
        "model.layers.{i}.mlp.*": "blocks.{i}.mlp.*",
        "model.layers.{i}.input_layernorm.weight": "blocks.{i}.ln1.weight",
        "model.layers.{i}.post_attention_layernorm.weight": "blocks.{i}.ln2.weight"})
    size_keys = SIZE_KEYS
    activation_key, activation, gelu_names = "hidden_act", "silu", Family.gelu_names
    tied = False
    presets = {
        # Llama 3.2: GQA, Llama 3's rope scaling, a tied head
        "Llama-3.2-1B": ("meta-llama/Llama-3.2-1B", dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=131072, tie_word_embeddings=True,
            attention_bias=False, mlp_bias=False, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    }

    # none of GPT-2's own: its attention options, n_inner, its Conv1D and fused c_attn (the
    # checkpoint's tensors are the model's: Linear weights, q, k, v apart)
    read_extra, write_extra = Family.read_extra, Family.write_extra
    tensors_from_hf, tensors_to_hf = Family.tensors_from_hf, Family.tensors_to_hf
