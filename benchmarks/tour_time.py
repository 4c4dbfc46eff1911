"""The tour's CPU time, then and now: ``python -m minitx`` at an earlier commit beside today's,
in one run.

```
python benchmarks/tour_time.py [--then c747c7d] [--runs 5]
```

The earlier commit is unpacked with ``git archive`` into a temporary folder (nothing in the
checkout changes), and each tour runs there as ``python -m minitx`` with the working tree's
own interpreter, so both import their own ``minitx``. The two commands alternate, ``--runs``
times each, so that the machine's slow stretches fall on both alike; each figure is the CPU
time of the child process (user + system, ``os.wait4``), which leaves out the time it waited
for a core. Prints min / median / max of each and the ratio now ÷ then of the medians and of
the minima, and the load average it ran under (a noisy run is no evidence).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_seconds(cwd: str) -> float:
    """User + system CPU seconds of one ``python -m minitx`` run in ``cwd``."""
    env = dict(os.environ, MINITX_NO_TQDM="1", PYTHONPATH=cwd)
    proc = subprocess.Popen([sys.executable, "-m", "minitx"], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the tour failed in {cwd}: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def unpack(commit: str, into: str) -> str:
    """The tree of ``commit`` under ``into`` (``git archive``), returned as a path."""
    archive = os.path.join(into, "then.tar")
    with open(archive, "wb") as fh:
        subprocess.run(["git", "archive", commit], cwd=HERE, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(os.path.join(into, "then"), filter="data")
    return os.path.join(into, "then")


def summary(label: str, values) -> str:
    return (f"{label:<22} min {min(values):6.2f} s   median {statistics.median(values):6.2f} s"
            f"   max {max(values):6.2f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--then", default="c747c7d", help="the earlier commit (default c747c7d)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each tour (default 5)")
    args = ap.parse_args(argv)
    print(f"load average at the start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        then_dir = unpack(args.then, tmp)
        then, now = [], []
        for _ in range(args.runs):
            then.append(cpu_seconds(then_dir))
            now.append(cpu_seconds(HERE))
    print(summary(f"tour at {args.then}", then))
    print(summary("tour now", now))
    print(f"now / then: median {statistics.median(now) / statistics.median(then):.2f}x, "
          f"min {min(now) / min(then):.2f}x")
    print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"({time.strftime('%Y-%m-%d %H:%M')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
