"""Hook points, run_with_cache and run_with_hooks: names, shapes, the identities that
tie the activations together, replacement, gradients, and clean-up."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.models import GPT, GPTConfig, MultiheadAttention
from minitx.nn import HookPoint, act_name
from support import assert_close, assert_equal, tensor, to_host

V, E, H, L = 13, 16, 2, 2
D = E // H


def gpt(attention="mha", n_layer=L, seed=0, **config):
    minitx.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=n_layer, n_head=H, n_embd=E,
                         attention=attention, **config)).double()


def tokens(b=2, t=7, seed=1):
    return minitx.tensor(np.random.default_rng(seed).integers(0, V, (b, t)))


def expected_shapes(b, t, n_layer=L, hkv=H):
    """Every GPT hook name and its documented shape (docs/look_inside.md's table)."""
    shapes = {"hook_embed": (b, t, E), "hook_pos_embed": (b, t, E),
              "ln_final.hook_scale": (b, t, 1), "ln_final.hook_normalized": (b, t, E)}
    for i in range(n_layer):
        p = f"blocks.{i}."
        shapes.update({
            p + "hook_resid_pre": (b, t, E), p + "hook_resid_mid": (b, t, E),
            p + "hook_resid_post": (b, t, E), p + "hook_attn_out": (b, t, E),
            p + "hook_mlp_out": (b, t, E),
            p + "ln1.hook_scale": (b, t, 1), p + "ln1.hook_normalized": (b, t, E),
            p + "ln2.hook_scale": (b, t, 1), p + "ln2.hook_normalized": (b, t, E),
            p + "attn.hook_q": (b, t, H, D), p + "attn.hook_k": (b, t, hkv, D),
            p + "attn.hook_v": (b, t, hkv, D), p + "attn.hook_z": (b, t, H, D),
            p + "attn.hook_attn_scores": (b, H, t, t), p + "attn.hook_pattern": (b, H, t, t),
            p + "mlp.hook_pre": (b, t, 4 * E), p + "mlp.hook_post": (b, t, 4 * E)})
    return shapes


# ---- names, firing, shapes --------------------------------------------------------------------

@pytest.mark.parametrize("attention,hkv", [("mha", H), ("mqa", 1), ("gqa", 1), ("dot", H),
                                           ("additive", H)])
def test_every_gpt_hook_fires_once_with_its_documented_shape(attention, hkv):
    model = gpt(attention)
    want = expected_shapes(2, 7, hkv=hkv)
    assert sorted(model.hook_names()) == sorted(want)
    seen = []
    model.run_with_hooks(tokens(), fwd_hooks=[(lambda n: True,
                                               lambda x, hook: seen.append((hook.name,
                                                                            x.shape)))])
    assert sorted(n for n, _ in seen) == sorted(want)          # each exactly once
    assert {n: tuple(s) for n, s in seen} == want


# nystrom with at least as many landmarks as the 8 tokens is softmax attention and forms no
# landmark: give it fewer, so that every hook it names runs
HOOK_OPTIONS = {"nystrom": {"num_landmarks": 4}}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_variant_names_its_hooks_and_each_fires_once(name):
    cls = REGISTRY[name]
    minitx.manual_seed(0)
    layer = cls(E, H, **HOOK_OPTIONS.get(name, {})).double()
    names = layer.hook_names()
    own = ("hook_mixed",) if name == "fnet" else ("hook_q", "hook_k", "hook_v", "hook_z")
    assert set(own) <= set(names)
    x = tensor(np.random.default_rng(0).standard_normal((2, 8, E)))
    count = {}

    def tally(t, hook):
        count[hook.name] = count.get(hook.name, 0) + 1
        square = hook.name in ("hook_mask", "hook_position_bias")           # (N, N) maps
        assert t.shape[0] in ((8,) if square else (1, 2))

    with layer.hooks([(lambda n: True, tally)]):
        layer(x)
    assert count == {n: 1 for n in names}
    assert not any(p.active for p in layer.hook_points().values())   # the context removed them


def test_hook_renames_follow_transformerlens():
    assert act_name("pattern", 1) == "blocks.1.attn.hook_pattern"
    assert act_name("resid_pre", 0) == "blocks.0.hook_resid_pre"
    assert act_name("post", 3) == "blocks.3.mlp.hook_post"
    assert act_name("scale", 0, "ln2") == "blocks.0.ln2.hook_scale"
    assert act_name("normalized", None, "ln_final") == "ln_final.hook_normalized"
    assert act_name("embed") == "hook_embed"


# ---- identities in float64 --------------------------------------------------------------------

def _gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def test_cached_activations_satisfy_the_transformer_identities():
    model = gpt()
    toks = tokens(2, 9)
    logits, c = model.run_with_cache(toks)
    h = {n: to_host(t) for n, t in c.items()}
    wte = to_host(model.wte.weight)
    ids = to_host(toks)
    assert_close(h["hook_embed"], wte[ids], rtol=0, atol=0)
    assert_close(h["blocks.0.hook_resid_pre"], h["hook_embed"] + h["hook_pos_embed"],
                 rtol=1e-12)
    causal = np.tril(np.ones((9, 9), bool))
    for i in range(L):
        p = f"blocks.{i}."
        resid_pre, scores, pattern = (h[p + "hook_resid_pre"], h[p + "attn.hook_attn_scores"],
                                      h[p + "attn.hook_pattern"])
        # layer norm: normalized = (x − mean) / scale, scale = sqrt(var + eps)
        mu = resid_pre.mean(-1, keepdims=True)
        assert_close(h[p + "ln1.hook_scale"], np.sqrt(resid_pre.var(-1, keepdims=True) + 1e-5),
                     rtol=1e-12)
        assert_close(h[p + "ln1.hook_normalized"], (resid_pre - mu) / h[p + "ln1.hook_scale"],
                     rtol=1e-12)
        # scores: −inf exactly where causality hides a key; q·k/√D elsewhere
        q, k, v = h[p + "attn.hook_q"], h[p + "attn.hook_k"], h[p + "attn.hook_v"]
        raw = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        assert np.all(np.isneginf(scores[..., ~causal]))
        assert_close(scores[..., causal], raw[..., causal], rtol=1e-12)
        # pattern = softmax(scores) over keys; z = pattern · v per head
        e = np.exp(raw - raw.max(-1, keepdims=True)) * causal
        assert_close(pattern, e / e.sum(-1, keepdims=True), rtol=1e-12)
        assert_close(h[p + "attn.hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, v), rtol=1e-12)
        # attn_out = merge(z) W_Oᵀ + b_O ; residual stream sums
        wo, bo = to_host(model.h[i].attn.out_proj.weight), to_host(model.h[i].attn.out_proj.bias)
        assert_close(h[p + "hook_attn_out"], h[p + "attn.hook_z"].reshape(2, 9, E) @ wo.T + bo,
                     rtol=1e-10, atol=1e-14)
        assert_close(h[p + "hook_resid_mid"], resid_pre + h[p + "hook_attn_out"], rtol=1e-12)
        assert_close(h[p + "mlp.hook_post"], _gelu(h[p + "mlp.hook_pre"]), rtol=1e-10,
                     atol=1e-14)
        assert_close(h[p + "hook_resid_post"], h[p + "hook_resid_mid"] + h[p + "hook_mlp_out"],
                     rtol=1e-12)
        if i + 1 < L:
            assert_equal(h[f"blocks.{i + 1}.hook_resid_pre"], h[p + "hook_resid_post"])
    # the cached logits are the plain forward's, to rounding (LN and attention ran composed)
    plain, _ = model(toks)
    assert_close(logits, plain, rtol=1e-12, atol=1e-14)


def test_multihead_attention_pattern_matches_its_returned_weights():
    minitx.manual_seed(3)
    mha = MultiheadAttention(E, H, batch_first=True).double()
    x = tensor(np.random.default_rng(2).standard_normal((2, 6, E)))
    out0, w0 = mha(x, x, x, is_causal=True, average_attn_weights=False)
    with mha.hooks([("hook_pattern", lambda t, hook: None)]):
        out1, w1 = mha(x, x, x, is_causal=True, average_attn_weights=False)
    assert_close(w1, w0, rtol=1e-12, atol=1e-15)
    assert_close(out1, out0, rtol=1e-12, atol=1e-15)
    assert mha.hook_pattern.fwd_hooks == []


# ---- replacing activations --------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(0, 10_000))
def test_identity_hooks_change_nothing_bit_for_bit(b, t, seed):
    model = gpt(seed=seed % 7)
    toks = tokens(b, t, seed)
    keep = model.run_with_hooks(toks, fwd_hooks=[(lambda n: True, lambda x, hook: None)])[0]
    same = model.run_with_hooks(toks, fwd_hooks=[(lambda n: True, lambda x, hook: x)])[0]
    assert_equal(same, keep)
    # hook points outside LayerNorm and attention leave the fused path alone: bit for bit
    plain = model(toks)[0]
    resid = model.run_with_hooks(toks, fwd_hooks=[(lambda n: "resid" in n or "mlp" in n,
                                                   lambda x, hook: x)])[0]
    assert_equal(resid, plain)


def test_a_replacement_flows_downstream():
    model = gpt()
    toks = tokens()
    last = f"blocks.{L - 1}.hook_resid_post"
    logits, _ = model.run_with_hooks(toks, fwd_hooks=[(last, lambda x, hook: x * 0.0)])
    # LN_f of zeros is its bias, so every position gets the same logits: b_f · wteᵀ
    bias = to_host(model.ln_f.bias)
    assert_close(logits, np.broadcast_to(bias @ to_host(model.wte.weight).T, (2, 7, V)),
                 rtol=1e-12, atol=1e-15)


def test_a_hook_with_the_wrong_shape_or_type_is_refused_by_name():
    model = gpt()
    with pytest.raises(ValueError, match="blocks.0.hook_resid_mid.*shape"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.hook_resid_mid",
                                                   lambda x, hook: x[:, :1])])
    with pytest.raises(TypeError, match="hook_embed.*Tensor"):
        model.run_with_hooks(tokens(), fwd_hooks=[("hook_embed", lambda x, hook: 0)])
    with pytest.raises(KeyError, match="hook_resid_mdi"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.hook_resid_mdi", print)])


def test_hooks_are_removed_after_an_exception_inside_the_context():
    model = gpt()
    before = model.add_hook("hook_embed", lambda x, hook: None)   # set outside: must stay
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks([(lambda n: True, lambda x, hook: x)],
                         [("hook_embed", lambda g, hook: g)]):
            raise RuntimeError("boom")
    points = model.hook_points()
    assert sum(len(p.fwd_hooks) + len(p.bwd_hooks) for p in points.values()) == 1
    assert len(before[0].fwd_hooks) == 1
    model.reset_hooks()
    assert not any(p.active for p in model.hook_points().values())


def test_hook_raising_inside_forward_leaves_no_hook_behind():
    model = gpt()

    def bad(x, hook):
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.1.attn.hook_pattern", bad)])
    assert not any(p.active for p in model.hook_points().values())


# ---- the cache --------------------------------------------------------------------------------

def test_cache_is_detached_filtered_and_takes_the_shorthand():
    model = gpt()
    logits, cache = model.run_with_cache(tokens(), names_filter=lambda n: "pattern" in n)
    assert sorted(cache) == [f"blocks.{i}.attn.hook_pattern" for i in range(L)]
    assert cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"]
    assert ("pattern", 0) in cache and ("z", 0) not in cache
    assert not logits.requires_grad and all(not t.requires_grad for t in cache.values())
    assert all(t.is_leaf for t in cache.values())
    _, one = model.run_with_cache(tokens(), names_filter="hook_embed")
    assert list(one) == ["hook_embed"]
    with pytest.raises(KeyError, match="not in the cache"):
        cache["blocks.0.hook_resid_pre"]


# ---- gradients --------------------------------------------------------------------------------

def _metric(logits):
    return logits[0, -1, 3] - logits[1, 2, 5]


def test_incl_bwd_gradients_match_finite_differences():
    model = gpt()
    toks = tokens()
    names = ["hook_embed", "blocks.0.hook_resid_mid", "blocks.1.attn.hook_pattern",
             "blocks.1.ln2.hook_scale", "blocks.0.attn.hook_v"]
    _, cache = model.run_with_cache(toks, names_filter=names, incl_bwd=True, metric=_metric)
    rng = np.random.default_rng(0)
    eps = 1e-6
    for name in names:
        grad = to_host(cache[name + "_grad"])
        assert grad.shape == tuple(cache[name].shape)
        for _ in range(3):
            idx = tuple(int(rng.integers(0, s)) for s in grad.shape)

            def shifted(delta):
                def nudge(x, hook):
                    bump = np.zeros(x.shape)
                    bump[idx] = delta
                    return x + tensor(bump)
                logits, _ = model.run_with_hooks(toks, fwd_hooks=[(name, nudge)])
                return float(_metric(logits).item())

            fd = (shifted(eps) - shifted(-eps)) / (2 * eps)
            assert abs(fd - grad[idx]) <= 1e-6 + 1e-4 * abs(fd), (name, idx, fd, grad[idx])


def test_a_backward_hook_can_rescale_a_gradient():
    model = gpt()
    toks = tokens()
    logits, _ = model(toks)
    _metric(logits).backward()
    plain = to_host(model.wpe.weight.grad).copy()
    model.zero_grad()
    logits, _ = model.run_with_hooks(toks, bwd_hooks=[("hook_pos_embed",
                                                       lambda g, hook: g * 2.0)])
    _metric(logits).backward()
    assert_close(model.wpe.weight.grad, 2 * plain, rtol=1e-12)


def test_a_hook_point_alone_is_the_identity():
    hp = HookPoint()
    x = tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert hp(x) is x
    hp.add_hook(lambda t, hook: t + 1.0)
    assert_close(hp(x), np.arange(6.0).reshape(2, 3) + 1)
    with pytest.raises(ValueError, match="'fwd' or 'bwd'"):
        hp.add_hook(print, dir="forward")


# ---- encoder / decoder layers, classifier, seq2seq ---------------------------------------------

@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_classifier_hooks_fire_once_and_tie_the_residual_stream(norm_first):
    from minitx.models import EncoderClassifier
    minitx.manual_seed(0)
    model = EncoderClassifier(vocab_size=V, num_classes=3, d_model=E, nhead=H, num_layers=L,
                              norm_first=norm_first).double().eval()
    toks = tokens(2, 6)
    seen = []
    model.run_with_hooks(toks, fwd_hooks=[(lambda n: True,
                                           lambda x, hook: seen.append(hook.name))])
    assert sorted(seen) == sorted(model.hook_names())
    assert ("ln_final.hook_scale" in seen) == norm_first          # the stack's final norm
    _, c = model.run_with_cache(toks)
    h = {n: to_host(t) for n, t in c.items()}
    for i in range(L):
        p = f"blocks.{i}."
        assert_close(h[p + "hook_resid_mid"], h[p + "hook_resid_pre"] + h[p + "hook_attn_out"],
                     rtol=1e-12)
        # pre-norm: the residual stream goes on from resid_mid; post-norm: from norm1 of it
        norm1 = model.encoder.layers[i].norm1
        stream = h[p + "hook_resid_mid"] if norm_first else \
            _layer_norm(h[p + "hook_resid_mid"]) * to_host(norm1.weight) + to_host(norm1.bias)
        assert_close(h[p + "hook_resid_post"], stream + h[p + "hook_mlp_out"], rtol=1e-10,
                     atol=1e-13)
        assert_close(h[p + "attn.hook_pattern"].sum(-1), np.ones((2, H, 6)), rtol=1e-12)


def _layer_norm(x, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


def test_seq2seq_names_encoder_and_decoder_blocks_with_cross_attention():
    from minitx.models import Transformer
    minitx.manual_seed(0)
    model = Transformer(V, V, d_model=E, nhead=H, num_encoder_layers=1, num_decoder_layers=1,
                        dim_feedforward=32, dropout=0.0).double()
    names = model.hook_names()
    for want in ("encoder.blocks.0.attn.hook_pattern", "decoder.blocks.0.attn.hook_pattern",
                 "decoder.blocks.0.cross_attn.hook_pattern", "decoder.blocks.0.hook_resid_mid2",
                 "decoder.blocks.0.hook_cross_attn_out", "decoder.blocks.0.ln3.hook_scale"):
        assert want in names
    src, tgt = tokens(2, 5), tokens(2, 3, seed=2)
    seen = []
    with model.hooks([(lambda n: True, lambda x, hook: seen.append((hook.name, x.shape)))]):
        model(src, tgt)
    assert sorted(n for n, _ in seen) == sorted(names)
    shapes = dict(seen)
    assert tuple(shapes["decoder.blocks.0.cross_attn.hook_pattern"]) == (2, H, 3, 5)


# ---- every variant explains itself ----------------------------------------------------------

def _variant_cache(name, n=12, causal=False, **options):
    minitx.manual_seed(0)
    layer = REGISTRY[name](E, H, causal=causal, **options).double().eval()
    x = tensor(np.random.default_rng(5).standard_normal((2, n, E)))
    plain = layer(x)
    cache = {}
    with layer.hooks([(lambda n: True, lambda t, hook: cache.__setitem__(hook.name, t))]):
        hooked = layer(x)
    return layer, {k: to_host(t) for k, t in cache.items()}, to_host(plain), to_host(hooked)


@pytest.mark.parametrize("name", ["local", "dilated", "strided", "fixed", "longformer",
                                  "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_variants_show_their_mask_and_masked_pattern(name, causal):
    n = 40
    layer, c, plain, hooked = _variant_cache(name, n, causal)
    assert_close(hooked, plain, rtol=1e-10, atol=1e-13)     # the dense path is the same map
    mask = c["hook_mask"]
    assert mask.dtype == bool and mask.shape == (n, n)
    assert_equal(mask, layer.pattern(n))
    pattern, scores = c["hook_pattern"], c["hook_attn_scores"]
    assert pattern.shape == scores.shape == (2, H, n, n)
    assert np.all(pattern[..., ~mask] == 0) and np.all(np.isneginf(scores[..., ~mask]))
    assert_close(pattern.sum(-1), np.ones((2, H, n)), rtol=1e-12)
    assert_close(c["hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, c["hook_v"]), rtol=1e-10,
                 atol=1e-14)


def test_linformer_shows_its_projected_keys_and_n_by_k_pattern():
    layer, c, _, _ = _variant_cache("linformer", 12, proj_dim=5, max_len=16)
    assert c["hook_k_projected"].shape == c["hook_v_projected"].shape == (2, H, 5, D)
    pattern = c["hook_pattern"]
    assert pattern.shape == (2, H, 12, 5)
    s = np.einsum("bhnd,bhkd->bhnk", np.swapaxes(c["hook_q"], 1, 2), c["hook_k_projected"])
    assert_close(c["hook_attn_scores"], s / math.sqrt(D), rtol=1e-12)
    assert_close(np.swapaxes(c["hook_z"], 1, 2), pattern @ c["hook_v_projected"], rtol=1e-10)


@pytest.mark.parametrize("name,causal", [("performer", False), ("performer", True),
                                         ("linear", False), ("linear", True)])
def test_kernel_variants_show_features_and_the_pattern_they_imply(name, causal):
    layer, c, plain, hooked = _variant_cache(name, 10, causal)
    assert_equal(hooked, plain)               # the implied pattern is only looked at
    pattern = c["hook_pattern"]
    assert pattern.shape == (2, H, 10, 10)
    assert c["hook_phi_q"].shape[:3] == (2, H, 10)
    if causal:
        assert np.all(pattern[..., ~np.tril(np.ones((10, 10), bool))] == 0)
    # out = A V with A the implied pattern, per head
    assert_close(c["hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, c["hook_v"]), rtol=1e-8,
                 atol=1e-12)


def test_implied_pattern_has_a_size_guard(monkeypatch):
    import minitx.attention.base as base
    monkeypatch.setattr(base, "IMPLIED_PATTERN_MAX_N", 8)
    layer = REGISTRY["performer"](E, H).double()
    x = tensor(np.zeros((1, 9, E)))
    with pytest.raises(ValueError, match="IMPLIED_PATTERN_MAX_N = 8"):
        _run_with(layer, x, "hook_pattern")
    layer(x)                                   # without the hook, any length runs


def _run_with(layer, x, name):
    with layer.hooks([(name, lambda t, h: None)]):
        return layer(x)


def test_synthesizer_shows_its_synthetic_pattern():
    layer, c, _, _ = _variant_cache("synthesizer", 12, True, synthesis="random", max_len=16)
    pattern = c["hook_pattern"]
    assert pattern.shape == (1, H, 12, 12)      # "random" synthesis: one pattern for every input
    pattern = np.broadcast_to(pattern, (2, H, 12, 12))
    assert np.all(pattern[..., ~np.tril(np.ones((12, 12), bool))] == 0)
    assert_close(c["hook_z"], np.einsum("bhqk,bkhd->bqhd", pattern, c["hook_v"]), rtol=1e-10)


def test_reformer_shows_buckets_and_the_sort_order_that_groups_them():
    layer, c, plain, hooked = _variant_cache("reformer", 16)
    assert_equal(hooked, plain)
    buckets, order = c["hook_buckets"], c["hook_sort_order"]
    rounds = layer.rotations.shape[0]
    assert buckets.shape == order.shape == (2, H, rounds, 16)
    assert buckets.dtype.kind in "iu" and buckets.min() >= 0
    grouped = np.take_along_axis(buckets, order, axis=-1)
    assert np.all(np.diff(grouped, axis=-1) >= 0)              # sorted by bucket
    assert_equal(np.sort(order, axis=-1), np.broadcast_to(np.arange(16), order.shape))
    chunks = c["hook_chunk_pattern"]             # (B, H, R, nc, c, c'), softmax rows
    c_size = min(layer.chunk_size, 16)
    assert chunks.shape[:5] == (2, H, rounds, -(-16 // c_size), c_size)
    assert_close(chunks.sum(-1), np.ones(chunks.shape[:-1]), rtol=1e-12)


def test_reformer_chunk_patterns_are_attention_within_buckets():
    """With small chunks, a query's chunk row puts weight only on keys of its own bucket."""
    layer, c, _, _ = _variant_cache("reformer", 16, chunk_size=4, n_hashes=1)
    chunks, order, buckets = c["hook_chunk_pattern"], c["hook_sort_order"], c["hook_buckets"]
    assert chunks.shape == (2, H, 1, 4, 4, 8)               # keys: own chunk + previous one
    b = 0
    sorted_buckets = np.take_along_axis(buckets, order, axis=-1)[b, 0, 0].reshape(4, 4)
    keys = np.concatenate([sorted_buckets, sorted_buckets[(np.arange(4) - 1) % 4]], axis=-1)
    weight = chunks[b, 0, 0]                                # (nc, c, 2c)
    other = keys[:, None, :] != sorted_buckets[:, :, None]
    assert np.all(weight[other] == 0)


def test_routing_shows_cluster_assignments_and_a_hook_can_reassign_them():
    layer, c, plain, hooked = _variant_cache("routing", 16)
    assert_equal(hooked, plain)
    qc, kc = c["hook_query_clusters"], c["hook_key_clusters"]
    assert qc.shape == kc.shape == (2, H, 16)
    assert qc.min() >= 0 and qc.max() < layer.num_clusters
    x = tensor(np.random.default_rng(5).standard_normal((2, 16, E)))
    one = [(name, lambda t, hook: t * 0) for name in ("hook_query_clusters",
                                                      "hook_key_clusters")]
    with layer.hooks(one):                                       # everything in cluster 0
        moved = to_host(layer(x))
    assert not np.allclose(moved, plain)


def test_aft_shows_the_position_bias_it_mixes_with_and_its_gate():
    layer, c, _, _ = _variant_cache("aft", 12)
    assert c["hook_position_bias"].shape == (12, 12)
    assert_equal(c["hook_position_bias"], to_host(layer.w)[:12, :12])
    assert_close(c["hook_gate"], 1 / (1 + np.exp(-np.swapaxes(c["hook_q"], 1, 2))),
                 rtol=1e-12)


@pytest.mark.parametrize("name", ["mha", "mqa", "gqa", "dot", "additive", "rope", "alibi",
                                  "relative"])
@pytest.mark.parametrize("causal", [False, True])
def test_exact_variants_written_out_equal_the_fused_node(name, causal):
    """A pattern hook switches the layer to materialized attention: same map to rounding,
    and pattern = softmax(scores) with −inf where masked."""
    layer, c, plain, hooked = _variant_cache(name, 9, causal)
    assert_close(hooked, plain, rtol=1e-10, atol=1e-14)
    scores, pattern = c["hook_attn_scores"], c["hook_pattern"]
    finite = np.where(np.isfinite(scores), scores, -np.inf)
    e = np.exp(finite - finite.max(-1, keepdims=True))
    assert_close(pattern, e / e.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)
    if causal:
        assert np.all(np.isneginf(scores[..., ~np.tril(np.ones((9, 9), bool))]))


def test_a_misspelt_variant_name_suggests_the_close_ones():
    with pytest.raises(KeyError, match="did you mean 'performer'") as info:
        REGISTRY["perfomer"]
    assert "registered:" in str(info.value) and "linformer" in str(info.value)
    with pytest.raises(KeyError, match="no attention variant named 'zzz' \\(registered"):
        REGISTRY["zzz"]
    assert "perfomer" not in REGISTRY and REGISTRY.get("perfomer") is None


# ---- mask polarity traps (the silent ones) ---------------------------------------------

def test_multihead_attention_warns_about_masks_of_the_other_polarity():
    minitx.manual_seed(0)
    mha = MultiheadAttention(E, H, batch_first=True).double()
    x = tensor(np.random.default_rng(0).standard_normal((2, 5, E)))
    may_attend = np.tril(np.ones((5, 5), bool))           # SDPA's polarity: True = may attend
    with pytest.warns(UserWarning, match="True where attention is NOT allowed"):
        mha(x, x, x, attn_mask=may_attend)
    hf_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)   # HF: True = token
    with pytest.warns(UserWarning, match="attention_mask == 0"):
        mha(x, x, x, key_padding_mask=hf_mask)
    import warnings
    with warnings.catch_warnings():                       # the right polarities stay silent
        warnings.simplefilter("error")
        mha(x, x, x, attn_mask=~may_attend)
        mha(x, x, x, key_padding_mask=~hf_mask)
        mha(x, x, x, is_causal=True)


def test_linear_refuses_integer_input_by_name():
    layer = minitx.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="Linear: input must be floating point.*int64"):
        layer(minitx.tensor(np.arange(6).reshape(2, 3)))
    assert layer(tensor(np.ones((2, 3)), dtype="float32")).shape == (2, 2)
