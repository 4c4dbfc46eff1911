r"""PyTorch parity for the variants that choose their keys: dsa, moba, nsa.

The torch side of each is transcribed here from the papers' official reference code — its
equations, not its code, and not from minitx's:

- DSA: DeepSeek-V3.2-Exp's ``inference/model.py`` — the indexer's score
  Σ_j w_{t,j} ReLU(q^I_{t,j}·k^I_s) with w = W_w x · h_I^{−1/2} · d_I^{−1/2}, a causal −inf
  mask added before ``topk(min(index_topk, end_pos))``, and the attention masked by a −inf
  matrix into which the chosen indices are scattered as 0; then the indexer's KL loss of the
  paper (the attention summed over heads, L1-normalised, against the indexer's softmax on the
  chosen keys). The indexer reads minitx's inputs (the query heads, the mean key head), as its
  docstring states;
- MoBA: MoonshotAI's ``moba_naive`` — the gate q·(block mean of k), −inf for the blocks
  ending after the query's block, +inf for its own, ``topk(min(moba_topk, num_block))``, the
  selected blocks' gate set to 0 and the others to −inf, repeated over each block's keys, a
  lower-triangular mask, one softmax; minitx's ``top_k`` is ``moba_topk − 1`` (MoBA counts
  the own block);
- NSA: flash-linear-attention's naive NSA — mean-pooled blocks, compressed attention to the
  blocks with (i + 1)·b − 1 ≤ t, block scores the compressed softmax averaged over the query
  heads of a key/value head with the own, previous and first blocks set to 1, ``topk``, the
  chosen keys attended causally, a causal window of w keys; the gates σ(q W_g + b_g) are
  minitx's (the reference takes gates as inputs).

Everything is float64. Compared: ``layer.attend(q, k, v)`` and, through ``.backward()`` of
the same random cotangent, the gradients of q, k, v (and of NSA's gate parameters), on a
hypothesis grid of N, heads (grouped key/value heads), blocks, top-k and windows; causal (the
references are causal only). A top-k whose boundary falls on a tie is ambiguous (PyTorch's
``topk`` does not order ties), so such draws are discarded by ``assume``.
"""
import math

import numpy as np
from hypothesis import assume, given, strategies as st

import minitx
from minitx.attention import REGISTRY
from support import params_to_float64, tensor, to_host, need

torch = need("torch")
OUT_TOL = 1e-12
GRAD_TOL = 1e-11
D = 4


def close(mine, theirs, tol):
    """max |Δ| ≤ tol (infinities must match)."""
    np.testing.assert_allclose(to_host(mine), theirs.detach().numpy(), rtol=0, atol=tol)


def build(name, h, hkv, **options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY[name](h * D, h, causal=True, num_kv_heads=hkv,
                                            **options)).eval()


def inputs(b, h, hkv, n, seed):
    g = np.random.default_rng(seed)
    return [g.standard_normal((b, heads, n, D)) for heads in (h, hkv, hkv)] + \
        [g.standard_normal((b, h, n, D))]


def compare(layer, arrays, torch_fn, params=()):
    """attend and torch_fn(q, k, v) on the same arrays; outputs and gradients."""
    q, k, v, cot = arrays
    mine = [tensor(a, requires_grad=True) for a in (q, k, v)]
    out = layer.attend(*mine)
    (out * tensor(cot)).sum().backward()
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    extra = [torch.tensor(to_host(p.data), requires_grad=True) for p in params]
    ref = torch_fn(*theirs, *extra)
    (ref * torch.tensor(cot)).sum().backward()
    close(out, ref, OUT_TOL)
    for a, t in zip(mine, theirs):
        close(a.grad, t.grad, GRAD_TOL)
    for p, t in zip(params, extra):
        close(p.grad, t.grad, GRAD_TOL)


def heads_of(q, k, v):
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def no_tie_at(scores, k):
    """True when, in every row, the k-th largest finite score beats the next one."""
    s = np.sort(scores, axis=-1)[..., ::-1]
    if k >= s.shape[-1]:
        return True
    kth, nxt = s[..., k - 1], s[..., k]
    return bool(np.all(~np.isfinite(kth) | (kth > nxt)))


# ---- DSA: DeepSeek-V3.2-Exp's indexer, top-k and scattered index mask --------------------

def torch_index_scores(q, k, wq, wk, ww, hi, di):
    b, h, n, d = q.shape
    x = q.transpose(1, 2).reshape(b, n, h * d)                 # the query heads, concatenated
    qi = (x @ wq.T).view(b, n, hi, di)
    ki = k.mean(dim=1) @ wk.T                                   # (B, N, d_I)
    weights = (x @ ww.T) * hi ** -0.5 * di ** -0.5              # weights_proj · n^−½ · scale
    logits = torch.relu(torch.einsum("bthd,bsd->btsh", qi, ki))
    score = torch.einsum("btsh,bth->bts", logits, weights)
    return score + torch.full((n, n), float("-inf")).triu(1)   # the causal mask


def torch_dsa(q, k, v, wq, wk, ww, hi, di, top_k):
    n = q.shape[2]
    score = torch_index_scores(q, k, wq, wk, ww, hi, di)
    chosen = score.topk(min(top_k, n), dim=-1)[1]
    index_mask = torch.full(score.shape, float("-inf")).scatter_(-1, chosen, 0.0)
    k, v = heads_of(q, k, v)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s + index_mask[:, None] + torch.full((n, n), float("-inf")).triu(1)
    return s.softmax(dim=-1) @ v


@given(n=st.integers(1, 24), heads=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
       top_k=st.integers(1, 10), hi=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_dsa_equals_deepseeks_indexer_and_masked_attention(n, heads, top_k, hi, seed):
    h, hkv = heads
    layer = build("dsa", h, hkv, top_k=top_k, indexer_heads=hi, indexer_dim=3)
    arrays = inputs(2, h, hkv, n, seed)
    w = [torch.tensor(to_host(m.weight.data)) for m in (layer.indexer_q, layer.indexer_k,
                                                        layer.indexer_w)]
    scores = torch_index_scores(*(torch.tensor(a) for a in arrays[:2]), *w, hi, 3)
    assume(no_tie_at(scores.numpy(), min(top_k, n)))
    with layer.hooks([("hook_index_scores", lambda t, hook: close(t, scores, 1e-12))]):
        layer.attend(*(tensor(a) for a in arrays[:3]))        # the indexer's scores agree
    compare(layer, arrays, lambda q, k, v: torch_dsa(q, k, v, *w, hi, 3, top_k))


@given(n=st.integers(2, 16), top_k=st.integers(1, 6), seed=st.integers(0, 2 ** 16))
def test_dsa_indexer_loss_equals_the_papers_kl(n, top_k, seed):
    layer = build("dsa", 2, 2, top_k=top_k, indexer_heads=2, indexer_dim=3)
    q, k, _, _ = inputs(1, 2, 2, n, seed)
    wt = [torch.tensor(to_host(m.weight.data), requires_grad=True)
          for m in (layer.indexer_q, layer.indexer_k, layer.indexer_w)]
    tq, tk = torch.tensor(q), torch.tensor(k)
    score = torch_index_scores(tq, tk, *wt, 2, 3)
    assume(no_tie_at(score.detach().numpy(), min(top_k, n)))
    chosen = score.topk(min(top_k, n), dim=-1)[1]                          # (B, N, c)
    index_mask = torch.full(score.shape, float("-inf")).scatter_(-1, chosen, 0.0)
    s = tq @ tk.transpose(-1, -2) / 2.0 + index_mask[:, None] \
        + torch.full((n, n), float("-inf")).triu(1)
    p = s.softmax(dim=-1).sum(dim=1)                                       # over heads
    p = p / p.sum(dim=-1, keepdim=True)                                    # L1-normalised
    logq = (score + index_mask).log_softmax(dim=-1)
    keep = torch.isfinite(score + index_mask)
    kl = torch.where(keep & (p > 0), p * (torch.log(p) - logq), torch.zeros(())).sum(-1)
    loss = kl.mean()
    loss.backward()
    mine = layer.indexer_loss(tensor(q), tensor(k))
    mine.backward()
    assert abs(float(to_host(mine)) - float(loss.detach())) <= 1e-12
    for m, t in zip((layer.indexer_q, layer.indexer_k, layer.indexer_w), wt):
        close(m.weight.grad, t.grad, 1e-11)


# ---- MoBA: moba_naive ----------------------------------------------------------------------

def torch_moba_naive(q, k, v, chunk, moba_topk):
    """MoBA's brute-force reference on (B, H, N, D) heads, one batch element at a time."""
    k, v = heads_of(q, k, v)
    out = []
    for b in range(q.shape[0]):
        q_, k_, v_ = (t[b].transpose(0, 1) for t in (q, k, v))           # [S, H, D]
        s = q_.shape[0]
        num_block = math.ceil(s / chunk)
        means = torch.cat([k_[i * chunk:min(s, (i + 1) * chunk)].mean(dim=0, keepdim=True)
                           for i in range(num_block)], dim=0)               # [N, H, D]
        gate = torch.einsum("shd,nhd->hsn", q_, means)
        gate = gate.clone()
        for i in range(num_block):
            gate[:, :(i + 1) * chunk, i] = float("-inf")     # blocks not yet finished
            gate[:, i * chunk:(i + 1) * chunk, i] = float("inf")   # the own block
        val, idx = torch.topk(gate, k=min(moba_topk, num_block), dim=-1, largest=True)
        val = val.min(dim=-1).values
        need = gate >= val.unsqueeze(-1)
        picked = torch.zeros(need.shape, dtype=torch.bool).scatter_(-1, idx, True)
        need = need & picked
        mask = torch.where(need, 0.0, float("-inf")).repeat_interleave(chunk, dim=-1)[:, :, :s]
        mask = mask.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        qk = torch.einsum("xhd,yhd->hxy", q_, k_)
        p = ((qk + mask) * q_.shape[-1] ** -0.5).softmax(dim=-1)
        out.append(torch.einsum("hxy,yhd->hxd", p, v_))
    return torch.stack(out)


@given(n=st.integers(1, 24), heads=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
       block=st.integers(1, 6), top_k=st.integers(0, 4), seed=st.integers(0, 2 ** 16))
def test_moba_equals_moba_naive(n, heads, block, top_k, seed):
    h, hkv = heads
    layer = build("moba", h, hkv, block=block, top_k=top_k)
    arrays = inputs(2, h, hkv, n, seed)
    compare(layer, arrays, lambda q, k, v: torch_moba_naive(q, k, v, block, top_k + 1))


# ---- NSA: flash-linear-attention's naive form ----------------------------------------------

def torch_nsa(q, k, v, gate_weight, gate_bias, block, top_k, window):
    b, h, n, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    scale = d ** -0.5
    nb = math.ceil(n / block)
    pad = nb * block - n
    pooled = [torch.nn.functional.pad(t, (0, 0, 0, pad)).view(b, hkv, nb, block, d).sum(3)
              / torch.tensor([min(block, n - i * block) for i in range(nb)],
                             dtype=torch.float64)[:, None] for t in (k, v)]
    k_cmp, v_cmp = (t.repeat_interleave(group, dim=1) for t in pooled)     # (B, H, nb, D)
    t_ = torch.arange(n)[:, None]
    s_ = torch.arange(nb)[None, :]
    allow = (s_ + 1) * block - 1 <= t_                                     # complete blocks
    logits = (q @ k_cmp.transpose(-1, -2) * scale).masked_fill(~allow, float("-inf"))
    probs = torch.nan_to_num(logits.softmax(dim=-1), nan=0.0)              # empty rows → 0
    o_cmp = probs @ v_cmp
    # block scores: the compressed probabilities averaged over a group, forced blocks 1
    scores = probs.view(b, hkv, group, n, nb).mean(dim=2)                  # (B, Hkv, N, nb)
    own = t_ // block
    current = (s_ == own) | (s_ == 0) | (s_ == own - 1)
    scores = torch.where(current, torch.ones(()), scores)
    idx = scores.topk(min(top_k, nb), dim=-1)[1]                           # (B, Hkv, N, S)
    ok = torch.gather((allow | current).expand(b, hkv, n, nb), -1, idx)
    idx = torch.where(ok, idx, -torch.ones((), dtype=torch.long))
    # the chosen keys, attended causally (the reference's loop over queries, as one mask)
    chosen = torch.zeros(b, hkv, n, nb + 1, dtype=torch.bool)
    chosen.scatter_(-1, torch.where(idx < 0, nb, idx), True)
    key_ok = chosen[..., :nb].repeat_interleave(block, dim=-1)[..., :n]    # (B, Hkv, N, N)
    key_ok = key_ok.repeat_interleave(group, dim=1) & torch.ones(n, n, dtype=torch.bool).tril()
    kf, vf = heads_of(q, k, v)
    s = (q @ kf.transpose(-1, -2)) * scale
    o_slc = s.masked_fill(~key_ok, float("-inf")).softmax(dim=-1) @ vf
    # the sliding window: flash-attention's window_size = (w − 1, 0), causal
    dist = t_ - torch.arange(n)[None, :]
    o_swa = s.masked_fill(~((dist >= 0) & (dist < window)), float("-inf")).softmax(-1) @ vf
    g = torch.sigmoid(torch.einsum("bhtd,hdc->bhtc", q, gate_weight) + gate_bias[:, None])
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_swa


@given(n=st.integers(1, 24), heads=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
       block=st.integers(1, 5), top_k=st.integers(3, 6), window=st.integers(1, 8),
       seed=st.integers(0, 2 ** 16))
def test_nsa_equals_the_naive_reference(n, heads, block, top_k, window, seed):
    h, hkv = heads
    layer = build("nsa", h, hkv, block=block, top_k=top_k, window=window)
    arrays = inputs(2, h, hkv, n, seed)
    compare(layer, arrays,
            lambda q, k, v, w, b_: torch_nsa(q, k, v, w, b_, block, top_k, window),
            params=(layer.gate_weight, layer.gate_bias))
