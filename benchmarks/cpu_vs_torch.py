"""minitx against PyTorch on the CPU, with its fast layer on and off, in one run (float32).

    python benchmarks/cpu_vs_torch.py [--quick] [--memory] [--tricks] [--repeats 5]

Every minitx row is timed twice in the same turns: with the fast layer on (``fast``, the
default: ``minitx/fast/``) and off (``ref``: the reference code alone, as with
``MINITX_FAST=0``), beside PyTorch, so the reader sees what the fast layer buys and what the
reference costs. ``--tricks`` adds a table of what each fast twin buys on its own: each case
timed with every twin on, then with one twin at a time taken out
(``minitx.configuration.without_twins``).

1. **Engine**: a chain of 2,000 ops, ``y = y * 0.999`` then ``y = y + 0.001`` alternately, on
   an 8 × 8 tensor, then ``sum`` and backward: µs per op, forward + backward.
2. **SDPA**: ``F.scaled_dot_product_attention`` forward + backward, B·H = 8 (B = 2, H = 4),
   D = 64, N = 256 / 1,024 / 4,096, full and causal, against
   ``torch.nn.functional.scaled_dot_product_attention``; and the share of NumPy's sgemm
   GFLOP/s (a 2,048³ ``np.matmul``, measured in the same run) that minitx reaches. FLOPs as
   FlashAttention's papers count them: 2 matmuls forward, 5 backward, 2·N²·D each, per head,
   halved for causal. Beside it, **the matmuls alone**: the six matrix products of minitx's
   forward + backward (S = Q Kᵀ, O = P V; dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q) on
   its own blocks and threads, with nothing else — what the op would cost if every
   element-wise pass were free, so ``matmuls/torch`` is the least ratio NumPy's BLAS allows
   this design, and minitx − matmuls is what the softmax, masks and bookkeeping cost. The
   sgemm line also times PyTorch's own 2,048³ matmul (its BLAS, MKL on x86), since the two
   libraries do not multiply matrices equally fast.
3. **Flash**: the tiled ``F.flash_attention`` (linear memory) against the fused op at
   N = 4,096.
4. **Blocks**: ``nn.MultiheadAttention`` (causal, B = 4, T = 256, E = 256, H = 8) and
   ``nn.TransformerEncoderLayer`` (same sizes, feed-forward 1,024, no dropout) forward +
   backward against the same PyTorch modules with the same weights; and, as for SDPA, the
   block's matmuls alone in NumPy (its ``Linear`` layers' and its attention's).
5. ``--memory``: forward + backward of the ``flash``, ``local``, ``linear`` and ``performer``
   layers' ``attend`` at N = 65,536, D = 64, one head, traced by ``tracemalloc`` (peak above
   the inputs), against the floor of 80 MiB: the gradients of q, k, v, the output and its
   gradient, five N × D float32 arrays. Minutes, so a flag.

Times are the best of ``--repeats`` runs after a warm-up (a shared machine only ever slows
a run down, so the best is the least disturbed; calls of a few milliseconds are repeated for
about half a second); the load average is printed. Ratios are
minitx ÷ PyTorch in time: below 1 minitx is faster. PyTorch runs with 2 threads (NumPy's
BLAS uses its own, printed too). Without PyTorch the comparisons are skipped with a line
saying so; minitx's own numbers still print.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

import minitx.functional as F
from minitx import nn
from minitx.attention import REGISTRY
from minitx import configuration
from minitx.fast.parallel import map_in_threads, thread_count
from minitx.fast.sdpa import _by_heads, attention_blocks
from minitx.ops.sdpa import grouped_key_grad, grouped_scores, grouped_values

try:
    import torch
except ImportError:                     # the comparison is optional; minitx's numbers are not
    torch = None

TORCH_THREADS = 2
D = 64


BUDGET = {"seconds": 0.5}       # per timed case, for short calls (0 with --quick)


def best_time(fn, repeats):
    """Least wall time of at least ``repeats`` calls after one warm-up call, in seconds; a
    call of a few milliseconds is repeated until about ``BUDGET`` seconds have run (at most
    200 times), since one short call is easily disturbed."""
    t0 = time.perf_counter()
    fn()
    budget = BUDGET["seconds"]
    repeats = max(repeats, min(200, int(budget / max(time.perf_counter() - t0, 1e-9))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_times(fns, repeats, turns=8):
    """``best_time`` of each of ``fns`` (a None gives None), taken in ``turns`` turns each: the
    machine has slow stretches (seen here lasting from half a second to several seconds), and
    taking many short turns puts them on minitx and PyTorch alike. Each turn starts with an
    untimed call: the other library's idle threads may still be spinning on the cores
    (PyTorch's OpenMP threads do for a while after each call), which would slow the first
    call of a turn."""
    live = [fn for fn in fns if fn is not None]
    t0 = time.perf_counter()
    for fn in live:                                     # the warm-up calls
        fn()
    budget = BUDGET["seconds"] * len(live)
    calls = max(repeats, min(200, int(budget / max(time.perf_counter() - t0, 1e-9))))
    per_turn = max(1, -(-calls // turns))
    best = [float("inf")] * len(live)
    for _ in range(turns):
        for i, fn in enumerate(live):
            fn()                                        # untimed: see above
            for _ in range(per_turn):
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
    found = iter(best)
    return [None if fn is None else next(found) for fn in fns]


def reference(fn):
    """``fn`` with the fast layer off: the reference code alone."""
    def run():
        with minitx.using_config(fast=False):
            return fn()
    return run


def ratio(a, b):
    return "—" if b is None else f"{a / b:.2f}×"


def ms(t):
    return "—" if t is None else f"{t * 1e3:9.2f}"


def sgemm_gflops(repeats):
    """Float32 matmul speed on 2,048³ of NumPy and of PyTorch (None without it), GFLOP/s, in
    turns: NumPy's is the ceiling for matmul-bound attention; PyTorch's shows how far its
    own BLAS sets it ahead before any attention code runs."""
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    ta = torch.from_numpy(a) if torch else None
    flops = 2 * 2048 ** 3
    mt, tt = best_times([lambda: a @ a, (lambda: ta @ ta) if torch else None], repeats, turns=3)
    return flops / mt / 1e9, None if tt is None else flops / tt / 1e9


# ---- 1. engine overhead ------------------------------------------------------------------

def chain_runners(n_ops):
    """Callables running the op chain in minitx and in PyTorch (None without it)."""
    x0 = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)

    def run_minitx():
        x = minitx.tensor(x0, requires_grad=True)
        y = x
        for _ in range(n_ops // 2):
            y = y * 0.999
            y = y + 0.001
        y.sum().backward()

    def run_torch():
        x = torch.tensor(x0, requires_grad=True)
        y = x
        for _ in range(n_ops // 2):
            y = y * 0.999
            y = y + 0.001
        y.sum().backward()
    return run_minitx, run_torch if torch else None


def chain_times(n_ops, repeats):
    run_minitx, run_torch = chain_runners(n_ops)
    mt, rt, tt = best_times([run_minitx, reference(run_minitx), run_torch], repeats)
    return mt / n_ops, rt / n_ops, None if tt is None else tt / n_ops


# ---- 2. SDPA, 3. flash ---------------------------------------------------------------------

def qkv_arrays(n, b=2, h=4, seed=0):
    r = np.random.default_rng(seed)
    return [r.standard_normal((b, h, n, D)).astype(np.float32) for _ in range(4)]


def minitx_attention(arrays, fn):
    """A callable running ``fn(q, k, v)`` forward + backward with gradient ``do``."""
    q, k, v = (minitx.tensor(a, requires_grad=True) for a in arrays[:3])
    do = arrays[3]

    def run():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(do)
    return run


def torch_sdpa(arrays, causal):
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    do = torch.tensor(arrays[3])

    def run():
        for t in (q, k, v):
            t.grad = None
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
    return run


def attention_matmuls(arrays, causal):
    """A callable doing only the six matmuls of the fused op's forward + backward, on the
    blocks it uses and in its threads (``attention_blocks``, ``map_in_threads``): the time
    NumPy's BLAS alone needs for this design. The products are thrown away; P and dS are
    stood in for by S and dP (the same shapes; their values do not change a matmul's
    time)."""
    q, k, v, do = arrays
    b, h, n, _ = q.shape
    groups = _by_heads(attention_blocks(b, h, 1, n, n, causal, parts=thread_count()))

    def group(blocks):
        for bs, hs, hq, i0, i1, kend in blocks:
            qb, dob = q[bs, hq, i0:i1], do[bs, hq, i0:i1]
            kb, vb = k[bs, hs, :kend], v[bs, hs, :kend]
            s = grouped_scores(qb, kb)          # S = Q Kᵀ
            grouped_values(s, vb)               # O = P V
            dp = grouped_scores(dob, vb)        # dP = dO Vᵀ
            grouped_key_grad(s, dob, 1)         # dV = Pᵀ dO
            grouped_values(dp, kb)              # dQ = dS K
            grouped_key_grad(dp, qb, 1)         # dK = dSᵀ Q

    return lambda: map_in_threads(group, groups, like=q)


def sdpa_table(ns, repeats, gflops):
    print(f"SDPA forward + backward, B·H = 8, D = {D}, float32 (fast = the fast layer on, "
          f"ref = off; % = share of the {gflops:.0f} GFLOP/s sgemm; matmuls = the six matmuls "
          "of the fast op alone, on its blocks and threads)")
    print(f"  {'N':>6} {'causal':>6} {'fast ms':>9} {'ref ms':>9} {'torch ms':>9} "
          f"{'fast/torch':>10} {'ref/torch':>9} {'fast %':>6} {'ref %':>5} {'torch %':>7} "
          f"{'matmuls ms':>10} {'matmuls/torch':>13}")
    for n in ns:
        arrays = qkv_arrays(n)
        for causal in (False, True):
            flops = 14 * n * n * D * 8 * (0.5 if causal else 1.0)
            run = minitx_attention(arrays, lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal))
            mt, rt, tt, mm = best_times([run, reference(run),
                                         torch_sdpa(arrays, causal) if torch else None,
                                         attention_matmuls(arrays, causal)], repeats)
            share = lambda t: "—" if t is None else f"{100 * flops / t / 1e9 / gflops:.0f}%"  # noqa: E731
            print(f"  {n:>6} {str(causal):>6} {ms(mt):>9} {ms(rt):>9} {ms(tt):>9} "
                  f"{ratio(mt, tt):>10} {ratio(rt, tt):>9} {share(mt):>6} {share(rt):>5} "
                  f"{share(tt):>7} {ms(mm):>10} {ratio(mm, tt):>13}")


def flash_vs_fused(n, repeats):
    print(f"\nflash_attention (tiled, linear memory) vs the fused SDPA, N = {n}, B·H = 8 "
          "(fast layer on / off)")
    arrays = qkv_arrays(n)
    for causal in (False, True):
        fused = minitx_attention(arrays, lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal))
        flash = minitx_attention(arrays, lambda q, k, v: F.flash_attention(q, k, v,
                                                                           causal=causal))
        fu, fl, rfu, rfl = best_times([fused, flash, reference(fused), reference(flash)],
                                      repeats)
        print(f"  causal={str(causal):5}  fast: fused {ms(fu)} ms  flash {ms(fl)} ms  "
              f"flash/fused {fl / fu:.2f}×   ref: fused {ms(rfu)} ms  flash {ms(rfl)} ms  "
              f"flash/fused {rfl / rfu:.2f}×")


# ---- 4. blocks -----------------------------------------------------------------------------

def copy_weights(ours, theirs):
    """Give the torch module minitx's parameter values (the names are PyTorch's)."""
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.tensor(mine[name].numpy()))


def block_rows(repeats, b=4, t=256, e=256, h=8, ff=1024):
    print(f"\nblocks forward + backward, B = {b}, T = {t}, E = {e}, H = {h} (causal), float32")
    x0 = np.random.default_rng(1).standard_normal((b, t, e)).astype(np.float32)
    mask = np.triu(np.ones((t, t), dtype=bool), 1)          # True = masked (PyTorch polarity)
    minitx.manual_seed(0)
    cases = [("MultiheadAttention",
              nn.MultiheadAttention(e, h, batch_first=True),
              lambda m, x, msk: m(x, x, x, attn_mask=msk, need_weights=False,
                                  is_causal=True)[0],
              lambda: torch.nn.MultiheadAttention(e, h, batch_first=True)),
             ("TransformerEncoderLayer",
              nn.TransformerEncoderLayer(e, h, ff, dropout=0.0, batch_first=True),
              lambda m, x, msk: m(x, src_mask=msk, is_causal=True),
              lambda: torch.nn.TransformerEncoderLayer(e, h, ff, dropout=0.0,
                                                       batch_first=True))]
    for name, ours, call, make_theirs in cases:
        x = minitx.tensor(x0, requires_grad=True)

        def run_minitx():
            ours.zero_grad()
            x.grad = None
            call(ours, x, mask).sum().backward()
        run_torch = None
        if torch:
            theirs = make_theirs()
            copy_weights(ours, theirs)
            tx, tmask = torch.tensor(x0, requires_grad=True), torch.tensor(mask)

            def run_torch():
                theirs.zero_grad()
                tx.grad = None
                call(theirs, tx, tmask).sum().backward()
        mt, rt, tt, mm = best_times([run_minitx, reference(run_minitx), run_torch,
                                     block_matmuls(b, t, e, h, ff if "Encoder" in name else 0)],
                                    repeats)
        print(f"  {name:24} fast {ms(mt)} ms  ref {ms(rt)} ms  torch {ms(tt)} ms  "
              f"fast/torch {ratio(mt, tt)}  ref/torch {ratio(rt, tt)}"
              f"   matmuls {ms(mm)} ms, matmuls/torch {ratio(mm, tt)}")


def block_matmuls(b, t, e, h, ff):
    """A callable doing only the matmuls of a block's forward + backward in NumPy: each
    ``Linear`` (x Wᵀ, dY W, dYᵀ x) — the (q, k, v) projection, the output projection and,
    with ``ff``, the feed-forward pair — and the attention's six (``attention_matmuls``)."""
    r = np.random.default_rng(2)
    shapes = [(e, 3 * e), (e, e)] + ([(e, ff), (ff, e)] if ff else [])
    linears = []
    for n_in, n_out in shapes:
        x, dy = (r.standard_normal((b * t, n)).astype(np.float32) for n in (n_in, n_out))
        linears.append((x, r.standard_normal((n_out, n_in)).astype(np.float32), dy))
    attention = attention_matmuls(
        [r.standard_normal((b, h, t, e // h)).astype(np.float32) for _ in range(4)], True)

    def run():
        for x, w, dy in linears:
            x @ w.T, dy @ w, dy.T @ x
        attention()
    return run


# ---- what each twin buys -------------------------------------------------------------------

def without(name, fn):
    """``fn`` with the fast layer on but the twin ``name`` taken out."""
    def run():
        with configuration.without_twins(name):
            return fn()
    return run


def encoder_runner(b=4, t=256, e=256, h=8, ff=1024):
    """A callable: ``nn.TransformerEncoderLayer`` forward + backward, causal (minitx)."""
    x = minitx.tensor(np.random.default_rng(1).standard_normal((b, t, e)).astype(np.float32),
                      requires_grad=True)
    mask = np.triu(np.ones((t, t), dtype=bool), 1)
    minitx.manual_seed(0)
    layer = nn.TransformerEncoderLayer(e, h, ff, dropout=0.0, batch_first=True)

    def run():
        layer.zero_grad()
        x.grad = None
        layer(x, src_mask=mask, is_causal=True).sum().backward()
    return run


def tricks_table(repeats, quick):
    """Each case with the whole fast layer, with one twin at a time taken out, and with none:
    "×" is the time without the twin over the time with it (above 1: the twin buys time)."""
    n = 256 if quick else 1024
    arrays = qkv_arrays(n)
    cases = [(f"SDPA N={n}", minitx_attention(arrays, lambda q, k, v:
                                              F.scaled_dot_product_attention(q, k, v))),
             (f"SDPA N={n} causal", minitx_attention(arrays, lambda q, k, v:
                                                     F.scaled_dot_product_attention(
                                                         q, k, v, is_causal=True))),
             ("encoder layer", encoder_runner(t=32 if quick else 256)),
             ("engine chain", chain_runners(200 if quick else 2000)[0])]
    names = sorted(configuration.twins())
    print("\nwhat each fast twin buys: the time with the twin taken out (the rest of the fast "
          "layer on) over the time with the whole layer, forward + backward")
    print(f"  {'twin taken out':16} " + " ".join(f"{case:>18}" for case, _ in cases))
    columns = []
    for _, fn in cases:
        variants = [fn] + [without(name, fn) for name in names] + [reference(fn)]
        columns.append(best_times(variants, repeats, turns=3))
    print(f"  {'(none) ms':16} " + " ".join(f"{ms(col[0]):>18}" for col in columns))
    for i, name in enumerate(names, 1):
        print(f"  {name:16} " + " ".join(f"{col[i] / col[0]:>17.2f}×" for col in columns))
    print(f"  {'all (ref)':16} " + " ".join(f"{col[-1] / col[0]:>17.2f}×" for col in columns))


# ---- 5. memory -----------------------------------------------------------------------------

def memory_rows(n, names=("flash", "local", "linear", "performer")):
    floor = 5 * n * D * 4 / 2 ** 20                     # 80 MiB at N = 65,536
    print(f"\nmemory, forward + backward of attend(q, k, v), N = {n}, D = {D}, one head, "
          f"float32: tracemalloc peak above the inputs; floor {floor:.0f} MiB "
          "(q, k, v grads + output + its grad)")
    r = np.random.default_rng(0)
    arrays = [r.standard_normal((1, 1, n, D)).astype(np.float32) for _ in range(4)]
    for name in names:
        layer = REGISTRY[name](D, 1)
        q, k, v = (minitx.tensor(a, requires_grad=True) for a in arrays[:3])
        tracemalloc.start()
        t0 = time.perf_counter()
        layer.attend(q, k, v).backward(arrays[3].copy())     # the output gradient, traced
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
        tracemalloc.stop()
        print(f"  {name:10} {peak:8.1f} MiB  {peak / floor:5.2f}× the floor  ({seconds:.1f} s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke run: small sizes, one repeat")
    parser.add_argument("--memory", action="store_true",
                        help="also the N = 65,536 memory table (minutes)")
    parser.add_argument("--tricks", action="store_true",
                        help="also what each fast twin buys on its own (minutes)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    minitx.fast.host.tune_host_allocator()         # the caching allocator the examples use
    repeats = 1 if args.quick else args.repeats
    BUDGET["seconds"] = 0.0 if args.quick else 0.5
    if torch is None:
        print("PyTorch is not installed: its columns are skipped (pip install torch to compare)")
    else:
        torch.set_num_threads(TORCH_THREADS)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"fast layer: {len(configuration.twins())} twins "
          f"({', '.join(sorted(configuration.twins()))})")
    print(f"numpy {np.__version__}, BLAS threads: "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default (all cores)')}; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} "
          f"(at the start), best of {repeats}\n")
    gflops, torch_gflops = sgemm_gflops(repeats)
    print(f"sgemm 2,048³, float32: NumPy {gflops:.0f} GFLOP/s, PyTorch "
          f"{'—' if torch_gflops is None else f'{torch_gflops:.0f}'} GFLOP/s, "
          "NumPy/PyTorch in time "
          f"{'—' if torch_gflops is None else ratio(torch_gflops, gflops)}\n")
    mt, rt, tt = chain_times(200 if args.quick else 2000, repeats)
    print(f"engine chain, y*0.999 + 0.001 on 8×8, forward + backward: fast "
          f"{mt * 1e6:.2f} µs/op, ref {rt * 1e6:.2f} µs/op, torch "
          f"{'—' if tt is None else f'{tt * 1e6:.2f}'} µs/op, fast/torch {ratio(mt, tt)}, "
          f"ref/torch {ratio(rt, tt)}\n")
    sdpa_table((64, 256) if args.quick else (256, 1024, 4096), repeats, gflops)
    flash_vs_fused(256 if args.quick else 4096, repeats)
    block_rows(repeats, t=32 if args.quick else 256)
    if args.tricks:
        tricks_table(repeats, args.quick)
    if args.memory:
        memory_rows(4096 if args.quick else 65536)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
