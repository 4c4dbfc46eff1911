"""Qwen2 and Qwen2.5 (Alibaba, 2024): Llama with biases on q, k and v only, and a window
that is written but switched off unless ``use_sliding_window`` (then layers from
``max_window_layers`` on slide).

HF's ``Qwen2Config``.
"""
from .llama import Llama


class Qwen2(Llama):
    model_type = "qwen2"
    switches = dict(qkv_bias=True, o_bias=False)       # q, k, v biases only
    keys = {"mlp_bias": None}
    defaults = dict(num_key_value_heads=32, max_position_embeddings=32768)
    presets = {
        # Qwen2.5: biases on q, k, v; the window written but switched off
        "Qwen2.5-0.5B": ("Qwen/Qwen2.5-0.5B", dict(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=32768, tie_word_embeddings=True,
            rope_theta=1000000.0, use_sliding_window=False, sliding_window=32768,
            max_window_layers=24)),
    }

    def read_layers(self, cfg, n, source):
        """``layer_types`` when written, else HF's: layers from ``max_window_layers`` on
        slide, when ``use_sliding_window``."""
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
        types = cfg.get("layer_types")
        if types is None:
            first = cfg.get("max_window_layers", 28)
            types = ["sliding_attention" if window is not None and i >= first else
                     "full_attention" for i in range(n)]
        return self.typed_layers(types, window, source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window, "use_sliding_window":
                c.sliding_window is not None,
                "layer_types": [f"{t}_attention" for t in c.layer_types]}
