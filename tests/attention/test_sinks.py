"""Attention sinks (StreamingLLM): the sink pattern against its definition, the RoPE-by-cache-slot
scores against the paper's picture (each row's cache contents rotated by slot), the dense
reference, gradients, the rolling cache (bounded, decoding equals the full forward far past the
window and past GPT's block_size), hooks and errors."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, apply_rope
from minitx.attention.sinks import SinkAttention, SinkCache, sink_mask
from minitx.models.gpt import GPT, GPTConfig
from minitx.validate import OptionError
from support import assert_close, params_to_float64, qkv, tensor, to_host

E, H, D = 8, 2, 4


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY["sink"](E, H, causal=causal, **options)).eval()


def allowed_by_hand(n, s, w, causal):
    """The paper's rule written out pair by pair."""
    m = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            near = 0 <= i - j < w if causal else abs(i - j) < w
            m[i, j] = (near or j < s) and (j <= i or not causal)
    return m


def softmax_rows(s, allowed):
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---- the pattern ---------------------------------------------------------------------------

@given(n=st.integers(1, 30), s=st.integers(0, 6), w=st.integers(1, 8), causal=st.booleans())
def test_pattern_is_sinks_plus_window(n, s, w, causal):
    lay = layer(causal, num_sinks=s, window=w)
    assert lay.pattern(n).dtype == bool
    np.testing.assert_array_equal(lay.pattern(n), allowed_by_hand(n, s, w, causal))
    np.testing.assert_array_equal(sink_mask(n, s, w, causal), allowed_by_hand(n, s, w, causal))


@settings(max_examples=15)
@given(n=st.integers(1, 24), s=st.integers(0, 4), w=st.integers(1, 6),
       causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_without_rope_it_is_dense_softmax_under_the_pattern(n, s, w, causal, seed):
    lay = layer(causal, num_sinks=s, window=w, rope=False)
    assert lay.kind == "masked" and REGISTRY["sink"].kind == "score"
    q, k, v = qkv(n, b=1, h=H, d=D, seed=seed)
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    p = softmax_rows(q @ k.swapaxes(-1, -2) / np.sqrt(D), allowed_by_hand(n, s, w, causal))
    assert_close(out, p @ v, atol=1e-12)


# ---- RoPE by cache slot ----------------------------------------------------------------------

def row_by_cache_slots(q, k, v, i, s, w):
    """Query i as the paper decodes it: its cache holds positions [0, s) ∪ (i − w, i]; each
    held key is rotated by its slot 0, 1, …; the query by its own slot (the last)."""
    held = sorted(set(range(min(s, i + 1))) | set(range(max(0, i - w + 1), i + 1)))
    kr = to_host(apply_rope(tensor(k[:, :, held]), np.arange(len(held)))).copy()
    qr = to_host(apply_rope(tensor(q[:, :, i:i + 1]), np.asarray([len(held) - 1])))
    p = softmax_rows(qr @ kr.swapaxes(-1, -2) / np.sqrt(D), np.ones((1, len(held)), bool))
    return (p @ v[:, :, held])[:, :, 0]


@settings(max_examples=15)
@given(n=st.integers(1, 26), s=st.integers(0, 4), w=st.integers(1, 6),
       seed=st.integers(0, 2 ** 16))
def test_each_row_equals_its_cache_rotated_by_slot(n, s, w, seed):
    lay = layer(num_sinks=s, window=w)
    q, k, v = qkv(n, b=2, h=H, d=D, seed=seed)
    out = to_host(lay.attend(tensor(q), tensor(k), tensor(v)))
    for i in range(n):
        assert_close(out[:, :, i], row_by_cache_slots(q, k, v, i, s, w), atol=1e-12,
                     err_msg=f"row {i}")


@settings(max_examples=15)
@given(nk=st.integers(1, 26), dq=st.integers(0, 25), s=st.integers(0, 4), w=st.integers(1, 7),
       causal=st.booleans(), hkv=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
def test_attend_equals_the_dense_reference(nk, dq, s, w, causal, hkv, seed):
    nq = max(1, nk - dq)                                       # Nq ≤ Nk: the last Nq positions
    lay = layer(causal, num_sinks=s, window=w)
    q, k, v = qkv(nq, nk, b=2, h=H, hkv=hkv, d=D, seed=seed)
    out = lay.attend(tensor(q), tensor(k), tensor(v))
    qt, kt, vt = tensor(q), tensor(k), tensor(v)
    assert_close(out, lay.reference(qt.data, kt.data, vt.data), atol=1e-12)


def test_the_rows_attend_to_the_sinks_past_the_window():
    # past s + w the sink columns get weight and the middle columns none
    n, s, w = 20, 2, 4
    lay = layer(num_sinks=s, window=w)
    q, k, v = qkv(n, b=1, h=H, d=D, seed=3)
    with lay.hooks([("hook_pattern", lambda t, hook: cache.append(to_host(t)))]):
        cache = []
        lay.attend(tensor(q), tensor(k), tensor(v))
    p = cache[0][0, :, -1]                                     # (H, N), the last query
    assert np.all(p[:, :s] > 0) and np.all(p[:, s:n - w] == 0) and np.all(p[:, n - w:] > 0)
    assert_close(p.sum(-1), np.ones(H), rtol=1e-12)


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_around_the_window(rope, causal):
    lay = layer(causal, num_sinks=2, window=3, rope=rope)
    for n in (1, 4, 5, 6, 9):                                  # around s + w = 5
        arrays = qkv(n, b=1, h=H, hkv=1, d=D, scale=0.8, seed=n)
        minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))


# ---- the rolling cache -------------------------------------------------------------------

def test_sink_cache_keeps_the_sinks_and_the_last_window(rng):
    cache = SinkCache(num_sinks=2, window=3)
    ks = rng.standard_normal((1, 2, 11, 4))
    seen = 0
    for n in (1, 4, 1, 2, 3):                                   # chunks longer than s + w too
        k, _, pos = cache.update(tensor(ks[:, :, seen:seen + n]), tensor(ks[:, :, seen:seen + n]))
        old = sorted(set(range(min(2, seen))) | set(range(max(0, seen - 2), seen)))
        np.testing.assert_array_equal(pos, old + list(range(seen, seen + n)))
        assert_close(k, ks[:, :, pos])                          # held then new, in order
        seen += n
        assert len(cache) == seen
        # the sinks and the last w − 1: all the next query reads besides itself
        held = sorted(set(range(min(2, seen))) | set(range(max(0, seen - 2), seen)))
        np.testing.assert_array_equal(cache.positions, held)
        assert cache.size == len(held) <= 4
        assert_close(cache.keys, ks[:, :, held])
    cache.reset()
    assert len(cache) == 0 and cache.size == 0 and cache.keys is None


def tiny_gpt(**kw):
    cfg = {"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8,
           "attention": "sink", "position": "none",
           "attention_options": {"num_sinks": 2, "window": 4}}
    cfg.update(kw)
    minitx.manual_seed(0)
    return params_to_float64(GPT(GPTConfig(**cfg))).eval()


@pytest.mark.parametrize("position,rope", [("none", True), ("sinusoidal", False)])
def test_gpt_decoding_through_the_cache_equals_the_full_forward(rng, position, rope):
    # 8× the window, 4× block_size: the full forward never crops (no learned positions)
    model = tiny_gpt(position=position,
                     attention_options={"num_sinks": 2, "window": 4, "rope": rope})
    idx = rng.integers(0, 13, (2, 32))
    full = model(idx)[0].numpy()
    caches = model.new_caches()
    assert all(isinstance(c, SinkCache) for c in caches)
    got = [model(idx[:, :3], kv_caches=caches)[0].numpy()]      # prefill 3, then one by one
    for t in range(3, 32):
        got.append(model(idx[:, t:t + 1], kv_caches=caches)[0].numpy())
        assert all(c.size == min(t + 1, 2 + 4 - 1) for c in caches) and len(caches[0]) == t + 1
    assert_close(np.concatenate(got, axis=1), full, atol=1e-12)
    # chunked, with chunks longer than the cache
    caches = model.new_caches()
    chunks = [model(idx[:, a:b], kv_caches=caches)[0].numpy()
              for a, b in ((0, 9), (9, 10), (10, 17), (17, 32))]
    assert_close(np.concatenate(chunks, axis=1), full, atol=1e-12)


def test_gpt_generate_decodes_through_the_cache_past_block_size(rng, monkeypatch):
    model = tiny_gpt()
    made = []
    new_caches = model.new_caches
    monkeypatch.setattr(model, "new_caches", lambda: made.append(new_caches()) or made[-1])
    idx = rng.integers(0, 13, (2, 3))
    out = to_host(model.generate(idx, 32, top_k=1))             # 8× the window, 35 > 8
    assert out.shape == (2, 35)
    assert len(made) == 1 and all(len(c) == 34 and c.size == 5 for c in made[0])
    # greedy from the uncropped full forward picks the same tokens
    toks = idx.copy()
    for _ in range(32):
        nxt = model(toks)[0].numpy()[:, -1].argmax(-1)
        toks = np.concatenate([toks, nxt[:, None]], axis=1)
    np.testing.assert_array_equal(out, toks)


def test_gpt_with_learned_positions_still_crops_to_block_size(rng):
    model = tiny_gpt(position="learned")
    out = model.generate(rng.integers(0, 13, (1, 3)), 10, top_k=1)   # 13 > block_size = 8
    assert out.shape == (1, 13)


# ---- hooks and errors --------------------------------------------------------------------

def test_hooks_show_mask_scores_and_pattern(rng):
    n = 14
    lay = layer(num_sinks=2, window=4)
    x = tensor(rng.standard_normal((2, n, E)))
    seen = {}
    with lay.hooks([(lambda name: True, lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        y = lay(x)
    assert_close(y, lay(x), rtol=1e-13)
    mask, scores, pattern = seen["hook_mask"], seen["hook_attn_scores"], seen["hook_pattern"]
    np.testing.assert_array_equal(mask, allowed_by_hand(n, 2, 4, True))
    assert np.all(np.isneginf(scores[..., ~mask])) and np.all(np.isfinite(scores[..., mask]))
    assert np.all(pattern[..., ~mask] == 0)
    assert_close(pattern, softmax_rows(scores, mask), rtol=1e-12)
    assert_close(seen["hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, seen["hook_v"]),
                 rtol=1e-10, atol=1e-14)


def test_bad_options_and_caches_are_refused_by_name():
    with pytest.raises(OptionError, match="num_sinks must be an int >= 0, got -1"):
        REGISTRY["sink"](E, H, num_sinks=-1)
    with pytest.raises(OptionError, match="window must be a positive int, got 0"):
        REGISTRY["sink"](E, H, window=0)
    with pytest.raises(OptionError, match="even head dim .* got 3"):
        REGISTRY["sink"](6, 2)
    assert REGISTRY["sink"](6, 2, rope=False).kind == "masked"
    with pytest.raises(OptionError, match="rope must be"):
        REGISTRY["sink"](E, H, rope="yes")
    lay = layer()
    x = tensor(np.zeros((1, 2, E)))
    with pytest.raises(OptionError, match="kv_cache must be a SinkCache .* got a KVCache"):
        lay(x, kv_cache=minitx.attention.KVCache())
    with pytest.raises(OptionError, match="needs causal=True"):
        layer(causal=False)(x, kv_cache=SinkCache())
    cache = SinkCache()
    cache.update(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)))
    with pytest.raises(ValueError, match="expected k of shape"):
        cache.update(np.zeros((1, 3, 1, 4)), np.zeros((1, 3, 1, 4)))
    with pytest.raises(ValueError, match="k and v must be"):
        cache.update(np.zeros((1, 2, 1)), np.zeros((1, 2, 1)))


def test_identities_hold():
    for claim, value, limit in SinkAttention.identities():
        assert value <= limit, (claim, value, limit)


# ---- StreamingLLM's dense prompt (prefill="dense") -----------------------------------------

def rope_by_hand(x, positions, base=10000.0):
    """Rotate each pair (x_2i, x_2i+1) of x (…, N, D) by the angle p·base^(−2i/D)."""
    d = x.shape[-1]
    angle = np.asarray(positions)[:, None] * base ** (-2.0 * np.arange(d // 2) / d)   # (N, D/2)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * np.cos(angle) - odd * np.sin(angle)
    out[..., 1::2] = even * np.sin(angle) + odd * np.cos(angle)
    return out


def dense_by_slot(lay, x, held_k, held_v):
    """StreamingLLM's prompt through one layer: the held keys/values (B, H, m, D) at cache slots
    0 … m − 1, the chunk's at m … m + n − 1, causal softmax over all of them, RoPE by slot."""
    w = {name: to_host(getattr(lay, name).weight) for name in ("q_proj", "k_proj", "v_proj")}
    bias = {name: to_host(getattr(lay, name).bias) for name in w}

    def heads(name):
        y = x @ w[name].T + bias[name]                                   # (B, n, E)
        return y.reshape(x.shape[0], x.shape[1], H, D).transpose(0, 2, 1, 3)

    q = heads("q_proj")
    k = np.concatenate([held_k, heads("k_proj")], axis=2)
    v = np.concatenate([held_v, heads("v_proj")], axis=2)
    m, n = held_k.shape[2], x.shape[1]
    slots = np.arange(m + n)
    s = rope_by_hand(q, slots[m:]) @ np.swapaxes(rope_by_hand(k, slots), -1, -2) / np.sqrt(D)
    z = softmax_rows(s, slots[m:, None] >= slots[None, :]) @ v           # (B, H, n, D)
    z = z.transpose(0, 2, 1, 3).reshape(x.shape[0], n, E)
    return z @ to_host(lay.out_proj.weight).T + to_host(lay.out_proj.bias)


@pytest.mark.parametrize("first,second", [(9, 5), (5, 3), (6, 6), (1, 7)])
def test_dense_prefill_is_streamingllms_prompt_and_measurably_not_the_pattern(rng, first,
                                                                              second):
    """s = 2, w = 3. Two chunks through the cache: with ``prefill="dense"`` each equals causal
    softmax over the held entries and the chunk with RoPE by cache slot (written here from
    StreamingLLM's description) to 1e-12. The pattern prefill (the default) equals the full
    forward instead. The two agree on a first chunk of at most s + w tokens (the pattern then
    covers every pair) and differ beyond: max |Δ| from 0.16 to 0.57 in these cases."""
    x = rng.standard_normal((2, first + second, E))
    dense, pattern = layer(num_sinks=2, window=3, prefill="dense"), layer(num_sinks=2, window=3)
    caches = {"dense": SinkCache(2, 3), "pattern": SinkCache(2, 3)}
    out = {}
    for name, lay in (("dense", dense), ("pattern", pattern)):
        out[name] = [to_host(lay(tensor(x[:, :first]), kv_cache=caches[name]))]
    want = dense_by_slot(dense, x[:, :first], np.zeros((2, H, 0, D)), np.zeros((2, H, 0, D)))
    assert_close(out["dense"][0], want, atol=1e-12)
    held_k, held_v = (to_host(t) for t in (caches["dense"].keys, caches["dense"].values))
    for name, lay in (("dense", dense), ("pattern", pattern)):
        out[name].append(to_host(lay(tensor(x[:, first:]), kv_cache=caches[name])))
    assert_close(out["dense"][1], dense_by_slot(dense, x[:, first:], held_k, held_v),
                 atol=1e-12)
    assert_close(np.concatenate(out["pattern"], axis=1), pattern(tensor(x)), atol=1e-12)
    # the caches hold the same entries either way: only the prompt's own outputs differ
    np.testing.assert_array_equal(caches["dense"].positions, caches["pattern"].positions)
    gaps = [np.abs(a - b).max() for a, b in zip(out["dense"], out["pattern"])]
    assert gaps[0] <= 1e-14 or first > 5, gaps           # a first chunk of at most s + w
    assert max(gaps) > 0.1, gaps


def test_prefill_is_validated():
    with pytest.raises(OptionError, match="prefill"):
        REGISTRY["sink"](E, H, prefill="full")


@settings(max_examples=20, deadline=None)
@given(s=st.integers(0, 3), w=st.integers(1, 4), n=st.integers(1, 14), seed=st.integers(0, 99))
def test_a_cache_of_s_plus_w_minus_1_decodes_as_the_full_forward(s, w, n, seed):
    """Token by token through the trimmed cache (the sinks and the last w − 1 tokens), with
    no sinks and a window of one token among the cases: the full forward's rows, and never
    more than s + w − 1 entries held."""
    lay = layer(num_sinks=s, window=w)
    x = np.random.default_rng(seed).standard_normal((1, n, E))
    cache = SinkCache(s, w)
    steps = []
    for t in range(n):
        steps.append(to_host(lay(tensor(x[:, t:t + 1]), kv_cache=cache)))
        assert cache.size == min(t + 1, s + w - 1)
    assert_close(np.concatenate(steps, axis=1), lay(tensor(x)), atol=1e-12)
