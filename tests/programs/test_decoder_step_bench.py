"""``benchmarks/decoder_step.py --quick`` runs and prints both models' rows (a smoke test that
keeps the script from rotting; its timings are never asserted). The script itself checks that
minitx's first loss equals transformers' (the same weights through ``interop.to_torch``)."""
import os
import re
import subprocess
import sys

from support import REPO

SCRIPT = REPO / "benchmarks" / "decoder_step.py"


def test_quick_run_prints_both_models():
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env["PYTHONPATH"] = str(SCRIPT.parents[1])
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, env=env, timeout=600, cwd=str(SCRIPT.parents[1]))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for row in ("llama (E=256, 2 layers)", "mixtral-style MoE (8 experts, top 2)"):
        line = next((ln for ln in out.splitlines() if ln.startswith(row)), None)
        assert line is not None, out
        if "minitx only" not in out:                   # the ratio is there, not a dash
            assert re.search(r"\d+\.\d\d×", line), line
    if "minitx only" not in out:                       # the last line: the MoE's ratios
        assert re.fullmatch(r"mixture of experts, minitx / torch: \d+\.\d\d× \(medians\), "
                            r"\d+\.\d\d× \(paired\), \d+\.\d\d× \(minima\)",
                            out.strip().splitlines()[-1]), out
