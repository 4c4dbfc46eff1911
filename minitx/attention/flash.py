"""The registered ``flash`` variant: exact attention computed tile by tile.

The algorithm — the online softmax recurrence and the recomputing backward — is in
``ops/flash.py`` (``flash_attention``); this Module puts it behind the registry contract.
"""
from __future__ import annotations

from .. import validate
from ..ops.flash import flash_attention
from .base import AttentionBase, register

__all__ = ["FlashAttention"]


@register("flash")
class FlashAttention(AttentionBase):
    r"""Exact attention computed tile by tile with the online softmax (``flash_attention``).

    Formula: attention (``ops/attention_maths.py``) without forming it, by the online softmax
    of the module docstring of ``ops/flash.py``, tile by tile; backward recomputes each tile's
    probabilities from the saved lse.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, key_mask=None)``:
    q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D); ``key_mask`` (B, N) bool (True = may
    attend). Saved for backward: O and lse (B, H, N); tiles S (B, H, b_q, b_k).

    Options: ``block_q`` b_q (256), ``block_k`` b_k (512), ``causal`` (False; tiles entirely
    above the diagonal are skipped), ``num_kv_heads`` (None → H), ``bias`` (True).

    Complexity: {complexity}; time like dense, but no N × N matrix in forward or backward. (On
    CuPy float32/float16 it runs the CUDA kernels.)

    Exactness: exact (equals softmax attention under pattern(n)), up to rounding.

    Reference: Dao, Fu, Ermon, Rudra & Ré (2022), "FlashAttention: Fast and Memory-Efficient
    Exact Attention with IO-Awareness"; backward as in Dao (2023), "FlashAttention-2".
    """

    complexity = "time O(B·H·N²·D), memory O(B·H·(N·D + b_q·b_k))"

    kind = "exact"

    def __init__(self, embed_dim, num_heads, causal=False, block_q: int = 256,
                 block_k: int = 512, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.block_q = validate.positive_int(block_q, "block_q", owner="flash")
        self.block_k = validate.positive_int(block_k, "block_k", owner="flash")

    def attend(self, q, k, v, key_mask=None):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv); optional ``key_mask`` (B, N)."""
        return flash_attention(q, k, v, causal=self.causal, key_mask=key_mask,
                               block_q=self.block_q, block_k=self.block_k)
