"""The block indexer (Qwen4-Exp's indexed attention, ``attention/block_indexer.py``) against a
reference written here, query by query:

- the selection made explicit: the indexer from the layer's weights in NumPy, the mean of each
  complete block's keys, the scores, the top k by a sort, the tail; dense softmax attention
  under that (query, key) mask equals ``attend`` (hypothesis over lengths, blocks, k, causal,
  shared key/value heads);
- a top-k that keeps every block is dense causal attention (dense attention without
  ``causal``);
- decoding through the cache in any split equals the full forward;
- the hooks see the pooled keys, the block scores, the chosen blocks, the keys read and the
  pattern, and a replaced score moves the choice;
- float64 gradients of ``attend`` and of the indexer's loss match central differences, and the
  loss trains the indexer only;
- bad options are named.

The registry contract runs in test_registry_contract.py; HF's Qwen4-Exp indexer and attention
are the oracle in tests/oracles/test_torch_parity_block_indexer.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from support import assert_close, assert_equal, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, seed=0, **options):
    minitx.manual_seed(seed)
    lay = REGISTRY["block_indexer"](E, H, causal=causal, **options).double().eval()
    # norm weights away from their zero start, so that a missing 1 + γ shows
    rng = np.random.default_rng(seed + 100)
    for p in (lay.q_norm_weight, lay.k_norm_weight):
        p.data = tensor(rng.standard_normal(p.shape) * 0.3).data
    return lay


def host(p):
    return to_host(p.data)


def selection_by_hand(lay, q, k):
    """The keys each query reads, (B, Nq, Nk) bool, with the indexer's pieces, computed one
    query at a time from the rule (queries at the last Nq of Nk positions)."""
    b, h, nq, d = q.shape
    nk, c, kk = k.shape[2], lay.block, lay.top_k
    hi, di, eps = lay.indexer_heads, lay.indexer_dim, lay.norm_eps
    wq, wk = host(lay.indexer_q.weight), host(lay.indexer_k.weight)
    gq, gk = host(lay.q_norm_weight), host(lay.k_norm_weight)

    def norm(x, g):
        return x / math.sqrt((x * x).mean() + eps) * (1 + g)

    nb = nk // c
    pooled = np.zeros((b, nb, di))
    scores = np.full((b, nq, nb), -np.inf)
    read = np.zeros((b, nq, nk), dtype=bool)
    chosen_blocks = np.zeros((b, nq, nb), dtype=bool)
    for bi in range(b):
        ki = k[bi].mean(axis=0) @ wk.T                           # (Nk, d_I), the mean key head
        for i in range(nb):
            pooled[bi, i] = norm(ki[i * c:(i + 1) * c].mean(axis=0), gk)
        for t in range(nq):
            pos = nk - nq + t
            end = pos + 1 if lay.causal else nk                  # keys < end are visible
            qt = q[bi, :, t].reshape(-1) @ wq.T                  # [q_1 … q_H] → h_I·d_I
            heads = [norm(qt[j * di:(j + 1) * di], gq) for j in range(hi)]
            complete = [i for i in range(nb) if (i + 1) * c <= end]
            for i in complete:
                scores[bi, t, i] = sum(max(hq @ pooled[bi, i], 0.0)
                                       for hq in heads) / math.sqrt(di)
            # the k best complete blocks, ties to the lower block
            best = sorted(complete, key=lambda i: (-scores[bi, t, i], i))[:kk]
            for i in best:
                chosen_blocks[bi, t, i] = True
                read[bi, t, i * c:(i + 1) * c] = True
            # the tail: the keys after the last complete block, up to the last visible one
            read[bi, t, (end // c) * c:end] = True
    return read, pooled, scores, chosen_blocks


def margin(scores, chosen):
    """The smallest gap between a chosen and an unchosen complete block of one query."""
    gap = np.inf
    for at in np.ndindex(scores.shape[:-1]):
        row, pick = scores[at], chosen[at]
        ok = np.isfinite(row)
        if pick.any() and (ok & ~pick).any():
            gap = min(gap, row[pick].min() - row[ok & ~pick].max())
    return gap


# ---- the dense reference under the explicit selection -------------------------------------------

@settings(deadline=None, max_examples=40)
@given(nq=st.integers(1, 12), extra=st.integers(0, 14), c=st.integers(1, 5),
       kk=st.integers(1, 4), causal=st.booleans(), hkv=st.sampled_from([1, 2]),
       seed=st.integers(0, 2 ** 16))
def test_attend_is_dense_attention_under_the_explicit_selection(nq, extra, c, kk, causal, hkv,
                                                                 seed):
    nk = nq + extra if causal else nq
    lay = layer(causal, seed=seed % 7, block=c, top_k=kk, num_kv_heads=hkv)
    q, k, v = qkv(nq, nk, b=2, h=H, hkv=hkv, d=D, seed=seed)
    read, *_ = selection_by_hand(lay, q, k)
    if causal:                         # the rule never reads a future key: not imposed here
        assert not (read & ~np.tri(nq, nk, nk - nq, dtype=bool)).any()
    want = dense_attention_array(q, np.repeat(k, H // hkv, 1), np.repeat(v, H // hkv, 1),
                                 read[:, None])
    got = lay.attend(tensor(q), tensor(k), tensor(v))
    assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert_close(lay.reference(tensor(q).data, tensor(k).data, tensor(v).data), want,
                 atol=1e-12, rtol=1e-12)


@settings(deadline=None, max_examples=25)
@given(n=st.integers(1, 30), c=st.integers(1, 6), causal=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_top_k_over_every_block_is_dense_attention(n, c, causal, seed):
    lay = layer(causal, block=c, top_k=max(1, n // c))
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    allowed = np.tri(n, dtype=bool) if causal else np.ones((n, n), dtype=bool)
    assert_close(lay.attend(tensor(q), tensor(k), tensor(v)),
                 dense_attention_array(q, k, v, allowed), atol=1e-12, rtol=1e-12)


def test_a_sparse_choice_reads_fewer_keys_and_differs_from_dense():
    """k = 1 of blocks of 3 over 24 keys: at most 1·3 + 2 keys per query, and the output is not
    causal attention (the sparsity does something)."""
    lay = layer(True, block=3, top_k=1)
    q, k, v = qkv(24, b=1, h=H, d=D, seed=3)
    read, *_ = selection_by_hand(lay, q, k)
    assert read.sum(-1).max() <= 5 and read.sum(-1)[0, -1] == 3   # t = 23: one whole block
    out = to_host(lay.attend(tensor(q), tensor(k), tensor(v)))
    assert not np.allclose(out, dense_attention_array(q, k, v, np.tri(24, dtype=bool)))


# ---- decoding -----------------------------------------------------------------------------------

@settings(deadline=None, max_examples=25)
@given(cuts=st.lists(st.integers(1, 18), min_size=1, max_size=5, unique=True),
       c=st.integers(1, 5), kk=st.integers(1, 3))
def test_decoding_in_any_split_equals_the_full_forward(cuts, c, kk):
    lay = layer(True, block=c, top_k=kk, num_kv_heads=1)
    x = np.random.default_rng(c * 10 + kk).standard_normal((2, 19, E))
    with minitx.no_grad():
        full = lay(tensor(x)).numpy()
        cache, steps, start = lay.new_cache(), [], 0
        for end in sorted(cuts) + [19]:
            steps.append(lay(tensor(x[:, start:end]), kv_cache=cache).numpy())
            start = end
    assert len(cache) == 19
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-12, rtol=1e-12)


# ---- hooks --------------------------------------------------------------------------------------

def test_hooks_see_the_indexer_and_the_pattern():
    lay = layer(True, block=3, top_k=2)
    q, k, v = qkv(14, b=2, h=H, d=D, seed=5)
    read, pooled, scores, chosen = selection_by_hand(lay, q, k)
    seen = {}
    for name in ("hook_pooled_keys", "hook_block_scores", "hook_selection", "hook_keys_read",
                 "hook_pattern"):
        getattr(lay, name).add_hook(lambda t, hook, name=name:
                                    seen.__setitem__(name, to_host(t)))
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    assert_close(seen["hook_pooled_keys"], pooled, atol=1e-12)
    assert_close(seen["hook_block_scores"], scores, atol=1e-12)     # −inf where not complete
    assert_equal(seen["hook_selection"], chosen)
    assert_equal(seen["hook_keys_read"], read)
    pattern = seen["hook_pattern"]
    assert pattern.shape == (2, H, 14, 14) and np.all(pattern[~np.broadcast_to(
        read[:, None], pattern.shape)] == 0)
    assert_close(pattern.sum(-1), np.ones((2, H, 14)), atol=1e-12)
    # the pattern's path (dense under the mask) and the block path give the same output
    lay.reset_hooks()
    assert_close(out, lay.attend(tensor(q), tensor(k), tensor(v)), atol=1e-12)


def test_a_replaced_block_score_moves_the_choice():
    """Scores that put block 0 first for every query that has it: block 0 is chosen."""
    lay = layer(True, block=3, top_k=1)
    q, k, v = qkv(12, b=1, h=H, d=D, seed=6)

    def first(t, hook):
        s = to_host(t).copy()
        s[..., 0] = np.where(np.isfinite(s[..., 0]), 1e9, s[..., 0])
        return tensor(s)
    picked = {}
    lay.hook_block_scores.add_hook(first)
    lay.hook_selection.add_hook(lambda t, hook: picked.__setitem__("sel", to_host(t)))
    lay.attend(tensor(q), tensor(k), tensor(v))
    sel = picked["sel"][0]
    assert sel[2:, 0].all() and sel[2:].sum(-1).tolist() == [1] * 10     # t ≥ 2: block 0 only
    assert not sel[:2].any()                                            # no complete block yet


# ---- gradients ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n,c,kk,causal", [(7, 2, 1, True), (11, 3, 2, True),
                                           (9, 4, 1, False), (1, 2, 1, True)])
def test_gradcheck_attend(n, c, kk, causal):
    """float64 central differences for q, k and v; the inputs were checked to leave a margin
    of 1e-3 between chosen and unchosen blocks, so that the step of 1e-6 moves no choice."""
    lay = layer(causal, block=c, top_k=kk)
    q, k, v = qkv(n, b=1, h=H, d=D, scale=0.7, seed=n)
    _, _, scores, chosen = selection_by_hand(lay, q, k)
    assert margin(scores, chosen) > 1e-3
    assert minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in (q, k, v)))


def test_the_indexer_loss_trains_the_indexer_only():
    """In training the KL loss's gradient reaches the indexer's weights and nothing else: the
    gradients of q, k, v and of the attention's projections are those of eval mode. The loss
    itself passes a float64 gradient check in the indexer's weights."""
    lay = layer(True, block=3, top_k=2)
    x = np.random.default_rng(7).standard_normal((2, 13, E))
    r = np.random.default_rng(8).standard_normal((2, 13, E))
    grads = {}
    for mode in ("train", "eval"):
        lay.zero_grad()
        getattr(lay, mode)()
        (lay(tensor(x)) * tensor(r)).sum().backward()
        grads[mode] = {n: (None if p.grad is None else to_host(p.grad))
                       for n, p in lay.named_parameters()}
    indexer = ("indexer_q.weight", "indexer_k.weight", "q_norm_weight", "k_norm_weight")
    for name, g in grads["train"].items():
        if name in indexer:
            assert g is not None and np.any(g), name
            assert grads["eval"][name] is None or not np.any(grads["eval"][name]), name
        else:
            assert_close(g, grads["eval"][name], atol=1e-12, err_msg=name)
    lay.eval()
    q, k, _ = (tensor(a) for a in qkv(13, b=1, h=H, d=D, seed=9))
    blocks, allowed, chosen, ok = lay.select(q, k)
    params = (lay.indexer_q.weight, lay.indexer_k.weight, lay.q_norm_weight, lay.k_norm_weight)
    assert minitx.gradcheck(lambda *ps: lay.indexer_loss(q, k, blocks, allowed, chosen, ok),
                            params)


# ---- bad options --------------------------------------------------------------------------------

@pytest.mark.parametrize("option,value", [
    ("block", 0), ("top_k", -1), ("indexer_heads", 1.5), ("indexer_dim", 0),
    ("indexer_loss_weight", -1.0), ("norm_eps", 0.0), ("block", "4")])
def test_bad_options_are_named(option, value):
    with pytest.raises((ValueError, TypeError)) as info:
        REGISTRY["block_indexer"](E, H, **{option: value})
    assert option in str(info.value) and repr(value) in str(info.value), str(info.value)
