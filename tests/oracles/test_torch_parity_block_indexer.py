"""The block indexer (``minitx/attention/block_indexer.py``) against ``transformers``' Qwen4-Exp
(the test-only oracle): ``Qwen4ExpTextAttention`` with its ``Qwen4ExpTextQSAIndexer``, built
from a tiny config (hidden 16, 2 query heads over 1 key/value head of 8, partial RoPE of 4,
an indexer of 3 heads of 8, blocks of c, a budget of k·c tokens), every parameter redrawn
(the zero-centred norm weights too), CPU float64.

The module boundary: minitx's variant reads its indexer from the attention's own heads, and
leaves RoPE out; Qwen4-Exp's indexer projects the hidden state and rotates its queries and
pooled keys. So the test runs minitx's steps on HF's own inputs, and adds around them what
HF does between them:

- the indexer: HF's ``index_qk_proj``, ``q_layernorm`` and rotation give the index queries,
  and the raw index keys; minitx pools the keys per complete block (``pooled_block_keys``);
  HF's ``k_layernorm`` and rotation at each block's first position follow (the test's step);
  minitx scores the blocks (``block_index_scores``), keeps the complete ones
  (``complete_blocks``), takes the top k and adds the tail (``indexed_blocks``): the keys
  each query reads equal HF's ``selected_token_mask``, exactly;
- the attention: the queries, keys, values and mask that HF's attention hands its attention
  function (recorded there; the gate and output projection come after) against minitx's
  ``block_attention`` over the blocks minitx chose: within 1e-12 of the largest output.

HF computes its RMSNorms and index scores in float32 by design (``.float()``); the tests make
``Tensor.float`` keep float64 while they run (``keep_float64``), so that the comparison is of
the formulas, not of float32 rounding.
"""
import math

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")

from minitx.attention import block_attention  # noqa: E402
from minitx.attention.block_indexer import (block_index_scores, complete_blocks,  # noqa: E402
                                            indexed_blocks, indexed_mask, pooled_block_keys)
from minitx.attention.selection import top_k_indices  # noqa: E402
from minitx.backend import get_array_module  # noqa: E402
from support import tensor, to_host  # noqa: E402

from transformers.models.qwen4_exp import modeling_qwen4_exp as qwen4  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, ROTARY = 16, 2, 1, 8, 4
INDEX_HEADS, INDEX_DIM = 3, 8


@pytest.fixture
def keep_float64(monkeypatch):
    """HF's ``.float()`` keeps a float64 tensor float64 while the test runs."""
    real = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float",
                        lambda self, *a, **k: self if self.dtype == torch.float64
                        else real(self, *a, **k))


@pytest.fixture
def recorded(monkeypatch):
    """What HF's attention hands its attention function (sdpa): query, key, value, mask, and
    what it returns."""
    seen = {}
    sdpa = transformers.integrations.sdpa_attention.sdpa_attention_forward

    def record(module, query, key, value, attention_mask, **kwargs):
        out = sdpa(module, query, key, value, attention_mask, **kwargs)
        seen.update(q=query, k=key, v=value, mask=attention_mask, out=out[0])
        return out

    class Interface:
        @staticmethod
        def get_interface(name, default):
            return record
    monkeypatch.setattr(qwen4, "ALL_ATTENTION_FUNCTIONS", Interface())
    return seen


def config(block, top_k):
    cfg = qwen4.Qwen4ExpTextConfig(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, rms_norm_eps=0.05, num_hidden_layers=1, vocab_size=32,
        moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts=4,
        num_experts_per_tok=2, indexer_n_heads=INDEX_HEADS, indexer_kv_heads=1,
        indexer_head_dim=INDEX_DIM, indexer_budget=top_k * block, indexer_compress_ratio=block,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                         "partial_rotary_factor": ROTARY / HEAD_DIM})
    cfg._attn_implementation = "sdpa"
    return cfg


def rotary(b, n):
    """cos, sin (B, N, ROTARY) of positions 0 … N − 1, HF's rotate-half layout."""
    inv = 100.0 ** (-torch.arange(0, ROTARY, 2, dtype=torch.float64) / ROTARY)
    freqs = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], dim=-1).expand(b, n, ROTARY)
    return emb.cos(), emb.sin()


def hf_attention(block, top_k, seed):
    attn = qwen4.Qwen4ExpTextAttention(config(block, top_k), layer_idx=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return attn.to(torch.float64).eval()


def minitx_choice(indexer, hidden, cos, sin, block, top_k):
    """minitx's steps on HF's inputs, HF's between them (module docstring): the blocks each
    query reads and which of their keys, (B, N, k + 1) and (B, N, k + 1, c)."""
    b, n, _ = hidden.shape
    with torch.no_grad():
        qk = indexer.index_qk_proj(hidden)
        q, keys = qk.split([INDEX_HEADS * INDEX_DIM, INDEX_DIM], dim=-1)
        q = indexer.q_layernorm(q.reshape(b, n, INDEX_HEADS, INDEX_DIM))
        q = qwen4.apply_rotary_pos_emb(q, cos=cos, sin=sin, unsqueeze_dim=2)
    pooled = pooled_block_keys(tensor(keys.numpy()), block)                 # minitx
    nb = pooled.shape[1]
    with torch.no_grad():                                                   # HF's step
        kbar = indexer.k_layernorm(torch.tensor(to_host(pooled)))
        starts = torch.arange(nb) * block
        if nb:                                   # (B, nb, 1, d_I), at positions i·c
            kbar = qwen4.apply_rotary_pos_emb(kbar.unsqueeze(2), cos=cos[:, starts],
                                              sin=sin[:, starts], unsqueeze_dim=2).squeeze(2)
    qi = tensor(q.permute(0, 2, 1, 3).numpy())                              # (B, h_I, N, d_I)
    scores = block_index_scores(qi, tensor(kbar.numpy()), 1.0 / math.sqrt(INDEX_DIM)).data
    xp = get_array_module(scores)
    scores = xp.where(complete_blocks(n, n, block, True, xp), scores, -math.inf)
    chosen, ok = top_k_indices(scores, top_k)
    return indexed_blocks(chosen, ok, n, n, block, True)


CASES = [(1, 2, 1), (7, 2, 1), (12, 3, 2), (13, 3, 2), (23, 4, 3), (19, 1, 5), (9, 5, 4)]


@pytest.mark.parametrize("n,block,top_k", CASES)
def test_the_keys_read_equal_qwen4_exp(keep_float64, recorded, n, block, top_k):
    attn = hf_attention(block, top_k, seed=n + block)
    rng = np.random.default_rng(n * 7 + top_k)
    hidden = torch.tensor(rng.standard_normal((2, n, HIDDEN)))
    cos, sin = rotary(2, n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(2, 1, n, n)
    with torch.no_grad():
        want = attn.indexer(hidden, (cos, sin), mask, None)                # (B, 1, N, N)
        attn(hidden, (cos, sin), attention_mask=mask)
    blocks, allowed = minitx_choice(attn.indexer, hidden, cos, sin, block, top_k)
    got = to_host(indexed_mask(blocks, allowed, n, block))                  # (B, N, N)
    assert np.array_equal(got, want[:, 0].numpy())
    assert np.array_equal(got, recorded["mask"][:, 0].numpy())             # what attention used
    if n > block * (top_k + 1):
        assert not got.all(axis=(1, 2)).any()                               # a real choice


@pytest.mark.parametrize("n,block,top_k", CASES)
def test_attention_under_the_choice_equals_qwen4_exp(keep_float64, recorded, n, block, top_k):
    attn = hf_attention(block, top_k, seed=n + block + 1)
    rng = np.random.default_rng(n * 5 + top_k)
    hidden = torch.tensor(rng.standard_normal((2, n, HIDDEN)))
    cos, sin = rotary(2, n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(2, 1, n, n)
    with torch.no_grad():
        attn(hidden, (cos, sin), attention_mask=mask)
    blocks, allowed = minitx_choice(attn.indexer, hidden, cos, sin, block, top_k)
    q = recorded["q"].numpy()                                               # (B, H, N, D)
    k, v = (np.repeat(recorded[x].numpy(), HEADS // KV_HEADS, axis=1) for x in ("k", "v"))
    shape = (2, HEADS) + blocks.shape[1:]
    xp = get_array_module(blocks)
    out = block_attention(tensor(q), tensor(k), tensor(v), xp.broadcast_to(blocks[:, None], shape),
                          xp.broadcast_to(allowed[:, None], shape + (block,)), block,
                          HEAD_DIM ** -0.5)
    want = recorded["out"].numpy().transpose(0, 2, 1, 3)                    # (B, H, N, D)
    got = to_host(out)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
