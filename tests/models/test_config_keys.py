"""Real checkpoints' config.json carry keys that cannot change the forward pass: accepted
unread, by one rule (``decoders.changes_nothing``); a key that could change it is still refused,
by name. A key left out takes HF's class default (``decoders.HF_DEFAULTS``); a broken file
or a missing shard is refused with a clear error before any weight is read."""
import json

import pytest

import minitx.pretrained as pt
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


# ---- a config.json that is broken, and a shard that is not there: a clear error each ---------

def _folder(tmp_path, config):
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else
                                          json.dumps(config), "utf-8")
    return tmp_path


@pytest.mark.parametrize("config, match", [
    ("[1, 2]", "a config.json is a JSON object of keys .*got a JSON list"),
    ('{"model_type": "llama",', "not valid JSON"),
    ({k: v for k, v in LLAMA.items() if k != "hidden_size"},
     "hidden_size is missing; a llama config.json states vocab_size, hidden_size"),
    (dict(LLAMA, hidden_size="16"), "hidden_size must be a positive int, got '16'"),
    (dict(LLAMA, num_hidden_layers=0), "num_hidden_layers must be a positive int, got 0"),
])
def test_a_broken_config_json_is_refused_before_any_weight_is_read(tmp_path, config, match):
    folder = _folder(tmp_path, config)           # no weights, no tokenizer: never reached
    with pytest.raises(OptionError, match=match):
        pt.load(folder, tokenizer=False)


@pytest.mark.parametrize("index, error, match", [
    ({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}, FileNotFoundError,
     "names shard\\(s\\) model-00002-of-00002.safetensors, which the folder does not have"),
    ({"metadata": {}}, OptionError, "'weight_map' maps tensor names to shard files"),
    ([], OptionError, "'weight_map' maps tensor names to shard files"),
])
def test_an_index_that_names_what_is_not_there_says_so(tmp_path, index, error, match):
    folder = _folder(tmp_path, LLAMA)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), "utf-8")
    with pytest.raises(error, match=match):
        pt.load(folder, tokenizer=False)


def test_absent_keys_take_hfs_class_defaults():
    """The table itself is checked against transformers' configuration classes in
    tests/oracles/test_hf_defaults.py; here, that it is what a file without the keys gets."""
    sizes = {k: v for k, v in LLAMA.items() if k in ("vocab_size", "hidden_size",
                                                      "num_hidden_layers",
                                                      "num_attention_heads")}
    gemma = decoder_config({"model_type": "gemma3_text", **sizes})
    assert (gemma.head_dim, gemma.query_pre_attn_scalar, gemma.sliding_window,
            gemma.norm_eps) == (256, 256, 4096, 1e-6)
    oss = decoder_config({"model_type": "gpt_oss", **sizes, "num_key_value_heads": 2})
    assert (oss.rope["rope_type"], oss.rope["factor"], oss.rope["rope_theta"]) == \
        ("yarn", 32.0, 150000.0)
    assert (oss.sliding_window, oss.qkv_bias, oss.norm_eps) == (128, True, 1e-5)
    mixtral = decoder_config({"model_type": "mixtral", **sizes, "num_key_value_heads": 2})
    assert (mixtral.rope["rope_theta"], mixtral.norm_eps) == (1e6, 1e-5)
    # a rope key in the file replaces the whole rope default
    old = decoder_config({"model_type": "mixtral", **sizes, "num_key_value_heads": 2,
                          "rope_theta": 500.0})
    assert old.rope["rope_theta"] == 500.0
