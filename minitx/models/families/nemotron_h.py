"""Nemotron-H (NVIDIA, 2025; Nemotron 3 Nano): a decoder whose every layer is one norm and one
sublayer — a Mamba-2 mixer, an attention layer without positions, a two-matrix MLP around a
squared ReLU, or a mixture of such experts that runs in a narrower latent space beside one
shared expert (``single_sublayer``, ``models/mixers/mamba2.py``, ``nn/moe.py``).

HF's ``NemotronHConfig`` and ``NemotronHForCausalLM``: ``layers_block_type`` names each layer
("linear_attention" is Mamba-2, "full_attention", "mlp", "moe"), or the older
``hybrid_override_pattern`` ("M", "*", "-", "E" per layer); the number of layers is that
list's length (the file may leave ``num_hidden_layers`` out). The Mamba-2 layers' step Δ is
clamped below at ``time_step_min`` (HF's Nemotron-H does not read ``time_step_limit``); the
router is DeepSeek-V3's (σ scores, a correction bias that only chooses, groups), and HF's
attention takes no bias whatever ``attention_bias`` says (read and ignored, as HF does).
Everything lives under ``backbone.`` in the files and ``model.`` in HF's modules, each
layer's sublayer under ``mixer``, the experts one matrix each in the files.
"""
import math

from .base import SIZE_KEYS, Family, fail, fresh
from .llama import Llama

# HF's layer names (and the older pattern's letters) → minitx's layer types
_NAMES = {"linear_attention": "mamba2", "full_attention": "full", "mlp": "mlp", "moe": "moe"}
_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
# config.json key → the Mamba-2 mixer's option (``models/mixers/mamba2.py``)
MAMBA_KEYS = {"mamba_num_heads": "num_heads", "mamba_head_dim": "head_dim",
              "ssm_state_size": "state_size", "n_groups": "n_groups",
              "conv_kernel": "conv_kernel", "use_conv_bias": "conv_bias", "use_bias": "bias",
              "chunk_size": "chunk_size"}
MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "moe_shared_expert_intermediate_size", "moe_latent_size", "n_shared_experts",
            "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob")
# read by HF only to initialise, to choose kernels or a cache dtype, or for multi-token
# prediction, which is not part of its forward
UNREAD = {"expand", "time_step_max", "time_step_floor", "time_step_limit", "use_mamba_kernels",
          "mamba_ssm_cache_dtype", "mamba_proj_bias", "rescale_prenorm_residual",
          "residual_in_fp32", "hidden_dropout", "num_logits_to_keep", "mtp_layers_block_type",
          "moe_shared_expert_overlap", "attention_bias", "sliding_window"}


class NemotronH(Llama):
    model_type = "nemotron_h"
    # one sublayer a layer, no positions; the MLP layers' activation is the ReLU²
    switches = fresh(norm="rmsnorm", mlp="relu2", positions="none", single_sublayer=True)
    keys = fresh({
        "vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
        "intermediate_size": "ffn_hidden", "layer_norm_epsilon": "norm_eps",
        "mlp_bias": "mlp_bias", "max_position_embeddings": "max_position"})
    # the keys the methods read: the layer list, Mamba-2's, the experts', and those HF ignores
    reads = fresh.of("layers_block_type", "hybrid_override_pattern", "mamba_hidden_act",
                     "time_step_min", *MAMBA_KEYS, *MOE_KEYS, *UNREAD)
    size_keys = SIZE_KEYS
    bias_key = None
    activation_key, activation = "mlp_hidden_act", "relu2"
    # HF's NemotronHConfig defaults (transformers 5.24)
    defaults = fresh(
        num_key_value_heads=8, head_dim=128, intermediate_size=21504, layer_norm_epsilon=1e-5,
        mlp_bias=False, max_position_embeddings=4096, mamba_num_heads=128, mamba_head_dim=64,
        ssm_state_size=128, n_groups=8, conv_kernel=4, use_conv_bias=True, use_bias=False,
        chunk_size=128, time_step_min=0.001, mamba_hidden_act="silu", n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=7688,
        moe_shared_expert_intermediate_size=7688, moe_latent_size=None, n_shared_experts=1,
        routed_scaling_factor=1.0, n_group=1, topk_group=1, norm_topk_prob=True,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp"])
    tensors = fresh({
        "backbone.embeddings.weight": "embed.weight",
        "backbone.norm_f.weight": "ln_final.weight",
        "lm_head.weight": "unembed.weight",
        "backbone.layers.{i}.norm.weight": "blocks.{i}.ln1.weight",
        # a Mamba-2 or attention layer's mixer; an MLP layer's (renamed ``mlp`` on the way in,
        # so that one HF name has one minitx name); an MoE layer's, as the experts' reader
        # leaves it (``decoders._experts_from_hf``)
        "backbone.layers.{i}.mixer.*": "blocks.{i}.attn.*",
        "backbone.layers.{i}.mlp.*": "blocks.{i}.mlp.*",
        "model.layers.{i}.mlp.*": "blocks.{i}.mlp.*"})
    tied = False
    experts_key, expert_width_key = "n_routed_experts", "moe_intermediate_size"
    aux_key = None
    expert_files = ("gate_proj", "up_proj", "down_proj")
    shared_expert = "shared_experts"
    presets = {
        # HF's class defaults: four layers, one of each kind (Nemotron 3 Nano's own file was
        # not at hand; its card: 23 Mamba-2 and MoE layers, 6 attention layers, 128 experts)
        "Nemotron-H (HF class)": ("transformers 5.24 NemotronHConfig defaults", dict(
            vocab_size=131072, hidden_size=4096, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, intermediate_size=21504,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=7688,
            n_group=1, topk_group=1, n_shared_experts=1,
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp"])),
    }

    def prepare(self, cfg, source):
        """The layer list from the older pattern, and the number of layers from the list."""
        pattern = cfg.pop("hybrid_override_pattern", None)
        if pattern is not None and cfg.get("layers_block_type") is None:
            if not set(pattern) <= set(_LETTERS):
                fail(source, f"hybrid_override_pattern may hold only {sorted(_LETTERS)}, got "
                             f"{pattern!r}")
            cfg["layers_block_type"] = [_LETTERS[ch] for ch in pattern]
        types = cfg.get("layers_block_type") or self.defaults["layers_block_type"]
        cfg.setdefault("num_hidden_layers", len(types))
        return cfg

    def read_layers(self, cfg, n, source):
        """HF's layer names → minitx's layer types, one for each layer."""
        types = cfg.get("layers_block_type") or self.defaults["layers_block_type"]
        if len(types) != n or not set(types) <= set(_NAMES):
            fail(source, f"layers_block_type must give one of {sorted(_NAMES)} for each of the "
                         f"{n} layers, got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        back = {v: k for k, v in _NAMES.items()}
        return {"layers_block_type": [back.get(t, t) for t in c.layer_types]}

    def read_extra(self, cfg, n, fields, source):
        """The Mamba-2 layers' options and, where there are MoE layers, the experts'."""
        get = {**self.defaults, **{k: v for k, v in cfg.items() if v is not None}}.get
        # Mamba-2's options: its sizes, and Δ clamped below at time_step_min only
        if get("mamba_hidden_act") != "silu":
            fail(source, f"mamba_hidden_act={get('mamba_hidden_act')!r} is not supported "
                         "(minitx's Mamba-2 runs silu)")
        mamba = {mine: get(key) for key, mine in MAMBA_KEYS.items()}
        mamba.update(time_step_limit=(get("time_step_min"), math.inf),
                     norm_eps=get("layer_norm_epsilon"))
        out = {"mixer_options": {"mamba2": mamba}}
        # the experts: DeepSeek-V3's router over ReLU² experts in a latent space, one shared
        if "moe" in fields["layer_types"]:
            shared = get("moe_shared_expert_intermediate_size") \
                if get("n_shared_experts") else None
            out.update(num_experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"),
                       expert_hidden=get("moe_intermediate_size"), moe_options=dict(
                           router="sigmoid_grouped", n_group=get("n_group"),
                           topk_group=get("topk_group"),
                           norm_topk_prob=bool(get("norm_topk_prob")),
                           routed_scaling_factor=float(get("routed_scaling_factor")),
                           expert="relu2", shared_intermediate_size=shared,
                           latent_size=get("moe_latent_size"), latent_bias=fields["mlp_bias"]))
        return out

    def write_extra(self, c):
        # read_extra's keys back: Mamba-2's, then the experts' where there are any
        m = c.mixer_options.get("mamba2", {})
        d = {key: m[mine] for key, mine in MAMBA_KEYS.items() if mine in m}
        if "time_step_limit" in m:
            d["time_step_min"] = m["time_step_limit"][0]
        if c.num_experts:                           # the router's options, the latent, shared
            o = c.moe_options
            d.update(n_routed_experts=c.num_experts, num_experts_per_tok=c.top_k,
                     moe_intermediate_size=c.expert_hidden, n_group=o.get("n_group", 1),
                     topk_group=o.get("topk_group", 1),
                     norm_topk_prob=o.get("norm_topk_prob", True),
                     routed_scaling_factor=o.get("routed_scaling_factor", 1.0),
                     moe_latent_size=o.get("latent_size"),
                     moe_shared_expert_intermediate_size=o.get("shared_intermediate_size"),
                     n_shared_experts=int(o.get("shared_intermediate_size") is not None))
        return d

    def tensors_from_hf(self, tensors, model, source):
        """A sublayer's module is ``mixer`` whatever it is: an MLP layer's read as ``mlp``, an
        MoE layer's as the experts' reader expects it (``model.layers.{i}.mlp``)."""
        kinds = model.config.layer_types
        out = {}
        for key, value in tensors.items():          # each name on its own: a rename or none
            parts = key.split(".")
            if parts[0] == "model" and len(parts) > 1 and parts[1] in (
                    "embeddings", "norm_f", "layers") and "mlp" not in parts[3:4]:
                parts[0] = "backbone"                  # HF's module names → the files'
                key = ".".join(parts)
            # a layer's sublayer: renamed after what the layer is
            if len(parts) > 4 and parts[:2] == ["backbone", "layers"] and parts[3] == "mixer":
                kind = kinds[int(parts[2])] if int(parts[2]) < len(kinds) else None
                if kind == "mlp":
                    key = ".".join(parts[:3] + ["mlp"] + parts[4:])
                elif kind == "moe":
                    key = ".".join(["model", "layers", parts[2], "mlp"] + parts[4:])
            out[key] = value
        return out

    def tensors_to_hf(self, tensors, model, files):
        """The files' names under ``backbone.``, the modules' (``files=False``) under
        ``model.``, every sublayer a ``mixer``."""
        root = "backbone" if files else "model"
        out = {}                                    # every MLP-like module back to ``mixer``
        for key, value in tensors.items():
            parts = key.split(".")
            if len(parts) > 4 and parts[1] == "layers" and parts[3] == "mlp" and \
                    parts[0] in ("backbone", "model"):
                parts = ["backbone", "layers", parts[2], "mixer"] + parts[4:]
            if parts[0] == "backbone":
                parts[0] = root
            out[".".join(parts)] = value
        return out

    # none of Llama's: its experts' keys and methods, its rope
    read_experts, write_experts = Family.read_experts, Family.write_experts

    def read_ropes(self, cfg, source):
        """No positions: the attention layers rotate nothing."""
        return {"rope_type": "default", "rope_theta": 10000.0}, None

    def write_ropes(self, c):
        return {}
