"""nn.MultiheadAttention and the registered exact variants (mha, mqa, gqa, dot, additive):
gradients, keys, masks, GQA, fully masked batch elements, causality, errors."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
import minitx.nn as nn
from minitx.attention import (REGISTRY, ExactSelfAttention, causal_pattern,
                              dense_attention_array, default_kv_heads)
from minitx.attention import base as attention_base
from minitx.models import multihead as models_attention
from support import tensor, to_host

MINE = ["mha", "mqa", "gqa", "dot", "additive", "rope", "alibi", "relative"]


def mha(*args, **kw):
    return nn.MultiheadAttention(*args, **kw).to(dtype="float64")


# ---- nn.MultiheadAttention ---------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7])
def test_mha_gradcheck_self_attention(rng, n):
    layer = mha(4, 2, batch_first=True)
    x = tensor(rng.standard_normal((2, n, 4)), requires_grad=True)
    pad = np.zeros((2, n), bool)
    pad[1, 0] = n > 1

    def fn(x, w):
        return layer(x, x, x, key_padding_mask=pad)
    minitx.gradcheck(fn, (x, layer.in_proj_weight))


def test_mha_gradcheck_cross_kdim_vdim_and_gqa(rng):
    layer = mha(6, 3, kdim=5, vdim=2, num_kv_heads=1)
    q, k, v = (tensor(rng.standard_normal(s), requires_grad=True)
               for s in ((4, 2, 6), (3, 2, 5), (3, 2, 2)))
    mask = np.zeros((4, 3), bool)
    mask[1:, 2] = True
    minitx.gradcheck(lambda q, k, v: layer(q, k, v, attn_mask=mask), (q, k, v))
    minitx.gradcheck(lambda w: layer(q, k, v)[0], (layer.k_proj_weight,))


def test_mha_state_dict_keys():
    assert list(nn.MultiheadAttention(8, 2).state_dict()) == [
        "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    sd = nn.MultiheadAttention(8, 2, kdim=3, vdim=5).state_dict()
    assert {k: v.shape for k, v in sd.items()} == {
        "q_proj_weight": (8, 8), "k_proj_weight": (8, 3), "v_proj_weight": (8, 5),
        "in_proj_bias": (24,), "out_proj.weight": (8, 8), "out_proj.bias": (8,)}
    sd = nn.MultiheadAttention(8, 4, num_kv_heads=2).state_dict()  # D = 2, Hkv·D = 4
    assert {k: v.shape for k, v in sd.items()} == {
        "q_proj_weight": (8, 8), "k_proj_weight": (4, 8), "v_proj_weight": (4, 8),
        "in_proj_bias": (16,), "out_proj.weight": (8, 8), "out_proj.bias": (8,)}
    assert list(nn.MultiheadAttention(8, 2, bias=False).state_dict()) == [
        "in_proj_weight", "out_proj.weight"]


def test_mha_matches_dense_reference_with_gqa(rng):
    layer = mha(8, 4, num_kv_heads=2, batch_first=True)
    x = rng.standard_normal((2, 5, 8))
    out, w = layer(*[tensor(x, requires_grad=True) for _ in range(3)],
                   average_attn_weights=False)
    b = layer.in_proj_bias.numpy()
    q = x @ layer.q_proj_weight.numpy().T + b[:8]
    k = x @ layer.k_proj_weight.numpy().T + b[8:12]
    v = x @ layer.v_proj_weight.numpy().T + b[12:]
    split = lambda t, h: t.reshape(2, 5, h, 2).transpose(0, 2, 1, 3)   # noqa: E731
    heads = dense_attention_array(split(q, 4), split(k, 2), split(v, 2))
    merged = heads.transpose(0, 2, 1, 3).reshape(2, 5, 8)
    ref = merged @ layer.out_proj.weight.numpy().T + layer.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    assert w.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(w.numpy().sum(-1), 1.0)


def test_mha_fully_padded_batch_element_gives_bias_and_zero_grads(rng):
    layer = mha(4, 2, batch_first=True)
    q, k, v = (tensor(rng.standard_normal((2, 3, 4)), requires_grad=True) for _ in range(3))
    pad = np.zeros((2, 3), bool)
    pad[1] = True                                               # element 1: every key masked
    out, w = layer(q, k, v, key_padding_mask=pad)
    (out * tensor(rng.standard_normal(out.shape))).sum().backward()
    for t in (out, w, q.grad, k.grad, v.grad):
        assert np.isfinite(t.numpy()).all()
    # no attention: the heads give 0, so the output is out_proj(0) = its bias
    np.testing.assert_allclose(out.numpy()[1], np.broadcast_to(layer.out_proj.bias.numpy(),
                                                               (3, 4)))
    assert np.all(w.numpy()[1] == 0)
    for t in (q, k, v):
        assert np.all(t.grad.numpy()[1] == 0)
        assert np.any(t.grad.numpy()[0] != 0)


def test_mha_is_causal_without_mask_and_kv_cache(rng):
    layer = mha(8, 2, batch_first=True)
    x = rng.standard_normal((2, 6, 8))

    def qkv_leaves(a):                                          # query, key, value: 3 leaves
        return [tensor(a, requires_grad=True) for _ in range(3)]
    full, _ = layer(*qkv_leaves(x), is_causal=True)
    mask = ~causal_pattern(6, 6)                                # PyTorch polarity: True = masked
    np.testing.assert_allclose(layer(*qkv_leaves(x), attn_mask=mask)[0].numpy(), full.numpy(),
                               atol=1e-12)
    cache = minitx.attention.KVCache()
    steps = [layer(*qkv_leaves(x[:, t:t + 1]), is_causal=True, kv_cache=cache)[0].numpy()
             for t in range(6)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.numpy(), atol=1e-12)


def _blocked(nq, nk):
    """The causal mask in PyTorch's polarity, built here with triu: True where key j is in
    query i's future, j > i + (nk − nq) (bottom-right aligned)."""
    return np.triu(np.ones((nq, nk), bool), nk - nq + 1)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from(["bool", "float"]),
       st.integers(-1, 35))
def test_a_causal_attn_mask_is_recognised_exactly(nq, nk, kind, flip):
    """``is_causal_mask``: True for exactly the causal mask (bool True / float −inf above the
    diagonal, False / 0 elsewhere), False once one entry differs, for another shape, or for
    a per-head 3-d mask."""
    blocked = _blocked(nq, nk)
    mask = blocked if kind == "bool" else np.where(blocked, -np.inf, 0.0)
    changed = mask.copy()
    if 0 <= flip < mask.size:
        i, j = divmod(flip, nk)
        if kind == "bool":
            changed[i, j] = not changed[i, j]
        else:                                   # unblock a future key, or bias a visible one
            changed[i, j] = 0.0 if blocked[i, j] else 1.0
    is_causal = models_attention.is_causal_mask
    assert is_causal(mask, nq, nk)
    assert is_causal(minitx.tensor(mask), nq, nk)          # a Tensor too
    assert is_causal(changed, nq, nk) == (not 0 <= flip < mask.size)
    assert not is_causal(mask, nq + 1, nk)
    assert not is_causal(mask[None], nq, nk)
    assert not is_causal(blocked.astype(np.int64), nq, nk)
    assert not is_causal(None, nq, nk)


@pytest.mark.parametrize("kind", ["bool", "float", "near"])
def test_mha_runs_a_causal_attn_mask_as_the_causal_flag(rng, kind, monkeypatch):
    """A causal ``attn_mask`` reaches attention as ``is_causal=True`` with no mask (the flag
    skips the upper triangle); a mask one entry away from causal stays a mask. Either way the
    output and gradients equal the dense formula under that mask."""
    nq = 5
    blocked = _blocked(nq, nq)
    if kind == "near":
        blocked[3, 4] = False                   # query 3 may see key 4: not causal
    mask = blocked if kind != "float" else np.where(blocked, -np.inf, 0.0)
    seen = []
    sdpa = attention_base.scaled_dot_product_attention          # what hookable_attention calls

    def spy(*args, **kw):
        seen.append((kw["is_causal"], kw["attn_mask"] is None))
        return sdpa(*args, **kw)
    monkeypatch.setattr(attention_base, "scaled_dot_product_attention", spy)
    layer = mha(4, 2, batch_first=True)
    x = tensor(rng.standard_normal((2, nq, 4)), requires_grad=True)
    out, _ = layer(x, x, x, attn_mask=mask, need_weights=False, is_causal=kind != "near")
    assert seen == [(True, True)] if kind != "near" else seen == [(False, False)]
    w, b = layer.in_proj_weight.numpy(), layer.in_proj_bias.numpy()
    split = lambda t: t.reshape(2, nq, 2, 2).transpose(0, 2, 1, 3)   # noqa: E731
    xs = x.numpy()
    q, k, v = (split(xs @ w[i * 4:(i + 1) * 4].T + b[i * 4:(i + 1) * 4]) for i in range(3))
    heads = dense_attention_array(q, k, v, allowed=~blocked)
    ref = heads.transpose(0, 2, 1, 3).reshape(2, nq, 4) @ layer.out_proj.weight.numpy().T \
        + layer.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    minitx.gradcheck(lambda x: layer(x, x, x, attn_mask=mask, need_weights=False)[0], (x,))


def test_mha_dropout_only_in_training(rng):
    layer = mha(4, 2, dropout=0.5, batch_first=True)
    x = tensor(rng.standard_normal((1, 5, 4)), requires_grad=True)
    minitx.manual_seed(0)
    a = layer(x, x, x)[0].numpy()
    layer.eval()
    b, c = layer(x, x, x)[0].numpy(), layer(x, x, x)[0].numpy()
    np.testing.assert_array_equal(b, c)
    assert not np.allclose(a, b)


@pytest.mark.parametrize("kw,match", [
    (dict(embed_dim=10, num_heads=3), r"embed_dim \(10\) must be divisible by num_heads \(3\)"),
    (dict(embed_dim=8, num_heads=4, num_kv_heads=3),
     r"num_heads \(4\) must be divisible by num_kv_heads \(3\)"),
    (dict(embed_dim=8, num_heads=2, add_bias_kv=True), "add_bias_kv"),
    (dict(embed_dim=0, num_heads=2), "embed_dim must be a positive int"),
    (dict(embed_dim=8, num_heads=2, dropout=1.5), r"dropout must be a probability in \[0, 1\)"),
])
def test_mha_construction_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        nn.MultiheadAttention(**kw)


def test_mha_call_errors(rng):
    layer = mha(8, 2)
    x = tensor(rng.standard_normal((5, 2, 8)), requires_grad=True)
    with pytest.raises(ValueError, match="query must have last dim 8"):
        layer(tensor(np.zeros((5, 2, 7)), requires_grad=True), x, x)
    with pytest.raises(ValueError, match="3-d .batched. or 2-d"):
        layer(tensor(np.zeros((5, 2, 8, 1)), requires_grad=True), x, x)
    with pytest.raises(ValueError, match=r"attn_mask must be a bool or float array "
                                         r"\(L, S\) = \(5, 5\) .*, got bool \(4, 5\)"):
        layer(x, x, x, attn_mask=np.zeros((4, 5), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool or float array "
                                         r"\(N, S\) = \(2, 5\), got bool \(5, 2\)"):
        layer(x, x, x, key_padding_mask=np.zeros((5, 2), bool))
    with pytest.raises(ValueError, match="batch sizes differ"):
        layer(x, tensor(np.zeros((5, 3, 8)), requires_grad=True),
              tensor(np.zeros((5, 3, 8)), requires_grad=True))


# ---- registered variants -----------------------------------------------------------------

def test_registered_names_and_kinds():
    for name in MINE:
        assert name in REGISTRY
    assert REGISTRY["mha"].kind == "exact" and REGISTRY["gqa"].kind == "exact"
    assert {REGISTRY[n].kind for n in ("dot", "additive", "rope", "alibi", "relative")} == \
        {"score"}
    assert REGISTRY["mqa"](8, 4).num_kv_heads == 1
    assert REGISTRY["gqa"](8, 4).num_kv_heads == 2
    assert REGISTRY["gqa"](12, 6).num_kv_heads == 3
    assert [default_kv_heads(h) for h in (1, 2, 3, 6, 8, 9)] == [1, 1, 1, 3, 4, 3]
    with pytest.raises(ValueError, match="mqa uses num_kv_heads=1"):
        REGISTRY["mqa"](8, 4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be divisible by num_kv_heads"):
        REGISTRY["gqa"](8, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="embed_dim .10. must be divisible by num_heads .4."):
        REGISTRY["mha"](10, 4)


@pytest.mark.parametrize("name", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_exact_variants_equal_dense_under_pattern(rng, name, causal):
    layer = REGISTRY[name](8, 4, causal=causal).to(dtype="float64")
    hkv = layer.num_kv_heads
    q, k, v = (rng.standard_normal((2, h, 6, 2)) for h in (4, hkv, hkv))
    out = layer.attend(*(tensor(a, requires_grad=True) for a in (q, k, v))).numpy()
    np.testing.assert_allclose(out, dense_attention_array(q, k, v, layer.pattern(6)),
                               atol=1e-12)


def test_dot_variant_formula(rng):
    for general in (False, True):
        layer = REGISTRY["dot"](8, 2, general=general).to(dtype="float64")
        if general:
            layer.score_weight.copy_(rng.standard_normal(layer.score_weight.shape))
        q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
        w = layer.score_weight.numpy() if general else np.eye(4)
        s = (q @ w) @ np.swapaxes(k, -1, -2)                     # unscaled: qᵀ W k
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
        np.testing.assert_allclose(layer.attend(tq, tk, tv).numpy(), p @ v, atol=1e-12)
        if general:
            minitx.gradcheck(lambda q, w: layer.attend(q, tensor(k, requires_grad=True),
                                                       tensor(v, requires_grad=True)),
                             (tensor(q, requires_grad=True), layer.score_weight))


def test_additive_variant_formula(rng):
    layer = REGISTRY["additive"](8, 2, causal=True, hidden_dim=3).to(dtype="float64")
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    wq, wk, w = (m.weight.numpy() for m in (layer.W_q, layer.W_k, layer.w))
    e = np.tanh((q @ wq.T)[..., :, None, :] + (k @ wk.T)[..., None, :, :]) @ w[0]
    e = np.where(causal_pattern(5, 5), e, -np.inf)
    p = np.exp(e - e.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tq, tk, tv = (tensor(a, requires_grad=True) for a in (q, k, v))
    np.testing.assert_allclose(layer.attend(tq, tk, tv).numpy(), p @ v, atol=1e-12)


@pytest.mark.parametrize("name", MINE)
@pytest.mark.parametrize("n", [1, 7])
def test_variant_gradcheck(rng, name, n):
    layer = REGISTRY[name](4, 2, causal=True).to(dtype="float64")
    x = tensor(rng.standard_normal((1, n, 4)), requires_grad=True)
    minitx.gradcheck(layer, (x,))


@pytest.mark.parametrize("name", MINE)
def test_causal_variants_never_look_ahead(rng, name):
    layer = REGISTRY[name](8, 2, causal=True).to(dtype="float64")
    x = rng.standard_normal((1, 9, 8))
    y = layer(tensor(x)).numpy()
    for t in (0, 4, 7):
        x2 = x.copy()
        x2[:, t + 1:] = rng.standard_normal(x2[:, t + 1:].shape)
        np.testing.assert_allclose(layer(tensor(x2)).numpy()[:, :t + 1], y[:, :t + 1],
                                   atol=1e-12)


@pytest.mark.parametrize("name", ["mha", "mqa", "gqa", "dot", "additive"])
@given(perm=st.permutations(list(range(5))))
def test_unmasked_variants_are_permutation_equivariant(name, perm):
    minitx.manual_seed(0)
    layer = REGISTRY[name](8, 2).to(dtype="float64")
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    y = layer(tensor(x)).numpy()
    np.testing.assert_allclose(layer(tensor(x[:, perm])).numpy(), y[:, perm], atol=1e-12)


def test_variant_attn_mask_and_record_weights(rng):
    layer = REGISTRY["gqa"](8, 4).to(dtype="float64")
    assert isinstance(layer, ExactSelfAttention)
    x = tensor(rng.standard_normal((2, 5, 8)))
    allowed = np.ones((2, 1, 1, 5), bool)
    allowed[1, ..., 3:] = False                                 # batch 1: keys 3, 4 are padding
    layer.record_weights = True
    layer(x, attn_mask=allowed)
    w = to_host(layer.last_attn_weights)                        # a raw array of the backend
    assert w.shape == (2, 4, 5, 5) and np.all(w[1, ..., 3:] == 0)
    np.testing.assert_allclose(w.sum(-1), 1.0)
    with pytest.raises(ValueError, match=r"x must be \(B, N, 8\)"):
        layer(tensor(np.zeros((2, 5, 4)), requires_grad=True))
