"""``python -m minitx``: the tour's worked example (numbers checked by hand), the variant table,
and the subcommands."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

ENV = dict(os.environ, MINITX_NO_TQDM="1", MINITX_BACKEND="numpy")


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "minitx", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def _row_present(out, row):
    """A line holding the numbers of ``row`` in order (4 decimals)."""
    pattern = r"\s+".join(re.escape(f"{v:.4f}") for v in row)
    return re.search(pattern, out) is not None


@pytest.fixture(scope="module")
def tour():
    proc = run(timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_tour_worked_example_numbers(tour):
    # by hand: scores_ij = q_i · k_j / sqrt(2); weights = row softmax; output = weights @ V
    x = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    scores = [[sum(a * b for a, b in zip(qi, kj)) / 2 ** 0.5 for kj in x] for qi in x]
    weights = []
    for row in scores:
        e = [np.exp(s) for s in row]
        weights.append([v / sum(e) for v in e])
    output = [[sum(w * x[j][c] for j, w in enumerate(wrow)) for c in range(2)]
              for wrow in weights]
    assert abs(scores[2][2] - 2 ** 0.5) < 1e-12 and abs(sum(weights[0]) - 1) < 1e-12
    for block in (scores, weights, output):
        for row in block:
            assert _row_present(tour, row), f"row {row} not found in the tour output"


def test_tour_sections(tour):
    assert "softmax Jacobian" in tour and "max |J − autograd|" in tour
    m = re.search(r"max \|J − autograd\| = ([0-9.e+-]+)", tour)
    assert float(m.group(1)) < 1e-12
    # the variant table: every registered variant has a row with its kind
    from minitx.attention import REGISTRY
    for name, cls in REGISTRY.items():
        assert re.search(rf"^\s+{name}\s+{cls.kind}\s", tour, re.M), name
    # the name column is as wide as the longest registered name (gated_deltanet, 14), so
    # every row's kind starts in the header's "kind" column
    width = max(len(name) for name in REGISTRY)
    assert width >= len("gated_deltanet")
    header = re.search(r"^   variant +kind ", tour, re.M).group(0)
    assert header == f"   {'variant':<{width}} kind "
    for name, cls in REGISTRY.items():
        assert re.search(rf"^   {name:<{width}} {cls.kind} ", tour, re.M), name
    assert "Complexity (" in tour and "gradcheck" in tour
    for name, cls in REGISTRY.items():      # each variant's complexity, under the table
        assert f"   {name:<{width}} {cls.complexity[:30]}" in tour, name
    assert re.search(r"^\s+mha\s+exact\s+pass\s+\S+\s+dense\s", tour, re.M)
    # the 1/sqrt(d_k) section: Var(q·k) ≈ d_k. The tour uses 20000 samples; q·k has kurtosis
    # 3 + 6/d, so the sample variance's relative standard error is √((2 + 6/d)/20000) ≤ 1.3%
    # (d = 4), and printing rounds to ≤ 0.005/d. 0.06 is > 4 standard errors plus rounding,
    # while a missing or doubled 1/√d_k is off by ≥ 50%.
    for d in (4, 16, 64, 256):
        m = re.search(rf"^\s+{d}\s+([0-9.]+)\s+([0-9.]+)", tour, re.M)
        assert m and abs(float(m.group(1)) / d - 1) < 0.06 and abs(float(m.group(2)) - 1) < 0.06
    for name in ("local", "dilated", "longformer", "bigbird", "strided", "fixed"):
        assert re.search(rf"^\s+{name} \(", tour, re.M)
    assert "■" in tour and "·" in tour


def test_the_tour_ends_pointing_at_the_course(tour):
    ending = " ".join(tour.split("Tour done in", 1)[1].split())
    assert "Next: the course" in ending and "python -m minitx site --out site" in ending


def _cache_row(tour, name):
    m = re.search(rf"^\s+{name}\s+([0-9,]+)\s+([0-9,]+)\s+(\d+)", tour, re.M)
    assert m, f"no cache row for {name}"
    return [int(g.replace(",", "")) for g in m.groups()]


def test_tour_counts_what_each_decode_cache_keeps(tour):
    # E = 64, H = 8, D = 8, after 32 and 96 tokens: keys and values are 2·H·D = 128 numbers a
    # token; GQA with 2 key/value heads a quarter of that, MQA an eighth; MLA keeps its latent
    # d_c = 4·D = 32 and its RoPE key d_R = D/2 = 4 (the paper's ratios, its defaults)
    assert _cache_row(tour, "mha") == [32 * 128, 96 * 128, 128]
    assert _cache_row(tour, "gqa") == [32 * 32, 96 * 32, 32]
    assert _cache_row(tour, "mqa") == [32 * 16, 96 * 16, 16]
    assert _cache_row(tour, "mla") == [32 * 36, 96 * 36, 36]
    # sinks: 4 sinks + the last 15 tokens (a window of 16 with the next query) of 128 numbers,
    # whatever the length
    assert _cache_row(tour, "sink")[:2] == [19 * 128, 19 * 128]
    for name in ("retention", "deltanet", "ssd"):        # one H × D × D state
        assert _cache_row(tour, name)[:2] == [8 * 8 * 8, 8 * 8 * 8], name


def test_patterns():
    proc = run("patterns", "--n", "12", "--variants", "local,strided")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("■") > 12 and "strided" in proc.stdout


def test_bench_without_out_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "minitx", "bench", "--variants", "mha",
                           "--min-n", "32", "--max-n", "32"], capture_output=True, text=True,
                          timeout=60, env=ENV, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "N=32" in proc.stdout and "--out DIR" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_bench_small(tmp_path):
    proc = run("bench", "--variants", "mha,local", "--min-n", "64", "--max-n", "128",
               "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "N=64" in proc.stdout and "N=128" in proc.stdout and "error" not in proc.stdout
    assert any(f.startswith("bench_time") for f in os.listdir(tmp_path))


@pytest.mark.parametrize("command", ["patterns", "bench"])
@pytest.mark.parametrize("variants, says", [
    ("nosuch", "no attention variant named 'nosuch'"),
    ("local,perfomer", "did you mean 'performer'"),
    (",", "expected comma-separated registry names"),
])
def test_an_unknown_variant_stops_the_command_naming_it(command, variants, says, tmp_path):
    proc = run(command, "--variants", variants, "--out", str(tmp_path)) if command == "bench" \
        else run(command, "--variants", variants)
    assert proc.returncode == 2, proc.stdout
    assert "argument --variants" in proc.stderr and says in proc.stderr
    assert "■" not in proc.stdout and "N=" not in proc.stdout      # nothing ran


def test_cupy_backend_message():
    from minitx.backend import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present")
    proc = run("--backend", "cupy", "patterns")
    assert proc.returncode == 2
    assert "cupy" in proc.stderr.lower() and "error" in proc.stderr.lower()


def test_tour_fits_in_100_columns(tour):
    widest = max(tour.splitlines(), key=len)
    assert len(widest) <= 100, (len(widest), widest)


def test_tour_says_what_each_error_compares(tour):
    """Every row names its reference, and the legend under the table explains each one — in
    particular that Reformer's and Routing's ~1 is against an attention they do not estimate."""
    refs = {m.group(1): m.group(2) for m in re.finditer(
        r"^   (\w+)\s+(?:exact|masked|score|approximate)\s+pass\s+\S+\s+(dense∘pattern|dense|"
        r"formula|full)\b", tour, re.M)}
    from minitx.attention import REGISTRY
    assert set(refs) == set(REGISTRY), set(REGISTRY) ^ set(refs)
    assert refs["reformer"] == refs["routing"] == refs["performer"] == "full"
    legend = tour[tour.index("rel. error = "):tour.index("Complexity (")]
    for ref in ("dense ", "dense∘pattern", "formula", "full "):
        assert f"     {ref}" in legend, ref
    assert "Reformer" in legend and "Routing" in legend and "different" in legend


def test_tour_function_survives_a_broken_variant():
    from minitx.attention import REGISTRY
    from minitx.tour import variant_table

    class Broken(REGISTRY["mha"]):
        def attend(self, q, k, v):
            raise RuntimeError("boom")

    REGISTRY["zz_broken"] = Broken
    try:
        lines = variant_table(names=["mha", "zz_broken"], n=64)
    finally:
        del REGISTRY["zz_broken"]
    text = "\n".join(lines)
    assert "zz_broken" in text and "error: RuntimeError: boom" in text


def test_time_call_leaves_out_the_cold_call_and_reports_the_best_loop():
    from minitx.tour import time_call
    calls = []

    def cold_then_fast():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)              # a first call's caches and allocation
    assert time_call(cold_then_fast, repeat=3, loop_seconds=0.001) < 0.05
    assert len(calls) >= 1 + 3           # the warm-up call, then the timed loops


def test_the_tour_and_bench_time_with_the_same_function(monkeypatch):
    import minitx.tour as tour_mod
    from minitx.cli import bench_rows
    monkeypatch.setattr(tour_mod, "time_call", lambda call, **kw: (call(), 0.125)[1])
    assert bench_rows(["mha"], [16])[0]["time_s"] == 0.125
    assert tour_mod.variant_rows(["mha"], n=16)[0]["time_s"] == 0.125


@pytest.mark.parametrize("command, options", [("bench", ("--min-n", "--max-n", "--embed",
                                                        "--heads")),
                                               ("patterns", ("--n",)), ("tour", ("--n",))])
def test_every_size_option_says_what_it_sets(command, options):
    from minitx.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]
    for action in parser._actions:
        if set(action.option_strings) & set(options):
            assert action.help and "(default" in action.help, action.dest
