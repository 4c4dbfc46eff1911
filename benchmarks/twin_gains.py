"""What each fast twin buys on its own workload: the twin on and off, in the same run.

    python benchmarks/twin_gains.py [--quick] [--turns 15] [--only NAME ...]

For every twin of ``minitx.configuration.twins()`` this times the workload the site's appendix
uses for it (``minitx/site/fast_twins.py``'s ``WORKLOADS``: one workload through that twin's
dispatch point, float32, forward + backward where there is one), at both of its sizes (the
site's quick one and its full one), twice: with the whole fast layer on, and with that one
twin taken out (``configuration.without_twins``, the other twins staying on). The two run in
alternating turns (on, off, then off, on, …), so that a slow stretch of a shared machine falls
on both; the least time of each is kept (``fast_twins.on_and_off``). ``gain`` = time without
the twin ÷ time with it (above 1: the twin buys time). The load average is printed at the
start and the end; compare gains from quiet runs only. A few minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

from minitx import configuration
from minitx.site.fast_twins import WORKLOADS, on_and_off

BUDGET = 0.1           # seconds of timed calls per variant and turn, at least one call


def calls_for(name, size):
    """How many timed calls make about ``BUDGET`` seconds of the twin's workload."""
    fn = WORKLOADS[name][0](np.random.default_rng(0), size)
    fn()
    t0 = time.perf_counter()
    fn()
    return max(1, min(50, int(BUDGET / max(time.perf_counter() - t0, 1e-9))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke run: the small sizes, three turns, one call")
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these twins only")
    args = parser.parse_args(argv)
    minitx.fast.host.tune_host_allocator()         # the caching allocator the examples use
    names = sorted(configuration.twins())
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"--only: no twin named {', '.join(unknown)} (twins: {', '.join(names)})")
    turns = 3 if args.quick else args.turns
    print(f"fast layer: {len(names)} twins; numpy {np.__version__}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f} (at the start); least of {turns} "
          "alternating turns")
    print(f"  {'twin':16} {'workload':26} {'on ms':>10} {'off ms':>10} {'gain':>7}")
    for name in args.only or names:
        if name not in WORKLOADS:
            print(f"  {name:16} (no workload in minitx/site/fast_twins.py)")
            continue
        make, sizes = WORKLOADS[name]
        for size in sizes[:1] if args.quick else sizes:
            calls = 1 if args.quick else calls_for(name, size)
            on, off = on_and_off(name, size, turns, calls)
            workload = f"{make.__name__.strip('_')} n={size}"
            print(f"  {name:16} {workload:26} {on * 1e3:10.3f} {off * 1e3:10.3f} "
                  f"{off / on:6.2f}×", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
