r"""A GGUF model file as a minitx ``Decoder``: llama.cpp's names and conventions undone.

``gguf.py`` reads the container and dequantizes its tensors; this file translates what it
holds into what the rest of ``minitx.pretrained`` reads from a HuggingFace folder — a
``config.json`` dict and ``{HF key: array}`` — so that a GGUF model goes through the same
family translation (``decoders.decoder_config``, ``decoders.decoder_from_hf``) as a
safetensors checkpoint, and nothing about a family is written twice.

**The metadata.** GGUF keys are ``ARCH.key`` (``llama.block_count``); ``METADATA`` maps each
to its config.json name, per architecture. ``general.*`` is the file's description (name,
licence, quantisation) and changes nothing; ``tokenizer.*`` builds the tokenizer
(``hf_tokenizer.Tokenizer.from_gguf_metadata``). Any other ``ARCH.*`` key is refused by name:
it may change the maths (a rope scaling, experts). Only the architectures in ``METADATA`` are
read: ``llama`` (Llama, SmolLM2, …) and ``gemma3``; another is refused by name.

The ``gemma3.*`` keys have no layer pattern, no local RoPE base and no
``query_pre_attn_scalar``. HuggingFace fills them from ``Gemma3TextConfig``'s class
defaults — one full layer after every five sliding ones, a sliding-layer RoPE base of 10,000,
and a score scale of $1/\sqrt{256}$ — and so does ``GEMMA3_DEFAULTS`` here, with
``gelu_pytorch_tanh``, Gemma's activation, which the file does not name either. The
embedding is tied when the file has no ``output.weight`` (llama.cpp drops the tied copy).

**The tensors.** llama.cpp renames every tensor (``blk.{i}.attn_q.weight`` for
``model.layers.{i}.self_attn.q_proj.weight``, ``TENSORS``) and changes two kinds on the way
in; both are undone here:

- **Llama's q and k rows are permuted.** HuggingFace's Llama rotates each head's two halves,
  (x_j, x_{j + D/2}) for j < D/2 (``rotate_half``); llama.cpp rotates adjacent pairs
  (x_{2j}, x_{2j+1}). Its converter therefore reorders the rows of ``q_proj`` and ``k_proj``
  within each head so that pair j sits at rows 2j and 2j + 1:
  $W^{gguf}_{h, 2j + t} = W^{hf}_{h, j + t D/2}$, t ∈ {0, 1}. ``unpermute_rows`` applies the
  inverse, row $j + tD/2$ from row $2j + t$ (k with the key/value head count).
- **Gemma's norm weights are stored plus one.** Gemma's RMSNorm scales by (1 + w), and
  llama.cpp's norm by w, so its converter writes w + 1 for every ``*norm.weight`` (the layers'
  four, q and k norms, and the final norm); ``gemma3_norm`` subtracts 1, in float32, as
  HuggingFace's GGUF loader does.

Everything else is the weight as HuggingFace stores it, (out, in), after dequantization
(``gguf.py``: exact float32 values of each block format).
"""
from __future__ import annotations

import re

import numpy as np

from .. import validate
from .decoders import decoder_from_hf
from .gguf import GGUFFile

__all__ = ["METADATA", "TENSORS", "GEMMA3_DEFAULTS", "gguf_config", "gguf_tensors",
           "unpermute_rows", "load_gguf_model"]

# ARCH.key → config.json key, per architecture (None: read elsewhere, or known to change
# nothing); a key of the architecture not listed here is refused by name.
_COMMON = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",        # often absent: then read off the embedding's rows
}
# the keys each architecture adds: Llama's rotary dimension is its head size; Gemma 3 states
# its head size apart from E / H, and its sliding window
METADATA = {
    "llama": {"model_type": "llama", **_COMMON, "rope.dimension_count": "head_dim"},
    "gemma3": {"model_type": "gemma3_text", **_COMMON, "attention.key_length": "head_dim",
               "attention.value_length": None, "attention.sliding_window": "sliding_window"},
}
#: Gemma3TextConfig's class defaults for what the gemma3.* keys leave out (module docstring)
GEMMA3_DEFAULTS = {"sliding_window_pattern": 6, "rope_local_base_freq": 10_000.0,
                   "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh"}

# GGUF tensor name → HF name, "{i}" the layer. The same GGUF name means different HF norms in
# the two families: Llama's ffn_norm is the norm before its MLP, post_attention_layernorm;
# Gemma 3 has four norms a layer.
_LAYER = "model.layers.{i}."
_ATTN_MLP = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
}
# each family's per-layer tensors; the norms are where the two differ
TENSORS = {
    "llama": {"ffn_norm.weight": "post_attention_layernorm.weight", **_ATTN_MLP},
    "gemma3": {"attn_q_norm.weight": "self_attn.q_norm.weight",
               "attn_k_norm.weight": "self_attn.k_norm.weight",
               "post_attention_norm.weight": "post_attention_layernorm.weight",
               "ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight", **_ATTN_MLP},
}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
           "model.norm.weight", "output.weight": "lm_head.weight"}


def _architecture(meta: dict, source: str) -> str:
    """``general.architecture``, refused by name unless ``METADATA`` translates it."""
    arch = meta.get("general.architecture")
    if arch not in METADATA:
        raise validate.OptionError(
            f"{source}: general.architecture {arch!r} is not supported; minitx reads GGUF "
            f"models of architecture {', '.join(sorted(METADATA))}")
    return arch


def gguf_config(meta: dict, tensor_shapes: dict, source: str = "model.gguf") -> dict:
    """The config.json dict of a GGUF file's model: ``meta`` its metadata, ``tensor_shapes``
    {GGUF tensor name: NumPy shape} (the tying and the vocabulary size are read off the
    tensors). Refuses another architecture, or a key of this one it does not translate, by
    name."""
    arch = _architecture(meta, source)
    table = METADATA[arch]
    cfg = {"model_type": table["model_type"]}
    unknown = []
    for key, value in meta.items():                # every ARCH.* key: translated, or refused
        if not key.startswith(arch + "."):
            continue                              # general.*, tokenizer.*: not the model's
        name = key[len(arch) + 1:]
        if name not in table:
            unknown.append(key)
        elif table[name] is not None:
            cfg[table[name]] = value
    if unknown:
        raise validate.OptionError(
            f"{source}: GGUF key(s) {', '.join(map(repr, sorted(unknown)))} are not translated "
            f"for architecture {arch!r} (they may change the forward); refused")
    # two tensors that change the config: stored RoPE factors (refused), and the embedding
    if "rope_freqs.weight" in tensor_shapes:
        raise validate.OptionError(f"{source}: tensor 'rope_freqs.weight' (llama.cpp's stored "
                                   "RoPE frequency scaling, Llama 3.1's) is not read; refused")
    if "token_embd.weight" not in tensor_shapes:
        raise validate.OptionError(f"{source}: no tensor 'token_embd.weight' (the embedding)")
    cfg.setdefault("vocab_size", int(tensor_shapes["token_embd.weight"][0]))
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_shapes   # no output: tied
    if arch == "gemma3":                           # HF's class defaults, as HF fills them
        d = GEMMA3_DEFAULTS
        n = cfg["num_hidden_layers"]
        cfg["layer_types"] = ["full_attention" if (i + 1) % d["sliding_window_pattern"] == 0
                              else "sliding_attention" for i in range(n)]
        # two RoPE bases: the file's for the full layers, the default local one for sliding
        cfg["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": d["rope_local_base_freq"]}}
        cfg["query_pre_attn_scalar"] = d["query_pre_attn_scalar"]
        cfg["hidden_activation"] = d["hidden_activation"]
    return cfg


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's row order of a q or k projection (module docstring): (heads·D, E) with
    row 2j + t of each head → row j + t·D/2."""
    rows = w.shape[0]
    if rows % (2 * heads):
        raise validate.OptionError(f"unpermute_rows: {rows} rows do not split into {heads} "
                                   "heads of an even size")
    d = rows // heads
    # (H, D/2, 2, …): [h, j, t] is GGUF row h·D + 2j + t; swapping j and t puts it at j + t·D/2
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, arch: str, source: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in TENSORS[arch]:
        return _LAYER.format(i=m.group(1)) + TENSORS[arch][m.group(2)]
    raise validate.OptionError(f"{source}: tensor {name!r} has no HuggingFace name for "
                               f"architecture {arch!r}; refused")


def gguf_tensors(reader, cfg: dict, dtype="float32", source: str = "model.gguf") -> dict:
    """{HF key: array} of an open ``GGUFFile``: dequantized (exact float32), renamed, with
    llama.cpp's changes undone (module docstring), then cast to ``dtype``."""
    arch = _architecture(reader.metadata, source)
    out = {}
    for name in reader.tensors:
        key = _hf_name(name, arch, source)
        w = reader.dequantize(name)                                    # float32
        if arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if key.endswith("q_proj.weight") else \
                cfg["num_key_value_heads"]
            w = unpermute_rows(w, heads)
        if arch == "gemma3" and key.endswith("norm.weight"):
            w = w - np.float32(1.0)                                    # w + 1 stored
        out[key] = w.astype(dtype, copy=False)
    return out


def load_gguf_model(path, dtype="float32"):
    """``(Decoder, GGUFFile)`` from a GGUF file: the model in eval mode, and the open file (its
    metadata builds the tokenizer)."""
    path = str(path)
    reader = GGUFFile(path)
    shapes = {name: info.shape for name, info in reader.tensors.items()}
    cfg = gguf_config(reader.metadata, shapes, source=path)
    tensors = gguf_tensors(reader, cfg, dtype=dtype, source=path)
    model = decoder_from_hf(cfg, tensors, source=path, dtype=dtype, assign=True)
    return model, reader
