"""PyTorch parity for sigmoid attention (float64, max abs diff ≤ 1e-12): torch composes it as
torch.sigmoid(q @ kᵀ · scale − log n) @ v, masked entries zeroed; outputs and the gradients of
q, k, v, and the whole layer with the same weights."""
import math

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY, causal_pattern
from support import params_to_float64, tensor, to_host, need

torch = need("torch")
ATOL = 1e-12
E, H = 8, 2


def torch_sigmoid_attention(q, k, v, n, allowed=None):
    """The paper's formula in torch: σ(q kᵀ/√D − log n) v, grouped heads repeated."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    p = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) - math.log(n))
    if allowed is not None:
        p = p * torch.tensor(allowed, dtype=p.dtype)
    return p @ v


def close(mine, theirs):
    mine, theirs = to_host(mine), theirs.detach().numpy()
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() <= ATOL, np.abs(mine - theirs).max()


CASES = {
    "plain": dict(nq=6, nk=6, hkv=2, causal=False),
    "causal": dict(nq=7, nk=7, hkv=2, causal=True),
    "causal_nq_ne_nk": dict(nq=3, nk=8, hkv=2, causal=True),        # bottom-right aligned
    "gqa": dict(nq=5, nk=5, hkv=1, causal=False),
    "bool_mask_empty_row": dict(nq=5, nk=6, hkv=2, causal=False, mask=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attend_and_its_gradients_match_torch(rng, name):
    c = CASES[name]
    n = 37
    minitx.manual_seed(0)
    layer = params_to_float64(REGISTRY["sigmoid"](E, H, causal=c["causal"], context_length=n))
    shapes = [(2, H, c["nq"], 4), (2, c["hkv"], c["nk"], 4), (2, c["hkv"], c["nk"], 4)]
    arrays = [rng.standard_normal(s) for s in shapes]
    mine = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    allowed = causal_pattern(c["nq"], c["nk"]) if c["causal"] else None
    mask = None
    if c.get("mask"):
        mask = rng.random((1, 1, c["nq"], c["nk"])) > 0.5
        mask[..., 2, :] = False                                  # a row with no key: zeros
        allowed = mask
    out = layer.attend(*mine, attn_mask=mask)
    ref = torch_sigmoid_attention(*theirs, n, allowed)
    close(out, ref)
    g = rng.standard_normal(ref.shape)
    (out * tensor(g)).sum().backward()
    (ref * torch.tensor(g)).sum().backward()
    for a, b in zip(mine, theirs):
        close(a.grad, b.grad)


def test_the_layer_matches_torch_with_the_same_weights(rng):
    minitx.manual_seed(0)
    layer = params_to_float64(REGISTRY["sigmoid"](E, H, causal=True, context_length=16))
    w = {name: torch.tensor(p.numpy()) for name, p in layer.named_parameters()}
    x = rng.standard_normal((2, 9, E))
    xt = torch.tensor(x)

    def heads(t):                                                # (B, N, E) -> (B, H, N, D)
        return t.reshape(2, 9, H, E // H).transpose(1, 2)

    q, k, v = (heads(xt @ w[f"{p}_proj.weight"].T + w[f"{p}_proj.bias"]) for p in "qkv")
    z = torch_sigmoid_attention(q, k, v, 16, causal_pattern(9)).transpose(1, 2).reshape(2, 9, E)
    ref = z @ w["out_proj.weight"].T + w["out_proj.bias"]
    close(layer(tensor(x)), ref)
