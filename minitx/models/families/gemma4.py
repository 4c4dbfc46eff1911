"""Gemma 4 (Google, 2026), the text model: Gemma 3's layer (the sandwich, GeGLU, QK-norm per
head, five local layers to one global) with plain gains (w, not 1 + w), values normalised
too (without a gain), the scores unscaled (s = 1), and a learned number on each layer's
output; its global layers have heads of their own size and key/value heads of their own, may
take their values from the keys' projection, and rotate "proportionally"; its last layers
may read an earlier layer's keys and values (``kv_shared_layers``, ``attention/shared_kv.py``).

HF's ``Gemma4TextConfig``: ``global_head_dim`` and ``num_global_key_value_heads`` (the
"full_attention" layers'), ``attention_k_eq_v``, ``num_kv_shared_layers`` (the last n layers
each read the last earlier layer of their type), ``use_double_wide_mlp`` (those layers' MLP
twice as wide). Its per-layer embeddings (``hidden_size_per_layer_input`` > 0, Gemma 4 E2B
and E4B) and its mixture-of-experts block beside the MLP (``enable_moe_block``, 26B-A4B) are
not implemented here and are refused by name; HF's class turns the embeddings on by
default, so a file must say 0. Checkpoints that still hold the borrowing layers' own
``k_proj``, ``v_proj``, ``k_norm`` are read without them, as HF ignores them.
"""
from .base import fail
from .gemma3 import Gemma3

# the keys of the parts refused, with what each must hold for minitx to run the file
UNIMPLEMENTED = {"hidden_size_per_layer_input": (0, None), "enable_moe_block": (False, None),
                 "use_bidirectional_attention": (None,)}
# the borrowing layers' modules that some checkpoints still carry
_UNUSED = ("k_proj", "v_proj", "k_norm", "v_norm")


class Gemma4(Gemma3):
    model_type = "gemma4_text"
    # plain gains, values normalised, a scalar on each layer's output, the scores unscaled
    switches = dict(norm_unit_offset=False, v_norm=True, layer_scalars=True,
                    query_pre_attn_scalar=1.0)
    # the global layers' own sizes, K = V, the borrowing layers and their wider MLPs
    keys = {"query_pre_attn_scalar": None, "global_head_dim": "full_head_dim",
            "num_global_key_value_heads": "full_kv_heads",
            "attention_k_eq_v": "attention_k_eq_v", "num_kv_shared_layers": "kv_shared_layers",
            "use_double_wide_mlp": "double_wide_mlp"}
    # the refused parts' sizes: accepted, as they size nothing while those parts are off
    reads = {*UNIMPLEMENTED, "vocab_size_per_layer_input", "num_experts", "top_k_experts",
             "moe_intermediate_size"}
    # HF's Gemma4TextConfig defaults (transformers 5.24)
    defaults = dict(query_pre_attn_scalar=None, num_key_value_heads=4, head_dim=256,
                    sliding_window=512,
                    max_position_embeddings=131072, intermediate_size=9216,
                    global_head_dim=512, attention_k_eq_v=False, num_kv_shared_layers=0,
                    use_double_wide_mlp=False, final_logit_softcapping=None,
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional",
                                           "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}})
    tensors = {"model.layers.{i}.layer_scalar": "blocks.{i}.layer_scalar"}
    presets = {
        # a Gemma 4 31B-shaped dense model is not in HF's class defaults: the class describes
        # E2B-like per-layer embeddings, which minitx refuses; the preset is the class's
        # attention and MLP geometry with the embeddings off
        "Gemma-4 (HF class)": (
            "transformers 5.24 Gemma4TextConfig defaults, hidden_size_per_layer_input=0",
            dict(vocab_size=262144, hidden_size=2304, intermediate_size=9216,
                 num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=256, global_head_dim=512, hidden_activation="gelu_pytorch_tanh",
                 max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
                 sliding_window=512, hidden_size_per_layer_input=0)),
    }

    def prepare(self, cfg, source):
        """A saved file states the global layers' sizes as ``per_layer_config`` {layer:
        {"head_dim", "num_key_value_heads"}}; read as ``global_head_dim`` and
        ``num_global_key_value_heads`` when it gives every full layer, and only those, the same
        sizes (HF's class writes it so); anything else is refused by name."""
        per_layer = cfg.pop("per_layer_config", None)
        if not per_layer:
            return cfg
        # minitx's global layers share one size: every full layer, and only those, the same
        types = cfg.get("layer_types") or []
        full = {i for i, t in enumerate(types) if t == "full_attention"}
        sizes = {tuple(sorted(v.items())) for v in per_layer.values()}
        keys = {k for v in per_layer.values() for k in v}
        if {int(i) for i in per_layer} != full or len(sizes) != 1 or \
                not keys <= {"head_dim", "num_key_value_heads"}:
            fail(source, "per_layer_config must give every full_attention layer, and only "
                         "those, the same head_dim and num_key_value_heads (minitx's global "
                         f"layers share one size), got {per_layer!r}")
        # that one size, as the two keys the rest of the family reads
        one = dict(next(iter(sizes)))
        cfg["global_head_dim"] = one.get("head_dim", cfg.get("head_dim"))
        if "num_key_value_heads" in one:
            cfg["num_global_key_value_heads"] = one["num_key_value_heads"]
        return cfg

    def read_extra(self, cfg, n, fields, source):
        """The parts not implemented refused by name; the last layer must be global."""
        for key, allowed in UNIMPLEMENTED.items():
            if cfg.get(key) not in allowed:
                fail(source, f"{key}={cfg[key]!r} changes the model and minitx does not "
                             "implement it for gemma4_text (per-layer embeddings, the MoE "
                             "block, bidirectional attention); refused")
        if fields["layer_types"] and fields["layer_types"][-1] != "full":
            fail(source, "layer_types must end with a full_attention layer (HF's Gemma 4 "
                         f"forces it), got {fields['layer_types'][-1]!r}_attention")
        return {}

    def write_extra(self, c):
        return {"hidden_size_per_layer_input": 0}

    def tensors_from_hf(self, tensors, model, source):
        """The borrowing layers' own key and value modules, which HF ignores, dropped."""
        borrowing = {str(i) for i, b in enumerate(model.blocks) if b.attn.borrows}

        def unused(key):
            parts = key.split(".")               # model.layers.{i}.self_attn.{module}.…
            return len(parts) > 4 and parts[:2] == ["model", "layers"] and \
                parts[2] in borrowing and parts[3] == "self_attn" and parts[4] in _UNUSED
        return {k: v for k, v in tensors.items() if not unused(k)}
