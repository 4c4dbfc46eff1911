"""A config.json that holds only the sizes, loaded by minitx and by ``transformers``: every key
left out takes HF's configuration class's default (``decoders.HF_DEFAULTS``), so the two
models compute the same logits. HF's own ``save_pretrained`` writes every key; configs from
other writers do not, and before the table a missing key took minitx's own default (Gemma 3's
``query_pre_attn_scalar``, Mixtral's and gpt-oss's rope, OLMo 2's and Mixtral's eps, gpt-oss's
biases). Also: a ``mistral`` config.json with ``layer_types``, which HF's ``AutoConfig`` runs
as Ministral (each layer slides or not as the list says), and Gemma 3's nested YaRN
``truncate``, which HF does not read.

Tolerance: float64 logits within 1e-5 of HF's relative to the largest, as in
``test_pretrained_decoders.py`` (HF's float32 norms and rotary tables); an eps of 1e-5 against
1e-6 moves them by 2e-5 to 4e-5, a wrong rope or scale by far more.
"""
import json

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import MORE_SIZES, hf_model, randomize, relative  # noqa: E402
from decoder_util import SIZES_ONLY as SIZES  # noqa: E402
from minitx.pretrained.decoders import HF_DEFAULTS  # noqa: E402

IDS = np.random.default_rng(1).integers(3, 97, (2, 11))
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma3_text", "mixtral",
            "qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v32", "qwen3_next", "minimax",
            "olmo3", "smollm3", "minimax_m2", "glm4_moe", "lfm2", "qwen3_5_text",
            "qwen3_5_moe_text", "olmo_hybrid"]


@pytest.mark.parametrize("kind", sorted(HF_DEFAULTS))
def test_the_table_is_hfs_class_defaults(kind):
    """Each entry of HF_DEFAULTS equals the attribute of HF's config class built with no
    arguments (transformers 5.24.0)."""
    hf = transformers.AutoConfig.for_model(kind)
    for key, value in HF_DEFAULTS[kind].items():
        theirs = _hf_default(hf, kind, key)
        assert theirs == value, (kind, key, theirs, value)


def _hf_default(hf, kind, key):
    """HF's class default of ``key``. Gemma 4 keeps its head sizes per layer
    (``per_layer_config``, and refuses the global attribute): the local layers' is
    ``head_dim``, a global layer's ``global_head_dim``."""
    if kind == "gemma4_text" and key in ("head_dim", "global_head_dim"):
        kind_of_layer = "full_attention" if key == "global_head_dim" else "sliding_attention"
        return hf.per_layer_config[hf.layer_types.index(kind_of_layer)].head_dim
    return getattr(hf, key)


def _sizes_only(tmp_path, kind, extra=None):
    """(folder, HF's float64 model): a random tiny model of ``kind`` built by HF from the
    sizes alone (HF fills the rest from its class), saved, its config.json then cut back to
    ``model_type`` and the sizes (plus ``extra``)."""
    sizes = {**SIZES, **MORE_SIZES.get(kind, {})}
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(kind, **sizes, **(extra or {}))
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize(model, torch, seed=FAMILIES.index(kind) if kind in FAMILIES else 0)
    folder = tmp_path / kind
    model.save_pretrained(folder)
    hf = hf_model(str(folder))                   # read back from the full config HF wrote
    (folder / "config.json").write_text(json.dumps({"model_type": kind, **sizes,
                                                    **(extra or {})}), "utf-8")
    return folder, hf


def _logits(hf, ids):
    with torch.no_grad():
        return hf(torch.from_numpy(ids)).logits.numpy()


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_config_of_sizes_only_gives_hfs_logits(tmp_path, kind):
    folder, hf = _sizes_only(tmp_path, kind)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    want = _logits(hf, IDS)
    got = model(IDS).numpy()
    assert relative(got, want) < 1e-5, (kind, relative(got, want))


def test_mistral_with_layer_types_runs_as_hf_runs_it(tmp_path):
    """HF's AutoConfig reads a mistral config.json with layer_types as Ministral's: layer 0 full
    here, layer 1 sliding (a window of 4 over 11 tokens), where plain Mistral slides both."""
    types = ["full_attention", "sliding_attention"]
    folder, mistral = _sizes_only(tmp_path, "mistral", {"sliding_window": 4})
    cfg = json.loads((folder / "config.json").read_text("utf-8"))
    # rope_theta and head_dim written out: HF's Ministral, read this way, derives neither
    (folder / "config.json").write_text(json.dumps({**cfg, "layer_types": types, "head_dim": 8,
                                                    "rope_theta": 10000.0}), "utf-8")
    hf = hf_model(str(folder))
    assert type(hf).__name__ == "MinistralForCausalLM"
    want = _logits(hf, IDS)
    assert relative(_logits(mistral, IDS), want) > 1e-2      # the two readings differ
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    assert model.config.layer_types == ("full", "sliding")
    assert relative(model(IDS).numpy(), want) < 1e-5


def test_gemma3s_nested_yarn_truncates_whatever_it_says_as_in_hf(tmp_path):
    """HF reads YaRN's ``truncate`` from the outer rope_parameters, which for Gemma 3 holds
    only the layer types: a nested ``truncate: false`` is not applied, there or here."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "rope_theta": 1000.0, "truncate": False}
    extra = {"head_dim": 16, "sliding_window": 4, "max_position_embeddings": 64,
             "layer_types": ["sliding_attention", "full_attention"],
             "rope_parameters": {"full_attention": yarn,
                                 "sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 50.0}}}
    folder, hf = _sizes_only(tmp_path, "gemma3_text", extra)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    assert model.config.rope["truncate"] is True
    assert relative(model(IDS).numpy(), _logits(hf, IDS)) < 1e-5


def test_olmo3s_flat_rope_theta_reaches_the_full_layers_only_as_in_hf(tmp_path):
    """An older OLMo 3 config.json with a flat ``rope_theta``: HF's conversion gives it to the
    full layers, and the sliding layers keep the class's θ = 500,000 (a window of 4 over 11
    tokens, so the sliding layer's rotation shows in the logits)."""
    extra = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
    folder, _ = _sizes_only(tmp_path, "olmo3", extra)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "olmo3", **SIZES, **extra, "rope_theta": 100.0}), "utf-8")
    hf = hf_model(str(folder))
    assert hf.config.rope_parameters["sliding_attention"]["rope_theta"] == 500000.0
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    assert model.config.rope["rope_theta"] == 100.0
    assert model.config.local_rope["rope_theta"] == 500000.0
    assert relative(model(IDS).numpy(), _logits(hf, IDS)) < 1e-5


@pytest.mark.parametrize("extra", [
    {"no_rope_layer_interval": 2},                                      # layer 1 NoPE
    {"no_rope_layers": [0, 1]},                                         # layer 0 NoPE
    {"no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": 4},
    {"use_sliding_window": True, "sliding_window": 4,                   # layer_types win
     "layer_types": ["sliding_attention", "full_attention"]},
], ids=["interval", "list", "nope-slides", "layer-types"])
def test_smollm3s_nope_and_window_keys_give_hfs_logits(tmp_path, extra):
    """SmolLM3's NoPE layers (``no_rope_layers`` or its interval) and its window, each way
    HF's config reads them."""
    folder, hf = _sizes_only(tmp_path, "smollm3", extra)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    assert relative(model(IDS).numpy(), _logits(hf, IDS)) < 1e-5
