r"""Today's decoder families side by side, generated from minitx's own translation: each
family's published ``config.json`` (the keys that change the maths) goes through
``decoders.decoder_config``, and the table is read off the ``DecoderConfig`` it gives. A
family whose ``model_type`` is not in ``decoders.FAMILIES`` yet, or whose configuration the
translation refuses, says so in its row: nothing here is written by hand but the configs.

Two costs are counted from a configuration alone (no model is built, so real sizes cost
nothing). The KV cache's growth per token of context once every window is full
(``models.decoder.kv_cache_bytes_per_token``, read off the total ``kv_cache_bytes``): what a
full layer adds per token, keys and values of Hkv heads
of D numbers (GQA; MHA when Hkv = H), or MLA's latent of r numbers and one rotary key of D_r
(and DeepSeek-V3.2's indexer key of d_I numbers; d_I = 0 without it); a sliding layer's
cache keeps at most its last W − 1 tokens and adds nothing once full, and a hybrid's recurrent layer
(gated DeltaNet, KDA, lightning attention) keeps a state of fixed size. With b bytes a number,
over the L_full full layers:

$$
\text{GQA: } 2\, L_{\text{full}}\, H_{kv}\, D\, b, \qquad
\text{MLA: } L_{\text{full}}\, (r + D_r + d_I)\, b \quad \text{bytes per token}
$$

And the parameters a token meets under a mixture of experts: of n experts of width I per
layer it runs the k its router picks (and the shared ones, of width s·I), so with
P_rest the parameters outside the experts,

$$
P_{\text{total}} = P_{\text{rest}} + L_{\text{moe}}\, (n + s)\, 3EI, \qquad
P_{\text{active}} = P_{\text{rest}} + L_{\text{moe}}\, (k + s)\, 3EI
$$

(Qwen3-Next's one shared expert has a width of its own and a gate w_s of E numbers, which
replace s·3EI.)
"""
from __future__ import annotations

import dataclasses

from .. import validate
from ..models.decoder import (DecoderConfig, check_config, count_parameters,
                              kv_cache_bytes_per_token)
from . import decoders

__all__ = ["TODAY", "REPRESENTATIVE", "COLUMNS", "family_config", "attention_config",
           "family_row", "family_table", "kv_cache_bytes_per_token", "expert_counts",
           "DENSE_TWIN"]

# The families, in the course's order (HF's model_type names); the hybrids last.
TODAY = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma3_text", "olmo2",
         "gpt_oss", "deepseek_v3", "deepseek_v32",
         "qwen3_next", "kimi_linear", "minimax")

# One published model of each family: the config.json keys that change the forward (the
# ignored ones, token ids and dtype, are left out). The facts are the checkpoints' own.
REPRESENTATIVE = {
    # Llama 3.2: GQA, Llama 3's rope scaling, a tied head
    "llama": ("Llama-3.2-1B", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
        hidden_act="silu", max_position_embeddings=131072, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    # Mistral 7B v0.1: every layer slides over 4096 tokens
    "mistral": ("Mistral-7B-v0.1", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, hidden_act="silu",
        max_position_embeddings=32768, tie_word_embeddings=False, rope_theta=10000.0,
        sliding_window=4096)),
    # Qwen2.5: biases on q, k, v; the window written but switched off
    "qwen2": ("Qwen2.5-0.5B", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1000000.0,
        use_sliding_window=False, sliding_window=32768, max_window_layers=24)),
    # Qwen3: QK-norm, a head dim wider than E/H
    "qwen3": ("Qwen3-0.6B", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        hidden_act="silu", max_position_embeddings=40960, tie_word_embeddings=True,
        attention_bias=False, rope_theta=1000000.0, use_sliding_window=False,
        sliding_window=None, max_window_layers=28)),
    # Qwen3-MoE: 8 of 128 narrow experts in every layer
    "qwen3_moe": ("Qwen3-30B-A3B", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
        hidden_act="silu", max_position_embeddings=40960, tie_word_embeddings=False,
        attention_bias=False, rope_theta=1000000.0, use_sliding_window=False,
        sliding_window=None, max_window_layers=48, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[])),
    # Mixtral: Mistral's attention, 2 of 8 experts of full width
    "mixtral": ("Mixtral-8x7B", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, hidden_act="silu",
        max_position_embeddings=32768, tie_word_embeddings=False, rope_theta=1000000.0,
        sliding_window=None, num_local_experts=8, num_experts_per_tok=2)),
    # Gemma 3: five local layers to one global, two rope bases, GeGLU
    "gemma3_text": ("Gemma-3-270M", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
        tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256,
        rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512,
        _sliding_window_pattern=6, final_logit_softcapping=None, attn_logit_softcapping=None)),
    # OLMo 2: norms after each sublayer, QK-norm over the projection
    "olmo2": ("OLMo-2-0425-1B", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
        rope_theta=500000.0)),
    # gpt-oss: sinks, biases, alternating windows, YaRN, clamped SwiGLU experts
    "gpt_oss": ("gpt-oss-20b", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
        hidden_act="silu", max_position_embeddings=131072, tie_word_embeddings=False,
        attention_bias=True, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12, rope_theta=150000.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 4096},
        num_local_experts=32, num_experts_per_tok=4, swiglu_limit=7.0)),
    # DeepSeek-V3: latent attention, 3 dense layers, then 8 of 256 experts + 1 shared
    "deepseek_v3": ("DeepSeek-V3", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=163840, tie_word_embeddings=False, attention_bias=False,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, moe_intermediate_size=2048, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="noaux_tc",
        scoring_func="sigmoid", rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096})),
    # Qwen3-Next: three gated DeltaNet layers to one gated attention layer (a quarter of each
    # head rotated), 10 of 512 narrow experts plus a gated shared one
    "qwen3_next": ("Qwen3-Next-80B", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
        hidden_act="silu", max_position_embeddings=262144, tie_word_embeddings=False,
        attention_bias=False, rope_theta=10000000.0, partial_rotary_factor=0.25,
        full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[])),
    # Kimi Linear: 20 KDA layers (a fixed-size state) and 7 MLA layers without rotation,
    # 1-based as the file writes them; then DeepSeek-V3's experts, 8 of 256 + 1 shared
    "kimi_linear": ("Kimi-Linear-48B-A3B", dict(
        vocab_size=163840, hidden_size=2304, intermediate_size=9216, num_hidden_layers=27,
        num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5, hidden_act="silu",
        model_max_length=1048576, tie_word_embeddings=False, q_lora_rank=None,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        mla_use_nope=True, first_k_dense_replace=1, moe_layer_freq=1, num_experts=256,
        num_shared_experts=1, num_experts_per_token=8, moe_intermediate_size=1024,
        num_expert_group=1, topk_group=1, routed_scaling_factor=2.446, moe_renormalize=True,
        moe_router_activation_func="sigmoid", use_grouped_topk=True,
        linear_attn_config={"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                            "kda_layers": [i for i in range(1, 28) if i % 4 and i != 27]})),
    # MiniMax-Text-01 (HF's conversion): 7 lightning layers to 1 softmax, 2 of 32 experts,
    # residual weights α = (2L)^{1/4} on the normalised input
    "minimax": ("MiniMax-Text-01", dict(
        vocab_size=200064, hidden_size=6144, intermediate_size=9216, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        hidden_act="silu", max_position_embeddings=10240000, tie_word_embeddings=False,
        rope_theta=10000000.0, sliding_window=None, num_local_experts=32,
        num_experts_per_tok=2, block_size=256,
        layer_types=["full_attention" if (i + 1) % 8 == 0 else "linear_attention"
                     for i in range(80)],
        full_attn_alpha_factor=3.5565588200778455, full_attn_beta_factor=1.0,
        linear_attn_alpha_factor=3.5565588200778455, linear_attn_beta_factor=1.0,
        mlp_alpha_factor=3.5565588200778455, mlp_beta_factor=1.0)),
}
# DeepSeek-V3.2: V3's model, plus a lightning indexer choosing 2048 keys per query
REPRESENTATIVE["deepseek_v32"] = ("DeepSeek-V3.2", dict(
    REPRESENTATIVE["deepseek_v3"][1], index_topk=2048, index_n_heads=64, index_head_dim=128))

COLUMNS = ("family", "model", "norm", "MLP", "positions", "attention", "window pattern",
           "experts", "sinks", "soft-cap")

# HF's names for the expert counts and widths, each family's spelling first.
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
# … and every key only a mixture of experts has (dropped to read its dense twin)
_MOE_ONLY = frozenset(_EXPERT_KEYS + ("num_experts_per_tok", "moe_intermediate_size",
                                      "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                                      "swiglu_limit", "layer_types"))


def _representative(kind):
    if kind not in REPRESENTATIVE:
        raise validate.OptionError(f"families: no representative config for {kind!r} "
                                   f"(known: {', '.join(REPRESENTATIVE)})")
    name, cfg = REPRESENTATIVE[kind]
    return name, dict(cfg, model_type=kind)


def family_config(kind: str) -> DecoderConfig:
    """The ``DecoderConfig`` minitx's loader makes of ``kind``'s representative config.json;
    ``OptionError`` (saying why) when the family is not loadable yet."""
    name, cfg = _representative(kind)
    return check_config(decoders.decoder_config(cfg, f"{name}/config.json"))


# A family not loadable yet, read as the loadable one whose attention it shares (the cache and
# the count outside the experts see only the attention): Mixtral's is Mistral's, Qwen3-MoE's
# Qwen3's, gpt-oss's Llama's with biases, plus its learned sinks and alternating windows.
DENSE_TWIN = {"mixtral": ("mistral", {}), "qwen3_moe": ("qwen3", {}),
              "gpt_oss": ("llama", {"attn_sinks": True})}


def attention_config(kind: str) -> DecoderConfig:
    """``family_config``, or — when the experts are what is refused — the same config.json
    with dense MLPs (DeepSeek-V3: every layer dense; the others: read as their
    ``DENSE_TWIN``). The attention, and so the KV cache, does not depend on the MLP."""
    try:
        return family_config(kind)
    except validate.OptionError:
        name, cfg = _representative(kind)
        if kind in ("deepseek_v3", "deepseek_v32"):
            cfg["first_k_dense_replace"] = cfg["num_hidden_layers"]
            return check_config(decoders.decoder_config(cfg, f"{name}/config.json (dense)"))
        if kind not in DENSE_TWIN:
            raise
        twin, extra = DENSE_TWIN[kind]
        dense = {k: v for k, v in cfg.items() if k not in _MOE_ONLY}
        c = decoders.decoder_config(dict(dense, model_type=twin), f"{name}/config.json")
        if "layer_types" in cfg:                     # windows the twin does not read
            extra = dict(extra, sliding_window=cfg["sliding_window"], layer_types=tuple(
                t.split("_")[0] for t in cfg["layer_types"]))
        return check_config(dataclasses.replace(c, **extra))


def expert_counts(kind: str) -> dict:
    """{"total", "active", "lookup", "experts", "top_k", "shared"}: the parameters of
    ``kind``'s representative model and those one token runs through (module docstring), from
    its config.json; the model's other parameters come from ``count_parameters`` of its dense
    twin. A dense family has total = active. "lookup" is the embedding table V·E, which a
    token reads one row of: some model cards leave it out of the active count (gpt-oss's
    3.6 B), others keep it (Mixtral's 12.9 B)."""
    name, cfg = _representative(kind)
    c = attention_config(kind)
    n = next((cfg[k] for k in _EXPERT_KEYS if k in cfg), 0)
    if not n:
        total = count_parameters(dataclasses.replace(c, mlp=c.mlp if c.mlp != "moe"
                                                     else "swiglu"))["total"]
        return {"total": total, "active": total, "lookup": c.vocab_size * c.hidden_size,
                "experts": 0, "top_k": 0, "shared": 0}
    # the dense twin with no MLP at all in its expert layers: its parameters are the rest's
    k = cfg.get("num_experts_per_tok", cfg.get("num_experts_per_token"))    # Kimi's spelling
    s = cfg.get("n_shared_experts", cfg.get("num_shared_experts", 0))
    e, width = cfg["hidden_size"], cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    moe_layers = c.num_layers - cfg.get("first_k_dense_replace", 0)
    dense = dataclasses.replace(c, mlp="swiglu", ffn_hidden=cfg["intermediate_size"])
    rest = count_parameters(dense)["total"] - moe_layers * 3 * e * cfg["intermediate_size"]
    router = n * e + n * bool(cfg.get("swiglu_limit"))          # gpt-oss: a router bias too
    expert = 3 * e * width + (2 * width + e) * bool(cfg.get("swiglu_limit"))   # its biases
    shared = s * 3 * e * width
    if cfg.get("shared_expert_intermediate_size"):   # Qwen3-Next: its own width, and its gate
        s, shared = 1, 3 * e * cfg["shared_expert_intermediate_size"] + e
    rest += moe_layers * (router + shared)
    return {"total": rest + moe_layers * n * expert, "active": rest + moe_layers * k * expert,
            "lookup": c.vocab_size * e, "experts": n, "top_k": k, "shared": s}


# ---- the table ----------------------------------------------------------------------------

def _pattern(types, window):
    """'all full', 'all sliding (W 4096)', or how many layers of each type, in the order they
    first appear: '15 sliding, 3 full (W 512)', '36 gated_deltanet, 12 full'."""
    if set(types) == {"full"}:
        return "all full"
    if set(types) == {"sliding"}:
        return f"all sliding (W {window})"
    return ", ".join(f"{types.count(t)} {t}" for t in dict.fromkeys(types)) + \
        (f" (W {window})" if "sliding" in types else "")


def _cells(c: DecoderConfig) -> dict:
    """The table's columns read off one DecoderConfig."""
    norm = "RMSNorm" if c.norm == "rmsnorm" else "LayerNorm"
    norm += {"pre": ", pre", "post": ", post", "sandwich": ", sandwich"}[c.norm_placement]
    norm += ", (1+w)" if c.norm_unit_offset else ""
    mlp = {"gelu": "GELU", "swiglu": "SwiGLU", "geglu": "GeGLU", "moe": "MoE"}[c.mlp]
    rope = c.rope["rope_type"]
    positions = {"learned": "learned", "none": "none"}.get(
        c.positions, f"RoPE {rope}" + (", local base" if c.local_rope else ""))
    # attention: its kind and head sharing, then what it adds (QK-norm, biases)
    if c.attention == "mla":
        attention = f"MLA{'+DSA' if c.index_topk else ''} (r {c.kv_lora_rank})"
    else:
        h, hkv = c.num_heads, c.num_kv_heads
        attention = "MHA" if hkv == h else "MQA" if hkv == 1 else f"GQA {h}/{hkv}"
    attention += ", QK-norm" if c.qk_norm else ""
    attention += ", qkv bias" if c.qkv_bias else ""
    attention += ", gated" if c.attn_output_gate else ""
    # the experts (k of n) and the soft-caps, "—" where the family has none
    experts = "—" if c.mlp != "moe" else f"{c.top_k} of {c.num_experts}"
    caps = [f"{w} {v:g}" for w, v in (("logits", c.final_logit_softcap),
                                      ("scores", c.attn_logit_softcap)) if v is not None]
    return {"norm": norm, "MLP": mlp, "positions": positions, "attention": attention,
            "window pattern": _pattern(c.layer_types, c.sliding_window),
            "experts": experts, "sinks": "yes" if c.attn_sinks else "—",
            "soft-cap": ", ".join(caps) or "—"}


def family_row(kind: str) -> dict:
    """{column: text} for one family; a family minitx does not load yet gets ``status``
    (why) in place of the switches."""
    name, _ = _representative(kind)
    row = {"family": kind, "model": name}
    if kind not in decoders.FAMILIES:
        return dict(row, status="not yet loadable (no row in the family table)")
    try:
        c = family_config(kind)
    except validate.OptionError as exc:     # the loader's reason, its first clause
        reason = str(exc).split(": ", 1)[-1].removeprefix(f"{kind}: ")
        return dict(row, status=f"not yet loadable: {reason.split(', ')[0].split('; ')[0]}")
    return dict(row, **_cells(c))


def family_table(kinds=TODAY) -> list:
    """The comparison table as aligned text lines, one row per family (``family_row``)."""
    rows = [family_row(k) for k in kinds]
    # each column as wide as its widest cell; a status line runs across the switches
    widths = {col: max(len(col), *(len(r.get(col, "")) for r in rows if "status" not in r))
              for col in COLUMNS}
    head = "  ".join(f"{col:<{widths[col]}}" for col in COLUMNS).rstrip()
    lines = [head, "  ".join("-" * widths[col] for col in COLUMNS)]
    for r in rows:                           # a family not loadable: its status, then why
        if "status" in r:
            lines.append(f"{r['family']:<{widths['family']}}  {r['model']:<{widths['model']}}  "
                         f"{r['status']}")
        else:
            lines.append("  ".join(f"{r[col]:<{widths[col]}}" for col in COLUMNS).rstrip())
    return lines
