"""Efficient attention, measured: cost versus N, approximation quality, and decoding with MHA/GQA/MQA.

    python examples/efficient_report.py
    python examples/efficient_report.py --quick

Three tables:

1. forward time and traced peak memory versus sequence length N (B = 1) for exact, masked
   and approximate variants (plots when matplotlib is installed);
2. approximation quality: ‖A − A*‖_F / ‖A*‖_F where A* = softmax(QKᵀ/√D) and A is the
   attention matrix a variant implies, read off by attending with V = I (the identity:
   A·I = A), at a few budgets (features, projection rank, buckets, window). Inputs are random
   unit-variance q, k — untrained; Linformer's projection is meant to be learned, so its
   numbers here are an upper bound;
3. decoding: KV-cache bytes and time per generated token for MHA, GQA and MQA (same query
   heads; fewer key/value heads shrink the cache by H / Hkv).

Ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import minitx
from minitx.attention import REGISTRY, dense_attention_array, split_heads
from minitx.cli import add_common_args, bench_rows, bench_table, result_line, setup_run
from minitx.tour import fmt_bytes
from minitx.viz import line_plot

COST_VARIANTS = "mha,flash,local,bigbird,linformer,performer,linear,reformer"
BUDGETS = {
    "performer": ("num_features", (16, 64, 256)),
    "linformer": ("proj_dim", (16, 64, 128)),
    "reformer": ("n_buckets", (16, 8, 2)),
    "routing": ("num_clusters", (8, 4, 2)),
    "local": ("window", (8, 32, 64)),
    "bigbird": ("block", (8, 16, 32)),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/efficient_report")
    p.add_argument("--variants", default=COST_VARIANTS)
    p.add_argument("--max-n", type=int, default=2048)
    p.add_argument("--approx-n", type=int, default=256)
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
        args.variants = "mha,flash,local,performer,linear"
    return args


def to_host(a):
    return np.asarray(minitx.backend.to_device(getattr(a, "data", a), "cpu"))


def implied_matrix(layer, q, k, n):
    """The (B, H, N, N) attention matrix a layer applies, via attend(q, k, V = I)."""
    xp = minitx.backend.xp()
    eye = xp.broadcast_to(xp.eye(n, dtype=q.dtype), (q.shape[0], k.shape[1], n, n)).copy()
    with minitx.no_grad():
        return to_host(layer.attend(q, k, minitx.tensor(eye)))


def approximation_table(n, heads=2, d=16, seed=0, std=0.5):
    gen = np.random.default_rng(seed)
    q, k = (minitx.tensor(std * gen.standard_normal((1, heads, n, d)), dtype="float64")
            for _ in range(2))
    exact = to_host(dense_attention_array(q.data, k.data,
                                          minitx.backend.xp().eye(n, dtype="float64")[None, None]
                                          .repeat(heads, 1)))
    rows = []
    for name, (opt, budgets) in BUDGETS.items():
        if name not in REGISTRY:
            continue
        for b in budgets:
            row = {"variant": name, "option": f"{opt}={b}", "error": None, "note": ""}
            try:
                kw = {opt: b}
                if name == "linformer":
                    kw["max_len"] = n
                layer = REGISTRY[name](d * heads, heads, **kw)
                layer.to(dtype="float64")
                layer.eval()
                a = implied_matrix(layer, q, k, n)
                row["error"] = float(np.linalg.norm(a - exact) / np.linalg.norm(exact))
                row["kind"] = layer.kind
            except Exception as exc:  # noqa: BLE001
                row["note"] = f"error: {type(exc).__name__}: {exc}"[:80]
            rows.append(row)
    return rows


def decoding_table(context, embed, heads, reps=32, seed=0):
    """Per variant: Hkv, cache bytes at ``context`` tokens, ms per generated token."""
    rows = []
    gen = np.random.default_rng(seed)
    d = embed // heads
    xp = minitx.backend.xp()
    for name, hkv in (("mha", heads), ("gqa", max(1, heads // 4)), ("mqa", 1)):
        kw = {} if name == "mha" else {"num_kv_heads": hkv}
        layer = REGISTRY[name](embed, heads, **kw)
        layer.eval()
        hkv = layer.num_kv_heads
        kc = xp.asarray(gen.standard_normal((1, hkv, context + reps, d)), dtype="float32")
        vc = xp.asarray(gen.standard_normal((1, hkv, context + reps, d)), dtype="float32")
        x = minitx.tensor(gen.standard_normal((1, 1, embed)), dtype="float32")
        times = []
        with minitx.no_grad():
            for step in range(reps):
                t0 = time.perf_counter()
                qn = split_heads(layer.q_proj(x), heads)
                kn = split_heads(layer.k_proj(x), hkv).data
                vn = split_heads(layer.v_proj(x), hkv).data
                t = context + step
                kc[:, :, t:t + 1] = kn                       # append to the cache
                vc[:, :, t:t + 1] = vn
                o = layer.attend(qn, minitx.tensor(kc[:, :, :t + 1]),
                                 minitx.tensor(vc[:, :, :t + 1]))
                layer.out_proj(o.transpose(0, 2, 1, 3).reshape(1, 1, embed))
                times.append(time.perf_counter() - t0)
        cache_bytes = 2 * hkv * context * d * 4          # K and V, float32, one layer
        rows.append({"variant": name, "kv_heads": hkv, "cache_bytes": cache_bytes,
                     "ms_per_token": 1e3 * float(np.median(times))})
    return rows


def main(argv=None):
    args = parse_args(argv)
    out = setup_run(args, "efficient_report: cost, approximation quality, decoding")
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

    print(f"\n2. approximation quality at N = {args.approx_n}, D = 16 (‖A − A*‖F / ‖A*‖F; "
          f"random q, k with entries N(0, {args.qk_std}²); untrained)")
    approx = approximation_table(args.approx_n, std=args.qk_std)
    print("  (Reformer hashes shared query-keys and Routing clusters them, so both also drop "
          "pairs the\n   exact map keeps; window/block equal to N recovers exact attention)")
    print(f"  {'variant':<11} {'budget':<18} {'rel. error':>10}")
    for r in approx:
        err = f"{r['error']:.3f}" if r["error"] is not None else r["note"]
        print(f"  {r['variant']:<11} {r['option']:<18} {err:>10}")

    print(f"\n3. decoding one token with a {args.decode_context}-token KV cache "
          f"(E = {args.decode_embed}, H = {args.decode_heads}, one layer, float32)")
    dec = decoding_table(args.decode_context, args.decode_embed, args.decode_heads)
    base = dec[0]["cache_bytes"]
    print(f"  {'variant':<8} {'KV heads':>8} {'cache':>12} {'vs MHA':>7} {'ms/token':>9}")
    for r in dec:
        print(f"  {r['variant']:<8} {r['kv_heads']:>8} {fmt_bytes(r['cache_bytes']):>12} "
              f"{r['cache_bytes'] / base:>7.2f} {r['ms_per_token']:>9.3f}")
    result_line({"cost": [{k: r[k] for k in ("variant", "n", "time_s", "peak_bytes")}
                          for r in rows],
                 "approximation": [{k: r.get(k) for k in ("variant", "option", "error")}
                                   for r in approx],
                 "decoding": dec, "pictures": [p for p in pictures if p], "out": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
