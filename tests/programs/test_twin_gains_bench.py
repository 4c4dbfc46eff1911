"""``benchmarks/twin_gains.py --quick`` runs and prints a gain for every fast twin (a smoke test
that keeps the script from rotting; its timings are never asserted), and refuses an unknown
twin naming the known ones. Run in a fresh interpreter on the NumPy backend: the script tunes
the process's allocator."""
import os
import re
import subprocess
import sys

from support import REPO

SCRIPT = REPO / "benchmarks" / "twin_gains.py"


def run_script(*args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND", "MINITX_FAST")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=str(REPO))


def test_quick_run_prints_a_gain_for_every_twin():
    done = run_script("--quick")
    assert done.returncode == 0, done.stderr
    import minitx
    names = sorted(minitx.configuration.twins())
    assert f"fast layer: {len(names)} twins" in done.stdout, done.stdout
    for name in names:
        assert re.search(rf"^  {name} +\w+ n=\d+ +\d+\.\d{{3}} +\d+\.\d{{3}} +\d+\.\d\d×$",
                         done.stdout, re.M), (name, done.stdout)
    assert "load average at the end" in done.stdout


def test_an_unknown_twin_is_refused_naming_the_twins():
    done = run_script("--quick", "--only", "row_max", "no_such_twin")
    assert done.returncode == 2
    assert "no twin named no_such_twin" in done.stderr and "row_max" in done.stderr, done.stderr
