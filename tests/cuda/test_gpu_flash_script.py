"""benchmarks/gpu_flash.py (build + check + benchmark on a GPU) works where there is no GPU:
``--help`` needs neither CuPy nor a GPU, and a run without a usable GPU exits with status 2 and
says why (the launcher's ``unavailable_reason``)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_flash.py")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MINITX_BACKEND", None)           # the script runs in a plain interpreter
    env.pop("MINITX_TEST_BACKEND", None)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_help_without_cupy():
    p = _run("--help")
    assert p.returncode == 0, p.stderr
    for flag in ("--check", "--check-only", "--quick", "--dtype"):
        assert flag in p.stdout


def _reason_in_a_plain_interpreter():
    """What the script's own interpreter (no stand-in, NumPy backend) will say."""
    code = "from minitx.backend import flash_cuda; print(flash_cuda.unavailable_reason())"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, check=True).stdout.strip()
    return None if out == "None" else out


def test_without_a_gpu_exits_2_with_the_reason():
    why = _reason_in_a_plain_interpreter()
    if why is None:
        pytest.skip("a GPU is usable here: the script would build, check and benchmark")
    p = _run("--check", "--quick")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert why in p.stderr and "no usable GPU" in p.stderr
