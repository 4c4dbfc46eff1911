"""The variants that choose their keys (dsa, moba, nsa): the gathered form against the dense
form under its own selection mask on a hypothesis grid, the choice itself against the papers'
rules written out query by query, what a top-k that keeps everything equals, keys read per
query and memory against N, decoding through a GPT's caches, the hooks (and steering the
choice through them), the indexer's loss, and option errors. The registry contract (gradients,
causality, GQA) runs in test_registry_contract.py; PyTorch parity in
tests/oracles/test_torch_parity_selection.py."""
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, causal_pattern, dense_attention_array
from minitx.models.gpt import GPT, GPTConfig
from minitx.validate import OptionError
from support import assert_close, params_to_float64, qkv, tensor, to_host

E, H, D = 8, 2, 4
NAMES = ("dsa", "moba", "nsa")


def layer(name, causal=True, **options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY[name](E, H, causal=causal, **options)).eval()


def run_hooked(lay, x):
    """lay(x) with every hook recording: (output, {hook name: host array})."""
    seen = {}
    with lay.hooks([(lambda n: True, lambda t, hook: seen.__setitem__(hook.name, t))]):
        out = lay(tensor(x))
    return to_host(out), {k: to_host(t) for k, t in seen.items()}


def heads_of(seen, name):
    """A hooked (B, N, H, D) activation as (B, H, N, D)."""
    return seen[name].transpose(0, 2, 1, 3)


# ---- the gathered form equals the dense form under its own choice -------------------------

OPTIONS = {
    "dsa": lambda d: {"top_k": d.draw(st.integers(1, 12))},
    "moba": lambda d: {"block": d.draw(st.integers(1, 6)), "top_k": d.draw(st.integers(0, 4))},
    "nsa": lambda d: {"block": d.draw(st.integers(1, 6)), "top_k": d.draw(st.integers(1, 5)),
                      "window": d.draw(st.integers(1, 9))},
}


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data(), n=st.integers(1, 30), extra=st.integers(0, 5),
       causal=st.booleans(), hkv=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_attend_equals_dense_attention_under_its_own_choice(name, data, n, extra, causal, hkv,
                                                            seed):
    options = OPTIONS[name](data)
    lay = layer(name, causal, num_kv_heads=hkv, **options)
    nk = n + (extra if causal else 0)            # queries at the last n of nk positions
    q, k, v = qkv(n, nk, b=2, h=H, hkv=hkv, d=D, seed=seed)
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    ref = lay.reference(*(tensor(a).data for a in (q, k, v)))     # on the layer's device
    assert_close(out, ref, atol=1e-12, rtol=1e-12,
                 err_msg=f"{name} {options} n={n} nk={nk} causal={causal}")


# ---- the choice, against each paper's rule written out query by query ---------------------

def test_dsa_index_scores_and_choice_follow_the_indexer_formula(rng):
    lay = layer("dsa", top_k=5, indexer_heads=3, indexer_dim=4)
    n = 11
    x = rng.standard_normal((2, n, E))
    _, seen = run_hooked(lay, x)
    q, k = heads_of(seen, "hook_q"), heads_of(seen, "hook_k")
    wq, wk, ww = (to_host(m.weight) for m in (lay.indexer_q, lay.indexer_k, lay.indexer_w))
    for b in range(2):
        for t in range(n):
            qt = q[b, :, t].reshape(-1)                             # the heads, concatenated
            qi = (wq @ qt).reshape(3, 4)
            w = ww @ qt / math.sqrt(3 * 4)
            want = np.full(n, -np.inf)
            for s in range(t + 1):
                ks = wk @ k[b, :, s].mean(axis=0)
                want[s] = sum(w[j] * max(qi[j] @ ks, 0.0) for j in range(3))
            assert_close(seen["hook_index_scores"][b, t], want, rtol=1e-12, atol=1e-14)
            chosen = sorted(range(t + 1), key=lambda s: (-want[s], s))[:5]
            assert set(np.flatnonzero(seen["hook_selection"][b, t])) == set(chosen)


def test_moba_choice_follows_its_rule(rng):
    lay = layer("moba", block=3, top_k=2)
    n = 17
    _, seen = run_hooked(lay, rng.standard_normal((2, n, E)))
    q, k = heads_of(seen, "hook_q"), heads_of(seen, "hook_k")
    for b, h, t in np.ndindex(2, H, n):
        own = t // 3
        means = [k[b, h, 3 * i:3 * i + 3].mean(axis=0) for i in range(own)]
        past = sorted(range(own), key=lambda i: -(q[b, h, t] @ means[i]))[:2]
        assert set(np.flatnonzero(seen["hook_selection"][b, h, t])) == set(past) | {own}


@pytest.mark.parametrize("hkv", [1, 2])
def test_nsa_choice_follows_its_rule(rng, hkv):
    lay = layer("nsa", block=3, top_k=4, window=2, num_kv_heads=hkv)
    n, per = 20, H // hkv                          # per: query heads sharing a choice
    _, seen = run_hooked(lay, rng.standard_normal((2, n, E)))
    q, k = heads_of(seen, "hook_q"), heads_of(seen, "hook_k")
    for b, g, t in np.ndindex(2, hkv, n):
        own = t // 3
        complete = [i for i in range(7) if 3 * i + 2 <= t]
        # each head's softmax over the complete blocks' mean keys, summed over the group
        score = np.zeros(7)
        for h in range(g * per, (g + 1) * per):
            s = np.array([q[b, h, t] @ k[b, g, 3 * i:3 * i + 3].mean(axis=0) / 2.0
                          for i in complete])
            if complete:
                score[complete] += np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        forced = list(dict.fromkeys(i for i in (own, own - 1, 0) if i >= 0))  # by priority
        rest = sorted((i for i in complete if i not in forced), key=lambda i: -score[i])
        want = forced[:4] + rest[:max(0, 4 - len(forced))]
        assert set(np.flatnonzero(seen["hook_selection"][b, g, t])) == set(want), (b, g, t)


# ---- a top-k that keeps everything, and the identities ------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_identities_hold(name):
    rows = REGISTRY[name].identities(0)
    assert len(rows) >= 3
    for claim, value, limit in rows:
        assert limit <= 1e-6 and value <= limit, (name, claim, value)


@pytest.mark.parametrize("name,options", [("dsa", {"top_k": 40}), ("moba", {"top_k": 40}),
                                          ("moba", {"block": 1, "top_k": 40})])
@pytest.mark.parametrize("hkv", [1, 2])
def test_keeping_every_key_is_causal_softmax_attention(rng, name, options, hkv):
    lay = layer(name, num_kv_heads=hkv, **options)
    q, k, v = qkv(23, b=2, h=H, hkv=hkv, d=D, seed=3)
    got = lay.attend(tensor(q), tensor(k), tensor(v))
    assert_close(got, dense_attention_array(q, k, v, causal_pattern(23)), atol=1e-13)


def test_nsa_branches_are_causal_softmax_and_the_gates_mix_them(rng):
    lay = layer("nsa", block=4, top_k=8, window=30)
    x = rng.standard_normal((2, 25, E))
    out, seen = run_hooked(lay, x)
    q, k, v = (heads_of(seen, n) for n in ("hook_q", "hook_k", "hook_v"))
    full = dense_attention_array(q, k, v, causal_pattern(25)).transpose(0, 2, 1, 3)
    assert_close(seen["hook_selected"], full, atol=1e-13)
    assert_close(seen["hook_window"], full, atol=1e-13)
    # the compressed branch: causal softmax over the complete blocks' mean keys and values
    kbar, vbar = (a[:, :, :24].reshape(2, H, 6, 4, D).mean(axis=3) for a in (k, v))
    seen_blocks = (np.arange(6)[None, :] + 1) * 4 - 1 <= np.arange(25)[:, None]
    cmp = dense_attention_array(q, kbar, vbar, seen_blocks).transpose(0, 2, 1, 3)
    assert_close(seen["hook_compressed"], cmp, atol=1e-13)
    g = seen["hook_gates"].transpose(0, 2, 1, 3)                      # (B, N, H, 3)
    z = g[..., 0:1] * cmp + g[..., 1:2] * full + g[..., 2:3] * full
    assert_close(seen["hook_z"], z, atol=1e-13)
    assert np.all((g > 0) & (g < 1))


# ---- keys read per query, and memory, against N --------------------------------------------

@pytest.mark.parametrize("name,options,per_query", [
    ("dsa", {"top_k": 8}, 8), ("moba", {"block": 4, "top_k": 2}, 12),
    ("nsa", {"block": 4, "top_k": 2, "window": 4}, 12)])
def test_keys_read_per_query_do_not_grow_with_n(rng, name, options, per_query):
    for n in (32, 128):
        lay = layer(name, **options)
        _, seen = run_hooked(lay, rng.standard_normal((1, n, E)))
        sel = seen["hook_selection"]
        if name == "dsa":
            keys = sel.sum(axis=-1)                                   # (B, N)
        else:                                                         # blocks → their keys
            keys = sel.sum(axis=-1) * options["block"]
            keys = keys + (options.get("window", 0))
        assert keys.max() <= per_query, (name, n, keys.max())
        assert keys[..., -1].min() == per_query                     # the last query: all k


def peak_bytes(name, n, **options):
    """Peak bytes traced while a float32 causal layer attends over N tokens (B = 1, H = 2)."""
    lay = REGISTRY[name](E, H, causal=True, **options).eval()
    q, k, v = (tensor(a, dtype="float32") for a in qkv(n, b=1, h=H, d=D, seed=0,
                                                       dtype="float32"))
    tracemalloc.start()
    with minitx.no_grad():
        lay.attend(q, k, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("name,options", [("dsa", {"top_k": 8}),
                                          ("moba", {"block": 64, "top_k": 2})])
def test_memory_grows_linearly_in_n(name, options):
    """DSA's indexer runs on blocks of queries and both gather k (or (k + 1)·b) keys per
    query: doubling N doubles the memory (an N × N map would quadruple it; MoBA's N × N/b
    gate scores stay small beside its gathered keys at b = 64)."""
    small, large = (peak_bytes(name, n, **options) for n in (2048, 4096))
    assert large / small < 2.5, (name, small, large)
    assert large < H * 4096 * 4096 * 4          # less than one float32 (H, N, N) map


def test_nsa_memory_is_the_block_means_not_the_keys():
    """NSA's compressed branch holds N × N/b scores, the stated O(N²/b): at b = 64 far below
    one dense (H, N, N) map."""
    n = 4096
    assert peak_bytes("nsa", n, block=64, top_k=2, window=64) < H * n * n * 4 / 2


# ---- decoding --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [("dsa", {"top_k": 5}),
                                          ("moba", {"block": 3, "top_k": 1}),
                                          ("nsa", {"block": 3, "top_k": 3, "window": 4})])
def test_gpt_decoding_through_its_caches_equals_the_full_forward(rng, name, options):
    minitx.manual_seed(0)
    model = params_to_float64(GPT(GPTConfig(vocab_size=13, block_size=32, n_layer=2, n_head=2,
                                            n_embd=8, attention=name,
                                            attention_options=options))).eval()
    idx = rng.integers(0, 13, (2, 30))
    full = model(idx)[0].numpy()
    caches = model.new_caches()
    got = [model(idx[:, :4], kv_caches=caches)[0].numpy()]
    got += [model(idx[:, t:t + 1], kv_caches=caches)[0].numpy() for t in range(4, 30)]
    assert_close(np.concatenate(got, axis=1), full, atol=1e-12)
    caches = model.new_caches()                                   # chunks of several tokens
    chunks = [model(idx[:, a:b], kv_caches=caches)[0].numpy()
              for a, b in ((0, 7), (7, 8), (8, 19), (19, 30))]
    assert_close(np.concatenate(chunks, axis=1), full, atol=1e-12)


# ---- hooks steer the choice -----------------------------------------------------------------

def test_dsa_replaced_index_scores_choose_the_keys(rng):
    lay = layer("dsa", top_k=3)
    n = 10
    q, k, v = qkv(n, b=1, h=H, d=D, seed=1)

    def earliest_first(scores, hook):                     # prefer the earliest keys
        return tensor(np.where(np.isfinite(to_host(scores)), -np.arange(n, dtype=float),
                               -np.inf))
    with lay.hooks([("hook_index_scores", earliest_first)]):
        got = lay.attend(tensor(q), tensor(k), tensor(v))
    allowed = causal_pattern(n) & (np.arange(n)[None, :] < 3)
    assert_close(got, dense_attention_array(q, k, v, allowed), atol=1e-13)


def test_moba_replaced_gate_scores_choose_the_blocks(rng):
    lay = layer("moba", block=2, top_k=1)
    n = 12
    q, k, v = qkv(n, b=1, h=H, d=D, seed=2)

    def first_block(scores, hook):                        # always block 0 among the past ones
        s = to_host(scores)
        return tensor(np.where(np.isfinite(s), -np.arange(s.shape[-1], dtype=float), -np.inf))
    with lay.hooks([("hook_gate_scores", first_block)]):
        got = lay.attend(tensor(q), tensor(k), tensor(v))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (j <= i) & ((j // 2 == i // 2) | (j // 2 == 0))
    assert_close(got, dense_attention_array(q, k, v, allowed), atol=1e-13)


def test_nsa_replaced_gates_pick_one_branch(rng):
    lay = layer("nsa", block=2, top_k=2, window=3)
    n = 13
    q, k, v = qkv(n, b=1, h=H, d=D, seed=4)
    _, o_cmp, o_slc, o_win, _ = (to_host(a) for a in lay.reference(
        *(tensor(a).data for a in (q, k, v)), branches=True))
    for i, want in enumerate((o_cmp, o_slc, o_win)):
        def only(g, hook, i=i):
            one = np.zeros(g.shape)
            one[..., i] = 1.0
            return tensor(one)
        with lay.hooks([("hook_gates", only)]):
            got = lay.attend(tensor(q), tensor(k), tensor(v))
        assert_close(got, want, atol=1e-13)
    win = (np.arange(n)[:, None] - np.arange(n)[None, :])
    assert_close(o_win, dense_attention_array(q, k, v, (win >= 0) & (win < 3)), atol=1e-13)


# ---- the indexer's loss ----------------------------------------------------------------------

def test_dsa_indexer_learns_from_its_loss_only(rng):
    lay = layer("dsa", top_k=4).train()
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(9, b=2, h=H, d=D, seed=5))
    out = lay.attend(q, k, v)
    assert_close(out, lay.eval().attend(q, k, v))                 # the value is untouched
    lay.train()
    (out * tensor(np.random.default_rng(0).standard_normal(out.shape))).sum().backward()
    via_output = {n: to_host(p.grad) for n, p in lay.named_parameters() if "indexer" in n}
    grads_q = to_host(q.grad)
    lay.zero_grad()
    q2, k2 = (tensor(to_host(a), requires_grad=True) for a in (q, k))
    loss = lay.indexer_loss(q2, k2)
    loss.backward()
    assert float(to_host(loss)) >= 0
    assert q2.grad is None or not np.any(to_host(q2.grad))       # no gradient to q from it
    for n, p in lay.named_parameters():
        if "indexer" in n:
            assert_close(via_output[n], p.grad, rtol=1e-12, atol=1e-15)
            assert np.any(via_output[n])
    # the output's gradient to q is the same as without the loss (eval mode)
    lay.eval()
    q3 = tensor(to_host(q), requires_grad=True)
    out3 = lay.attend(q3, tensor(to_host(k)), tensor(to_host(v)))
    (out3 * tensor(np.random.default_rng(0).standard_normal(out3.shape))).sum().backward()
    assert_close(q3.grad, grads_q, rtol=1e-12, atol=1e-15)


def test_dsa_indexer_loss_is_the_kl_divergence_by_hand(rng):
    lay = layer("dsa", top_k=3, indexer_heads=2, indexer_dim=3)
    n = 6
    q, k, v = qkv(n, b=1, h=H, d=D, seed=6)
    scores = {}
    with lay.hooks([("hook_index_scores", lambda t, h: scores.__setitem__("I", to_host(t)))]):
        lay.attend(tensor(q), tensor(k), tensor(v))
    total = 0.0
    for t in range(n):
        row = scores["I"][0, t]
        chosen = sorted(range(t + 1), key=lambda s: (-row[s], s))[:3]
        logits = np.einsum("hd,chd->hc", q[0, :, t], k[0, :, chosen]) / 2.0   # (H, c)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).sum(0)
        p = p / p.sum()
        i = row[chosen]
        logq = i - i.max() - np.log(np.exp(i - i.max()).sum())
        total += (p * (np.log(p) - logq)).sum()
    got = float(to_host(lay.indexer_loss(tensor(q), tensor(k))))
    assert abs(got - total / n) < 1e-12


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,option,value", [
    ("dsa", "top_k", 0), ("dsa", "indexer_heads", 0), ("dsa", "indexer_dim", -1),
    ("dsa", "indexer_loss_weight", -1.0), ("dsa", "top_k", 2.5),
    ("moba", "block", 0), ("moba", "top_k", -1), ("moba", "block", "8"),
    ("nsa", "block", 0), ("nsa", "top_k", 0), ("nsa", "window", 0)])
def test_bad_options_name_the_option_and_the_value(name, option, value):
    with pytest.raises(OptionError, match=rf"{name}: {option} must be .*got {value!r}"):
        REGISTRY[name](E, H, **{option: value})


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_option_is_refused(name):
    with pytest.raises((TypeError, OptionError), match="top_kk"):
        REGISTRY[name](E, H, top_kk=3)


@settings(max_examples=10)
@given(n=st.integers(1, 12), seed=st.integers(0, 100))
def test_a_single_query_decoded_alone_matches_its_row(n, seed):
    """The last row of the full attention equals attending with that query alone over the
    same keys (queries are bottom-right aligned), for each variant."""
    for name in NAMES:
        lay = layer(name, **({"top_k": 3} if name == "dsa" else {"block": 2, "top_k": 1}
                             if name == "moba" else {"block": 2, "top_k": 2, "window": 2}))
        q, k, v = qkv(n, b=1, h=H, d=D, seed=seed)
        full = to_host(lay.attend(tensor(q), tensor(k), tensor(v)))
        last = to_host(lay.attend(tensor(q[:, :, -1:]), tensor(k), tensor(v)))
        assert_close(last, full[:, :, -1:], atol=1e-13)
