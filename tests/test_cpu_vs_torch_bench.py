"""``benchmarks/cpu_vs_torch.py --quick`` runs and prints every row of issue 20's table (a smoke
test that keeps the script from rotting; its timings are never asserted). Run in a fresh
interpreter on the NumPy backend: the script tunes the process's allocator and threads."""
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_vs_torch.py"
ROWS = ("engine chain", "SDPA forward + backward", "flash_attention", "MultiheadAttention",
        "TransformerEncoderLayer", "memory, forward + backward", "flash ", "local ", "linear ",
        "performer ", "load average")


def run_script(*code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env["PYTHONPATH"] = str(SCRIPT.parents[1])
    done = subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(SCRIPT.parents[1]))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quick_run_prints_every_row():
    out = run_script(str(SCRIPT), "--quick", "--memory")
    for row in ROWS:
        assert row in out, f"no {row!r} row in:\n{out}"
    if "PyTorch is not installed" not in out:
        assert out.count("minitx/torch") >= 4, out      # the ratios are there, not dashes


def test_without_torch_it_says_so_and_still_measures_minitx():
    pytest.importorskip("torch")        # (without torch the test above already covers this)
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['x', '--quick']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    out = run_script("-c", code)
    assert "PyTorch is not installed" in out, out
    assert "minitx/torch —" in out and "SDPA forward + backward" in out, out
