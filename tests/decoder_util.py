"""Tiny random HuggingFace decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 3, OLMo 2, OLMo 3,
SmolLM3, DeepSeek-V3, nanochat, and the mixtures of experts Mixtral, Qwen3-MoE, gpt-oss,
DeepSeek-V3's, MiniMax-M2, GLM-4.5, Llama 4)
for the parity tests, built with ``transformers`` itself and saved with ``save_pretrained``.

Each case is a config small enough to run in a fraction of a second — 2 layers, E = 32,
4 query heads sharing 2 key/value heads, V = 97 — with what makes its family differ switched
on: a sliding window of 4 (shorter than the test's 11 tokens), local and global layers, a
head dim other than E/H, each rope scaling, biases, tied or untied embeddings. Every
parameter is redrawn at random (norm gains too, as 1 + noise, or noise for Gemma's
zero-centred ones), so no weight keeps a default 0 or 1 and a mis-mapped tensor cannot hide.
The oracle packages are test-only: callers skip with ``pytest.importorskip`` first.
"""
from __future__ import annotations

import os

# eps far above its usual 1e-6: a wrong eps, or eps in the wrong place, moves the logits by
# far more than the tests' tolerance instead of by about 1e-6.
SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=0.05)

# case name → (model_type, extra config). The rope variants ride on Llama, whose HF model
# reads every rope_type minitx implements.
CASES = {
    "llama": ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "llama-linear": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                    "rope_theta": 500.0})),
    "llama-llama3": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16, "rope_theta": 500.0})),
    "llama-yarn": ("llama", dict(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 500.0})),
    "mistral": ("mistral", dict(sliding_window=4)),
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": ("qwen3", dict(head_dim=16, rope_parameters={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8,
        "rope_theta": 1000.0})),
    "gemma3_text": ("gemma3_text", dict(
        head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=3.0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
    "olmo2": ("olmo2", dict(rms_norm_eps=0.02)),
    # OLMo 2 with a sliding layer then a full one, each with its own rope (YaRN on the full)
    "olmo3": ("olmo3", dict(sliding_window=4, layer_types=["sliding_attention",
                                                           "full_attention"],
                            rope_parameters={
                                "full_attention": {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 16,
                                                   "rope_theta": 500.0},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": 50.0}})),
    # layer 1 without rotary positions (NoPE), and sliding, as HF slides the NoPE layers
    "smollm3": ("smollm3", dict(no_rope_layer_interval=2, use_sliding_window=True,
                                sliding_window=4, rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 500.0})),
    # every layer dense (first_k_dense_replace = 2): multi-head latent attention with a q
    # latent, interleaved rotary dims and YaRN's mscale on the scale
    "deepseek_v3": ("deepseek_v3", dict(
        num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, first_k_dense_replace=2, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, n_group=2, topk_group=1,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0,
                         "original_max_position_embeddings": 16, "mscale": 0.8,
                         "mscale_all_dim": 0.9})),
    # the mixtures of experts (nn/moe.py), 4 to 8 experts of width 16, two chosen per token
    "mixtral": ("mixtral", dict(intermediate_size=16, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=4)),
    # layer 1 dense (mlp_only_layers), the top-k renormalised, a head dim of its own
    "qwen3_moe": ("qwen3_moe", dict(moe_intermediate_size=16, num_experts=4,
                                    num_experts_per_tok=2, norm_topk_prob=True, head_dim=16,
                                    mlp_only_layers=[1])),
    # sinks, sliding and full layers alternating, clamped SwiGLU experts with biases, a router
    # with a bias; YaRN without truncation
    "gpt_oss": ("gpt_oss", dict(intermediate_size=16, num_local_experts=4,
                                num_experts_per_tok=2, head_dim=8, sliding_window=4,
                                rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 16,
                                                 "rope_theta": 500.0, "truncate": False,
                                                 "beta_fast": 32.0, "beta_slow": 1.0})),
    # layer 0 dense, layer 1 an MoE: sigmoid scores, 8 experts in 4 groups of which 2 are
    # kept, the correction bias, 2 shared experts, the routed scaling factor
    "deepseek_v3-moe": ("deepseek_v3", dict(
        num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, first_k_dense_replace=1, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=16, n_group=4, topk_group=2,
        n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True)),
    # QK-norm over the projection, a quarter of each head rotated (rotary_dim 4 of 16), the
    # sigmoid router choosing by score + correction bias
    "minimax_m2": ("minimax_m2", dict(intermediate_size=16, num_local_experts=4,
                                      num_experts_per_tok=2, head_dim=16, rotary_dim=4,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 500.0})),
    # layer 0 dense, layer 1 DeepSeek-V3's experts under GQA: q, k, v biases (o none), per-head
    # QK-norm, half of each head rotated, 8 experts in 2 groups of which 1 is kept
    "glm4_moe": ("glm4_moe", dict(
        head_dim=16, attention_bias=True, use_qk_norm=True, first_k_dense_replace=1,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_group=2,
        topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                         "partial_rotary_factor": 0.5})),
    # every norm without a gain (the embeddings' too), q and k normalised after a rotation
    # that turns the other way, a squared-ReLU MLP, the logits capped at 3 so the cap shows
    "nanochat": ("nanochat", dict(final_logit_softcapping=3.0, rope_parameters={
        "rope_type": "default", "rope_theta": 500.0})),
    # layer 0 rotary, chunked (chunks of 3) and dense, its q and k normalised after the
    # rotation; layer 1 NoPE, full, its queries warmed (F = 2, α = 0.5: visible within 11
    # tokens), an MoE of 4 experts (2 chosen, σ on their inputs) beside a shared one
    "llama4_text": ("llama4_text", dict(
        intermediate_size=16, intermediate_size_mlp=48, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layer_interval=2,
        attention_chunk_size=3, floor_scale=2, attn_scale=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
}
MOE_CASES = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3-moe", "minimax_m2", "glm4_moe",
             "llama4_text")

# The sizes a config.json must state, and nothing else (test_hf_defaults.py, the sweep)
SIZES_ONLY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
# the experts' and the latents' sizes too, where a family has them: their defaults are a
# full-size model's (256 experts of width 2048, latents of 1536)
MORE_SIZES = {
    "mixtral": dict(num_local_experts=4),
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=16, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=10,
                        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                        n_routed_experts=8, moe_intermediate_size=16, num_experts_per_tok=2,
                        n_group=2, topk_group=1, first_k_dense_replace=1),
    # four layers: HF's default makes every fourth one full, and its forward needs one
    "qwen3_next": dict(num_hidden_layers=4, num_experts=4, moe_intermediate_size=16,
                       num_experts_per_tok=2,
                       shared_expert_intermediate_size=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=8),
    "minimax": dict(num_local_experts=4),
    "minimax_m2": dict(num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": dict(n_routed_experts=4, moe_intermediate_size=16, num_experts_per_tok=2),
    # its default pad id, 128004, is outside a vocabulary of 97
    "smollm3": dict(pad_token_id=0),
    # a convolution layer before the attention one: HF's default makes every layer attend
    "lfm2": dict(full_attn_idxs=[1]),
    # four layers, as Qwen3-Next's; the MoE one has no dense MLP width
    "qwen3_5_text": dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=8, linear_value_head_dim=8),
    "qwen3_5_moe_text": dict(num_hidden_layers=4, linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=8,
                             linear_value_head_dim=8, num_experts=4, moe_intermediate_size=16,
                             num_experts_per_tok=2, shared_expert_intermediate_size=16),
    # its default pad id, 100277, is outside a vocabulary of 97
    "olmo_hybrid": dict(pad_token_id=0),
}
# eight indexer heads: with two, ReLU zeroes both for many keys, and the exact ties at 0
# are broken in each library's own order by its top-k
MORE_SIZES["deepseek_v32"] = dict(MORE_SIZES["deepseek_v3"], index_n_heads=8,
                                  index_head_dim=8, index_topk=4)

_BUILT = {}


def hf_config(case):
    import transformers
    kind, extra = CASES[case]
    extra = {**SIZES, **extra}
    return transformers.AutoConfig.for_model(kind, **extra)


def randomize(model, torch, seed, scale=0.3):
    """Every parameter redrawn: gains 1 + noise (Gemma 1–3's stored g − 1: noise; Gemma 4
    stores g), the rest noise; and the buffers that weigh the forward: DeepSeek-V3's
    ``e_score_correction_bias`` (zeros by default), so that the choice of experts depends on
    it, and Gemma 4's ``layer_scalar`` (ones: 1 + noise)."""
    g = torch.Generator().manual_seed(seed)
    kind = type(model).__name__.lower()
    zero_centred = "gemma" in kind and "gemma4" not in kind
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * scale
            gain = name.endswith("norm.weight") and not zero_centred
            p.copy_(1.0 + noise if gain else noise)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g, dtype=b.dtype) * scale)
            elif name.endswith("layer_scalar"):
                b.copy_(1.0 + torch.randn(b.shape, generator=g, dtype=b.dtype) * scale)


def tiny_decoder(root, case):
    """Path of a folder holding the random tiny model of ``case`` (built once per session)."""
    if case in _BUILT:
        return _BUILT[case]
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(case))
    randomize(model, torch, seed=sorted(CASES).index(case))
    folder = os.path.join(str(root), f"tiny-{case}")
    model.save_pretrained(folder)
    _BUILT[case] = folder
    return folder


def hf_model(folder, dtype="float64"):
    """HF's model of a saved tiny checkpoint in eval mode, in float64 or float32 (its eager
    loop over experts: HF's grouped-matmul experts take no float64)."""
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(
        folder, experts_implementation="eager").eval()
    return m.double() if dtype == "float64" else m


def relative(a, b):
    """max |a − b| / max |b|: the parity tests' measure of a difference."""
    import numpy as np
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def saved_tiny(tmp_path_factory, config, seed, name):
    """Folder of a random tiny HF model of ``config`` (every parameter redrawn by
    ``randomize(seed)``), saved with ``save_pretrained``."""
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize(model, torch, seed=seed)
    path = str(tmp_path_factory.mktemp(name) / f"tiny-{name}")
    model.save_pretrained(path)
    return path


def both_backward(model, ref, ids, **hf_kwargs):
    """One next-token cross-entropy over every position of ``ids`` (B, N + 1), backward in
    minitx's ``model`` and HF's ``ref`` alike (``hf_kwargs`` go to HF's forward); returns HF's
    parameter gradients {HF name: array}, minitx's stay on its parameters."""
    import torch

    from minitx.ops.loss import cross_entropy
    from minitx.ops.shape import reshape
    out = ref(torch.tensor(ids[:, :-1]), **hf_kwargs).logits
    torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                      torch.tensor(ids[:, 1:]).reshape(-1)).backward()
    logits = model(ids[:, :-1])
    cross_entropy(reshape(logits, (-1, logits.shape[-1])), ids[:, 1:].reshape(-1)).backward()
    return {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}


def assert_round_trip(model, ref, model_type):
    """minitx's state written back is HF's state dict key for key and bit for bit; the
    config.json ``hf_config_dict`` writes names ``model_type`` and reads back to the same
    switches; ``count_parameters`` counts what both libraries hold."""
    import dataclasses

    import numpy as np

    import minitx.pretrained as pt
    from minitx.models import count_parameters
    from minitx.models.decoder import check_config
    from minitx.pretrained.decoders import decoder_config, hf_config_dict
    theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
    back = pt.decoder_state_to_hf(model.state_dict(), model)
    assert set(back) == set(theirs)
    for key, value in back.items():
        assert np.array_equal(np.asarray(value), theirs[key]), key
    d = hf_config_dict(model.config)
    assert d["model_type"] == model_type
    assert dataclasses.asdict(check_config(decoder_config(d))) == \
        dataclasses.asdict(model.config)
    assert count_parameters(model.config)["total"] == \
        sum(p.numel() for p in ref.parameters()) == sum(p.size for p in model.parameters())
