"""TransformerLens as an optional test oracle for minitx's hook points.

A tiny random GPT-2 (2 layers, 2 heads, d_model 16, vocabulary 50) is built by
``transformers``, saved as a HuggingFace folder and loaded by ``minitx.pretrained.load``; the
same HuggingFace module is wrapped by TransformerLens 4.x (``build_bridge_from_module``, which
needs no download). Both caches of one forward are then compared: every name minitx caches
must be a TransformerLens name, with the same shape and the same values.

Both sides run in float64, so the tolerance is rounding only (1e-12 against values of order
1–10; the two compute the same sums in different orders). The one documented difference is the
value of masked scores in ``hook_attn_scores``: minitx writes −inf, TransformerLens 4.x
(HuggingFace's eager attention underneath) the dtype's minimum; both patterns are 0 there.

Today's decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 3, OLMo 2, Mixtral, Qwen3-MoE, gpt-oss)
are compared the same way, each family's tiny random model under TransformerLens's bridge.

Install (CPU torch stays as it is; every package pinned, none pulls torch or CUDA):
``pip install --no-deps transformer-lens==4.3.0 einops==0.8.2 fancy-einsum==0.0.3
jaxtyping==0.3.11 wadler-lindig==0.1.8 beartype==0.23.1 typeguard==4.6.1`` and
``pip install datasets==5.2.0 accelerate==1.15.0 pandas==3.1.1`` (TransformerLens imports
them at start-up).
"""
import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")
bridge_sources = need("transformer_lens.model_bridge.sources")

import minitx.pretrained as pt  # noqa: E402
from pretrained_util import _randomize  # noqa: E402

TOL = 1e-12                  # float64 on both sides: rounding only


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """(minitx cache, TransformerLens cache, minitx logits, TL logits) of one forward."""
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50,
                                     n_positions=32)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    _randomize(hf, torch, seed=21)          # LayerNorm gains and biases too: nothing is 1 or 0
    folder = tmp_path_factory.mktemp("tl_gpt2")
    hf.save_pretrained(folder)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    bridge = bridge_sources.build_bridge_from_module(hf.double(), "GPT2LMHeadModel",
                                                     hf_config=config)
    tokens = np.array([[1, 5, 7, 9, 3, 44, 2], [0, 49, 13, 13, 8, 21, 30]])
    logits, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        tl_logits, tl_cache = bridge.run_with_cache(torch.tensor(tokens))
    return cache, tl_cache, logits.numpy(), tl_logits.numpy()


def test_every_minitx_hook_name_is_a_transformerlens_name(caches):
    cache, tl_cache, _, _ = caches
    mine, theirs = set(cache), set(tl_cache.keys())
    assert mine <= theirs, sorted(mine - theirs)
    # the hook names of docs/look_inside.md, per block and outside the blocks
    for i in range(2):
        for name in ("hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q",
                     "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern",
                     "attn.hook_z", "hook_attn_out", "hook_resid_mid", "ln2.hook_scale",
                     "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out",
                     "hook_resid_post"):
            assert f"blocks.{i}.{name}" in mine
    assert {"hook_embed", "hook_pos_embed", "ln_final.hook_scale",
            "ln_final.hook_normalized"} <= mine


def test_shapes_and_values_match_transformerlens(caches):
    cache, tl_cache, logits, tl_logits = caches
    assert np.abs(logits - tl_logits).max() <= TOL
    for name in sorted(cache):
        ours, theirs = cache[name].numpy(), tl_cache[name].numpy()
        assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
        assert ours.dtype == theirs.dtype == np.float64, name
        if name.endswith("hook_attn_scores"):
            continue                                     # masked entries differ: next test
        assert np.abs(ours - theirs).max() <= TOL, name


def test_scores_agree_where_attention_is_allowed_and_masked_values_are_as_documented(caches):
    cache, tl_cache, _, _ = caches
    for i in range(2):
        ours = cache[f"blocks.{i}.attn.hook_attn_scores"].numpy()      # (B, H, N, N)
        theirs = tl_cache[f"blocks.{i}.attn.hook_attn_scores"].numpy()
        n = ours.shape[-1]
        allowed = np.broadcast_to(np.tril(np.ones((n, n), bool)), ours.shape)
        assert np.abs(ours[allowed] - theirs[allowed]).max() <= TOL
        assert np.all(ours[~allowed] == -np.inf)
        assert np.all(theirs[~allowed] == np.finfo(np.float64).min)
        pattern = cache[f"blocks.{i}.attn.hook_pattern"].numpy()
        assert np.all(pattern[~allowed] == 0)


# ---- today's decoders: the same names, shapes and values as TransformerLens's bridge ----------

# HF computes RMSNorm, the rotary tables and the routers in float32 even in a float64 model
# (tests/decoder_util.py), which moves its values by 1e-7–1e-6 of their size; minitx stays in
# float64. The decoder parity tests use the same bound for the same reason.
DECODER_TOL = 1e-5
# minitx's own MoE hooks, which TransformerLens has no name for
OWN = ("mlp.hook_router_logits", "mlp.hook_tokens_per_expert")


@pytest.fixture(scope="module")
def decoder_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tl_decoders")


@pytest.mark.parametrize("case", ["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "olmo2",
                                  "mixtral", "qwen3_moe", "gpt_oss"])
def test_decoder_hooks_are_transformerlens_hooks(decoder_root, case):
    """Each family's tiny random model (tests/decoder_util.py) loaded by minitx and wrapped by
    TransformerLens 4.x: every hook minitx caches, but its own router hooks, is a
    TransformerLens name with the same shape and values. Two documented layouts differ:
    masked scores (minitx −inf, TransformerLens the dtype's minimum) and
    ``hook_expert_weights`` ((B·N, k) beside the indices here, scattered into (B·N, n) there)."""
    from decoder_util import tiny_decoder
    folder = tiny_decoder(decoder_root, case)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", experts_implementation="eager").double().eval()
    bridge = bridge_sources.build_bridge_from_module(hf, type(hf).__name__, hf_config=hf.config)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    tokens = np.array([[1, 5, 7, 9, 3, 44, 2, 8, 9, 10, 11]])      # longer than any window
    logits, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        tl_logits, tl_cache = bridge.run_with_cache(torch.tensor(tokens))
    theirs = set(tl_cache.keys())
    mine = {name for name in cache if not name.endswith(OWN)}
    assert mine <= theirs, sorted(mine - theirs)
    assert any(".attn.hook_rot_q" in name for name in mine) and "hook_embed" in mine

    def close(ours, ref, name):
        assert ours.shape == ref.shape, (name, ours.shape, ref.shape)
        assert np.abs(ours - ref).max() <= DECODER_TOL * np.abs(ref).max(), name

    close(logits.numpy(), tl_logits.numpy(), "logits")
    for name in sorted(mine):
        ours, ref = cache[name].numpy(), tl_cache[name].numpy()
        if name.endswith("hook_attn_scores"):                   # compare where allowed
            allowed = np.isfinite(ours)
            assert np.all(ref[~allowed] == np.finfo(np.float64).min), name
            close(ours[allowed], ref[allowed], name)
        elif name.endswith("mlp.hook_expert_weights"):           # (T, k) against (T, n)
            indices = cache[name.replace("weights", "indices")].numpy()
            dense = np.zeros(ref.shape)
            np.put_along_axis(dense, indices, ours, axis=-1)
            close(dense, ref, name)
        else:
            close(ours, ref, name)
