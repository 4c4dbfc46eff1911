"""Real checkpoints' config.json carry keys that cannot change the forward pass: accepted
unread, by one rule (``decoders.changes_nothing``); a key that could change it is still refused,
by name."""
import pytest

from minitx.pretrained.decoders import IGNORED, changes_nothing, decoder_config
from minitx.validate import OptionError

LLAMA = {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64}


@pytest.mark.parametrize("key, value", [
    ("_model_name_or_path", "meta-llama/x"), ("_name_or_path", "x"),
    ("_attn_implementation_autoset", True), ("unk_token_id", 0), ("bos_token_id", 1),
    ("eos_token_id", [2, 3]), ("sep_token_id", 4), ("decoder_start_token_id", 0),
    ("suppress_token_ids", [5]), ("transformers_version", "5.24.0"), ("dtype", "bfloat16"),
    ("torch_dtype", "float16"), ("use_cache", False), ("id2label", {"0": "A"}),
])
def test_keys_that_cannot_change_the_forward_are_accepted(key, value):
    assert changes_nothing(key)
    plain = decoder_config(dict(LLAMA))
    assert decoder_config(dict(LLAMA, **{key: value})) == plain


@pytest.mark.parametrize("key", ["rope_dimension_scale", "attention_multiplier",
                                 "hidden_act_scale", "token_id_scale", "logit_scale"])
def test_a_key_that_could_change_it_is_refused_by_name(key):
    assert not changes_nothing(key)
    with pytest.raises(OptionError, match=f"'{key}'"):
        decoder_config(dict(LLAMA, **{key: 1.0}))


def test_the_rule_is_stated_in_one_set_and_one_function():
    assert "use_cache" in IGNORED and "transformers_version" in IGNORED
    assert not any(k.startswith("_") or k.endswith("_token_id") for k in IGNORED)
