"""PyTorch parity for two attention variants of current models, composed from torch ops as
their papers' code does (float64, max |Δ| ≤ 1e-10, outputs and gradients):

- ``diff`` (Ye et al. 2024): the layout of the paper's code — queries/keys viewed as 2H
  half-heads, RoPE on every half-head (interleaved pairs) with ``rope=True``, the two maps as
  one (B, H, 2, N, N) tensor, λ, RMSNorm over each head, (1 − λ_init). With Hkv = H: the
  paper's code repeats key *half*-heads for GQA, which pairs them differently from minitx
  (query head h reads both halves of key head h // (H/Hkv)).
- ``mla`` (DeepSeek-AI 2024): down/up projections, RoPE on the decoupled part (interleaved
  pairs), the shared RoPE key expanded over heads, torch's scaled_dot_product_attention with
  scale 1/√(D + d_R).
"""
import math

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY
from support import tensor, to_host, need

torch = need("torch")
ATOL = 1e-10


def close(mine, theirs):
    theirs = theirs.detach().numpy()
    mine = to_host(mine)
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() <= ATOL, np.abs(mine - theirs).max()


def torch_params(layer):
    """{name: torch leaf tensor} with the layer's float64 values, requiring grad."""
    return {n: torch.tensor(to_host(p.data), requires_grad=True)
            for n, p in layer.named_parameters()}


def linear(p, name, x):
    w, b = p[name + ".weight"], p.get(name + ".bias")
    return torch.nn.functional.linear(x, w, b)


def causal_mask(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


# ---- differential attention, as the paper's code writes it --------------------------------

def torch_diff(p, x, h, lambda_init, eps=1e-5, rope=False):
    b, n, e = x.shape
    d = e // h // 2
    q = linear(p, "q_proj", x).view(b, n, 2 * h, d).transpose(1, 2)       # (B, 2H, N, d)
    k = linear(p, "k_proj", x).view(b, n, 2 * h, d).transpose(1, 2)
    if rope:                                     # every half-head rotated by its position
        q, k = torch_rope(q), torch_rope(k)
    v = linear(p, "v_proj", x).view(b, n, h, 2 * d).transpose(1, 2)       # (B, H, N, 2d)
    w = (q * d ** -0.5) @ k.transpose(-1, -2)
    w = torch.softmax(w.masked_fill(~causal_mask(n), float("-inf")), dim=-1)
    lam = (torch.exp(torch.sum(p["lambda_q1"] * p["lambda_k1"]))
           - torch.exp(torch.sum(p["lambda_q2"] * p["lambda_k2"])) + lambda_init)
    w = w.view(b, h, 2, n, n)
    attn = (w[:, :, 0] - lam * w[:, :, 1]) @ v                             # (B, H, N, 2d)
    attn = torch.nn.functional.rms_norm(attn, (2 * d,), p["head_norm.weight"], eps)
    attn = (attn * (1 - lambda_init)).transpose(1, 2).reshape(b, n, e)
    return linear(p, "out_proj", attn)


@pytest.mark.parametrize("rope", [False, True])
def test_diff_matches_the_papers_code_in_torch(rope):
    minitx.manual_seed(0)
    layer = REGISTRY["diff"](16, 2, causal=True, layer_index=3, rope=rope).double()
    rng = np.random.default_rng(0)
    for par in (layer.lambda_q1, layer.lambda_k1, layer.lambda_q2, layer.lambda_k2,
                layer.head_norm.weight):
        par.copy_(rng.standard_normal(par.shape) * 0.5)
    x_host = rng.standard_normal((2, 7, 16))
    x = tensor(x_host, requires_grad=True)
    y = layer(x)
    p = torch_params(layer)
    xt = torch.tensor(x_host, requires_grad=True)
    yt = torch_diff(p, xt, 2, 0.8 - 0.6 * math.exp(-0.3 * 3), rope=rope)
    close(y, yt)
    r = rng.standard_normal(y.shape)
    (y * tensor(r)).sum().backward()
    (yt * torch.tensor(r)).sum().backward()
    close(x.grad, xt.grad)
    for name, par in layer.named_parameters():
        close(par.grad, p[name].grad)


# ---- multi-head latent attention ----------------------------------------------------------

def torch_rope(t, base=10000.0):
    """Rotate interleaved pairs of t (…, N, d) by position·base^(−2i/d), positions 0 … N−1."""
    n, d = t.shape[-2], t.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * theta            # (N, d/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def torch_mla(p, x, h, d, dr):
    b, n, _ = x.shape
    c_q = linear(p, "w_dq", x)
    q_c = linear(p, "w_uq", c_q).view(b, n, h, d).transpose(1, 2)          # (B, H, N, D)
    q_r = torch_rope(linear(p, "w_qr", c_q).view(b, n, h, dr).transpose(1, 2))
    c_kv = linear(p, "w_dkv", x)                                            # (B, N, d_c)
    k_c = linear(p, "w_uk", c_kv).view(b, n, h, d).transpose(1, 2)
    v = linear(p, "w_uv", c_kv).view(b, n, h, d).transpose(1, 2)
    k_r = torch_rope(linear(p, "w_kr", x))[:, None].expand(b, h, n, dr)     # shared by heads
    q, k = torch.cat([q_c, q_r], dim=-1), torch.cat([k_c, k_r], dim=-1)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                         scale=(d + dr) ** -0.5)
    return linear(p, "out_proj", o.transpose(1, 2).reshape(b, n, h * d))


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_matches_its_composition_in_torch(absorbed):
    minitx.manual_seed(1)
    layer = REGISTRY["mla"](16, 4, causal=True, kv_rank=6, q_rank=5, rope_dim=4,
                            absorbed=absorbed).double()
    x_host = np.random.default_rng(1).standard_normal((2, 7, 16))
    x = tensor(x_host, requires_grad=True)
    y = layer(x)
    p = torch_params(layer)
    xt = torch.tensor(x_host, requires_grad=True)
    yt = torch_mla(p, xt, 4, 4, 4)
    close(y, yt)
    r = np.random.default_rng(2).standard_normal(y.shape)
    (y * tensor(r)).sum().backward()
    (yt * torch.tensor(r)).sum().backward()
    close(x.grad, xt.grad)
    for name, par in layer.named_parameters():
        close(par.grad, p[name].grad)
