"""BERT (Devlin et al. 2019) from HuggingFace checkpoints, built from minitx's own
``TransformerEncoderLayer`` — e.g. sentence-transformers' all-MiniLM-L6-v2.

    model, tok = minitx.pretrained.load("all-MiniLM-L6-v2")
    batch = tok(["A man is eating food.", "A man eats."])
    hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"])  # (B, N, E)
    emb = minitx.pretrained.mean_pool(hidden, batch["attention_mask"])            # (B, E)

The model, for token ids t (B, N), segment ids s and positions p = 0 … N − 1::

    h₀ = LayerNorm(W_word[t] + W_pos[p] + W_type[s])              (BertEmbeddings)
    h_l = post-norm encoder layer (Vaswani et al. 2017):
          a = LayerNorm₁(h + MHA(h, padding mask))
          h_l = LayerNorm₂(a + W₂ GELU(W₁ a + b₁) + b₂)
    pooled = tanh(W_pool h_L[:, 0] + b_pool)                        (optional, [CLS])

``hidden_act`` "gelu" is the exact erf GELU (x·Φ(x)), not the tanh approximation;
``layer_norm_eps`` (1e-12 for BERT) comes from ``config.json``. Dropout rates are kept for
training (``hidden_dropout_prob`` on the layers, ``attention_probs_dropout_prob`` on the
attention probabilities); ``load`` returns the model in eval mode.

Checkpoint keys (HuggingFace → minitx; ``L.`` is ``encoder.layer.{i}.`` → ``encoder.layers.{i}.``):

=====================================================  ========================================
HuggingFace                                            minitx
=====================================================  ========================================
embeddings.word_embeddings.weight (V, E)               embeddings.word_embeddings.weight
embeddings.position_embeddings.weight (P, E)           embeddings.position_embeddings.weight
embeddings.token_type_embeddings.weight (T, E)         embeddings.token_type_embeddings.weight
embeddings.LayerNorm.weight / .bias                    embeddings.norm.weight / .bias
L.attention.self.query/key/value.weight (E, E) each    L.self_attn.in_proj_weight (3E, E) =
                                                       [W_query; W_key; W_value] (rows stacked)
L.attention.self.query/key/value.bias (E,) each        L.self_attn.in_proj_bias (3E,)
L.attention.output.dense.weight / .bias                L.self_attn.out_proj.weight / .bias
L.attention.output.LayerNorm.weight / .bias            L.norm1.weight / .bias
L.intermediate.dense.weight (F, E) / .bias             L.linear1.weight / .bias
L.output.dense.weight (E, F) / .bias                   L.linear2.weight / .bias
L.output.LayerNorm.weight / .bias                      L.norm2.weight / .bias
pooler.dense.weight / .bias                            pooler.dense.weight / .bias
=====================================================  ========================================

A leading ``bert.`` (task models such as ``BertForMaskedLM``) is stripped; task heads
(``cls.*``), the ``embeddings.position_ids`` buffer and old TensorFlow names
(``LayerNorm.gamma``/``beta``) are handled; any other key is an error that names it.
Both linear layouts are PyTorch's (out_features, in_features), so nothing is transposed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .. import functional as F
from ..models.transformer import BLOCK_HOOK_RENAMES, TransformerEncoder, TransformerEncoderLayer
from ..nn import Dropout, Embedding, HookedModel, HookPoint, LayerNorm, Linear, Module
from ..models.common import AttentionMaps
from .common import activation, device_xp, padding_mask, token_array

__all__ = ["BertConfig", "BertEmbeddings", "BertPooler", "BertModel", "bert_state_from_hf",
           "bert_state_to_hf"]


@dataclass
class BertConfig:
    """The ``config.json`` fields BERT needs (HuggingFace's names and defaults)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    # "gelu" is the exact GELU; BERT's LayerNorm epsilon 1e-12 is far below the usual 1e-5 and
    # must be copied for outputs to match.
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    add_pooling_layer: bool = True

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "BertConfig":
        """Known fields from a parsed ``config.json``; refuses what minitx cannot run."""
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{source}: position_embedding_type "
                             f"{cfg['position_embedding_type']!r} is not supported (only "
                             "'absolute', BERT's learned positions)")
        if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
            raise ValueError(f"{source}: BERT as a decoder (is_decoder / add_cross_attention) "
                             "is not supported")
        activation(cfg.get("hidden_act", "gelu"), f"{source}: hidden_act")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})


class BertEmbeddings(Module):
    """h₀ = LayerNorm(W_word[t] + W_pos[p] + W_type[s]), then dropout.  (B, N) → (B, N, E)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.position_embeddings = Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.hidden_dropout_prob)
        self.hook_embed = HookPoint()             # (B, N, E) W_word[t] (input_ids only)
        self.hook_pos_embed = HookPoint()         # (B, N, E) W_pos[p]
        self.hook_token_type_embed = HookPoint()  # (B, N, E) W_type[s]

    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None):
        """``input_ids`` (B, N) ints on the model's device, or ``inputs_embeds`` (B, N, E)
        (a Tensor, e.g. to take gradients with respect to it); ``token_type_ids`` (B, N)."""
        xp = device_xp(self)
        x = self.hook_embed(self.word_embeddings(input_ids)) if inputs_embeds is None else \
            inputs_embeds
        b, n = x.shape[0], x.shape[1]
        if n > self.position_embeddings.num_embeddings:
            raise ValueError(f"BertModel: {n} tokens exceed max_position_embeddings="
                             f"{self.position_embeddings.num_embeddings}")
        # h₀ = W_word[t] + W_pos[p] + W_type[s] with positions p = 0 … N − 1 and segment ids s
        # (default 0), then LayerNorm and dropout.
        positions = xp.arange(n)                                       # (N,)
        if token_type_ids is None:
            token_type_ids = xp.zeros((b, n), dtype=np.int64)
        pos = self.position_embeddings(positions)                      # (N, E)
        if self.hook_pos_embed.active:
            pos = self.hook_pos_embed(F.broadcast_to(pos, x.shape))
        x = x + pos + self.hook_token_type_embed(self.token_type_embeddings(token_type_ids))
        return self.dropout(self.norm(x))                              # (B, N, E)


class BertPooler(Module):
    """pooled = tanh(W h[:, 0] + b): the [CLS] state through a dense layer. (B, N, E) → (B, E)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)

    def forward(self, hidden):
        return F.tanh(self.dense(hidden[:, 0]))


class BertModel(Module, AttentionMaps, HookedModel):
    """BERT's encoder (see the module docstring).

    ``forward(input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None)``
    → the last hidden state (B, N, E) as a Tensor. ``input_ids`` (B, N) ints (NumPy arrays
    from the tokenizer are moved to the model's device here, once); ``attention_mask`` (B, N)
    in HuggingFace's polarity, 1 = token, 0 = padding; ``token_type_ids`` (B, N) segment
    ids (default 0). ``pool(hidden)`` applies the pooler ([CLS] → dense → tanh) when the
    checkpoint has one.

    ``record_attention(True)`` keeps every layer's attention probabilities
    (``attention_maps()`` → {"encoder.layers.{i}.self_attn": (B, H, N, N)}). Padding keys
    get probability 0; rows of padding *queries* are computed like any other (as in
    HuggingFace) and are simply not meaningful.

    Hook points, ``run_with_cache`` (the cache's "logits" are the last hidden state) and
    ``run_with_hooks`` under TransformerLens's BERT names: ``hook_embed``,
    ``hook_pos_embed``, ``hook_token_type_embed``, ``embed.ln.*``, ``blocks.{i}.…`` (post-norm:
    ``hook_resid_mid`` and ``hook_resid_post`` are the sums before ``ln1`` / ``ln2``).
    """

    hook_renames = ((r"^embeddings\.norm\.", "embed.ln."), (r"^embeddings\.", ""),
                    (r"^encoder\.", ""), *BLOCK_HOOK_RENAMES)

    def __init__(self, config: BertConfig):
        super().__init__()
        c = self.config = config
        self.embeddings = BertEmbeddings(c)
        # BERT is post-norm (norm_first=False): x = LN(x + sublayer(x)); the stack deep-copies this
        # layer; attention-probability dropout has its own rate.
        layer = TransformerEncoderLayer(
            c.hidden_size, c.num_attention_heads, c.intermediate_size,
            dropout=c.hidden_dropout_prob, activation=activation(c.hidden_act, "BertModel"),
            layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=False)
        layer.self_attn.dropout = float(c.attention_probs_dropout_prob)
        self.encoder = TransformerEncoder(layer, c.num_hidden_layers)
        self.pooler = BertPooler(c.hidden_size) if c.add_pooling_layer else None

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                inputs_embeds=None):
        xp = device_xp(self)
        # Inputs: token ids (moved to the model's device once) or embeddings given directly
        # (inputs_embeds), and optional segment ids of the same (B, N).
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("BertModel: pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            input_ids = token_array(input_ids, xp)
            shape = input_ids.shape
        else:
            shape = tuple(inputs_embeds.shape[:2])
        if token_type_ids is not None:
            token_type_ids = token_array(token_type_ids, xp, "token_type_ids")
            if tuple(token_type_ids.shape) != tuple(shape):
                raise ValueError(f"token_type_ids must have shape {tuple(shape)}, got "
                                 f"{tuple(token_type_ids.shape)}")
        # attention_mask (1 = token) becomes PyTorch's key padding mask (True = pad): padding keys
        # get probability 0.
        pad = padding_mask(attention_mask, shape, xp)                  # (B, N), True = pad
        h = self.embeddings(input_ids, token_type_ids, inputs_embeds)  # (B, N, E)
        return self.encoder(h, src_key_padding_mask=pad)               # (B, N, E)

    def pool(self, hidden):
        """BERT's pooled output tanh(W h[:, 0] + b), (B, E)."""
        if self.pooler is None:
            raise ValueError("BertModel: this checkpoint has no pooler (pooler.dense.*)")
        return self.pooler(hidden)

    @classmethod
    def from_hf(cls, config: dict, tensors: dict, source: str = "checkpoint",
                dtype=None) -> "BertModel":
        """Build from a parsed ``config.json`` and {HF key: array}; parameters in ``dtype``
        (default float32). A pooler is built when the checkpoint has one."""
        state = bert_state_from_hf(tensors, source)
        cfg = dict(config)
        cfg["add_pooling_layer"] = "pooler.dense.weight" in state
        model = cls(BertConfig.from_dict(cfg, source))
        if dtype is not None:
            model.to(dtype=dtype)               # before loading: no float32 round trip
        model.load_state_dict(state)
        return model


# ---- key mapping -------------------------------------------------------------------------

# HF name inside encoder.layer.{i}. → minitx name inside encoder.layers.{i}.
_LAYER_KEYS = {
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "linear1",
    "output.dense": "linear2",
    "output.LayerNorm": "norm2",
}
# Embeddings and pooler keep their names, except LayerNorm → norm.
_EMBEDDING_KEYS = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "pooler.dense.weight": "pooler.dense.weight",
    "pooler.dense.bias": "pooler.dense.bias",
}
_QKV = ("query", "key", "value")


def _clean_key(key: str):
    """Strip ``bert.``; TF-era ``gamma``/``beta`` → ``weight``/``bias``; None = ignore."""
    if key.startswith("bert."):
        key = key[len("bert."):]
    if key.startswith("cls.") or key.endswith("position_ids"):
        return None                                         # task heads, a buffer
    if key.endswith("LayerNorm.gamma"):
        key = key[:-len("gamma")] + "weight"
    elif key.endswith("LayerNorm.beta"):
        key = key[:-len("beta")] + "bias"
    return key


def bert_state_from_hf(tensors: dict, source: str = "checkpoint") -> dict:
    """{HuggingFace BERT key: array} → {minitx ``BertModel`` key: array} (module docstring's
    table). Unknown keys raise ValueError naming them and ``source``."""
    hf = {}
    for key, value in tensors.items():
        k = _clean_key(key)
        if k is not None:
            hf[k] = value
    # Embedding and pooler keys map one to one.
    state, qkv, unknown = {}, {}, []
    for key, value in hf.items():
        if key in _EMBEDDING_KEYS:
            state[_EMBEDDING_KEYS[key]] = value
            continue
        # Layer keys encoder.layer.{i}.<inner>.<leaf>: dense and LayerNorm through _LAYER_KEYS;
        # query, key and value are collected to be packed below; anything else is an error.
        parts = key.split(".")
        if len(parts) >= 5 and parts[:2] == ["encoder", "layer"] and parts[2].isdigit():
            i, inner, leaf = parts[2], ".".join(parts[3:-1]), parts[-1]
            if inner in _LAYER_KEYS:
                state[f"encoder.layers.{i}.{_LAYER_KEYS[inner]}.{leaf}"] = value
                continue
            if inner.startswith("attention.self.") and parts[-2] in _QKV:
                qkv[(i, parts[-2], leaf)] = value
                continue
        unknown.append(key)
    if unknown:
        raise ValueError(f"{source}: unexpected BERT checkpoint key(s): {', '.join(unknown)}")
    # Each layer needs all three of query, key and value, for the weight and the bias.
    for i in sorted({i for i, _, _ in qkv}, key=int):
        for leaf, name in (("weight", "in_proj_weight"), ("bias", "in_proj_bias")):
            parts = [qkv.get((i, p, leaf)) for p in _QKV]
            if any(p is None for p in parts):
                missing = [f"encoder.layer.{i}.attention.self.{p}.{leaf}"
                           for p, a in zip(_QKV, parts) if a is None]
                raise ValueError(f"{source}: missing BERT checkpoint key(s): "
                                 f"{', '.join(missing)}")
            # [W_query; W_key; W_value]: PyTorch's packed in-projection, (3E, E) or (3E,)
            state[f"encoder.layers.{i}.self_attn.{name}"] = np.concatenate(
                [np.asarray(p) for p in parts], axis=0)
    return state


def bert_state_to_hf(state: dict) -> dict:
    """The inverse of ``bert_state_from_hf``: {minitx key: array} → {HF ``BertModel`` key}
    (the packed in-projection is split back into query/key/value)."""
    to_hf = {v: k for k, v in _EMBEDDING_KEYS.items()}
    layer_back = {v: k for k, v in _LAYER_KEYS.items()}
    out = {}
    for key, value in state.items():
        if key in to_hf:
            out[to_hf[key]] = value
            continue
        # Layer keys: dense and LayerNorm names mapped back; the packed in-projection split into
        # three equal row blocks (query, key, value).
        parts = key.split(".")                    # encoder.layers.{i}.<inner>.<leaf>
        i, inner, leaf = parts[2], ".".join(parts[3:-1]), parts[-1]
        prefix = f"encoder.layer.{i}."
        if inner in layer_back:
            out[prefix + layer_back[inner] + "." + leaf] = value
        elif leaf in ("in_proj_weight", "in_proj_bias"):
            e, kind = value.shape[0] // 3, leaf[len("in_proj_"):]        # "weight" / "bias"
            for j, p in enumerate(_QKV):
                out[f"{prefix}attention.self.{p}.{kind}"] = value[j * e:(j + 1) * e]
        else:
            raise ValueError(f"bert_state_to_hf: unexpected minitx key {key!r}")
    return out
