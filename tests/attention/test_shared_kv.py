"""Keys and values shared across layers (``attention/shared_kv.py``): a consumer equals softmax
attention of its own queries over its producer's keys and values, written here in NumPy over
a grid of sizes; decoding through the two caches in any split equals the full forward, and
the consumer's cache holds nothing; float64 gradients reach the producer's key and value
projections through the consumer's output; the hooks show the borrowed keys; bad sources and
steps are named. The decoder's ``kv_shared_layers`` (Gemma 4's) is checked in
tests/models/test_decoder.py."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, KVCache, SharedKVCache, dense_attention_array
from minitx.validate import OptionError
from support import assert_close, tensor, to_host


def pair(e=12, h=4, hkv=2, causal=True, seed=0):
    minitx.manual_seed(seed)
    producer = REGISTRY["shared_kv"](e, h, causal=causal, num_kv_heads=hkv).double().eval()
    consumer = REGISTRY["shared_kv"](e, h, causal=causal, num_kv_heads=hkv,
                                     source=producer).double().eval()
    return producer, consumer


def numpy_consumer(producer, consumer, x, x2, causal):
    """softmax(Q_c K_pᵀ/√D) V_p, projected out, from the two layers' host weights."""
    p = {k: to_host(v) for k, v in producer.state_dict().items()}
    c = {k: to_host(v) for k, v in consumer.state_dict().items()}
    b, n, e = x.shape
    d = producer.head_dim

    def heads(t, h):
        return t.reshape(b, n, h, d).transpose(0, 2, 1, 3)
    q = heads(x2 @ c["q_proj.weight"].T + c["q_proj.bias"], consumer.num_heads)
    k = heads(x @ p["k_proj.weight"].T + p["k_proj.bias"], producer.num_kv_heads)
    v = heads(x @ p["v_proj.weight"].T + p["v_proj.bias"], producer.num_kv_heads)
    z = dense_attention_array(q, k, v, np.tri(n, dtype=bool) if causal else None)
    return z.transpose(0, 2, 1, 3).reshape(b, n, e) @ c["out_proj.weight"].T + \
        c["out_proj.bias"]


@settings(deadline=None, max_examples=25)
@given(n=st.integers(1, 10), heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 1)]),
       causal=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_a_consumer_attends_to_its_producers_keys_and_values(n, heads, causal, seed):
    h, hkv = heads
    producer, consumer = pair(e=4 * h, h=h, hkv=hkv, causal=causal, seed=seed)
    g = np.random.default_rng(seed)
    x, x2 = g.standard_normal((2, 2, n, 4 * h))
    with minitx.no_grad():
        producer(tensor(x))
        got = consumer(tensor(x2))
    assert_close(got, numpy_consumer(producer, consumer, x, x2, causal), atol=1e-12)
    # no key or value projection of its own, and the producer's are not its parameters
    assert sorted(n for n, _ in consumer.named_parameters()) == \
        ["out_proj.bias", "out_proj.weight", "q_proj.bias", "q_proj.weight"]


@settings(deadline=None, max_examples=25)
@given(n=st.integers(2, 12), cuts=st.lists(st.integers(1, 11), max_size=4),
       seed=st.integers(0, 2 ** 16))
def test_decoding_through_the_caches_equals_the_full_forward(n, cuts, seed):
    producer, consumer = pair(seed=seed)
    g = np.random.default_rng(seed)
    x, x2 = g.standard_normal((2, 2, n, 12))
    with minitx.no_grad():
        producer(tensor(x))
        full = to_host(consumer(tensor(x2)))
        caches = producer.new_cache(), consumer.new_cache()
        assert isinstance(caches[0], KVCache) and isinstance(caches[1], SharedKVCache)
        bounds = [0, *sorted({c for c in cuts if c < n}), n]
        steps = []
        for a, b in zip(bounds, bounds[1:]):
            producer(tensor(x[:, a:b]), kv_cache=caches[0])
            steps.append(to_host(consumer(tensor(x2[:, a:b]), kv_cache=caches[1])))
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-12)
    assert len(caches[1]) == n and caches[1].numbers == 0
    assert caches[0].keys.shape == (2, 2, n, 3)


def test_gradients_reach_the_producers_projections_through_the_consumer():
    """float64 central differences for both inputs and every parameter of both layers, through
    the consumer's output alone."""
    producer, consumer = pair(e=8, h=2, hkv=1)
    g = np.random.default_rng(1)
    x, x2 = (tensor(g.standard_normal((1, 4, 8)), requires_grad=True) for _ in range(2))
    params = [*producer.parameters(), *consumer.parameters()]

    def run(a, b, *ps):
        producer(a)
        return consumer(b)
    assert minitx.gradcheck(run, (x, x2, *params))
    producer(x)
    minitx.functional.sum(consumer(x2) ** 2).backward()
    assert np.abs(to_host(producer.k_proj.weight.grad)).max() > 0
    assert np.abs(to_host(producer.v_proj.weight.grad)).max() > 0


def test_the_consumers_hooks_show_the_borrowed_keys():
    producer, consumer = pair()
    x, x2 = np.random.default_rng(2).standard_normal((2, 2, 5, 12))
    seen = {}
    producer.hook_shared.add_hook(lambda t, h: seen.__setitem__("shared", t.numpy()))
    consumer.hook_k.add_hook(lambda t, h: seen.__setitem__("k", t.numpy()))
    with minitx.no_grad():
        producer(tensor(x))
        consumer(tensor(x2))
    # hook_k is (B, Nk, Hkv, D); the shared keys (B, Hkv, Nk, D)
    assert np.array_equal(seen["k"], seen["shared"].transpose(0, 2, 1, 3))


def test_bad_sources_and_steps_are_refused_by_name():
    producer, consumer = pair()
    with pytest.raises(OptionError, match="source must be a producing SharedKVAttention"):
        REGISTRY["shared_kv"](12, 4, source=consumer)
    with pytest.raises(OptionError, match="source must be a producing.*got Linear"):
        REGISTRY["shared_kv"](12, 4, source=producer.q_proj)
    with pytest.raises(OptionError, match="num_kv_heads=4 heads of 3"):
        REGISTRY["shared_kv"](12, 4, source=producer)
    fresh_producer, fresh_consumer = pair()
    x = tensor(np.zeros((1, 3, 12)))
    with pytest.raises(ValueError, match="source layer must run first.*seen 3.*for None"):
        fresh_consumer(x)
    fresh_producer(tensor(np.zeros((1, 2, 12))))
    with pytest.raises(ValueError, match="seen 3 tokens, the source holds keys for 2"):
        fresh_consumer(x)
    with pytest.raises(OptionError, match="kv_cache must be a SharedKVCache"):
        fresh_consumer(x, kv_cache=KVCache())
