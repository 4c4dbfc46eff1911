"""Mistral (Jiang et al. 2023): Llama whose every layer slides over the last W tokens.

HF's ``MistralConfig``. A file with ``layer_types`` is what HF's ``AutoConfig`` reads as
Ministral's: each layer slides or not as the list says.
"""
from .llama import Llama


class Mistral(Llama):
    model_type = "mistral"
    keys = {"mlp_bias": None}                      # HF's Mistral has no MLP biases …
    bias_key = None                                # … and no attention biases
    defaults = dict(sliding_window=4096, num_key_value_heads=8,
                    max_position_embeddings=131072)
    presets = {
        # Mistral 7B v0.1: every layer slides over 4096 tokens
        "Mistral-7B-v0.1": ("mistralai/Mistral-7B-v0.1", dict(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=32768, tie_word_embeddings=False,
            rope_theta=10000.0, sliding_window=4096)),
    }

    def read_layers(self, cfg, n, source):
        """One window for every layer (or none); with ``layer_types``, Ministral's."""
        if "layer_types" not in cfg:
            return cfg.get("sliding_window"), None
        return self.typed_layers(cfg["layer_types"], cfg.get("sliding_window"), source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window}
