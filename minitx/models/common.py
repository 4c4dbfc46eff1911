"""What the models share: token-id checking and reading the attention maps back."""
from __future__ import annotations

from .. import backend
from ..autograd.tensor import Tensor

__all__ = ["token_ids", "AttentionMaps"]


def token_ids(idx, name="idx"):
    """Integer token ids (B, T) as a raw array."""
    data = idx.data if isinstance(idx, Tensor) else backend.xp().asarray(idx)
    if data.ndim != 2 or data.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a (B, T) integer array, got shape "
                         f"{tuple(data.shape)} and dtype {data.dtype}")
    return data


class AttentionMaps:
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
