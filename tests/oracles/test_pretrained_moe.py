"""The mixture-of-experts decoders — Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3, MiniMax-M2,
GLM-4.5 — loaded by ``minitx.pretrained.load`` against ``transformers`` (the test-only
oracle), beyond what ``test_pretrained_decoders.py`` checks for every family (logits, greedy
tokens, caches, gradients, hidden states): the router's logits and choices under each
block's hooks, the load-balancing loss as HF's ``output_router_logits`` gives it, the
checkpoint files' per-expert spelling written back, and the refusals.

Routing is discontinuous: a token whose k-th and (k+1)-th expert scores were nearly tied could
choose differently in HF, which computes Mixtral's and Qwen's router softmax, MiniMax-M2's
router sigmoid, and all of DeepSeek-V3's and GLM-4.5's router in float32 even in a float64
model. The tiny checkpoints have no such
near-tie (checked below: every margin is far above float32's rounding), so both libraries
choose the same experts and the logits agree to 1e-5.
"""
import json
import os
import shutil

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx.pretrained as pt  # noqa: E402
from decoder_util import CASES, MOE_CASES, tiny_decoder  # noqa: E402
from minitx.ops.loss import cross_entropy  # noqa: E402
from minitx.ops.shape import reshape  # noqa: E402
from minitx.pretrained.safetensors import load_file, save_file  # noqa: E402
from support import to_host  # noqa: E402

IDS = np.random.default_rng(0).integers(3, 97, (2, 11))
MASK = np.ones_like(IDS)
MASK[0, :3] = 0                                       # three padding tokens on the left


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("moe-decoders")


def hf_model(folder):
    m = transformers.AutoModelForCausalLM.from_pretrained(folder,
                                                          experts_implementation="eager")
    return m.double().eval()


def relative(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def moe_layers(model):
    return [i for i, b in enumerate(model.blocks) if hasattr(b.mlp, "router")]


@pytest.mark.parametrize("case", MOE_CASES)
def test_router_logits_and_choices_are_hooked_under_each_block(root, case):
    """``blocks.{i}.mlp.hook_router_logits`` holds HF's router logits (its
    ``output_router_logits``) and ``hook_expert_indices`` the experts HF's router picks;
    dense layers have neither."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    ref = hf_model(folder)
    with torch.no_grad():
        out = ref(torch.tensor(IDS), output_router_logits=True)
    _, cache = model.run_with_cache(IDS)
    layers = moe_layers(model)
    assert layers == {"mixtral": [0, 1], "qwen3_moe": [0], "gpt_oss": [0, 1],
                      "deepseek_v3-moe": [1], "minimax_m2": [0, 1], "glm4_moe": [1],
                      "llama4_text": [1]}[case]
    for i, block in enumerate(model.blocks):
        assert (f"blocks.{i}.mlp.hook_router_logits" in cache) == (i in layers)
    theirs = [t.numpy() for t in out.router_logits] if out.router_logits else None
    k = model.config.top_k
    for n, i in enumerate(layers):
        logits = cache[f"blocks.{i}.mlp.hook_router_logits"].numpy()
        chosen = np.sort(cache[f"blocks.{i}.mlp.hook_expert_indices"].numpy(), axis=-1)
        assert chosen.shape == (IDS.size, k)
        if theirs is not None and CASES[case][0] not in ("deepseek_v3", "glm4_moe"):
            assert relative(logits, theirs[n]) <= 1e-5
        # HF's choice from its own router, in float32 as HF computes it
        layer = ref.model.layers[i]
        block = layer.mlp if hasattr(layer, "mlp") else layer.feed_forward     # Llama 4's
        h = model.blocks[i].ln2(cache[f"blocks.{i}.hook_resid_mid"])     # the MoE's input
        h = torch.tensor(h.numpy()).reshape(-1, 32)
        with torch.no_grad():
            gate = getattr(block, "gate", None)                 # gpt-oss's is "router"
            if hasattr(block, "e_score_correction_bias") or \
                    hasattr(gate, "e_score_correction_bias"):
                # σ scores + the correction bias (DeepSeek-V3's under the gate, MiniMax-M2's
                # beside it), group-limited where HF's config says: n_group groups, the
                # topk_group best kept, a group scored by its two best experts
                bias = getattr(gate, "e_score_correction_bias", None)
                bias = block.e_score_correction_bias if bias is None else bias
                lg = torch.nn.functional.linear(h.float(), block.gate.weight.float())
                score = lg.sigmoid() + bias.float()
                g, kg = getattr(ref.config, "n_group", 1), getattr(ref.config, "topk_group", 1)
                per = score.shape[-1] // g
                groups = score.view(-1, g, per).topk(2, dim=-1)[0].sum(-1)
                keep = torch.zeros_like(groups).scatter_(1, groups.topk(kg, dim=-1)[1], 1)
                score = score.masked_fill(~keep.repeat_interleave(per, 1).bool(), -1e9)
            else:
                router = block.gate if hasattr(block, "gate") else block.router
                score = torch.nn.functional.linear(h, router.weight, getattr(router, "bias",
                                                                            None)).float()
        top = score.topk(k + 1, dim=-1)[0].numpy()
        # no near-tie between the k-th and the next expert: float32 cannot flip the choice
        assert (top[:, k - 1] - top[:, k]).min() > 1e-5
        assert np.array_equal(chosen, np.sort(score.topk(k, dim=-1)[1].numpy(), axis=-1))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_the_load_balancing_loss_is_transformers_aux_loss(root, case, masked):
    """``model.aux_loss()`` over the last forward equals HF's ``aux_loss`` with
    ``output_router_logits=True`` (the layers' tokens pooled; padding left out), and the
    training loss cross-entropy + router_aux_loss_coef · aux equals HF's ``loss`` given
    labels. HF accumulates the loss in float32: relative 1e-6."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    mask = MASK if masked else None
    with torch.no_grad():
        out = hf_model(folder)(torch.tensor(IDS), labels=torch.tensor(IDS),
                               output_router_logits=True,
                               attention_mask=None if mask is None else torch.tensor(mask))
    logits = model(IDS, attention_mask=mask)
    aux = model.aux_loss(attention_mask=mask)
    assert abs(float(aux.item()) - float(out.aux_loss)) <= 1e-6 * float(out.aux_loss)
    if mask is None:   # HF's labels do not skip the padding: compare the unmasked loss only
        shift = reshape(logits[:, :-1], (-1, logits.shape[-1]))
        loss = cross_entropy(shift, IDS[:, 1:].reshape(-1)) + \
            model.config.router_aux_loss_coef * aux
        assert model.config.router_aux_loss_coef == 0.001
        assert abs(float(loss.item()) - float(out.loss)) <= 1e-6 * float(out.loss)
    # the loss's gradient reaches the routers
    aux.backward()
    for i in moe_layers(model):
        assert np.abs(model.blocks[i].mlp.router.weight.grad.numpy()).max() > 0


def test_a_dense_decoder_has_no_load_balancing_loss(root):
    model, _ = pt.load(tiny_decoder(root, "llama"), dtype="float64", tokenizer=False)
    model(IDS)
    assert model.router_logits() == []
    with pytest.raises(ValueError, match="no mixture-of-experts layer has run"):
        model.aux_loss()


@pytest.mark.parametrize("case", MOE_CASES)
def test_the_files_spelling_is_written_back_exactly(root, case):
    """``decoder_state_to_hf(files=True)`` gives the checkpoint file's tensors — Mixtral's
    per-expert w1, w3, w2 under block_sparse_moe, Qwen's and DeepSeek's per-expert matrices,
    gpt-oss's interleaved, transposed ones — key for key and bit for bit."""
    folder = tiny_decoder(root, case)
    model, _ = pt.load(folder, dtype="float32", tokenizer=False)
    files = load_file(os.path.join(folder, "model.safetensors"))
    state = {k: to_host(v) for k, v in model.state_dict().items()}
    back = pt.decoder_state_to_hf(state, model, files=True)
    assert sorted(back) == sorted(files)
    for key, value in files.items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def _copy(root, case, name):
    dst = os.path.join(str(root), name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(tiny_decoder(root, case), dst)
    return dst


def _edit(folder, config=None, tensors=None):
    if config:
        path = os.path.join(folder, "config.json")
        with open(path) as fh:
            cfg = json.load(fh)
        cfg.update(config)
        with open(path, "w") as fh:
            json.dump(cfg, fh)
    if tensors:
        path = os.path.join(folder, "model.safetensors")
        save_file(tensors(dict(load_file(path))), path)


def test_deepseek_norm_topk_prob_null_reads_as_false_as_in_transformers(root):
    folder = _copy(root, "deepseek_v3-moe", "norm-null")
    _edit(folder, config={"norm_topk_prob": None})
    model, _ = pt.load(folder, dtype="float64", tokenizer=False)
    assert model.config.moe_options["norm_topk_prob"] is False
    with torch.no_grad():
        ref = hf_model(folder)(torch.tensor(IDS)).logits.numpy()
    assert relative(model(IDS).numpy(), ref) <= 1e-5


def _mxfp4(t):
    key = "model.layers.0.mlp.experts.gate_up_proj"
    t[key + "_blocks"] = np.zeros((4, 32, 2, 16), np.uint8)
    t[key + "_scales"] = np.zeros((4, 32, 2), np.uint8)
    del t[key]
    return t


@pytest.mark.parametrize("case,config,tensors,match", [
    ("gpt_oss", {"quantization_config": {"quant_method": "mxfp4"}}, None,
     "quantization_config says MXFP4"),
    ("gpt_oss", None, _mxfp4, "gate_up_proj_blocks' is MXFP4-quantised"),
    ("mixtral", {"router_jitter_noise": 0.1}, None, "router_jitter_noise=0.1"),
    ("deepseek_v3-moe", {"scoring_func": "softmax"}, None, "scoring_func='softmax'"),
    ("mixtral", None,
     lambda t: {k: v for k, v in t.items()
                if k != "model.layers.1.block_sparse_moe.experts.3.w1.weight"},
     r"layer 1: gate_proj of expert\(s\) \[3\] missing"),
    ("qwen3_moe", None,
     lambda t: {**t, "model.layers.0.mlp.experts.0.down_proj.weight": np.zeros((3, 3))},
     r"layer 0: the experts' down_proj tensors differ in shape"),
])
def test_what_minitx_does_not_run_is_refused_by_name(root, case, config, tensors, match):
    folder = _copy(root, case, "bad-moe")
    _edit(folder, config, tensors)
    with pytest.raises(ValueError, match=match):
        pt.load(folder, tokenizer=False)
