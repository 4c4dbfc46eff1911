"""``EncoderClassifier``: token ids → class logits, with a pooled encoder stack.

Embeddings + positions + an encoder stack + pooling ("mean" over the non-padding tokens, or a
learned "cls" token, Devlin et al. 2019) + a linear head.
"""
from __future__ import annotations

from .. import backend, validate
from ..autograd.tensor import Tensor
from ..nn import init
from ..nn.hooks import HookedModel, HookPoint
from ..nn.layers import Dropout, Embedding, LayerNorm, Linear
from ..nn.module import Module, Parameter
from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from ..ops.indexing import getitem
from ..ops.shape import broadcast_to, concatenate
from .common import AttentionMaps, token_ids
from .transformer import BLOCK_HOOK_RENAMES, TransformerEncoder, TransformerEncoderLayer

__all__ = ["EncoderClassifier"]


class EncoderClassifier(Module, AttentionMaps, HookedModel):
    """Token ids → class logits: embedding + positions + encoder stack + pooling + head.

    ``pooling="mean"``: mean of the final states over non-padding tokens; ``"cls"``: a learned
    ``cls_token`` (1, 1, E) is prepended and its final state is classified (BERT).
    ``position``: "sinusoidal" | "learned" | "none". ``attention``: None (PyTorch's MHA) or a
    REGISTRY name for the self-attention. ``forward(tokens (B, N), key_padding_mask=None)``
    → logits (B, num_classes); ``key_padding_mask`` (B, N) bool, True = padding (derived
    from ``pad_idx`` when given; it also decides which states the mean pools, so a float or
    int mask is refused rather than guessed at). With ``position="learned"`` at most
    ``max_len`` tokens (the table has one more row, for the cls token).
    """

    # hook names as TransformerLens's BERT: blocks.{i}.…, ln_final.…, plus hook_embed
    hook_renames = ((r"^encoder\.", ""), *BLOCK_HOOK_RENAMES)

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
        # The token table is (vocab_size, E); pad_idx's row starts at zero and never gets a gradient
        # (PyTorch's padding_idx), so a padding token embeds to the zero vector.
        self.pooling, self.pad_idx, self.d_model = pooling, pad_idx, d_model
        self.max_len = validate.positive_int(max_len, "max_len", owner="EncoderClassifier")
        self.position = position
        self.embed = Embedding(vocab_size, d_model, padding_idx=pad_idx)
        # Sinusoidal positions have entries of size ~1: word embeddings start at the same
        # scale (std 1) so that word identity is not drowned by position; learned positions
        # start small like the words (std 0.02).
        init.normal_(self.embed.weight, 0.0, 1.0 if position == "sinusoidal" else 0.02)
        if pad_idx is not None:
            self.embed.weight.data[pad_idx] = 0
        # Learned positions get max_len + 1 rows: with cls pooling the cls token takes one too.
        if position == "learned":
            self.pos = LearnedPositionalEmbedding(max_len + 1, d_model)
        elif position == "sinusoidal":
            self.pos = SinusoidalPositionalEncoding(d_model)
        else:
            self.pos = None
        # "cls" pooling (BERT): one learned (1, 1, E) vector, prepended to every sequence; attention
        # lets its final state gather the whole sequence, and that state is classified.
        if pooling == "cls":
            self.cls_token = Parameter(backend.xp().zeros((1, 1, d_model), dtype="float32"))
            init.normal_(self.cls_token, 0.0, 0.02)
        self.drop = Dropout(dropout)
        # One encoder layer, deep-copied num_layers times; a pre-norm stack (norm_first) ends with
        # a LayerNorm, since its residual stream is never normalised inside the layers.
        layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward or 4 * d_model,
                                        dropout=dropout, activation=activation,
                                        batch_first=True, norm_first=norm_first,
                                        attention=attention, attention_options=attention_options)
        self.encoder = TransformerEncoder(layer, num_layers,
                                          norm=LayerNorm(d_model) if norm_first else None)
        self.head = Linear(d_model, num_classes)
        self.hook_embed = HookPoint()               # (B, N, E) token embeddings

    def forward(self, tokens, key_padding_mask=None):
        tokens = token_ids(tokens, "tokens")
        xp = backend.get_array_module(tokens)
        b, n = tokens.shape
        if self.position == "learned" and n > self.max_len:
            raise ValueError(f"EncoderClassifier: {n} tokens exceed max_len={self.max_len}")
        # The padding mask (B, N), True = padding: the one given, else tokens == pad_idx.
        pad = key_padding_mask
        if pad is None and self.pad_idx is not None:
            pad = tokens == self.pad_idx
        if pad is not None:                                       # a host mask enters once
            pad = xp.asarray(pad.data if isinstance(pad, Tensor) else pad)
            validate.mask(pad, "key_padding_mask", shape=(b, n), dims="(B, N)", kinds="b",
                          owner="EncoderClassifier",
                          hint="True = padding; from HuggingFace's attention_mask (1 = token) "
                               "pass attention_mask == 0, from a 0/1 float mask mask > 0")
        # Embed; with cls pooling prepend the cls vector, never padding, so the mask grows a column.
        x = self.hook_embed(self.embed(tokens))                   # (B, N, E)
        if self.pooling == "cls":
            cls = broadcast_to(self.cls_token, (b, 1, self.d_model))
            x = concatenate([cls, x], axis=1)                     # (B, 1 + N, E)
            if pad is not None:
                pad = xp.concatenate([xp.zeros((b, 1), dtype=bool), pad], axis=1)
        # Add positions, then dropout and the encoder stack.
        if self.pos is not None:
            x = self.pos(x)
        h = self.encoder(self.drop(x), src_key_padding_mask=pad)  # (B, N', E)
        # Pool to one (B, E) vector: the cls state, or the mean over the real tokens,
        # Σᵢ keepᵢ hᵢ / max(Σᵢ keepᵢ, 1) (a row of padding only pools to 0, not NaN).
        if self.pooling == "cls":
            pooled = getitem(h, (slice(None), 0))                 # (B, E)
        elif pad is None:
            pooled = h.mean(axis=1)
        else:
            keep = (~pad).astype(h.dtype)[:, :, None]             # (B, N, 1)
            pooled = (h * keep).sum(axis=1) / xp.maximum(keep.sum(axis=1), 1.0)
        return self.head(pooled)
