"""Reformer: LSH hashing, the one-bucket limit, causality, reversible layers, chunked FF."""
import numpy as np
import pytest

import minitx.functional as F
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.reformer import lsh_hash
from minitx.nn.module import Module, Parameter
from minitx.nn.reversible import ReversibleBlock, ReversibleSequence, chunked_feed_forward
from support import assert_close, qkv, tensor


def test_lsh_hash_is_angular_and_in_range():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 50, 8))
    rot = rng.standard_normal((8, 4))
    b = lsh_hash(x, rot)
    assert b.min() >= 0 and b.max() < 8
    np.testing.assert_array_equal(lsh_hash(3.7 * x, rot), b)       # depends on direction only
    np.testing.assert_array_equal(lsh_hash(x, rot[:, :0]), 0)       # one bucket


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 2, 17, 40])
def test_one_bucket_equals_full_attention_without_self(n, causal):
    layer = REGISTRY["reformer"](16, 2, causal=causal, n_buckets=1, n_hashes=1, chunk_size=64)
    q, k, v = qkv(n, d=8)
    out = layer.attend(*[tensor(x) for x in (q, k, v)])
    allowed, keys = layer.pattern_reference(q, v)                # on the host
    if n > 1 and not causal:
        assert not allowed[0, 0]                  # the no-self rule
    assert_close(out, dense_attention_array(q, keys, v, allowed), atol=1e-10)


def test_more_rounds_combine_and_stay_normalised():
    layer = REGISTRY["reformer"](16, 2, n_buckets=4, n_hashes=3, chunk_size=4)
    q, k, _ = qkv(20, d=8)
    v = np.ones((2, 2, 20, 8))
    out = layer.attend(*[tensor(x) for x in (q, k, v)])
    assert_close(out, 1.0, atol=1e-12)   # weights sum to one over rounds


@pytest.mark.parametrize("n_buckets,chunk", [(4, 4), (8, 3), (2, 16)])
def test_causal_lsh_never_sees_the_future(n_buckets, chunk):
    layer = REGISTRY["reformer"](16, 2, causal=True, n_buckets=n_buckets, chunk_size=chunk)
    q, k, v = qkv(30, d=8, seed=1)
    out1 = layer.attend(*[tensor(x) for x in (q, k, v)]).numpy()
    q2, v2 = q.copy(), v.copy()
    q2[:, :, 12:] = np.random.default_rng(5).standard_normal(q2[:, :, 12:].shape)
    v2[:, :, 12:] += 1
    out2 = layer.attend(*[tensor(x) for x in (q2, k, v2)]).numpy()
    np.testing.assert_allclose(out1[:, :, :12], out2[:, :, :12], atol=1e-12)


def test_rotations_are_a_fixed_buffer_until_redrawn():
    layer = REGISTRY["reformer"](16, 2).eval()
    r0 = layer.rotations.numpy().copy()
    assert "rotations" in dict(layer.named_buffers())
    layer.redraw()
    assert not np.allclose(layer.rotations.numpy(), r0)
    with pytest.raises(ValueError, match="n_buckets"):
        REGISTRY["reformer"](16, 2, n_buckets=3)


# ---- reversible layers ------------------------------------------------------------------

class MLP(Module):
    def __init__(self, e, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = Parameter(rng.standard_normal((e, 2 * e)) / np.sqrt(e))
        self.w2 = Parameter(rng.standard_normal((2 * e, e)) / np.sqrt(2 * e))

    def forward(self, x):
        return F.matmul(F.tanh(F.matmul(x, self.w1)), self.w2)


def make_blocks(depth, e=6):
    return [ReversibleBlock(MLP(e, 2 * i), MLP(e, 2 * i + 1)) for i in range(depth)]


def saved_bytes(tensor):
    """Bytes the graph behind ``tensor`` keeps for backward (every context's saved arrays)."""
    from minitx.autograd.engine import topological_order
    total = 0
    for ctx in topological_order(tensor._ctx):
        for a in ctx.saved_tensors or ():
            total += getattr(a, "nbytes", 0)
    return total


def test_reversible_gradients_equal_plain_composition():
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 6))
    g1, g2 = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 6))
    blocks = make_blocks(3)
    results = []
    for mode in ("plain", "reversible"):
        for b in blocks:
            b.zero_grad()
        a, b_ = tensor(x1, requires_grad=True), tensor(x2, requires_grad=True)
        if mode == "plain":
            y1, y2 = a, b_
            for blk in blocks:
                y1, y2 = blk(y1, y2)
        else:
            y1, y2 = ReversibleSequence(blocks)(a, b_)
        ((y1 * tensor(g1)).sum() + (y2 * tensor(g2)).sum()).backward()
        results.append((y1.numpy(), y2.numpy(), a.grad.numpy(), b_.grad.numpy(),
                        [p.grad.numpy().copy() for blk in blocks for p in blk.parameters()]))
    plain, rev = results
    for u, w in zip(plain[:4], rev[:4]):
        np.testing.assert_allclose(u, w, atol=1e-10)
    for u, w in zip(plain[4], rev[4]):
        np.testing.assert_allclose(u, w, atol=1e-10)


def test_reversible_inverse_recovers_inputs():
    rng = np.random.default_rng(1)
    blk = make_blocks(1)[0]
    x1, x2 = (tensor(rng.standard_normal((3, 6))) for _ in range(2))
    r1, r2 = blk.inverse(*blk(x1, x2))
    assert_close(r1, x1, atol=1e-12)
    assert_close(r2, x2, atol=1e-12)


def test_saved_memory_does_not_grow_with_depth():
    rng = np.random.default_rng(2)
    x1, x2 = (tensor(rng.standard_normal((4, 32, 6)), requires_grad=True) for _ in range(2))
    rev, plain = [], []
    for depth in (1, 2, 4, 8):
        blocks = make_blocks(depth)
        y1, _ = ReversibleSequence(blocks)(x1, x2)
        rev.append(saved_bytes(y1))
        p1, p2 = x1, x2
        for blk in blocks:
            p1, p2 = blk(p1, p2)
        plain.append(saved_bytes(p1))
    assert rev[0] == rev[1] == rev[2] == rev[3], rev             # constant in depth
    assert plain[3] > 6 * plain[0], plain                       # plain grows ~linearly
    assert rev[3] < plain[3] / 8


def test_chunked_feed_forward_equals_unchunked():
    rng = np.random.default_rng(3)
    ff = MLP(6, 9)
    x = rng.standard_normal((2, 13, 6))
    g = rng.standard_normal((2, 13, 6))
    results = []
    for chunks in (1, 4, 13):
        ff.zero_grad()
        t = tensor(x, requires_grad=True)
        out = chunked_feed_forward(ff, t, chunks)
        out.backward(g)
        results.append((out.numpy(), t.grad.numpy(), ff.w1.grad.numpy().copy()))
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_allclose(a, b, atol=1e-12)
    with pytest.raises(ValueError, match="chunks"):
        chunked_feed_forward(ff, tensor(x), 0)
