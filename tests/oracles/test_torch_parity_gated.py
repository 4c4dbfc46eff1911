"""PyTorch parity for gated attention, forgetting attention (FoX) and lightning attention, in
float64, outputs and gradients (max abs diff ≤ 1e-12):

- gated: HuggingFace's own ``Qwen3NextAttention`` (its doubled q projection gives the gate),
  with q/k RMSNorm replaced by the identity and the rotation at angle 0 (cos 1, sin 0), loaded
  into minitx's separate q and gate projections;
- FoX: the official forgetting-attention equations written in torch (log f = logsigmoid of a
  per-head linear map with bias, c = cumsum(log f), scores + c_i − c_j, causal softmax);
- lightning: HuggingFace's own ``MiniMaxLightningAttention`` (MiniMax's block equations and
  decay schedule), with the identity activation, its RMSNorm replaced by the identity and the
  output gate's weights zero (σ(0) = ½, folded into minitx's output projection: exact), and
  MiniMax's block equations written in torch for ``attend``'s own gradients."""
import math

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY
from minitx.backend import get_array_module
from support import params_to_float64, tensor, to_host, need

torch = need("torch")
ATOL = 1e-12
E, H, D = 8, 2, 4


def close(mine, theirs, atol=ATOL):
    mine, theirs = to_host(mine), theirs.detach().numpy()
    assert mine.shape == theirs.shape, (mine.shape, theirs.shape)
    assert np.abs(mine - theirs).max() <= atol, np.abs(mine - theirs).max()


def to_minitx(linear, weight, bias=None):
    """Put host copies of torch parameters into a minitx Linear, on its device."""
    xp = get_array_module(linear.weight.data)
    linear.weight.data = xp.asarray(weight.detach().numpy())
    if bias is not None:
        linear.bias.data = xp.asarray(bias.detach().numpy())


# ---- gated attention: Qwen3-Next's own module ---------------------------------------------

@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_gated_matches_qwen3_next_attention(num_kv_heads):
    need("transformers")
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention
    config = Qwen3NextConfig(hidden_size=E, num_attention_heads=H,
                             num_key_value_heads=num_kv_heads, head_dim=D,
                             attention_bias=False, attention_dropout=0.0)
    config._attn_implementation = "sdpa"          # eager's softmax runs in float32
    torch.manual_seed(0)
    hf = Qwen3NextAttention(config, layer_idx=0).double().eval()
    hf.q_norm, hf.k_norm = torch.nn.Identity(), torch.nn.Identity()
    mine = params_to_float64(REGISTRY["gated"](E, H, causal=True, num_kv_heads=num_kv_heads,
                                               bias=False))
    # HF's q_proj rows are, per head, D query rows then D gate rows
    wq = hf.q_proj.weight.view(H, 2 * D, E)
    to_minitx(mine.q_proj, wq[:, :D].reshape(E, E))
    to_minitx(mine.gate_linear, wq[:, D:].reshape(E, E))
    for name, theirs in (("k", hf.k_proj), ("v", hf.v_proj), ("out", hf.o_proj)):
        to_minitx(getattr(mine, f"{name}_proj"), theirs.weight)
    x = np.random.default_rng(1).standard_normal((2, 9, E))
    xt = torch.tensor(x, requires_grad=True)
    angle0 = (torch.ones(2, 9, D, dtype=torch.float64), torch.zeros(2, 9, D, dtype=torch.float64))
    ref, _ = hf(xt, position_embeddings=angle0, attention_mask=None)
    xm = tensor(x, requires_grad=True)
    out = mine(xm)
    close(out, ref)
    g = np.random.default_rng(2).standard_normal(ref.shape)
    ref.backward(torch.tensor(g))
    out.backward(tensor(g))
    close(xm.grad, xt.grad)
    gq = hf.q_proj.weight.grad.view(H, 2 * D, E)
    close(mine.q_proj.weight.grad, gq[:, :D].reshape(E, E))
    close(mine.gate_linear.weight.grad, gq[:, D:].reshape(E, E))
    close(mine.k_proj.weight.grad, hf.k_proj.weight.grad)
    close(mine.out_proj.weight.grad, hf.o_proj.weight.grad)


# ---- FoX: the official equations in torch ---------------------------------------------------

def torch_forgetting_attention(q, k, v, log_fgate):
    """(B, H, N, D) heads, log f (B, H, N): c = cumsum(log f); softmax(q kᵀ/√D + c_i − c_j,
    causal) v."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    c = torch.cumsum(log_fgate, dim=-1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + c[..., :, None] - c[..., None, :]
    n = q.shape[2]
    s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def torch_fox_layer(x, p, hkv):
    """FoX's layer: projections, fgate = logsigmoid(x W_f + b) per head, the attention, W_O."""
    b, n, _ = x.shape

    def split(y, h):
        return y.view(b, n, h, -1).transpose(1, 2)
    q = split(x @ p["q.w"].T + p["q.b"], H)
    k, v = (split(x @ p[f"{s}.w"].T + p[f"{s}.b"], hkv) for s in "kv")
    log_f = torch.nn.functional.logsigmoid(x @ p["f.w"].T + p["f.b"]).transpose(1, 2)
    o = torch_forgetting_attention(q, k, v, log_f)
    return o.transpose(1, 2).reshape(b, n, E) @ p["o.w"].T + p["o.b"]


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_fox_layer_matches_the_official_equations(num_kv_heads):
    minitx.manual_seed(0)
    mine = params_to_float64(REGISTRY["fox"](E, H, causal=True, num_kv_heads=num_kv_heads))
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "f": "forget_linear"}
    p = {}
    for short, attr in names.items():
        lin = getattr(mine, attr)
        p[f"{short}.w"] = torch.tensor(to_host(lin.weight.data), requires_grad=True)
        p[f"{short}.b"] = torch.tensor(to_host(lin.bias.data), requires_grad=True)
    x = np.random.default_rng(3).standard_normal((2, 11, E))
    xt, xm = torch.tensor(x, requires_grad=True), tensor(x, requires_grad=True)
    ref, out = torch_fox_layer(xt, p, num_kv_heads), mine(xm)
    close(out, ref)
    g = np.random.default_rng(4).standard_normal(ref.shape)
    ref.backward(torch.tensor(g))
    out.backward(tensor(g))
    close(xm.grad, xt.grad)
    for short, attr in names.items():
        close(getattr(mine, attr).weight.grad, p[f"{short}.w"].grad)
        close(getattr(mine, attr).bias.grad, p[f"{short}.b"].grad)


def test_fox_attend_gradients_match_the_official_equations():
    mine = params_to_float64(REGISTRY["fox"](E, H, causal=True))
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((2, H, 7, D)) for _ in range(3)]
    arrays.append(-rng.uniform(0.0, 3.0, (2, H, 7)))
    ours = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = mine.attend(*ours[:3], log_forget=ours[3])
    ref = torch_forgetting_attention(*theirs)
    close(out, ref)
    g = rng.standard_normal(ref.shape)
    ref.backward(torch.tensor(g))
    out.backward(tensor(g))
    for a, b in zip(ours, theirs):
        close(a.grad, b.grad)


# ---- lightning attention: MiniMax's own module and its block equations ---------------------

def torch_lightning_blocks(q, k, v, slopes, block):
    """MiniMax's block equations: query decay λ^i, key decay λ^{c−j}, diagonal decay λ^{i−j}
    (0 above), block decay λ^c; the state carried from block to block. s (H,) rates."""
    b, h, n, d = q.shape
    s = slopes[:, None, None]                                          # (H, 1, 1)
    state = torch.zeros(b, h, d, v.shape[-1], dtype=q.dtype)
    outs = []
    for start in range(0, n, block):
        qb, kb, vb = (t[:, :, start:start + block] for t in (q, k, v))
        c = qb.shape[2]
        i = torch.arange(1, c + 1, dtype=q.dtype)
        diff = i[:, None] - i[None, :]
        diag = torch.exp(torch.where(diff >= 0, -s * diff, float("-inf")))    # (H, c, c)
        intra = (qb @ kb.transpose(-1, -2) * diag) @ vb
        inter = (qb * torch.exp(-s * i[:, None])) @ state
        outs.append(intra + inter)
        state = state * torch.exp(-s * c) + (kb * torch.exp(-s * (c - i[:, None]))).transpose(
            -1, -2) @ vb
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("n,block", [(10, 4), (9, 3), (5, 8)])
def test_lightning_attend_matches_minimax_block_equations(n, block):
    mine = REGISTRY["lightning"](E, H, causal=True, block=block)
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((2, H, n, D)) for _ in range(3)]
    ours = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = mine.attend(*ours)
    ref = torch_lightning_blocks(*theirs, torch.tensor(mine.slopes), block)
    close(out, ref)
    g = rng.standard_normal(ref.shape)
    ref.backward(torch.tensor(g))
    out.backward(tensor(g))
    for a, b in zip(ours, theirs):
        close(a.grad, b.grad)


@pytest.mark.parametrize("layer_idx,num_layers,n,block", [(0, 3, 11, 4), (2, 3, 7, 2),
                                                          (1, 2, 6, 8)])
def test_lightning_matches_minimax_lightning_attention(layer_idx, num_layers, n, block):
    need("transformers")
    from transformers.models.minimax.configuration_minimax import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention
    config = MiniMaxConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=H,
                           head_dim=D, num_hidden_layers=num_layers, block_size=block,
                           hidden_act="linear")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)   # the decay buffers are made at construction
    try:
        hf = MiniMaxLightningAttention(config, layer_idx=layer_idx).eval()
    finally:
        torch.set_default_dtype(default)
    hf.norm = torch.nn.Identity()
    with torch.no_grad():
        hf.output_gate.weight.zero_()                               # σ(0) = ½ on every channel
    mine = params_to_float64(REGISTRY["lightning"](E, H, causal=True, block=block, bias=False,
                                                   layer_index=layer_idx,
                                                   num_layers=num_layers))
    # HF's fused projection: per head, D rows each of q, k and v
    w = hf.qkv_proj.weight.view(H, 3 * D, E)
    for i, name in enumerate("qkv"):
        to_minitx(getattr(mine, f"{name}_proj"), w[:, i * D:(i + 1) * D].reshape(E, E))
    to_minitx(mine.out_proj, hf.out_proj.weight * 0.5)              # the gate's ½, exactly
    x = np.random.default_rng(7).standard_normal((2, n, E))
    xt, xm = torch.tensor(x, requires_grad=True), tensor(x, requires_grad=True)
    ref = hf(xt, position_embeddings=None, attention_mask=None)[0]
    out = mine(xm)
    close(out, ref)
    g = np.random.default_rng(8).standard_normal(ref.shape)
    ref.backward(torch.tensor(g))
    out.backward(tensor(g))
    close(xm.grad, xt.grad)
    gw = hf.qkv_proj.weight.grad.view(H, 3 * D, E)
    for i, name in enumerate("qkv"):
        close(getattr(mine, f"{name}_proj").weight.grad,
              gw[:, i * D:(i + 1) * D].reshape(E, E))
