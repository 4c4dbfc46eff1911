"""Each family's own options swept against ``transformers`` 5.24: biases, each rope type,
partial rotation, a window, a head dim of its own, tying either way. For each family and
option, HF builds a tiny random model with the option set (every parameter redrawn) and
saves it; minitx then either computes HF's float64 logits (within 1e-5 of the largest, HF's
float32 norms and rotary tables, as in ``test_pretrained_decoders.py``) or refuses the
config by name (an ``OptionError`` that names the key or its value). Nothing is silently
different. An option HF's own config class rejects, or its model cannot run, is not a case
(the skip says which).
"""
import copy
import json

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import MORE_SIZES, SIZES_ONLY, hf_model, randomize, relative  # noqa: E402
from minitx import validate  # noqa: E402

IDS = np.random.default_rng(2).integers(3, 97, (2, 11))
KINDS = ["llama", "mistral", "qwen2", "qwen3", "olmo2", "olmo3", "smollm3", "gemma3_text",
         "mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v32", "qwen3_next",
         "minimax", "minimax_m2", "glm4_moe", "lfm2", "qwen3_5_text", "qwen3_5_moe_text",
         "olmo_hybrid"]
ROPE = {"rope_theta": 1000.0}
OPTIONS = {
    "attention-bias": dict(attention_bias=True),
    "mlp-bias": dict(mlp_bias=True),
    "tied": dict(tie_word_embeddings=True),
    "untied": dict(tie_word_embeddings=False),
    "head-dim": dict(head_dim=16),
    "window": dict(sliding_window=4, use_sliding_window=True),
    "rope-linear": dict(rope_parameters={"rope_type": "linear", "factor": 2.0, **ROPE}),
    "rope-yarn": dict(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 16, **ROPE}),
    "rope-llama3": dict(rope_parameters={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16, **ROPE}),
    "rope-dynamic": dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, **ROPE}),
    "partial-rotary": dict(partial_rotary_factor=0.5),
}


def _named(exc, option) -> bool:
    """The refusal names one of the option's keys or values (a rope type)."""
    words = set(option)
    for value in option.values():
        words |= {str(v) for v in (value.values() if isinstance(value, dict) else [value])}
        if isinstance(value, dict):
            words |= set(value)
    return any(w in str(exc) for w in words)


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("kind", KINDS)
def test_each_option_equals_hf_or_is_refused_by_name(tmp_path, kind, name):
    option = copy.deepcopy(OPTIONS[name])      # HF's config classes edit the dicts given
    sizes = {**SIZES_ONLY, **MORE_SIZES.get(kind, {}), "max_position_embeddings": 64}
    try:
        config = transformers.AutoConfig.for_model(kind, **sizes, **option)
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        pytest.skip(f"HF's own {kind} refuses {option}: {type(exc).__name__}")
    randomize(ref, torch, seed=KINDS.index(kind))
    folder = tmp_path / kind
    ref.save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text("utf-8"))
    try:
        with torch.no_grad():
            want = hf_model(str(folder))(torch.from_numpy(IDS)).logits.numpy()
    except RuntimeError as exc:     # DeepSeek-V3 with a head_dim beside its rotary dims
        pytest.skip(f"HF's own {kind} model cannot run {option}: {str(exc)[:80]}")
    try:
        model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    except validate.OptionError as exc:
        assert _named(exc, option), (kind, name, str(exc))
        return
    err = relative(model(IDS).numpy(), want)
    assert err < 1e-5, (kind, name, err, {k: written.get(k) for k in option})
