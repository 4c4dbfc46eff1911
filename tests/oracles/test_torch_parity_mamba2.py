r"""PyTorch parity for the Mamba-2 layer: HuggingFace's ``NemotronHMamba2Mixer`` (its
``torch_forward`` path on the CPU: ``mamba2_chunk_scan`` for a prompt, ``causal_conv1d_update``
and ``mamba2_selective_state_update`` for a generated token) against minitx's layer type
``mamba2`` (``models/mixers/mamba2.py``), built from a tiny ``NemotronHConfig`` with every
parameter redrawn and copied across under the same names.

HF rounds to float32 at fixed points even in a float64 model (``.float()`` in the SSM and the
decay, ``.to(torch.float32)`` in the gated norm), about 3e-7 relative here. The float64
comparisons therefore run HF with those casts widened back to float64 (``torch.Tensor.float``
and ``torch.Tensor.to`` patched, while HF runs, to keep a float64 tensor float64): the
maths is HF's unchanged, so they must agree to 1e-10 relative; the unpatched float64 run and
the float32 models are compared at 1e-5.

Compared: a prompt's outputs and the state HF caches (its (B, H, P, N) is the transpose of
minitx's (B, H, N, P)), on a hypothesis grid of sizes (heads, head and state sizes, groups,
kernels, chunk sizes, prompt lengths over chunk boundaries); decoding through HF's
``DynamicCache`` one token at a time and a chunk at a time against minitx's own cache and
full forward; Nemotron-H's clamp Δ ≥ ``time_step_min`` where it binds; padding through
``attention_mask``; the gradients of the input and of every parameter (≤ 1e-9).
"""
import contextlib
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minitx.models import DecoderConfig
from minitx.models.mixers import MIXERS
from support import need, tensor, to_host

torch = need("torch")
need("transformers")
from transformers import NemotronHConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer  # noqa: E402

TOL = 1e-10             # float64, HF widened: the same maths
ROUNDED = 1e-5          # HF's float32 casts (unpatched), or both models in float32
E = 16


def relative(a, b):
    a, b = to_host(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def pair(h=4, p=3, n=5, g=2, kernel=3, chunk=4, bias=True, dt_min=0.001, seed=0):
    """(HF's mixer, minitx's) in float64 with the same redrawn parameters (scale 0.5: Δ well
    inside torch's softplus threshold of 20)."""
    cfg = NemotronHConfig(vocab_size=31, hidden_size=E, layers_block_type=["linear_attention"],
                          mamba_num_heads=h, mamba_head_dim=p, ssm_state_size=n, n_groups=g,
                          conv_kernel=kernel, chunk_size=chunk, use_conv_bias=bias,
                          use_bias=bias, time_step_min=dt_min, layer_norm_epsilon=0.05,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    hf = NemotronHMamba2Mixer(cfg, layer_idx=0).double().eval()
    config = DecoderConfig(hidden_size=E, num_heads=4, norm_eps=0.05, num_layers=1,
                           layer_types=("mamba2",), mixer_options={"mamba2": dict(
                               num_heads=h, head_dim=p, state_size=n, n_groups=g,
                               conv_kernel=kernel, chunk_size=chunk, conv_bias=bias, bias=bias,
                               time_step_limit=(dt_min, math.inf))})
    mine = MIXERS["mamba2"](config, 0).to(dtype="float64")
    ours = dict(mine.named_parameters())
    theirs = dict(hf.named_parameters())
    assert sorted(ours) == sorted(theirs)                    # HF's names, one for one
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, prm in theirs.items():
            prm.copy_(torch.from_numpy(rng.standard_normal(tuple(prm.shape)) * 0.5))
            ours[name].copy_(prm.numpy())
    return cfg, hf, mine


@contextlib.contextmanager
def widened():
    """While inside: a float64 tensor's ``.float()`` and ``.to(torch.float32)`` keep it float64
    (HF's float32 casts widened; nothing else changes)."""
    plain_float, plain_to = torch.Tensor.float, torch.Tensor.to

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else plain_float(self, *args, **kwargs)

    def keep_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return plain_to(self, *args, **kwargs)

    torch.Tensor.float, torch.Tensor.to = keep_float, keep_to
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to = plain_float, plain_to


def run_hf(hf, x, wide=True, **kwargs):
    """HF's output for x (B, T, E), its float32 casts widened unless ``wide=False``."""
    with torch.no_grad(), (widened() if wide else contextlib.nullcontext()):
        return hf(torch.from_numpy(x), **kwargs).numpy()


@settings(deadline=None, max_examples=12)
@given(heads=st.sampled_from([(1, 1), (4, 2), (4, 4), (6, 3)]), p=st.sampled_from([1, 3]),
       n=st.sampled_from([1, 5]), kernel=st.sampled_from([1, 2, 4]),
       chunk=st.sampled_from([1, 3, 4, 64]), t=st.integers(1, 11), bias=st.booleans())
def test_a_prompt_and_its_state_equal_hfs(heads, p, n, kernel, chunk, t, bias):
    h, g = heads
    cfg, hf, mine = pair(h, p, n, g, kernel, chunk, bias, seed=t)
    x = np.random.default_rng(t).standard_normal((2, t, E))
    cache = DynamicCache(config=cfg)
    theirs = run_hf(hf, x, cache=cache)
    ours = mine.new_cache()
    got = mine(tensor(x), kv_cache=ours)
    assert relative(got, theirs) <= TOL
    hf_state = cache.layers[0].recurrent_states[0].numpy()                # (B, H, P, N)
    assert relative(ours.state.swapaxes(-1, -2), hf_state) <= TOL
    assert relative(mine(tensor(x)), run_hf(hf, x)) <= TOL                # no cache either


@pytest.mark.parametrize("parts", [(5, 1, 1, 1, 1), (4, 1, 1, 3), (1,) * 7, (2, 5)])
def test_decoding_through_hfs_cache_equals_minitxs(parts):
    cfg, hf, mine = pair()
    t = sum(parts)
    x = np.random.default_rng(1).standard_normal((2, t, E))
    full = mine(tensor(x)).numpy()
    theirs, ours = DynamicCache(config=cfg), mine.new_cache()
    hf_out, our_out, start = [], [], 0
    for part in parts:
        hf_out.append(run_hf(hf, x[:, start:start + part], cache=theirs))
        our_out.append(mine(tensor(x[:, start:start + part]), kv_cache=ours).numpy())
        start += part
    hf_out, our_out = np.concatenate(hf_out, 1), np.concatenate(our_out, 1)
    assert relative(our_out, hf_out) <= TOL
    assert relative(full, hf_out) <= TOL
    assert relative(ours.state.swapaxes(-1, -2),
                    theirs.layers[0].recurrent_states[0].numpy()) <= TOL


def test_hfs_float32_casts_are_the_only_difference():
    """Unpatched, HF's float64 model differs from minitx's by its float32 roundings only;
    both models in float32 agree to float32's."""
    _, hf, mine = pair(seed=3)
    x = np.random.default_rng(3).standard_normal((2, 9, E))
    rounded = relative(mine(tensor(x)), run_hf(hf, x, wide=False))
    assert 1e-9 < rounded <= ROUNDED                  # visible, and no more than rounding
    hf.float()
    mine.to(dtype="float32")
    with torch.no_grad():
        theirs = hf(torch.from_numpy(x.astype(np.float32))).numpy()
    assert relative(mine(tensor(x, dtype="float32")), theirs) <= ROUNDED


def test_nemotron_hs_clamp_of_the_step_where_it_binds():
    """Head 0's bias at −12 puts Δ = softplus(δ − 12) below time_step_min = 0.001: HF's prompt
    clamps it there, and so does minitx (time_step_limit (0.001, ∞)); without the clamp the
    outputs differ."""
    _, hf, mine = pair(dt_min=0.001, seed=4)
    with torch.no_grad():
        hf.dt_bias[0] = -12.0
    mine.dt_bias.copy_(hf.dt_bias.detach().numpy())
    x = np.random.default_rng(4).standard_normal((2, 8, E))
    theirs = run_hf(hf, x)
    assert relative(mine(tensor(x)), theirs) <= TOL
    mine.options["time_step_limit"] = (0.0, math.inf)
    assert relative(mine(tensor(x)), theirs) > 1e-6


def test_padding_through_the_attention_mask_equals_hfs():
    _, hf, mine = pair(bias=False, seed=5)
    x = np.random.default_rng(5).standard_normal((2, 7, E))
    keep = np.ones((2, 7))
    keep[0, :3] = keep[1, 4] = 0.0
    theirs = run_hf(hf, x, attention_mask=torch.from_numpy(keep))
    from minitx.backend import xp
    got = mine(tensor(x), keep=xp().asarray(keep.astype(bool)))
    assert relative(got, theirs) <= TOL


def test_gradients_of_the_input_and_every_parameter_equal_hfs():
    _, hf, mine = pair(seed=6)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9, E))
    cot = rng.standard_normal((2, 9, E))
    xt = torch.from_numpy(x).requires_grad_(True)
    with widened():
        (hf(xt) * torch.from_numpy(cot)).sum().backward()
    xm = tensor(x, requires_grad=True)
    (mine(xm) * tensor(cot)).sum().backward()
    assert relative(xm.grad, xt.grad.numpy()) <= 1e-9
    ours = dict(mine.named_parameters())
    for name, prm in hf.named_parameters():
        assert relative(ours[name].grad, prm.grad.numpy()) <= 1e-9, name
