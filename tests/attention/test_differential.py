"""Differential attention (``diff``, Ye et al. 2024): the layer against the paper's equations
written out here in NumPy, λ and λ_init by depth (GPT and the transformer stacks), decoding
through a KV cache, the hook points and their identities, gradients, and option errors."""
import math
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.differential import DifferentialAttention, lambda_init_for_depth
from minitx.models import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, \
    TransformerEncoderLayer
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, qkv, tensor, to_host

TIGHT = dict(rtol=1e-12, atol=1e-12)


def build(e=8, h=2, seed=0, **options):
    """A float64 layer whose λ vectors and norm weight are random draws (not their init), so
    every term of the formula shows in the output."""
    minitx.manual_seed(seed)
    layer = REGISTRY["diff"](e, h, **options).double().eval()
    rng = np.random.default_rng(seed + 100)
    for p in (layer.lambda_q1, layer.lambda_k1, layer.lambda_q2, layer.lambda_k2):
        p.copy_(rng.standard_normal(p.shape) * 0.5)
    layer.head_norm.weight.copy_(1 + 0.3 * rng.standard_normal(layer.head_norm.weight.shape))
    return layer


# ---- the reference: the paper's equations (section 2.1), on the host ----------------------

def paper_lambda_init(depth):
    """λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)), l the 1-based depth."""
    return 0.8 - 0.6 * math.exp(-0.3 * (depth - 1))


def softmax(s):
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def rotate(x, positions, base=10000.0):
    """RoPE by hand: each pair (x_2i, x_2i+1) of x (…, N, d) turned by p·base^(−2i/d)."""
    d = x.shape[-1]
    angle = np.asarray(positions)[:, None] * base ** (-2.0 * np.arange(d // 2) / d)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * np.cos(angle) - x[..., 1::2] * np.sin(angle)
    out[..., 1::2] = x[..., 0::2] * np.sin(angle) + x[..., 1::2] * np.cos(angle)
    return out


def diff_reference(layer, q, k, v, allowed=None, lambda_init=None):
    """Head by head: (softmax(Q1K1ᵀ/√d) − λ softmax(Q2K2ᵀ/√d)) V, RMSNorm over the head's
    features with the learned gain, × (1 − λ_init); with ``layer.rope`` each half rotated by
    its position first (keys 0 … Nk − 1, queries the last Nq), as the paper's code. Host arrays
    q (B, H, Nq, 2d), k/v (B, Hkv, Nk, 2d); ``allowed`` broadcastable to (B, H, Nq, Nk).
    Returns (out, P1, P2, λ)."""
    b, h, nq, dd = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    d = dd // 2
    if layer.rope:
        q = np.concatenate([rotate(q[..., :d], np.arange(nk - nq, nk)),
                            rotate(q[..., d:], np.arange(nk - nq, nk))], axis=-1)
        k = np.concatenate([rotate(k[..., :d], np.arange(nk)), rotate(k[..., d:], np.arange(nk))],
                           axis=-1)
    if lambda_init is None:
        lambda_init = paper_lambda_init(layer.layer_index + 1)
    lq1, lk1, lq2, lk2 = (to_host(p.data) for p in (layer.lambda_q1, layer.lambda_k1,
                                                    layer.lambda_q2, layer.lambda_k2))
    lam = math.exp(lq1 @ lk1) - math.exp(lq2 @ lk2) + lambda_init
    mask = np.ones((b, h, nq, nk), bool) if allowed is None else \
        np.broadcast_to(allowed, (b, h, nq, nk))
    if layer.causal:
        mask = mask & np.tri(nq, nk, nk - nq, dtype=bool)
    gain, eps = to_host(layer.head_norm.weight.data), 1e-5
    out, p1s, p2s = np.zeros((b, h, nq, dd)), np.zeros((b, h, nq, nk)), np.zeros((b, h, nq, nk))
    for head in range(h):
        g = head // (h // hkv)
        s1 = np.einsum("bid,bjd->bij", q[:, head, :, :d], k[:, g, :, :d]) / math.sqrt(d)
        s2 = np.einsum("bid,bjd->bij", q[:, head, :, d:], k[:, g, :, d:]) / math.sqrt(d)
        p1 = softmax(np.where(mask[:, head], s1, -np.inf))
        p2 = softmax(np.where(mask[:, head], s2, -np.inf))
        o = (p1 - lam * p2) @ v[:, g]                                       # (B, Nq, 2d)
        o = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + eps) * gain      # RMSNorm per head
        out[:, head], p1s[:, head], p2s[:, head] = (1 - lambda_init) * o, p1, p2
    return out, p1s, p2s, lam


@given(nq=st.integers(1, 12), extra=st.integers(0, 5), h=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 2]), d=st.sampled_from([1, 2, 3]), causal=st.booleans(),
       depth=st.integers(0, 6), masked=st.sampled_from([None, "random", "empty row"]),
       rope=st.booleans(), seed=st.integers(0, 99))
def test_attend_equals_the_papers_equations(nq, extra, h, group, d, causal, depth, masked,
                                            rope, seed):
    hkv = max(1, h // group)
    rope = rope and d % 2 == 0                     # RoPE turns pairs of each half-head
    layer = build(2 * d * h, h, seed, causal=causal, num_kv_heads=hkv, layer_index=depth,
                  rope=rope)
    q, k, v = qkv(nq, nq + extra, h=h, hkv=hkv, d=2 * d, seed=seed)
    allowed = None
    # (one query alone with its key and nothing else, Nq = Nk = 1, cannot lose it: a mask
    # hiding every query's own key draws minitx's polarity warning)
    empty = masked == "empty row" and nq + extra > 1
    if masked:
        # each query keeps its own key (bottom-right diagonal), but for the empty row
        allowed = np.random.default_rng(seed).random((2, h, nq, nq + extra)) < 0.7
        allowed |= np.eye(nq, nq + extra, extra, dtype=bool)
        if empty:
            allowed[1, 0, nq // 2] = False            # a query that may see no key: zeros
    mask = None if allowed is None else minitx.tensor(allowed)
    out = layer.attend(tensor(q), tensor(k), tensor(v), attn_mask=mask)
    want = diff_reference(layer, q, k, v, allowed)[0]
    assert_close(out, want, **TIGHT)
    if empty:
        assert np.all(to_host(out)[1, 0, nq // 2] == 0)


@given(n=st.integers(1, 10), lambda_init=st.floats(-1.0, 1.0), seed=st.integers(0, 99))
def test_layer_equals_projections_then_the_papers_equations(n, lambda_init, seed):
    layer = build(12, 3, seed, causal=True, lambda_init=lambda_init)
    x = np.random.default_rng(seed).standard_normal((2, n, 12))

    def project(lin):                                       # x W_ᵀ + b, split into 3 heads
        y = x @ to_host(lin.weight.data).T + to_host(lin.bias.data)
        return y.reshape(2, n, 3, 4).transpose(0, 2, 1, 3)
    heads = diff_reference(layer, project(layer.q_proj), project(layer.k_proj),
                           project(layer.v_proj), lambda_init=lambda_init)[0]
    y = heads.transpose(0, 2, 1, 3).reshape(2, n, 12) @ to_host(layer.out_proj.weight.data).T
    assert_close(layer(tensor(x)), y + to_host(layer.out_proj.bias.data), **TIGHT)


def test_the_heads_cost_what_mhas_cost():
    """num_heads heads of width D, each split into two query/key halves of width D/2: the
    projections are mha's; λ's four (D/2,) vectors and the (D,) norm gain are all that's added."""
    diff, mha = REGISTRY["diff"](16, 4), REGISTRY["mha"](16, 4)
    count = [sum(p.data.size for p in m.parameters()) for m in (diff, mha)]
    assert count[0] == count[1] + 4 * 2 + 4


# ---- λ_init by depth ---------------------------------------------------------------------

def test_lambda_init_follows_the_papers_schedule():
    for index in range(8):
        assert lambda_init_for_depth(index) == pytest.approx(paper_lambda_init(index + 1),
                                                             abs=1e-15)
    assert lambda_init_for_depth(0) == pytest.approx(0.2, abs=1e-15)
    assert REGISTRY["diff"](8, 2).lambda_init == pytest.approx(0.2, abs=1e-15)
    assert REGISTRY["diff"](8, 2, layer_index=5, lambda_init=0.5).lambda_init == 0.5


def gpt(n_layer=3, **options):
    minitx.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=n_layer, n_head=2, n_embd=8,
                         attention="diff", position="learned",
                         attention_options=options)).double().eval()


def test_gpt_gives_each_block_its_depth_unless_told():
    model = gpt()
    assert [b.attn.layer_index for b in model.h] == [0, 1, 2]
    assert [b.attn.lambda_init for b in model.h] == \
        pytest.approx([paper_lambda_init(l) for l in (1, 2, 3)], abs=1e-15)
    assert {b.attn.lambda_init for b in gpt(lambda_init=0.3).h} == {0.3}
    assert {b.attn.layer_index for b in gpt(layer_index=4).h} == {4}


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_transformer_stacks_renumber_their_copies(stack):
    layer_cls, stack_cls = ((TransformerEncoderLayer, TransformerEncoder) if stack == "encoder"
                            else (TransformerDecoderLayer, TransformerDecoder))
    layer = layer_cls(8, 2, dim_feedforward=16, attention="diff")
    assert layer.self_attn.layer_index == 0                   # a lone layer is the first
    model = stack_cls(layer, num_layers=3)
    depths = [block.self_attn.layer_index for block in model.layers]
    assert depths == [0, 1, 2]
    assert [b.self_attn.lambda_init for b in model.layers] == \
        pytest.approx([paper_lambda_init(l) for l in (1, 2, 3)], abs=1e-15)
    given_init = stack_cls(layer_cls(8, 2, dim_feedforward=16, attention="diff",
                                     attention_options={"lambda_init": 0.6}), num_layers=2)
    assert [b.self_attn.lambda_init for b in given_init.layers] == [0.6, 0.6]
    given_depth = stack_cls(layer_cls(8, 2, dim_feedforward=16, attention="diff",
                                      attention_options={"layer_index": 7}), num_layers=2)
    assert [b.self_attn.layer_index for b in given_depth.layers] == [7, 7]


def test_encoder_stack_runs_with_its_depths():
    """The renumbered copies compute with their own λ_init: layer 1 of the stack equals a lone
    layer built with layer_index=1 and the same weights."""
    minitx.manual_seed(0)
    stack = TransformerEncoder(TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                                       attention="diff", batch_first=True),
                               num_layers=2).double().eval()
    x = tensor(np.random.default_rng(0).standard_normal((2, 5, 8)))
    lone = TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, attention="diff",
                                   batch_first=True,
                                   attention_options={"layer_index": 1}).double().eval()
    lone.load_state_dict(stack.layers[1].state_dict())
    assert_close(stack(x), lone(stack.layers[0](x)), **TIGHT)


# ---- decoding through a KV cache ---------------------------------------------------------

@pytest.mark.parametrize("prefill,rope", [(1, False), (4, False), (1, True), (4, True)])
def test_gpt_decoding_through_the_kv_cache_equals_the_full_forward(prefill, rope):
    """With ``rope`` the cached keys are rotated by their positions at every step."""
    model = gpt(rope=True) if rope else gpt()
    ids = np.random.default_rng(0).integers(0, 11, (2, 10))
    full = to_host(model(minitx.tensor(ids))[0])
    caches = model.new_caches()
    steps = [model(minitx.tensor(ids[:, :prefill]), kv_caches=caches)[0]]
    steps += [model(minitx.tensor(ids[:, t:t + 1]), kv_caches=caches)[0]
              for t in range(prefill, 10)]
    assert_close(np.concatenate([to_host(s) for s in steps], axis=1), full, **TIGHT)
    assert all(len(c) == 10 for c in caches)
    prompt = minitx.tensor(ids[:1, :3])
    assert to_host(model.generate(prompt, 5, temperature=0)).tolist() == \
        to_host(model.generate(prompt, 5, temperature=0, use_cache=False)).tolist()


# ---- hook points and their identities ----------------------------------------------------

def run_hooked(layer, q, k, v, replace=None):
    seen = {}

    def keep(t, hook):
        seen[hook.name] = to_host(t)
        return replace.get(hook.name, lambda t: None)(t) if replace else None
    with layer.hooks([(lambda name: True, keep)]):
        out = layer.attend(tensor(q), tensor(k), tensor(v))
    return to_host(out), seen


def test_hooks_see_both_maps_lambda_and_their_difference():
    layer = build(8, 2, causal=True, layer_index=3)
    q, k, v = qkv(6, h=2, d=4, seed=1)
    out, seen = run_hooked(layer, q, k, v)
    want, p1, p2, lam = diff_reference(layer, q, k, v)
    assert_close(out, want, **TIGHT)                        # the composed path, too
    assert_close(seen["hook_pattern1"], p1, **TIGHT)
    assert_close(seen["hook_pattern2"], p2, **TIGHT)
    assert_close(seen["hook_lambda"], [lam], **TIGHT)
    pattern = seen["hook_pattern"]
    assert_close(pattern, p1 - lam * p2, **TIGHT)
    assert_close(pattern.sum(-1), np.full((2, 2, 6), 1 - lam), **TIGHT)   # not 1
    assert (pattern < 0).any()                               # not a probability map
    o = pattern @ v
    gain, scale = to_host(layer.head_norm.weight.data), 1 - layer.lambda_init
    assert_close(out, scale * gain * o / np.sqrt((o ** 2).mean(-1, keepdims=True) + 1e-5),
                 **TIGHT)


def test_replacing_lambda_with_zero_leaves_the_first_map_alone():
    layer = build(8, 2, layer_index=1)
    q, k, v = qkv(5, h=2, d=4, seed=2)
    out, _ = run_hooked(layer, q, k, v, replace={"hook_lambda": lambda t: t * 0})
    o = softmax(np.einsum("bhid,bhjd->bhij", q[..., :2], k[..., :2]) / math.sqrt(2)) @ v
    gain, scale = to_host(layer.head_norm.weight.data), 1 - layer.lambda_init
    assert_close(out, scale * gain * o / np.sqrt((o ** 2).mean(-1, keepdims=True) + 1e-5),
                 **TIGHT)


# ---- gradients ---------------------------------------------------------------------------

@pytest.mark.parametrize("rope", [False, True])
def test_gradcheck_reaches_lambda_and_the_norm_gain(rope):
    layer = build(8, 2, causal=True, num_kv_heads=1, rope=rope)
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(5, h=2, hkv=1, d=4, scale=0.7))
    params = [layer.lambda_q1, layer.lambda_k2, layer.head_norm.weight]
    minitx.gradcheck(lambda q, k, v, *p: layer.attend(q, k, v), (q, k, v, *params))


# ---- options and errors ------------------------------------------------------------------

@pytest.mark.parametrize("args,options,words", [
    ((6, 2), {}, "even"), ((8, 2), {"layer_index": -1}, "layer_index"),
    ((8, 2), {"layer_index": 1.5}, "layer_index"), ((8, 2), {"lambda_init": float("nan")},
                                                   "lambda_init"),
    ((8, 2), {"eps": 0.0}, "eps"), ((12, 2), {"rope": True}, "multiple of 4, got 6"),
    ((8, 2), {"rope": "yes"}, "rope"), ((8, 2), {"rope": True, "base": 0.0}, "base"),
])
def test_bad_options_name_the_argument(args, options, words):
    with pytest.raises(ValueError, match=words):
        REGISTRY["diff"](*args, **options)


def test_attend_refuses_a_value_width_its_norm_cannot_take():
    layer = build(8, 2)
    q, k, v = qkv(3, h=2, d=4, dv=6)
    with pytest.raises(ValueError, match="head dim 4"):
        layer.attend(tensor(q), tensor(k), tensor(v))


def test_identities_hold_and_are_quick():
    start = time.perf_counter()
    rows = DifferentialAttention.identities(0)
    assert time.perf_counter() - start < 5.0
    assert len(rows) == 3 and all(value <= limit for _, value, limit in rows), rows
