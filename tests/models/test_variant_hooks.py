"""The hook points of the position and synthesizer variants (rope, alibi, relative,
synthesizer) and GPT's hook list: each fires with its documented shape, and the identity
tying it to the output holds (recomputed from the hooked values, or a replacement changes the
output as predicted)."""
import math

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY
from minitx.models import GPT, GPTConfig
from support import assert_close, tensor, to_host

E, H = 16, 2
D = E // H


def layer_of(name, causal=False, **options):
    minitx.manual_seed(0)
    return REGISTRY[name](E, H, causal=causal, **options).double().eval()


def inputs(b=2, n=9, seed=5):
    return tensor(np.random.default_rng(seed).standard_normal((b, n, E)))


def run_cached(layer, x, hooks=(), **kwargs):
    """Run ``layer(x)`` caching every hook point (after ``hooks`` replaced what they replace:
    the cache hook is set last, so it sees the replacement). Returns (out, {name: host})."""
    cache = {}
    keep = [(lambda n: True, lambda t, hook: cache.__setitem__(hook.name, to_host(t)))]
    with layer.hooks(list(hooks) + keep):
        out = to_host(layer(x, **kwargs))
    return out, cache


def heads_first(a):
    """(B, N, H, D) hook layout -> (B, H, N, D)."""
    return np.swapaxes(a, 1, 2)


def softmax_masked(s, causal):
    if causal:
        n, nk = s.shape[-2:]
        s = np.where(np.tri(n, nk, nk - n, dtype=bool), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---- RoPE: hook_rot_q, hook_rot_k -------------------------------------------------------

def rotate(x, positions, base=10000.0):
    """Host RoPE on (B, N, H, D): pair (x_2i, x_2i+1) turned by positions·base^(−2i/D)."""
    d = x.shape[-1]
    angle = positions[:, None] * base ** (-np.arange(0, d, 2) / d)          # (N, D/2)
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]   # (1, N, 1, D/2)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_rope_rotated_q_and_k_fire_with_their_shapes_and_give_the_scores(causal):
    layer = layer_of("rope", causal, num_kv_heads=1)
    x = inputs()
    plain = to_host(layer(x))
    out, c = run_cached(layer, x)
    assert_close(out, plain, rtol=1e-10, atol=1e-14)
    assert c["hook_rot_q"].shape == c["hook_q"].shape == (2, 9, H, D)
    assert c["hook_rot_k"].shape == c["hook_k"].shape == (2, 9, 1, D)      # Hkv = 1
    pos = np.arange(9.0)
    assert_close(c["hook_rot_q"], rotate(c["hook_q"], pos), rtol=1e-12, atol=1e-14)
    assert_close(c["hook_rot_k"], rotate(c["hook_k"], pos), rtol=1e-12, atol=1e-14)
    # scores = R q · R k / √D (the shared key head broadcast to both query heads)
    s = np.einsum("bqhd,bkd->bhqk", c["hook_rot_q"], c["hook_rot_k"][:, :, 0]) / math.sqrt(D)
    scores = c["hook_attn_scores"]
    finite = np.isfinite(scores)
    assert_close(scores[finite], s[finite], rtol=1e-12)
    assert finite.all() != causal


def test_rope_replacing_the_rotated_query_changes_the_output_as_predicted():
    """Doubling R q doubles the scores: z = softmax(2 s) v."""
    layer = layer_of("rope")
    x = inputs()
    _, c = run_cached(layer, x)
    out, c2 = run_cached(layer, x, hooks=[("hook_rot_q", lambda t, hook: t * 2.0)])
    s = np.einsum("bqhd,bkhd->bhqk", c["hook_rot_q"], c["hook_rot_k"]) / math.sqrt(D)
    want = np.einsum("bhqk,bkhd->bqhd", softmax_masked(2 * s, False), c["hook_v"])
    assert_close(c2["hook_z"], want, rtol=1e-10, atol=1e-13)
    assert not np.allclose(c2["hook_z"], c["hook_z"])


def test_rope_rotated_hooks_under_a_kv_cache_sit_at_the_absolute_positions():
    """Prefill 6 tokens, then one: the new query is rotated at position 6 and hook_rot_k
    holds all 7 cached keys, equal to the full forward's."""
    layer = layer_of("rope", causal=True)
    x = inputs(n=7)
    _, full = run_cached(layer, x)
    cache = layer.new_cache()
    run_cached(layer, tensor(to_host(x)[:, :6]), kv_cache=cache)
    _, step = run_cached(layer, tensor(to_host(x)[:, 6:]), kv_cache=cache)
    assert step["hook_rot_q"].shape == (2, 1, H, D) and step["hook_rot_k"].shape == (2, 7, H, D)
    assert_close(step["hook_rot_q"], full["hook_rot_q"][:, 6:], rtol=1e-12, atol=1e-14)
    assert_close(step["hook_rot_k"], full["hook_rot_k"], rtol=1e-12, atol=1e-14)


# ---- ALiBi: hook_alibi_bias -------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_alibi_bias_fires_with_its_shape_and_is_the_scores_minus_qk(causal):
    layer = layer_of("alibi", causal)
    x = inputs()
    out, c = run_cached(layer, x)
    bias = c["hook_alibi_bias"]
    assert bias.shape == (1, H, 9, 9)
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)             # H = 2: 2^-4, 2^-8
    dist = np.abs(np.arange(9)[:, None] - np.arange(9)[None, :])
    assert_close(bias[0], -slopes[:, None, None] * dist, rtol=1e-15)
    qk = np.einsum("bqhd,bkhd->bhqk", c["hook_q"], c["hook_k"]) / math.sqrt(D)
    scores = c["hook_attn_scores"]
    finite = np.isfinite(scores)
    assert_close(scores[finite], np.broadcast_to(qk + bias, scores.shape)[finite], rtol=1e-12)


def test_alibi_zeroing_the_bias_gives_plain_softmax_attention():
    layer = layer_of("alibi", causal=True)
    x = inputs()
    _, c = run_cached(layer, x, hooks=[("hook_alibi_bias", lambda t, hook: t * 0.0)])
    qk = np.einsum("bqhd,bkhd->bhqk", c["hook_q"], c["hook_k"]) / math.sqrt(D)
    want = np.einsum("bhqk,bkhd->bqhd", softmax_masked(qk, True), c["hook_v"])
    assert_close(c["hook_z"], want, rtol=1e-10, atol=1e-13)
    # and without the replacement the bias matters
    _, plain = run_cached(layer, x)
    assert not np.allclose(plain["hook_z"], want)


def test_alibi_bias_hook_alone_keeps_the_fused_path_output():
    """Only the bias hook set: the fused attention runs with the hooked bias, same output."""
    layer = layer_of("alibi")
    x = inputs()
    plain = to_host(layer(x))
    with layer.hooks([("hook_alibi_bias", lambda t, hook: None)]):
        looked = to_host(layer(x))
    assert_close(looked, plain, rtol=0, atol=0)


# ---- relative positions: hook_rel_key_term, hook_rel_value_term -------------------------

def clipped(nq, nk, k):
    return np.clip(np.arange(nk)[None, :] - (np.arange(nq)[:, None] + nk - nq), -k, k) + k


@pytest.mark.parametrize("causal", [False, True])
def test_relative_terms_decompose_scores_and_z(causal):
    """scores = q·k/√D + key term (key term = q_i·a^K_ij/√D) and
    z = pattern · v + value term (value term = Σ_j α_ij a^V_ij): hook_z is explained."""
    layer = layer_of("relative", causal, max_relative_position=3)
    x = inputs(n=10)
    plain = to_host(layer(x))
    out, c = run_cached(layer, x)
    assert_close(out, plain, rtol=1e-10, atol=1e-14)
    key_term, value_term = c["hook_rel_key_term"], c["hook_rel_value_term"]
    assert key_term.shape == (2, H, 10, 10) and value_term.shape == (2, 10, H, D)
    idx = clipped(10, 10, 3)
    a_k, a_v = to_host(layer.rel_k)[idx], to_host(layer.rel_v)[idx]       # (N, N, D)
    q = heads_first(c["hook_q"])
    assert_close(key_term, np.einsum("bhid,ijd->bhij", q, a_k) / math.sqrt(D), rtol=1e-12)
    qk = np.einsum("bqhd,bkhd->bhqk", c["hook_q"], c["hook_k"]) / math.sqrt(D)
    scores = c["hook_attn_scores"]
    finite = np.isfinite(scores)
    assert_close(scores[finite], (qk + key_term)[finite], rtol=1e-12)
    pattern = c["hook_pattern"]
    assert_close(value_term, np.einsum("bhij,ijd->bihd", pattern, a_v), rtol=1e-12)
    pv = np.einsum("bhqk,bkhd->bqhd", pattern, c["hook_v"])
    assert_close(c["hook_z"], pv + value_term, rtol=1e-10, atol=1e-13)
    assert np.abs(value_term).max() > 1e-3          # the rest of z is not negligible


def test_relative_value_term_on_the_fused_path_and_its_replacement():
    """With only the relative hooks set (the fused attention runs), z − value term is the
    pattern softmax(q·k/√D + key term) times v; zeroing the value term leaves exactly that."""
    layer = layer_of("relative")
    x = inputs()
    names = ["hook_q", "hook_k", "hook_v", "hook_z", "hook_rel_key_term",
             "hook_rel_value_term"]
    seen = {}

    def keep(t, hook):
        seen[hook.name] = to_host(t)

    with layer.hooks([(n, keep) for n in names]):
        layer(x)
    qk = np.einsum("bqhd,bkhd->bhqk", seen["hook_q"], seen["hook_k"]) / math.sqrt(D)
    pv = np.einsum("bhqk,bkhd->bqhd", softmax_masked(qk + seen["hook_rel_key_term"], False),
                   seen["hook_v"])
    assert_close(seen["hook_z"] - seen["hook_rel_value_term"], pv, rtol=1e-10, atol=1e-13)
    with layer.hooks([("hook_rel_value_term", lambda t, hook: t * 0.0), ("hook_z", keep)]):
        layer(x)
    assert_close(seen["hook_z"], pv, rtol=1e-10, atol=1e-13)


# ---- synthesizer: hook_synthetic_logits -------------------------------------------------

@pytest.mark.parametrize("synthesis,lead", [("dense", 2), ("random", 1), ("factorized", 1),
                                            ("mixture", 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_synthetic_logits_fire_and_make_the_scores(synthesis, lead, causal):
    layer = layer_of("synthesizer", causal, synthesis=synthesis, max_len=12)
    x = inputs(n=9)
    out, c = run_cached(layer, x)
    synth = c["hook_synthetic_logits"]
    assert synth.shape == (lead, H, 9, 9)
    assert np.all(np.isfinite(synth))               # before the causal mask
    want = synth
    if synthesis == "mixture":                      # α = softmax(a) mixes S with q·k/√D
        a = np.exp(to_host(layer.mix))
        a = a / a.sum()
        qk = np.einsum("bqhd,bkhd->bhqk", c["hook_q"], c["hook_k"]) / math.sqrt(D)
        want = a[0] * synth + a[1] * qk
    scores = c["hook_attn_scores"]
    want = np.broadcast_to(want, scores.shape)
    finite = np.isfinite(scores)
    assert_close(scores[finite], want[finite], rtol=1e-12)
    assert finite.all() != causal
    if synthesis == "dense":                        # S = relu(q W₁ + b₁) W₂ + b₂, cut to N
        w1, b1, w2, b2 = (to_host(p) for p in (layer.w1, layer.b1, layer.w2, layer.b2))
        hid = np.maximum(np.einsum("bhnd,hde->bhne", heads_first(c["hook_q"]), w1) + b1, 0)
        assert_close(synth, (np.einsum("bhne,hel->bhnl", hid, w2) + b2)[..., :9], rtol=1e-12)


@pytest.mark.parametrize("synthesis", ["dense", "random", "mixture"])
def test_zeroing_the_synthetic_logits_changes_the_output_as_predicted(synthesis):
    """S = 0: "dense"/"random" attend uniformly (z = mean of v over the keys); "mixture"
    attends with α₂ q·k/√D alone."""
    layer = layer_of("synthesizer", synthesis=synthesis, max_len=12)
    x = inputs(n=9)
    _, c = run_cached(layer, x, hooks=[("hook_synthetic_logits", lambda t, hook: t * 0.0)])
    if synthesis == "mixture":
        a = np.exp(to_host(layer.mix))
        a = a / a.sum()
        qk = np.einsum("bqhd,bkhd->bhqk", c["hook_q"], c["hook_k"]) / math.sqrt(D)
        want = np.einsum("bhqk,bkhd->bqhd", softmax_masked(a[1] * qk, False), c["hook_v"])
    else:
        want = np.broadcast_to(c["hook_v"].mean(1, keepdims=True), c["hook_z"].shape)
    assert_close(c["hook_z"], want, rtol=1e-10, atol=1e-13)


# ---- GPT lists only the hook points that fire -------------------------------------------

@pytest.mark.parametrize("position", ["learned", "sinusoidal", "none", "rope", "alibi",
                                      "relative"])
def test_gpt_lists_exactly_the_hook_points_that_fire(position):
    minitx.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=H, n_embd=E,
                          position=position)).double()
    names = model.hook_names()
    assert ("hook_pos_embed" in names) == (position == "learned")
    seen = []
    toks = minitx.tensor(np.random.default_rng(0).integers(0, 13, (2, 7)))
    model.run_with_hooks(toks, fwd_hooks=[(lambda n: True,
                                           lambda t, hook: seen.append(hook.name))])
    assert sorted(seen) == sorted(names)            # each listed point fires, exactly once
    own = {"rope": {"hook_rot_q", "hook_rot_k"}, "alibi": {"hook_alibi_bias"},
           "relative": {"hook_rel_key_term", "hook_rel_value_term"}}.get(position, set())
    assert own <= {n.rsplit(".", 1)[-1] for n in names}
    if position != "learned":
        with pytest.raises(KeyError, match="no hook point 'hook_pos_embed'"):
            model.run_with_hooks(toks, fwd_hooks=[("hook_pos_embed", lambda t, hook: None)])
