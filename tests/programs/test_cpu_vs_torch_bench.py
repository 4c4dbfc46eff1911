"""``benchmarks/cpu_vs_torch.py --quick`` runs and prints every row, with the fast layer on and
off, and the table of what each fast twin buys (a smoke test that keeps the script from
rotting; its timings are never asserted). Run in a fresh
interpreter on the NumPy backend: the script tunes the process's allocator and threads."""
import os
import re
import subprocess
import sys

from support import REPO, need

SCRIPT = REPO / "benchmarks" / "cpu_vs_torch.py"
ROWS = ("sgemm 2,048³", "engine chain", "SDPA forward + backward", "matmuls/torch",
        "flash_attention", "MultiheadAttention", "TransformerEncoderLayer",
        "what each fast twin buys", "all (ref)",
        "memory, forward + backward", "flash ", "local ", "linear ", "performer ", "load average")


def run_script(*code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env["PYTHONPATH"] = str(SCRIPT.parents[1])
    done = subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(SCRIPT.parents[1]))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quick_run_prints_every_row():
    out = run_script(str(SCRIPT), "--quick", "--memory", "--tricks")
    for row in ROWS:
        assert row in out, f"no {row!r} row in:\n{out}"
    import minitx
    for twin in minitx.configuration.twins():           # a row for each twin, four ratios
        assert re.search(rf"^  {twin} +(?: +\d+\.\d\d×){{4}}$", out, re.M), (twin, out)
    assert "ref " in out and "ref/torch" in out, out    # the fast layer off, on every table
    if "PyTorch is not installed" not in out:
        assert out.count("fast/torch") >= 4, out        # the ratios are there, not dashes
        assert "NumPy/PyTorch in time —" not in out, out
        # the matmuls-alone ratio on every SDPA row (4 in --quick) and both block rows
        sdpa_rows = re.findall(r"^ +\d+ +(?:True|False) .*×.*\d\.\d\d×$", out, re.M)
        assert len(sdpa_rows) == 4, out                 # N = 64 and 256, full and causal
        assert out.count("matmuls/torch ") == 2 and "matmuls/torch —" not in out, out


def test_without_torch_it_says_so_and_still_measures_minitx():
    need("torch")        # (without torch the test above already covers this)
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['x', '--quick']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    out = run_script("-c", code)
    assert "PyTorch is not installed" in out, out
    assert "fast/torch —" in out and "SDPA forward + backward" in out, out
    assert "PyTorch — GFLOP/s" in out and "matmuls/torch —" in out, out
