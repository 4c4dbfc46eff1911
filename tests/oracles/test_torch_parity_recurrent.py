r"""PyTorch parity for four attention variants that PyTorch composes from its own ops: retention,
the delta rule (deltanet), state-space duality (ssd) and attention sinks (sink).

The torch side of each is written here from the papers' equations as each variant's docstring
states them — not from minitx's code: the dense masked forms for retention, SSD and sinks, a
per-token loop for the delta rule (its definition; minitx computes it chunkwise through a
triangular solve). minitx's parameters are copied into torch tensors; everything is float64.

Compared: ``layer.attend(q, k, v)`` (max |Δ| ≤ 1e-10) and, through ``.backward()`` of the
same random cotangent on both sides, the gradients of q, k, v and of the variant's own
parameters (deltanet's β weights, SSD's Δ and A parameters) (max |Δ| ≤ 1e-9), on a
hypothesis grid: N = 1 … 24, H ∈ {1, 2, 4} with H ≠ Hkv (grouped heads: query head h reads
key/value head h // (H/Hkv)), causal and non-causal (each variant's documented extension),
the chunk sizes of the chunkwise forms, and for sinks Nq ≤ Nk, RoPE on and off. Then the whole
layer ``layer(x)`` (projections, heads, attend, output projection) against the same torch
composition, with the gradients of x and of every parameter. SSD's ``share="bc"`` (Mamba-2's
``ngroups``: C and B per group, X per head) is compared with Mamba-2's step-by-step recurrence.
"""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY
from support import tensor, to_host, need

torch = need("torch")
OUT_TOL = 1e-10        # outputs
GRAD_TOL = 1e-9        # gradients: one more pass through the same sums


def close(mine, theirs, tol):
    mine, theirs = to_host(mine), theirs.detach().numpy()
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() <= tol, np.abs(mine - theirs).max()


def heads_of(q, k, v):
    """Repeat key/value heads for grouped queries: query head h reads kv head h // (H/Hkv)."""
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


# ---- retention (Sun et al. 2023): the parallel form ---------------------------------------

def torch_retention(q, k, v, causal, p=None):
    r"""O = (Q Kᵀ/√D ⊙ D) V, D_nm = γ_h^{n−m} for n ≥ m (0 above), γ_h = 1 − 2^(−5−h);
    non-causal (minitx's extension): D_nm = γ_h^{|n−m|}."""
    k, v = heads_of(q, k, v)
    h, n, d = q.shape[1], q.shape[2], q.shape[3]
    gamma = 1.0 - 2.0 ** (-5.0 - torch.arange(h, dtype=torch.float64))        # (H,)
    pos = torch.arange(n)
    dist = pos[:, None] - pos[None, :]                                        # n − m
    decay = gamma[:, None, None] ** dist.abs()                                # (H, N, N)
    if causal:
        decay = decay * (dist >= 0)
    return (q @ k.transpose(-1, -2) / math.sqrt(d) * decay) @ v


# ---- the delta rule (Schlag et al. 2021; Yang et al. 2024): the recurrence ----------------

def unit(x, eps):
    """x/√(‖x‖² + ε) over the last axis (the layer's documented normalisation)."""
    return x / torch.sqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 + eps)


def torch_deltanet(q, k, v, causal, p):
    r"""S_t = S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = τ S_t q_t (column vectors,
    S (Dv, Dk), S_0 = 0), unit q_t, k_t, β_t = σ(w_h·k̃_t + b_h) from the raw key k̃_t,
    τ = 1/√D (the official kernel's scale). Non-causal (minitx's extension): o_t = τ S_N q_t."""
    k_raw, v = heads_of(q, k, v)
    beta = torch.sigmoid(torch.einsum("bhnd,hd->bhn", k_raw, p["beta_weight"])
                         + p["beta_bias"][None, :, None])                      # (B, H, N)
    q, k = unit(q, p["eps"]) / math.sqrt(q.shape[-1]), unit(k_raw, p["eps"])
    b, h, n, dk = k.shape
    eye = torch.eye(dk, dtype=torch.float64)
    s = torch.zeros(b, h, v.shape[-1], dk, dtype=torch.float64)               # (B, H, Dv, Dk)
    outs = []
    for t in range(n):
        kt, vt, bt = k[:, :, t, :, None], v[:, :, t, :, None], beta[:, :, t, None, None]
        s = s @ (eye - bt * kt @ kt.transpose(-1, -2)) + bt * vt @ kt.transpose(-1, -2)
        outs.append((s @ q[:, :, t, :, None])[..., 0])                        # (B, H, Dv)
    if not causal:
        return (s @ q.transpose(-1, -2)).transpose(-1, -2)                    # S_N q_t
    return torch.stack(outs, dim=2)


# ---- SSD (Dao & Gu 2024): the masked-attention (quadratic) form --------------------------

def torch_ssd(q, k, v, causal, p):
    r"""Y = (L ⊙ C B̄ᵀ) X, C = q, B̄_t = Δ_t k_t, X = v, L_ts = a_{s+1} ··· a_t (t ≥ s),
    Δ_t = softplus(w_h·v_t + b_h), a_t = exp(−Δ_t exp(A_log_h)). Non-causal (minitx's
    extension): the symmetric mask L_ts = L_st."""
    k, v = heads_of(q, k, v)
    n = q.shape[2]
    # threshold 50: torch's softplus returns x itself above its threshold (20 by default),
    # which is log(1 + eˣ) only to e^(−20) ≈ 2e-9
    dt = torch.nn.functional.softplus(torch.einsum("bhnd,hd->bhn", v, p["dt_weight"])
                                      + p["dt_bias"][None, :, None], threshold=50)
    log_a = -dt * torch.exp(p["A_log"])[None, :, None]                        # (B, H, N)
    # L_ts = exp(Σ_{s<r≤t} log a_r): the −inf above the diagonal makes exp give 0 there
    total = torch.cumsum(log_a, dim=-1)
    below = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.exp((total[..., :, None] - total[..., None, :]).masked_fill(~below, -math.inf))
    if not causal:
        mask = mask + mask.transpose(-1, -2) - torch.eye(n, dtype=torch.float64)
    return (mask * (q @ (k * dt[..., None]).transpose(-1, -2))) @ v


def torch_mamba2_grouped(c, b, x, causal, p):
    r"""Mamba-2's ``ngroups`` layout as its step-by-step reference writes it: C, B (Bt, G, T, N)
    per group, x (Bt, H, T, P) per head, head h reading group h // (H/G);
    dA = exp(Δ A), A = −exp(A_log), state ← state · dA + (Δ B)ᵀ x, y = C · state. Δ from the
    head's own x (this layer's parameterisation). Causal only (the recurrence)."""
    assert causal
    h = x.shape[1]
    c, b = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (c, b))
    dt = torch.nn.functional.softplus(torch.einsum("bhnd,hd->bhn", x, p["dt_weight"])
                                      + p["dt_bias"][None, :, None], threshold=50)
    big_a = -torch.exp(p["A_log"])                                            # (H,)
    state = torch.zeros(x.shape[0], h, b.shape[-1], x.shape[-1], dtype=torch.float64)
    ys = []
    for t in range(x.shape[2]):
        d_a = torch.exp(dt[:, :, t] * big_a)[..., None, None]                 # (Bt, H, 1, 1)
        d_b = dt[:, :, t, None] * b[:, :, t]                                  # (Bt, H, N)
        state = state * d_a + d_b[..., :, None] * x[:, :, t, None, :]
        ys.append(torch.einsum("bhn,bhnp->bhp", c[:, :, t], state))
    return torch.stack(ys, dim=2)


# ---- attention sinks (Xiao et al. 2023): dense softmax, RoPE by cache slot ---------------

def rope(x, positions, base):
    """Rotate interleaved pairs (x_2i, x_2i+1) of x (…, N, D) by positions·base^(−2i/D)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * theta                      # (N, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def sink_allowed(i, j, s, w, causal):
    """Query i sees key j iff j ≤ i and (j < s or i − j < w); non-causal: j < s or |i − j| < w."""
    if causal:
        return (j <= i) & ((j < s) | (i - j < w))
    return (j < s) | ((i - j).abs() < w)


def torch_sink(q, k, v, causal, p):
    r"""softmax(S + M) V over keys 0 … Nk − 1, queries at the last Nq positions. With RoPE,
    S_ij = ⟨R_{c(i)} q_i, R_{c(i) − d_ij} k_j⟩/√D: a window key at distance d_ij = i − j (both
    rotated by their positions), a sink key j < s by its cache slot j with the query at its
    slot c(i) = min(i, s + w − 1)."""
    k, v = heads_of(q, k, v)
    s, w = p["num_sinks"], p["window"]
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    i, j = torch.arange(nk - nq, nk), torch.arange(nk)
    allowed = sink_allowed(i[:, None], j[None, :], s, w, causal)               # (Nq, Nk)
    if not p["rope"]:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    kr = rope(k, j, p["base"])
    window_scores = rope(q, i, p["base"]) @ kr.transpose(-1, -2)
    sink_scores = rope(q, torch.clamp(i, max=s + w - 1), p["base"]) @ kr.transpose(-1, -2)
    scores = torch.where(j[None, :] < s, sink_scores, window_scores) / math.sqrt(d)
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1) @ v


# ---- the comparison ------------------------------------------------------------------------

TORCH = {"retention": torch_retention, "deltanet": torch_deltanet, "ssd": torch_ssd,
         "sink": torch_sink}
OWN = {"retention": (), "deltanet": ("beta_weight", "beta_bias"),
       "ssd": ("dt_weight", "dt_bias", "A_log"), "sink": ()}


def build(name, h, hkv, d, causal, seed, **options):
    """The layer in float64, its own parameters set to random values of a useful size (so
    that β, Δ and the decays vary from token to token), and its torch-side settings."""
    minitx.manual_seed(seed)
    layer = REGISTRY[name](h * d, h, causal=causal, num_kv_heads=hkv, **options).double()
    g = np.random.default_rng(seed + 1)
    for attr in OWN[name]:
        par = getattr(layer, attr)
        par.copy_(g.standard_normal(par.shape) * 0.7)
    settings = {"eps": getattr(layer, "eps", None)}
    if name == "sink":
        settings.update(num_sinks=layer.num_sinks, window=layer.window, rope=layer.rope,
                        base=layer.base)
    return layer, settings


def torch_own(layer, name):
    """The variant's own parameters as torch leaves requiring grad."""
    return {a: torch.tensor(to_host(getattr(layer, a).data), requires_grad=True)
            for a in OWN[name]}


def check_attend(name, layer, settings, b, nq, nk, hkv, seed):
    """attend and its gradients (q, k, v and the variant's own parameters) against torch."""
    h, d = layer.num_heads, layer.head_dim
    g = np.random.default_rng(seed)
    arrays = [g.standard_normal(s) for s in ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d))]
    mine = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    own = torch_own(layer, name)
    out = layer.attend(*mine)
    ref = TORCH[name](*theirs, layer.causal, {**settings, **own})
    close(out, ref, OUT_TOL)
    # the same cotangent on both sides, then every gradient
    cot = g.standard_normal(ref.shape)
    (out * tensor(cot)).sum().backward()
    (ref * torch.tensor(cot)).sum().backward()
    for a, t in zip(mine, theirs):
        close(a.grad, t.grad, GRAD_TOL)
    for attr, t in own.items():
        close(getattr(layer, attr).grad, t.grad, GRAD_TOL)


HEADS = st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1)])          # (H, Hkv)


@given(n=st.integers(1, 24), heads=HEADS, d=st.sampled_from([2, 4, 6]), b=st.integers(1, 2),
       causal=st.booleans(), chunk=st.sampled_from([None, 1, 5]), seed=st.integers(0, 2**16))
def test_retention_matches_its_parallel_form_in_torch(n, heads, d, b, causal, chunk, seed):
    layer, settings = build("retention", *heads, d, causal, seed,
                            chunk_size=chunk if causal else None)   # chunkwise: causal only
    check_attend("retention", layer, settings, b, n, n, heads[1], seed)


@given(n=st.integers(1, 24), heads=HEADS, d=st.sampled_from([2, 4, 6]), b=st.integers(1, 2),
       causal=st.booleans(), chunk=st.sampled_from([None, 1, 5, 16]),
       seed=st.integers(0, 2**16))
def test_deltanet_matches_the_delta_rule_recurrence_in_torch(n, heads, d, b, causal, chunk,
                                                             seed):
    layer, settings = build("deltanet", *heads, d, causal, seed, chunk_size=chunk)
    check_attend("deltanet", layer, settings, b, n, n, heads[1], seed)


@given(n=st.integers(1, 24), heads=HEADS, d=st.sampled_from([2, 4, 6]), b=st.integers(1, 2),
       causal=st.booleans(), chunk=st.sampled_from([None, 1, 5]), seed=st.integers(0, 2**16))
def test_ssd_matches_its_masked_attention_form_in_torch(n, heads, d, b, causal, chunk, seed):
    layer, settings = build("ssd", *heads, d, causal, seed,
                            chunk_size=chunk if causal else None)   # chunked: causal only
    check_attend("ssd", layer, settings, b, n, n, heads[1], seed)


@given(n=st.integers(1, 16), heads=HEADS, d=st.sampled_from([2, 4]), b=st.integers(1, 2),
       chunk=st.sampled_from([None, 1, 5]), seed=st.integers(0, 2**16))
def test_ssd_share_bc_matches_mamba2s_grouped_recurrence_in_torch(n, heads, d, b, chunk,
                                                                   seed):
    """``share="bc"``: q, k (C, B) with the Hkv groups, v (X) with the H heads."""
    h, g = heads
    layer, settings = build("ssd", h, g, d, True, seed, chunk_size=chunk, share="bc")
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in ((b, g, n, d), (b, g, n, d), (b, h, n, d))]
    mine = [tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    own = torch_own(layer, "ssd")
    out, ref = layer.attend(*mine), torch_mamba2_grouped(*theirs, True, {**settings, **own})
    close(out, ref, OUT_TOL)
    cot = rng.standard_normal(ref.shape)
    (out * tensor(cot)).sum().backward()
    (ref * torch.tensor(cot)).sum().backward()
    for a, t in zip(mine, theirs):
        close(a.grad, t.grad, GRAD_TOL)
    for attr, t in own.items():
        close(getattr(layer, attr).grad, t.grad, GRAD_TOL)


@given(nk=st.integers(1, 24), data=st.data(), heads=HEADS, d=st.sampled_from([2, 4, 6]),
       b=st.integers(1, 2), causal=st.booleans(), sinks=st.integers(0, 4),
       window=st.integers(1, 8), rope_on=st.booleans(), seed=st.integers(0, 2**16))
def test_sink_matches_dense_softmax_with_rope_by_cache_slot_in_torch(nk, data, heads, d, b,
                                                                     causal, sinks, window,
                                                                     rope_on, seed):
    nq = data.draw(st.integers(1, nk), label="nq")          # queries at the last nq positions
    layer, settings = build("sink", *heads, d, causal, seed, num_sinks=sinks, window=window,
                            rope=rope_on)
    check_attend("sink", layer, settings, b, nq, nk, heads[1], seed)


# ---- the whole layer: projections, heads, attend, output projection -------------------------

def torch_layer(name, p, x, layer, settings):
    """x (B, N, E) → (B, N, E) in torch with the layer's weights (y = x Wᵀ + b)."""
    b, n, e = x.shape
    h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim

    def heads(proj, count):                                   # (B, N, E') -> (B, count, N, D)
        y = torch.nn.functional.linear(x, p[proj + ".weight"], p[proj + ".bias"])
        return y.view(b, n, count, d).transpose(1, 2)

    q, k, v = heads("q_proj", h), heads("k_proj", hkv), heads("v_proj", hkv)
    z = TORCH[name](q, k, v, layer.causal, {**settings, **p})                  # (B, H, N, D)
    z = z.transpose(1, 2).reshape(b, n, e)
    return torch.nn.functional.linear(z, p["out_proj.weight"], p["out_proj.bias"])


LAYERS = {"retention": {}, "deltanet": {"chunk_size": 4}, "ssd": {"chunk_size": 4},
          "sink": {"num_sinks": 2, "window": 3}}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(LAYERS))
def test_the_whole_layer_matches_torch_with_the_same_weights(name, causal):
    layer, settings = build(name, 4, 2, 4, causal, 3, **LAYERS[name])
    p = {n: torch.tensor(to_host(par.data), requires_grad=True)
         for n, par in layer.named_parameters()}
    g = np.random.default_rng(4)
    x_host = g.standard_normal((2, 11, 16))
    x, xt = tensor(x_host, requires_grad=True), torch.tensor(x_host, requires_grad=True)
    y, yt = layer(x), torch_layer(name, p, xt, layer, settings)
    close(y, yt, OUT_TOL)
    cot = g.standard_normal(yt.shape)
    (y * tensor(cot)).sum().backward()
    (yt * torch.tensor(cot)).sum().backward()
    close(x.grad, xt.grad, GRAD_TOL)
    for n, par in layer.named_parameters():
        close(par.grad, p[n].grad, GRAD_TOL)
