r"""Today's decoder families side by side, generated from the family files: each family's
published ``config.json`` (its file's first preset) is read by its file, and the table is
read off the ``DecoderConfig`` it gives; a configuration the translation refuses says so in
its row. Nothing here is written by hand.

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

import inspect
import os

from .. import validate
from ..models.decoder import (DecoderConfig, check_config, count_parameters,
                              kv_cache_bytes_per_token)
from ..models.families import FAMILIES, LINEAGE, parent
from . import decoders

__all__ = ["TODAY", "REPRESENTATIVE", "COLUMNS", "family_config", "family_row",
           "family_table", "kv_cache_bytes_per_token", "expert_counts", "lineage_rows",
           "lineage_table"]

# Today's families, in the lineage's order (HF's model_type names; the hybrids last): every
# family file but GPT-2's, the root they are compared with.
TODAY = tuple(cls.model_type for cls in LINEAGE[1:])

# One published model of each family: the first preset of its family file (the config.json
# keys that change the forward), {model_type: (name, keys)}.
def _first_preset(fam):
    name, (_, cfg) = next(iter(fam.presets.items()))
    return name, cfg


REPRESENTATIVE = {kind: _first_preset(FAMILIES[kind]) for kind in TODAY}

COLUMNS = ("family", "model", "norm", "MLP", "positions", "attention", "window pattern",
           "experts", "sinks", "soft-cap")


def _representative(kind):
    """(name, config.json) of ``kind``'s first preset; ``OptionError`` for an unknown kind."""
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


def expert_counts(kind: str) -> dict:
    """{"total", "active", "lookup", "experts", "top_k", "shared"}: the parameters of
    ``kind``'s representative model and those one token runs through (module docstring),
    counted by ``count_parameters`` from its config alone. A dense family has total =
    active. "lookup" is the embedding table V·E, which a token reads one row of: some model
    cards leave it out of the active count (gpt-oss's 3.6 B), others keep it (Mixtral's
    12.9 B)."""
    c = family_config(kind)
    counts = count_parameters(c)
    o = c.moe_options
    shared = 1 if o.get("shared_intermediate_size") else o.get("n_shared_experts", 0)
    return {"total": counts["total"], "active": counts["active"],
            "lookup": c.vocab_size * c.hidden_size, "experts": c.num_experts or 0,
            "top_k": c.top_k or 0, "shared": shared if c.mlp == "moe" else 0}


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
    mlp = {"gelu": "GELU", "relu2": "ReLU²", "swiglu": "SwiGLU", "geglu": "GeGLU",
           "moe": "MoE"}[c.mlp]
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


# ---- the lineage: each family file as its difference from its parent ----------------------

def _diff(mine: dict, theirs: dict) -> list:
    """The entries ``mine`` sets or changes over ``theirs``, and "−key" for those it drops."""
    out = [f"{k}={v!r}" for k, v in mine.items() if k not in theirs or theirs[k] != v]
    return out + [f"−{k}" for k in theirs if k not in mine]


def lineage_rows() -> list:
    """One dict per family file, in the lineage's order, read off the classes themselves:
    its parent, its file's length, the switches it flips, how many config keys, HF defaults
    and tensor names it adds or changes (and drops), and the methods it overrides."""
    rows = []
    for cls in LINEAGE:
        fam = FAMILIES[cls.model_type]
        up = parent(fam)
        base = type(up) if up is not None else cls.__mro__[1]     # the root's: Family's
        with open(inspect.getsourcefile(cls), encoding="utf-8") as fh:
            lines = len(fh.read().splitlines())
        # the merged tables against the parent's: what this file's own tables did
        tables = {name: _diff(getattr(cls, name), getattr(base, name))
                  for name in ("keys", "defaults", "tensors")}
        methods = sorted(n for n, v in vars(cls).items()          # defined in the file itself
                         if callable(v) and not n.startswith("__"))
        rows.append({"family": cls.model_type, "parent": up.model_type if up else "—",
                     "file": os.path.basename(inspect.getsourcefile(cls)), "lines": lines,
                     "switches": _diff(cls.switches, base.switches), "tables": tables,
                     "methods": methods})
    return rows


def lineage_table() -> list:
    """The lineage as Markdown table lines (docs/decoders.md holds them as generated here)."""
    lines = ["| family | parent | file (lines) | switches it flips | keys / defaults / "
             "tensors it changes | methods it overrides |", "|---|---|---|---|---|---|"]
    for r in lineage_rows():
        counts = " / ".join(str(len(r["tables"][t])) for t in ("keys", "defaults", "tensors"))
        flips = ", ".join(f"`{s}`" for s in r["switches"]) or "—"
        methods = ", ".join(f"`{m}`" for m in r["methods"]) or "—"
        lines.append(f"| `{r['family']}` | {r['parent']} | `{r['file']}` ({r['lines']}) | "
                     f"{flips} | {counts} | {methods} |")
    return lines

