"""Kimi Linear (Moonshot AI, 2025), a hybrid: KDA layers (``models/mixers/kda.py``, a state
of fixed size) between MLA layers without rotary positions (the rotary key k^R is one more
key shared by every head), then DeepSeek-V3's experts.

HF's ``KimiLinearConfig``. Moonshot's config.json spells some keys its own way (HF's
``attribute_map``, ``ALIASES``), and ``linear_attn_config``'s head_dim, num_heads and
short_conv_kernel_size win over the flat ``linear_*`` keys. Keys of Moonshot's file that HF's
model does not read (``FIXED``) must hold what HF's model does anyway, else the checkpoint is
not the model HF builds. transformers 5's module holds the decay's tensors under
``self_attn.forget_gate.`` and the three convolutions stacked as one ``conv1d.weight``
(3·H·D, 1, K), q's rows, then k's, then v's; the files hold every MLP under
``block_sparse_moe``. minitx keeps the files' names.
"""
import numpy as np

from .base import fail
from .deepseek_v3 import MLA_KEYS, DeepseekV3
from .deepseek_v32 import dense_by_type

# Moonshot's spellings → the other families' (HF's attribute_map)
ALIASES = {"moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group",
           "num_experts_per_token": "num_experts_per_tok",
           "num_shared_experts": "n_shared_experts",
           "model_max_length": "max_position_embeddings"}
# keys HF's model does not read, and the value it runs whatever they say
FIXED = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid",
         "use_grouped_topk": True, "moe_layer_freq": 1}
# linear_attn_config's keys, and the flat keys they win over
_LINEAR = (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
           ("short_conv_kernel_size", "linear_conv_kernel_dim"))
_NAMES = {"linear_attention": "kda", "full_attention": "full"}  # HF's layer_types → minitx's
# the decay's tensors (transformers 5: under forget_gate.), the three short convolutions
# (transformers 5: one conv1d.weight)
_KDA_GATE = ("f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log")
_KDA_CONVS = ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")


class KimiLinear(DeepseekV3):
    model_type = "kimi_linear"
    switches = dict(positions="none", rope_interleave=False)  # the MLA layers rotate nothing
    reads = {"linear_attn_config", "linear_num_heads", "linear_head_dim",
             "linear_conv_kernel_dim", "mlp_layer_types", "num_experts", *FIXED}
    # None: a key of DeepSeek-V3's that HF's KimiLinearConfig lacks (or holds as None)
    defaults = dict(rms_norm_eps=1e-5, max_position_embeddings=1048576, q_lora_rank=None,
                    num_key_value_heads=32, n_routed_experts=None, num_experts=256,
                    moe_intermediate_size=1024, first_k_dense_replace=None, n_group=1,
                    topk_group=1, routed_scaling_factor=2.446, linear_num_heads=32,
                    linear_head_dim=128, linear_conv_kernel_dim=4)
    experts_key = "num_experts"
    expert_files = ("w1", "w3", "w2")
    presets = {
        # Kimi Linear: 20 KDA layers (a fixed-size state) and 7 MLA layers without
        # rotation, 1-based as the file writes them; then DeepSeek-V3's experts, 8 of 256 + 1
        "Kimi-Linear-48B-A3B": ("moonshotai/Kimi-Linear-48B-A3B-Instruct", dict(
            vocab_size=163840, hidden_size=2304, intermediate_size=9216, num_hidden_layers=27,
            num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5,
            hidden_act="silu", model_max_length=1048576, tie_word_embeddings=False,
            q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, mla_use_nope=True, first_k_dense_replace=1, moe_layer_freq=1,
            num_experts=256, num_shared_experts=1, num_experts_per_token=8,
            moe_intermediate_size=1024, num_expert_group=1, topk_group=1,
            routed_scaling_factor=2.446, moe_renormalize=True,
            moe_router_activation_func="sigmoid", use_grouped_topk=True,
            linear_attn_config={"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                                "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                                "kda_layers": [i for i in range(1, 28)    # the 20 others
                                               if i % 4 and i != 27]})),
    }

    def prepare(self, cfg, source):
        """The file under the other families' names, HF's defaults filled in, and
        ``linear_attn_config`` read as HF reads it; ``head_dim`` is HF's alias of
        ``qk_rope_head_dim``."""
        for key, value in FIXED.items():
            if cfg.get(key, value) != value:
                fail(source, f"{key}={cfg[key]!r}: HuggingFace's Kimi Linear runs "
                             f"{key}={value!r} whatever the config says; refused")
        out = dict(self.defaults)
        out.update({ALIASES.get(k, k): v for k, v in cfg.items()})
        linear = out.get("linear_attn_config") or {}
        unknown = sorted(set(linear) - {"head_dim", "num_heads", "short_conv_kernel_size",
                                        "kda_layers", "full_attn_layers"})
        if unknown:                       # e.g. a bounded gate, which HF's model lacks
            fail(source, f"linear_attn_config key(s) {', '.join(map(repr, unknown))} are not "
                         "read by HuggingFace's Kimi Linear; refused rather than ignored")
        for key, flat in _LINEAR:
            out[flat] = linear.get(key, out[flat])
        out["head_dim"] = out["qk_rope_head_dim"]
        return out

    def read_layers(self, cfg, n, source):
        """``layer_types``, else ``linear_attn_config``'s 1-based ``kda_layers`` and
        ``full_attn_layers``, else HF's default (MLA at layers 4, 8, …, counted from 0)."""
        types = cfg.get("layer_types")
        linear = cfg.get("linear_attn_config") or {}
        if types is None and "kda_layers" in linear and "full_attn_layers" in linear:
            types = [None] * n                      # filled from the two lists
            for key, name in (("full_attn_layers", "full_attention"),
                              ("kda_layers", "linear_attention")):
                for layer in linear[key]:
                    if not 1 <= int(layer) <= n:
                        fail(source, f"linear_attn_config.{key} holds layer {layer}, outside "
                                     f"1 … {n} (1-based)")
                    types[int(layer) - 1] = name    # 1-based in the file
        if types is None:                           # HF's default
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention"
                     for i in range(n)]
        if len(types) != n or not set(types) <= set(_NAMES):
            fail(source, f"layer_types must give one of {sorted(_NAMES)} for each of the {n} "
                         f"layers, got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        return {"layer_types": [{"kda": "linear_attention"}.get(t, f"{t}_attention")
                                for t in c.layer_types]}

    def read_extra(self, cfg, n, fields, source):
        """The latent attention's sizes (``q_lora_rank`` may be None: queries not compressed)
        and KDA's, from the flat keys ``prepare`` filled in."""
        return {**{k: cfg.get(k) for k in MLA_KEYS},
                "mixer_options": {"kda": {"num_heads": cfg["linear_num_heads"],
                                          "head_dim": cfg["linear_head_dim"],
                                          "conv_kernel": cfg["linear_conv_kernel_dim"]}}}

    def write_extra(self, c):
        kda = c.mixer_options.get("kda") or {}
        return {**{k: getattr(c, k) for k in MLA_KEYS},
                "linear_num_heads": kda.get("num_heads", c.num_heads),
                "linear_head_dim": kda.get("head_dim", c.head_dim),
                "linear_conv_kernel_dim": kda.get("conv_kernel", 4)}

    def write(self, c):
        """Moonshot's spellings (``ALIASES``), and no rope: the MLA layers rotate nothing."""
        back = {v: k for k, v in ALIASES.items()}
        d = super().write(c)
        for key in ("rope_parameters", "rope_interleave", "first_k_dense_replace"):
            d.pop(key, None)
        return {back.get(k, k): v for k, v in d.items()}

    def read_dense_layers(self, get, n, source):
        """``mlp_layer_types``, else HF's rule: the first ``first_k_dense_replace`` layers
        (1 when absent) are dense."""
        dense = dense_by_type(get("mlp_layer_types"), n, source)
        return tuple(range(min(get("first_k_dense_replace", 1), n))) if dense is None else dense

    def write_dense_layers(self, c):
        return {"mlp_layer_types": ["dense" if i in c.dense_layers else "sparse"
                                    for i in range(c.num_layers)]}

    def tensors_from_hf(self, tensors, model, source):
        """The files' names or transformers 5's module's → minitx's: every MLP under ``mlp.``,
        the decay's tensors out of ``forget_gate.``, the stacked conv1d split into q's, k's
        and v's."""
        out = {}
        for key, value in tensors.items():
            key = key.replace(".block_sparse_moe.", ".mlp.").replace(".forget_gate.", ".")
            if key.endswith(".self_attn.conv1d.weight"):
                stem = key[:-len("conv1d.weight")]
                for name, part in zip(_KDA_CONVS, np.split(np.asarray(value), 3, axis=0)):
                    out[stem + name] = part
                continue
            out[key] = value
        return out

    def tensors_to_hf(self, out, model, files):
        """The files' names (``files``), or transformers 5's module's."""
        if files:
            return {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in out.items()}
        res, convs = {}, {}
        for key, value in out.items():
            stem, _, rest = key.partition(".self_attn.")
            if rest in _KDA_GATE:
                res[f"{stem}.self_attn.forget_gate.{rest}"] = value
            elif rest in _KDA_CONVS:
                convs.setdefault(stem, {})[rest] = value
            else:
                res[key] = value
        for stem, parts in convs.items():
            res[f"{stem}.self_attn.conv1d.weight"] = np.concatenate(
                [np.asarray(parts[name]) for name in _KDA_CONVS], axis=0)
        return res
