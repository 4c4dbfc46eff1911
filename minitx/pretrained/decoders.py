"""HuggingFace's decoder families — Llama, Mistral, Qwen2, Qwen3, Gemma 3, OLMo 2 and
DeepSeek-V3 (its dense layers and multi-head latent attention, for now) — read into
minitx's one ``Decoder``: each family is a row of switches, its ``config.json`` translated
key by key, its tensors renamed by one table.

    model, _ = minitx.pretrained.load("path/to/Qwen3-0.6B", dtype="float64", tokenizer=False)
    logits = model(ids)                                   # (B, N, V)
    out = model.generate(ids, max_new_tokens=20)          # greedy, through the KV caches

**The switches.** ``FAMILIES[model_type]`` holds what a family fixes (its MLP, norm
placement, QK-norm, Gemma's details); the sizes, eps, rope, biases, windows and tying come
from ``config.json`` (``decoder_config``). Every key of ``config.json`` is read, listed as
not changing the forward (``IGNORED``, with the reason in docs/decoders.md), or refused by
name: a rope_type minitx does not compute, an activation it does not have, bidirectional
attention, quantisation. Adding a family is one more row; the mixture-of-experts families
add ``mlp="moe"`` and the router's keys.

**The tensors** (``L.`` = ``model.layers.{i}.`` in HuggingFace, ``blocks.{i}.`` in minitx):

===========================================  ================================================
HuggingFace                                  minitx
===========================================  ================================================
model.embed_tokens.weight (V, E)             embed.weight
L.self_attn.{q,k,v,o}_proj.weight / .bias    blocks.{i}.attn.{q,k,v,o}_proj.weight / .bias
L.self_attn.{q,k}_norm.weight                blocks.{i}.attn.{q,k}_norm.weight
L.mlp.{gate,up,down}_proj.weight             blocks.{i}.mlp.{gate,up,down}_proj.weight
L.input_layernorm.weight                     blocks.{i}.ln1.weight (pre, sandwich)
L.post_attention_layernorm.weight            blocks.{i}.ln2.weight (pre: Llama, Mistral,
                                             Qwen) or blocks.{i}.ln1_post.weight (OLMo 2,
                                             Gemma 3: it follows the attention)
L.pre_feedforward_layernorm.weight           blocks.{i}.ln2.weight (Gemma 3)
L.post_feedforward_layernorm.weight          blocks.{i}.ln2_post.weight (OLMo 2, Gemma 3)
model.norm.weight                            ln_final.weight
lm_head.weight (V, E)                        unembed.weight; when tied, absent or checked
                                             equal to embed.weight
===========================================  ================================================

Both libraries store ``Linear`` weights as (out, in), so no tensor is transposed. A missing,
extra or misshapen tensor is refused, naming it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import validate
from ..models.decoder import Decoder, DecoderConfig, check_config
from ..nn.rotary import check_rope

__all__ = ["FAMILIES", "IGNORED", "decoder_config", "decoder_state_from_hf",
           "decoder_state_to_hf", "decoder_from_hf", "hf_norm_names", "hf_config_dict"]

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
}

# DeepSeek-V3's keys: multi-head latent attention's sizes, and the MoE's, by HF's names.
_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "rope_interleave")
_MOE_KEYS = {"n_routed_experts": "num_experts", "num_experts_per_tok": "top_k",
             "moe_intermediate_size": "expert_hidden"}
# the router's options: translated once nn.moe runs them (until then an MoE layer is refused)
_ROUTER_KEYS = ("n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
                "norm_topk_prob", "topk_method", "scoring_func")

# config.json keys that do not change the forward pass (docs/decoders.md gives each reason).
IGNORED = frozenset({
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version",
    "_name_or_path", "bos_token_id", "eos_token_id", "use_cache", "initializer_range",
    "attention_dropout", "pretraining_tp", "tokenizer_class",
    "output_attentions", "output_hidden_states", "return_dict", "max_window_layers",
    "use_sliding_window", "sliding_window_pattern", "_sliding_window_pattern",
    "attn_logit_softcapping", "qk_head_dim", "num_nextn_predict_layers", "output_router_logits",
})

# What a key that changes the maths must hold for minitx to run the family as HF does.
_REFUSED = {"use_bidirectional_attention": (False, None), "quantization_config": (None,)}
_ACTIVATIONS = {"silu": None, "gelu_pytorch_tanh": True, "gelu_new": True, "gelu": False}
_DEFAULT_THETA = {"gemma3_text": (1_000_000.0, 10_000.0)}
_TIED_DEFAULT = {"gemma3_text": True}


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
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
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
        return (_rope_dict(params["full_attention"], cfg, kind, source),
                _rope_dict(params["sliding_attention"], cfg, kind, source))
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
    if kind == "mistral":                      # one window for every layer, or none
        return window, None
    if kind in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    # layer_types when written; else derived as HF derives it (Gemma: every 6th is global;
    # Qwen: layers from max_window_layers on slide)
    types = cfg.get("layer_types")
    if types is None and kind == "gemma3_text":
        period = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % period else "full_attention"
                 for i in range(n)]
    if types is None and kind in ("qwen2", "qwen3"):
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else
                 "full_attention" for i in range(n)]
    # HF's names to minitx's, and a sliding layer needs a window
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    if not set(types) <= set(names):
        _fail(source, f"layer_types may hold only {sorted(names)}, got {sorted(set(types))}")
    types = tuple(names[t] for t in types)
    if "sliding" in types and window is None:
        _fail(source, "layer_types has sliding_attention layers but sliding_window is null")
    return window, types


def decoder_config(cfg: dict, source: str = "config.json") -> DecoderConfig:
    """A parsed ``config.json`` of a family in ``FAMILIES`` → ``DecoderConfig``; a key that
    is neither translated nor in ``IGNORED`` is refused by name."""
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        _fail(source, f"model_type {kind!r} is not a decoder family minitx loads "
                      f"({', '.join(sorted(FAMILIES))})")
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
        switches.update(_deepseek(cfg, n, source))
    # HF's names → the switches (the sizes, eps, rope, windows, Gemma's numbers, the tying)
    c = DecoderConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_layers=n,
        num_heads=cfg["num_attention_heads"], num_kv_heads=cfg.get("num_key_value_heads"),
        head_dim=cfg.get("head_dim"), ffn_hidden=cfg["intermediate_size"],
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
            "pad_token_id", "max_position_embeddings", *_REFUSED, "first_k_dense_replace",
            *_MLA_KEYS, *_MOE_KEYS, *_ROUTER_KEYS}
    unknown = sorted(set(cfg) - read - IGNORED)
    if unknown:
        _fail(source, f"config.json key(s) {', '.join(map(repr, unknown))} are not known to "
                      f"minitx's {kind} translation (neither read nor known not to change the "
                      "forward); refused rather than ignored")
    return c


def _deepseek(cfg, n, source):
    """DeepSeek-V3's switches: MLA's sizes, the dense first layers, the experts' sizes."""
    first = cfg.get("first_k_dense_replace", 3)
    if first < n:
        _fail(source, f"deepseek_v3: layers {first} … {n - 1} are mixtures of experts, whose "
                      f"router options ({', '.join(k for k in _ROUTER_KEYS if k in cfg)}) "
                      "minitx does not translate yet; only checkpoints whose "
                      "first_k_dense_replace covers every layer load")
    out = {"dense_layers": tuple(range(n)), "rope_interleave": cfg.get("rope_interleave", True)}
    out.update({k: cfg[k] for k in _MLA_KEYS[:-1] if k in cfg})
    out.update({name: cfg[k] for k, name in _MOE_KEYS.items() if k in cfg})
    return out


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
    if module == "self_attn":
        return f"blocks.{i}.attn." + ".".join(rest)
    if module == "mlp":
        return f"blocks.{i}.mlp." + ".".join(rest)
    if module in norms and rest == ["weight"]:
        return f"blocks.{i}.{norms[module]}.weight"
    return None


def decoder_state_from_hf(tensors: dict, model: Decoder, source: str = "checkpoint") -> dict:
    """{HF key: array} → {minitx key: array} for ``model``; a tensor the model does not
    have, one it needs that is missing, or one of the wrong shape raises, naming it."""
    norms = hf_norm_names(model.config.norm_placement)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # each HF tensor: renamed, then it must be one the model has, of the model's shape
    state, extra = {}, []
    for key, value in tensors.items():
        name = _to_minitx(key, norms)
        if name == "unembed.weight" and model.config.tie_embeddings:
            # a tied checkpoint may still store the head: it must equal the embedding
            emb = tensors.get("model.embed_tokens.weight")
            if emb is not None and not np.array_equal(np.asarray(value), np.asarray(emb)):
                _fail(source, "lm_head.weight differs from model.embed_tokens.weight but "
                              "config.json says tie_word_embeddings=true")
            continue
        if name not in expected:
            extra.append(key)
            continue
        if tuple(np.shape(value)) != expected[name]:
            _fail(source, f"tensor {key!r} has shape {tuple(np.shape(value))}, the model "
                          f"needs {expected[name]} (as {name})")
        state[name] = value
    # nothing left over, nothing missing
    if extra:
        family = getattr(model, "config_source", "the decoder")
        _fail(source, f"unexpected tensor(s) for {family}: {', '.join(extra)}")
    missing = sorted(set(expected) - set(state))
    if missing:
        names = {v: k for k, v in norms.items()}
        _fail(source, f"missing tensor(s): {', '.join(_to_hf(k, names) for k in missing)}")
    return state


def _to_hf(name, norms):
    """One minitx key → its HF name (the inverse of ``_to_minitx``)."""
    parts = name.split(".")
    top = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.norm.weight",
           "unembed.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    if parts[0] == "blocks" and parts[2] in ("attn", "mlp"):
        module = "self_attn" if parts[2] == "attn" else "mlp"
        return f"model.layers.{parts[1]}.{module}." + ".".join(parts[3:])
    if parts[0] == "blocks" and parts[2] in norms:
        return f"model.layers.{parts[1]}.{norms[parts[2]]}.weight"
    raise ValueError(f"decoder_state_to_hf: unexpected minitx key {name!r}")


def decoder_state_to_hf(state: dict, model: Decoder) -> dict:
    """The inverse of ``decoder_state_from_hf``: {minitx key: value} → {HF key: value}
    (``lm_head.weight`` = ``embed.weight`` when tied and the embedding is given)."""
    norms = {v: k for k, v in hf_norm_names(model.config.norm_placement).items()}
    out = {_to_hf(name, norms): value for name, value in state.items()}
    if model.config.tie_embeddings and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def decoder_from_hf(cfg: dict, tensors: dict, source: str = "checkpoint",
                    dtype=None) -> Decoder:
    """A ``Decoder`` in eval mode from a parsed ``config.json`` and {HF key: array};
    parameters in ``dtype`` (default float32). ``model.hf_config`` keeps the config."""
    model = Decoder(decoder_config(cfg, f"{source}/config.json"))
    if dtype is not None:
        model.to(dtype=dtype)                  # before loading: no float32 round trip
    model.config_source = cfg["model_type"]
    model.hf_config = dict(cfg)
    model.load_state_dict(decoder_state_from_hf(tensors, model, source))
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
    if kind != "qwen2":
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
    if kind == "deepseek_v3":
        d.update({k: getattr(c, k) for k in _MLA_KEYS},
                 first_k_dense_replace=len(c.dense_layers),
                 n_routed_experts=c.num_experts, num_experts_per_tok=c.top_k,
                 moe_intermediate_size=c.expert_hidden)
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
