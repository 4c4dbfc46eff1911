"""Engine benchmark: per-op overhead and a causal multi-head self-attention step (float32).

    python benchmarks/engine_bench.py [--repeats 7] [--chain 2000]

1. **Per-op overhead**: a chain of ``--chain`` tiny ops on (4, 4) tensors, alternating
   ``y = y * c`` and ``y = y + c``, then ``sum`` and backward. The arrays are so small that
   the time is almost entirely bookkeeping (graph recording, dispatch, the backward walk);
   reported as µs per op, forward + backward.
2. **Causal MHA**: B=4, T=256, C=256, H=8 (d=32): linear qkv, split heads, q kᵀ/√d, causal
   ``masked_fill`` with −inf, softmax, @ v, merge heads, output linear, sum; forward and
   backward to the input and all four parameters.

Every implementation computes the same thing: minitx, PyTorch (CPU, default thread count),
MyGrad and HIPS ``autograd`` when importable (benchmark peers only, not dependencies), and
a hand-written NumPy forward + backward (the floor: what the arithmetic costs with no
autograd at all). Times are medians of ``--repeats`` runs after a warm-up. Two ratio
columns: ``minitx / impl`` (above 1: minitx is slower than impl) and ``impl / torch``.
Before timing, every implementation's gradients are checked against the NumPy reference.

Timings on a shared machine are only meaningful when it is otherwise idle: the script
prints the 1-minute load average next to the core count so a reader can tell.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

import minitx.functional as F

B, T, C, H = 4, 256, 256, 8
D = C // H
DTYPE = np.float32


def median_time(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- optional peers --------------------------------------------------------------------------

def try_import(name):
    try:
        return __import__(name), None
    except Exception as exc:  # ImportError or a broken install
        return None, f"{type(exc).__name__}: {exc}"


torch, torch_err = try_import("torch")
mygrad, mygrad_err = try_import("mygrad")
if mygrad is not None:
    from mygrad.nnet.activations import softmax as mg_softmax
hips, hips_err = try_import("autograd")
if hips is not None:
    import autograd.numpy as anp


# ---- 1. per-op overhead: a chain of tiny ops ---------------------------------------------------

def chain_cases(n_ops: int):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((4, 4)).astype(DTYPE)
    c0 = (1 + 1e-3 * rng.standard_normal((4, 4))).astype(DTYPE)
    half = n_ops // 2
    cases = {}

    def run_minitx():
        x = minitx.tensor(x0, requires_grad=True)
        c = minitx.tensor(c0)
        y = x
        for _ in range(half):
            y = y * c
            y = y + c
        y.sum().backward()
        return x.grad.numpy()
    cases["minitx"] = run_minitx

    if torch is not None:
        def run_torch():
            x = torch.tensor(x0, requires_grad=True)
            c = torch.tensor(c0)
            y = x
            for _ in range(half):
                y = y * c
                y = y + c
            y.sum().backward()
            return x.grad.numpy()
        cases["torch"] = run_torch

    if mygrad is not None:
        def run_mygrad():
            x = mygrad.tensor(x0)
            c = c0
            y = x
            for _ in range(half):
                y = y * c
                y = y + c
            y.sum().backward()
            return np.asarray(x.grad)
        cases["mygrad"] = run_mygrad

    if hips is not None:
        def loss(x):
            y = x
            for _ in range(half):
                y = y * c0
                y = y + c0
            return anp.sum(y)
        grad_fn = hips.grad(loss)
        cases["autograd"] = lambda: grad_fn(x0)

    def run_numpy():
        # forward (keeping what the backward needs: nothing, c is constant), then backward
        y = x0
        for _ in range(half):
            y = y * c0
            y = y + c0
        g = np.ones_like(y)
        for _ in range(half):
            g = g * c0            # d(y + c)/dy = 1, d(y * c)/dy = c
        return g
    cases["numpy"] = run_numpy
    return cases


# ---- 2. causal multi-head self-attention ------------------------------------------------------

def mha_params(seed=0):
    rng = np.random.default_rng(seed)
    s = 1 / math.sqrt(C)
    return dict(x=rng.standard_normal((B, T, C)).astype(DTYPE),
                w_qkv=(rng.standard_normal((3 * C, C)) * s).astype(DTYPE),
                b_qkv=(rng.standard_normal(3 * C) * 0.1).astype(DTYPE),
                w_o=(rng.standard_normal((C, C)) * s).astype(DTYPE),
                b_o=(rng.standard_normal(C) * 0.1).astype(DTYPE))


CAUSAL = np.triu(np.ones((T, T), dtype=bool), k=1)      # True above the diagonal: masked
NAMES = ("x", "w_qkv", "b_qkv", "w_o", "b_o")


def mha_minitx(p):
    t = {k: minitx.tensor(v, requires_grad=True) for k, v in p.items()}
    mask = minitx.tensor(CAUSAL)
    qkv = F.linear(t["x"], t["w_qkv"], t["b_qkv"])                   # (B, T, 3C)
    qkv = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)         # (3, B, H, T, D)
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = (q @ k.swapaxes(-1, -2)) / math.sqrt(D)                     # (B, H, T, T)
    att = F.softmax(F.masked_fill(att, mask, -np.inf), -1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)             # merge heads
    out = F.linear(y, t["w_o"], t["b_o"]).sum()
    out.backward()
    return [t[k].grad.numpy() for k in NAMES]


def mha_minitx_sdpa(p):
    """minitx's own path (what nn.MultiheadAttention runs): one fused SDPA Function."""
    t = {k: minitx.tensor(v, requires_grad=True) for k, v in p.items()}
    qkv = F.linear(t["x"], t["w_qkv"], t["b_qkv"])                   # (B, T, 3C)
    qkv = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)         # (3, B, H, T, D)
    y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    out = F.linear(y.transpose(0, 2, 1, 3).reshape(B, T, C), t["w_o"], t["b_o"]).sum()
    out.backward()
    return [t[k].grad.numpy() for k in NAMES]


def mha_torch_sdpa(p):
    """PyTorch's own fused path (torch.nn.functional.scaled_dot_product_attention)."""
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    qkv = torch.nn.functional.linear(t["x"], t["w_qkv"], t["b_qkv"])
    qkv = qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    y = torch.nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    out = torch.nn.functional.linear(y.permute(0, 2, 1, 3).reshape(B, T, C), t["w_o"], t["b_o"]).sum()
    out.backward()
    return [t[k].grad.numpy() for k in NAMES]


def mha_torch(p):
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    mask = torch.from_numpy(CAUSAL)
    qkv = torch.nn.functional.linear(t["x"], t["w_qkv"], t["b_qkv"])
    qkv = qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    att = torch.softmax(att.masked_fill(mask, -math.inf), -1)
    y = (att @ v).permute(0, 2, 1, 3).reshape(B, T, C)
    out = torch.nn.functional.linear(y, t["w_o"], t["b_o"]).sum()
    out.backward()
    return [t[k].grad.numpy() for k in NAMES]


def mha_mygrad(p):
    t = {k: mygrad.tensor(v) for k, v in p.items()}
    qkv = mygrad.matmul(t["x"], mygrad.transpose(t["w_qkv"])) + t["b_qkv"]
    qkv = mygrad.transpose(qkv.reshape(B, T, 3, H, D), (2, 0, 3, 1, 4))
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = mygrad.matmul(q, mygrad.swapaxes(k, -1, -2)) / np.float32(math.sqrt(D))
    att = mygrad.where(CAUSAL, np.float32(-np.inf), att)
    att = mg_softmax(att, axis=-1)
    y = mygrad.transpose(mygrad.matmul(att, v), (0, 2, 1, 3)).reshape(B, T, C)
    out = (mygrad.matmul(y, mygrad.transpose(t["w_o"])) + t["b_o"]).sum()
    out.backward()
    return [np.asarray(t[k].grad) for k in NAMES]


def _hips_loss(x, w_qkv, b_qkv, w_o, b_o):
    qkv = anp.matmul(x, w_qkv.T) + b_qkv
    qkv = anp.transpose(anp.reshape(qkv, (B, T, 3, H, D)), (2, 0, 3, 1, 4))
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = anp.matmul(q, anp.swapaxes(k, -1, -2)) / np.float32(math.sqrt(D))
    att = anp.where(CAUSAL, np.float32(-np.inf), att)
    e = anp.exp(att - anp.max(att, axis=-1, keepdims=True))
    att = e / anp.sum(e, axis=-1, keepdims=True)
    y = anp.reshape(anp.transpose(anp.matmul(att, v), (0, 2, 1, 3)), (B, T, C))
    return anp.sum(anp.matmul(y, w_o.T) + b_o)


def mha_hips(p, _grad=[None]):
    if _grad[0] is None:
        _grad[0] = hips.grad(_hips_loss, argnum=(0, 1, 2, 3, 4))
    return list(_grad[0](*[p[k] for k in NAMES]))


def mha_numpy(p):
    """Forward and backward by hand: the cost of the arithmetic alone."""
    x, w_qkv, b_qkv, w_o, b_o = (p[k] for k in NAMES)
    x2 = x.reshape(B * T, C)
    qkv = x2 @ w_qkv.T + b_qkv                                        # (BT, 3C)
    heads = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)       # (3, B, H, T, D)
    q, k, v = heads[0], heads[1], heads[2]
    scale = np.float32(1 / math.sqrt(D))
    s = (q @ k.swapaxes(-1, -2)) * scale
    s[..., CAUSAL] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    a = np.exp(s, out=s)
    a /= a.sum(axis=-1, keepdims=True)
    y = (a @ v).transpose(0, 2, 1, 3).reshape(B * T, C)
    # out = sum(y W_oᵀ + b_o): dout = 1
    g_out = np.ones((B * T, C), dtype=DTYPE)
    d_bo = g_out.sum(axis=0)
    d_wo = g_out.T @ y
    d_y = (g_out @ w_o).reshape(B, T, H, D).transpose(0, 2, 1, 3)     # (B, H, T, D)
    d_v = a.swapaxes(-1, -2) @ d_y
    d_a = d_y @ v.swapaxes(-1, -2)
    d_s = a * (d_a - (d_a * a).sum(axis=-1, keepdims=True))           # softmax backward
    d_s *= scale                                                      # masked entries: a = 0
    d_q = d_s @ k
    d_k = d_s.swapaxes(-1, -2) @ q
    d_heads = np.stack([d_q, d_k, d_v])                               # (3, B, H, T, D)
    d_qkv = d_heads.transpose(1, 3, 0, 2, 4).reshape(B * T, 3 * C)
    d_bqkv = d_qkv.sum(axis=0)
    d_wqkv = d_qkv.T @ x2
    d_x = (d_qkv @ w_qkv).reshape(B, T, C)
    return [d_x, d_wqkv, d_bqkv, d_wo, d_bo]


def mha_cases():
    cases = {"minitx": mha_minitx, "minitx-sdpa": mha_minitx_sdpa}
    if torch is not None:
        cases["torch"] = mha_torch
        cases["torch-sdpa"] = mha_torch_sdpa
    if mygrad is not None:
        cases["mygrad"] = mha_mygrad
    if hips is not None:
        cases["autograd"] = mha_hips
    cases["numpy"] = mha_numpy
    return cases


# ---- report ----------------------------------------------------------------------------------

def check_agreement(results, rtol=2e-3, atol=2e-3):
    """Every implementation must produce the same gradients (else the timing is meaningless)."""
    ref = results["numpy"]
    for name, grads in results.items():
        for g, r in zip(grads, ref):
            g = np.asarray(g, dtype=np.float64)
            if g.shape != r.shape or not np.allclose(g, r, rtol=rtol, atol=atol * np.abs(r).max()):
                raise AssertionError(f"{name}: gradients differ from the NumPy reference")


def table(title, times, unit_scale, unit, per):
    print(f"\n{title}")
    base = times.get("torch")
    print(f"  {'impl':<11} {unit:>11}   {'minitx / impl':>14}   {'impl / torch':>12}")
    for name, t in times.items():
        vs_torch = f"{t / base:11.2f}x" if base else "        n/a"
        print(f"  {name:<11} {t * unit_scale / per:11.2f}   {times['minitx'] / t:13.2f}x   {vs_torch}")


def main(argv=None):
    minitx.fast.host.tune_host_allocator()     # measured with the caching host allocator on
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chain", type=int, default=2000)
    args = ap.parse_args(argv)

    print(f"minitx {minitx.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    from importlib.metadata import PackageNotFoundError, version
    for name, mod, err in (("torch", torch, torch_err), ("mygrad", mygrad, mygrad_err),
                           ("autograd", hips, hips_err)):
        if mod is None:
            print(f"  skipping {name}: not importable ({err})")
            continue
        try:
            print(f"  {name} {version(name)}")
        except PackageNotFoundError:
            print(f"  {name} (version unknown)")
    if torch is not None:
        print(f"  torch threads: {torch.get_num_threads()}")
    if hasattr(os, "getloadavg"):
        print(f"  load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"float32, median of {args.repeats} runs after a warm-up")

    cases = chain_cases(args.chain)
    results = {k: [np.asarray(f())] for k, f in cases.items()}
    check_agreement(results, rtol=1e-4, atol=1e-4)
    times = {k: median_time(f, args.repeats) for k, f in cases.items()}
    table(f"Per-op overhead: chain of {args.chain} ops on (4, 4), forward + backward",
          times, 1e6, "µs/op", args.chain)
    overhead = times["minitx"] * 1e6 / args.chain

    p = mha_params()
    cases = mha_cases()
    results = {k: f(p) for k, f in cases.items()}
    check_agreement(results)
    times = {k: median_time(lambda f=f: f(p), args.repeats) for k, f in cases.items()}
    table(f"Causal MHA B={B} T={T} C={C} H={H}, forward + backward", times, 1e3, "ms", 1)

    print("\nTargets: overhead <= 9 µs/op: "
          f"{'met' if overhead <= 9 else 'MISSED'} ({overhead:.2f})")
    if "torch" in times:
        for mine, theirs in (("minitx", "torch"), ("minitx-sdpa", "torch"),
                             ("minitx-sdpa", "torch-sdpa")):
            ratio = times[mine] / times[theirs]
            print(f"  MHA {mine} / {theirs}: {ratio:.2f}x "
                  f"({'met' if ratio <= 1.0 else 'MISSED'} the <= 1.0x target)")


if __name__ == "__main__":
    main()
