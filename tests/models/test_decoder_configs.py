"""Published ``config.json`` files, as their checkpoints ship them (written by transformers
4.x, with the older ``rope_theta`` / ``rope_scaling`` keys), read by
``minitx.pretrained.decoders.decoder_config``: every key is understood, the switches are the
family's, and the parameters counted from the configuration alone are the figures the model
cards publish, to the precision they publish them. No weights are needed."""
import pytest

from minitx.models import count_parameters
from minitx.pretrained.decoders import decoder_config

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}

LLAMA_3_2_3B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 24, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}

GEMMA_3_270M = {
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
    "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                    for i in range(18)],
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
    "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}


def test_qwen3_0_6b():
    c = decoder_config(QWEN3_0_6B)
    assert (c.qk_norm, c.head_dim, c.sliding_window, c.tie_embeddings) == ("head", 128, None,
                                                                         True)
    assert c.rope == {"rope_type": "default", "rope_theta": 1000000}
    n = count_parameters(c)
    # the model card: 0.6B parameters, 0.44B of them not embeddings
    assert round(n["total"] / 1e9, 1) == 0.6 and round(n["non_embedding"] / 1e9, 2) == 0.44


def test_llama_3_2_3b():
    c = decoder_config(LLAMA_3_2_3B)
    assert c.rope["rope_type"] == "llama3" and c.rope["factor"] == 32.0
    assert (c.num_kv_heads, c.norm_eps, c.qkv_bias) == (8, 1e-05, False)
    assert round(count_parameters(c)["total"] / 1e9, 2) == 3.21         # the card: 3.21B


def test_gemma_3_270m():
    c = decoder_config(GEMMA_3_270M)
    full = [i for i, t in enumerate(c.layer_types) if t == "full"]
    assert full == [5, 11, 17] and c.sliding_window == 512
    assert c.local_rope["rope_theta"] == 10000.0 and c.rope["rope_theta"] == 1000000.0
    assert (c.query_pre_attn_scalar, c.embed_scale, c.norm_unit_offset) == (256, True, True)
    assert c.attn_logit_softcap is None                  # not applied, as in HF's Gemma 3
    n = count_parameters(c)
    # Google's announcement: 270M parameters, 170M embedding and 100M in the blocks
    assert round(n["total"] / 1e6, -1) == 270
    assert round(n["embedding"] / 1e6, -1) == 170
    assert round(n["non_embedding"] / 1e6, -1) == 100


@pytest.mark.parametrize("config", [QWEN3_0_6B, LLAMA_3_2_3B, GEMMA_3_270M],
                         ids=["qwen3", "llama", "gemma3"])
def test_one_unknown_key_is_refused_by_name(config):
    with pytest.raises(ValueError, match="'use_mrope' are not known"):
        decoder_config({**config, "use_mrope": True})
