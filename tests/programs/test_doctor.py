"""``python -m minitx doctor``: the learner's report by default (no compiling, seconds), the CUDA
kernels' report behind ``--kernels``."""
import os
import subprocess
import sys
import time

import minitx
from minitx import doctor

ENV = dict(os.environ, MINITX_NO_TQDM="1", MINITX_BACKEND="numpy")


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "minitx", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def test_the_default_report_is_short_fast_and_compiles_nothing():
    t0 = time.perf_counter()
    proc = run("doctor")
    took = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    # what a CPU learner needs, and nothing from nvcc: no compile step, no ptxas table
    assert len(lines) <= 15, out
    assert took < 10, f"doctor took {took:.1f} s"
    assert "compiling" not in out and "ptxas (" not in out and "registers" not in out
    assert lines[0].startswith(f"minitx {minitx.__version__}") and "NumPy" in lines[0]
    assert any(line.startswith("backend: numpy") for line in lines), out
    assert any(line.startswith("fast layer: on") and "thread" in line for line in lines), out
    assert any(line.startswith("GPU: ") for line in lines), out
    # every extra of setup.cfg has a line, installed or missing with its install command
    for extra in doctor.extras():
        row = next(line for line in lines if line.strip().startswith(f"[{extra}]"))
        assert row.endswith(": installed") or f'python -m pip install ".[{extra}]"' in row, row
    assert "python -m minitx doctor --kernels" in out


def test_a_missing_package_is_named_with_its_install_command(monkeypatch):
    # numpy is the one package every environment that runs this test has installed.
    monkeypatch.setattr(doctor, "extras", lambda: {"viz": ["numpy", "no-such-dist-xyz"]})
    lines = doctor.report_lines()
    row = next(line for line in lines if line.strip().startswith("[viz]"))
    assert "missing no-such-dist-xyz" in row and 'python -m pip install ".[viz]"' in row
    assert "numpy" not in row.split("missing", 1)[1]


def test_the_extras_are_read_from_the_package_metadata():
    table = doctor.extras()
    assert {"viz", "docs", "gpu", "fast", "test"} <= set(table), table
    assert "matplotlib" in table["viz"] and "threadpoolctl" in table["fast"]
    assert set(table) == set(doctor.PURPOSE), "every extra says what it is for"


def test_kernels_report_is_todays_report():
    proc = run("doctor", "--kernels", "--quick")   # the full compile: tests/gpu/cuda
    assert proc.returncode == 0, proc.stderr
    assert "nvcc" in proc.stdout.lower() and "flash instantiations" in proc.stdout
    assert "fast layer: on," in proc.stdout and "sdpa" in proc.stdout
