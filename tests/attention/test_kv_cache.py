"""KV caches: decoding token by token (or chunk by chunk) through a cache equals one causal
forward over the whole sequence; the paged cache equals the contiguous one."""
import numpy as np
import pytest

from minitx.attention import REGISTRY, KVCache, PagedKVCache
from support import assert_equal, tensor

CACHED = ["mha", "mqa", "gqa", "dot", "additive", "rope", "alibi", "relative"]


def test_kv_cache_append_and_positions(rng):
    cache = KVCache()
    k1, v1 = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 6))
    k, v = cache.append(tensor(k1), tensor(v1))
    assert len(cache) == 4 and k.shape == (2, 3, 4, 5) and v.shape == (2, 3, 4, 6)
    assert_equal(cache.positions, np.arange(4))               # an array of the backend
    for step in range(20):                                      # grows past the first buffer
        k2, v2 = rng.standard_normal((2, 3, 1, 5)), rng.standard_normal((2, 3, 1, 6))
        k, v = cache.append(k2, v2)
    assert_equal(cache.positions, [23])
    assert k.shape == (2, 3, 24, 5)
    np.testing.assert_array_equal(k.numpy()[:, :, :4], k1)
    np.testing.assert_array_equal(v.numpy()[:, :, -1:], v2)
    cache.reset()
    assert len(cache) == 0 and cache.keys is None


def test_kv_cache_errors(rng):
    cache = KVCache(max_len=3)
    cache.append(np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)))
    with pytest.raises(ValueError, match="cache is full: 2 cached \\+ 2 new > max_len=3"):
        cache.append(np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4)))
    with pytest.raises(ValueError, match="expected k of shape"):
        cache.append(np.zeros((1, 3, 1, 4)), np.zeros((1, 3, 1, 4)))
    with pytest.raises(ValueError, match="k and v must be"):
        cache.append(np.zeros((1, 2, 1)), np.zeros((1, 2, 1)))
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        KVCache(max_len=0)


@pytest.mark.parametrize("name", CACHED)
def test_token_by_token_equals_full_causal_forward(rng, name):
    layer = REGISTRY[name](8, 4, causal=True).to(dtype="float64")
    x = rng.standard_normal((2, 9, 8))
    full = layer(tensor(x)).numpy()
    cache = KVCache()
    steps = [layer(tensor(x[:, t:t + 1]), kv_cache=cache).numpy() for t in range(9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)
    # chunked prefill: 4 tokens, then 3, then 2 (Nq > 1 against Nk > Nq: bottom-right causal)
    cache = KVCache()
    chunks = [layer(tensor(x[:, a:b]), kv_cache=cache).numpy() for a, b in ((0, 4), (4, 7), (7, 9))]
    np.testing.assert_allclose(np.concatenate(chunks, axis=1), full, atol=1e-12)


def test_paged_cache_matches_contiguous_for_interleaved_sequences(rng):
    paged = PagedKVCache(num_pages=8, page_size=3, num_kv_heads=2, head_dim=4, dtype="float64")
    caches = {s: KVCache() for s in ("a", "b")}
    for step, (seq, n) in enumerate([("a", 2), ("b", 5), ("a", 3), ("b", 1), ("a", 1)]):
        k, v = rng.standard_normal((2, n, 4)), rng.standard_normal((2, n, 4))
        pk, pv = paged.append(seq, k, v)
        ck, cv = caches[seq].append(k[None], v[None])
        assert_equal(pk, ck.numpy()[0])                           # pool arrays: on the device
        assert_equal(pv, cv.numpy()[0])
    assert paged.length("a") == 6 and paged.length("b") == 6
    assert len(paged.block_tables["a"]) == 2 and len(paged.free_pages) == 4
    # the two sequences' pages interleave in the pool: no sequence owns a contiguous range
    assert sorted(paged.block_tables["a"] + paged.block_tables["b"]) == [0, 1, 2, 3]
    paged.free("a")
    assert len(paged.free_pages) == 6 and "a" not in paged
    assert_equal(paged.gather("b")[0], caches["b"].keys.numpy()[0])


def test_paged_cache_errors():
    paged = PagedKVCache(num_pages=2, page_size=4, num_kv_heads=1, head_dim=2)
    paged.append(0, np.zeros((1, 5, 2)), np.zeros((1, 5, 2)))  # uses both pages
    with pytest.raises(RuntimeError, match="out of pages: sequence 1 needs 1 more page"):
        paged.append(1, np.zeros((1, 1, 2)), np.zeros((1, 1, 2)))
    with pytest.raises(RuntimeError, match="0 of 2 are free"):
        paged.append(0, np.zeros((1, 4, 2)), np.zeros((1, 4, 2)))
    with pytest.raises(ValueError, match=r"k must be \(Hkv, n, D\)"):
        paged.append(0, np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))
    with pytest.raises(ValueError, match=r"v must be \(Hkv, n, Dv\)"):
        paged.append(0, np.zeros((1, 1, 2)), np.zeros((1, 2, 2)))
    with pytest.raises(KeyError, match="unknown sequence"):
        paged.free(7)
    with pytest.raises(ValueError, match="page_size must be a positive int"):
        PagedKVCache(2, 0, 1, 2)


@pytest.mark.parametrize("name", ["mha", "gqa", "rope"])
def test_paged_decoding_equals_full_forward(rng, name):
    layer = REGISTRY[name](8, 4, causal=True).to(dtype="float64")
    x = rng.standard_normal((3, 7, 8))
    full = layer(tensor(x)).numpy()
    pool = PagedKVCache(num_pages=12, page_size=2, num_kv_heads=layer.num_kv_heads,
                        head_dim=2, dtype="float64")
    view = pool.view([10, 11, 12])
    out = [layer(tensor(x[:, :3]), kv_cache=view).numpy()]
    out += [layer(tensor(x[:, t:t + 1]), kv_cache=view).numpy() for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate(out, axis=1), full, atol=1e-12)
    assert len(view) == 7
