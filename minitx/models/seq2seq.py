"""The encoder–decoder ``Transformer`` of "Attention Is All You Need" (Vaswani et al. 2017).

Embeddings · √d_model + sinusoidal positions, an encoder and a decoder stack
(``TransformerEncoder``/``Decoder``), a generator head; ``greedy_decode`` through per-layer KV
caches.
"""
from __future__ import annotations

import math

from .. import backend, validate
from ..attention import KVCache, cached_length
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..nn import init
from ..nn.hooks import HookedModel
from ..nn.layers import Embedding, LayerNorm, Linear
from ..nn.module import Module
from ..nn.positional import SinusoidalPositionalEncoding
from .common import AttentionMaps, token_ids
from .transformer import (BLOCK_HOOK_RENAMES, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

__all__ = ["Transformer"]


# The whole model: two embeddings, the encoder and decoder stacks and the generator head,
# batch-first throughout.
class Transformer(Module, AttentionMaps, HookedModel):
    """The encoder–decoder of "Attention Is All You Need" for sequence-to-sequence tasks.

        memory = Encoder(E_src[src]·√d + PE),   logits = W_g Decoder(E_tgt[tgt]·√d + PE, memory)

    Batch-first: src (B, S), tgt (B, T) token ids. ``pad_idx`` (optional) derives the key
    padding masks from the tokens. Embeddings start N(0, 1/d_model) (fairseq), so that
    E·√d_model and the sinusoidal code have the same scale. Keys: ``src_embed.weight``,
    ``tgt_embed.weight``, ``encoder.layers.{i}.*``, ``encoder.norm.*``, ``decoder.layers.{i}.*``,
    ``decoder.norm.*``,
    ``generator.*``. Cross-attention maps: ``record_attention(True)`` then
    ``attention_maps()`` (keys ``decoder.layers.{i}.multihead_attn``).
    """

    hook_renames = BLOCK_HOOK_RENAMES    # encoder.blocks.{i}.…, decoder.blocks.{i}.…

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 512,
                 nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation="relu",
                 norm_first: bool = False, pad_idx: int = None, attention: str = None,
                 attention_options: dict = None):
        super().__init__()
        # Embeddings are scaled by √d_model and start at N(0, 1/d), so E·√d matches the O(1)
        # entries of the sinusoidal code; the pad rows start at zero.
        self.d_model, self.pad_idx = d_model, pad_idx
        self.src_embed = Embedding(src_vocab_size, d_model, padding_idx=pad_idx)
        self.tgt_embed = Embedding(tgt_vocab_size, d_model, padding_idx=pad_idx)
        for emb in (self.src_embed, self.tgt_embed):      # N(0, 1/d): E·√d is O(1), like PE
            init.normal_(emb.weight, 0.0, d_model ** -0.5)
            if pad_idx is not None:
                emb.weight.data[pad_idx] = 0
        # Both stacks share the layer options and end with a LayerNorm (as PyTorch's
        # nn.Transformer); the generator maps E to target-vocabulary logits.
        self.pos = SinusoidalPositionalEncoding(d_model, dropout=dropout)
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

    # Padding masks: the one given, else tokens == pad_idx (True = pad, PyTorch's polarity).
    def _padding(self, tokens, mask):
        if mask is not None or self.pad_idx is None:
            return mask
        return tokens == self.pad_idx

    def _embed(self, embedding, tokens, offset=0):
        return self.pos(embedding(tokens) * math.sqrt(self.d_model), offset=offset)

    def encode(self, src, src_key_padding_mask=None):
        """src (B, S) → memory (B, S, E)."""
        src = token_ids(src, "src")
        return self.encoder(self._embed(self.src_embed, src),
                            src_key_padding_mask=self._padding(src, src_key_padding_mask))

    def decode(self, tgt, memory, memory_key_padding_mask=None, tgt_key_padding_mask=None,
               kv_caches=None):
        """tgt (B, T) (only the new tokens when ``kv_caches`` are given) → logits (B, T, V)."""
        tgt = token_ids(tgt, "tgt")
        offset = cached_length(kv_caches, len(self.decoder.layers),
                               owner="Transformer.decode")
        x = self.decoder(self._embed(self.tgt_embed, tgt, offset), memory,
                         tgt_key_padding_mask=None if kv_caches is not None else
                         self._padding(tgt, tgt_key_padding_mask),
                         memory_key_padding_mask=memory_key_padding_mask,
                         tgt_is_causal=True, kv_caches=kv_caches)
        return self.generator(x)

    def forward(self, src, tgt, src_key_padding_mask=None, tgt_key_padding_mask=None):
        """Teacher forcing: src (B, S), tgt (B, T) → logits (B, T, V) (causal decoder)."""
        src_tokens = token_ids(src, "src")
        pad = self._padding(src_tokens, src_key_padding_mask)
        memory = self.encode(src_tokens, pad)
        return self.decode(tgt, memory, memory_key_padding_mask=pad,
                           tgt_key_padding_mask=tgt_key_padding_mask)

    def greedy_decode(self, src, max_len: int, bos_idx: int, eos_idx: int = None,
                      src_key_padding_mask=None, use_cache: bool = True):
        """Greedy decoding: start from ``bos_idx``, append the argmax token until ``max_len``
        tokens (or every row produced ``eos_idx``). Returns (B, ≤ max_len) ids incl. BOS, an
        int Tensor. With ``use_cache`` each step feeds one token through per-layer KV caches."""
        src_tokens = token_ids(src, "src")
        max_len = validate.positive_int(max_len, "max_len", owner="Transformer.greedy_decode")
        xp = backend.get_array_module(src_tokens)
        pad = self._padding(src_tokens, src_key_padding_mask)
        ys = xp.full((src_tokens.shape[0], 1), bos_idx, dtype=src_tokens.dtype)
        done = xp.zeros(src_tokens.shape[0], dtype=bool)
        with no_grad():
            memory = self.encode(src_tokens, pad)
            # each layer's own cache: keys and values, or a variant's latent or state
            caches = [getattr(layer.self_attn, "new_cache", KVCache)()
                      for layer in self.decoder.layers] if use_cache else None
            # Each step appends the argmax token; with caches only the newest token is fed (earlier
            # keys and values are read from the caches). Stop once every row has produced eos.
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
        return Tensor(ys)

    generate = greedy_decode
