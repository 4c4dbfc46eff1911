"""Efficient attention, measured: cost versus N, approximation quality, and what decoding keeps.

    python examples/efficient_report.py
    python examples/efficient_report.py --quick

Three tables:

1. forward time and traced peak memory versus sequence length N (B = 1) for exact, masked
   and approximate variants (plots when matplotlib is installed);
2. approximation quality of the *approximate* variants (Performer, Linformer, Nyström,
   Reformer, Routing) at growing budgets: ‖A − A*‖_F / ‖A*‖_F and ‖O − O*‖_F / ‖O*‖_F, where A is the
   attention matrix a variant implies, read off by attending with V = I (A·I = A). This is
   ``minitx.metrics`` — the measurement of benchmarks/approx_quality.py, same regime (q, k
   entries N(0, 0.5²); Reformer against its shared-QK reference; Linformer with pooling
   projections on smooth keys/values), so at N = 128 the two print the same numbers. Masked
   (sparse) variants are not approximations: one line shows they are exact under their own
   pattern, and how far that pattern is from full attention;
3. decoding: the bytes each layer's cache holds after a prompt, and the time per generated
   token, through each variant's own cache: MHA, GQA and MQA (fewer key/value heads shrink the
   cache by H / Hkv), multi-head latent attention (one latent and one RoPE key a token),
   attention sinks (a bounded window) and the recurrent forms (one state, whatever the length).

Ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

from minitx.attention import REGISTRY
from minitx.cli import add_common_args, bench_rows, bench_table, result_line, setup_run
from minitx.metrics import masked_distances, quality_table
from minitx.tour import cached_numbers, fmt_bytes
from minitx.viz import line_plot

COST_VARIANTS = "mha,flash,local,bigbird,linformer,performer,linear,reformer"
MASKED = {"local": {"window": 16}, "bigbird": {"block": 16, "num_random": 1}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/efficient_report")
    p.add_argument("--variants", default=COST_VARIANTS)
    p.add_argument("--max-n", type=int, default=2048)
    p.add_argument("--approx-n", type=int, default=128)
    p.add_argument("--approx-seeds", type=int, default=3,
                   help="seeds averaged per cell of the approximation table")
    p.add_argument("--decode-context", type=int, default=1024)
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--qk-std", type=float, default=0.5,
                   help="std of the random q, k entries in the approximation table")
    p.add_argument("--decode-embed", type=int, default=256)
    p.add_argument("--decode-heads", type=int, default=8)
    args = p.parse_args(argv)
    if args.quick:
        args.max_n, args.approx_n, args.decode_context = 128, 64, 128
        args.approx_seeds = 1
        args.variants = "mha,flash,local,performer,linear"
    return args


def approximation_table(n, d=16, seeds=3, std=0.5):
    """Approximate variants vs exact attention, via ``minitx.metrics`` — the same measurement
    (and, at the same settings, the same numbers) as benchmarks/approx_quality.py."""
    return [{"variant": name, "option": f"{option}={budget}", "budget": budget,
             "error": att, "output_error": out}
            for name, option, budget, att, out in quality_table(n, d, seeds, scale=std)]


def masked_table(n, d=16, std=0.5):
    """Masked variants: distance from exact attention under their own pattern and from full."""
    rows = []
    for name, options in MASKED.items():
        own, full = masked_distances(name, options, n, d, scale=std)
        rows.append({"variant": name, "option": ",".join(f"{k}={v}" for k, v in options.items()),
                     "own_pattern_error": own, "full_error": full})
    return rows


DECODE_VARIANTS = ("mha", "gqa", "mqa", "mla", "sink", "retention", "deltanet", "ssd")


def decoding_table(context, embed, heads, reps=32, seed=0):
    """Per variant: key/value heads, the bytes its cache holds after ``context`` tokens (read
    off the cache: keys and values, a latent, a window, a state), and ms per generated token.

    Each layer decodes through its own ``new_cache()`` as GPT does: one forward over the prompt,
    then one token at a time."""
    rows = []
    gen = np.random.default_rng(seed)
    prompt = minitx.tensor(gen.standard_normal((1, context, embed)), dtype="float32")
    steps = minitx.tensor(gen.standard_normal((1, reps, embed)), dtype="float32")
    for name in DECODE_VARIANTS:
        kw = {"num_kv_heads": max(1, heads // 4)} if name == "gqa" else {}
        layer = REGISTRY[name](embed, heads, causal=True, **kw).eval()
        cache, times = layer.new_cache(), []
        with minitx.no_grad():
            layer(prompt, kv_cache=cache)                     # the prompt, at once
            held = cached_numbers(cache) * 4                  # float32 bytes, one layer
            for step in range(reps):                          # then one token at a time
                t0 = time.perf_counter()
                layer(steps[:, step:step + 1], kv_cache=cache)
                times.append(time.perf_counter() - t0)
        keeps_kv = type(cache).__name__ == "KVCache"          # keys and values, by head
        rows.append({"variant": name, "kv_heads": layer.num_kv_heads if keeps_kv else None,
                     "cache_bytes": held,
                     "ms_per_token": 1e3 * float(np.median(times))})
    return rows


def main(argv=None):
    args = parse_args(argv)
    out = setup_run(args, "efficient_report: cost, approximation quality, decoding",
                    full_run="The full run (`python examples/efficient_report.py`; timed in "
                    "docs/benchmarks.md) measures more variants to a larger N, the approximation error "
                    "over three seeds, and the KV cache (MQA = 1/8 of MHA, GQA = 1/4, H = 8).")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    sizes, n = [], 128 if args.max_n >= 512 else 64
    while n <= args.max_n:
        sizes.append(n)
        n *= 2
    print(f"\n1. forward time and peak memory (B = 1, E = {args.embed}, H = {args.heads})")
    rows = bench_rows(names, sizes, args.embed, args.heads)
    print("\n".join(bench_table(rows, sizes)))
    pictures = []
    for key, label, fname, scale in (("time_s", "ms per forward", "time_vs_n.png", 1e3),
                                     ("peak_bytes", "peak MiB", "memory_vs_n.png", 2 ** -20)):
        series = {v: ([r["n"] for r in rows if r["variant"] == v and r[key]],
                      [r[key] * scale for r in rows if r["variant"] == v and r[key]])
                  for v in names}
        series = {k: s for k, s in series.items() if s[0]}
        if series:
            pictures.append(line_plot(series, os.path.join(out, fname), f"{label} vs N",
                                      "sequence length N", label, logx=True, logy=True,
                                      quiet=True))
    print(f"pictures: {', '.join(p for p in pictures if p)}")

    print(f"\n2. approximation quality at N = {args.approx_n}, D = 16, 2 heads: relative "
          f"Frobenius distance\n   to exact attention, q, k ~ N(0, {args.qk_std}²), mean over "
          f"{args.approx_seeds} seed(s), float64 — the\n   measurement of "
          f"benchmarks/approx_quality.py (minitx.metrics)")
    approx = approximation_table(args.approx_n, seeds=args.approx_seeds, std=args.qk_std)
    print(f"  {'variant':<10} {'budget':<18} {'‖A−A*‖/‖A*‖':>12} {'‖O−O*‖/‖O*‖':>12}")
    for r in approx:
        print(f"  {r['variant']:<10} {r['option']:<18} {r['error']:>12.4f} "
              f"{r['output_error']:>12.4f}")
    print("  (error falls as the budget grows. Reformer is compared with shared-QK attention "
          "without\n   self-attention, its one-bucket limit; Linformer with pooling projections "
          "on smooth\n   keys/values — an untrained random projection approximates nothing; "
          "Routing with\n   one cluster and a window ≥ N is exact)")
    masked = masked_table(args.approx_n, std=args.qk_std)
    print("  sparse vs full: masked variants are exact under their own pattern, not "
          "approximations —")
    for r in masked:
        print(f"    {r['variant']:<8} {r['option']:<22} vs own-mask attention "
              f"{r['own_pattern_error']:.1e}, vs full {r['full_error']:.3f}")

    print(f"\n3. decoding one token after a {args.decode_context}-token prompt, through each "
          "variant's own cache\n"
          f"   (E = {args.decode_embed}, H = {args.decode_heads}, one layer, float32)")
    dec = decoding_table(args.decode_context, args.decode_embed, args.decode_heads)
    base = dec[0]["cache_bytes"]
    print(f"  {'variant':<10} {'KV heads':>8} {'cache':>12} {'vs MHA':>7} {'ms/token':>9}")
    for r in dec:
        heads = "-" if r["kv_heads"] is None else r["kv_heads"]
        print(f"  {r['variant']:<10} {heads:>8} {fmt_bytes(r['cache_bytes']):>12} "
              f"{r['cache_bytes'] / base:>7.2f} {r['ms_per_token']:>9.3f}")
    result_line({"cost": [{k: r[k] for k in ("variant", "n", "time_s", "peak_bytes")}
                          for r in rows],
                 "approximation": approx, "masked": masked,
                 "decoding": dec, "pictures": [p for p in pictures if p], "out": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
