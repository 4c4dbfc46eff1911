"""OLMo 3 (AI2, 2025): OLMo 2 with three sliding layers to one full one, each layer type
with its own rope (YaRN on the full layers of the long-context models).

HF's ``Olmo3Config``: ``rope_parameters`` per layer type. From an older file,
``rope_scaling`` and ``rope_theta`` go to the full layers only: HF's conversion pops
``rope_theta`` for them, so the sliding layers keep the class's θ = 500,000 whatever the
file says. minitx follows HF.
"""
from .base import fail
from .olmo2 import Olmo2


class Olmo3(Olmo2):
    model_type = "olmo3"
    defaults = dict(sliding_window=4096)
    theta = 500_000.0
    presets = {
        # OLMo 3 7B as HF's Olmo3Config defaults describe it: windows of 4096 tokens in
        # three layers of four
        "OLMo-3-7B": ("transformers 5.24 Olmo3Config defaults", dict(
            vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=2048, tie_word_embeddings=False,
            attention_bias=False, sliding_window=4096, rope_theta=500000.0)),
    }

    def read_ropes(self, cfg, source):
        """A rope per layer type (transformers 5); from an older file, ``rope_theta`` and
        ``rope_scaling`` for the full layers and the class's θ for the sliding ones, as HF's
        conversion does."""
        params = cfg.get("rope_parameters")
        if params and "full_attention" in params:
            return self.per_type_ropes(params, cfg, source)
        if params:
            fail(source, "rope_parameters must give one rope per layer type "
                         "(full_attention, sliding_attention) for olmo3, as HF's does")
        theta = cfg.get("rope_theta", self.theta)     # the full layers' only
        full = self.rope_dict({"rope_theta": theta, **(cfg.get("rope_scaling") or {})}, cfg,
                              source, "rope_scaling")
        return full, self.rope_dict({"rope_type": "default", "rope_theta": self.theta}, cfg,
                                    source)

    def write_ropes(self, c):
        return {"rope_parameters": {"full_attention": dict(c.rope),
                                    "sliding_attention": dict(c.local_rope or c.rope)}}

    def read_layers(self, cfg, n, source):
        """``layer_types``, else HF's: every 4th layer full."""
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 4 else
                                           "full_attention" for i in range(n)]
        return self.typed_layers(types, cfg.get("sliding_window"), source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window,
                "layer_types": [f"{t}_attention" for t in c.layer_types]}
