"""SmolLM3 (Hugging Face, 2025): Llama whose every 4th layer rotates nothing (NoPE), the
head tied, and a window switched on only by ``use_sliding_window``.

HF's ``SmolLM3Config``: ``no_rope_layers`` holds 1 for a rotary layer and 0 for a NoPE
one (default: 0 at every ``no_rope_layer_interval``-th layer); with ``use_sliding_window``
and no ``layer_types``, the NoPE layers slide.
"""
from .base import fail, rotary_flags
from .llama import Llama


class SmolLM3(Llama):
    model_type = "smollm3"
    reads = {"no_rope_layers", "no_rope_layer_interval", "use_sliding_window"}
    defaults = dict(num_key_value_heads=4, max_position_embeddings=32768)
    theta = 2_000_000.0
    tied = True
    presets = {
        # SmolLM3-3B as HF's SmolLM3Config defaults describe it: GQA 16/4, a NoPE layer in
        # every four, θ = 2·10⁶
        "SmolLM3-3B": ("transformers 5.24 SmolLM3Config defaults", dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
            num_attention_heads=16, num_key_value_heads=4, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=32768, tie_word_embeddings=True,
            rope_theta=2000000.0, use_sliding_window=False, no_rope_layer_interval=4)),
    }

    def read_layers(self, cfg, n, source):
        window = cfg.get("sliding_window")
        types = cfg.get("layer_types")
        if types is None:
            slide = cfg.get("use_sliding_window", False) and window is not None
            types = ["sliding_attention" if slide and not r else "full_attention"
                     for r in rotary_flags(cfg, n, source)]
        elif "sliding_attention" in types and not cfg.get("use_sliding_window", False):
            # HF's masks would slide and its flash path would not: no one model to follow
            fail(source, "layer_types has sliding_attention layers but use_sliding_window is "
                         "false; refused")
        return self.typed_layers(types, window, source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window,
                "use_sliding_window": c.sliding_window is not None,
                "layer_types": [f"{t}_attention" for t in c.layer_types]}

    def read_extra(self, cfg, n, fields, source):
        return {"nope_layers": tuple(i for i, r in enumerate(rotary_flags(cfg, n, source))
                                     if not r)}

    def write_extra(self, c):
        return {"no_rope_layers": [int(i not in c.nope_layers) for i in range(c.num_layers)]}
