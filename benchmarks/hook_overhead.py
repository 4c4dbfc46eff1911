"""What idle hook points cost: a causal MultiheadAttention and a GPT block, forward + backward,
timed with this checkout's minitx and with another checkout's (``--old PATH``, a directory
holding a ``minitx/`` package from before the hook points), alternating in one run so both see
the same machine load.

    python benchmarks/hook_overhead.py --old /tmp/hooks_old [--repeats 15]

Each repeat runs one subprocess per side (old, new) that times ``--iters`` steps after a warm-up
and prints the median step time; the script prints the median over repeats, the new/old ratio,
and the spread of the ratios (a shared machine is noisy: read the ratio with its spread).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, statistics, sys, time
import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np
from minitx.models import GPTBlock, GPTConfig, MultiheadAttention
what, iters = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
B, N, E, H = 8, 64, 128, 4
x = minitx.tensor(rng.standard_normal((B, N, E)).astype("float32"), requires_grad=True)
if what == "mha":
    m = MultiheadAttention(E, H, batch_first=True)
    step = lambda: m(x, x, x, need_weights=False, is_causal=True)[0].sum().backward()
else:
    m = GPTBlock(GPTConfig(n_embd=E, n_head=H, block_size=N), "mha")
    step = lambda: m(x).sum().backward()
for _ in range(3):
    step()
times = []
for _ in range(iters):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


def run(path: str, what: str, iters: int) -> float:
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(iters)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="directory holding the old minitx/ package")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    result = {}
    for what in ("mha", "block"):
        old, new = [], []
        for _ in range(args.repeats):
            old.append(run(args.old, what, args.iters))
            new.append(run(HERE, what, args.iters))
        ratios = sorted(n / o for n, o in zip(new, old))
        result[what] = {"old_ms": 1e3 * statistics.median(old),
                        "new_ms": 1e3 * statistics.median(new),
                        "ratio_median": statistics.median(ratios),
                        "ratio_min": ratios[0], "ratio_max": ratios[-1]}
        print(what, json.dumps({k: round(v, 4) for k, v in result[what].items()}))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
