"""DeepSeek-V3.2's lightning indexer (``models/indexer.py``, ``DecoderConfig.index_topk``):
its scores and choice against the formula written out in NumPy, the attention restricted to
the chosen keys, plain MLA when k covers the context, decoding through the caches as the
full forward does, float64 gradients, the counts, and bad options refused by name. Equality
with HuggingFace's DeepSeek-V3.2 is ``tests/oracles/test_hybrid_deepseek_v32.py``.
"""
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.models import Decoder, DecoderConfig, count_parameters, kv_cache_bytes
from minitx.models.indexer import IndexedLatentCache
from support import assert_close, tensor, to_host

V = 31


def _config(topk=3, heads=3, dim=6, q_lora=6, rope=None, **extra):
    return DecoderConfig(vocab_size=V, hidden_size=16, num_layers=2, num_heads=4,
                         attention="mla", q_lora_rank=q_lora, kv_lora_rank=5,
                         qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2,
                         rope_interleave=True, index_topk=topk, index_n_heads=heads,
                         index_head_dim=dim,
                         rope=rope or {"rope_type": "default", "rope_theta": 50.0}, **extra)


def _model(seed=0, **options):
    minitx.manual_seed(seed)
    model = Decoder(_config(**options)).to(dtype="float64")
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.copy_(rng.standard_normal(p.shape) * 0.5)
    return model


def _ids(b, n, seed=1):
    return np.random.default_rng(seed).integers(0, V, (b, n))


def _rotate_halves(x, pos, theta):
    """x (..., N, d) rotated at positions pos (N,) as two halves (rotate_half)."""
    d = x.shape[-1]
    angle = pos[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]       # (N, d/2)
    cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))
    half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + half * sin


def _reference_scores(layer, x, config):
    """I (B, N, N), −inf at future keys: the module docstring's formula on raw arrays."""
    w = {k: to_host(p.data) for k, p in layer.named_parameters()}
    b, n, _ = x.shape
    hi, di, dr = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
    theta, pos = config.rope["rope_theta"], np.arange(n, dtype=float)
    # MLA's q latent: RMSNorm (eps 1e-6) of q_a_proj x
    ql = x @ w["q_a_proj.weight"].T
    ql = ql / np.sqrt((ql ** 2).mean(-1, keepdims=True) + 1e-6) * w["q_a_layernorm.weight"]
    q = (ql @ w["indexer.wq_b.weight"].T).reshape(b, n, hi, di).transpose(0, 2, 1, 3)
    q[..., :dr] = _rotate_halves(q[..., :dr], pos, theta)
    k = x @ w["indexer.wk.weight"].T
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6)
    k = k * w["indexer.k_norm.weight"] + w["indexer.k_norm.bias"]
    k[..., :dr] = _rotate_halves(k[..., :dr], pos, theta)
    weights = (x @ w["indexer.weights_proj.weight"].T) / math.sqrt(hi * di)    # (B, N, h_I)
    scores = np.einsum("btj,bjts->bts", weights,
                       np.maximum(np.einsum("bjtd,bsd->bjts", q, k), 0.0))
    return np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)


def _capture(model, layer=0):
    seen = {}
    attn = model.blocks[layer].attn
    for name in ("hook_index_scores", "hook_topk_indices"):
        getattr(attn.indexer, name).add_hook(lambda t, h, name=name: seen.__setitem__(
            name, t.numpy()))
    for name in ("hook_q", "hook_k", "hook_v", "hook_z"):
        getattr(attn, name).add_hook(lambda t, h, name=name: seen.__setitem__(name, t.numpy()))
    model.blocks[layer].hook_resid_pre.add_hook(lambda t, h: seen.__setitem__("x", t.numpy()))
    return seen


@settings(max_examples=10, deadline=None)
@given(topk=st.integers(1, 5), heads=st.integers(1, 4), dim=st.sampled_from([4, 6]),
       n=st.integers(1, 9), seed=st.integers(0, 3))
def test_scores_and_choice_are_the_formula(topk, heads, dim, n, seed):
    model = _model(seed, topk=topk, heads=heads, dim=dim)
    seen = _capture(model)
    model(_ids(2, n, seed))
    x = model.blocks[0].ln1(tensor(seen["x"])).numpy()        # the attention's input
    ref = _reference_scores(model.blocks[0].attn, x, model.config)
    got = seen["hook_index_scores"]
    assert got.shape == (2, n, n)
    assert np.array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    assert_close(got[finite], ref[finite], rtol=1e-10, atol=1e-12)
    # the choice: the k best visible keys of each row, ties to the earlier key
    chosen = seen["hook_topk_indices"]
    assert chosen.shape == (2, n, min(topk, n))
    for bi in range(2):
        for t in range(n):
            order = np.argsort(-ref[bi, t, :t + 1], kind="stable")[:topk]
            row = chosen[bi, t]
            assert list(row[row >= 0]) == list(order)
            assert (row < 0).sum() == max(0, min(topk, n) - (t + 1))


def test_attention_reads_only_the_chosen_keys():
    """z = softmax over the chosen keys only, from the layer's own q, k, v (hooks)."""
    model = _model(2, topk=2)
    seen = _capture(model)
    model(_ids(2, 7))
    q, k, v = (seen[f"hook_{s}"].transpose(0, 2, 1, 3) for s in "qkv")      # (B, H, N, ·)
    idx = seen["hook_topk_indices"]
    chosen = np.zeros((2, 7, 7), bool)
    for bi in range(2):
        for t in range(7):
            chosen[bi, t, idx[bi, t][idx[bi, t] >= 0]] = True
    assert chosen.sum(-1).tolist() == [[1] + [2] * 6] * 2
    s = np.einsum("bhtd,bhsd->bhts", q, k) * model.blocks[0].attn.scale
    s = np.where(chosen[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    z = np.einsum("bhts,bhsd->bhtd", p / p.sum(-1, keepdims=True), v)
    assert_close(seen["hook_z"], z.transpose(0, 2, 1, 3), rtol=1e-10, atol=1e-12)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 8), extra=st.integers(0, 3), padded=st.booleans())
def test_topk_covering_the_context_is_plain_mla(n, extra, padded):
    sparse = _model(3, topk=n + extra)
    plain = Decoder(dataclasses.replace(sparse.config, index_topk=None)).to(dtype="float64")
    plain.load_state_dict({k: v for k, v in sparse.state_dict().items() if "indexer" not in k})
    ids = _ids(2, n)
    mask = np.ones((2, n), int)
    if padded and n > 1:
        mask[0, :1] = 0                                # left padding in row 0
    keep = mask if padded else None
    a, b = sparse(ids, attention_mask=keep).numpy(), plain(ids, attention_mask=keep).numpy()
    rows = mask.astype(bool)
    assert_close(a[rows], b[rows], rtol=1e-12, atol=1e-12)
    # and fewer keys than the context changes the output: the choice matters
    if n >= 4:
        fewer = Decoder(dataclasses.replace(sparse.config, index_topk=1)).to(dtype="float64")
        fewer.load_state_dict(sparse.state_dict())
        assert np.abs(fewer(ids).numpy() - b).max() > 1e-3


def test_padding_keys_are_never_chosen():
    model = _model(4, topk=3)
    seen = _capture(model)
    mask = np.ones((2, 8), int)
    mask[0, :3] = 0
    model(_ids(2, 8), attention_mask=mask)
    idx = seen["hook_topk_indices"]
    assert not np.isin(idx[0, 3:], [0, 1, 2]).any()
    assert np.isneginf(seen["hook_index_scores"][0, :, :3]).all()


@settings(max_examples=6, deadline=None)
@given(topk=st.integers(1, 4), split=st.integers(1, 6), seed=st.integers(0, 3))
def test_cached_decoding_equals_the_full_forward(topk, split, seed):
    model = _model(seed, topk=topk)
    ids = _ids(2, 9, seed)
    full = model(ids).numpy()
    caches = model.new_caches()
    assert all(isinstance(c, IndexedLatentCache) for c in caches)
    steps = [model(ids[:, :split], kv_caches=caches).numpy()]
    steps += [model(ids[:, i:i + 1], kv_caches=caches).numpy() for i in range(split, 9)]
    assert_close(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    # r + D_r latent numbers and d_I index-key numbers per token
    assert caches[0].keys.shape == (2, 1, 9, 5) and caches[0].values.shape == (2, 1, 9, 4)
    assert caches[0].index_keys.shape == (2, 9, 6)


def test_the_index_scores_hook_may_replace_the_choice():
    model = _model(5, topk=1)
    seen = _capture(model)
    # every query forced to read key 0 alone
    model.blocks[1].attn.indexer.hook_index_scores.add_hook(
        lambda t, h: minitx.tensor(np.where(np.isinf(t.numpy()), -np.inf,
                                            -np.arange(t.shape[-1], dtype=float))))
    picked = {}
    model.blocks[1].attn.indexer.hook_topk_indices.add_hook(
        lambda t, h: picked.__setitem__("i", t.numpy()))
    model(_ids(2, 6))
    assert (picked["i"] == 0).all() and seen["hook_topk_indices"].shape == (2, 6, 1)


def test_gradients_pass_a_float64_gradcheck():
    """The layer's gradient (through MLA on the chosen keys; the top-k is constant under a
    small change, and the indexer itself runs without gradient)."""
    model = _model(6, topk=2)
    layer = model.blocks[0].attn
    x = np.random.default_rng(7).standard_normal((2, 5, 16))
    minitx.gradcheck(lambda t: layer(t), (tensor(x, requires_grad=True),))
    out = layer(tensor(x, requires_grad=True))
    out.sum().backward()
    assert all(p.grad is None for p in layer.indexer.parameters())
    assert layer.q_b_proj.weight.grad is not None


def test_counts_include_the_indexer():
    model = _model(0, topk=3, heads=3, dim=6)
    c = model.config
    assert count_parameters(c)["total"] == sum(p.size for p in model.parameters())
    indexer = sum(p.size for p in model.blocks[0].attn.indexer.parameters())
    assert indexer == 6 * 3 * 6 + 16 * 6 + 2 * 6 + 16 * 3
    plain = dataclasses.replace(c, index_topk=None)
    assert count_parameters(c)["total"] - count_parameters(plain)["total"] == 2 * indexer
    # each token adds d_I numbers per layer to the caches
    assert kv_cache_bytes(c, 10, 1) - kv_cache_bytes(plain, 10, 1) == 2 * 10 * 6


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="index_topk"):
        Decoder(_config(topk=0))
    with pytest.raises(ValueError, match="q_lora_rank"):
        Decoder(_config(q_lora=None))
    with pytest.raises(ValueError, match="attention='mla'"):
        Decoder(DecoderConfig(index_topk=4, index_n_heads=2, index_head_dim=4))
    with pytest.raises(ValueError, match="index_n_heads"):
        Decoder(_config(heads=None))
    with pytest.raises(ValueError, match=r"index_head_dim \(2\) must be at least"):
        Decoder(_config(dim=2))
    model = _model(0)
    from minitx.attention import KVCache
    with pytest.raises(TypeError, match="IndexedLatentCache"):
        model(_ids(1, 3), kv_caches=[KVCache(), KVCache()])
