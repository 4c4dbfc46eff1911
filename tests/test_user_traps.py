"""The traps a newcomer falls into where a message is unclear, each fixed where its class
arises: a mask of the wrong dtype names the module, the argument, what was expected and what
was given (``validate.mask``); a KV-cache list of the wrong length names the layer count
(``cached_length``); a limit message names the limit the caller passed; NumPy scalars are
accepted wherever Python numbers are."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import nn, validate
from minitx.attention import KVCache
from minitx.models import GPT, EncoderClassifier, GPTConfig, Transformer
from minitx.pretrained.gpt2 import GPT2Config, GPT2Model
from minitx.validate import OptionError


def _x(*shape):
    return minitx.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))


# ---- masks of the wrong dtype or shape -----------------------------------------------------

def test_an_int_key_padding_mask_is_refused_naming_module_argument_dtype_and_shape():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = _x(2, 5, 8)
    with pytest.raises(OptionError, match=r"^MultiheadAttention: key_padding_mask must be a "
                                          r"bool or float array \(N, S\) = \(2, 5\), got "
                                          r"int64 \(2, 5\)\. True = padding"):
        mha(x, x, x, key_padding_mask=np.zeros((2, 5), np.int64))
    with pytest.raises(TypeError):           # OptionError is a TypeError, as it was before
        mha(x, x, x, key_padding_mask=np.zeros((2, 5), np.int32))


def test_a_key_padding_mask_of_the_wrong_shape_says_both_shapes():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = _x(2, 5, 8)
    with pytest.raises(ValueError, match=r"key_padding_mask must be .* \(N, S\) = \(2, 5\), "
                                         r"got bool \(2, 4\)"):
        mha(x, x, x, key_padding_mask=np.zeros((2, 4), bool))


@pytest.mark.parametrize("mask, given", [(np.zeros((5, 5), np.int64), r"int64 \(5, 5\)"),
                                         (np.zeros((3, 5, 5), bool), r"bool \(3, 5, 5\)")])
def test_an_attn_mask_is_refused_naming_both_shapes_it_may_have(mask, given):
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = _x(2, 5, 8)
    with pytest.raises(OptionError, match=r"MultiheadAttention: attn_mask must be a bool or "
                                          r"float array \(L, S\) = \(5, 5\) or "
                                          r"\(N·num_heads, L, S\) = \(4, 5, 5\), got " + given):
        mha(x, x, x, attn_mask=mask)


def test_a_layer_with_a_registry_variant_names_itself_in_the_mask_error():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                       attention="local", attention_options={"window": 2})
    with pytest.raises(OptionError, match=r"^TransformerEncoderLayer: key_padding_mask must be"):
        layer(_x(2, 5, 8), src_key_padding_mask=np.zeros((2, 5), np.int64))


@pytest.mark.parametrize("mask", [np.array([[0, 0, 1, 1], [0, 1, 1, 1]], np.float32),
                                  np.array([[0, 0, 1, 1], [0, 1, 1, 1]], np.int64)])
def test_the_classifier_refuses_a_non_bool_padding_mask_saying_how_to_convert(mask):
    model = EncoderClassifier(20, 3, d_model=8, nhead=2, num_layers=1, dropout=0.0)
    tokens = np.array([[1, 2, 0, 0], [3, 0, 0, 0]])
    with pytest.raises(OptionError, match=rf"^EncoderClassifier: key_padding_mask must be a "
                                          rf"bool array \(B, N\) = \(2, 4\), got {mask.dtype} "
                                          r"\(2, 4\)\. True = padding; .*attention_mask == 0"):
        model(tokens, mask)
    model(tokens, mask.astype(bool))                                  # the fix it names runs


def test_validate_mask_accepts_what_it_should_and_a_list_is_named():
    assert validate.mask(np.zeros((2, 3), bool), "m", shape=(2, 3)) is not None
    validate.mask(np.zeros((2, 3), np.float16), "m", shape=[(1, 3), (2, 3)])
    with pytest.raises(OptionError, match=r"m must be a bool array, got a list"):
        validate.mask([[True]], "m", kinds="b")


# ---- KV caches: one per layer --------------------------------------------------------------

def _gpt():
    return GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=3, n_head=2, n_embd=8,
                         dropout=0.0))


def _gpt2():
    return GPT2Model(GPT2Config(vocab_size=11, n_positions=16, n_embd=8, n_layer=3, n_head=2,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


@pytest.mark.parametrize("make, owner", [(_gpt, "GPT"), (_gpt2, "GPT2Model")])
@pytest.mark.parametrize("keep", [0, 1, 2, 4])
def test_a_cache_list_of_the_wrong_length_names_the_layer_count(make, owner, keep):
    model = make()
    caches = [KVCache() for _ in range(keep)]
    with pytest.raises(ValueError, match=rf"^{owner}: kv_caches must hold one cache per "
                                         rf"layer: 3 caches, got {keep}$"):
        model(np.ones((1, 2), np.int64), kv_caches=caches)


def test_a_single_cache_or_caches_out_of_step_are_named():
    model = _gpt()
    with pytest.raises(ValueError, match=r"kv_caches must be a list of one cache per layer "
                                         r"\(3\), got a KVCache"):
        model(np.ones((1, 2), np.int64), kv_caches=KVCache())
    caches = model.new_caches()
    model(np.ones((1, 2), np.int64), kv_caches=caches)
    with pytest.raises(ValueError, match=r"must all hold the same tokens, got lengths "
                                         r"\[2, 2, 0\]"):
        model(np.ones((1, 1), np.int64), kv_caches=caches[:2] + [KVCache()])


def test_the_seq2seq_decoder_names_its_layer_count():
    model = Transformer(9, 9, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2,
                        dim_feedforward=16, dropout=0.0)
    memory = model.encode(np.ones((1, 3), np.int64))
    with pytest.raises(ValueError, match=r"^Transformer.decode: kv_caches must hold one cache "
                                         r"per layer: 2 caches, got 1$"):
        model.decode(np.ones((1, 1), np.int64), memory, kv_caches=[KVCache()])


# ---- a limit message names the limit passed ------------------------------------------------

@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_classifier_names_the_max_len_it_was_given(pooling):
    # the learned table has max_len + 1 rows (room for the cls token): the message used to
    # quote that size, and mean pooling let max_len + 1 tokens through
    model = EncoderClassifier(20, 3, d_model=8, nhead=2, num_layers=1, dropout=0.0,
                              max_len=8, position="learned", pooling=pooling)
    assert model(np.ones((2, 8), np.int64)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^EncoderClassifier: 9 tokens exceed max_len=8$"):
        model(np.ones((2, 9), np.int64))


# ---- NumPy scalars wherever Python numbers are accepted ------------------------------------

reals = st.floats(1e-3, 1e3)             # float16 keeps these non-zero and finite


@settings(max_examples=30, deadline=None)
@given(reals, st.sampled_from([np.float16, np.float32, np.float64]))
def test_validate_accepts_numpy_floats_as_python_floats(value, kind):
    v = kind(value)
    assert validate.positive_real(v, "lr") == float(v)
    assert validate.real(v, "x", minimum=0.0) == float(v)
    assert isinstance(validate.nonnegative_real(v, "eps"), float)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 2 ** 31), st.sampled_from([np.int8, np.int32, np.int64, np.uint16]))
def test_validate_accepts_numpy_ints_as_python_ints(value, kind):
    v = kind(min(value, np.iinfo(kind).max))
    assert validate.positive_int(v, "n") == int(v) and type(validate.positive_int(v, "n")) is int
    assert validate.real(v, "x") == float(v)


@pytest.mark.parametrize("value", [np.bool_(True), True, np.float64("nan"), "0.1"])
def test_validate_still_refuses_bools_nan_and_strings(value):
    with pytest.raises(OptionError):
        validate.positive_real(value, "lr")


@pytest.mark.parametrize("make", [
    lambda: nn.Dropout(np.float32(0.1)),
    lambda: nn.LayerNorm(np.int64(4), eps=np.float32(1e-5)),
    lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), np.int64(2)),
    lambda: EncoderClassifier(np.int64(10), np.int64(2), d_model=np.int64(8),
                              nhead=np.int64(2), num_layers=np.int64(1),
                              dropout=np.float32(0.1)),
    lambda: nn.init.calculate_gain("leaky_relu", np.float32(0.2)),
    lambda: nn.ModuleList([nn.Linear(2, 2)])[np.int64(0)],
], ids=["Dropout", "LayerNorm", "TransformerEncoder", "EncoderClassifier", "calculate_gain",
        "ModuleList"])
def test_modules_take_numpy_scalars(make):
    make()


@pytest.mark.parametrize("call, shape", [
    (lambda x: F.sum(x, axis=np.int64(1)), (2, 4)),
    (lambda x: F.reshape(x, np.int64(24)), (24,)),
    (lambda x: F.expand_dims(x, np.int32(0)), (1, 2, 3, 4)),
    (lambda x: F.layer_norm(x, np.int64(4)), (2, 3, 4)),
    (lambda x: F.split(x, np.int64(2), axis=0)[0], (1, 3, 4)),
    (lambda x: F.pad(x, np.int64(1)), (4, 5, 6)),
])
def test_ops_take_numpy_ints_as_axes_and_shapes(call, shape):
    assert call(_x(2, 3, 4)).shape == shape


@pytest.mark.parametrize("make", [
    lambda p: minitx.optim.SGD(p, lr=np.float32(0.1), momentum=np.float32(0.9)),
    lambda p: minitx.optim.Adam(p, lr=np.float32(1e-3), betas=(np.float32(0.9), 0.999)),
    lambda p: minitx.optim.AdamW(p, lr=np.int64(1), weight_decay=np.float32(0.01)),
], ids=["SGD", "Adam", "AdamW"])
def test_optimizers_take_numpy_scalars(make):
    make(nn.Linear(2, 2).parameters())
