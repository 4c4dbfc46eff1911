r"""PyTorch parity for the gated delta rule: gated DeltaNet (Yang, Kautz & Hatamizadeh 2025)
and Kimi Delta Attention (Kimi Linear, 2025).

The torch side transcribes the equations of the official references (flash-linear-attention's
``naive_recurrent_gated_delta_rule`` / ``naive_recurrent_kda`` and its gate functions), in
their layout and orientation — tokens (B, T, H, K), the state (K, V), token by token — not
minitx's code (which works chunkwise, through a triangular solve and pairwise decay masks):

- the gates: g = −exp(A_log)·softplus(x + dt_bias), one per head (gated DeltaNet) or per head
  and key channel (KDA), and β = σ(·);
- q and k divided by √(‖·‖² + ε) (the official ``l2norm``), q times scale = 1/√K;
- each token: S ← S·exp(g) (per head, or row by row), S ← S + (β k) ⊗ (v − kᵀ S), o = qᵀ S.

What differs by design (the module docstring lists it) is fed in as minitx defines it: the
gate inputs come from the raw key head (x = u_h·k̃ or U_h k̃; β from w_h·k̃ + b_h) instead of
the official projections of the token, key/value heads are repeated for grouped queries, and
non-causal reads o_t = qᵀ S_N (minitx's extension). Everything is float64.

Compared: ``layer.attend(q, k, v)`` (max |Δ| ≤ 1e-10) and, through ``.backward()`` of one
random cotangent on both sides, the gradients of q, k, v and of the five gate parameters
(max |Δ| ≤ 1e-9), on a hypothesis grid (N = 1 … 24, (H, Hkv) with grouped heads, D, B,
causal and not, the chunk sizes); then the whole layer ``layer(x)`` with every parameter's
gradient.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY
from support import tensor, to_host, need

torch = need("torch")
OUT_TOL = 1e-10        # outputs
GRAD_TOL = 1e-9        # gradients: one more pass through the same sums
OWN = ("beta_weight", "beta_bias", "alpha_weight", "dt_bias", "A_log")


def softplus(x):
    # threshold 50: torch's softplus returns x itself above its threshold (20 by default),
    # which is log(1 + eˣ) only to e^(−20) ≈ 2e-9
    return torch.nn.functional.softplus(x, threshold=50)


def gdn_gate(x, a_log, dt_bias):
    """Gated DeltaNet's gate: g = −exp(A_log)·softplus(x + dt_bias); x (B, T, H)."""
    return -a_log.exp() * softplus(x + dt_bias)


def kda_gate(x, a_log, dt_bias):
    """KDA's gate, per channel: g = −exp(A_log_h)·softplus(x + dt_bias_h); x (B, T, H, K),
    dt_bias (H·K) viewed (H, K)."""
    h = x.shape[-2]
    return -a_log.view(h, 1).exp() * softplus(x + dt_bias.reshape(h, -1))


def l2norm(x, eps):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def naive_recurrent(q, k, v, g, beta, scale):
    r"""The official references' recurrence: q, k (B, T, H, K), v (B, T, H, V), g (B, T, H)
    or (B, T, H, K) (log decays), beta (B, T, H). S (B, H, K, V) from 0; each token
    S ← S·exp(g_t), S ← S + (β_t k_t) ⊗ (v_t − k_tᵀ S), o_t = (scale·q_t)ᵀ S.
    Returns (o (B, T, H, V), S_T)."""
    q = q * scale
    b, t_len, h, dk = q.shape
    s = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64)
    outs = []
    for t in range(t_len):
        g_t = g[:, t]
        decay = g_t[..., None, None].exp() if g_t.dim() == 2 else g_t[..., None].exp()
        s = s * decay
        k_t = k[:, t]
        error = v[:, t] - (k_t[..., None] * s).sum(-2)                      # v − kᵀ S
        s = s + torch.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k_t, error)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], s))
    return torch.stack(outs, dim=1), s


def torch_gated_delta(name, q, k, v, causal, p):
    """minitx's heads (B, H, N, D) through the official equations; → (B, H, N, D)."""
    rep = q.shape[1] // k.shape[1]
    k_raw, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # minitx's gate inputs (from the raw key head), then the official gate functions
    beta = torch.sigmoid(torch.einsum("bhnd,hd->bhn", k_raw, p["beta_weight"])
                         + p["beta_bias"][None, :, None])
    if name == "kda":
        x = torch.einsum("bhnd,hed->bnhe", k_raw, p["alpha_weight"])              # (B, T, H, K)
        g = kda_gate(x, p["A_log"], p["dt_bias"].reshape(-1))
    else:
        x = torch.einsum("bhnd,hd->bnh", k_raw, p["alpha_weight"])                # (B, T, H)
        g = gdn_gate(x, p["A_log"], p["dt_bias"])
    qt, kt = (l2norm(a, p["eps"]).transpose(1, 2) for a in (q, k_raw))         # (B, T, H, K)
    scale = q.shape[-1] ** -0.5
    o, s = naive_recurrent(qt, kt, v.transpose(1, 2), g, beta.transpose(1, 2), scale)
    if not causal:                              # minitx's extension: every query reads S_N
        return torch.einsum("bthk,bhkv->bhtv", qt * scale, s)
    return o.transpose(1, 2)


def build(name, h, hkv, d, causal, seed, **options):
    """The layer in float64, its gate parameters set to random values of a useful size (so
    that β and the decays vary from token to token)."""
    minitx.manual_seed(seed)
    layer = REGISTRY[name](h * d, h, causal=causal, num_kv_heads=hkv, **options).double()
    g = np.random.default_rng(seed + 1)
    for attr in OWN:
        par = getattr(layer, attr)
        par.copy_(g.standard_normal(par.shape) * 0.7)
    return layer


def close(mine, theirs, tol):
    mine, theirs = to_host(mine), theirs.detach().numpy()
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() <= tol, np.abs(mine - theirs).max()


HEADS = st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1)])          # (H, Hkv)


@pytest.mark.parametrize("name", ["gated_deltanet", "kda"])
@given(n=st.integers(1, 24), heads=HEADS, d=st.sampled_from([2, 4, 6]), b=st.integers(1, 2),
       causal=st.booleans(), chunk=st.sampled_from([None, 1, 5, 16]),
       seed=st.integers(0, 2**16))
def test_attend_matches_the_official_recurrence_in_torch(name, n, heads, d, b, causal, chunk,
                                                         seed):
    h, hkv = heads
    layer = build(name, h, hkv, d, causal, seed, chunk_size=chunk)
    g = np.random.default_rng(seed)
    arrays = [g.standard_normal(s) for s in ((b, h, n, d), (b, hkv, n, d), (b, hkv, n, d))]
    mine = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    own = {a: torch.tensor(to_host(getattr(layer, a).data), requires_grad=True) for a in OWN}
    out = layer.attend(*mine)
    ref = torch_gated_delta(name, *theirs, causal, {**own, "eps": layer.eps})
    close(out, ref, OUT_TOL)
    cot = g.standard_normal(ref.shape)
    (out * tensor(cot)).sum().backward()
    (ref * torch.tensor(cot)).sum().backward()
    for a, t in zip(mine, theirs):
        close(a.grad, t.grad, GRAD_TOL)
    for attr, t in own.items():
        close(getattr(layer, attr).grad, t.grad, GRAD_TOL)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["gated_deltanet", "kda"])
def test_the_whole_layer_matches_torch_with_the_same_weights(name, causal):
    layer = build(name, 4, 2, 4, causal, 3, chunk_size=4)
    p = {n: torch.tensor(to_host(par.data), requires_grad=True)
         for n, par in layer.named_parameters()}
    g = np.random.default_rng(4)
    x_host = g.standard_normal((2, 11, 16))
    x, xt = tensor(x_host, requires_grad=True), torch.tensor(x_host, requires_grad=True)

    def heads(proj, count):                                   # (B, N, E') -> (B, count, N, D)
        y = torch.nn.functional.linear(xt, p[proj + ".weight"], p[proj + ".bias"])
        return y.view(2, 11, count, 4).transpose(1, 2)

    z = torch_gated_delta(name, heads("q_proj", 4), heads("k_proj", 2), heads("v_proj", 2),
                          causal, {**p, "eps": layer.eps})
    yt = torch.nn.functional.linear(z.transpose(1, 2).reshape(2, 11, 16), p["out_proj.weight"],
                                    p["out_proj.bias"])
    y = layer(x)
    close(y, yt, OUT_TOL)
    cot = g.standard_normal(yt.shape)
    (y * tensor(cot)).sum().backward()
    (yt * torch.tensor(cot)).sum().backward()
    close(x.grad, xt.grad, GRAD_TOL)
    for n, par in layer.named_parameters():
        close(par.grad, p[n].grad, GRAD_TOL)
