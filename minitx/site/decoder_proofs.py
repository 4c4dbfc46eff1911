"""Live proofs for today's decoders: the numbers beside ``nn/decoder_layers.py``,
``nn/rotary.py``, ``nn/moe.py``, ``models/decoder.py`` and ``pretrained/families.py``,
recomputed at every build (the boxes and their thresholds as in ``proofs.py``).

- the blocks against their formulas in NumPy, and a float64 gradient check;
- RoPE's promise, for every scaling: a score depends on the offset only;
- the mixture of experts against a loop over tokens, and its gradient;
- ``count_parameters`` against the models it counts; decoding through the caches against the
  full forward, and what each cache holds per token;
- the KV-cache bytes and active parameters of real models, and the family table, read off
  the loader's translation of their published configurations.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import minitx
from minitx.models.decoder import (Decoder, DecoderConfig, count_parameters,
                                   kv_cache_bytes_per_token)
from minitx.nn.decoder_layers import DecoderRMSNorm, GatedMLP
from minitx.nn.moe import MoE
from minitx.nn.rotary import Rotary
from minitx.pretrained import families

from .proofs import Proof, _gradient, _host, _rel

__all__ = ["decoder_proofs"]

# The small decoders the proofs build: GPT-2's switches, Llama's, Gemma 3's local and global
# layers, DeepSeek's latent attention (and V3.2's indexer on it).
_SMALL = dict(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4)
CONFIGS = {
    "GPT-2": dict(norm="layernorm", norm_bias=True, mlp="gelu", positions="learned",
                  max_position=32, qkv_bias=True, o_bias=True, mlp_bias=True),
    "Llama": dict(num_kv_heads=2, tie_embeddings=False),
    "Gemma 3": dict(num_kv_heads=1, head_dim=16, mlp="geglu", qk_norm="head",
                    norm_placement="sandwich", norm_unit_offset=True, embed_scale=True,
                    sliding_window=4, layer_types=("sliding", "full"),
                    final_logit_softcap=30.0),
    "DeepSeek (MLA)": dict(attention="mla", q_lora_rank=12, kv_lora_rank=10,
                           qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5),
    # DeepSeek-V3.2: the same, each query reading the 3 keys its indexer chooses
    "DeepSeek-V3.2 (MLA + indexer)": dict(attention="mla", q_lora_rank=12, kv_lora_rank=10,
                                          qk_nope_head_dim=6, qk_rope_head_dim=4,
                                          v_head_dim=5, index_topk=3, index_n_heads=4,
                                          index_head_dim=8),
}


def _config(name):
    return DecoderConfig(**_SMALL, **CONFIGS[name])


def _blocks(g, n):
    """decoder_layers.py: RMSNorm and the gated MLP against NumPy, and their gradients."""
    norm_p = Proof("DecoderRMSNorm", "DecoderRMSNorm")
    norm = DecoderRMSNorm(8, eps=1e-6).to(dtype="float64")
    norm.weight.data[...] = g.standard_normal(8)
    x = g.standard_normal((4, 8))
    ref = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * _host(norm.weight)
    norm_p.check("error vs x / √(mean x² + ε) ⊙ w in NumPy, shape 4×8",
                 _rel(_host(norm(minitx.tensor(x))), ref), 1e-14)
    _gradient(norm_p, norm, [g.standard_normal((2, n, 8))])
    mlp_p = Proof("GatedMLP", "GatedMLP")
    mlp = GatedMLP(8, 12, "silu").to(dtype="float64")
    wg, wu, wd = (_host(m.weight) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    gate = x @ wg.T
    ref = (gate / (1 + np.exp(-gate)) * (x @ wu.T)) @ wd.T
    mlp_p.check("SwiGLU: error vs W_d(silu(W_g x) ⊙ W_u x) in NumPy, shape 4×8",
                _rel(_host(mlp(minitx.tensor(x))), ref), 1e-14)
    _gradient(mlp_p, mlp, [g.standard_normal((2, n, 8))])
    return {"minitx/nn/decoder_layers.py": [norm_p, mlp_p]}


ROPES = {"default": {"rope_type": "default", "rope_theta": 10000.0},
         "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
         "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                    "rope_theta": 500000.0},
         "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                  "rope_theta": 10000.0}}


def _rotary(g):
    """rotary.py: (R_{m+s} q)·(R_{n+s} k) = (R_m q)·(R_n k) for each scaling."""
    p = Proof("Rotary", "Rotary")
    q, k = (minitx.tensor(g.standard_normal((1, 1, 1, 16))) for _ in range(2))
    for name, rope in ROPES.items():
        rot = Rotary(16, rope)

        def score(m, n, rot=rot):
            return float(np.sum(_host(rot.rotate(q, np.array([m])))
                                * _host(rot.rotate(k, np.array([n])))))
        worst = max(abs(score(m + s, n + s) - score(m, n)) / max(abs(score(m, n)), 1e-300)
                    for m, n, s in ((3, 1, 100), (7, 7, 1000), (50, 20, 4096)))
        p.check(f"{name}: relative change of a score when both positions shift (by up to "
                "4096), float64", worst, 1e-12)
    return {"minitx/nn/rotary.py": [p]}


def _moe(g, n):
    """moe.py: the dispatch against a loop over tokens, and the gradient."""
    p = Proof("MoE", "MoE")
    minitx.manual_seed(1)
    layer = MoE(8, 12, num_experts=4, top_k=2).to(dtype="float64")
    x = g.standard_normal((2, 5, 8))
    with minitx.no_grad():
        out = _host(layer(minitx.tensor(x)))
        logits = _host(layer.router_logits)
        ref = np.zeros((10, 8))
        for t, xt in enumerate(x.reshape(10, 8)):            # the loop the dispatch avoids
            prob = np.exp(logits[t] - logits[t].max())
            prob /= prob.sum()
            chosen = np.argsort(-prob)[:2]
            for e in chosen:
                y = _host(layer.experts.expert(int(e), minitx.tensor(xt[None])))[0]
                ref[t] += prob[e] / prob[chosen].sum() * y
    p.check("error vs a loop over tokens, Σ_{e ∈ top-2} w_e f_e(x), 4 experts",
            _rel(out, ref.reshape(out.shape)), 1e-13)
    p.check("tokens per expert sum to T·k = 20", abs(int(_host(layer.tokens_per_expert).sum())
                                                      - 20), 0, fmt="{:.0f}")
    _gradient(p, layer, [g.standard_normal((1, n, 8))], limit=1e-5)
    return {"minitx/nn/moe.py": [p]}


def _decoder(g):
    """decoder.py: counts against the built models; decoding against the full forward."""
    counts = Proof("count_parameters", "count_parameters")
    caches = Proof("Decoder", "Decoder")
    ids = g.integers(0, _SMALL["vocab_size"], size=(2, 9))
    for name in CONFIGS:
        minitx.manual_seed(0)
        model = Decoder(_config(name)).to(dtype="float64").eval()
        built = sum(int(np.prod(t.shape)) for t in model.parameters())
        counts.check(f"{name}: |count from the config − parameters built| (of {built:,})",
                     abs(count_parameters(_config(name))["total"] - built), 0, fmt="{:.0f}")
        with minitx.no_grad():
            full = _host(model(minitx.tensor(ids)))
            kv = model.new_caches()
            steps = [_host(model(minitx.tensor(ids[:, :5]), kv_caches=kv))]
            steps += [_host(model(minitx.tensor(ids[:, i:i + 1]), kv_caches=kv))
                      for i in range(5, 9)]
        caches.check(f"{name}: decoding through the caches (5 tokens, then 1 by 1) vs the "
                     "full forward, N = 9", _rel(np.concatenate(steps, axis=1), full), 1e-12)
    return {"minitx/models/decoder.py": [counts, caches]}


def _as_mha(c) -> int:
    """Bytes per token of the same model with every layer full and one key/value head per
    query head (MLA: its keys and values decompressed), in bfloat16: the cache GPT-2 keeps."""
    if c.attention == "mla":
        per_head = c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim
        return c.num_layers * c.num_heads * per_head * 2
    return 2 * c.num_layers * c.num_heads * c.head_dim * 2


def _families():
    """Real models' caches (on decoder.py's page, beside ``kv_cache_bytes_per_token``) and
    counts and the table (families.py), from their configs."""
    kv = Proof("kv_cache_bytes_per_token", "kv_cache_bytes_per_token")
    for kind in families.TODAY:
        c = families.family_config(kind)
        kv.check(f"{families.REPRESENTATIVE[kind][0]} ({kind}): KV cache per token, bf16, KiB "
                 f"(limit: the same model as GPT-2's MHA)",
                 kv_cache_bytes_per_token(c) / 1024, _as_mha(c) / 1024, fmt="{:.1f}")
    llama = families.family_config("llama")
    mha = dataclasses.replace(llama, num_kv_heads=llama.num_heads)
    kv.check("Llama-3.2-1B as MHA / as published (GQA: 32 query heads, 8 key/value) − 4",
             abs(kv_cache_bytes_per_token(mha)
                 / kv_cache_bytes_per_token(llama) - 4), 0.0)
    # two counters that share no code: the hand count from config.json, and the decoder's own
    experts = Proof("expert_counts", "expert_counts")
    for kind in families.TODAY:
        r = families.expert_counts(kind)
        if r["experts"]:
            built = count_parameters(families.family_config(kind))
            model = families.REPRESENTATIVE[kind][0]
            experts.check(f"{model}: {r['top_k']} of {r['experts']} experts, total "
                          f"{r['total'] / 1e9:.1f} B, active per token {r['active'] / 1e9:.2f} B;"
                          f" largest difference from count_parameters' total and active",
                          max(abs(r["total"] - built["total"]),
                              abs(r["active"] - built["active"])), 0.0, fmt="{:,.0f}")
    table = Proof("family_table", "family_table")
    table.note = ("Each family's published configuration, as minitx's loader translates it "
                  "(columns: norm · MLP · positions · attention · window pattern · experts · "
                  "sinks · soft-cap): " + "; ".join(
                      f"{kind} ({row['model']}): " + (row.get("status") or " · ".join(
                          row[col] for col in families.COLUMNS[2:]))
                      for kind, row in ((k, families.family_row(k)) for k in families.TODAY)))
    return {"minitx/pretrained/families.py": [experts, table], "minitx/models/decoder.py": [kv]}


def decoder_proofs(sizes, seed: int) -> dict:
    """{module path: [Proof]} for the decoder chapters' files (module docstring)."""
    g = np.random.default_rng(seed)
    pages = {}
    for part in (_blocks(g, sizes.grad_n), _rotary(g), _moe(g, sizes.grad_n), _decoder(g),
                 _families()):
        for path, proofs in part.items():
            pages.setdefault(path, []).extend(proofs)
    return pages
