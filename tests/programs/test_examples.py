"""Every example with --quick (subprocess, tmp output folder): what it reports, not only that it
exits. Each parses the final ``RESULT {json}`` line."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from support import REPO

ROOT = str(REPO)
ENV = dict(os.environ, MINITX_NO_TQDM="1", MINITX_BACKEND="numpy")


def run_example(name, tmp_path, *extra, env=None, timeout=240):
    out = tmp_path / name
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", f"{name}.py"),
                           "--quick", "--out", str(out), *extra], capture_output=True,
                          text=True, timeout=timeout, env=env or ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"output folder: {out}" in proc.stdout
    # a --quick run says it is a smoke run, and what the full run shows and takes
    assert "quick smoke run" in proc.stdout and "The full run (`python examples/" in \
        " ".join(proc.stdout.split()), proc.stdout[:1500]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):]), proc.stdout, out


def _files_exist(result):
    assert result["pictures"]
    for p in result["pictures"]:
        assert os.path.exists(p) and os.path.getsize(p) > 0, p


def test_sentiment(tmp_path):
    r, out, _ = run_example("sentiment", tmp_path)
    assert r["accuracy"] > 0.6                       # binary, balanced: chance 0.5
    assert len(r["pictures"]) == 3
    _files_exist(r)
    assert "[CLS] attends most to" in out and r["top_words"]


def test_sentiment_imdb_folder_text_fallback(tmp_path):
    root = tmp_path / "imdb"
    pos = ["a great wonderful film", "truly excellent and fun", "great acting , great story"]
    neg = ["an awful boring film", "terrible and dull", "bad acting , weak story"]
    for split in ("train", "test"):
        for sub, texts in (("pos", pos), ("neg", neg)):
            d = root / split / sub
            d.mkdir(parents=True)
            for i, t in enumerate(texts * 4):
                (d / f"{i}_1.txt").write_text(t, encoding="utf-8")
    env = dict(ENV, MINITX_NO_MATPLOTLIB="1")
    r, out, _ = run_example("sentiment", tmp_path, "--data", str(root), env=env)
    assert "IMDB folder" in out and "24 train / 24 test" in out
    assert 0.0 <= r["accuracy"] <= 1.0
    assert all(p.endswith(".txt") for p in r["pictures"])   # no matplotlib → text pictures
    _files_exist(r)


def test_seq2seq(tmp_path):
    r, out, _ = run_example("seq2seq", tmp_path)
    # chance: guessing every symbol (length known) — the quick run must beat it by far
    assert r["exact_match"] > max(20 * r["chance"], 0.05)
    assert r["final_loss"] < 0.7 * r["first_loss"]
    assert "greedy, KV cache" in out
    _files_exist(r)


def test_char_gpt(tmp_path):
    r, out, _ = run_example("char_gpt", tmp_path)
    assert r["final_loss"] < r["first_loss"] - 0.3
    assert r["first_loss"] < r["uniform_loss"] + 0.5
    assert len(r["prev_token_scores"]) == 2 * 4          # layers × heads
    assert all(0.0 <= v <= 1.0 for v in r["prev_token_scores"].values())
    assert r["sample"].startswith("def ")
    _files_exist(r)


def test_char_gpt_on_a_users_text_says_so_and_quotes_no_stdlib_figure(tmp_path):
    text = tmp_path / "poem.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    r, out, _ = run_example("char_gpt", tmp_path, "--text", str(text))
    banner = " ".join(out.split("corpus:", 1)[0].split())
    assert "a character-level GPT on poem.txt" in banner
    assert "standard library" not in banner and "stdlib" not in banner
    for stdlib_figure in ("4.30", "1.94", "2.00", "4.56", "L0H3"):
        assert stdlib_figure not in banner, stdlib_figure
    assert f"characters of {text}" in out
    assert r["sample"].startswith("the ")                 # the prompt: the text's first chars


def test_lra_listops(tmp_path):
    r, out, _ = run_example("lra_listops", tmp_path)
    wanted = {"mha", "local", "linear", "performer", "linformer", "bigbird", "reformer", "nystrom",
              "mla", "diff", "sigmoid"}
    assert wanted <= set(r["variants"])
    for name in wanted:
        v = r["variants"][name]
        assert "error" not in v, (name, v)
        assert 0.0 <= v["accuracy"] <= 1.0 and v["step_ms"] > 0
        assert math.isfinite(v["first_loss"]) and math.isfinite(v["final_loss"]), (name, v)
        # 80 seeded steps: every variant's training loss falls (first 5 vs last 10 steps)
        assert v["final_loss"] < v["first_loss"], (name, v)
        # the report rounds accuracy and vs_majority to 4 decimals (majority is unrounded):
        # two roundings of ≤ 0.5e-4 each
        assert v["vs_majority"] == pytest.approx(v["accuracy"] - r["majority"], abs=1e-4 + 1e-12)
    assert 0.0 < r["majority"] < 1.0
    assert "ms/step" in out and "vs major." in out
    _files_exist(r)


def test_lra_listops_quick_keeps_a_step_count_given_with_it():
    """--quick shortens what the user left at its default, not what they chose (the GPU run
    passes --quick --steps 30)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "lra_listops_args", os.path.join(REPO, "examples", "lra_listops.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parse_args([]).steps == 600
    assert mod.parse_args(["--quick"]).steps == 80
    assert mod.parse_args(["--quick", "--steps", "30"]).steps == 30
    assert mod.parse_args(["--steps", "7"]).steps == 7


def test_efficient_report(tmp_path):
    r, out, _ = run_example("efficient_report", tmp_path)
    dec = {d["variant"]: d for d in r["decoding"]}
    assert dec["mqa"]["cache_bytes"] * dec["mha"]["kv_heads"] == dec["mha"]["cache_bytes"]
    assert dec["gqa"]["cache_bytes"] < dec["mha"]["cache_bytes"]
    # the quick run: E = 256, H = 8 (D = 32), a 128-token prompt, float32, read off each cache:
    # MLA keeps d_c + d_R = 4·D + D/2 = 144 numbers a token; sinks 4 + 15 entries of K and V
    # (the window of 16 less the next query);
    # a recurrent form one H × D × D state
    assert dec["mha"]["cache_bytes"] == 2 * 8 * 32 * 128 * 4
    assert dec["mla"]["cache_bytes"] == 144 * 128 * 4
    assert dec["sink"]["cache_bytes"] == 2 * 8 * 32 * 19 * 4
    for name in ("retention", "deltanet", "ssd"):
        assert dec[name]["cache_bytes"] == 8 * 32 * 32 * 4, name
    errs = {(a["variant"], a["option"]): a["error"] for a in r["approximation"]}
    # only approximate variants are tabulated; more random features help Performer, a
    # full-rank pooling Linformer and one-cluster Routing (window ≥ N) are exact
    assert {a["variant"] for a in r["approximation"]} == {"performer", "linformer", "reformer",
                                                           "routing", "nystrom"}
    assert errs[("nystrom", "num_landmarks=64")] < errs[("nystrom", "num_landmarks=4")]
    assert errs[("performer", "num_features=512")] < errs[("performer", "num_features=8")]
    assert errs[("linformer", "proj_dim=64")] < 1e-10
    assert errs[("routing", "num_clusters=1")] < 1e-10
    # masked variants (reported separately) are exact under their own pattern
    assert all(m["own_pattern_error"] < 1e-10 for m in r["masked"])
    assert {c["variant"] for c in r["cost"]} >= {"mha", "flash", "local"}
    _files_exist(r)


def test_look_inside(tmp_path):
    r, out, _ = run_example("look_inside", tmp_path)
    layers, heads = 2, 4
    for key in ("prev_token", "induction", "patching", "attribution"):
        assert np.array(r[key]).shape == (layers, heads), key
    # scores are mean attention weights: in [0, 1]
    assert 0 <= np.min(r["prev_token"]) and np.max(r["prev_token"]) <= 1
    # attribution is a first-order estimate of patching: the tables agree in direction
    assert r["patching_attribution_corr"] > 0.5
    assert 0 <= r["performer_l1"] < 2
    assert "activation patching" in out and "attribution patching" in out
    assert len(r["pictures"]) == 2
    _files_exist(r)


def test_cupy_backend_missing_exits_2(tmp_path):
    from minitx.backend import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "seq2seq.py"),
                           "--quick", "--backend", "cupy", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 2 and "cupy" in proc.stderr.lower()


def test_train_subcommand_runs_an_example(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "minitx", "train", "efficient_report",
                           "--quick", "--out", str(tmp_path / "e")], capture_output=True,
                          text=True, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT " in proc.stdout
