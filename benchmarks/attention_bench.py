"""Time and peak memory of every attention variant as the sequence grows (CPU, NumPy).

For each registered variant and N = 128, 256, ..., --max-n: one head, D = 64, batch 1,
float32, ``layer.attend(q, k, v)`` forward + backward (``--forward-only`` for forward).
Reports the best-of-r wall time, the peak memory traced by ``tracemalloc`` (NumPy reports
its allocations to it) in a separate run, and the growth exponent: the slope of log time
vs log N fitted over the largest measured Ns (≈ 1 for linear-time variants, ≈ 2 for dense).

"dense" is the textbook reference softmax(q kᵀ/√D) v built from minitx ops (the N × N
scores live in memory). Each variant is built afresh per N (variants with a ``max_len`` get
max_len = N, so e.g. AFT-full's (max_len × max_len) bias stays N × N). A variant is skipped at the next N when its predicted memory (the
last peak extrapolated with its own growth) exceeds --mem-cap-mb, or its predicted time
exceeds --time-cap; skips are printed, never silent.

    python benchmarks/attention_bench.py --quick
    python benchmarks/attention_bench.py --max-n 4096 --png attention_bench.png
    python benchmarks/attention_bench.py --flash-memory      # the N = 16,384 measurement
"""
from __future__ import annotations

import argparse
import math
import time
import tracemalloc

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

import minitx.functional as F
from minitx.attention import REGISTRY

D = 64

# Options that make a variant run at long N (the constructor defaults target short sequences).
def long_options(name, max_n):
    return {
        "linformer": {"max_len": max_n, "proj_dim": 64},
        "synthesizer": {"max_len": max_n},
        "aft": {"max_len": max_n},
        "flash": {"block_q": 256, "block_k": 256},
        "local": {"window": 32, "block_size": 64},
        "dilated": {"window": 16, "dilation": 2, "block_size": 64},
        "longformer": {"window": 32, "block_size": 64, "global_tokens": (0,)},
        "bigbird": {"block": 32, "num_random": 2, "num_global": 1},
        "strided": {"stride": 32},
        "fixed": {"stride": 32},
        "reformer": {"n_buckets": 16, "n_hashes": 2, "chunk_size": 64},
        "routing": {"num_clusters": 8, "window": 64},
        "performer": {"num_features": 64},
        "dsa": {"top_k": 64}, "moba": {"block": 64, "top_k": 2},
        "nsa": {"block": 64, "top_k": 2, "window": 64},
    }.get(name, {})


class Dense:
    """Reference: softmax(q kᵀ/√D) v from minitx ops, the full N × N matrix in memory."""

    def attend(self, q, k, v):
        s = F.matmul(q, F.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        return F.matmul(F.softmax(s, axis=-1), v)


def make(name, max_n):
    if name == "dense":
        return Dense()
    layer = REGISTRY[name](D, 1, **long_options(name, max_n))
    return layer.eval()


def run_once(layer, n, backward):
    rng = np.random.default_rng(n)
    t = [minitx.tensor(rng.standard_normal((1, 1, n, D)).astype(np.float32),
                       requires_grad=backward) for _ in range(3)]
    if backward:
        out = layer.attend(*t)
        out.backward(np.ones(out.shape, dtype=np.float32))
    else:
        with minitx.no_grad():
            layer.attend(*t)


def measure(layer, n, backward, repeats):
    tracemalloc.start()
    start = time.perf_counter()
    run_once(layer, n, backward)            # also the warm-up call (not timed)
    first = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(repeats if first < 5.0 else 1):
        start = time.perf_counter()
        run_once(layer, n, backward)
        times.append(time.perf_counter() - start)
    return min(times), peak


def growth(ns, values, last=4):
    """Slope of log(value) vs log(N) over the last ``last`` points (None if < 2 points).

    Small-N times are dominated by Python overhead, hence the upper points only; on a busy
    machine time exponents are noisy, memory exponents are not.
    """
    pts = [(n, v) for n, v in zip(ns, values) if v is not None][-last:]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def bench(names, ns, backward=True, mem_cap_mb=2048, time_cap=30.0, repeats=2, log=print):
    results = {}
    for name in names:
        times, peaks, notes = [], [], []
        for i, n in enumerate(ns):
            try:        # built per N: variants with a max_len get max_len = N
                layer = make(name, n)
            except Exception as exc:  # noqa: BLE001 - report and go on
                notes.append(f"{name}: cannot construct ({type(exc).__name__}: {exc})")
                times += [None] * (len(ns) - i)
                peaks += [None] * (len(ns) - i)
                break
            done = [(m, t, p) for m, t, p in zip(ns, times, peaks) if t is not None]
            if len(done) >= 2:
                (n0, t0, p0), (n1, t1, p1) = done[-2:]
                scale = math.log(n / n1) / math.log(n1 / n0)
                mem_next = p1 * (p1 / p0) ** scale if p0 > 0 else p1
                time_next = t1 * (t1 / t0) ** scale if t0 > 0 else t1
                if mem_next > mem_cap_mb * 2 ** 20 or time_next > time_cap:
                    reason = (f"predicted {mem_next / 2**20:.0f} MB > cap {mem_cap_mb} MB"
                              if mem_next > mem_cap_mb * 2 ** 20
                              else f"predicted {time_next:.0f} s > cap {time_cap:.0f} s")
                    notes.append(f"{name}: skipped N ≥ {n} ({reason})")
                    times += [None] * (len(ns) - i)
                    peaks += [None] * (len(ns) - i)
                    break
            try:
                t, p = measure(layer, n, backward, repeats)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"{name}: failed at N = {n} ({type(exc).__name__}: {exc})")
                times += [None] * (len(ns) - i)
                peaks += [None] * (len(ns) - i)
                break
            times.append(t)
            peaks.append(p)
        results[name] = (times, peaks, notes)
        for note in notes:
            log("  " + note)
    return results


def print_table(results, ns, log=print):
    head = "| variant     | " + " | ".join(f"N={n:<6}" for n in ns) + " | exp. time | exp. mem |"
    log(head)
    log("|" + "---|" * (len(ns) + 3))
    for name, (times, peaks, _) in results.items():
        cells = []
        for t, p in zip(times, peaks):
            cells.append("skipped " if t is None else f"{t * 1e3:.0f} ms / {p / 2**20:.1f} MB")
        et, em = growth(ns, times), growth(ns, peaks)
        fmt = lambda x: "   –  " if x is None else f"{x:5.2f}"  # noqa: E731
        log(f"| {name:<11} | " + " | ".join(cells) + f" | {fmt(et)} | {fmt(em)} |")


def save_png(results, ns, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG written")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for name, (times, peaks, _) in results.items():
        pts = [(n, t, p) for n, t, p in zip(ns, times, peaks) if t is not None]
        if pts:
            ax1.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            ax2.loglog([p[0] for p in pts], [p[2] / 2**20 for p in pts], marker="o", label=name)
    ax1.set(xlabel="N", ylabel="seconds", title="time (forward + backward)")
    ax2.set(xlabel="N", ylabel="MB", title="peak traced memory")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def flash_memory(n=16384, block=256):
    """Flash forward + backward peak at N = n (one head, D = 64, float32) vs dense's need."""
    rng = np.random.default_rng(0)
    t = [minitx.tensor(rng.standard_normal((1, 1, n, D)).astype(np.float32), requires_grad=True)
         for _ in range(3)]
    tracemalloc.start()
    start = time.perf_counter()
    out = F.flash_attention(*t, block_q=block, block_k=block)
    out.backward(np.ones(out.shape, dtype=np.float32))
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    scores = n * n * 4
    print(f"flash, N = {n}, one head, D = {D}, float32, blocks {block}×{block}: forward + "
          f"backward {elapsed:.1f} s, peak traced memory {peak / 2**20:.1f} MB")
    print(f"dense at the same size needs the N × N scores ({scores / 2**30:.2f} GiB) plus the "
          f"probabilities and their gradient (≥ {3 * scores / 2**30:.2f} GiB)")
    return peak


def main(argv=None):
    minitx.fast.host.tune_host_allocator()     # measured with the caching host allocator on
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-n", type=int, default=16384)
    parser.add_argument("--quick", action="store_true", help="N ≤ 1024, one repeat")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--variants", default="", help="comma-separated names (default: all)")
    parser.add_argument("--mem-cap-mb", type=float, default=2048)
    parser.add_argument("--time-cap", type=float, default=30.0, help="seconds per call")
    parser.add_argument("--png", default=None, help="write a log-log plot here")
    parser.add_argument("--flash-memory", action="store_true",
                        help="only the N = 16,384 flash memory measurement")
    args = parser.parse_args(argv)
    if args.flash_memory:
        flash_memory()
        return
    max_n = min(args.max_n, 1024) if args.quick else args.max_n
    ns = [n for n in (2 ** p for p in range(7, 15)) if n <= max_n]
    names = ["dense"] + sorted(REGISTRY)
    if args.variants:
        names = [v.strip() for v in args.variants.split(",") if v.strip()]
    mode = "forward" if args.forward_only else "forward + backward"
    print(f"{mode}, one head, D = {D}, batch 1, float32; time = best of "
          f"{1 if args.quick else 2} after a warm-up (1 when a call takes > 5 s); memory = "
          f"tracemalloc peak; exponents fitted over the largest 4 measured N\n")
    results = bench(names, ns, not args.forward_only, args.mem_cap_mb, args.time_cap,
                    1 if args.quick else 2)
    print()
    print_table(results, ns)
    if args.png:
        save_png(results, ns, args.png)


if __name__ == "__main__":
    main()
