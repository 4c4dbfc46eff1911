"""The engine on a GPU against PyTorch CUDA, in one run: what an op costs beyond its arithmetic
(a short chain of tiny ops) and a causal multi-head attention block, forward + backward.

    python benchmarks/gpu_engine.py                     # minitx on CuPy vs PyTorch on CUDA
    python benchmarks/gpu_engine.py --backend numpy     # minitx on NumPy vs PyTorch on the CPU
    python benchmarks/gpu_engine.py --quick             # small sizes, few repeats (tests)

1. **Per-op overhead**: ``--chain`` ops on (4, 4) float32 tensors, alternating ``y = y * c``
   and ``y = y + c``, then ``sum`` and backward. The arrays are so small that the time is
   bookkeeping and kernel launches: µs per op, forward + backward.
2. **Causal MultiheadAttention**: ``nn.MultiheadAttention(E, H, batch_first=True)`` called with
   the causal ``attn_mask`` and ``is_causal=True``, forward + backward to the input and every
   parameter, float32, at B4 T256 E256 H8 and B16 T1024 E768 H12. PyTorch's module gets
   minitx's weights (the same state-dict names); outputs and gradients are compared before
   timing, and the dispatch decisions of one call are printed (the CUDA kernel, or the array
   code and why).

Times are medians of ``--repeats`` runs after a warm-up, each run ended by a device
synchronisation (CuPy's and ``torch.cuda``'s), so that queued kernels are counted. The run
ends with ``GOAL`` lines: minitx's time over PyTorch's (the goal: at most 1.2x). PyTorch is a
peer measured in the same run, never a dependency: without it minitx's times are printed alone.
On the CPU (NumPy, or the strict CuPy stand-in) the numbers only show that the script runs.
Exit status 1 when minitx and PyTorch disagree; 2 when the backend cannot be used.
"""
from __future__ import annotations

import argparse
import collections
import logging
import statistics
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

from minitx import nn
from minitx.backend import cupy_or_none, describe_device

GOAL = 1.2                  # minitx's time / PyTorch's, at most
BLOCKS = [(4, 256, 256, 8), (16, 1024, 768, 12)]       # (B, T, E, H)
QUICK_BLOCKS = [(2, 16, 32, 4)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cupy", "numpy"], default="cupy")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chain", type=int, default=200, help="ops in the chain (default 200)")
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (tests)")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.chain = 3, 40
    return args


def median_time(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def minitx_sync(backend):
    """Wait for minitx's queued device work (nothing to wait for on NumPy)."""
    cp = cupy_or_none() if backend == "cupy" else None
    if cp is None:
        return lambda: None
    return cp.cuda.Device().synchronize


def torch_peer(backend):
    """(torch, device, sync) for the peer, or None without PyTorch."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: minitx's times alone, no ratios")
        return None
    if backend == "cupy" and torch.cuda.is_available():
        return torch, "cuda", torch.cuda.synchronize
    if backend == "cupy":
        print("PyTorch has no CUDA device here: its peer runs on the CPU, so the ratios below "
              "are not the GPU's")
    return torch, "cpu", lambda: None


def _close(a, b):
    """Max |a - b| relative to max(|b|, 1)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1.0))


def chain(args, sync, peer):
    """µs per op of the chain (minitx, PyTorch or None) and the gradients' agreement."""
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((4, 4)).astype(np.float32)
    c0 = (1 + 1e-3 * rng.standard_normal((4, 4))).astype(np.float32)
    half = args.chain // 2
    ops = 2 * half + 1                                    # the chain and the sum
    x, c = minitx.tensor(x0, requires_grad=True), minitx.tensor(c0)   # on the device once

    def run_minitx():
        x.grad = None
        y = x
        for _ in range(half):
            y = y * c
            y = y + c
        y.sum().backward()
        sync()
    t_mine = median_time(run_minitx, args.repeats) / ops
    t_torch = err = None
    if peer is not None:
        torch, dev, tsync = peer
        tx = torch.tensor(x0, device=dev, requires_grad=True)
        tc = torch.tensor(c0, device=dev)

        def run_torch():
            tx.grad = None
            y = tx
            for _ in range(half):
                y = y * tc
                y = y + tc
            y.sum().backward()
            tsync()
        t_torch = median_time(run_torch, args.repeats) / ops
        err = _close(x.grad.numpy(), tx.grad.cpu().numpy())
    return ops, t_mine, t_torch, err


def _dispatch_decisions(fn):
    """Run ``fn`` once and count the ``minitx.dispatch`` logger's decisions."""
    seen = collections.Counter()

    class Count(logging.Handler):
        def emit(self, record):
            seen[record.getMessage()] += 1
    log = logging.getLogger("minitx.dispatch")
    handler, level = Count(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        fn()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return "; ".join(f"{n}x {msg}" for msg, n in seen.items()) or "no attention dispatch logged"


def mha_block(B, T, E, H, args, sync, peer):
    """(minitx s, PyTorch s or None, agreement or None, dispatch decisions) of one block."""
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((B, T, E)).astype(np.float32)
    mask0 = np.triu(np.ones((T, T), dtype=bool), 1)           # True = masked (PyTorch's polarity)
    minitx.manual_seed(0)
    ours = nn.MultiheadAttention(E, H, batch_first=True)
    x, mask = minitx.tensor(x0, requires_grad=True), minitx.tensor(mask0)

    def run_minitx():
        ours.zero_grad()
        x.grad = None
        out = ours(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]
        out.sum().backward()
        sync()
        return out
    decisions = _dispatch_decisions(run_minitx)
    t_mine = median_time(run_minitx, args.repeats)
    if peer is None:
        return t_mine, None, None, decisions
    torch, dev, tsync = peer
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True).to(dev)
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.from_numpy(mine[name].numpy()).to(dev))
    tx = torch.tensor(x0, device=dev, requires_grad=True)
    tmask = torch.tensor(mask0, device=dev)

    def run_torch():
        theirs.zero_grad()
        tx.grad = None
        out = theirs(tx, tx, tx, attn_mask=tmask, need_weights=False, is_causal=True)[0]
        out.sum().backward()
        tsync()
        return out
    out, tout = run_minitx(), run_torch()
    err = max(_close(out.numpy(), tout.detach().cpu().numpy()),
              _close(x.grad.numpy(), tx.grad.cpu().numpy()),
              _close(mine["in_proj_weight"].grad.numpy(),
                     theirs.in_proj_weight.grad.cpu().numpy()))
    t_torch = median_time(run_torch, args.repeats)
    return t_mine, t_torch, err, decisions


def _goal(what, mine, theirs, unit, scale, peer_dev):
    if theirs is None:
        return f"GOAL {what}: minitx {mine * scale:.2f} {unit}; no PyTorch peer, no ratio"
    ratio = mine / theirs
    met = "met" if ratio <= GOAL else "not met"
    return (f"GOAL {what}: minitx {mine * scale:.2f} {unit}, PyTorch ({peer_dev}) "
            f"{theirs * scale:.2f} {unit} = {ratio:.2f}x (goal <= {GOAL}x: {met})")


def main(argv=None):
    args = parse_args(argv)
    try:
        minitx.set_backend(args.backend)
    except (RuntimeError, ValueError) as exc:
        print(f"gpu_engine: cannot use backend {args.backend!r}: {exc}", file=sys.stderr)
        return 2
    sync = minitx_sync(args.backend)
    peer = torch_peer(args.backend)
    print(f"minitx on {args.backend} ({describe_device()}); PyTorch "
          f"{'absent' if peer is None else peer[0].__version__ + ' on ' + peer[1]}; "
          f"median of {args.repeats}, float32")
    goals, agree = [], True
    tol = 2e-3

    ops, t_mine, t_torch, err = chain(args, sync, peer)
    line = f"chain of {ops} ops (4 x 4), forward + backward: minitx {t_mine * 1e6:.1f} µs/op"
    if t_torch is not None:
        line += (f", PyTorch {t_torch * 1e6:.1f} µs/op, minitx/PyTorch {t_mine / t_torch:.2f}x; "
                 f"gradients agree to {err:.1e}")
        agree &= err <= tol
    print(line)
    peer_dev = None if peer is None else peer[1]
    goals.append(_goal(f"engine per op (chain of {ops} tiny ops, fwd+bwd) on {args.backend}",
                       t_mine, t_torch, "µs/op", 1e6, peer_dev))

    for B, T, E, H in (QUICK_BLOCKS if args.quick else BLOCKS):
        t_mine, t_torch, err, decisions = mha_block(B, T, E, H, args, sync, peer)
        line = (f"causal MultiheadAttention B{B} T{T} E{E} H{H}, forward + backward: "
                f"minitx {t_mine * 1e3:.2f} ms")
        if t_torch is not None:
            line += (f", PyTorch {t_torch * 1e3:.2f} ms, minitx/PyTorch {t_mine / t_torch:.2f}x; "
                     f"output and gradients agree to {err:.1e}")
            agree &= err <= tol
        print(line)
        print(f"  attention dispatch in one call: {decisions}")
        goals.append(_goal(f"MultiheadAttention block causal B{B} T{T} E{E} H{H} fwd+bwd on "
                           f"{args.backend}", t_mine, t_torch, "ms", 1e3, peer_dev))
    for g in goals:
        print(g)
    if not agree:
        print(f"gpu_engine: minitx and PyTorch DISAGREE beyond {tol:.0e} (see above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
