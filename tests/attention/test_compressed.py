"""DeepSeek-V4's compressed attention (``attention/compressed.py``): CSA and HCA against a dense
reference written here with loops — each compressed entry pooled slot by slot, each query's
chosen entries listed by sorting its index scores, one softmax over [window keys ∪ chosen
entries ∪ sink] per query — over a grid of lengths, compression rates, windows, top-k, head
counts and both causal settings; with m = 1, every entry read and a window over everything it
is causal softmax attention; decoding through its cache in any split equals the full forward;
float64 gradients reach q, the key/value head, the compressor and the sinks, and the indexer
learns from its own KL objective (written out here) in training only; the hooks show the
entries, the index scores, the chosen entries and the pattern, and a replaced score moves the
choice; the identities hold; bad options are named. The registry contract runs in
test_registry_contract.py; HF's ``DeepseekV4Attention`` is the oracle in
tests/oracles/test_torch_parity_deepseek_v4_attention.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.compressed import CompressedCache
from minitx.nn.layers import Identity
from minitx.nn.module import Parameter
from minitx.validate import OptionError
from support import assert_close, qkv, tensor, to_host

E, H = 16, 2
D = E // H
NAMES = ["compressed_sparse", "heavily_compressed"]


def layer(name, causal=True, seed=0, **options):
    """A float64 layer in eval mode, every parameter redrawn (biases, gains, sinks too)."""
    minitx.manual_seed(0)
    lay = REGISTRY[name](E, H, causal=causal, **options).to(dtype="float64").eval()
    g = np.random.default_rng(seed)
    for p in lay.parameters():
        p.data = tensor(g.standard_normal(p.shape) * 0.7).data
    return lay


def host(p):
    return to_host(p.data)


def rotate(x, pos, r, base):
    """x (…, D) with its last r dims turned in pairs by pos·θ_i, θ_i = base^(−2i/r), written
    as complex numbers (not minitx's code)."""
    if not r:
        return x
    y, d = x.copy(), x.shape[-1]
    z = x[..., d - r::2] + 1j * x[..., d - r + 1::2]
    z = z * np.exp(1j * pos * base ** (-np.arange(0, r, 2) / r))
    y[..., d - r::2], y[..., d - r + 1::2] = z.real, z.imag
    return y


def entries_by_loop(src, comp):
    """A compressor's entries of src (B, G, N, S), each entry from its list of slots."""
    m, d = comp.rate, comp.dim
    c, z = src @ host(comp.content.weight).T, src @ host(comp.gate.weight).T
    bias, gain, eps = host(comp.position_bias), host(comp.kv_norm.weight), comp.kv_norm.eps
    out = np.zeros(src.shape[:2] + (src.shape[2] // m, d))
    for w in range(src.shape[2] // m):
        slots = []     # (content, gate) rows: the a-halves of block w − 1, the b-halves of w
        if comp.overlap and w > 0:
            slots += [(c[:, :, s, :d], z[:, :, s, :d] + bias[s - (w - 1) * m, :d])
                      for s in range((w - 1) * m, w * m)]
        slots += [(c[:, :, s, -d:], z[:, :, s, -d:] + bias[s - w * m, -d:])
                  for s in range(w * m, (w + 1) * m)]
        gates = np.stack([gz for _, gz in slots])
        weights = np.exp(gates - gates.max(axis=0))
        weights /= weights.sum(axis=0)
        pooled = sum(a * cz for a, (cz, _) in zip(weights, slots))
        normed = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + eps) * gain
        out[:, :, w] = rotate(normed, w * m, comp.rope_dim, comp.rope_base)
    return out


def by_hand(lay, q, v):
    """The module docstring's o_t, query by query: (out (B, H, N, D), entries, index scores
    (B, N, M) or None, the chosen entries of each (b, t))."""
    b, h, n, d = q.shape
    g = h // v.shape[1]
    m, r, base = lay.compress, lay.rope_dim, lay.rope_base
    entries = entries_by_loop(v, lay.compressor)
    count = entries.shape[2]
    scores = None
    if lay.sparse:
        ix = lay.indexer
        merged = q.transpose(0, 2, 1, 3).reshape(b, n, h * d)
        qi = (merged @ host(ix.query.weight).T).reshape(b, n, ix.heads, ix.dim)
        qi = np.stack([rotate(qi[:, t], t, r, base) for t in range(n)], axis=1)
        ki = entries_by_loop(v.mean(axis=1)[:, None], ix.compressor)[:, 0]    # (B, M, d_I)
        w = merged @ host(ix.weights.weight).T / math.sqrt(ix.heads * ix.dim)
        scores = np.einsum("btj,btjw->btw", w, np.maximum(np.einsum("btjd,bwd->btjw", qi, ki),
                                                          0))
    chosen = {}
    for bb in range(b):
        for t in range(n):
            seen = [e for e in range(count) if not lay.causal or (e + 1) * m - 1 <= t]
            if lay.sparse:     # the k best, ties to the earlier entry
                seen = sorted(seen, key=lambda e: (-scores[bb, t, e], e))[:lay.top_k]
            chosen[bb, t] = sorted(seen)
    sinks = None if lay.sinks is None else host(lay.sinks)
    out = np.zeros_like(q)
    for bb in range(b):
        for hh in range(h):
            for t in range(n):
                near = [s for s in range(n) if (0 <= t - s < lay.window if lay.causal
                                                else abs(t - s) < lay.window)]
                keys = [rotate(v[bb, hh // g, s], s, r, base) for s in near]
                keys += [entries[bb, hh // g, e] for e in chosen[bb, t]]
                qt = rotate(q[bb, hh, t], t, r, base)
                logits = [qt @ k / math.sqrt(d) for k in keys]
                logits += [] if sinks is None else [sinks[hh]]
                p = np.exp(np.array(logits) - max(logits))
                p /= p.sum()
                out[bb, hh, t] = rotate(sum(pi * k for pi, k in zip(p, keys)), -t, r, base)
    return out, entries, scores, chosen


@settings(deadline=None, max_examples=30)
@given(name=st.sampled_from(NAMES), n=st.integers(1, 19), m=st.integers(1, 5),
       window=st.integers(1, 8), top_k=st.integers(1, 4), causal=st.booleans(),
       hkv=st.sampled_from([1, 2]), sinks=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_attend_equals_the_loops(name, n, m, window, top_k, causal, hkv, sinks, seed):
    options = {"top_k": top_k} if name == "compressed_sparse" else {}
    lay = layer(name, causal, seed, compress=m, window=window, sinks=sinks, rope_dim=4,
                **options)
    q, k, v = qkv(n, b=2, h=H, hkv=hkv, d=D, seed=seed)
    want, *_ = by_hand(lay, q, v)
    got = lay.attend(tensor(q), tensor(k), tensor(v))
    assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert_close(lay.reference(tensor(q).data, tensor(k).data, tensor(v).data), want,
                 atol=1e-12, rtol=1e-12)


def exact_limit(name, n):
    """m = 1, every entry read, a window of N, the content map the identity (the b-half; the
    a-half's gates −∞), no norm, rope or sink: every key is read twice, raw and as its own
    entry."""
    options = {"top_k": n} if name == "compressed_sparse" else {}
    lay = layer(name, True, compress=1, window=n, sinks=False, rope_dim=0, **options)
    comp = lay.compressor
    comp.kv_norm = Identity()
    identity = np.eye(D) if not comp.overlap else np.concatenate([np.zeros((D, D)), np.eye(D)])
    comp.content.weight.data = tensor(identity).data
    if comp.overlap:
        bias = np.zeros((1, 2 * D))
        bias[:, :D] = -np.inf
        comp.position_bias.data = tensor(bias).data
    return lay


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 6, 17])
def test_compression_of_one_with_everything_read_is_causal_attention(name, n):
    lay = exact_limit(name, n)
    q, _, v = qkv(n, b=2, h=H, d=D, seed=n)
    causal = np.tril(np.ones((n, n), dtype=bool))
    s = np.where(causal, q @ v.swapaxes(-1, -2) / math.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    assert_close(lay.attend(tensor(q), tensor(v), tensor(v)), want, atol=1e-12, rtol=1e-12)
    # the entries are the keys themselves, and a shorter window changes the answer
    seen = {}
    lay.hook_compressed.add_hook(lambda t, hook: seen.__setitem__("c", to_host(t)))
    lay.attend(tensor(q), tensor(v), tensor(v))
    assert_close(seen["c"], v, atol=1e-15)
    if n > 2:
        lay.window = 1
        assert not np.allclose(to_host(lay.attend(tensor(q), tensor(v), tensor(v))), want)


@settings(deadline=None, max_examples=25)
@given(name=st.sampled_from(NAMES), n=st.integers(1, 24), m=st.integers(1, 5),
       window=st.integers(1, 7), top_k=st.integers(1, 4),
       cuts=st.lists(st.integers(1, 23), max_size=4), hkv=st.sampled_from([1, 2]),
       seed=st.integers(0, 2 ** 16))
def test_decoding_in_any_split_equals_the_full_forward(name, n, m, window, top_k, cuts, hkv,
                                                       seed):
    options = {"top_k": top_k} if name == "compressed_sparse" else {}
    lay = layer(name, True, seed, compress=m, window=window, num_kv_heads=hkv, **options)
    x = np.random.default_rng(seed).standard_normal((2, n, E))
    with minitx.no_grad():
        full = to_host(lay(tensor(x)).data)
        cache = lay.new_cache()
        edges = sorted({0, n, *[c for c in cuts if c < n]})
        steps = [to_host(lay(tensor(x[:, a:b]), kv_cache=cache).data)
                 for a, b in zip(edges, edges[1:])]
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-12, rtol=1e-12)
    # what the cache keeps: the last w − 1 keys, every entry, the partial block's rows
    assert len(cache) == n
    assert cache.keys.shape[2] == min(n, window - 1)
    assert cache.compressor.count == n // m and cache.compressor.entries.shape[2] == n // m
    assert cache.compressor.pending[0].shape[2] == n % m
    if name == "compressed_sparse":
        assert cache.index.count == n // m and cache.index.entries.shape[-1] == lay.indexer.dim
        assert (cache.compressor.before is not None) == (n >= m)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_reach_q_the_head_the_compressor_and_the_sinks(name, causal):
    lay = layer(name, causal, 3, compress=2, window=3)
    q, k, v = qkv(9, b=1, h=H, hkv=1, d=D, scale=0.7, seed=4)
    comp = lay.compressor
    params = [Parameter(p.data.copy()) for p in
              (comp.content.weight, comp.gate.weight, comp.position_bias,
               comp.kv_norm.weight, lay.sinks)]

    def out(q_, v_, wc, wz, bias, gain, sinks):
        comp.content.weight, comp.gate.weight, comp.position_bias = wc, wz, bias
        comp.kv_norm.weight, lay.sinks = gain, sinks
        return lay.attend(q_, tensor(k), v_)
    minitx.gradcheck(out, (tensor(q, requires_grad=True), tensor(v, requires_grad=True),
                           *params))


@pytest.mark.parametrize("name", NAMES)
def test_hooks_show_the_entries_the_scores_the_choice_and_the_pattern(name):
    sparse = name == "compressed_sparse"
    lay = layer(name, True, 5, compress=3, window=4, **({"top_k": 2} if sparse else {}))
    n = 17
    q, k, v = qkv(n, b=2, h=H, hkv=1, d=D, seed=6)
    want, entries, scores, chosen = by_hand(lay, q, v)
    seen = {}

    def keep(key):
        return lambda t, hook: seen.__setitem__(key, to_host(t))
    lay.hook_compressed.add_hook(keep("entries"))
    lay.hook_selection.add_hook(keep("read"))
    lay.hook_pattern.add_hook(keep("pattern"))
    if sparse:
        lay.indexer.hook_index_scores.add_hook(keep("scores"))
        lay.indexer.hook_topk_indices.add_hook(keep("index"))
    out = to_host(lay.attend(tensor(q), tensor(k), tensor(v)).data)
    assert_close(out, want, atol=1e-12)
    assert_close(seen["entries"], entries, atol=1e-12)
    count = entries.shape[2]
    read = np.zeros((2, n, count), dtype=bool)
    for (b, t), es in chosen.items():
        read[b, t, es] = True
    assert np.array_equal(seen["read"], read)
    if sparse:
        visible = (np.arange(count)[None] + 1) * 3 - 1 <= np.arange(n)[:, None]
        assert_close(np.where(visible, seen["scores"], 0), np.where(visible, scores, 0),
                     atol=1e-12)
        assert np.all(seen["scores"][:, ~visible] == -np.inf)
        for (b, t), es in chosen.items():
            picked = seen["index"][b, t]
            assert sorted(picked[picked >= 0]) == es
    # the pattern: window keys then entries; the sink takes the rest of each row
    p = seen["pattern"]
    assert p.shape == (2, H, n, n + count)
    mass = p.sum(-1)
    assert np.all(mass < 1) and np.all(mass > 0)
    assert np.all(p[..., :n][:, :, ~((np.arange(n)[:, None] - np.arange(n)[None] >= 0) &
                                      (np.arange(n)[:, None] - np.arange(n)[None] < 4))] == 0)
    assert np.all(p[..., n:][np.broadcast_to(~read[:, None], p[..., n:].shape)] == 0)


def test_a_replaced_index_score_moves_the_choice():
    """The choice follows ``hook_index_scores``: scores that favour the earliest entries make
    every query read its first k visible entries."""
    lay = layer("compressed_sparse", True, 7, compress=2, window=2, top_k=2)
    n = 14
    q, k, v = qkv(n, b=1, h=H, d=D, seed=8)
    seen = {}
    lay.hook_selection.add_hook(lambda t, hook: seen.__setitem__("read", to_host(t)))
    before = to_host(lay.attend(tensor(q), tensor(k), tensor(v)).data)
    favour = tensor(-np.arange(n // 2, dtype=float)[None, None] * np.ones((1, n, 1)))
    lay.indexer.hook_index_scores.add_hook(
        lambda t, hook: minitx.functional.masked_fill(favour, t.data == -np.inf, -np.inf))
    after = to_host(lay.attend(tensor(q), tensor(k), tensor(v)).data)
    want = np.zeros((1, n, n // 2), dtype=bool)
    for t in range(n):
        want[0, t, :min(2, (t + 1) // 2)] = True
    assert np.array_equal(seen["read"], want)
    assert not np.allclose(before, after)


def test_the_cache_refuses_what_it_cannot_continue():
    lay = layer("heavily_compressed", True)
    x = tensor(np.zeros((1, 3, E)))
    with pytest.raises(OptionError, match="CompressedCache"):
        lay(x, kv_cache=minitx.attention.KVCache())
    with pytest.raises(OptionError, match="CompressedCache"):
        lay(x, kv_cache=layer("compressed_sparse", True).new_cache())
    with pytest.raises(OptionError, match="causal=True"):
        layer("heavily_compressed", False)(x, kv_cache=CompressedCache(8, False))


BAD = [("compress", [0, -1, 2.5, True, "4"]), ("window", [0, 1.5, "8"]),
       ("rope_dim", [3, -2, 1.5, 10]), ("rope_base", [0, -1.0, math.nan]),
       ("sinks", ["yes", 1]), ("eps", [0, -1e-6])]
SPARSE_BAD = [("top_k", [0, 1.5, None]), ("indexer_heads", [0, "4"]),
              ("indexer_dim", [0, 1, 2.5]), ("indexer_loss_weight", [-1.0, "1"])]


@pytest.mark.parametrize("name,option,value",
                         [(n, o, v) for n in NAMES for o, vs in BAD for v in vs]
                         + [("compressed_sparse", o, v) for o, vs in SPARSE_BAD for v in vs])
def test_bad_options_are_named(name, option, value):
    with pytest.raises((ValueError, TypeError)) as info:
        REGISTRY[name](E, H, **({option: value} if option != "indexer_dim" else
                                {option: value, "rope_dim": 4}))
    assert option in str(info.value) and str(value) in str(info.value), str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_identities_hold(name):
    for claim, value, limit in REGISTRY[name].identities():
        assert value <= limit, (claim, value, limit)


def test_the_indexer_learns_from_its_own_loss():
    """In training the output is unchanged and the indexer's weights get the gradient of its
    KL objective (the attention's mass on the chosen entries against the indexer's softmax on
    them, written out here); in eval, or with weight 0, they get none."""
    lay = layer("compressed_sparse", True, 9, compress=2, window=3, top_k=2)
    n = 12
    q, k, v = qkv(n, b=2, h=H, d=D, seed=10)
    want, _, scores, chosen = by_hand(lay, q, v)
    seen = {}
    lay.hook_pattern.add_hook(lambda t, hook: seen.__setitem__("p", to_host(t)))
    lay.train()
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    assert_close(out, want, atol=1e-12)
    out.sum().backward()
    indexer = dict(lay.indexer.named_parameters())
    assert all(np.any(to_host(p.grad.data)) for p in indexer.values()), list(indexer)
    # the objective by hand: KL per query over its chosen entries, the mean over all queries
    probs = seen["p"][..., n:].sum(axis=1)                                   # (B, Nq, M)
    total = 0.0
    for (b, t), es in chosen.items():
        if es:
            target = probs[b, t, es] / probs[b, t, es].sum()
            logq = scores[b, t, es] - np.log(np.exp(scores[b, t, es]).sum())
            total += (target * (np.log(target) - logq)).sum()
    qt, vt = tensor(q), tensor(v)
    src = lay.sources(qt, vt)
    read = np.zeros(probs.shape, dtype=bool)
    for (b, t), es in chosen.items():
        read[b, t, es] = True
    loss = lay.indexer.loss(src["index_query"], src["index_weights"], src["index_keys"],
                            np.arange(n), tensor(read, dtype=None).data,
                            tensor(seen["p"][..., n:]).data)
    assert_close(loss, total / (2 * n), atol=1e-12)
    # its gradient, float64, in the indexer's weights
    params = [minitx.nn.Parameter(p.data.copy()) for p in
              (lay.indexer.query.weight, lay.indexer.weights.weight,
               lay.indexer.compressor.content.weight, lay.indexer.compressor.position_bias)]

    def objective(wq, ww, wc, bias):
        lay.indexer.query.weight, lay.indexer.weights.weight = wq, ww
        lay.indexer.compressor.content.weight, lay.indexer.compressor.position_bias = wc, bias
        return lay.indexer.loss(src["index_query"], src["index_weights"], src["index_keys"],
                                np.arange(n), tensor(read, dtype=None).data,
                                tensor(seen["p"][..., n:]).data)
    minitx.gradcheck(objective, tuple(params))
    # eval, or weight 0: no gradient reaches the indexer
    for p in lay.indexer.parameters():
        p.grad = None
    for switch in (lambda: lay.eval(), lambda: setattr(lay, "indexer_loss_weight", 0.0)):
        lay.train()
        switch()
        lay.attend(tensor(q), tensor(k), tensor(v, requires_grad=True)).sum().backward()
        assert all(p.grad is None for p in lay.indexer.parameters())
