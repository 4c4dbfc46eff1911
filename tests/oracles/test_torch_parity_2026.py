"""The attention variants of 2026's models against their models' own code, in float64:

- ``chunked``: HF's mask function for Llama 4's chunked layers
  (``transformers.masking_utils.chunked_causal_mask_function``, no left padding) evaluated on
  the grid is ``pattern(n)``, and torch's ``scaled_dot_product_attention`` under it gives
  ``attend``'s output (1e-12);
- ``short_conv``: LFM2's equations as HF's ``Lfm2ShortConv`` computes them, transcribed: a
  depthwise ``torch.nn.functional.conv1d`` with K − 1 zeros of padding on the left, trimmed to
  N (HF's ``causal_conv1d_fn`` fallback), of B ⊙ x, times C; here on the attention contract's
  heads, C = q, B = k, x = v, channel h·D + d. The difference from HF's layer: HF convolves
  E channels of one stream, the variant H·D head channels (the same when H·D = E, as here).
  The whole layer is checked against HF's module itself in test_hybrid_lfm2.py.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from support import need, tensor, to_host

torch = need("torch")
masking_utils = need("transformers.masking_utils")


def hf_chunked_mask(n, chunk):
    fn = masking_utils.chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
    q = torch.arange(n)[:, None]
    kv = torch.arange(n)[None, :]
    return fn(torch.tensor(0), torch.tensor(0), q, kv).numpy()


@settings(deadline=None, max_examples=30)
@given(n=st.integers(1, 24), chunk=st.integers(1, 10), seed=st.integers(0, 2 ** 16))
def test_chunked_is_llama4s_mask_and_torchs_attention_under_it(n, chunk, seed):
    minitx.manual_seed(0)
    layer = REGISTRY["chunked"](8, 2, causal=True, chunk_size=chunk).double().eval()
    mask = hf_chunked_mask(n, chunk)
    assert np.array_equal(layer.pattern(n), mask)
    g = np.random.default_rng(seed)
    q, k, v = (g.standard_normal((1, 2, n, 4)) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(mask)).numpy()
    got = to_host(layer.attend(tensor(q), tensor(k), tensor(v)).data)
    assert np.abs(got - want).max() <= 1e-12


@pytest.mark.parametrize("kernel", [1, 3, 4])
def test_short_conv_is_lfm2s_equations(kernel):
    minitx.manual_seed(0)
    layer = REGISTRY["short_conv"](8, 2, causal=True, kernel_size=kernel,
                                   conv_bias=True).double().eval()
    layer.conv_bias.data[...] = tensor(np.linspace(-1, 1, 8).reshape(2, 4)).data
    g = np.random.default_rng(kernel)
    q, k, v = (g.standard_normal((2, 2, 9, 4)) for _ in range(3))
    # HF's layout: (B, channels, N), channel h·D + d
    def channels(a):
        return torch.tensor(a.transpose(0, 1, 3, 2).reshape(2, 8, 9))
    weight = torch.tensor(to_host(layer.conv_weight.data).reshape(8, 1, kernel))
    bias = torch.tensor(to_host(layer.conv_bias.data).reshape(8))
    bx = channels(k) * channels(v)
    conv = torch.nn.functional.conv1d(bx, weight, bias, padding=kernel - 1, groups=8)[..., :9]
    y = (channels(q) * conv).numpy().reshape(2, 2, 4, 9).transpose(0, 1, 3, 2)
    got = to_host(layer.attend(tensor(q), tensor(k), tensor(v)).data)
    assert np.abs(got - y).max() <= 1e-12
