"""``benchmarks/attention_2025.py --quick`` runs and prints its four tables (a smoke test that
keeps the script from rotting; its timings are never asserted). What is deterministic is
checked: every variant has its rows, dense causal attention reads t + 1 keys (total ∝ N²),
the recurrences keep one D × D state (4,096 numbers at D = 64) at every N while the softmax
caches grow like N, and each key chooser's largest count is its budget or below."""
import os
import re
import subprocess
import sys

from support import REPO

SCRIPT = REPO / "benchmarks" / "attention_2025.py"
NAMES = ("mha", "gated", "fox", "lightning", "gated_deltanet", "kda", "dsa", "moba", "nsa")


def _rows(text, title):
    """{variant: [cells]} of the markdown table that follows the line starting with title."""
    block = text.split(title, 1)[1].split("\n\n", 1)[0]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
             if line.startswith("| ") and not line.startswith("| variant"))}


def test_quick_run_prints_every_table():
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env["PYTHONPATH"] = str(SCRIPT.parents[1])
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                          text=True, env=env, timeout=900, cwd=str(SCRIPT.parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    timing = _rows(out, "Time and peak memory")
    floors = _rows(out, "Memory floor")
    keys = _rows(out, "Keys read per query")
    state = _rows(out, "State kept")
    assert set(timing) == set(floors) == set(state) == set(NAMES), out
    for name in NAMES:
        assert all(re.fullmatch(r"[\d,]+ ms / [\d,.]+ MB", c) for c in timing[name][:3])
    assert keys["mha"][-1] == "2.00"                              # Σ (t + 1) ∝ N²
    for name in ("lightning", "gated_deltanet", "kda"):
        assert state[name][:3] == ["4,096"] * 3 and state[name][3] == "0.00", state[name]
    for name in ("mha", "gated", "dsa", "moba", "nsa"):
        assert state[name][:3] == ["16,384", "32,768", "65,536"], state[name]   # 2·N·D
    budget = {"dsa": 64, "moba": 3 * 64, "nsa": 2 * 64 + 64 + 512 // 64}       # at N = 512
    for name, most in budget.items():
        largest = int(keys[name][2].split("/")[1].replace(",", ""))
        assert largest <= most, (name, keys[name])
