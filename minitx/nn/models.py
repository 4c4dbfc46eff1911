"""Complete models: a decoder-only ``GPT``, the encoder–decoder ``Transformer`` and an
``EncoderClassifier`` — each small enough to read in one sitting.

- ``GPT`` (Radford et al. 2018/2019): token + position embeddings, ``n_layer`` pre-norm
  causal blocks, final LayerNorm, a language-model head tied to the token embedding
  (Press & Wolf 2017). ``generate`` decodes through a KV cache.
- ``Transformer`` (Vaswani et al. 2017): embeddings · √d_model + sinusoidal positions, an
  encoder and a decoder stack (``nn.TransformerEncoder``/``Decoder``), a generator head;
  ``greedy_decode`` through per-layer KV caches.
- ``EncoderClassifier``: embeddings + positions + encoder stack + pooling ("mean" over the
  non-padding tokens, or a learned "cls" token, Devlin et al. 2019) + a linear head.

Attention maps for visualisation: ``model.record_attention(True)``, run the model, then
``model.attention_maps()`` → {module name: (B, H, Nq, Nk) array} for every attention module
that keeps its weights (MultiheadAttention and the exact/position variants).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import backend
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..ops.indexing import getitem
from ..ops.linalg import linear
from ..ops.loss import cross_entropy
from ..ops.shape import broadcast_to, concatenate, reshape
from . import init
from .layers import Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleList, Parameter
from .transformer import (TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                          TransformerEncoderLayer, get_activation)

__all__ = ["GPTConfig", "GPT", "GPTBlock", "Transformer", "EncoderClassifier", "sample_next"]

_POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "relative", "none")


def _attn():
    from .. import attention  # noqa: PLC0415 - minitx.attention imports minitx.nn
    return attention


def _tokens(idx, name="idx"):
    """Integer token ids (B, T) as a raw array."""
    data = idx.data if isinstance(idx, Tensor) else backend.xp().asarray(idx)
    if data.ndim != 2 or data.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a (B, T) integer array, got shape "
                         f"{tuple(data.shape)} and dtype {data.dtype}")
    return data


def sample_next(logits, temperature: float = 1.0, top_k: int = None):
    """Pick the next token per row of ``logits`` (B, V) (raw array): argmax when
    ``temperature == 0``, else sample softmax(logits / temperature) restricted to the ``top_k``
    largest (drawn from ``minitx.manual_seed``'s generator). Returns (B, 1) ints."""
    xp = backend.get_array_module(logits)
    if temperature == 0 or top_k == 1:
        return logits.argmax(axis=-1)[:, None]
    if not temperature > 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature!r}")
    z = logits.astype("float64") / temperature
    if top_k is not None:
        if not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        kth = xp.sort(z, axis=-1)[:, -min(top_k, z.shape[-1])][:, None]
        z = xp.where(z < kth, -xp.inf, z)
    p = xp.exp(z - z.max(axis=-1, keepdims=True))
    cdf = xp.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
    r = backend.to_device(backend.rng().random((z.shape[0], 1)), backend.device_of(z))
    return xp.minimum((cdf < r).sum(axis=-1), z.shape[-1] - 1)[:, None]


class _AttentionMaps:
    """Mixin: switch weight recording on every attention module and collect the maps."""

    def record_attention(self, enabled: bool = True):
        for _, m in self.named_modules():
            if hasattr(m, "record_weights"):
                m.record_weights = bool(enabled)
                if not enabled:
                    m.last_attn_weights = None
        return self

    def attention_maps(self) -> dict:
        """{module name: last (B, H, Nq, Nk) attention weights} of the recording modules."""
        return {name: m.last_attn_weights for name, m in self.named_modules()
                if getattr(m, "last_attn_weights", None) is not None}


# ---- GPT ---------------------------------------------------------------------------------

@dataclass
class GPTConfig:
    """Hyper-parameters of ``GPT``.

    ``attention``: a ``minitx.attention.REGISTRY`` name (built causal). ``position``:
    "learned" (GPT-2's ``wpe``), "sinusoidal", "none", or "rope" | "alibi" | "relative",
    which select the matching attention variant (then ``attention`` must be "mha" or the
    same name). ``num_kv_heads``: MQA/GQA key/value heads (exact variants).
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    attention: str = "mha"
    num_kv_heads: int = None
    position: str = "learned"
    attention_options: dict = field(default_factory=dict)
    tie_weights: bool = True


class GPTBlock(Module):
    """Pre-norm causal block: x + Attn(LN₁(x)), then x + MLP(LN₂(x)), MLP = W₂ GELU(W₁ x)."""

    def __init__(self, config: GPTConfig, attention: str):
        super().__init__()
        c = config
        attn = _attn()
        cls = attn.REGISTRY[attention]
        options = dict(c.attention_options)
        if issubclass(cls, attn.ExactSelfAttention):
            options.setdefault("dropout", c.dropout)
        if c.num_kv_heads is not None:
            options["num_kv_heads"] = c.num_kv_heads
        self.ln_1 = LayerNorm(c.n_embd, bias=c.bias)
        self.attn = cls(c.n_embd, c.n_head, causal=True, bias=c.bias, **options)
        self.ln_2 = LayerNorm(c.n_embd, bias=c.bias)
        self.c_fc = Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.drop = Dropout(c.dropout)
        self.gelu = get_activation("gelu")

    def forward(self, x, kv_cache=None):
        """x (B, T, E) → (B, T, E)."""
        a = self.ln_1(x)
        x = x + (self.attn(a, kv_cache=kv_cache) if kv_cache is not None else self.attn(a))
        return x + self.drop(self.c_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class GPT(Module, _AttentionMaps):
    """A decoder-only transformer language model (GPT-2's layout, Radford et al. 2019).

        h₀ = wte[idx] + positions,  h_l = Block_l(h_{l−1}),  logits = LN_f(h_L) wteᵀ

    ``forward(idx (B, T), targets=None, kv_caches=None)`` → ``(logits (B, T, V), loss or
    None)``; loss = mean cross-entropy of ``targets`` (B, T) (−100 ignored). Keys:
    ``wte.weight``, ``wpe.weight`` (learned positions), ``h.{i}.ln_1/attn/ln_2/c_fc/c_proj.*``,
    ``ln_f.*`` (and ``lm_head.weight`` only when ``tie_weights=False``). Initialisation as
    GPT-2: N(0, 0.02²), residual projections N(0, 0.02²/(2·n_layer)), zero biases.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        c = config
        if c.position not in _POSITIONS:
            raise ValueError(f"GPTConfig.position must be one of {_POSITIONS}, got "
                             f"{c.position!r}")
        name = c.attention
        if c.position in ("rope", "alibi", "relative"):
            if c.attention not in ("mha", c.position):
                raise ValueError(f"GPTConfig: position={c.position!r} selects the "
                                 f"{c.position!r} attention variant; attention must be 'mha' "
                                 f"or {c.position!r}, got {c.attention!r}")
            name = c.position
        if name not in _attn().REGISTRY:
            raise ValueError(f"GPTConfig.attention must be one of {sorted(_attn().REGISTRY)}, "
                             f"got {name!r}")
        self.config = c
        self.wte = Embedding(c.vocab_size, c.n_embd)
        if c.position == "learned":
            self.wpe = _attn().LearnedPositionalEmbedding(c.block_size, c.n_embd)
        elif c.position == "sinusoidal":
            self.wpe = _attn().SinusoidalPositionalEncoding(c.n_embd)
        else:
            self.wpe = None
        self.drop = Dropout(c.dropout)
        self.h = ModuleList([GPTBlock(c, name) for _ in range(c.n_layer)])
        self.ln_f = LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = None if c.tie_weights else Linear(c.n_embd, c.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.startswith("ln") or ".ln_" in name or name.startswith("wpe"):
                continue
            if name.endswith("bias"):
                init.zeros_(p)
            elif name.endswith("c_proj.weight") or name.endswith("out_proj.weight"):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.config.n_layer))
            elif name.endswith("weight") and len(p.shape) == 2 and "rel_" not in name:
                init.normal_(p, 0.0, 0.02)

    @property
    def supports_kv_cache(self) -> bool:
        return all(getattr(b.attn, "supports_kv_cache", False) for b in self.h)

    def new_caches(self):
        """One empty ``KVCache`` per block."""
        return [_attn().KVCache() for _ in self.h]

    def forward(self, idx, targets=None, kv_caches=None):
        tokens = _tokens(idx)
        b, t = tokens.shape
        offset = len(kv_caches[0]) if kv_caches is not None else 0
        if self.config.position == "learned" and offset + t > self.config.block_size:
            raise ValueError(f"GPT: sequence of {offset + t} tokens exceeds block_size="
                             f"{self.config.block_size}")
        x = self.wte(tokens)                                       # (B, T, E)
        if self.wpe is not None:
            x = self.wpe(x, offset=offset)
        x = self.drop(x)
        for i, block in enumerate(self.h):
            x = block(x, None if kv_caches is None else kv_caches[i])
        x = self.ln_f(x)
        w = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(x, w)                                      # (B, T, E) @ (E, V)
        if targets is None:
            return logits, None
        tgt = _tokens(targets, "targets")
        loss = cross_entropy(reshape(logits, (b * t, -1)), tgt.reshape(-1))
        return logits, loss

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int = None,
                 use_cache: bool = True, paged: bool = False):
        """Extend idx (B, T) by ``max_new_tokens`` tokens, one at a time; returns (B, T + n).

        With ``use_cache`` (and attention variants that support it) each step feeds only the
        new token through the model, reading earlier keys/values from per-block KV caches
        (``paged=True``: a ``PagedKVCache`` pool). As in nanoGPT the context is cropped to
        the last ``block_size`` tokens; once it would be, steps fall back to a full forward, so
        cached and uncached generation give the same tokens. ``temperature=0`` or
        ``top_k=1`` is greedy.
        """
        tokens = _tokens(idx).copy()
        xp = backend.get_array_module(tokens)
        bs = self.config.block_size
        caches = None
        with no_grad():
            for step in range(max_new_tokens):
                t = tokens.shape[1]
                if use_cache and self.supports_kv_cache and t <= bs:
                    if caches is None:
                        caches = self._paged_caches(tokens.shape[0]) if paged else \
                            self.new_caches()
                        logits, _ = self(tokens, kv_caches=caches)
                    else:
                        logits, _ = self(tokens[:, -1:], kv_caches=caches)
                else:
                    logits, _ = self(tokens[:, -bs:])
                nxt = sample_next(logits.data[:, -1, :], temperature, top_k)
                tokens = xp.concatenate([tokens, nxt.astype(tokens.dtype)], axis=1)
        return tokens

    def _paged_caches(self, batch, page_size: int = 16):
        c = self.config
        hkv = self.h[0].attn.num_kv_heads
        pages = batch * (-(-c.block_size // page_size) + 1)
        return [_attn().PagedKVCache(pages, page_size, hkv, c.n_embd // c.n_head).view(
            range(batch)) for _ in self.h]


# ---- the encoder–decoder Transformer -----------------------------------------------------

class Transformer(Module, _AttentionMaps):
    """The encoder–decoder of "Attention Is All You Need" for sequence-to-sequence tasks.

        memory = Encoder(E_src[src]·√d + PE),   logits = W_g Decoder(E_tgt[tgt]·√d + PE, memory)

    Batch-first: src (B, S), tgt (B, T) token ids. ``pad_idx`` (optional) derives the key
    padding masks from the tokens. Embeddings start N(0, 1/d_model) (fairseq), so that
    E·√d_model and the sinusoidal code have the same scale. Keys: ``src_embed.weight``, ``tgt_embed.weight``,
    ``encoder.layers.{i}.*``, ``encoder.norm.*``, ``decoder.layers.{i}.*``, ``decoder.norm.*``,
    ``generator.*``. Cross-attention maps: ``record_attention(True)`` then
    ``attention_maps()`` (keys ``decoder.layers.{i}.multihead_attn``).
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 512,
                 nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation="relu",
                 norm_first: bool = False, pad_idx: int = None, attention: str = None,
                 attention_options: dict = None):
        super().__init__()
        self.d_model, self.pad_idx = d_model, pad_idx
        self.src_embed = Embedding(src_vocab_size, d_model, padding_idx=pad_idx)
        self.tgt_embed = Embedding(tgt_vocab_size, d_model, padding_idx=pad_idx)
        for emb in (self.src_embed, self.tgt_embed):      # N(0, 1/d): E·√d is O(1), like PE
            init.normal_(emb.weight, 0.0, d_model ** -0.5)
            if pad_idx is not None:
                emb.weight.data[pad_idx] = 0
        self.pos = _attn().SinusoidalPositionalEncoding(d_model, dropout=dropout)
        common = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                      batch_first=True, norm_first=norm_first)
        self.encoder = TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, attention=attention,
                                    attention_options=attention_options, **common),
            num_encoder_layers, norm=LayerNorm(d_model))
        self.decoder = TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **common), num_decoder_layers,
            norm=LayerNorm(d_model))
        self.generator = Linear(d_model, tgt_vocab_size)

    def _padding(self, tokens, mask):
        if mask is not None or self.pad_idx is None:
            return mask
        return tokens == self.pad_idx

    def _embed(self, embedding, tokens, offset=0):
        return self.pos(embedding(tokens) * math.sqrt(self.d_model), offset=offset)

    def encode(self, src, src_key_padding_mask=None):
        """src (B, S) → memory (B, S, E)."""
        src = _tokens(src, "src")
        return self.encoder(self._embed(self.src_embed, src),
                            src_key_padding_mask=self._padding(src, src_key_padding_mask))

    def decode(self, tgt, memory, memory_key_padding_mask=None, tgt_key_padding_mask=None,
               kv_caches=None):
        """tgt (B, T) (only the new tokens when ``kv_caches`` are given) → logits (B, T, V)."""
        tgt = _tokens(tgt, "tgt")
        offset = len(kv_caches[0]) if kv_caches is not None else 0
        x = self.decoder(self._embed(self.tgt_embed, tgt, offset), memory,
                         tgt_key_padding_mask=None if kv_caches is not None else
                         self._padding(tgt, tgt_key_padding_mask),
                         memory_key_padding_mask=memory_key_padding_mask,
                         tgt_is_causal=True, kv_caches=kv_caches)
        return self.generator(x)

    def forward(self, src, tgt, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """Teacher forcing: src (B, S), tgt (B, T) → logits (B, T, V) (causal decoder)."""
        src_tokens = _tokens(src, "src")
        pad = self._padding(src_tokens, src_key_padding_mask)
        memory = self.encode(src_tokens, pad)
        return self.decode(tgt, memory, memory_key_padding_mask=pad,
                           tgt_key_padding_mask=tgt_key_padding_mask)

    def greedy_decode(self, src, max_len: int, bos_idx: int, eos_idx: int = None,
                      src_key_padding_mask=None, use_cache: bool = True):
        """Greedy decoding: start from ``bos_idx``, append the argmax token until ``max_len``
        tokens (or every row produced ``eos_idx``). Returns (B, ≤ max_len) ids incl. BOS.
        With ``use_cache`` each step feeds one token through per-layer KV caches."""
        src_tokens = _tokens(src, "src")
        xp = backend.get_array_module(src_tokens)
        pad = self._padding(src_tokens, src_key_padding_mask)
        ys = xp.full((src_tokens.shape[0], 1), bos_idx, dtype=src_tokens.dtype)
        done = xp.zeros(src_tokens.shape[0], dtype=bool)
        with no_grad():
            memory = self.encode(src_tokens, pad)
            caches = [_attn().KVCache() for _ in self.decoder.layers] if use_cache else None
            for _ in range(max_len - 1):
                if use_cache:
                    logits = self.decode(ys[:, -1:], memory, pad, kv_caches=caches)
                else:
                    logits = self.decode(ys, memory, pad)
                nxt = logits.data[:, -1].argmax(axis=-1)[:, None].astype(ys.dtype)
                ys = xp.concatenate([ys, nxt], axis=1)
                if eos_idx is not None:
                    done |= nxt[:, 0] == eos_idx
                    if bool(done.all()):
                        break
        return ys

    generate = greedy_decode


# ---- a classifier ------------------------------------------------------------------------

class EncoderClassifier(Module, _AttentionMaps):
    """Token ids → class logits: embedding + positions + encoder stack + pooling + head.

    ``pooling="mean"``: mean of the final states over non-padding tokens; ``"cls"``: a learned
    ``cls_token`` (1, 1, E) is prepended and its final state is classified (BERT).
    ``position``: "sinusoidal" | "learned" | "none". ``attention``: None (PyTorch's MHA) or a
    REGISTRY name for the self-attention. ``forward(tokens (B, N), key_padding_mask=None)``
    → logits (B, num_classes); ``key_padding_mask`` (B, N) True = padding (derived from
    ``pad_idx`` when given).
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 64, nhead: int = 4,
                 num_layers: int = 2, dim_feedforward: int = None, dropout: float = 0.1,
                 max_len: int = 512, pooling: str = "mean", position: str = "sinusoidal",
                 attention: str = None, attention_options: dict = None, norm_first: bool = True,
                 activation="gelu", pad_idx: int = None):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"EncoderClassifier: pooling must be 'mean' or 'cls', got "
                             f"{pooling!r}")
        if position not in ("sinusoidal", "learned", "none"):
            raise ValueError(f"EncoderClassifier: position must be 'sinusoidal', 'learned' or "
                             f"'none', got {position!r}")
        self.pooling, self.pad_idx, self.d_model = pooling, pad_idx, d_model
        self.embed = Embedding(vocab_size, d_model, padding_idx=pad_idx)
        # Sinusoidal positions have entries of size ~1: word embeddings start at the same
        # scale (std 1) so that word identity is not drowned by position; learned positions
        # start small like the words (std 0.02).
        init.normal_(self.embed.weight, 0.0, 1.0 if position == "sinusoidal" else 0.02)
        if pad_idx is not None:
            self.embed.weight.data[pad_idx] = 0
        if position == "learned":
            self.pos = _attn().LearnedPositionalEmbedding(max_len + 1, d_model)
        elif position == "sinusoidal":
            self.pos = _attn().SinusoidalPositionalEncoding(d_model)
        else:
            self.pos = None
        if pooling == "cls":
            self.cls_token = Parameter(backend.xp().zeros((1, 1, d_model), dtype="float32"))
            init.normal_(self.cls_token, 0.0, 0.02)
        self.drop = Dropout(dropout)
        layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward or 4 * d_model,
                                        dropout=dropout, activation=activation,
                                        batch_first=True, norm_first=norm_first,
                                        attention=attention, attention_options=attention_options)
        self.encoder = TransformerEncoder(layer, num_layers,
                                          norm=LayerNorm(d_model) if norm_first else None)
        self.head = Linear(d_model, num_classes)

    def forward(self, tokens, key_padding_mask=None):
        tokens = _tokens(tokens, "tokens")
        xp = backend.get_array_module(tokens)
        b, n = tokens.shape
        pad = key_padding_mask
        if pad is None and self.pad_idx is not None:
            pad = tokens == self.pad_idx
        if pad is not None:                                       # a host mask enters once
            pad = xp.asarray(pad.data if isinstance(pad, Tensor) else pad)
        x = self.embed(tokens)                                    # (B, N, E)
        if self.pooling == "cls":
            cls = broadcast_to(self.cls_token, (b, 1, self.d_model))
            x = concatenate([cls, x], axis=1)                     # (B, 1 + N, E)
            if pad is not None:
                pad = xp.concatenate([xp.zeros((b, 1), dtype=bool), pad], axis=1)
        if self.pos is not None:
            x = self.pos(x)
        h = self.encoder(self.drop(x), src_key_padding_mask=pad)  # (B, N', E)
        if self.pooling == "cls":
            pooled = getitem(h, (slice(None), 0))                 # (B, E)
        elif pad is None:
            pooled = h.mean(axis=1)
        else:
            keep = (~pad).astype(h.dtype)[:, :, None]             # (B, N, 1)
            pooled = (h * keep).sum(axis=1) / xp.maximum(keep.sum(axis=1), 1.0)
        return self.head(pooled)
