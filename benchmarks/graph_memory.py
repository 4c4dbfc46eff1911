"""Memory a graph holds before and after backward: minitx beside PyTorch, in the same run.

    python benchmarks/graph_memory.py [--nodes 20000] [--size 1000]

The scenario: a chain of ``--nodes`` ops ``y = tanh(y)`` on a float64
vector of ``--size`` elements (8 KB at the default 1,000), then ``y.sum().backward()`` without
``retain_graph``. ``tanh`` saves its output for the backward (d tanh(x)/dx = 1 − tanh(x)²) in
both libraries, so the built graph holds nodes × size × 8 bytes: 160 MB by default. Before the
engine freed what backward no longer needs, minitx still held all of it (161 MB) after
``backward()`` until the output was deleted.

Reported per library, in MB of resident memory (RSS) above what the process used before the
chain: after building it, after ``backward()`` with the output still referenced, and after
deleting the output. For minitx the same three points are also read from ``tracemalloc``
(NumPy reports its array allocations there), which needs no allocator setting.

Each library runs in a fresh interpreter with glibc's mmap threshold fixed at 4 KiB
(``MALLOC_MMAP_THRESHOLD_=4096``): every array then has pages of its own that go back to the OS
when it is freed, so RSS follows the live arrays. (With glibc's defaults, a freed 8 KB block
stays in the heap and RSS cannot tell held memory from freed memory.) Linux only (RSS is read
from ``/proc/self/statm``); elsewhere the script says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MB = 1e6


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(lib: str, nodes: int, size: int, traced: bool) -> dict:
    """Build the chain, backward, delete the output; MB above the start at each point.

    minitx: RSS, or with ``traced`` what ``tracemalloc`` counts (a run of its own: its
    bookkeeping lives in the heap and would blur RSS). torch: RSS, or with ``traced`` the bytes
    of the tensors its graph saved that are still alive (``saved_tensors_hooks`` hand each saved
    tensor over; a weak reference to it dies when the graph lets go of it).
    """
    import contextlib
    import tracemalloc
    import weakref

    import numpy as np
    x0 = np.full(size, 0.5)
    recording = contextlib.nullcontext()
    if lib == "minitx":
        import minitx
        x = minitx.tensor(x0, requires_grad=True)
        if traced:
            tracemalloc.start()
        now = (lambda: tracemalloc.get_traced_memory()[0]) if traced else rss_bytes
    else:
        import torch
        torch.set_num_threads(1)
        x = torch.tensor(x0, requires_grad=True)
        saved = []

        def pack(t):
            t = t.detach()                   # a tensor object of its own: only the graph holds it
            saved.append(weakref.ref(t))
            return t
        if traced:
            recording = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            now = lambda: sum(r().nbytes for r in saved if r() is not None)
        else:
            now = rss_bytes
    base = now()
    y = x
    with recording:
        for _ in range(nodes):
            y = y.tanh()
        y = y.sum()
    points = {"built": now()}
    y.backward()
    points["after backward"] = now()
    grad = x.grad.numpy().copy()
    del y
    points["output deleted"] = now()
    return {"mb": {k: (v - base) / MB for k, v in points.items()}, "grad": grad.tolist()}


def measure(lib: str, nodes: int, size: int, traced: bool = False):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4096", OMP_NUM_THREADS="1",
               MINITX_BACKEND="numpy")                 # host memory is what is measured
    run = subprocess.run([sys.executable, __file__, "--child", lib, "--nodes", str(nodes),
                          "--size", str(size)] + ["--traced"] * traced,
                         env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
    return json.loads(run.stdout.strip().splitlines()[-1]), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--child", choices=["minitx", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.nodes, args.size, args.traced)))
        return 0
    if not os.path.exists("/proc/self/statm"):
        print("graph_memory.py reads resident memory from /proc/self/statm: Linux only.")
        return 2

    import numpy as np
    saved = args.nodes * args.size * 8 / MB
    print(f"chain of {args.nodes} tanh ops on float64 ({args.size},), then sum().backward(); "
          f"the saved outputs total {saved:.1f} MB")
    rows = {}
    for name, lib, traced in (("minitx (RSS)", "minitx", False),
                              ("minitx (tracemalloc)", "minitx", True),
                              ("torch (RSS)", "torch", False),
                              ("torch (saved tensors)", "torch", True)):
        res, err = measure(lib, args.nodes, args.size, traced)
        if res is None:
            print(f"  skipping {name}: {err}")
        else:
            rows[name] = res
    if "minitx (RSS)" not in rows:
        print("minitx itself failed to run")
        return 1
    print(f"\n  {'MB above start':<22} {'built':>9} {'after backward':>15} {'output deleted':>15}")
    for name, res in rows.items():
        p = res["mb"]
        print(f"  {name:<22} {p['built']:9.1f} {p['after backward']:15.1f} {p['output deleted']:15.1f}")
    if "torch (RSS)" in rows:
        diff = np.max(np.abs(np.subtract(rows["minitx (RSS)"]["grad"], rows["torch (RSS)"]["grad"])))
        print(f"\n  max |grad minitx - grad torch| = {diff:.2e}")
        held_m = rows.get("minitx (tracemalloc)", rows["minitx (RSS)"])["mb"]["after backward"]
        held_t = rows.get("torch (saved tensors)", rows["torch (RSS)"])["mb"]["after backward"]
        print(f"  held after backward: minitx {held_m:.1f} MB (tracemalloc), torch {held_t:.1f} MB "
              f"(saved tensors alive), of {saved:.1f} MB saved")
    print("  (torch's RSS stays at its peak even once every saved tensor is gone, so for torch the "
          "saved-tensor row is the one that says what its graph holds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
