"""Gemma 4's text model loaded by ``minitx.pretrained.load`` against ``transformers`` (the
test-only oracle): a tiny random checkpoint built by HF's ``Gemma4ForCausalLM`` — a local
layer (a window of 4 over 11 tokens), a global one with heads of its own size (16 against 8)
and one key/value head whose values are its keys' projection, rotating "proportionally"
(half its frequencies turning); then two layers that read those two layers' keys and values
(``num_kv_shared_layers`` = 2) with MLPs twice as wide; values normalised, the scores
unscaled, each layer's output times its learned number (redrawn too), the logits capped at 3.
Every parameter redrawn (``decoder_util.randomize``), eps = 0.05 so an eps error shows.

Tolerances as ``test_pretrained_decoders.py``'s: float64 logits within 1e-5 of HF's relative
to the largest (HF computes its RMSNorms and rotary tables in float32 even in a float64 model),
float32 within 1e-4; minitx's cached decoding equals its full forward to 1e-10.
"""

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import (assert_round_trip, both_backward, hf_model, relative,  # noqa: E402
                          saved_tiny)
from minitx.attention import SharedKVCache  # noqa: E402
from minitx.models.decoder import kv_cache_bytes  # noqa: E402
from minitx.pretrained.decoders import decoder_config  # noqa: E402
from minitx.validate import OptionError  # noqa: E402

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
    num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
    use_double_wide_mlp=True, hidden_size_per_layer_input=0, sliding_window=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    final_logit_softcapping=3.0, rms_norm_eps=0.05, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                     "full_attention": {"rope_type": "proportional", "rope_theta": 500.0,
                                        "partial_rotary_factor": 0.5}})
IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
TOL = {"float64": 1e-5, "float32": 1e-4}
# HF's forward slices the tokens before its borrowing layers, a shortcut that fails without
# per-layer embeddings (it slices their absent inputs); asking for the hidden states turns the
# shortcut off and changes nothing else
WHOLE = dict(output_hidden_states=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_tiny(tmp_path_factory, transformers.Gemma4TextConfig(**CONFIG), 7, "gemma4")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_match_transformers(folder, dtype):
    model, _ = pt.load(folder, dtype=dtype, tokenizer=False)
    c = model.config
    assert (c.kv_shared_layers, c.full_head_dim, c.full_kv_heads) == (2, 16, 1)
    assert [b.attn.borrows for b in model.blocks] == [False, False, True, True]
    assert model.blocks[3].mlp.down_proj.in_features == 48           # twice as wide
    with torch.no_grad():
        ref = hf_model(folder, dtype)(torch.tensor(IDS), **WHOLE).logits.numpy()
    logits = model(IDS)
    assert logits.dtype == np.dtype(dtype) and logits.shape == ref.shape
    assert relative(logits.numpy(), ref) <= TOL[dtype]


def test_greedy_tokens_match_transformers_generate(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    prompt = IDS[:, :5]
    with torch.no_grad():
        ref = hf_model(folder).generate(torch.tensor(prompt), max_new_tokens=9,
                                        attention_mask=torch.ones(prompt.shape, dtype=int),
                                        do_sample=False, eos_token_id=None,
                                        **WHOLE).numpy()
    out = model.generate(prompt, max_new_tokens=9).numpy()
    assert np.array_equal(out, ref)


def test_cached_decoding_equals_the_full_forward_and_the_borrowers_cache_nothing(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    full = model(IDS).numpy()
    caches = model.new_caches()
    steps = [model(IDS[:, :4], kv_caches=caches).numpy()]
    steps += [model(IDS[:, i:i + 1], kv_caches=caches).numpy() for i in range(4, 11)]
    assert relative(np.concatenate(steps, axis=1), full) <= 1e-10
    assert all(isinstance(c, SharedKVCache) for c in caches[2:])
    # the local layer holds its last W − 1 = 3 tokens of 2 heads of 8, keys and values; the
    # global one all 11 tokens of one head of 16
    assert kv_cache_bytes(model.config, 11, 1) == 2 * (3 * 2 * 8 + 11 * 16)


def test_a_training_step_has_torchs_gradients(folder):
    """Every parameter's gradient as torch's, within the dense families' 1e-5; the borrowing
    layers' losses reach the first two layers' key projections."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    model.train()
    ref = hf_model(folder).train()
    hf_grads = both_backward(model, ref, IDS, **WHOLE)
    mine = dict(model.named_parameters())
    mapped = pt.decoder_state_from_hf({**hf_grads, **{
        k: b.numpy() for k, b in ref.named_buffers() if k.endswith("layer_scalar")}}, model)
    assert set(mine) <= set(mapped)
    for key in mine:
        assert relative(mine[key].grad.numpy(), mapped[key]) <= 1e-5, key


def test_state_and_config_round_trip_to_transformers(folder):
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    assert_round_trip(model, ref, "gemma4_text")


def test_a_checkpoint_with_the_borrowers_own_keys_loads_without_them(folder):
    """Google's files still carry k_proj, v_proj and k_norm in the layers that borrow; HF
    ignores them, and so does minitx."""
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    state = pt.decoder_state_to_hf(model.state_dict(), model)
    state["model.layers.2.self_attn.k_proj.weight"] = np.zeros((16, 32))
    state["model.layers.3.self_attn.k_norm.weight"] = np.zeros(16)
    again = pt.decoder_state_from_hf(state, model)
    assert set(again) == set(model.state_dict())


@pytest.mark.parametrize("changes, match", [
    (dict(hidden_size_per_layer_input=256), "hidden_size_per_layer_input=256"),
    (dict(enable_moe_block=True), "enable_moe_block=True"),
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    (dict(layer_types=["full_attention", "sliding_attention"] * 2),
     "must end with a full_attention layer"),
])
def test_what_minitx_does_not_implement_is_refused_by_name(changes, match):
    cfg = {**CONFIG, **changes, "model_type": "gemma4_text"}
    with pytest.raises(OptionError, match=match):
        decoder_config(cfg)
