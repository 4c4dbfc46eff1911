"""Pieces the BERT and GPT-2 families share: activations by HuggingFace name, the
``attention_mask`` convention, attention-map recording, and checkpoint-key bookkeeping.

**The mask trap.** HuggingFace models take ``attention_mask`` with 1 = a real token and
0 = padding. PyTorch's (and minitx's) ``TransformerEncoder`` takes ``src_key_padding_mask``
with the *opposite* polarity — True = padding — and a *float* mask there is not read as
true/false at all but **added to the attention scores**. So HF's mask passed straight on
as floats silently adds +1 to the real tokens' scores and masks nothing. The pretrained
models here take ``attention_mask`` in HuggingFace's polarity (ints, bools or floats that
are 0/1), check it, and turn it into a boolean padding mask themselves.
"""
from __future__ import annotations

from .. import backend
from .. import functional as F
from ..autograd.tensor import Tensor

__all__ = ["gelu_tanh", "activation", "ACTIVATIONS", "padding_mask", "token_array",
           "device_xp"]


def gelu_tanh(x):
    """GELU, tanh approximation: ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (GPT-2's "gelu_new")."""
    return F.gelu(x, approximate="tanh")


def _gelu(x):
    """GELU, exact: x·Φ(x) = ½x(1 + erf(x/√2)) (BERT's "gelu")."""
    return F.gelu(x)


# HuggingFace's ``hidden_act`` / ``activation_function`` names that minitx can run exactly.
ACTIVATIONS = {"gelu": _gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh,
               "relu": F.relu}


def activation(name, where: str):
    """The function for a HuggingFace activation name, or ValueError naming ``where``."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}: activation {name!r} is not supported; supported: "
                         f"{sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _raw(x):
    return x.data if isinstance(x, Tensor) else x


def token_array(ids, xp, name: str = "input_ids"):
    """Integer ids (B, N) — a NumPy/CuPy array, a Tensor or nested lists — as an array of
    the module ``xp`` (the model's), moved there once."""
    arr = xp.asarray(_raw(ids))
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be (B, N) integers, got shape {tuple(arr.shape)} and "
                         f"dtype {arr.dtype}")
    return arr


def padding_mask(attention_mask, shape, xp):
    """HuggingFace ``attention_mask`` (B, N): 1 = keep, 0 = padding (int, bool or 0/1 float)
    → a bool array (B, N), True = padding (PyTorch's ``key_padding_mask`` polarity), on the
    module ``xp``. None when there is no mask or it keeps every token."""
    if attention_mask is None:
        return None
    m = xp.asarray(_raw(attention_mask))
    if m.ndim == 1:
        m = m[None]
    if tuple(m.shape) != tuple(shape):
        raise ValueError(f"attention_mask must have shape {tuple(shape)} (batch, tokens), got "
                         f"{tuple(m.shape)}")
    # A numeric mask must be HuggingFace's 0/1 keep mask; an additive bias (0/−inf) is refused,
    # not misread.
    if m.dtype != bool:
        if m.dtype.kind not in "iuf":
            raise TypeError(f"attention_mask must be 0/1 ints, bools or 0/1 floats, got dtype "
                            f"{m.dtype}")
        if not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token), "
                             "HuggingFace's convention; it is not an additive bias")
        m = m != 0
    # A mask keeping every token is no mask: None lets attention take its unmasked path.
    if bool(m.all()):
        return None
    return ~m


def device_xp(module):
    """The array module holding ``module``'s parameters (where new arrays must be made)."""
    for p in module.parameters():
        return backend.get_array_module(p.data)
    return backend.xp()
