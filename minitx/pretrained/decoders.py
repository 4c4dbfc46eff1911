"""HuggingFace's decoder families — Llama, Mistral, Qwen2, Qwen3, Gemma 3, OLMo 2, the
mixtures of experts Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V3 and DeepSeek-V3.2 (V3 with the
lightning indexer's sparse attention, ``models/indexer.py``), and the hybrids Qwen3-Next,
Kimi Linear and MiniMax (token mixers among attention layers, ``models/mixers/``) — read into
minitx's one ``Decoder``: each family is a row of switches, its ``config.json`` translated key
by key, its tensors renamed by one table.

    model, _ = minitx.pretrained.load("path/to/Qwen3-0.6B", dtype="float64", tokenizer=False)
    logits = model(ids)                                   # (B, N, V)
    out = model.generate(ids, max_new_tokens=20)          # greedy, through the KV caches

**The switches.** ``FAMILIES[model_type]`` holds what a family fixes (its MLP, norm
placement, QK-norm, Gemma's details); the sizes, eps, rope, biases, windows and tying come
from ``config.json`` (``decoder_config``). Every key of ``config.json`` is read, listed as
not changing the forward (``changes_nothing``: metadata, token ids and ``IGNORED``, with the
reasons in docs/decoders.md), or refused by
name: a rope_type minitx does not compute, an activation it does not have, bidirectional
attention, quantisation (MXFP4 by name). A key the file leaves out takes HF's configuration
class's default (``HF_DEFAULTS``): HF's ``save_pretrained`` writes every key, other writers do
not. A ``mistral`` file with ``layer_types`` is read as HF's ``AutoConfig`` reads it, as
Ministral's (each layer slides or not as the list says). Adding a family is one more row; the
mixture-of-experts families add ``mlp="moe"``, and ``_moe`` translates their router's and
experts' keys into ``nn.moe.MoE``'s options (docs/moe.md).

**The tensors** (``L.`` = ``model.layers.{i}.`` in HuggingFace, ``blocks.{i}.`` in minitx):

===========================================  ================================================
HuggingFace                                  minitx
===========================================  ================================================
model.embed_tokens.weight (V, E)             embed.weight
L.self_attn.{q,k,v,o}_proj.weight / .bias    blocks.{i}.attn.{q,k,v,o}_proj.weight / .bias
L.self_attn.{q,k}_norm.weight                blocks.{i}.attn.{q,k}_norm.weight
L.self_attn.{qkv_proj,output_gate,out_proj}  blocks.{i}.attn.… (MiniMax's lightning layers,
.weight, L.self_attn.norm.weight             the same names)
L.self_attn.{slope_rate,query_decay,         none: MiniMax's decays, checked against those
key_decay,diagonal_decay}                    minitx computes, written back on the way out
L.mlp.{gate,up,down}_proj.weight             blocks.{i}.mlp.{gate,up,down}_proj.weight
L.input_layernorm.weight                     blocks.{i}.ln1.weight (pre, sandwich)
L.post_attention_layernorm.weight            blocks.{i}.ln2.weight (pre: Llama, Mistral,
                                             Qwen) or blocks.{i}.ln1_post.weight (OLMo 2,
                                             Gemma 3: it follows the attention)
L.pre_feedforward_layernorm.weight           blocks.{i}.ln2.weight (Gemma 3)
L.post_feedforward_layernorm.weight          blocks.{i}.ln2_post.weight (OLMo 2, Gemma 3)
L.linear_attn.* (Qwen3-Next)                 blocks.{i}.attn.* (the same names)
model.norm.weight                            ln_final.weight
lm_head.weight (V, E)                        unembed.weight; when tied, absent or checked
                                             equal to embed.weight
===========================================  ================================================

Both libraries store ``Linear`` weights as (out, in), so no tensor is transposed. A missing,
extra or misshapen tensor is refused, naming it. The experts are the exception: minitx stacks
them, (n, out, in) each; the files hold one matrix per expert (stacked on load), transformers
5's modules a fused ``gate_up_proj``, gpt-oss's interleaved and transposed (docs/moe.md);
``decoder_state_to_hf`` writes either spelling back.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import validate
from ..backend import to_host
from ..models.decoder import Decoder, DecoderConfig, check_config
from ..models.mixers.lightning import LightningMixer
from ..nn import init
from ..nn.moe import MoE
from ..nn.rotary import check_rope

__all__ = ["FAMILIES", "IGNORED", "HF_DEFAULTS", "SIZE_KEYS", "changes_nothing",
           "decoder_config", "decoder_state_from_hf", "decoder_state_to_hf", "decoder_from_hf",
           "hf_norm_names", "hf_config_dict"]

# What each family fixes. The rest comes from config.json.
FAMILIES = {
    "llama": dict(mlp="swiglu"),
    "mistral": dict(mlp="swiglu"),
    "qwen2": dict(mlp="swiglu", qkv_bias=True, o_bias=False),       # q, k, v biases only
    "qwen3": dict(mlp="swiglu", qk_norm="head"),
    "olmo2": dict(mlp="swiglu", qk_norm="proj", norm_placement="post",
                  norm_scale_in_float32=True),
    "gemma3_text": dict(mlp="geglu", qk_norm="head", norm_placement="sandwich",
                        norm_unit_offset=True, norm_scale_in_float32=True, embed_scale=True),
    "deepseek_v3": dict(mlp="moe", attention="mla"),
    # HF's V3.2 always reads its rotary dims as interleaved pairs
    "deepseek_v32": dict(mlp="moe", attention="mla", rope_interleave=True),
    # the mixtures of experts: which layers, which router, which experts (``_moe``)
    "qwen3_moe": dict(mlp="moe", qk_norm="head"),
    "mixtral": dict(mlp="moe"),
    "gpt_oss": dict(mlp="moe", attn_sinks=True, norm_scale_in_float32=True),
    # the hybrid: gated DeltaNet layers (models/mixers/gated_deltanet.py) among gated
    # attention layers; zero-centred norms (1 + w) computed in float32, as HF's
    "qwen3_next": dict(mlp="moe", qk_norm="head", norm_unit_offset=True,
                       norm_scale_in_float32=True, attn_output_gate=True),
    # the hybrid: KDA layers ("kda", models/mixers/kda.py) between MLA layers without rotary
    # positions, DeepSeek-V3's experts
    "kimi_linear": dict(mlp="moe", attention="mla", positions="none"),
    # the hybrid: lightning-attention layers (models/mixers/lightning.py) among softmax ones
    "minimax": dict(mlp="moe"),
}

# DeepSeek-V3's keys: multi-head latent attention's sizes, and the MoE's, by HF's names.
_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "rope_interleave")
# DeepSeek-V3.2's indexer: HF's names → DecoderConfig's (the same), and HF's defaults.
_INDEX_KEYS = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
# The mixtures of experts' keys, by HF's names (each family spells the expert count its way).
_MOE_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "first_k_dense_replace", "decoder_sparse_step",
             "mlp_only_layers", "mlp_layer_types", "router_aux_loss_coef",
             "router_jitter_noise", "swiglu_limit", "swiglu_alpha",
             "shared_expert_intermediate_size")
# Qwen3-Next's gated DeltaNet sizes (config.json key → the mixer's option), and the layout key
_LINEAR_KEYS = {"linear_num_key_heads": "num_k_heads", "linear_num_value_heads": "num_v_heads",
                "linear_key_head_dim": "head_k_dim", "linear_value_head_dim": "head_v_dim",
                "linear_conv_kernel_dim": "conv_kernel"}
_LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32,
                    "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                    "linear_conv_kernel_dim": 4}
_ROUTER_KEYS = ("n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
                "norm_topk_prob", "topk_method", "scoring_func")
# HF's configuration classes' defaults (transformers 5.24) for the keys that change the
# forward, when a config.json leaves them out: HF's own save_pretrained writes every key, other
# writers do not. The experts' are in _MOE_DEFAULTS below; a default that HF derives from other
# keys (head_dim = E / H, num_key_value_heads = H) is derived here too; a default θ of the
# plain rope is _DEFAULT_THETA's. gpt-oss's rope default (YaRN) applies only when the file has
# no rope key at all (rope_parameters, rope_theta or rope_scaling).
HF_DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, max_position_embeddings=2048),
    "mistral": dict(rms_norm_eps=1e-6, sliding_window=4096, num_key_value_heads=8,
                    max_position_embeddings=131072),
    "qwen2": dict(rms_norm_eps=1e-6, num_key_value_heads=32, max_position_embeddings=32768),
    "qwen3": dict(rms_norm_eps=1e-6, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768),
    "olmo2": dict(rms_norm_eps=1e-5, max_position_embeddings=2048),
    "gemma3_text": dict(rms_norm_eps=1e-6, num_key_value_heads=4, head_dim=256,
                        query_pre_attn_scalar=256, sliding_window=4096,
                        max_position_embeddings=131072),
    "mixtral": dict(rms_norm_eps=1e-5, num_key_value_heads=8, max_position_embeddings=131072),
    "qwen3_moe": dict(rms_norm_eps=1e-6, num_key_value_heads=4, max_position_embeddings=32768),
    "gpt_oss": dict(rms_norm_eps=1e-5, num_key_value_heads=8, head_dim=64, attention_bias=True,
                    sliding_window=128, max_position_embeddings=131072,
                    rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "truncate": False,
                                     "original_max_position_embeddings": 4096,
                                     "rope_theta": 150000.0}),
    "deepseek_v3": dict(rms_norm_eps=1e-6, num_key_value_heads=128, q_lora_rank=1536,
                        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, max_position_embeddings=4096),
    "deepseek_v32": dict(rms_norm_eps=1e-6, num_key_value_heads=128, q_lora_rank=1536,
                         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128, max_position_embeddings=163840),
    "qwen3_next": dict(rms_norm_eps=1e-6, num_key_value_heads=2, head_dim=256,
                       max_position_embeddings=32768),
    "minimax": dict(rms_norm_eps=1e-5, num_key_value_heads=8, max_position_embeddings=131072),
}
_ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")
# the sizes a checkpoint's config.json must state (its tensors are made to them)
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")

# HF's defaults, for a config.json that leaves a key out
_MOE_DEFAULTS = {
    "qwen3_moe": dict(router_aux_loss_coef=0.001, num_experts=128, num_experts_per_tok=8,
                      moe_intermediate_size=768, norm_topk_prob=False, decoder_sparse_step=1),
    "mixtral": dict(router_aux_loss_coef=0.001, num_experts=8, num_experts_per_tok=2),
    "minimax": dict(router_aux_loss_coef=0.001, num_experts=8, num_experts_per_tok=2),
    "gpt_oss": dict(router_aux_loss_coef=0.001, num_experts=128, num_experts_per_tok=4,
                    swiglu_limit=7.0, swiglu_alpha=1.702),
    "qwen3_next": dict(router_aux_loss_coef=0.001, num_experts=512, num_experts_per_tok=10,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512,
                       norm_topk_prob=True, decoder_sparse_step=1),
    "deepseek_v3": dict(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                        norm_topk_prob=True, first_k_dense_replace=3, n_group=8, topk_group=4,
                        routed_scaling_factor=2.5, n_shared_experts=1),
    "kimi_linear": dict(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=1024,
                        norm_topk_prob=True, first_k_dense_replace=1, n_group=1, topk_group=1,
                        routed_scaling_factor=2.446, n_shared_experts=1),
}
# Kimi Linear's config.json spells some keys its own way (HF's attribute_map), and leaves
# out what its config class defaults; ``_kimi_keys`` reads them under the names above.
_KIMI_ALIASES = {"moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group",
                 "num_experts_per_token": "num_experts_per_tok",
                 "num_shared_experts": "n_shared_experts",
                 "model_max_length": "max_position_embeddings"}
_KIMI_DEFAULTS = dict(rms_norm_eps=1e-5, max_position_embeddings=1048576, kv_lora_rank=512,
                      q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
                      v_head_dim=128, linear_num_heads=32, linear_head_dim=128,
                      linear_conv_kernel_dim=4)
# Keys of Moonshot's own config.json that HF's model does not read: each must hold what HF's
# model does anyway (MLA without rotation, a sigmoid router, grouped top-k, every layer after
# the dense ones an MoE), else the checkpoint is not the model HF builds.
_KIMI_FIXED = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid",
               "use_grouped_topk": True, "moe_layer_freq": 1}
_KIMI_KEYS = ("linear_attn_config", "linear_num_heads", "linear_head_dim",
              "linear_conv_kernel_dim", "mlp_layer_types", *_KIMI_FIXED)
_MOE_DEFAULTS["deepseek_v32"] = _MOE_DEFAULTS["deepseek_v3"]

# config.json keys that do not change the forward pass (docs/decoders.md gives each reason).
# The rule, stated once (``changes_nothing``): a key is accepted unread when it is writer's
# metadata (a leading "_": _name_or_path, _attn_implementation …), a token id (…_token_id or
# …_token_ids: which token starts or ends a text is the tokenizer's and generation's business,
# not the forward's), or one of the names below (the library's bookkeeping, training-only
# settings, and the switches a family reads from other keys). Every other key is translated
# or refused by name.
IGNORED = frozenset({
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version",
    "use_cache", "initializer_range", "attention_dropout", "pretraining_tp", "tokenizer_class",
    "output_attentions", "output_hidden_states", "return_dict", "max_window_layers",
    "use_sliding_window", "sliding_window_pattern",
    "attn_logit_softcapping", "qk_head_dim", "num_nextn_predict_layers", "output_router_logits",
    "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "id2label", "label2id",
    "task_specific_params", "finetuning_task", "problem_type", "chunk_size_feed_forward",
})


def changes_nothing(key: str) -> bool:
    """True when config.json's ``key`` cannot change the forward pass (the rule above)."""
    return key.startswith("_") or key.endswith(("_token_id", "_token_ids")) or key in IGNORED


# What a key that changes the maths must hold for minitx to run the family as HF does.
_REFUSED = {"use_bidirectional_attention": (False, None), "quantization_config": (None,)}
_ACTIVATIONS = {"silu": None, "gelu_pytorch_tanh": True, "gelu_new": True, "gelu": False}
_DEFAULT_THETA = {"gemma3_text": (1_000_000.0, 10_000.0), "minimax": (1_000_000.0, None),
                  "mixtral": (1_000_000.0, None),
                  "gpt_oss": (HF_DEFAULTS["gpt_oss"]["rope_parameters"]["rope_theta"], None)}
_TIED_DEFAULT = {"gemma3_text": True}
# HF's families that rotate only part of each head, and their default share
_PARTIAL_ROTARY = {"qwen3_next": 0.25}


def _fail(source, msg):
    raise validate.OptionError(f"{source}: {msg}")


def _rope_dict(rope, cfg, kind, source, where="rope_parameters"):
    """One HF rope dict → minitx's (``type`` read as ``rope_type``, the original context
    filled in as HF does), refused when partial: HF's model of these families rotates every
    head dim."""
    rope = dict(rope)
    if "type" in rope:
        rope.setdefault("rope_type", rope.pop("type"))
    if rope.get("rope_type") in ("llama3", "yarn"):
        rope.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    if kind in _PARTIAL_ROTARY:
        rope.setdefault("partial_rotary_factor", _PARTIAL_ROTARY[kind])
    elif float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        _fail(source, f"{where}: partial_rotary_factor={rope['partial_rotary_factor']} is not "
                      f"applied by HuggingFace's {kind} (it rotates every head dim); refused")
    try:
        return check_rope(rope, owner=where)
    except validate.OptionError as exc:
        _fail(source, str(exc))


def _ropes(cfg, kind, source):
    """(rope of full layers, rope of sliding layers or None) from rope_parameters, or the
    older rope_theta / rope_scaling (and Gemma's rope_local_base_freq)."""
    # transformers 5 writes rope_parameters (per layer type for Gemma 3)
    params = cfg.get("rope_parameters")
    theta, local_theta = _DEFAULT_THETA.get(kind, (10000.0, None))
    if params and kind == "gemma3_text" and "full_attention" in params:
        # HF reads YaRN's truncate from the outer dict, which has none, so it truncates
        # whatever a layer type's entry says (modeling_rope_utils); so does minitx
        per_type = [{**params[t], "truncate": True} if params[t].get("rope_type") == "yarn"
                    else params[t] for t in ("full_attention", "sliding_attention")]
        return tuple(_rope_dict(p, cfg, kind, source) for p in per_type)
    if params:
        return _rope_dict(params, cfg, kind, source), None
    # older checkpoints: rope_theta and rope_scaling; Gemma's scaling is for global layers
    rope = {"rope_theta": cfg.get("rope_theta", theta), **(cfg.get("rope_scaling") or {})}
    if "partial_rotary_factor" in cfg:
        rope["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    local = None
    if kind == "gemma3_text":
        local = {"rope_type": "default",
                 "rope_theta": cfg.get("rope_local_base_freq", local_theta)}
    return _rope_dict(rope, cfg, kind, source, "rope_scaling"), local


def _layer_types(cfg, kind, n, source):
    """(sliding_window, layer_types) as the family's HF model reads them."""
    window = cfg.get("sliding_window")
    if kind in ("llama", "olmo2", "deepseek_v3"):
        return None, None
    if kind == "kimi_linear":
        return None, _kimi_layer_types(cfg, n, source)
    if kind == "deepseek_v32":                 # HF's only layer type: every layer indexed
        types = cfg.get("layer_types") or ["indexed_attention"] * n
        if len(types) != n or set(types) != {"indexed_attention"}:
            _fail(source, f"layer_types must be 'indexed_attention' for each of the {n} "
                          f"layers (HF's DeepSeek-V3.2), got {types!r}")
        return None, None
    if kind == "mixtral" or (kind == "mistral" and "layer_types" not in cfg):
        return window, None                    # one window for every layer, or none
    # a mistral config.json with layer_types: HF's AutoConfig runs it as Ministral, whose
    # layers slide or not as layer_types says (the generic reading below)
    if kind == "qwen3_moe":                    # HF's Qwen3-MoE: every layer, when switched on
        return (window if cfg.get("use_sliding_window", False) else None), None
    if kind == "qwen3_next":                   # linear layers, every interval-th one full
        types = cfg.get("layer_types")
        if types is None:
            every = cfg.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                     for i in range(n)]
        names = {"full_attention": "full", "linear_attention": "gated_deltanet"}
        if not set(types) <= set(names) or len(types) != n:
            _fail(source, f"layer_types must give one of {sorted(names)} for each of the {n} "
                          f"layers, got {types!r}")
        return None, tuple(names[t] for t in types)
    if kind in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    # layer_types when written; else derived as HF derives it (Gemma: every 6th is global;
    # Qwen: layers from max_window_layers on slide)
    types = cfg.get("layer_types")
    if types is None and kind == "gemma3_text":
        period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % period else "full_attention"
                 for i in range(n)]
    if types is None and kind == "gpt_oss":     # HF's default: sliding, full, sliding, …
        types = ["full_attention" if i % 2 else "sliding_attention" for i in range(n)]
    if types is None and kind in ("qwen2", "qwen3"):
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else
                 "full_attention" for i in range(n)]
    # HF's names to minitx's, and a sliding layer needs a window
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    if kind == "minimax":      # lightning and softmax layers; a window makes the latter slide
        types = types or ["linear_attention" if i % 2 else "full_attention" for i in range(n)]
        names = {"full_attention": "sliding" if window else "full",
                 "linear_attention": "lightning"}
    if not set(types) <= set(names):
        _fail(source, f"layer_types may hold only {sorted(names)}, got {sorted(set(types))}")
    types = tuple(names[t] for t in types)
    if "sliding" in types and window is None:
        _fail(source, "layer_types has sliding_attention layers but sliding_window is null")
    return window, types


def _kimi_keys(cfg: dict, source: str) -> dict:
    """Kimi Linear's config.json under the names the other families use (``_KIMI_ALIASES``),
    HF's defaults filled in, and its ``linear_attn_config`` read as HF reads it (its
    head_dim, num_heads and short_conv_kernel_size win over the flat ``linear_*`` keys).
    ``head_dim`` is HF's alias of ``qk_rope_head_dim``."""
    for key, value in _KIMI_FIXED.items():
        if cfg.get(key, value) != value:
            _fail(source, f"{key}={cfg[key]!r}: HuggingFace's Kimi Linear runs {key}={value!r} "
                          "whatever the config says; refused")
    out = dict(_KIMI_DEFAULTS)
    out.update({_KIMI_ALIASES.get(k, k): v for k, v in cfg.items()})
    linear = out.get("linear_attn_config") or {}
    unknown = sorted(set(linear) - {"head_dim", "num_heads", "short_conv_kernel_size",
                                    "kda_layers", "full_attn_layers"})
    if unknown:                           # e.g. a bounded gate, which HF's model lacks
        _fail(source, f"linear_attn_config key(s) {', '.join(map(repr, unknown))} are not "
                      "read by HuggingFace's Kimi Linear; refused rather than ignored")
    for key, flat in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                      ("short_conv_kernel_size", "linear_conv_kernel_dim")):
        out[flat] = linear.get(key, out[flat])
    out["head_dim"] = out["qk_rope_head_dim"]
    return out


def _kimi_layer_types(cfg, n, source):
    """Which of Kimi Linear's layers are KDA ("kda") and which MLA ("full"): ``layer_types``,
    else ``linear_attn_config``'s 1-based ``kda_layers`` and ``full_attn_layers``, else HF's
    default (MLA at layers 4, 8, …, counted from 0)."""
    names = {"linear_attention": "kda", "full_attention": "full"}
    types = cfg.get("layer_types")
    linear = cfg.get("linear_attn_config") or {}
    if types is None and "kda_layers" in linear and "full_attn_layers" in linear:
        types = [None] * n
        for key, name in (("full_attn_layers", "full_attention"), ("kda_layers",
                                                                   "linear_attention")):
            for layer in linear[key]:
                if not 1 <= int(layer) <= n:
                    _fail(source, f"linear_attn_config.{key} holds layer {layer}, outside "
                                  f"1 … {n} (1-based)")
                types[int(layer) - 1] = name
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention"
                 for i in range(n)]
    if len(types) != n or not set(types) <= set(names):
        _fail(source, f"layer_types must give one of {sorted(names)} for each of the {n} "
                      f"layers, got {types!r}")
    return tuple(names[t] for t in types)


def decoder_config(cfg: dict, source: str = "config.json") -> DecoderConfig:
    """A parsed ``config.json`` of a family in ``FAMILIES`` → ``DecoderConfig``; a key that
    is neither translated nor ``changes_nothing`` is refused by name."""
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        _fail(source, f"model_type {kind!r} is not a decoder family minitx loads "
                      f"({', '.join(sorted(FAMILIES))})")
    if kind == "kimi_linear":
        cfg = _kimi_keys(cfg, source)
    for key in SIZE_KEYS:                       # the sizes: stated, and positive integers
        if key not in cfg:
            _fail(source, f"{key} is missing; a {kind} config.json states "
                          f"{', '.join(SIZE_KEYS)}")
        validate.positive_int(cfg[key], key, owner=source)
    # HF's class defaults under what the file says (HF_DEFAULTS)
    defaults = dict(HF_DEFAULTS.get(kind, {}))
    if any(k in cfg for k in _ROPE_KEYS):
        defaults.pop("rope_parameters", None)
    cfg = {**defaults, **cfg}
    quant = cfg.get("quantization_config") or {}
    if quant.get("quant_method") == "mxfp4":
        _fail(source, "quantization_config says MXFP4: the experts are stored as 4-bit blocks "
                      "and scales (…_blocks, …_scales), which minitx does not dequantise; "
                      "dequantise them to float tensors first (docs/moe.md)")
    for key, allowed in _REFUSED.items():
        if cfg.get(key) not in allowed:
            _fail(source, f"{key}={cfg[key]!r} changes the model and minitx does not "
                          f"implement it for {kind}")
    # The activation: SiLU gates SwiGLU; Gemma's GeGLU takes GELU, tanh or exact.
    act_key = "hidden_activation" if kind == "gemma3_text" else "hidden_act"
    act = cfg.get(act_key, "gelu_pytorch_tanh" if kind == "gemma3_text" else "silu")
    gated_by = "gelu" if FAMILIES[kind]["mlp"] == "geglu" else "silu"
    if act not in _ACTIVATIONS or not act.startswith(gated_by):
        _fail(source, f"{act_key}={act!r} is not supported for {kind} (minitx runs "
                      f"{'silu' if gated_by == 'silu' else 'gelu, gelu_pytorch_tanh'})")
    # positions, windows, biases; then the switches, the family's row on top
    rope, local_rope = _ropes(cfg, kind, source)
    n = cfg["num_hidden_layers"]
    window, types = _layer_types(cfg, kind, n, source)
    bias = bool(cfg.get("attention_bias", False))
    switches = dict(FAMILIES[kind])
    switches.setdefault("qkv_bias", bias)
    switches.setdefault("o_bias", bias)
    if kind == "deepseek_v3":
        switches.update({k: cfg[k] for k in _MLA_KEYS[:-1] if k in cfg},
                        rope_interleave=cfg.get("rope_interleave", True))
    if kind == "kimi_linear":             # MLA without rotation; the KDA layers' sizes
        switches.update({k: cfg[k] for k in _MLA_KEYS[:-1]}, rope_interleave=False,
                        mixer_options={"kda": {"num_heads": cfg["linear_num_heads"],
                                               "head_dim": cfg["linear_head_dim"],
                                               "conv_kernel": cfg["linear_conv_kernel_dim"]}})
    if kind == "deepseek_v32":                 # rope_interleave: HF's V3.2 does not read it
        switches.update({k: cfg[k] for k in _MLA_KEYS[:-1] if k in cfg},
                        **{k: cfg.get(k, v) for k, v in _INDEX_KEYS.items()})
    if FAMILIES[kind]["mlp"] == "moe":
        switches.update(_moe(cfg, kind, n, source))
    if kind == "qwen3_next":
        sizes = {**_LINEAR_DEFAULTS, **{k: cfg[k] for k in _LINEAR_KEYS if k in cfg}}
        switches["mixer_options"] = {"gated_deltanet": {_LINEAR_KEYS[k]: v
                                                        for k, v in sizes.items()}}
    if kind == "minimax":
        switches.update(_minimax(cfg, types))
    # HF's names → the switches (the sizes, eps, rope, windows, Gemma's numbers, the tying)
    c = DecoderConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=n,
        num_heads=cfg["num_attention_heads"], num_kv_heads=cfg.get("num_key_value_heads"),
        head_dim=cfg.get("head_dim"), ffn_hidden=cfg.get("intermediate_size"),
        norm_eps=cfg.get("rms_norm_eps", 1e-6), mlp_bias=bool(cfg.get("mlp_bias", False)),
        gelu_approximate=_ACTIVATIONS[act] is not False, rope=rope, local_rope=local_rope,
        sliding_window=window, layer_types=types,
        query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", _TIED_DEFAULT.get(kind, False))),
        padding_idx=cfg.get("pad_token_id"),
        max_position=cfg.get("max_position_embeddings", 2048), **switches)
    # Every key must have been read above or be known not to matter.
    read = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "mlp_bias",
            act_key, "rope_parameters", "rope_theta", "rope_scaling", "rope_local_base_freq",
            "partial_rotary_factor", "sliding_window", "layer_types", "attention_bias",
            "query_pre_attn_scalar", "final_logit_softcapping", "tie_word_embeddings",
            "pad_token_id", "max_position_embeddings", *_REFUSED, *_MLA_KEYS, *_MOE_KEYS,
            *_ROUTER_KEYS, *_LINEAR_KEYS, "full_attention_interval", *_KIMI_KEYS,
            *(_INDEX_KEYS if kind == "deepseek_v32" else ()),
            *(_MINIMAX_KEYS if kind == "minimax" else ())}
    unknown = sorted(k for k in set(cfg) - read if not changes_nothing(k))
    if unknown:
        _fail(source, f"config.json key(s) {', '.join(map(repr, unknown))} are not known to "
                      f"minitx's {kind} translation (neither read nor known not to change the "
                      "forward); refused rather than ignored")
    return c


# MiniMax's lightning blocks and residual weights: (α, β) after each layer kind, HF's names
_MINIMAX_KEYS = ("block_size", "full_attn_alpha_factor", "full_attn_beta_factor",
                 "linear_attn_alpha_factor", "linear_attn_beta_factor", "mlp_alpha_factor",
                 "mlp_beta_factor")


def _minimax(cfg, types):
    """MiniMax's switches: the lightning layers' block length, and each layer's residual
    weights (α₁, β₁) after its mixer (softmax or lightning) and (α₂, β₂) after the MLP."""
    get = {"block_size": 256, **{k: 1.0 for k in _MINIMAX_KEYS[1:]}, **cfg}.get
    scales = {kind: (float(get(f"{name}_alpha_factor")), float(get(f"{name}_beta_factor")))
              for kind, name in (("full", "full_attn"), ("sliding", "full_attn"),
                                 ("lightning", "linear_attn"), ("mlp", "mlp"))}
    return {"mixer_options": {"lightning": {"block": get("block_size")}},
            "residual_scales": tuple(scales[t] + scales["mlp"] for t in types)}


def _moe(cfg, kind, n, source):
    """The mixture of experts' switches: which layers stay dense, the experts' sizes, and
    ``nn.moe.MoE``'s options for the family's router and experts (docs/moe.md's table)."""
    get = {**_MOE_DEFAULTS[kind], **{k: v for k, v in cfg.items() if v is not None}}.get
    experts = get("n_routed_experts", get("num_local_experts", get("num_experts")))
    if kind == "qwen3_next" and not experts:
        _fail(source, "num_experts=0 (every MLP dense) is not translated for qwen3_next; "
                      "refused")
    if float(cfg.get("router_jitter_noise") or 0.0) != 0.0:
        _fail(source, f"router_jitter_noise={cfg['router_jitter_noise']} (noise on the router's "
                      "input while training) is not implemented; refused")
    for key, allowed in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
        if key in cfg and cfg[key] != allowed:
            _fail(source, f"{key}={cfg[key]!r}: minitx's {kind} router is {allowed!r}; refused")
    # the layers that keep a dense MLP of width intermediate_size
    if kind == "deepseek_v32" and cfg.get("mlp_layer_types") is not None:
        types = list(cfg["mlp_layer_types"])
        if len(types) != n or not set(types) <= {"dense", "sparse"}:
            _fail(source, f"mlp_layer_types must give 'dense' or 'sparse' for each of the {n} "
                          f"layers, got {types!r}")
        dense = tuple(i for i, t in enumerate(types) if t == "dense")
    elif kind in ("deepseek_v3", "deepseek_v32"):
        dense = tuple(range(min(get("first_k_dense_replace"), n)))
    elif kind == "kimi_linear":                # "dense" or "sparse" per layer
        types = get("mlp_layer_types") or ["dense" if i < get("first_k_dense_replace") else
                                           "sparse" for i in range(n)]
        if len(types) != n or not set(types) <= {"dense", "sparse"}:
            _fail(source, f"mlp_layer_types must give 'dense' or 'sparse' for each of the {n} "
                          f"layers, got {types!r}")
        dense = tuple(i for i, t in enumerate(types) if t == "dense")
    elif kind in ("qwen3_moe", "qwen3_next"):
        only, step = set(get("mlp_only_layers") or ()), get("decoder_sparse_step")
        dense = tuple(i for i in range(n) if i in only or (i + 1) % step)
    else:
        dense = ()
    options = {}
    if kind == "qwen3_moe":
        options = dict(norm_topk_prob=bool(get("norm_topk_prob")))
    elif kind == "qwen3_next":              # a shared expert of its own width, sigmoid-gated
        options = dict(norm_topk_prob=bool(get("norm_topk_prob")),
                       shared_intermediate_size=get("shared_expert_intermediate_size"),
                       shared_expert_gate=True)
    elif kind == "gpt_oss":
        options = dict(router="topk_softmax", router_bias=True, expert="clamped_swiglu",
                       expert_bias=True, swiglu_limit=float(get("swiglu_limit")),
                       swiglu_alpha=float(get("swiglu_alpha")))
    elif kind in ("deepseek_v3", "deepseek_v32", "kimi_linear"):
        # norm_topk_prob may be written null; HF's ``if norm_topk_prob`` reads it as False
        options = dict(router="sigmoid_grouped",
                       norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                       n_group=get("n_group"), topk_group=get("topk_group"),
                       routed_scaling_factor=float(get("routed_scaling_factor")),
                       n_shared_experts=get("n_shared_experts"))
    return {"num_experts": experts, "top_k": get("num_experts_per_tok"),
            "expert_hidden": get("moe_intermediate_size", cfg.get("intermediate_size")),
            "dense_layers": dense, "moe_options": options,
            "router_aux_loss_coef": float(get("router_aux_loss_coef", 0.0))}


def hf_norm_names(placement: str) -> dict:
    """{HF norm name inside a layer: minitx name} for a norm placement."""
    if placement == "pre":
        return {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}
    if placement == "post":
        return {"post_attention_layernorm": "ln1_post",
                "post_feedforward_layernorm": "ln2_post"}
    return {"input_layernorm": "ln1", "post_attention_layernorm": "ln1_post",
            "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ln2_post"}


def _to_minitx(key, norms):
    """One HF key → its minitx name (module docstring's table), or None if unknown."""
    top = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "ln_final.weight",
           "lm_head.weight": "unembed.weight"}
    if key in top:
        return top[key]
    # model.layers.{i}.<module>.…: attention and MLP keep their inner names, norms are renamed
    parts = key.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 5 or not parts[2].isdigit():
        return None
    i, module, rest = parts[2], parts[3], parts[4:]
    if module in ("self_attn", "linear_attn"):          # linear_attn: Qwen3-Next's mixer
        return f"blocks.{i}.attn." + ".".join(rest)
    if module == "mlp":
        return f"blocks.{i}.mlp." + ".".join(rest)
    if module in norms and rest == ["weight"]:
        return f"blocks.{i}.{norms[module]}.weight"
    return None


def _moe_layers(model) -> dict:
    """{layer index: MoE block} of a decoder's mixture-of-experts layers."""
    return {i: b.mlp for i, b in enumerate(model.blocks) if isinstance(b.mlp, MoE)}


def _spelling(model) -> str:
    """How HF writes this decoder's experts: "gpt_oss" (stacked, transposed, gate and up
    interleaved) or "split" (per-expert matrices in the files, gate and up fused in
    transformers 5's modules)."""
    router = model.config.moe_options.get("router", "softmax")
    return "gpt_oss" if router == "topk_softmax" else "split"


_PER_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "gate_proj": "gate_proj",
               "up_proj": "up_proj", "down_proj": "down_proj"}


def _experts_from_hf(tensors: dict, model, source) -> tuple:
    """HF's expert tensors (docs/moe.md: the files' per-expert matrices, or transformers 5's
    fused ``gate_up_proj``; gpt-oss's interleaved, transposed ones) → minitx's stacked
    tensors, under ``model.layers.{i}.mlp.<minitx name>``. Returns (tensors, {new key: the
    HF key it came from}); every other key passes through."""
    moe = _moe_layers(model)
    gpt_oss = _spelling(model) == "gpt_oss"
    out, origin, per_expert = {}, {}, {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5 or not parts[2].isdigit() \
                or int(parts[2]) not in moe or parts[3] not in ("mlp", "block_sparse_moe"):
            out[key] = value
            continue
        i, rest = int(parts[2]), ".".join(parts[4:])
        if rest.endswith(("_blocks", "_scales")):
            _fail(source, f"tensor {key!r} is MXFP4-quantised (4-bit blocks and scales); "
                          "minitx reads float experts: dequantise them first (docs/moe.md)")
        renamed = {}
        if rest in ("gate.weight", "router.weight"):
            renamed["router.weight"] = value
        elif rest in ("router.bias", "gate.e_score_correction_bias"):
            renamed["router." + rest.split(".")[1]] = value
        elif rest.startswith("shared_experts."):
            renamed["shared_expert." + rest.split(".", 1)[1]] = value
        elif rest == "experts.gate_up_proj" and gpt_oss:      # (n, E, 2I), interleaved
            v = np.asarray(value)
            renamed["experts.gate_proj"] = v[:, :, 0::2].transpose(0, 2, 1)
            renamed["experts.up_proj"] = v[:, :, 1::2].transpose(0, 2, 1)
        elif rest == "experts.gate_up_proj_bias" and gpt_oss:
            v = np.asarray(value)
            renamed["experts.gate_proj_bias"] = v[:, 0::2]
            renamed["experts.up_proj_bias"] = v[:, 1::2]
        elif rest == "experts.gate_up_proj":                  # (n, 2I, E): gate rows, then up
            v, half = np.asarray(value), moe[i].experts.intermediate_size
            renamed["experts.gate_proj"], renamed["experts.up_proj"] = v[:, :half], v[:, half:]
        elif rest == "experts.down_proj" and gpt_oss:         # (n, I, E)
            renamed["experts.down_proj"] = np.asarray(value).transpose(0, 2, 1)
        elif len(parts) == 8 and parts[4] == "experts" and parts[5].isdigit() \
                and parts[6] in _PER_EXPERT and parts[7] == "weight":
            per_expert[(i, _PER_EXPERT[parts[6]], int(parts[5]))] = (key, value)
            continue
        elif parts[3] == "mlp":
            renamed[rest] = value        # down_proj(_bias), shared_expert(_gate).*, extras
        else:
            out[key] = value             # an unknown block_sparse_moe key: refused by name
            continue
        for name, v in renamed.items():
            out[f"model.layers.{i}.mlp.{name}"] = v
            origin[f"model.layers.{i}.mlp.{name}"] = key
    # per-expert matrices: all n of each kind, stacked on a leading expert axis
    for i, block in moe.items():
        for kind in ("gate_proj", "up_proj", "down_proj"):
            got = {j: kv for (li, k, j), kv in per_expert.items() if (li, k) == (i, kind)}
            if not got:
                continue
            missing = sorted(set(range(block.num_experts)) - set(got))
            extra = sorted(set(got) - set(range(block.num_experts)))
            if missing or extra:
                _fail(source, f"layer {i}: {kind} of expert(s) {missing} missing, or of "
                              f"expert(s) {extra} beyond the {block.num_experts} experts")
            shapes = {tuple(np.shape(v)) for _, v in got.values()}
            if len(shapes) != 1:
                _fail(source, f"layer {i}: the experts' {kind} tensors differ in shape: "
                              f"{sorted(shapes)}")
            name = f"model.layers.{i}.mlp.experts.{kind}"
            out[name] = np.stack([np.asarray(got[j][1]) for j in range(block.num_experts)])
            first = got[0][0].split(".")
            origin[name] = ".".join(first[:5] + ["{j}"] + first[6:])
    return out, origin


def _experts_to_hf(state: dict, model, files: bool, kind: str) -> dict:
    """The inverse of ``_experts_from_hf`` on {minitx key: array}: transformers 5's module
    tensors (``files=False``, what ``load_state_dict`` of HF's model takes) or the
    checkpoint files' per-expert matrices (``files=True``; Mixtral's ``block_sparse_moe``
    w1, w3, w2). Keys of dense layers pass through."""
    moe = _moe_layers(model)
    gpt_oss = _spelling(model) == "gpt_oss"
    # DeepSeek-V3 writes its shared experts "shared_experts", Qwen's one "shared_expert"
    shared = "shared_experts." if model.config.moe_options.get("n_shared_experts") else \
        "shared_expert."
    out = {}
    for name, value in state.items():
        parts = name.split(".")
        if parts[0] != "blocks" or int(parts[1]) not in moe or parts[2] != "mlp":
            out[name] = value
    for i in moe:
        mine = {k[len(f"blocks.{i}.mlp."):]: v for k, v in state.items()
                if k.startswith(f"blocks.{i}.mlp.")}
        hf = {}
        for key, v in mine.items():
            if key == "router.weight":
                hf["router.weight" if gpt_oss else "gate.weight"] = v
            elif key == "router.bias":
                hf["router.bias"] = v
            elif key == "router.e_score_correction_bias":
                hf["gate.e_score_correction_bias"] = v
            elif key.startswith("shared_expert."):
                hf[shared + key.split(".", 1)[1]] = v
            elif not key.startswith("experts."):
                hf[key] = v
        gate, up, down = (mine.get(f"experts.{k}") for k in ("gate_proj", "up_proj",
                                                              "down_proj"))
        if gate is None:
            pass
        elif gpt_oss:                  # (n, E, 2I): gate in the even columns, up in the odd
            g, u = np.asarray(gate).transpose(0, 2, 1), np.asarray(up).transpose(0, 2, 1)
            both = np.empty(g.shape[:2] + (2 * g.shape[2],), dtype=g.dtype)
            both[:, :, 0::2], both[:, :, 1::2] = g, u
            gb, ub = (np.asarray(mine[f"experts.{k}_proj_bias"]) for k in ("gate", "up"))
            bias = np.empty((gb.shape[0], 2 * gb.shape[1]), dtype=gb.dtype)
            bias[:, 0::2], bias[:, 1::2] = gb, ub
            hf.update({"experts.gate_up_proj": both, "experts.gate_up_proj_bias": bias,
                       "experts.down_proj": np.asarray(down).transpose(0, 2, 1),
                       "experts.down_proj_bias": mine["experts.down_proj_bias"]})
        elif files:                    # one matrix per expert
            names = ("w1", "w3", "w2") if kind in ("mixtral", "kimi_linear", "minimax") else \
                ("gate_proj", "up_proj", "down_proj")
            for ours, theirs in zip((gate, up, down), names):
                for j, w in enumerate(np.asarray(ours)):
                    hf[f"experts.{j}.{theirs}.weight"] = w
        else:                          # transformers 5: (n, 2I, E), gate rows then up rows
            hf["experts.gate_up_proj"] = np.concatenate([np.asarray(gate), np.asarray(up)],
                                                        axis=1)
            hf["experts.down_proj"] = down
        block = "block_sparse_moe" if files and kind in ("mixtral", "minimax") else "mlp"
        out.update({f"model.layers.{i}.{block}.{k}": v for k, v in hf.items()})
    return out


# MiniMax's lightning layers store their decays as buffers (``L.self_attn.<name>``): constants
# of the slopes and the block length, checked on the way in and rewritten on the way out.
_DECAYS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


def _lightning_decays(mixer) -> dict:
    """{buffer name: array} as HF's ``MiniMaxLightningAttention`` holds them: the rates s_h
    (H, 1, 1), λ^{i+1} and λ^{c−i−1} (H, c, 1), λ^{i−j} below the diagonal (1, H, c, c)."""
    s, c = mixer.slopes[:, None, None], mixer.block
    i = np.arange(c)
    dist = i[:, None] - i[None, :]
    diagonal = np.where(dist >= 0, np.exp(-s * np.maximum(dist, 0)), 0.0)
    return {"slope_rate": s, "query_decay": np.exp(-s * (i[:, None] + 1)),
            "key_decay": np.exp(-s * (c - 1 - i[:, None])),
            "diagonal_decay": diagonal[None]}


def _lightning_from_hf(tensors: dict, model, source) -> dict:
    """``tensors`` without the lightning layers' decay buffers, each checked against the
    decays minitx computes (to float32's rounding: HF computes them in float32)."""
    out = dict(tensors)
    for i, block in enumerate(model.blocks):
        if not isinstance(block.attn, LightningMixer):
            continue
        for name, mine in _lightning_decays(block.attn).items():
            key = f"model.layers.{i}.self_attn.{name}"
            if key not in out:
                _fail(source, f"missing tensor: {key}")
            theirs = np.asarray(out.pop(key), dtype="float64")
            if theirs.shape != mine.shape or not np.allclose(theirs, mine, rtol=1e-5,
                                                             atol=1e-7):
                _fail(source, f"tensor {key!r} (shape {theirs.shape}) is not MiniMax's decay "
                              f"for layer {i} of {len(model.blocks)}, "
                              f"block_size={block.attn.block} (shape {mine.shape})")
    return out


def decoder_state_from_hf(tensors: dict, model: Decoder, source: str = "checkpoint") -> dict:
    """{HF key: array} → {minitx key: array} for ``model``; a tensor the model does not
    have, one it needs that is missing, or one of the wrong shape raises, naming it."""
    norms = hf_norm_names(model.config.norm_placement)
    # the shapes alone (state_dict() would copy every parameter to read them)
    expected = {k: tuple(v.shape) for k, v in model._state_entries().items()}
    if _is_kimi(model):
        tensors = _kimi_from_hf(tensors, model)
    # the experts stacked first (docs/moe.md); errors name the HF key a tensor came from
    tensors, origin = _experts_from_hf(_lightning_from_hf(tensors, model, source), model,
                                       source)
    # each HF tensor: renamed, then it must be one the model has, of the model's shape
    state, extra = {}, []
    for key, value in tensors.items():
        if key.startswith("mtp.") and getattr(model, "config_source", None) == "qwen3_next":
            continue                 # multi-token prediction: not in HF's forward either
        name = _to_minitx(key, norms)
        if name == "unembed.weight" and model.config.tie_embeddings:
            # a tied checkpoint may still store the head: it must equal the embedding
            emb = tensors.get("model.embed_tokens.weight")
            if emb is not None and not np.array_equal(np.asarray(value), np.asarray(emb)):
                _fail(source, "lm_head.weight differs from model.embed_tokens.weight but "
                              "config.json says tie_word_embeddings=true")
            continue
        if name not in expected:
            extra.append(origin.get(key, key))
            continue
        if tuple(np.shape(value)) != expected[name]:
            _fail(source, f"tensor {origin.get(key, key)!r} has shape "
                          f"{tuple(np.shape(value))}, the model needs {expected[name]} "
                          f"(as {name})")
        state[name] = value
    # nothing left over, nothing missing
    if extra:
        family = getattr(model, "config_source", "the decoder")
        _fail(source, f"unexpected tensor(s) for {family}: {', '.join(extra)}")
    missing = sorted(set(expected) - set(state))
    if missing:
        names = {v: k for k, v in norms.items()}
        linear = {i for i, t in enumerate(model.config.layer_types) if t == "gated_deltanet"}
        _fail(source, f"missing tensor(s): "
                      f"{', '.join(_to_hf(k, names, linear) for k in missing)}")
    return state


def _to_hf(name, norms, linear=()):
    """One minitx key → its HF name (the inverse of ``_to_minitx``); ``linear``: the indices
    of the layers whose mixer HF calls ``linear_attn`` (Qwen3-Next's)."""
    parts = name.split(".")
    top = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.norm.weight",
           "unembed.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    if parts[0] == "blocks" and parts[2] in ("attn", "mlp"):
        module = "mlp" if parts[2] == "mlp" else \
            "linear_attn" if int(parts[1]) in linear else "self_attn"
        return f"model.layers.{parts[1]}.{module}." + ".".join(parts[3:])
    if parts[0] == "blocks" and parts[2] in norms:
        return f"model.layers.{parts[1]}.{norms[parts[2]]}.weight"
    raise ValueError(f"decoder_state_to_hf: unexpected minitx key {name!r}")


def decoder_state_to_hf(state: dict, model: Decoder, files: bool = False) -> dict:
    """The inverse of ``decoder_state_from_hf``: {minitx key: value} → {HF key: value}
    (``lm_head.weight`` = ``embed.weight`` when tied and the embedding is given). The experts
    as transformers 5's modules hold them (``load_state_dict`` of HF's model), or with
    ``files`` as its checkpoint files do, one matrix per expert (docs/moe.md)."""
    norms = {v: k for k, v in hf_norm_names(model.config.norm_placement).items()}
    kind = getattr(model, "config_source", None)
    # the experts are re-laid out with NumPy: a model on a GPU hands its arrays over once, here
    state = _experts_to_hf({k: to_host(v) for k, v in state.items()}, model, files, kind)
    linear = {i for i, t in enumerate(model.config.layer_types) if t == "gated_deltanet"}
    out = {name if name.startswith("model.") else _to_hf(name, norms, linear): value
           for name, value in state.items()}
    if model.config.tie_embeddings and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    dtype = next(iter(state.values())).dtype if state else "float32"
    for i, block in enumerate(model.blocks):      # MiniMax's decays, in the model's dtype
        if isinstance(block.attn, LightningMixer):
            out.update({f"model.layers.{i}.self_attn.{k}": v.astype(dtype) for k, v in
                        _lightning_decays(block.attn).items()})
    return _kimi_to_hf(out, model, files) if _is_kimi(model) else out


# ---- Kimi Linear's KDA layers: the files' names, or transformers 5's modules' -----------------

_KDA_GATE = ("f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log")
_KDA_CONVS = ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")


def _is_kimi(model) -> bool:
    return getattr(model, "config_source", None) == "kimi_linear" or \
        "kda" in model.config.layer_types


def _kimi_from_hf(tensors: dict, model) -> dict:
    """Kimi Linear's tensors under the names the files use, which minitx's KDA layer keeps:
    transformers 5's module holds the decay's tensors under ``self_attn.forget_gate.`` and the
    three convolutions stacked as one ``conv1d.weight`` (3·H·D, 1, K), q's rows, then k's,
    then v's; and the files hold every MLP under ``block_sparse_moe``."""
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


def _kimi_to_hf(out: dict, model, files: bool) -> dict:
    """The inverse of ``_kimi_from_hf``: the files' names (``files``), or transformers 5's
    module's (``forget_gate.``, one stacked ``conv1d.weight``)."""
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


def decoder_from_hf(cfg: dict, tensors: dict, source: str = "checkpoint",
                    dtype=None, assign: bool = False) -> Decoder:
    """A ``Decoder`` in eval mode from a parsed ``config.json`` and {HF key: array};
    parameters in ``dtype`` (default float32). ``model.hf_config`` keeps the config.

    The model is built without its random initialisation (``init.skipped()``: every weight
    is the checkpoint's). ``assign=True`` gives ``tensors``' arrays to the model as its
    parameters where their dtype allows (``load_state_dict(assign=True)``), so that the
    weights are not held twice; ``load`` does, for the arrays it read itself."""
    with init.skipped():
        model = Decoder(decoder_config(cfg, f"{source}/config.json"))
    if dtype is not None:
        model.to(dtype=dtype)                  # before loading: no float32 round trip
    model.config_source = cfg["model_type"]
    model.hf_config = dict(cfg)
    model.load_state_dict(decoder_state_from_hf(tensors, model, source), assign=assign)
    return model.eval()


# ---- back: a Decoder's switches as a family's config.json ------------------------------------

def _candidate(c: DecoderConfig, kind: str) -> dict:
    """``c`` written as ``kind``'s config.json would hold it (checked by reading it back)."""
    d = dict(model_type=kind, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
             intermediate_size=c.ffn_hidden, num_hidden_layers=c.num_layers,
             num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
             head_dim=c.head_dim, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
             pad_token_id=c.padding_idx, max_position_embeddings=c.max_position,
             rope_parameters=dict(c.rope))
    # what only some families write: Gemma's activation, ropes and numbers; biases; windows
    if kind == "gemma3_text":
        d["hidden_activation"] = "gelu_pytorch_tanh" if c.gelu_approximate else "gelu"
        d["rope_parameters"] = {"full_attention": dict(c.rope),
                                "sliding_attention": dict(c.local_rope or c.rope)}
        d.update(query_pre_attn_scalar=c.query_pre_attn_scalar or c.head_dim,
                 final_logit_softcapping=c.final_logit_softcap)
    else:
        d["hidden_act"] = "silu"
    # Qwen2's q, k, v biases are fixed; the others write one switch for all four
    if kind not in ("qwen2", "minimax"):
        d["attention_bias"] = c.qkv_bias
    if kind == "llama":
        d["mlp_bias"] = c.mlp_bias
    # windows as each family writes them; DeepSeek's latent sizes and experts
    if kind == "mistral":
        d["sliding_window"] = c.sliding_window
    if kind in ("qwen2", "qwen3", "gemma3_text"):
        d["sliding_window"] = c.sliding_window
        d["layer_types"] = [f"{t}_attention" for t in c.layer_types]
    if kind in ("qwen2", "qwen3"):
        d["use_sliding_window"] = c.sliding_window is not None
    if kind in ("deepseek_v3", "deepseek_v32"):
        d.update({k: getattr(c, k) for k in _MLA_KEYS},
                 first_k_dense_replace=len(c.dense_layers),
                 n_routed_experts=c.num_experts, num_experts_per_tok=c.top_k,
                 moe_intermediate_size=c.expert_hidden)
    if kind == "deepseek_v32":                 # the indexer; dense layers and types by name
        d.pop("rope_interleave")
        d.update({k: getattr(c, k) for k in _INDEX_KEYS},
                 layer_types=["indexed_attention"] * c.num_layers,
                 mlp_layer_types=["dense" if i in c.dense_layers else "sparse"
                                  for i in range(c.num_layers)])
    # the mixtures of experts: sizes, the router's and the experts' options, dense layers
    o = c.moe_options
    if kind in ("deepseek_v3", "deepseek_v32"):
        d.update({k: o.get(k) for k in ("n_group", "topk_group", "routed_scaling_factor",
                                         "n_shared_experts", "norm_topk_prob")})
    if kind in ("qwen3_moe", "mixtral", "gpt_oss", "minimax"):
        d.update(num_experts_per_tok=c.top_k, router_aux_loss_coef=c.router_aux_loss_coef)
        d["num_experts" if kind == "qwen3_moe" else "num_local_experts"] = c.num_experts
    if kind == "qwen3_moe":
        d.update(moe_intermediate_size=c.expert_hidden, norm_topk_prob=o.get("norm_topk_prob"),
                 mlp_only_layers=list(c.dense_layers), decoder_sparse_step=1,
                 use_sliding_window=c.sliding_window is not None,
                 sliding_window=c.sliding_window)
    if kind in ("mixtral", "minimax"):
        d.update(intermediate_size=c.expert_hidden, sliding_window=c.sliding_window)
    if kind == "qwen3_next":
        names = {"full": "full_attention", "gated_deltanet": "linear_attention"}
        linear = c.mixer_options.get("gated_deltanet", {})
        d.update({k: linear.get(v) for k, v in _LINEAR_KEYS.items()},
                 layer_types=[names.get(t, t) for t in c.layer_types],
                 moe_intermediate_size=c.expert_hidden, num_experts=c.num_experts,
                 num_experts_per_tok=c.top_k, router_aux_loss_coef=c.router_aux_loss_coef,
                 norm_topk_prob=o.get("norm_topk_prob"), mlp_only_layers=list(c.dense_layers),
                 decoder_sparse_step=1,
                 shared_expert_intermediate_size=o.get("shared_intermediate_size"))
    if kind == "minimax":
        d.update(_minimax_keys(c))
    if kind == "gpt_oss":
        d.update(intermediate_size=c.expert_hidden, sliding_window=c.sliding_window,
                 layer_types=[f"{t}_attention" for t in c.layer_types],
                 swiglu_limit=o.get("swiglu_limit"), swiglu_alpha=o.get("swiglu_alpha"))
    if kind == "kimi_linear":              # its own spellings (_KIMI_ALIASES), no rope
        kda = c.mixer_options.get("kda") or {}
        del d["rope_parameters"]
        d["model_max_length"] = d.pop("max_position_embeddings")
        d.update({k: getattr(c, k) for k in _MLA_KEYS[:-1]},
                 layer_types=[{"kda": "linear_attention"}.get(t, f"{t}_attention")
                              for t in c.layer_types],
                 linear_num_heads=kda.get("num_heads", c.num_heads),
                 linear_head_dim=kda.get("head_dim", c.head_dim),
                 linear_conv_kernel_dim=kda.get("conv_kernel", 4),
                 mlp_layer_types=["dense" if i in c.dense_layers else "sparse"
                                  for i in range(c.num_layers)],
                 num_experts=c.num_experts, num_experts_per_token=c.top_k,
                 moe_intermediate_size=c.expert_hidden, topk_group=o.get("topk_group"),
                 num_shared_experts=o.get("n_shared_experts"), num_expert_group=o.get("n_group"),
                 routed_scaling_factor=o.get("routed_scaling_factor"),
                 moe_renormalize=o.get("norm_topk_prob"))
    return d


def _minimax_keys(c: DecoderConfig) -> dict:
    """MiniMax's own keys for ``c`` (``_minimax`` backwards): the layer kinds, the block
    length, and the residual weights of the first layer of each kind."""
    scales = c.residual_scales or ((1.0,) * 4,) * c.num_layers
    first = dict(zip(reversed(c.layer_types), reversed(scales)))     # first layer of a kind
    d = {"layer_types": ["linear_attention" if t == "lightning" else "full_attention"
                         for t in c.layer_types],
         "block_size": (c.mixer_options.get("lightning") or {}).get("block", 256),
         "mlp_alpha_factor": scales[0][2], "mlp_beta_factor": scales[0][3]}
    for kind, name in (("full", "full_attn"), ("sliding", "full_attn"),
                       ("lightning", "linear_attn")):
        if kind in first:
            d[f"{name}_alpha_factor"], d[f"{name}_beta_factor"] = first[kind][:2]
    return d


def hf_config_dict(c: DecoderConfig, prefer: dict = None) -> dict:
    """The config.json of the first family in ``FAMILIES`` that runs exactly ``c``: each
    family's candidate is read back by ``decoder_config`` and must give ``c`` again.
    ``prefer`` (the config.json a model was loaded from) is tried first, so token ids and
    other ignored keys survive a round trip. ValueError when no family has these switches
    (a decoder of minitx's own)."""
    mine = dataclasses.asdict(c)
    if mine["query_pre_attn_scalar"] == c.head_dim:
        mine["query_pre_attn_scalar"] = None           # 1/√D either way
    first = [] if prefer is None else [dict(prefer)]
    for d in first + [_candidate(c, kind) for kind in FAMILIES]:
        try:
            back = dataclasses.asdict(check_config(decoder_config(d, "hf_config_dict")))
        except validate.OptionError:
            continue
        if back["query_pre_attn_scalar"] == c.head_dim:
            back["query_pre_attn_scalar"] = None
        if back == mine:
            return d
    raise ValueError("hf_config_dict: no HuggingFace family runs this DecoderConfig (its "
                     f"switches match none of {', '.join(FAMILIES)})")
