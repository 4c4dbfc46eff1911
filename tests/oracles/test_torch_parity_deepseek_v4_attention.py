"""DeepSeek-V4's compressed attention layers against HF's ``DeepseekV4Attention`` (the oracle):
a tiny ``DeepseekV4Config`` (E = 32, H = 4 heads of D = 16, one key/value head, R = 8 rotary
dims, window 6, CSA m = 4 with top-k 3 of an 8-head indexer of d_I = 8, HCA m = 8, two output
groups), every parameter redrawn (sinks and position biases too), CPU, float64.

The module boundary differs: HF's layer maps x (B, N, E) to (B, N, E), minitx's variant
(``compressed_attend``) takes the query and key/value heads and the compressors' streams. So the
test adds around the variant what HF's layer does outside the attention maths, with the same
weights: the query path (q_a_proj, weighted RMSNorm, q_b_proj, unweighted RMSNorm per head),
the key/value path (kv_proj, weighted RMSNorm), the compressors and the indexer built on HF's
streams (``Compressor`` and ``CompressedIndexer`` reading x, the indexer's queries the query
latent), and the grouped low-rank output projection (o_a_proj per group, o_b_proj). Rotary,
compression, selection, window, sinks and turning the output back are the variant's.

HF's code casts to float32 in its RMSNorms, rotary tables and the compressor's softmax (for its
bf16 checkpoints), which would bound agreement near 1e-7: the HF side runs with torch's float32
names aliased to float64, so both sides compute in float64 and agree to 1e-10 relative.
"""
import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

from minitx.attention import REGISTRY  # noqa: E402
from minitx.attention.compressed import CompressedIndexer, Compressor  # noqa: E402
from minitx.nn.module import Parameter  # noqa: E402
import minitx.functional as F  # noqa: E402
from support import tensor, to_host  # noqa: E402

modeling = need("transformers.models.deepseek_v4.modeling_deepseek_v4")

E, H, D, R, RQ = 32, 4, 16, 8, 24
WINDOW, TOPK, IH, ID = 6, 3, 8, 8
RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
CONFIG = dict(vocab_size=50, hidden_size=E, moe_intermediate_size=16, num_hidden_layers=2,
              num_attention_heads=H, num_key_value_heads=1, head_dim=D, q_lora_rank=RQ,
              partial_rotary_factor=R / D, sliding_window=WINDOW, compress_rates=RATES,
              layer_types=list(RATES), index_n_heads=IH, index_head_dim=ID, index_topk=TOPK,
              o_groups=2, o_lora_rank=8, n_routed_experts=4, num_experts_per_tok=2,
              rms_norm_eps=0.05, compress_rope_theta=1000.0)


@pytest.fixture
def float64_torch(monkeypatch):
    """torch's float32 names read as float64 while HF's layer is built and run (restored
    after): its explicit float32 casts then keep float64."""
    monkeypatch.setattr(torch, "float32", torch.float64)
    monkeypatch.setattr(torch, "float", torch.float64)
    monkeypatch.setattr(torch.Tensor, "float", torch.Tensor.double)


def hf_layer(kind):
    """HF's attention layer of ``kind`` and its rotary tables, every parameter redrawn."""
    config = transformers.DeepseekV4Config(**CONFIG)
    config._attn_implementation = "eager"
    layer = modeling.DeepseekV4Attention(config, config.layer_types.index(kind)).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 0.3 if "weight" in name and "norm" not in name else 0.5
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale
                    + (1.0 if "norm" in name else 0.0))
    return config, layer, modeling.DeepseekV4RotaryEmbedding(config).double()


def hf_forward(config, layer, rotary, x):
    """HF's layer on x (B, N, E), the sliding-window causal mask built by hand."""
    n = x.shape[1]
    pos = torch.arange(n)[None]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= i) & (j > i - config.sliding_window)
    mask = torch.zeros(x.shape[0], 1, n, n, dtype=torch.float64).masked_fill(~allowed,
                                                                               float("-inf"))
    emb = {t: rotary(x, pos, layer_type=t) for t in ("main", "compress")}
    with torch.no_grad():
        out, _ = layer(x, position_embeddings=emb, position_ids=pos, attention_mask=mask)
    return out.numpy()


def hf_decode(config, layer, rotary, x, edges):
    """HF's layer through its own cache (``DynamicCache`` builds its CSA / HCA layers), the
    chunks between ``edges``: each chunk's mask covers the window rows the cache returns."""
    cache = transformers.DynamicCache(config=config)
    w, outs = config.sliding_window, []
    for a, z in zip(edges, edges[1:]):
        pos = torch.arange(a, z)[None]
        keys = torch.arange(a - min(a, w - 1), z)
        allowed = (keys[None] <= pos[0][:, None]) & (keys[None] > pos[0][:, None] - w)
        mask = torch.zeros(x.shape[0], 1, z - a, len(keys), dtype=torch.float64)
        mask = mask.masked_fill(~allowed, float("-inf"))
        chunk = x[:, a:z]
        emb = {t: rotary(chunk, pos, layer_type=t) for t in ("main", "compress")}
        with torch.no_grad():
            out, _ = layer(chunk, position_embeddings=emb, position_ids=pos,
                           attention_mask=mask, cache=cache)
        outs.append(out.numpy())
    return np.concatenate(outs, axis=1)


def weight(module, name):
    return tensor(getattr(module, name).detach().numpy())


def copy_compressor(mine, theirs):
    for ours, hf_name in (("content", "kv_proj"), ("gate", "gate_proj")):
        getattr(mine, ours).weight = Parameter(getattr(theirs, hf_name).weight.detach().numpy())
    mine.position_bias = Parameter(theirs.position_bias.detach().numpy())
    mine.kv_norm.weight = Parameter(theirs.kv_norm.weight.detach().numpy())


def minitx_forward(config, hf, kind, x, before=None, edges=None):
    """The variant with HF's weights, the projections around it as HF's layer has them;
    ``edges``: decode the chunks between them through the variant's cache."""
    sparse = kind == "compressed_sparse_attention"
    m, eps = RATES[kind], config.rms_norm_eps
    theta = config.compress_rope_theta
    name = "compressed_sparse" if sparse else "heavily_compressed"
    options = {"top_k": TOPK, "indexer_heads": IH, "indexer_dim": ID} if sparse else {}
    layer = REGISTRY[name](H * D, H, causal=True, num_kv_heads=1, compress=m, window=WINDOW,
                           rope_dim=R, rope_base=theta, eps=eps, **options)
    # the compressors on HF's streams: x for the entries and the index keys, the query
    # latent for the indexer's queries
    layer.compressor = Compressor(E, D, m, sparse, R, theta, eps)
    copy_compressor(layer.compressor, hf.compressor)
    if sparse:
        layer.indexer = CompressedIndexer(RQ, E, E, IH, ID, TOPK, m, R, theta, eps)
        ix = hf.compressor.indexer
        copy_compressor(layer.indexer.compressor, ix)
        layer.indexer.query.weight = Parameter(ix.q_b_proj.weight.detach().numpy())
        layer.indexer.weights.weight = Parameter(
            ix.scorer.weights_proj.weight.detach().numpy())
    layer.sinks = Parameter(hf.sinks.detach().numpy())
    layer.to(dtype="float64")
    if before is not None:
        before(layer)
    # what HF's layer does outside the attention maths, on the whole text or chunk by chunk
    n = x.shape[1]
    cache = None if edges is None else layer.new_cache()
    outs = [outside(config, hf, layer, x[:, a:z], cache)
            for a, z in ([(0, n)] if edges is None else zip(edges, edges[1:]))]
    return np.concatenate(outs, axis=1), layer


def outside(config, hf, layer, x, cache):
    """HF's query and key/value paths, the variant, HF's grouped output projection."""
    eps = config.rms_norm_eps
    b, n, _ = x.shape
    xt = tensor(x)
    q_res = F.rms_norm(F.matmul(xt, F.transpose(weight(hf.q_a_proj, "weight"), (1, 0))),
                       (RQ,), weight(hf.q_a_norm, "weight"), eps)
    q = F.matmul(q_res, F.transpose(weight(hf.q_b_proj, "weight"), (1, 0)))
    q = F.rms_norm(F.transpose(F.reshape(q, (b, n, H, D)), (0, 2, 1, 3)), (D,), None, eps)
    kv = F.rms_norm(F.matmul(xt, F.transpose(weight(hf.kv_proj, "weight"), (1, 0))), (D,),
                    weight(hf.kv_norm, "weight"), eps)
    kv = F.reshape(kv, (b, 1, n, D))
    y = layer.compressed_attend(q, kv, F.reshape(xt, (b, 1, n, E)), index_query=q_res,
                                index_weights=xt, index_keys=xt, cache=cache)   # (B, H, N, D)
    # the grouped output projection: each group's H·D/g dims to r, then r·g to E
    g, r = config.o_groups, config.o_lora_rank
    grouped = F.reshape(F.transpose(y, (0, 2, 1, 3)), (b, n, g, 1, H * D // g))
    wa = F.reshape(weight(hf.o_a_proj, "weight"), (g, r, H * D // g))
    mid = F.reshape(F.matmul(grouped, F.transpose(wa, (0, 2, 1))), (b, n, g * r))
    return to_host(F.matmul(mid, F.transpose(weight(hf.o_b_proj, "weight"), (1, 0))))


def no_ties_at_the_boundary(scores):
    """True when no row's k-th and (k + 1)-th visible index scores are equal: a tie (every
    indexer head's ReLU at 0 gives I = 0 exactly) is broken towards the earlier entry by
    minitx and in an unspecified order by torch's topk, so the data must have none there."""
    ranked = -np.sort(-scores, axis=-1)
    if ranked.shape[-1] <= TOPK:
        return True
    kth, after = ranked[..., TOPK - 1], ranked[..., TOPK]
    return not np.any((kth == after) & np.isfinite(kth))


@pytest.mark.parametrize("kind", list(RATES))
@pytest.mark.parametrize("n", [1, 7, 19, 33])
def test_prefill_equals_hf(float64_torch, kind, n):
    config, hf, rotary = hf_layer(kind)
    x = np.random.default_rng(n).standard_normal((2, n, E))
    want = hf_forward(config, hf, rotary, torch.from_numpy(x))
    seen = []
    got, _ = minitx_forward(config, hf, kind, x, None if kind != "compressed_sparse_attention"
                            else lambda layer: layer.indexer.hook_index_scores.add_hook(
                                lambda t, hook: seen.append(to_host(t))))
    assert all(no_ties_at_the_boundary(s) for s in seen)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-10, (kind, n, err)


def test_the_indexer_chooses_what_hf_chooses(float64_torch):
    """At N = 33 the CSA layer has 8 entries and reads 3: the selection is a real choice, and
    minitx's indexer (its ``hook_topk_indices``) picks HF's entries for every query, −1 where
    fewer than 3 blocks are complete."""
    kind = "compressed_sparse_attention"
    config, hf, _ = hf_layer(kind)
    x = np.random.default_rng(5).standard_normal((2, 33, E))
    seen = []
    minitx_forward(config, hf, kind, x, lambda layer: layer.indexer.hook_topk_indices.add_hook(
        lambda t, hook: seen.append(to_host(t))))
    xt = torch.from_numpy(x)
    with torch.no_grad():
        q_res = hf.q_a_norm(hf.q_a_proj(xt))
        want = hf.compressor.indexer(xt, q_res, torch.arange(33)[None], None, 0).numpy()
    got = seen[0]
    assert got.shape == want.shape == (2, 33, TOPK)
    np.testing.assert_array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1))
    complete = (np.arange(33) + 1) // RATES[kind]
    assert np.array_equal((got >= 0).sum(axis=-1), np.broadcast_to(np.minimum(complete, TOPK),
                                                                   (2, 33)))
    assert complete.max() > TOPK


@pytest.mark.parametrize("kind", list(RATES))
def test_decoding_through_both_caches_equals_hf_prefill(float64_torch, kind):
    """HF's layer decoding through its own cache, and minitx's through ``CompressedCache``, in
    the same uneven chunks (a prompt of 5, single tokens across block and window edges, a chunk
    of 9), both equal HF's one-shot prefill."""
    config, hf, rotary = hf_layer(kind)
    x = np.random.default_rng(11).standard_normal((2, 30, E))
    edges = [0, 5, 6, 7, 8, 17, 18, 19, 30]
    want = hf_forward(config, hf, rotary, torch.from_numpy(x))
    theirs = hf_decode(config, hf, rotary, torch.from_numpy(x), edges)
    seen = []
    ours, _ = minitx_forward(config, hf, kind, x, None if kind != "compressed_sparse_attention"
                             else lambda layer: layer.indexer.hook_index_scores.add_hook(
                                 lambda t, hook: seen.append(to_host(t))), edges=edges)
    assert all(no_ties_at_the_boundary(s) for s in seen)
    scale = np.abs(want).max()
    assert np.abs(theirs - want).max() / scale <= 1e-10
    assert np.abs(ours - want).max() / scale <= 1e-10
