"""Multi-head latent attention (``mla``, DeepSeek-V2): the layer against the paper's equations
written out here in NumPy, the absorbed inference form against the naive one, decoding through
the latent cache against the full forward, the hook points and the identities tying them
together, gradients, and option errors."""
import math
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minitx
from minitx.attention import REGISTRY, KVCache, dense_attention_array
from minitx.attention.latent import LatentCache, MultiHeadLatentAttention
from minitx.models import TransformerDecoder, TransformerDecoderLayer, TransformerEncoderLayer
from minitx.models.gpt import GPT, GPTConfig
from support import assert_close, qkv, tensor, to_host

TIGHT = dict(rtol=1e-12, atol=1e-12)


def build(e=8, h=2, seed=0, **options):
    minitx.manual_seed(seed)
    return REGISTRY["mla"](e, h, **options).double().eval()


def weight(linear):
    return to_host(linear.weight.data)


# ---- the reference: DeepSeek-V2's equations (9)–(19), on the host ------------------------

def rope(t, positions, base=10000.0):
    """Rotate each pair (t_{2i}, t_{2i+1}) by positions·base^(−2i/d): as complex numbers,
    multiplied by e^{i·m·θ_i}. ``positions`` index axis 1 of t (B, N, …, d)."""
    d = t.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)                              # (d/2,)
    angle = np.asarray(positions, dtype=float)[:, None] * theta            # (N, d/2)
    angle = angle.reshape((1, len(positions)) + (1,) * (t.ndim - 3) + (d // 2,))
    z = (t[..., 0::2] + 1j * t[..., 1::2]) * np.exp(1j * angle)
    out = np.empty_like(t)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def mla_reference(layer, x, allowed=None):
    """y (B, N, E) for host x (B, N, E), head by head; ``allowed`` (N, N) or (B, H, N, N)
    bool, True = may attend; rows with no allowed key give o_h = 0."""
    b, n, _ = x.shape
    h, hkv, d, dr = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.rope_dim
    pos = np.arange(n)
    c_q = x @ weight(layer.w_dq).T                                      # (B, N, d'_c)
    q_c = (c_q @ weight(layer.w_uq).T).reshape(b, n, h, d)
    q_r = rope((c_q @ weight(layer.w_qr).T).reshape(b, n, h, dr), pos)
    c_kv = x @ weight(layer.w_dkv).T                                    # (B, N, d_c)
    k_c = (c_kv @ weight(layer.w_uk).T).reshape(b, n, hkv, d)
    v = (c_kv @ weight(layer.w_uv).T).reshape(b, n, hkv, d)
    k_r = rope(x @ weight(layer.w_kr).T, pos)                           # (B, N, d_R) shared
    mask = np.ones((b, h, n, n), bool) if allowed is None else \
        np.broadcast_to(allowed, (b, h, n, n))
    if layer.causal:
        mask = mask & np.tri(n, dtype=bool)
    o = np.zeros((b, n, h, d))
    for head in range(h):
        g = head // (h // hkv)                                             # its key/value head
        s = (np.einsum("bid,bjd->bij", q_c[:, :, head], k_c[:, :, g])
             + np.einsum("bid,bjd->bij", q_r[:, :, head], k_r)) / math.sqrt(d + dr)
        s = np.where(mask[:, head], s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        p = np.divide(p, p.sum(-1, keepdims=True), out=np.zeros_like(p),
                      where=p.sum(-1, keepdims=True) > 0)
        o[:, :, head] = np.einsum("bij,bjd->bid", p, v[:, :, g])
    y = o.reshape(b, n, h * d) @ weight(layer.out_proj).T
    return y + to_host(layer.out_proj.bias.data)


SIZES = dict(n=st.integers(1, 12), h=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2]),
             d=st.sampled_from([2, 4]), kv_rank=st.integers(1, 8), q_rank=st.integers(1, 8),
             rope_dim=st.sampled_from([2, 4]), causal=st.booleans(), seed=st.integers(0, 99))


def sized_layer(n, h, group, d, kv_rank, q_rank, rope_dim, causal, seed):
    hkv = max(1, h // group)
    layer = build(h * d, h, seed, causal=causal, num_kv_heads=hkv, kv_rank=kv_rank,
                  q_rank=q_rank, rope_dim=rope_dim)
    x = np.random.default_rng(seed).standard_normal((2, n, h * d))
    return layer, x


@given(**SIZES)
def test_forward_equals_the_papers_equations(n, h, group, d, kv_rank, q_rank, rope_dim, causal,
                                             seed):
    layer, x = sized_layer(n, h, group, d, kv_rank, q_rank, rope_dim, causal, seed)
    assert_close(layer(tensor(x)), mla_reference(layer, x), **TIGHT)


@given(**SIZES, empty_row=st.booleans())
def test_absorbed_form_equals_naive_form_and_reference_under_masks(
        n, h, group, d, kv_rank, q_rank, rope_dim, causal, seed, empty_row):
    layer, x = sized_layer(n, h, group, d, kv_rank, q_rank, rope_dim, causal, seed)
    # a random mask that keeps each query's own key (a mask hiding all of them draws
    # minitx's polarity warning), except for one query that may see no key at all
    allowed = (np.random.default_rng(seed + 1).random((2, h, n, n)) < 0.6) | np.eye(n, dtype=bool)
    if empty_row and n > 1:
        allowed[0, 0, n // 2] = False
    naive = layer(tensor(x), attn_mask=minitx.tensor(allowed))
    absorbed = layer.absorbed_forward(tensor(x), attn_mask=minitx.tensor(allowed))
    assert_close(absorbed, naive, **TIGHT)
    assert_close(naive, mla_reference(layer, x, allowed), **TIGHT)
    assert np.all(np.isfinite(to_host(absorbed)))


def test_absorbed_weights_are_the_products_of_the_papers_matrices():
    layer = build(12, 3, num_kv_heads=1, kv_rank=5, q_rank=7, rope_dim=2)
    w_qk, w_ov = (to_host(w.data) for w in layer.absorbed_weights())
    w_uq = weight(layer.w_uq).reshape(3, 4, 7)
    w_uk = weight(layer.w_uk)                          # one key head: shared by all three
    w_o = weight(layer.out_proj)
    for head in range(3):
        assert_close(w_qk[head], w_uk.T @ w_uq[head], **TIGHT)
        assert_close(w_ov[head], w_o[:, 4 * head: 4 * head + 4] @ weight(layer.w_uv),
                     **TIGHT)


# ---- attend: softmax attention on the formed heads (kind "exact") -------------------------

@given(nq=st.integers(1, 9), extra=st.integers(0, 6), width=st.sampled_from([3, 6]),
       causal=st.booleans(), seed=st.integers(0, 99))
def test_attend_is_softmax_attention_over_the_heads_width(nq, extra, width, causal, seed):
    """q/k of width D + d_R (here ``width``), v of width D: scale 1/√width, bottom-right causal,
    Nq ≠ Nk (as with a cache)."""
    layer = build(8, 2, causal=causal)
    q, k, _ = qkv(nq, nq + extra, h=2, d=width, seed=seed)
    v = qkv(nq, nq + extra, h=2, d=4, seed=seed + 1)[2]
    allowed = np.tri(nq, nq + extra, extra, dtype=bool) if causal else None
    out = layer.attend(tensor(q), tensor(k), tensor(v))
    assert_close(out, dense_attention_array(q, k, v, allowed, scale=width ** -0.5), **TIGHT)


# ---- decoding through the latent cache -----------------------------------------------------

def small_gpt(**options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=4, n_embd=16,
                       attention="mla", position="none",
                       attention_options=dict(kv_rank=6, q_rank=8, rope_dim=2, **options))
    return GPT(config).double().eval()


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("prefill", [1, 4])
def test_gpt_decoding_through_the_latent_cache_equals_the_full_forward(absorbed, prefill):
    model = small_gpt(absorbed=absorbed)
    ids = np.random.default_rng(0).integers(0, 11, (2, 10))
    full = to_host(model(minitx.tensor(ids))[0])
    caches = model.new_caches()
    steps = [model(minitx.tensor(ids[:, :prefill]), kv_caches=caches)[0]]
    steps += [model(minitx.tensor(ids[:, t:t + 1]), kv_caches=caches)[0]
              for t in range(prefill, 10)]
    assert_close(np.concatenate([to_host(s) for s in steps], axis=1), full, **TIGHT)
    # the cache holds the latent and the shared RoPE key, nothing per head
    for cache in caches:
        assert isinstance(cache, LatentCache) and len(cache) == 10
        assert cache.latent.shape == (2, 10, 6) and cache.rope_keys.shape == (2, 10, 2)
        assert cache.numbers_per_token() == 6 + 2 == model.h[0].attn.cache_numbers_per_token()


def test_cached_generation_gives_the_same_tokens_as_uncached():
    model = small_gpt()
    prompt = minitx.tensor(np.array([[1, 2, 3]]))
    cached = model.generate(prompt, 6, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 6, temperature=0, use_cache=False)
    assert to_host(cached).tolist() == to_host(uncached).tolist()


def test_the_cache_is_smaller_than_mhas_where_the_docstring_says():
    layer = REGISTRY["mla"](128, 8)            # D = 16: d_c = 64, d_R = 8 by default
    assert layer.cache_numbers_per_token() == 64 + 8 < 2 * 8 * 16
    assert "d_c + d_R" in MultiHeadLatentAttention.cache_numbers_per_token.__doc__


# ---- hook points and the identities that tie them to the output -------------------------

def run_hooked(layer, x, form="forward"):
    """(y, {hook name: what it saw}); the absorbed form has no q/k/v/z heads to hook."""
    seen = {}
    heads = ("hook_q", "hook_k", "hook_v", "hook_z")

    def keep(t, hook):
        seen[hook.name] = to_host(t)
    with layer.hooks([(lambda name: form == "forward" or name not in heads, keep)]):
        y = (layer if form == "forward" else layer.absorbed_forward)(tensor(x))
    return to_host(y), seen


def test_hooks_see_the_latent_the_rope_key_and_the_heads_built_from_them():
    layer = build(12, 3, num_kv_heads=1, kv_rank=5, q_rank=7, rope_dim=2, causal=True)
    x = np.random.default_rng(4).standard_normal((2, 6, 12))
    y, seen = run_hooked(layer, x)
    latent, rope_k = seen["hook_latent"], seen["hook_rope_k"]
    assert_close(latent, x @ weight(layer.w_dkv).T, **TIGHT)
    assert_close(rope_k, rope(x @ weight(layer.w_kr).T, np.arange(6)), **TIGHT)
    k, v = seen["hook_k"], seen["hook_v"]                     # (B, N, Hkv, D + d_R), (…, D)
    assert k.shape == (2, 6, 1, 6) and v.shape == (2, 6, 1, 4)
    assert_close(k[:, :, 0, :4], latent @ weight(layer.w_uk).T, **TIGHT)
    assert_close(k[:, :, 0, 4:], rope_k, **TIGHT)              # the one shared RoPE key
    assert_close(v[:, :, 0], latent @ weight(layer.w_uv).T, **TIGHT)
    p = seen["hook_pattern"]                                   # (B, H, N, N)
    z = seen["hook_z"]                                         # (B, N, H, D)
    assert_close(z, np.einsum("bhij,bjd->bihd", p, v[:, :, 0]), **TIGHT)
    assert_close(y, z.reshape(2, 6, 12) @ weight(layer.out_proj).T
                 + to_host(layer.out_proj.bias.data), **TIGHT)
    _, absorbed = run_hooked(layer, x, "absorbed")             # same scores, same pattern
    assert_close(absorbed["hook_pattern"], p, **TIGHT)
    assert_close(absorbed["hook_latent"], latent, **TIGHT)


def test_replacing_the_latent_replaces_every_key_and_value():
    """A zero latent leaves k^C = 0 and v = 0: the output is W_O's bias alone."""
    layer = build(8, 2)
    x = tensor(np.random.default_rng(5).standard_normal((2, 5, 8)))
    with layer.hooks([("hook_latent", lambda t, hook: t * 0)]):
        y = layer(x)
    bias = np.broadcast_to(to_host(layer.out_proj.bias.data), (2, 5, 8))
    assert_close(y, bias, **TIGHT)
    assert not np.allclose(to_host(layer(x)), bias)


def test_head_hooks_send_an_absorbed_layer_through_the_naive_form():
    """absorbed_forward refuses hook_q/k/v/z (it never forms those heads); forward of an
    absorbed=True layer runs the naive form then, so the hook sees the heads and its
    replacement takes effect."""
    layer = build(absorbed=True)
    x = tensor(np.random.default_rng(7).standard_normal((1, 3, 8)))
    plain = to_host(layer(x))
    with layer.hooks([("hook_q", lambda t, hook: None)]):
        with pytest.raises(ValueError, match="absorbed form"):
            layer.absorbed_forward(x)
        assert_close(layer(x), plain, **TIGHT)                 # same values, naive form
    with layer.hooks([("hook_v", lambda t, hook: t * 0)]):
        assert_close(layer(x), np.broadcast_to(to_host(layer.out_proj.bias.data), (1, 3, 8)),
                     **TIGHT)


# ---- gradients ---------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["forward", "absorbed_forward"])
def test_gradcheck_through_the_latent_maps(form):
    layer = build(8, 2, causal=True, num_kv_heads=1, kv_rank=3, q_rank=3, rope_dim=2)
    x = tensor(np.random.default_rng(6).standard_normal((1, 4, 8)) * 0.7, requires_grad=True)
    params = [layer.w_uk.weight, layer.w_kr.weight, layer.w_qr.weight]
    minitx.gradcheck(lambda x, *p: getattr(layer, form)(x), (x, *params))


# ---- options and errors ------------------------------------------------------------------

@pytest.mark.parametrize("options,words", [
    (dict(kv_rank=0), "kv_rank"), (dict(q_rank=-1), "q_rank"), (dict(rope_dim=3), "rope_dim"),
    (dict(rope_dim=2.0), "rope_dim"), (dict(base=0.0), "base"), (dict(absorbed="yes"), "absorbed"),
])
def test_bad_options_name_the_argument(options, words):
    with pytest.raises(ValueError, match=words):
        REGISTRY["mla"](8, 2, **options)


def test_a_kv_cache_of_another_kind_is_refused_by_name():
    layer = build(causal=True)
    with pytest.raises(ValueError, match="LatentCache"):
        layer(tensor(np.zeros((1, 2, 8))), kv_cache=KVCache())


def test_identities_hold_and_are_quick():
    start = time.perf_counter()
    rows = MultiHeadLatentAttention.identities(0)
    assert time.perf_counter() - start < 5.0       # the site calls it once per build
    assert len(rows) == 4 and all(value <= limit for _, value, limit in rows), rows
    assert rows[-1][1] == 16 + 4 and rows[-1][2] == 2 * 32


def test_decoder_stack_decodes_through_latent_caches_and_encoder_takes_padding_masks():
    """The blocks: a decoder stack with one LatentCache per layer decodes like its full causal
    forward; an encoder layer's key-padding mask reaches the latent attention (a padded key
    changes nothing)."""
    minitx.manual_seed(0)
    options = {"kv_rank": 4, "q_rank": 4, "rope_dim": 2}
    dec = TransformerDecoder(TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                                     batch_first=True, attention="mla",
                                                     attention_options=options),
                             num_layers=2).double().eval()
    rng = np.random.default_rng(0)
    tgt, memory = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 3, 8))
    full = to_host(dec(tensor(tgt), tensor(memory)))
    caches = [layer.self_attn.new_cache() for layer in dec.layers]
    steps = [dec(tensor(tgt[:, t:t + 1]), tensor(memory), kv_caches=caches) for t in range(6)]
    assert_close(np.concatenate([to_host(s) for s in steps], axis=1), full, **TIGHT)
    enc = TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True,
                                  attention="mla", attention_options=options).double().eval()
    x = rng.standard_normal((1, 5, 8))
    pad = np.array([[False, False, False, False, True]])       # PyTorch's: True = padding
    y = to_host(enc(tensor(x), src_key_padding_mask=minitx.tensor(pad)))
    x2 = x.copy()
    x2[:, 4] += 5.0                                            # only the padded token changes
    y2 = to_host(enc(tensor(x2), src_key_padding_mask=minitx.tensor(pad)))
    assert_close(y2[:, :4], y[:, :4], **TIGHT)
    assert not np.allclose(to_host(enc(tensor(x2)))[:, :4], y[:, :4])
