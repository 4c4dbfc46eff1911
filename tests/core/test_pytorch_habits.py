"""Code copied from PyTorch runs: dtype/device construction keywords, ``.double()`` and friends,
``.to(np.float64)`` / ``.to("float64")``, ``enable_nested_tensor``; and the float-mask trap is
named where it is set."""
import warnings

import numpy as np
import pytest

import minitx
import minitx.nn as nn
from support import tensor


def _dtypes(module):
    return {str(p.dtype) for p in module.parameters()}


@pytest.mark.parametrize("make", [
    lambda **kw: nn.Linear(4, 3, **kw),
    lambda **kw: nn.Embedding(5, 4, **kw),
    lambda **kw: nn.LayerNorm(4, **kw),
    lambda **kw: nn.RMSNorm(4, **kw),
    lambda **kw: nn.MultiheadAttention(8, 2, **kw),
    lambda **kw: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, **kw),
    lambda **kw: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, **kw),
], ids=["Linear", "Embedding", "LayerNorm", "RMSNorm", "MultiheadAttention",
        "TransformerEncoderLayer", "TransformerDecoderLayer"])
def test_dtype_and_device_construction_keywords(make):
    assert _dtypes(make(dtype=np.float64)) == {"float64"}
    assert _dtypes(make(dtype="float64", device=minitx.get_backend() == "cupy" and "cuda"
                        or "cpu")) == {"float64"}
    assert _dtypes(make()) == {"float32"}


def test_double_float_half_and_every_spelling_of_to():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    assert layer.double() is layer and _dtypes(layer) == {"float64"}
    assert _dtypes(layer.float()) == {"float32"}
    assert _dtypes(layer.half()) == {"float16"}
    assert _dtypes(layer.to(np.float64)) == {"float64"}
    assert _dtypes(layer.to("float32")) == {"float32"}
    assert _dtypes(layer.to(np.dtype("float64"))) == {"float64"}
    assert _dtypes(layer.to(dtype="float32")) == {"float32"}
    here = "cuda" if minitx.get_backend() == "cupy" else "cpu"
    assert _dtypes(layer.to(here, "float64")) == {"float64"}
    assert all(p.device == here for p in layer.parameters())


def test_to_refuses_what_is_not_a_device_or_a_float_dtype():
    layer = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="floating dtype, got int64"):
        layer.to("int64")
    with pytest.raises(TypeError, match="dtype must be"):
        layer.to("tpu")
    with pytest.raises(ValueError, match="two dtypes"):
        layer.to("float32", "float64")
    assert _dtypes(layer) == {"float32"}                  # nothing half-changed


def test_encoder_takes_pytorchs_nested_tensor_switches_and_computes_the_same():
    minitx.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = tensor(np.random.default_rng(0).standard_normal((2, 5, 8)), dtype="float32")
    plain = nn.TransformerEncoder(layer, 2)
    ported = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False, mask_check=False)
    ported.load_state_dict(plain.state_dict())
    np.testing.assert_array_equal(ported(x).numpy(), plain(x).numpy())


def test_a_float_zero_one_padding_mask_warns_that_it_masks_nothing():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = tensor(np.ones((2, 4, 8)), dtype="float32")
    hf_mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=np.float32)   # HF polarity, floats
    with pytest.warns(UserWarning, match="a float mask of 0s and 1s"):
        mha(x, x, x, key_padding_mask=hf_mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # the bool mask: no warning
        mha(x, x, x, key_padding_mask=hf_mask == 0)
        mha(x, x, x, key_padding_mask=np.where(hf_mask == 0, -np.inf, 0.0).astype(np.float32))


def test_a_huggingface_polarity_bool_padding_mask_warns_and_long_padding_does_not():
    """HuggingFace's attention_mask passed as is (True at the tokens) hides every sequence's
    first key: a warning names the polarity. A PyTorch-polarity mask that hides most keys of
    every sequence (short sequences padded far) is legitimate: no warning."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = tensor(np.ones((2, 6, 8)), dtype="float32")
    attention_mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])   # HF: 1 = token
    with pytest.warns(UserWarning, match="hides the first key of every sequence.*"
                                         "attention_mask == 0"):
        mha(x, x, x, key_padding_mask=attention_mask == 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mha(x, x, x, key_padding_mask=attention_mask == 0)              # the fix it names
        short = np.array([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=bool)
        mha(x, x, x, key_padding_mask=short)                           # mostly padding: fine
