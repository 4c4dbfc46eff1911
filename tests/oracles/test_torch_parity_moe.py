"""minitx.nn.MoE against HuggingFace transformers' own MoE blocks, in float64.

For each family HF's block is built from a tiny config (``MixtralSparseMoeBlock``,
``Qwen3MoeSparseMoeBlock`` with and without ``norm_topk_prob``, ``Qwen2MoeSparseMoeBlock`` with
its sigmoid-gated shared expert, ``GptOssMLP``, ``DeepseekV3MoE`` with groups, shared experts and
the scaling factor), every parameter and buffer (DeepSeek-V3's correction bias included) is
redrawn at random, the weights are copied into minitx under the name map of ``docs/moe.md``,
and the two are compared:

- **the experts and the dispatch, exactly**: HF's experts module given minitx's routing
  against minitx's, outputs and every gradient within 1e-10 relative (float64 round-off);
- **the router**: the same choices; logits and weights within float64 round-off where HF
  computes in the model's dtype (gpt-oss; the Mixtral/Qwen logits), within float32's where HF
  computes in float32 (Mixtral's and Qwen's softmax, all of DeepSeek-V3's router);
- **the whole block, exactly**: HF's experts (and shared expert) after a float64 transcription
  of HF's router, written here from HF's code — the transcription itself equals HF's router to
  float32 precision; outputs, input gradients and parameter gradients within 1e-10;
- **the whole HF block as it runs**: within 1e-10 for gpt-oss, and within the float32 rounding
  of the router weights (relative 1e-6) for the others;
- **the load-balancing loss** against HF's ``load_balancing_loss_func``, which accumulates in
  float32 (relative 1e-6), with several layers and with an attention mask;
- **the checkpoint files**: a one-layer HF model of each family saved with ``save_pretrained``
  loads into minitx's block by docs/moe.md's map of the files' names, every tensor used once.
"""
import numpy as np
import pytest

import minitx
import minitx.nn as nn
from support import tensor, to_host, need

torch = need("torch")
transformers = need("transformers")

EXACT = 1e-10
FLOAT32_ROUTER = 1e-6      # HF rounds the router's weights to float32 (2^-24 ≈ 6e-8 each)
E, I, T_SHAPE = 8, 6, (2, 5)


def hf_block(family):
    """HF's MoE block for ``family``, float64, every parameter and buffer redrawn."""
    f = family.split(":")[0]
    if f == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
        cfg = transformers.MixtralConfig(hidden_size=E, intermediate_size=I,
                                         num_local_experts=4, num_experts_per_tok=2)
    elif f == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import \
            Qwen3MoeSparseMoeBlock as Block
        cfg = transformers.Qwen3MoeConfig(hidden_size=E, moe_intermediate_size=I, num_experts=4,
                                          num_experts_per_tok=2,
                                          norm_topk_prob=family.endswith("norm"))
    elif f == "qwen2_moe":
        from transformers.models.qwen2_moe.modeling_qwen2_moe import \
            Qwen2MoeSparseMoeBlock as Block
        cfg = transformers.Qwen2MoeConfig(hidden_size=E, moe_intermediate_size=I, num_experts=4,
                                          num_experts_per_tok=2, norm_topk_prob=False,
                                          shared_expert_intermediate_size=10)
    elif f == "gpt_oss":
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP as Block
        cfg = transformers.GptOssConfig(hidden_size=E, intermediate_size=I,
                                        num_local_experts=4, num_experts_per_tok=2)
    else:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as Block
        cfg = transformers.DeepseekV3Config(hidden_size=E, moe_intermediate_size=I,
                                            n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                            topk_group=2, n_shared_experts=2,
                                            routed_scaling_factor=2.5, norm_topk_prob=True)
    cfg._experts_implementation = "eager"         # set by from_pretrained; a bare block needs it
    block = Block(cfg).double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in [*block.named_parameters(), *block.named_buffers()]:
            scale = 0.3 if "correction_bias" in name else 1.0
            t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * scale)
    return block, cfg


def minitx_block(family):
    f = family.split(":")[0]
    opts = {"mixtral": {}, "qwen3_moe": {"norm_topk_prob": family.endswith("norm")},
            "qwen2_moe": dict(norm_topk_prob=False, shared_intermediate_size=10,
                              shared_expert_gate=True),
            "gpt_oss": dict(router="topk_softmax", router_bias=True, expert="clamped_swiglu",
                            expert_bias=True),
            "deepseek_v3": dict(router="sigmoid_grouped", n_group=4, topk_group=2,
                                routed_scaling_factor=2.5, n_shared_experts=2)}[f]
    return nn.MoE(E, I, 8 if f == "deepseek_v3" else 4, 2, dtype="float64", **opts)


def hf_to_minitx(state, family):
    """HF's in-memory names (transformers 5) → minitx's, as ``docs/moe.md`` tabulates."""
    gpt_oss = family == "gpt_oss"
    out = {}
    for name, v in state.items():
        v = v.detach().numpy() if hasattr(v, "detach") else v
        if name in ("gate.weight", "router.weight"):
            out["router.weight"] = v
        elif name in ("router.bias", "gate.e_score_correction_bias"):
            out["router." + name.split(".", 1)[1]] = v
        elif name == "experts.gate_up_proj" and gpt_oss:
            out["experts.gate_proj"] = v[:, :, 0::2].transpose(0, 2, 1)     # (n, E, 2I),
            # gate and up interleaved on the last axis
            out["experts.up_proj"] = v[:, :, 1::2].transpose(0, 2, 1)
        elif name == "experts.gate_up_proj_bias":
            out["experts.gate_proj_bias"], out["experts.up_proj_bias"] = v[:, 0::2], v[:, 1::2]
        elif name == "experts.gate_up_proj":                    # (n, 2I, E): gate rows, up rows
            out["experts.gate_proj"], out["experts.up_proj"] = v[:, :I], v[:, I:]
        elif name == "experts.down_proj" and gpt_oss:
            out["experts.down_proj"] = v.transpose(0, 2, 1)     # gpt-oss: (n, I, E)
        elif name.startswith("shared_experts."):
            out["shared_expert." + name.split(".", 1)[1]] = v
        else:
            out[name] = v                  # experts.down_proj(_bias), shared_expert(_gate).*
    return out


def load(moe, state, family):
    mapped = hf_to_minitx(state, family)
    names = [n for n, _ in [*moe.named_parameters(), *moe.named_buffers()]]
    assert sorted(names) == sorted(mapped)
    for name, t in [*moe.named_parameters(), *moe.named_buffers()]:
        assert tuple(t.shape) == mapped[name].shape, name
        t.copy_(np.ascontiguousarray(mapped[name]))


def rel(a, b):
    a, b = np.asarray(to_host(a)), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / np.abs(b).max())


def grads_of(moe):
    return {n: to_host(p.grad) for n, p in moe.named_parameters()}


def torch_grads(block, family):
    return hf_to_minitx({n: p.grad for n, p in block.named_parameters()}, family)


def pair(family):
    block, cfg = hf_block(family)
    moe = minitx_block(family)
    load(moe, {**dict(block.named_parameters()), **dict(block.named_buffers())},
         family.split(":")[0])
    x = np.random.default_rng(1).standard_normal((*T_SHAPE, E))
    return block, cfg, moe, x


def hf_gate(block):
    return block.router if hasattr(block, "router") else block.gate


def sort_rows(indices, weights):
    order = np.argsort(indices, axis=1)
    return np.take_along_axis(indices, order, 1), np.take_along_axis(weights, order, 1)


FAMILIES = ["mixtral", "qwen3_moe", "qwen3_moe:norm", "qwen2_moe", "gpt_oss", "deepseek_v3"]


# ---- the experts and the dispatch, exactly ------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_experts_equal_hf_experts_given_the_same_routing(family):
    block, _, moe, x = pair(family)
    h = x.reshape(-1, E)
    weights, indices = moe.router.route(moe.router(tensor(h)))
    w_np, i_np = to_host(weights), to_host(indices)
    ht = torch.tensor(h, requires_grad=True)
    wt = torch.tensor(w_np, requires_grad=True)
    theirs = block.experts(ht, torch.tensor(i_np), wt)
    hm, wm = tensor(h, requires_grad=True), tensor(w_np, requires_grad=True)
    mine = moe.experts(hm, indices, wm)
    assert rel(mine, theirs.detach().numpy()) <= EXACT
    r = np.random.default_rng(2).standard_normal(theirs.shape)
    (theirs * torch.tensor(r)).sum().backward()
    (mine * tensor(r)).sum().backward()
    assert rel(hm.grad, ht.grad.numpy()) <= EXACT
    assert rel(wm.grad, wt.grad.numpy()) <= EXACT
    want = torch_grads(block, family.split(":")[0])
    for name, g in grads_of(moe.experts).items():
        assert rel(g, want["experts." + name]) <= EXACT, name


@pytest.mark.parametrize("family", ["gpt_oss"])
def test_the_clamp_bites_in_the_parity_case(family):
    """The redrawn gpt-oss weights put some gate / up pre-activations beyond ±7, so the
    parity above covers the clamped branch and its zero gradient."""
    block, cfg, moe, x = pair(family)
    h = torch.tensor(x.reshape(-1, E))
    pre = h @ block.experts.gate_up_proj + block.experts.gate_up_proj_bias[:, None, :]
    assert (pre.abs() > cfg.swiglu_limit).any()


# ---- the router -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_router_chooses_as_hf(family):
    block, _, moe, x = pair(family)
    h = x.reshape(-1, E)
    out = hf_gate(block)(torch.tensor(h))
    if len(out) == 3:
        logits, w_hf, i_hf = out
    else:
        pytest.fail(f"unexpected router output of length {len(out)}")
    lg = moe.router(tensor(h))
    w, i = moe.router.route(lg)
    float32 = family.startswith("deepseek")                  # HF's whole router in float32
    assert rel(lg, logits.detach().double().numpy()) <= (FLOAT32_ROUTER if float32 else EXACT)
    i_hf, w_hf = sort_rows(i_hf.numpy(), w_hf.detach().double().numpy())
    i_mine, w_mine = sort_rows(to_host(i), to_host(w))
    np.testing.assert_array_equal(i_mine, i_hf)
    exact = family == "gpt_oss"
    assert rel(w_mine, w_hf) <= (EXACT if exact else FLOAT32_ROUTER)


def test_deepseek_correction_bias_changes_the_choice_in_the_parity_case():
    """The redrawn correction bias matters: without it some token chooses differently (so the
    parity above tests that the bias chooses and does not weigh)."""
    _, _, moe, x = pair("deepseek_v3")
    h = tensor(x.reshape(-1, E))
    lg = moe.router(h)
    _, with_bias = moe.router.route(lg)
    _, without = nn.sigmoid_grouped_topk(lg, 2, np.zeros(8), n_group=4, topk_group=2)
    assert (np.sort(to_host(with_bias), 1) != np.sort(to_host(without), 1)).any()


# ---- the whole block, exactly: HF's experts after a float64 transcription of HF's router ---

def transcribed_router(block, family, h):
    """HF's router for ``family``, written again in torch in float64 (HF casts to float32)."""
    gate = hf_gate(block)
    logits = torch.nn.functional.linear(h, gate.weight, getattr(gate, "bias", None))
    k = gate.top_k
    if family == "gpt_oss":
        top, idx = torch.topk(logits, k, dim=-1)
        return torch.softmax(top, dim=-1), idx
    if family.startswith("deepseek"):
        s = logits.sigmoid()
        c = s + gate.e_score_correction_bias
        groups = c.view(-1, gate.num_group, gate.num_experts // gate.num_group)
        best = torch.topk(groups.topk(2, dim=-1)[0].sum(-1), gate.topk_group, dim=-1)[1]
        keep = torch.zeros(groups.shape[:2], dtype=torch.bool).scatter_(1, best, True)
        c = c.masked_fill(~keep.repeat_interleave(groups.shape[-1], dim=1), float("-inf"))
        idx = torch.topk(c, k, dim=-1)[1]
        w = s.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) if gate.norm_topk_prob else w
        return w * gate.routed_scaling_factor, idx
    p = torch.softmax(logits, dim=-1)
    w, idx = torch.topk(p, k, dim=-1)
    if getattr(gate, "norm_topk_prob", True):            # Mixtral always renormalises
        w = w / w.sum(-1, keepdim=True)
    return w, idx


def transcribed_block(block, family, x):
    b, n, e = x.shape
    h = x.reshape(-1, e)
    w, idx = transcribed_router(block, family, h)
    y = block.experts(h, idx, w)
    if hasattr(block, "shared_experts"):
        y = y + block.shared_experts(h)
    if hasattr(block, "shared_expert"):
        y = y + torch.sigmoid(block.shared_expert_gate(h)) * block.shared_expert(h)
    return y.reshape(b, n, e)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_transcribed_router_is_hfs(family):
    block, _, _, x = pair(family)
    h = torch.tensor(x.reshape(-1, E))
    w, idx = transcribed_router(block, family, h)
    _, w_hf, i_hf = hf_gate(block)(h)
    i_hf, w_hf = sort_rows(i_hf.numpy(), w_hf.detach().double().numpy())
    i_t, w_t = sort_rows(idx.numpy(), w.detach().numpy())
    np.testing.assert_array_equal(i_t, i_hf)
    assert rel(w_t, w_hf) <= (EXACT if family == "gpt_oss" else FLOAT32_ROUTER)


@pytest.mark.parametrize("family", FAMILIES)
def test_block_equals_hf_experts_after_the_float64_router(family):
    block, _, moe, x = pair(family)
    xt = torch.tensor(x, requires_grad=True)
    theirs = transcribed_block(block, family, xt)
    xm = tensor(x, requires_grad=True)
    mine = moe(xm)
    assert rel(mine, theirs.detach().numpy()) <= EXACT
    r = np.random.default_rng(3).standard_normal(x.shape)
    (theirs * torch.tensor(r)).sum().backward()
    (mine * tensor(r)).sum().backward()
    assert rel(xm.grad, xt.grad.numpy()) <= EXACT
    want = torch_grads(block, family.split(":")[0])
    for name, g in grads_of(moe).items():
        assert rel(g, want[name]) <= EXACT, name


# ---- the HF block as it runs --------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_block_equals_the_hf_block(family):
    block, _, moe, x = pair(family)
    out = block(torch.tensor(x))
    theirs = (out[0] if isinstance(out, tuple) else out).detach().numpy()
    tol = EXACT if family == "gpt_oss" else FLOAT32_ROUTER
    assert rel(moe(tensor(x)), theirs) <= tol


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_the_hf_blocks(family):
    """Input and parameter gradients through HF's block as it runs: float64 round-off for
    gpt-oss; for the others the router's backward runs in float32 too, so its gradients carry
    float32 rounding amplified by the softmax's Jacobian (measured up to 1.1e-6 relative, for
    Qwen2-MoE's; the bound 1e-5 leaves a factor of ten)."""
    block, _, moe, x = pair(family)
    xt = torch.tensor(x, requires_grad=True)
    out = block(xt)
    theirs = out[0] if isinstance(out, tuple) else out
    xm = tensor(x, requires_grad=True)
    mine = moe(xm)
    r = np.random.default_rng(3).standard_normal(x.shape)
    (theirs * torch.tensor(r)).sum().backward()
    (mine * tensor(r)).sum().backward()
    tol = EXACT if family == "gpt_oss" else 1e-5
    assert rel(xm.grad, xt.grad.numpy()) <= tol
    want = torch_grads(block, family.split(":")[0])
    for name, g in grads_of(moe).items():
        assert rel(g, want[name]) <= tol, name


# ---- the load-balancing loss ----------------------------------------------------------------

@pytest.mark.parametrize("layers,masked", [(1, False), (3, False), (2, True)])
def test_load_balancing_loss_equals_hf(layers, masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    rng = np.random.default_rng(4)
    logits = [rng.standard_normal((2 * 7, 8)) for _ in range(layers)]
    mask = (rng.random((2, 7)) > 0.3).astype(np.int64) if masked else None
    theirs = load_balancing_loss_func(tuple(torch.tensor(lg) for lg in logits), 8, 2,
                                      None if mask is None else torch.tensor(mask))
    mine = nn.load_balancing_loss([tensor(lg) for lg in logits], 8, 2, attention_mask=mask)
    # HF sums the counts and probabilities in float32
    assert rel(mine, theirs.double().numpy()) <= FLOAT32_ROUTER


def test_load_balancing_loss_of_a_model_output():
    """The loss from the logits a forward keeps (``MoE.router_logits``), as HF computes it from
    its router's logits."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    block, _, moe, x = pair("mixtral")
    moe(tensor(x))
    logits, _, _ = hf_gate(block)(torch.tensor(x.reshape(-1, E)))
    theirs = load_balancing_loss_func((logits,), 4, 2)
    assert rel(nn.load_balancing_loss(moe.router_logits, 4, 2), theirs.detach().double().numpy()) \
        <= FLOAT32_ROUTER


# ---- the checkpoint files' names (what save_pretrained writes), as docs/moe.md maps them ------

def tiny_model(family):
    """A one-layer HF model of ``family`` whose layer 0 is an MoE layer, float64, redrawn."""
    common = dict(vocab_size=32, hidden_size=E, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
    if family == "mixtral":
        cfg, cls = transformers.MixtralConfig(intermediate_size=I, num_local_experts=4,
                                              **common), transformers.MixtralForCausalLM
    elif family == "qwen3_moe":
        cfg, cls = transformers.Qwen3MoeConfig(moe_intermediate_size=I, num_experts=4,
                                               num_experts_per_tok=2, head_dim=4, **common), \
            transformers.Qwen3MoeForCausalLM
    elif family == "qwen2_moe":
        cfg, cls = transformers.Qwen2MoeConfig(moe_intermediate_size=I, num_experts=4,
                                               num_experts_per_tok=2,
                                               shared_expert_intermediate_size=10, **common), \
            transformers.Qwen2MoeForCausalLM
    elif family == "gpt_oss":
        cfg, cls = transformers.GptOssConfig(intermediate_size=I, num_local_experts=4,
                                             num_experts_per_tok=2, head_dim=4, **common), \
            transformers.GptOssForCausalLM
    else:
        cfg, cls = transformers.DeepseekV3Config(
            moe_intermediate_size=I, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
            topk_group=2, n_shared_experts=2, first_k_dense_replace=0, q_lora_rank=None,
            kv_lora_rank=4, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=4,
            **common), transformers.DeepseekV3ForCausalLM
    cfg._experts_implementation = "eager"     # the loop over experts, which runs in float64
    model = cls(cfg).double()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.dtype == torch.float64:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype)
                        * (0.3 if "correction_bias" in name else 1.0))
    return model


def from_checkpoint(files, prefix, family):
    """minitx's MoE state from the checkpoint tensors under ``prefix``, docs/moe.md's map:
    per-expert matrices stacked (Mixtral's w1, w3, w2 are gate, up, down); gpt-oss's
    interleaved, transposed tensors cut and swapped."""
    mine = {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}
    n = 8 if family == "deepseek_v3" else 4
    out = {"router.weight": mine.pop("gate.weight" if family != "gpt_oss" else "router.weight")}
    if family == "gpt_oss":
        out["router.bias"] = mine.pop("router.bias")
        gate_up, bias = mine.pop("experts.gate_up_proj"), mine.pop("experts.gate_up_proj_bias")
        out["experts.gate_proj"] = gate_up[:, :, 0::2].transpose(0, 2, 1)
        out["experts.up_proj"] = gate_up[:, :, 1::2].transpose(0, 2, 1)
        out["experts.gate_proj_bias"], out["experts.up_proj_bias"] = bias[:, 0::2], bias[:, 1::2]
        out["experts.down_proj"] = mine.pop("experts.down_proj").transpose(0, 2, 1)
        out["experts.down_proj_bias"] = mine.pop("experts.down_proj_bias")
    else:
        names = (("w1", "w3", "w2") if family == "mixtral" else
                 ("gate_proj", "up_proj", "down_proj"))
        for ours, theirs in zip(("gate_proj", "up_proj", "down_proj"), names):
            out["experts." + ours] = np.stack([mine.pop(f"experts.{j}.{theirs}.weight")
                                               for j in range(n)])
    if family == "deepseek_v3":
        out["router.e_score_correction_bias"] = mine.pop("gate.e_score_correction_bias")
    for hf in ("shared_experts.", "shared_expert.", "shared_expert_gate."):
        for key in [k for k in mine if k.startswith(hf)]:
            out[key.replace("shared_experts.", "shared_expert.")] = mine.pop(key)
    assert not mine, f"checkpoint tensors left unmapped: {sorted(mine)}"
    return out


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss",
                                    "deepseek_v3"])
def test_checkpoint_files_map_as_documented(family, tmp_path):
    safetensors = need("safetensors.numpy")
    model = tiny_model(family)
    model.save_pretrained(tmp_path)
    files = safetensors.load_file(str(tmp_path / "model.safetensors"))
    block = model.model.layers[0].mlp
    moe = minitx_block(family)
    layer = "model.layers.0." + ("block_sparse_moe." if family == "mixtral" else "mlp.")
    state = from_checkpoint(files, layer, family)
    assert sorted(state) == sorted(n for n, _ in [*moe.named_parameters(),
                                                  *moe.named_buffers()])
    for name, t in [*moe.named_parameters(), *moe.named_buffers()]:
        assert tuple(t.shape) == state[name].shape, name
        t.copy_(np.ascontiguousarray(state[name]))
    x = np.random.default_rng(6).standard_normal((*T_SHAPE, E))
    out = block(torch.tensor(x))
    theirs = (out[0] if isinstance(out, tuple) else out).detach().numpy()
    assert rel(moe(tensor(x)), theirs) <= (EXACT if family == "gpt_oss" else FLOAT32_ROUTER)
