"""A misspelt option is named, with the closest real one, by every variant, block and model.

Python alone says "__init__() got an unexpected keyword argument 'nb_features'". minitx says
"PerformerAttention: unknown option 'nb_features'; did you mean 'num_features'? (options: …)"
— an ``OptionError`` (a TypeError and a ValueError), raised by one wrapper every ``Module``
subclass gets (``Module.__init_subclass__`` → ``validate.catch_unknown_options``), and by
``GPTConfig``. The wrapper must change nothing else: signatures, pickling, deep copies, a
TypeError raised inside a constructor, a missing argument, the cost of a good call."""
import copy
import dataclasses
import inspect
import pickle

import numpy as np
import pytest

import minitx
from minitx import validate
from minitx.attention import REGISTRY
from minitx.models.gpt import GPT, GPTConfig
from minitx.nn import (Linear, Module, MultiheadAttention, Transformer, TransformerDecoder,
                       TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)
from minitx.validate import OptionError
from support import assert_close, tensor


def typos(word):
    """Every one-letter slip of ``word``: a letter dropped, doubled, or two swapped."""
    out = set()
    for i in range(len(word)):
        out.add(word[:i] + word[i + 1:])
        out.add(word[:i] + word[i] + word[i:])
        if i + 1 < len(word) and word[i] != word[i + 1]:
            out.add(word[:i] + word[i + 1] + word[i] + word[i + 2:])
    return sorted(t for t in out if t and t != word)


def suggestion(message):
    """The part of an unknown-option message that suggests (before the list of options)."""
    return message.split(" (options: ")[0]


def assert_suggests(call, owner, typo, meant):
    with pytest.raises(OptionError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{owner}: unknown option {typo!r}; did you mean "), message
    assert repr(meant) in suggestion(message), message
    assert f"{meant}" in message.split(" (options: ")[1]          # and listed
    return message


# ---- every registered variant ---------------------------------------------------------------

def _own_options(cls):
    """The keywords a variant's own constructor names (its signature, read independently of
    the code under test), besides the two every variant takes positionally."""
    return [p.name for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("embed_dim", "num_heads")]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_variant_suggests_each_of_its_options_for_every_one_letter_slip(name):
    cls = REGISTRY[name]
    options = _own_options(cls)
    assert options, name
    for option in options:
        for typo in typos(option):
            if typo in options:                  # a slip that spells another real option
                continue
            assert_suggests(lambda: cls(8, 2, **{typo: 1}), cls.__name__, typo, option)


def _takes_kwargs(cls):
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())


@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if _takes_kwargs(c)))
def test_a_variant_passing_options_to_its_base_suggests_the_bases_options_too(name):
    """``bias`` and ``num_kv_heads`` belong to the base class (``AttentionBase`` or the exact
    family's); a variant taking ``**base`` must still suggest them."""
    cls = REGISTRY[name]
    assert "bias" not in _own_options(cls)
    message = assert_suggests(lambda: cls(8, 2, baias=False), cls.__name__, "baias", "bias")
    assert "embed_dim" in message and "causal" in message


def test_performer_nb_features_suggests_num_features():
    assert_suggests(lambda: REGISTRY["performer"](16, 2, nb_features=8),
                    "PerformerAttention", "nb_features", "num_features")
    assert REGISTRY["performer"](16, 2, num_features=8).num_features == 8   # the right one works


# ---- blocks and models: their own options, and a variant's options passed through ---------

@pytest.mark.parametrize("make,owner,typo,meant", [
    (lambda **kw: Linear(3, 2, **kw), "Linear", "baias", "bias"),
    (lambda **kw: MultiheadAttention(8, 2, **kw), "MultiheadAttention", "batchfirst",
     "batch_first"),
    (lambda **kw: MultiheadAttention(8, 2, **kw), "MultiheadAttention", "num_kv_head",
     "num_kv_heads"),
    (lambda **kw: TransformerEncoderLayer(8, 2, **kw), "TransformerEncoderLayer",
     "dim_feedfoward", "dim_feedforward"),
    (lambda **kw: TransformerDecoderLayer(8, 2, **kw), "TransformerDecoderLayer",
     "attention_option", "attention_options"),
    (lambda **kw: TransformerEncoder(TransformerEncoderLayer(8, 2, 8), 1, **kw),
     "TransformerEncoder", "nrom", "norm"),
    (lambda **kw: TransformerDecoder(TransformerDecoderLayer(8, 2, 8), 1, **kw),
     "TransformerDecoder", "num_layer", "num_layers"),
    (lambda **kw: Transformer(5, 5, d_model=8, nhead=2, **kw), "Transformer",
     "num_encoder_layer", "num_encoder_layers"),
    (lambda **kw: GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8),
                      **kw), "GPT", "confg", "config"),
])
def test_blocks_and_models_name_their_own_misspelt_options(make, owner, typo, meant):
    assert_suggests(lambda: make(**{typo: 1}), owner, typo, meant)


@pytest.mark.parametrize("layer", [TransformerEncoderLayer, TransformerDecoderLayer])
def test_a_blocks_attention_options_are_checked_by_the_variant_it_builds(layer):
    message = assert_suggests(
        lambda: layer(16, 2, dim_feedforward=8, attention="performer",
                      attention_options={"nb_features": 8}),
        "PerformerAttention", "nb_features", "num_features")
    assert "orthogonal" in message                           # the variant's options listed


def test_gpts_attention_options_are_checked_by_the_variant_it_builds():
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16,
                       attention="performer", attention_options={"nb_features": 8})
    assert_suggests(lambda: GPT(config), "PerformerAttention", "nb_features", "num_features")


def test_gptconfig_names_a_misspelt_field():
    assert_suggests(lambda: GPTConfig(n_heads=4), "GPTConfig", "n_heads", "n_head")
    assert_suggests(lambda: GPTConfig(n_embed=64), "GPTConfig", "n_embed", "n_embd")
    config = GPTConfig(n_head=2, n_embd=8)                      # the dataclass still works
    assert (config.n_head, config.n_embd) == (2, 8)
    assert dataclasses.replace(config, n_layer=1).n_layer == 1
    with pytest.raises(OptionError, match="GPTConfig: unknown option 'n_layers'"):
        dataclasses.replace(config, n_layers=1)
    assert [f.name for f in dataclasses.fields(GPTConfig)] == \
        list(inspect.signature(GPTConfig).parameters)
    assert pickle.loads(pickle.dumps(config)) == config


# ---- what the wrapper must not change ------------------------------------------------------

def test_it_is_still_a_type_error_and_a_value_error():
    for kind in (TypeError, ValueError):
        with pytest.raises(kind):
            Linear(3, 2, baias=False)


def test_a_missing_argument_keeps_pythons_words():
    with pytest.raises(TypeError, match="missing 1 required positional argument") as info:
        Linear(3)
    assert not isinstance(info.value, OptionError)


def test_a_type_error_raised_inside_a_constructor_passes_unchanged():
    raised = TypeError("the body's own complaint")

    class Picky(Module):
        def __init__(self, width: int = 1):
            super().__init__()
            raise raised

    with pytest.raises(TypeError) as info:
        Picky(width=2)                                          # keywords that bind fine
    assert info.value is raised

    class Outer(Module):
        def __init__(self, width: int = 1):
            super().__init__()
            self.inner = Linear(width, width, baias=True)       # the library's own slip

    with pytest.raises(OptionError, match="^Linear: unknown option 'baias'"):
        Outer(width=2)                                          # named by Linear, not Outer


def test_a_user_subclass_forwarding_keywords_to_its_base_is_checked_at_the_base():
    class Block(Module):
        def __init__(self, width, **kw):
            super().__init__(**kw)
            self.width = width

    assert_suggests(lambda: Block(2, widht=3), "Block", "widht", "width")
    assert Block(2).width == 2

    class Wider(Linear):                                        # no __init__ of its own
        pass

    assert_suggests(lambda: Wider(3, 2, baias=False), "Wider", "baias", "bias")
    assert Wider.__init__ is Linear.__init__                    # wrapped once, not again
    assert validate.catch_unknown_options(Linear.__init__) is Linear.__init__


def test_signatures_names_and_source_are_the_constructors_own():
    assert list(inspect.signature(Linear).parameters) == \
        ["in_features", "out_features", "bias", "device", "dtype"]
    assert Linear.__init__.__qualname__ == "Linear.__init__"
    assert inspect.getsource(Linear.__init__).lstrip().startswith("def __init__(self, in_feat")
    from minitx.tour import _init_options                      # the tour reads signatures
    assert _init_options(REGISTRY["linformer"], 40) == {"max_len": 40}


def test_a_good_call_never_reads_a_signature(monkeypatch):
    """The check costs a good call nothing: the signature is read only after a failure."""
    def refuse(*args, **kwargs):
        raise AssertionError("inspect.signature read on a good call")

    monkeypatch.setattr(validate.inspect, "signature", refuse)
    Linear(3, 2, bias=False)
    REGISTRY["performer"](8, 2, num_features=4)
    MultiheadAttention(8, 2, batch_first=True)


def test_modules_still_deep_copy_and_pickle():
    minitx.manual_seed(0)
    layer = TransformerEncoderLayer(8, 2, dim_feedforward=8, dropout=0.0, batch_first=True)
    layer = layer.double()
    x = tensor(np.random.default_rng(0).standard_normal((1, 3, 8)))
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(clone) is TransformerEncoderLayer
        assert_close(clone(x), layer(x))
        assert clone.linear1.weight is not layer.linear1.weight
