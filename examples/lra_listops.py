"""Mini Long-Range-Arena ListOps: the same small model trained with several attention variants.

    python examples/lra_listops.py                          # sequences of 100–300 tokens
    python examples/lra_listops.py --variants mha,local,performer --steps 400
    python examples/lra_listops.py --quick                  # short sequences, seconds

ListOps (``minitx.data.listops``) asks for the value (0–9) of a nested expression such as
``[MAX 2 9 [MIN 4 7 ] 0 ]``: the answer depends on tokens far apart. Every variant gets the
same data, model size, optimizer, steps and seed; only ``attention=`` changes. Sequences are
padded to one length and no padding mask is used (most efficient variants take none), so the
comparison is like for like. Prints accuracy and time per training step as one table and
ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import minitx
import minitx.functional as F
from minitx import nn, optim
from minitx.cli import Progress, add_common_args, result_line, setup_run
from minitx.data import LISTOPS_TOKENS, listops_dataset
from minitx.viz import line_plot

DEFAULT_VARIANTS = "mha,local,linear,performer,linformer,bigbird,reformer"


def variant_options(name, seq_len):
    """Per-variant settings for the ListOps model (budgets sized for a few hundred tokens)."""
    return {
        "local": {"window": 16},
        "linformer": {"proj_dim": 32, "max_len": seq_len},
        "performer": {"num_features": 32},
        "bigbird": {"block": 16, "num_random": 1},
        "reformer": {"n_buckets": 4, "chunk_size": 32},
        "synthesizer": {"max_len": seq_len},
        "routing": {"window": 32},
    }.get(name, {})


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/lra_listops")
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=300)
    p.add_argument("--train-size", type=int, default=3000)
    p.add_argument("--test-size", type=int, default=300)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.min_len, args.max_len, args.steps = 10, 40, 12
        args.train_size, args.test_size, args.batch_size = 400, 200, 16
    return args


def to_host(a):
    return np.asarray(minitx.backend.to_device(getattr(a, "data", a), "cpu"))


def run_variant(name, args, data, seq_len):
    (xtr, ytr), (xte, yte) = data
    minitx.manual_seed(args.seed)
    model = nn.EncoderClassifier(len(LISTOPS_TOKENS), 10, d_model=args.d_model,
                                 nhead=args.heads, num_layers=args.layers, dropout=0.0,
                                 max_len=seq_len, pooling="mean", position="sinusoidal",
                                 attention=None if name == "mha" else name,
                                 attention_options=variant_options(name, seq_len) or None)
    nn.init.normal_(model.embed.weight, 0.0, 1.0)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = optim.WarmupCosine(opt, warmup_steps=max(1, args.steps // 10),
                               total_steps=args.steps)
    gen = np.random.default_rng(args.seed)
    bar = Progress(args.steps, f"{name:>10}")
    losses = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        idx = gen.integers(0, len(xtr), args.batch_size)
        loss = F.cross_entropy(model(minitx.tensor(xtr[idx])), minitx.tensor(ytr[idx]))
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.item()))
        bar.update({"loss": float(np.mean(losses[-10:]))})
    bar.close()
    step_time = (time.perf_counter() - t0) / args.steps
    model.eval()
    correct = 0
    with minitx.no_grad():
        for s in range(0, len(xte), 100):
            pred = to_host(model(minitx.tensor(xte[s:s + 100])).data.argmax(-1))
            correct += int((pred == yte[s:s + 100]).sum())
    return {"accuracy": correct / len(xte), "step_ms": 1e3 * step_time,
            "first_loss": float(np.mean(losses[:5])), "final_loss": float(np.mean(losses[-10:])),
            "losses": losses}


def main(argv=None):
    args = parse_args(argv)
    out = setup_run(args, "lra_listops: one model, many attention variants")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    t0 = time.perf_counter()
    train = listops_dataset(args.train_size, args.min_len, args.max_len, seed=args.seed)
    test = listops_dataset(args.test_size, args.min_len, args.max_len, seed=args.seed + 1)
    seq_len = train[0].shape[1]
    majority = float(np.bincount(test[1], minlength=10).max() / len(test[1]))
    lengths = (train[0] != 0).sum(1)
    print(f"data: {args.train_size} train / {args.test_size} test expressions, {args.min_len}–"
          f"{args.max_len} tokens (mean {lengths.mean():.0f}), padded to {seq_len}; generated in "
          f"{time.perf_counter() - t0:.1f} s; majority-class accuracy {majority:.3f}")
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads; "
          f"{args.steps} steps of {args.batch_size} per variant")
    results = {}
    for name in names:
        try:
            results[name] = run_variant(name, args, (train, test), seq_len)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not end the table
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:120]}
            print(f"{name}: error: {results[name]['error']}")
    print()
    print(f"  {'variant':<12} {'accuracy':>9} {'ms/step':>9} {'loss first→last':>18}")
    print("  " + "-" * 51)
    for name, r in results.items():
        if "error" in r:
            print(f"  {name:<12} error: {r['error']}")
        else:
            print(f"  {name:<12} {r['accuracy']:>9.3f} {r['step_ms']:>9.1f} "
                  f"{r['first_loss']:>8.3f} → {r['final_loss']:<7.3f}")
    print(f"  (majority class {majority:.3f}; chance 0.100)")
    curves = {n: (np.arange(10, len(r['losses']) + 1),
                  np.convolve(r["losses"], np.ones(10) / 10, mode="valid"))
              for n, r in results.items() if "losses" in r and len(r["losses"]) >= 10}
    picture = line_plot(curves, path=os.path.join(out, "listops_loss.png"),
                        title=f"ListOps ({args.min_len}–{args.max_len} tokens): training loss",
                        xlabel="step", ylabel="cross-entropy (10-step mean)",
                        quiet=True) if curves else None
    print(f"loss curves: {picture}")
    summary = {n: ({"accuracy": round(r["accuracy"], 4), "step_ms": round(r["step_ms"], 1),
                    "first_loss": round(r["first_loss"], 4),
                    "final_loss": round(r["final_loss"], 4)} if "error" not in r else r)
               for n, r in results.items()}
    result_line({"variants": summary, "majority": majority, "seq_len": seq_len,
                 "pictures": [picture] if picture else [], "out": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
