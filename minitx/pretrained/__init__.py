"""``minitx.pretrained``: open HuggingFace checkpoints — BERT and GPT-2 families — and
their tokenizers, in minitx's own modules.

    import minitx.pretrained as pt

    model, tokenizer = pt.load("path/to/all-MiniLM-L6-v2")      # a HuggingFace folder
    batch = tokenizer(["A man is eating food.", "Someone eats."])
    hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"])   # (B, N, E)
    emb = pt.mean_pool(hidden, batch["attention_mask"])                          # (B, E), unit
    (emb @ emb.T).numpy()                                        # cosine similarities

``load`` reads ``config.json`` and picks the family from its ``model_type``:

- "bert" → ``BertModel`` (``model(input_ids, attention_mask=…, token_type_ids=…)`` →
  last hidden state (B, N, E)) and a ``WordPieceTokenizer``;
- "gpt2" → ``GPT2Model`` (``model(input_ids, attention_mask=…)`` → logits (B, N, V);
  ``model.generate``) and a ``ByteLevelBPETokenizer``;
- "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma4_text", "olmo2", "olmo3",
  "smollm3", "nanochat", and the mixtures of experts "qwen3_moe", "mixtral", "gpt_oss",
  "deepseek_v3", "deepseek_v32", "minimax_m2", "glm4_moe", "llama4_text", and the hybrids
  "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear", "minimax", "lfm2",
  "olmo_hybrid", "nemotron_h" → ``minitx.models.Decoder``
  (``model(ids)`` → logits (B, N, V); ``model.generate``), configured by
  ``minitx.pretrained.decoders``, and the folder's ``tokenizer.json`` as a
  ``hf_tokenizer.Tokenizer`` (with its chat template).

``load`` also takes a **GGUF file** (``model.gguf``, llama.cpp's container: ``gguf.py`` reads
it, ``gguf_load.py`` undoes llama.cpp's conventions): the model dequantized to ``dtype``, and
the tokenizer its metadata describes. ``load_tokenizer(path)`` reads a tokenizer alone, from
a folder, a ``tokenizer.json`` or a GGUF file.

    model, tok = pt.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                  add_generation_prompt=True)
    tok.decode(model.generate(Tensor([ids]), 20).numpy()[0, len(ids):])

Weights come only from ``*.safetensors`` and ``.gguf`` files (sharded safetensors through
``model.safetensors.index.json``), read and validated by ``minitx.pretrained.safetensors``
and ``minitx.pretrained.gguf``; pickle-based ``pytorch_model.bin`` files are refused. Every
layer's attention: ``model.record_attention(True)``, run, ``model.attention_maps()``.

``attention_mask`` is HuggingFace's (1 = token, 0 = padding). Do not pass it on to
``nn.TransformerEncoder`` as ``src_key_padding_mask``: that one means True = padding, and a
float mask there is *added* to the scores (see ``minitx.pretrained.common``).
"""
from __future__ import annotations

import json
import os

import numpy as np

from .. import backend, validate
from .. import functional as F
from ..autograd.tensor import Tensor
# Each family brings a config, a model, its tokenizer and the two key mappings
# (HuggingFace ↔ minitx).
from .bert import BertConfig, BertModel, bert_state_from_hf, bert_state_to_hf
from .bpe import ByteLevelBPETokenizer
from .decoders import FAMILIES as DECODER_FAMILIES
from .decoders import family
from .decoders import (decoder_config, decoder_from_hf, decoder_state_from_hf,
                       decoder_state_to_hf)
from .gguf import GGUFError, GGUFFile
from .gguf_load import load_gguf_model
from .gpt2 import GPT2Config, GPT2Model, gpt2_state_from_hf, gpt2_state_to_hf
from .safetensors import (PICKLE_SUFFIXES, SafetensorsError, UnsafeCheckpointError,
                          load_file, refuse_pickle)
from . import real
from .hf_tokenizer import Tokenizer, load_tokenizer
from .wordpiece import WordPieceTokenizer

__all__ = ["load", "load_tokenizer", "Tokenizer", "GGUFFile", "GGUFError", "load_weights",
           "mean_pool", "FAMILIES", "BertConfig", "BertModel",
           "GPT2Config", "GPT2Model", "WordPieceTokenizer", "ByteLevelBPETokenizer",
           "SafetensorsError", "UnsafeCheckpointError", "bert_state_from_hf",
           "bert_state_to_hf", "gpt2_state_from_hf", "gpt2_state_to_hf", "DECODER_FAMILIES",
           "decoder_from_hf", "decoder_state_from_hf", "decoder_state_to_hf", "real"]

# model_type in config.json → (model class, tokenizer class, config key of the position limit)
FAMILIES = {
    "bert": (BertModel, WordPieceTokenizer, "max_position_embeddings"),
    "gpt2": (GPT2Model, ByteLevelBPETokenizer, "n_positions"),
}


# config.json decides everything: model_type picks the family, its fields the shapes.
def _read_config(folder):
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: not a folder (expected a HuggingFace model folder "
                                "with config.json and *.safetensors)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing; a HuggingFace model folder has config.json")
    with open(path, encoding="utf-8") as fh:
        try:
            cfg = json.load(fh)
        except json.JSONDecodeError as exc:
            raise validate.OptionError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise validate.OptionError(f"{path}: a config.json is a JSON object of keys "
                                   f"(model_type, hidden_size, …), got a JSON "
                                   f"{type(cfg).__name__}")
    return cfg


def load_weights(folder, dtype="float32") -> dict:
    """{HF key: NumPy array} from the folder's safetensors file(s), floats as ``dtype``.

    Reads ``model.safetensors.index.json``'s shards when present, else every
    ``*.safetensors`` file. Raises ``UnsafeCheckpointError`` when only pickle-based
    checkpoints (``pytorch_model.bin``, ``*.pt`` …) are there, FileNotFoundError when none."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as fh:
            try:
                weight_map = json.load(fh)["weight_map"]
                files = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise validate.OptionError(f"{index}: expected a JSON object whose "
                                           f"'weight_map' maps tensor names to shard files "
                                           f"({type(exc).__name__}: {exc})") from exc
        missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
        if missing:
            raise FileNotFoundError(f"{index}: names shard(s) {', '.join(missing)}, which "
                                    f"the folder does not have")
    else:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    # No safetensors: refuse the pickle files if that is what is there, rather than a bare
    # "not found".
    if not files:
        pickles = sorted(f for f in os.listdir(folder) if f.lower().endswith(PICKLE_SUFFIXES))
        if pickles:
            refuse_pickle(os.path.join(folder, pickles[0]))
        raise FileNotFoundError(f"{folder}: no *.safetensors weights found")
    # Merge the shards; a key in two shards means a corrupt checkpoint, not one to overwrite.
    tensors = {}
    for name in files:
        path = os.path.join(folder, name)
        for key, arr in load_file(path, dtype=dtype).items():
            if key in tensors:
                raise SafetensorsError(f"{path}: tensor {key!r} appears in two shards")
            tensors[key] = arr
    return tensors


def load(folder, dtype=None, tokenizer: bool = True):
    """``(model, tokenizer)`` from a HuggingFace folder (config.json, *.safetensors,
    tokenizer files) or a ``.gguf`` file; the family comes from ``config.json``'s
    ``model_type`` (a GGUF's ``general.architecture``).

    ``dtype``: "float32" (default) or "float64" parameters (bfloat16/float16 checkpoints are
    widened exactly). Parameters live on the active backend (``minitx.set_backend``). The
    model is returned in eval mode (dropout off), as HuggingFace's ``from_pretrained`` does.
    ``tokenizer=False`` skips the tokenizer (returns ``(model, None)``).
    """
    folder = os.fspath(folder)
    target = np.dtype("float32" if dtype is None else dtype)
    if target not in (np.float32, np.float64):
        raise TypeError(f"load: dtype must be float32 or float64, got {target}")
    if folder.lower().endswith(".gguf") and not os.path.isdir(folder):
        if not os.path.isfile(folder):
            raise FileNotFoundError(f"{folder}: no such GGUF file")
        model, reader = load_gguf_model(folder, dtype=target)
        with reader:
            tok = Tokenizer.from_gguf_metadata(reader.metadata) if tokenizer else None
        return model, tok
    config = _read_config(folder)
    kind = config.get("model_type")
    own = FAMILIES.get(kind)
    if own is None and family(kind, default=None) is None:
        raise ValueError(f"{os.path.join(folder, 'config.json')}: model_type {kind!r} is not "
                         f"supported; minitx.pretrained loads: "
                         f"{', '.join(sorted({*FAMILIES, *DECODER_FAMILIES}))}")
    # Checkpoints may hold bf16/f16, but the model computes in float32 or float64: the weights
    # are widened exactly on load.
    # Weights → the family's key mapping → a model in eval mode; the tokenizer's length limit
    # is the model's position table.
    # Today's decoders: one Decoder, each family a file (models/families/); the tokenizer is
    # read first, so that a folder without one fails before the weights load. BERT and GPT-2
    # keep their own classes here (GPT-2 as the Decoder: ``decoder_from_hf``).
    if own is None:
        decoder_config(config, os.path.join(folder, "config.json"))   # refusals before reading
        tok = Tokenizer.from_folder(folder) if tokenizer else None
        tensors = load_weights(folder, dtype=target)
        return decoder_from_hf(config, tensors, source=folder, dtype=target, assign=True), tok
    tensors = load_weights(folder, dtype=target)
    model_cls, tok_cls, positions_key = own
    model = model_cls.from_hf(config, tensors, source=folder, dtype=target)
    model.eval()
    tok = None
    if tokenizer:
        tok = tok_cls.from_folder(folder, model_max_length=config.get(positions_key))
    return model, tok


def mean_pool(hidden, attention_mask, normalize: bool = True):
    """Sentence embeddings: the mean of the token states over the real tokens.

        e_b = Σ_n m_bn h_bn / max(Σ_n m_bn, 1e-9),   then e_b / max(‖e_b‖₂, 1e-12) if normalize

    ``hidden`` (B, N, E) Tensor, ``attention_mask`` (B, N) 1 = token, 0 = padding (NumPy,
    CuPy or Tensor; moved to hidden's device). Returns (B, E), differentiable. With
    ``normalize`` the rows have unit length, so ``emb @ emb.T`` is the cosine similarity
    (sentence-transformers' recipe for all-MiniLM-L6-v2).
    """
    if not isinstance(hidden, Tensor) or len(hidden.shape) != 3:
        raise ValueError(f"mean_pool: hidden must be a (B, N, E) Tensor, got "
                         f"{type(hidden).__name__} of shape {tuple(getattr(hidden, 'shape', ()))}")
    xp = backend.get_array_module(hidden.data)
    m = xp.asarray(getattr(attention_mask, "data", attention_mask))
    if tuple(m.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"mean_pool: attention_mask must have shape {tuple(hidden.shape[:2])},"
                         f" got {tuple(m.shape)}")
    m = m.astype(hidden.dtype)[:, :, None]                             # (B, N, 1)
    pooled = (hidden * m).sum(axis=1) / xp.maximum(m.sum(axis=1), 1e-9)  # (B, E)
    if not normalize:
        return pooled
    norm = F.sqrt((pooled * pooled).sum(axis=1, keepdims=True))         # (B, 1)
    return pooled / F.clip(norm, min=1e-12)
