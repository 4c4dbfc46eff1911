"""Qwen3-Next (Alibaba, 2025), a hybrid: three gated DeltaNet layers
(``models/mixers/gated_deltanet.py``) to one gated attention layer, whose q_proj also yields
a gate σ(g) on each head's output and which rotates a quarter of each head; zero-centred
norms (1 + w) in float32; Qwen3-MoE's experts plus one shared expert of its own width behind
a sigmoid gate.

HF's ``Qwen3NextConfig``: the DeltaNet layers are ``linear_attn``; the multi-token
prediction tensors (``mtp.``) are not in HF's forward and are skipped.
"""
from .base import fail
from .qwen3_moe import Qwen3Moe

# the gated DeltaNet's sizes: config.json key → the mixer's option, and HF's defaults
LINEAR_KEYS = {"linear_num_key_heads": "num_k_heads", "linear_num_value_heads": "num_v_heads",
               "linear_key_head_dim": "head_k_dim", "linear_value_head_dim": "head_v_dim",
               "linear_conv_kernel_dim": "conv_kernel"}
LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32,
                   "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_conv_kernel_dim": 4}
_NAMES = {"full_attention": "full", "linear_attention": "gated_deltanet"}  # HF's → minitx's


class Qwen3Next(Qwen3Moe):
    model_type = "qwen3_next"
    switches = dict(norm_unit_offset=True, norm_scale_in_float32=True, attn_output_gate=True)
    reads = {*LINEAR_KEYS, "full_attention_interval", "shared_expert_intermediate_size"}
    defaults = dict(num_key_value_heads=2, head_dim=256, num_experts=512,
                    num_experts_per_tok=10, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512, norm_topk_prob=True)
    # the DeltaNet layers' module, named for those layers only (a typed entry, base.py)
    tensors = {"model.layers.{i}.linear_attn.*": ("blocks.{i}.attn.*", "gated_deltanet")}
    partial_rotary = 0.25
    presets = {
        # Qwen3-Next: three gated DeltaNet layers to one gated attention layer (a quarter of
        # each head rotated), 10 of 512 narrow experts plus a gated shared one
        "Qwen3-Next-80B-A3B": ("Qwen/Qwen3-Next-80B-A3B-Instruct", dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
            num_attention_heads=16, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=262144, tie_word_embeddings=False,
            attention_bias=False, rope_theta=10000000.0, partial_rotary_factor=0.25,
            full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
            num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
            shared_expert_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[])),
    }

    def read_layers(self, cfg, n, source):
        """``layer_types``, else linear layers with every ``full_attention_interval``-th one
        full."""
        types = cfg.get("layer_types")
        if types is None:
            every = cfg.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                     for i in range(n)]
        if not set(types) <= set(_NAMES) or len(types) != n:
            fail(source, f"layer_types must give one of {sorted(_NAMES)} for each of the {n} "
                         f"layers, got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        back = {v: k for k, v in _NAMES.items()}
        return {"layer_types": [back.get(t, t) for t in c.layer_types]}

    def read_extra(self, cfg, n, fields, source):
        """The DeltaNet's sizes as the mixer's options, HF's defaults for those a file leaves
        out; a model without experts is refused."""
        if not fields["num_experts"]:
            fail(source, "num_experts=0 (every MLP dense) is not translated for qwen3_next; "
                         "refused")
        sizes = {**LINEAR_DEFAULTS, **{k: cfg[k] for k in LINEAR_KEYS if k in cfg}}
        return {"mixer_options": {"gated_deltanet": {LINEAR_KEYS[k]: v
                                                     for k, v in sizes.items()}}}

    def write_extra(self, c):
        linear = c.mixer_options.get("gated_deltanet", {})
        return {k: linear.get(v) for k, v in LINEAR_KEYS.items()}

    def read_moe_options(self, get, cfg, source):
        """A shared expert of its own width, sigmoid-gated."""
        return dict(norm_topk_prob=bool(get("norm_topk_prob")),
                    shared_intermediate_size=get("shared_expert_intermediate_size"),
                    shared_expert_gate=True)

    def write_moe_options(self, c):
        return {"norm_topk_prob": c.moe_options.get("norm_topk_prob"),
                "shared_expert_intermediate_size":
                    c.moe_options.get("shared_intermediate_size")}

    def tensors_from_hf(self, tensors, model, source):
        return {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
