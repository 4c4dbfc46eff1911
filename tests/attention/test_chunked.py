"""Chunked attention (Llama 4's local layers, ``attention/chunked.py``): the pattern is the
block-diagonal rule written here; attend equals dense attention under it for any length and
chunk; decoding through the ``ChunkKVCache`` in any split equals the full forward, and the
cache never holds more than C − 1 keys between calls; the hooks see the N × N maps; bad options
are named. The registry contract (gradcheck, causality, GQA, scales) runs in
test_registry_contract.py; HF's own chunked mask is the oracle in
tests/oracles/test_torch_parity_attention.py."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.kv_cache import ChunkKVCache
from minitx.validate import OptionError
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["chunked"](E, H, causal=causal, **options).double().eval()


def rule_by_hand(n, c, causal):
    return np.array([[i // c == j // c and (j <= i or not causal) for j in range(n)]
                     for i in range(n)])


@settings(deadline=None, max_examples=40)
@given(n=st.integers(1, 30), c=st.integers(1, 12), causal=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_attend_is_dense_attention_under_the_chunks(n, c, causal, seed):
    lay = layer(causal, chunk_size=c, num_kv_heads=1)
    assert np.array_equal(lay.pattern(n), rule_by_hand(n, c, causal))
    q, k, v = qkv(n, b=2, h=H, hkv=1, d=D, seed=seed)
    want = dense_attention_array(q, np.repeat(k, H, 1), np.repeat(v, H, 1),
                                 rule_by_hand(n, c, causal))
    assert_close(lay.attend(tensor(q), tensor(k), tensor(v)), want, atol=1e-12)


@settings(deadline=None, max_examples=25)
@given(cuts=st.lists(st.integers(1, 16), min_size=1, max_size=5, unique=True),
       c=st.integers(1, 6))
def test_decoding_in_any_split_equals_the_full_forward(cuts, c):
    lay = layer(True, chunk_size=c)
    x = np.random.default_rng(c).standard_normal((2, 17, E))
    with minitx.no_grad():
        full = lay(tensor(x)).numpy()
        cache, steps, start = lay.new_cache(), [], 0
        for end in sorted(cuts) + [17]:
            steps.append(lay(tensor(x[:, start:end]), kv_cache=cache).numpy())
            start = end
            # only the current chunk's keys stay: positions ⌊end/C⌋·C … end − 1
            assert cache._k.shape[2] == end % c <= c - 1
    assert len(cache) == 17
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-12)


def test_a_chunk_boundary_forgets_what_came_before():
    """The first query of a chunk sees only itself: its output is its own value, whatever the
    tokens before it (a sliding window would mix them in)."""
    q, k, v = qkv(9, b=1, h=H, d=D, seed=2)
    out = layer(True, chunk_size=4).attend(tensor(q), tensor(k), tensor(v)).numpy()
    assert_close(out[:, :, [0, 4, 8]], v[:, :, [0, 4, 8]], atol=1e-12)


def test_hooks_see_the_chunked_maps():
    lay = layer(True, chunk_size=3)
    seen = {}
    lay.hook_pattern.add_hook(lambda t, hook: seen.__setitem__("pattern", t.numpy()))
    lay.hook_mask.add_hook(lambda t, hook: seen.__setitem__("mask", to_host(t.data)))
    x = tensor(np.random.default_rng(3).standard_normal((2, 7, E)))
    plain = layer(True, chunk_size=3)(x).numpy()
    assert_close(lay(x), plain, atol=1e-12)              # the dense path computes the same
    assert np.array_equal(seen["mask"], rule_by_hand(7, 3, True))
    assert np.all(seen["pattern"][..., ~rule_by_hand(7, 3, True)] == 0)
    assert_close(seen["pattern"].sum(-1), np.ones((2, H, 7)), atol=1e-12)


def test_bad_options_and_caches_are_named():
    with pytest.raises(ValueError, match="chunk_size"):
        REGISTRY["chunked"](E, H, chunk_size=0)
    x = tensor(np.zeros((1, 2, E)))
    with pytest.raises(OptionError, match="ChunkKVCache of chunk 8"):
        layer(True)(x, kv_cache=ChunkKVCache(4))
    with pytest.raises(OptionError, match="causal=True"):
        layer(False)(x, kv_cache=ChunkKVCache(8))
    with pytest.raises(ValueError, match="chunk"):
        ChunkKVCache(0)
