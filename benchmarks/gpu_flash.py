"""Benchmark the hand-written CUDA flash-attention kernel on a GPU.

Compares, for forward and forward+backward:
  * minitx flash kernel (minitx.backend.flash_cuda, NVRTC-compiled via CuPy),
  * CuPy dense attention (cuBLAS matmuls + a softmax; materialises the N x N scores),
  * PyTorch scaled_dot_product_attention, if torch with CUDA is installed.
Sweeps N = 512 .. 16384, D = 64 and 128, fp32 and fp16, causal and not. Reports the median
time, TFLOP/s (forward 4*B*H*N^2*D, halved for causal; backward counted as 2.5x forward, so
forward+backward = 3.5x) and the ratios to the flash kernel.

    python benchmarks/gpu_flash.py                 # full sweep
    python benchmarks/gpu_flash.py --quick         # N in {512, 2048}, D = 64
    python benchmarks/gpu_flash.py --n 4096 --d 128 --dtype float16 --causal

Exits with status 2 and a clear message when no GPU/CuPy is available. Dense attention that
would not fit in memory (N x N scores) is reported as "oom" and skipped.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys


def _flops(B, H, N, D, causal, backward):
    f = 4.0 * B * H * N * N * D
    if causal:
        f /= 2
    return f * (3.5 if backward else 1.0)


def _timeit(cp, fn, repeat, warmup=2):
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(ts)


def _dense(cp, q, k, v, causal, scale, do=None):
    """Dense attention with CuPy (cuBLAS); with ``do`` also the manual backward."""
    s = cp.matmul(q, k.swapaxes(-1, -2)).astype(cp.float32) * scale
    if causal:
        n, m = s.shape[-2:]
        i = cp.arange(n)[:, None]
        j = cp.arange(m)[None, :]
        s = cp.where(j <= i + (m - n), s, -cp.inf)
    s -= s.max(-1, keepdims=True)
    p = cp.exp(s)
    p /= p.sum(-1, keepdims=True)
    pc = p.astype(q.dtype)
    o = cp.matmul(pc, v)
    if do is None:
        return o
    dv = cp.matmul(pc.swapaxes(-1, -2), do)
    dp = cp.matmul(do, v.swapaxes(-1, -2)).astype(cp.float32)
    ds = (p * (dp - (dp * p).sum(-1, keepdims=True))).astype(q.dtype)
    dq = cp.matmul(ds, k) * scale
    dk = cp.matmul(ds.swapaxes(-1, -2), q) * scale
    return o, dq, dk, dv


def _torch_sdpa():
    try:
        import torch
        import torch.nn.functional as F
        if not torch.cuda.is_available():
            return None
        return torch, F
    except Exception:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--dtype", nargs="*", default=["float32", "float16"])
    ap.add_argument("--causal", action="store_true", help="only causal (default: both)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-backward", action="store_true")
    args = ap.parse_args(argv)

    from minitx.backend import cupy_or_none, flash_cuda
    cp = cupy_or_none()
    if cp is None or not flash_cuda.is_available():
        print("gpu_flash: no usable GPU (needs CuPy with a CUDA device and NVRTC); nothing to "
              "benchmark. The kernels are still checked without a GPU by tests/cuda.",
              file=sys.stderr)
        return 2
    if args.quick:
        args.n, args.d = [512, 2048], [64]
    causals = [True] if args.causal else [False, True]
    torch_mod = _torch_sdpa()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"device: {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}"
          f"  torch SDPA: {'yes' if torch_mod else 'no'}")
    hdr = (f"{'pass':8s} {'dtype':7s} {'D':>4s} {'N':>6s} {'causal':6s} {'flash ms':>9s} "
           f"{'TFLOP/s':>8s} {'dense ms':>9s} {'dense/flash':>11s} {'sdpa ms':>8s} {'sdpa/flash':>10s}")
    print(hdr)
    B, H = args.batch, args.heads
    free_mem = dev.mem_info[0]
    for dt in args.dtype:
        for D in args.d:
            for N in args.n:
                for causal in causals:
                    rs = cp.random.RandomState(0)
                    q, k, v, do = (rs.standard_normal((B, H, N, D), dtype=cp.float32).astype(dt)
                                   for _ in range(4))
                    scale = 1.0 / math.sqrt(D)
                    passes = [("fwd", False)] + ([] if args.no_backward else [("fwd+bwd", True)])
                    for label, bwd in passes:
                        if bwd:
                            o, lse = flash_cuda.flash_attention_forward(q, k, v, causal=causal)

                            def flash():
                                o2, l2 = flash_cuda.flash_attention_forward(q, k, v, causal=causal)
                                flash_cuda.flash_attention_backward(q, k, v, o2, l2, do, causal=causal)
                        else:
                            def flash():
                                flash_cuda.flash_attention_forward(q, k, v, causal=causal)
                        t_flash = _timeit(cp, flash, args.repeat)
                        tflops = _flops(B, H, N, D, causal, bwd) / t_flash / 1e12
                        dense_bytes = B * H * N * N * 4 * (4 if bwd else 2)
                        if dense_bytes < 0.6 * free_mem:
                            t_dense = _timeit(cp, lambda: _dense(cp, q, k, v, causal, scale,
                                                                 do if bwd else None), args.repeat)
                            dense_s = f"{t_dense * 1e3:9.3f} {t_dense / t_flash:11.2f}"
                        else:
                            dense_s = f"{'oom':>9s} {'-':>11s}"
                        sdpa_s = f"{'-':>8s} {'-':>10s}"
                        if torch_mod is not None:
                            torch, F = torch_mod
                            tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, do))
                            if bwd:
                                tq, tk, tv = (x.detach().requires_grad_(True) for x in (tq, tk, tv))

                            def sdpa():
                                out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                                if bwd:
                                    out.backward(tdo)
                            try:
                                t_sdpa = _timeit(cp, sdpa, args.repeat)
                                sdpa_s = f"{t_sdpa * 1e3:8.3f} {t_sdpa / t_flash:10.2f}"
                            except Exception as exc:  # e.g. OOM for the math fallback
                                sdpa_s = f"{'err':>8s} {type(exc).__name__[:10]:>10s}"
                        print(f"{label:8s} {dt:7s} {D:4d} {N:6d} {str(causal):6s} "
                              f"{t_flash * 1e3:9.3f} {tflops:8.2f} {dense_s} {sdpa_s}", flush=True)
                    del q, k, v, do
                    cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
