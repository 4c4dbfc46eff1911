"""Gemma 3 (Google, 2025): norms before and after each sublayer (the sandwich), zero-centred
gains (1 + w) in float32, QK-norm per head, GeGLU, √E on the embeddings, the head tied; five
local layers (window W, their own rope base) to one global layer; the scale 1/√s with
s = ``query_pre_attn_scalar``, and an optional soft-cap on the logits.

HF's ``Gemma3TextConfig``. HF's Gemma 3 does not apply ``attn_logit_softcapping``.
``rope_parameters`` may be one dict per layer type (``Family.per_type_ropes``: a YaRN
entry's ``truncate`` is not read, as in HF).
"""
from .llama import Llama


class Gemma3(Llama):
    model_type = "gemma3_text"
    switches = dict(mlp="geglu", qk_norm="head", norm_placement="sandwich",
                    norm_unit_offset=True, norm_scale_in_float32=True, embed_scale=True)
    keys = {"mlp_bias": None, "query_pre_attn_scalar": "query_pre_attn_scalar",
            "final_logit_softcapping": "final_logit_softcap"}
    reads = {"rope_local_base_freq"}
    defaults = dict(num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                    sliding_window=4096, max_position_embeddings=131072)
    # the sandwich: HF's post_attention_layernorm here follows the attention (ln1_post), and
    # Llama's norm before the MLP (ln2) is pre_feedforward_layernorm
    tensors = {
        "model.layers.{i}.post_attention_layernorm.weight": "blocks.{i}.ln1_post.weight",
        "model.layers.{i}.pre_feedforward_layernorm.weight": "blocks.{i}.ln2.weight",
        "model.layers.{i}.post_feedforward_layernorm.weight": "blocks.{i}.ln2_post.weight"}
    activation_key, activation = "hidden_activation", "gelu_pytorch_tanh"
    tied = True
    theta, local_theta = 1_000_000.0, 10_000.0      # the global layers' base, the local ones'
    presets = {
        # Gemma 3: five local layers to one global, two rope bases, GeGLU
        "Gemma-3-270M": ("google/gemma-3-270m", dict(
            vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
            tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256,
            rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512,
            _sliding_window_pattern=6, final_logit_softcapping=None,
            attn_logit_softcapping=None, pad_token_id=0)),
    }

    def read_ropes(self, cfg, source):
        """A rope per layer type (transformers 5), or the older rope_theta / rope_scaling for
        the global layers and ``rope_local_base_freq`` for the local ones."""
        params = cfg.get("rope_parameters")
        if params and "full_attention" in params:
            return self.per_type_ropes(params, cfg, source)
        rope, _ = super().read_ropes(cfg, source)
        if params:
            return rope, None
        return rope, self.rope_dict({"rope_type": "default", "rope_theta": cfg.get(
            "rope_local_base_freq", self.local_theta)}, cfg, source)

    def write_ropes(self, c):
        return {"rope_parameters": {"full_attention": dict(c.rope),
                                    "sliding_attention": dict(c.local_rope or c.rope)}}

    def read_layers(self, cfg, n, source):
        """``layer_types``, else HF's: every 6th layer (``sliding_window_pattern``) global."""
        types = cfg.get("layer_types")
        if types is None:
            period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
            types = ["sliding_attention" if (i + 1) % period else "full_attention"
                     for i in range(n)]
        return self.typed_layers(types, cfg.get("sliding_window"), source)

    def write_layers(self, c):
        return {"sliding_window": c.sliding_window,
                "layer_types": [f"{t}_attention" for t in c.layer_types]}

    def write_extra(self, c):
        # 1/√D is s = D: HF's Gemma always has an s
        return {"query_pre_attn_scalar": c.query_pre_attn_scalar or c.head_dim}

