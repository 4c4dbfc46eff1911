"""The family table, the KV-cache bytes and the expert counts of
``minitx.pretrained.families``: the table is generated from the family files (a family
changed, removed or added there changes the table), and the counts match the figures the
model cards publish, to the precision they publish them."""
import os

import pytest

from minitx.pretrained import decoders, families
from support import REPO


def _row(kind):
    return families.family_row(kind)


def test_every_family_has_a_row_and_the_table_one_line_each():
    lines = families.family_table()
    assert len(lines) == 2 + len(families.TODAY)
    for kind, line in zip(families.TODAY, lines[2:]):
        assert line.split()[0] == kind
    assert lines[0].split()[:3] == ["family", "model", "norm"]


def test_rows_read_the_published_configurations():
    # Llama-3.2-1B: 32 query heads share 8 key/value heads, every layer full, llama3 rope
    llama = _row("llama")
    assert (llama["norm"], llama["MLP"], llama["attention"]) == ("RMSNorm, pre", "SwiGLU",
                                                                 "GQA 32/8")
    assert (llama["positions"], llama["window pattern"]) == ("RoPE llama3", "all full")
    # Gemma 3: five local layers to one global, W = 512, one key/value head, (1 + w) norms
    gemma = _row("gemma3_text")
    assert gemma["window pattern"] == "15 sliding, 3 full (W 512)"
    assert gemma["attention"] == "MQA, QK-norm" and gemma["MLP"] == "GeGLU"
    assert gemma["norm"] == "RMSNorm, sandwich, (1+w)"
    assert _row("mistral")["window pattern"] == "all sliding (W 4096)"
    assert _row("qwen2")["attention"] == "GQA 14/2, qkv bias"
    assert _row("olmo2")["norm"] == "RMSNorm, post"


def test_a_family_the_loader_lacks_says_so(monkeypatch):
    monkeypatch.delitem(decoders.FAMILIES, "qwen2")
    row = _row("qwen2")
    assert row["status"].startswith("not yet loadable") and "norm" not in row
    line = next(x for x in families.family_table() if x.startswith("qwen2 "))
    assert "not yet loadable" in line


def test_changing_a_family_file_changes_the_table(monkeypatch):
    before = families.family_table()
    qwen3 = decoders.FAMILIES["qwen3"]
    monkeypatch.setattr(qwen3, "switches", {k: v for k, v in qwen3.switches.items()
                                            if k != "qk_norm"})                # no QK-norm
    after = families.family_table()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("qwen3 ")
    assert "GQA 16/8, QK-norm" in changed[0][0] and "QK-norm" not in changed[0][1]


def test_a_family_added_as_one_file_gets_its_row(monkeypatch):
    """A new family is one class: its parent, what it changes, a preset. Registered, it is
    read, written back and tabled with no other change (the promise of models/families/)."""
    from minitx.models.families import FAMILIES, Mistral
    from minitx.pretrained.decoders import decoder_config, hf_config_dict

    class Windowless(Mistral):                       # Mistral with its window switched off
        model_type = "windowless"
        presets = {"Windowless-7B": ("a test", dict(
            families.REPRESENTATIVE["mistral"][1], sliding_window=None))}

        def read_layers(self, cfg, n, source):
            return None, None

    monkeypatch.setitem(FAMILIES, "windowless", Windowless())
    c = decoder_config(dict(Windowless.presets["Windowless-7B"][1], model_type="windowless"))
    assert c.sliding_window is None and c.mlp == "swiglu" and c.num_kv_heads == 8
    assert hf_config_dict(c)["model_type"] == "llama"      # the first family that runs it
    monkeypatch.setitem(families.REPRESENTATIVE, "windowless",
                        next((n, cfg) for n, (_, cfg) in Windowless.presets.items()))
    row = _row("windowless")
    assert (row["attention"], row["MLP"], row["window pattern"]) == ("GQA 32/8", "SwiGLU",
                                                                     "all full")


def test_kv_cache_bytes_per_token_at_real_sizes():
    # Llama-3.2-1B: 16 layers · 2 (k, v) · 8 heads · 64 dims · 2 bytes
    assert families.kv_cache_bytes_per_token(families.family_config("llama")) == 32768
    # DeepSeek-V3: 61 layers · (512 latent + 64 rotary) · 2 bytes
    assert families.kv_cache_bytes_per_token(families.family_config("deepseek_v3")) == \
        61 * 576 * 2
    # Gemma-3-270M: only its 3 global layers grow (1 key/value head of 256 dims)
    assert families.kv_cache_bytes_per_token(families.family_config("gemma3_text")) == \
        3 * 2 * 256 * 2
    assert families.kv_cache_bytes_per_token(families.family_config("mistral")) == 0
    # gpt-oss-20b: 12 full layers of 24, 8 key/value heads of 64 dims; its sinks are on
    c = families.family_config("gpt_oss")
    assert c.attn_sinks and families.kv_cache_bytes_per_token(c) == 12 * 2 * 8 * 64 * 2
    # Qwen3-Next-80B: only its 12 gated attention layers of 48 grow (2 heads of 256 dims);
    # the 36 gated DeltaNet layers keep a state of constant size
    c = families.family_config("qwen3_next")
    assert families._pattern(c.layer_types, None) == "36 gated_deltanet, 12 full"
    assert families.kv_cache_bytes_per_token(c) == 12 * 2 * 2 * 256 * 2


@pytest.mark.parametrize("kind, total, active, digits", [
    ("mixtral", 46.7e9, 12.9e9, 1),            # Mixtral-8x7B: 46.7 B, 12.9 B active
    ("deepseek_v3", 671e9, 37e9, 0),           # DeepSeek-V3: 671 B, 37 B activated
    ("qwen3_moe", 30.5e9, 3.3e9, 1),           # Qwen3-30B-A3B: 30.5 B, 3.3 B activated
    ("llama", 1.24e9, 1.24e9, 2),              # Llama-3.2-1B: 1.24 B
    ("qwen3_next", 80e9, 3e9, 0),              # Qwen3-Next-80B-A3B: 80 B, 3 B activated
])
def test_parameter_counts_match_the_model_cards(kind, total, active, digits):
    """Within one unit of the card's last digit: cards round (Mixtral's 12.88 → 12.9) or
    truncate (Qwen's 3.35 → 3.3), and some leave the embedding table out of "active"
    (DeepSeek's 37.6 with it, 36.6 without)."""
    r = families.expert_counts(kind)
    unit = 10.0 ** -digits
    assert abs(r["total"] / 1e9 - total / 1e9) < unit, r["total"]
    assert abs(r["active"] / 1e9 - active / 1e9) < unit, r["active"]


@pytest.mark.parametrize("kind, total, active, rounding", [
    ("minimax_m2", 230, 10, "rounded"),        # MiniMax-M2: 230 B total, 10 B active
    ("glm4_moe", 106, 12, "truncated"),        # GLM-4.5-Air: 106 B total, 12 B active
])
def test_the_2025_cards_count_active_without_the_embedding_table_and_head(kind, total,
                                                                          active, rounding):
    """MiniMax-M2's card rounds its 228.7 B to two figures; GLM-4.5-Air's truncates its
    106.9 B, as Qwen's does. Both leave the token table and the untied head out of "active"
    (a lookup each, and a product only at the last position)."""
    r = families.expert_counts(kind)
    assert not families.family_config(kind).tie_embeddings
    billions = r["total"] / 1e9
    assert (round(billions, -1) if rounding == "rounded" else int(billions)) == total
    assert round((r["active"] - 2 * r["lookup"]) / 1e9) == active


def test_llama4_scout_counts_by_hand_and_against_its_card():
    """Llama 4 Scout's text model counted by hand from its config (V 202048, E 5120, 48
    layers of 40 query and 8 KV heads of 128, 16 experts of 8192 beside a shared one, no
    norm gains on q and k): 107.8 B in all, 17.2 B through which a token runs. The card says
    17 B active, as here, and 109 B total, which counts the vision tower too (the text model
    alone is 107.8 B); its KV cache grows 48 KiB a token in bfloat16 once the 36 chunked
    layers hold their 8191, only the 12 NoPE layers growing."""
    v, e, layers, h, hkv, d, n, i = 202048, 5120, 48, 40, 8, 128, 16, 8192
    attention = 2 * e * h * d + 2 * e * hkv * d
    moe = n * e + n * 3 * e * i + 3 * e * i                # router, experts, shared expert
    total = 2 * v * e + layers * (attention + moe + 2 * e) + e
    r = families.expert_counts("llama4_text")
    assert r["total"] == total and round(total / 1e9, 1) == 107.8
    assert r["active"] == total - layers * (n - 1) * 3 * e * i
    assert round(r["active"] / 1e9) == 17
    c = families.family_config("llama4_text")
    assert c.layer_types.count("chunked") == 36 and len(c.nope_layers) == 12
    assert families.kv_cache_bytes_per_token(c) == 12 * 2 * hkv * d * 2 == 48 * 1024


def test_gpt_oss_counts_its_active_parameters_without_the_embedding_table():
    r = families.expert_counts("gpt_oss")           # the model card: 21 B, 3.6 B active
    assert round(r["total"] / 1e9) == 21
    assert round((r["active"] - r["lookup"]) / 1e9, 1) == 3.6
    assert (r["experts"], r["top_k"]) == (32, 4)


def test_unknown_family_is_refused_by_name():
    with pytest.raises(Exception, match="no_such_family"):
        families.family_row("no_such_family")


def test_the_tour_lists_every_family_within_its_width(monkeypatch):
    from minitx import tour
    lines = tour.decoder_section()
    assert all(len(line) <= tour.WIDTH for line in lines)
    for kind in families.TODAY:
        assert sum(line.split()[:1] == [kind] for line in lines) == 1, kind
    llama = next(line for line in lines if line.split()[:1] == ["llama"])
    assert llama.split()[-1] == "32.0"                 # KiB per token, Llama-3.2-1B
    monkeypatch.delitem(decoders.FAMILIES, "llama")
    assert "not yet loadable" in next(line for line in tour.decoder_section()
                                      if line.split()[:1] == ["llama"])


def test_the_lineage_in_the_docs_is_the_one_generated_from_the_files():
    """docs/decoders.md holds ``lineage_table()``'s lines as they are generated; the table
    itself is read off the family classes (a family that flips a switch shows it)."""
    with open(os.path.join(REPO, "docs", "decoders.md"), encoding="utf-8") as fh:
        doc = fh.read()
    table = families.lineage_table()
    assert "\n".join(table) in doc
    rows = {r["family"]: r for r in families.lineage_rows()}
    assert rows["qwen3"]["parent"] == "qwen2" and "qk_norm='head'" in rows["qwen3"]["switches"]
    assert rows["gpt2"]["parent"] == "—" and len(table) == 2 + len(families.LINEAGE)
