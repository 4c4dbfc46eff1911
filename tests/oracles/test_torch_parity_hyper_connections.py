"""Hyper-connections (``minitx/nn/hyper_connections.py``) against ``transformers``' own modules:
DeepSeek-V4's ``DeepseekV4HyperConnection`` and ``DeepseekV4HyperHead``, and Qwen4-Exp's
``Qwen4ExpTextGatedResidual`` (with and without its injection weights), built from tiny
configs, every parameter redrawn (biases, scales and norm weights too, so that none sits at
its neutral initial value), CPU float64.

HF computes these modules in float32 by design (``.float()`` inside each, whatever the
model's dtype). To compare the formulas at 1e-10 the float64 tests make ``Tensor.float`` keep
the tensor's dtype while they run (``keep_float64``); a float32 test compares HF unchanged
with minitx in float32. What the tests add around the modules is the write, as HF's decoder
layers do it (``post ⊗ F(x) + combᵀ H``; Qwen's ``hyper_input + injection``), with a fixed
layer F standing in for attention or the MLP; and Qwen's (B, N, n·E) layout reshaped to
minitx's (B, N, n, E).
"""
import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

import minitx  # noqa: E402
from minitx.nn.hyper_connections import (  # noqa: E402
    GatedHyperConnection, ManifoldHyperConnection, ManifoldHyperHead, expand_streams)
from support import tensor, to_host  # noqa: E402

from transformers.models.deepseek_v4 import modeling_deepseek_v4 as dsv4  # noqa: E402
from transformers.models.qwen4_exp import modeling_qwen4_exp as qwen4  # noqa: E402

E, N_STREAMS, RANK = 12, 3, 5
TOL = 1e-10


@pytest.fixture
def keep_float64(monkeypatch):
    """HF's ``.float()`` keeps a float64 tensor float64 while the test runs."""
    real = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float",
                        lambda self, *a, **k: self if self.dtype == torch.float64
                        else real(self, *a, **k))


def relative(a, b):
    a, b = to_host(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def redraw(module, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return module.to(dtype)


def load(module, values):
    """Copy host arrays into minitx parameters by name."""
    params = dict(module.named_parameters())
    for name, value in values.items():
        params[name].data = minitx.tensor(np.asarray(value)).data.astype(params[name].dtype)


def layer_f(x):
    """A fixed nonlinear stand-in for attention or the MLP, one in each library."""
    if isinstance(x, torch.Tensor):
        return torch.tanh(x) * 1.5 + x.roll(1, dims=-1)
    import minitx.functional as F
    return F.tanh(x) * 1.5 + F.concatenate([x[..., -1:], x[..., :-1]], axis=-1)


def dsv4_config(**over):
    cfg = dict(hidden_size=E, hc_mult=N_STREAMS, hc_sinkhorn_iters=7, hc_eps=1e-3,
               rms_norm_eps=0.05)
    cfg.update(over)
    return transformers.DeepseekV4Config(**cfg)


def hf_mhc_layer(hc, h):
    post, comb, collapsed = hc(h)
    return post.unsqueeze(-1) * layer_f(collapsed).unsqueeze(-2) + \
        torch.matmul(comb.transpose(-1, -2), h)


@pytest.mark.parametrize("iters", [1, 7, 20])
def test_mhc_equals_deepseek_v4(keep_float64, iters):
    hf = redraw(dsv4.DeepseekV4HyperConnection(dsv4_config(hc_sinkhorn_iters=iters)), 1)
    ours = ManifoldHyperConnection(E, N_STREAMS, sinkhorn_iterations=iters, eps=1e-3,
                                   norm_eps=0.05, dtype="float64")
    load(ours, {"weight": hf.fn.detach().numpy(), "bias": hf.base.detach().numpy(),
                "scale": hf.scale.detach().numpy()})
    h = np.random.default_rng(iters).standard_normal((2, 7, N_STREAMS, E))
    with torch.no_grad():
        post, comb, collapsed = hf(torch.tensor(h))
        want = hf_mhc_layer(hf, torch.tensor(h)).numpy()
    x, b, m = ours.read(tensor(h))
    assert relative(x, collapsed.numpy()) < TOL
    assert relative(b, post.numpy()) < TOL
    assert relative(m, comb.numpy()) < TOL
    assert relative(ours(tensor(h), layer_f), want) < TOL


def test_mhc_head_and_expansion_equal_deepseek_v4(keep_float64):
    cfg = dsv4_config()
    hf = redraw(dsv4.DeepseekV4HyperHead(cfg), 2)
    ours = ManifoldHyperHead(E, N_STREAMS, eps=1e-3, norm_eps=0.05, dtype="float64")
    load(ours, {"weight": hf.hc_fn.detach().numpy(), "bias": hf.hc_base.detach().numpy(),
                "scale": hf.hc_scale.detach().numpy()})
    h = np.random.default_rng(3).standard_normal((2, 6, N_STREAMS, E))
    with torch.no_grad():
        want = hf(torch.tensor(h)).numpy()
    assert relative(ours(tensor(h)), want) < TOL
    # the first layer's streams: DeepseekV4Model's expand of the embeddings
    emb = np.random.default_rng(4).standard_normal((2, 6, E))
    hf_streams = torch.tensor(emb).unsqueeze(2).expand(-1, -1, N_STREAMS, -1).numpy()
    assert np.array_equal(to_host(expand_streams(tensor(emb), N_STREAMS)), hf_streams)


def qwen4_config():
    return qwen4.Qwen4ExpTextConfig(hidden_size=E, hc_count=N_STREAMS, hc_lowrank=RANK,
                                    rms_norm_eps=0.05, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=6,
                                    moe_intermediate_size=8, shared_expert_intermediate_size=8,
                                    num_experts=4, num_experts_per_tok=2, vocab_size=32)


def load_gated(ours, hf):
    values = {"norm_weight": hf.hc_norm.weight.detach().numpy(),
              "mix_down.weight": hf.input_mix_weight_down.weight.detach().numpy(),
              "mix_up.weight": hf.input_mix_weight_up.weight.detach().numpy()}
    if hf.block_inject_weight is not None:
        values["inject.weight"] = hf.block_inject_weight.weight.detach().numpy()
    load(ours, values)


def test_gated_equals_qwen4_exp(keep_float64):
    hf = redraw(qwen4.Qwen4ExpTextGatedResidual(qwen4_config()), 5)
    ours = GatedHyperConnection(E, N_STREAMS, rank=RANK, norm_eps=0.05, dtype="float64")
    load_gated(ours, hf)
    h = np.random.default_rng(6).standard_normal((2, 7, N_STREAMS, E))
    flat = torch.tensor(h.reshape(2, 7, N_STREAMS * E))               # HF's (B, N, n·E)
    with torch.no_grad():
        mixed, hyper_input, inject = hf(flat)
        # Qwen4ExpTextDecoderLayer's write: hyper_input + (F(x) ⊗ injection).flatten
        want = (hyper_input + (layer_f(mixed).unsqueeze(-2) * inject.unsqueeze(-1))
                .flatten(-2)).numpy()
    x, b, m = ours.read(tensor(h))
    assert m is None
    assert relative(x, mixed.numpy()) < TOL
    assert relative(b, inject.numpy()) < TOL
    got = to_host(ours(tensor(h), layer_f)).reshape(2, 7, N_STREAMS * E)
    assert relative(got, want) < TOL


def test_gated_collapse_and_expansion_equal_qwen4_exp(keep_float64):
    hf = redraw(qwen4.Qwen4ExpTextGatedResidual(qwen4_config(), use_combine=False), 7)
    ours = GatedHyperConnection(E, N_STREAMS, rank=RANK, norm_eps=0.05, inject=False,
                                dtype="float64")
    load_gated(ours, hf)
    h = np.random.default_rng(8).standard_normal((2, 5, N_STREAMS, E))
    with torch.no_grad():
        want = hf(torch.tensor(h.reshape(2, 5, -1))).numpy()
    assert relative(ours(tensor(h)), want) < TOL
    # Qwen4ExpTextModel's expansion: hidden_states.repeat(1, 1, n), stream-major
    emb = np.random.default_rng(9).standard_normal((2, 5, E))
    hf_streams = torch.tensor(emb).repeat(1, 1, N_STREAMS).numpy()
    got = to_host(expand_streams(tensor(emb), N_STREAMS)).reshape(2, 5, -1)
    assert np.array_equal(got, hf_streams)


def test_float32_against_hf_as_it_runs():
    """HF unchanged (its own float32 coefficients) against minitx in float32."""
    hf = redraw(dsv4.DeepseekV4HyperConnection(dsv4_config()), 10, torch.float32)
    ours = ManifoldHyperConnection(E, N_STREAMS, sinkhorn_iterations=7, eps=1e-3,
                                   norm_eps=0.05, dtype="float32")
    load(ours, {"weight": hf.fn.detach().numpy(), "bias": hf.base.detach().numpy(),
                "scale": hf.scale.detach().numpy()})
    h = np.random.default_rng(11).standard_normal((2, 7, N_STREAMS, E)).astype(np.float32)
    with torch.no_grad():
        want = hf_mhc_layer(hf, torch.tensor(h)).numpy()
    # float32 rounding through a norm, a product of 36 terms and 13 normalisations
    assert relative(ours(tensor(h, dtype="float32"), layer_f), want) < 1e-5
