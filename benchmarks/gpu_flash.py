"""Build, check and benchmark minitx's hand-written CUDA flash-attention kernels on a GPU.

One command on a GPU machine does all three:

    python benchmarks/gpu_flash.py --check

1. build: compiles every kernel instantiation with NVRTC (the fp16 tensor-core kernels *_tc and
   the fp32 CUDA-core kernels *_simt, D = 32/64/128, causal or not) and prints the compile time;
2. check (``--check``): runs each kernel family against a float64 PyTorch reference on the GPU
   (ragged N, Nq != Nk causal with bottom-right alignment, GQA/MQA, padded D, Dv != D, lengths,
   key masks, fully masked rows) and prints the max errors of O, lse, dQ, dK, dV next to PyTorch's
   own SDPA error at the same dtype; a case fails when the kernel's error exceeds twice PyTorch's
   (plus a small floor) or anything is non-finite; the process exits 1 if any case fails;
3. benchmark: for N = 512 .. 16384, D = 64/128, fp16/fp32, causal or not, forward and
   forward+backward, the median time and TFLOP/s of the kernel, of CuPy dense attention (cuBLAS
   matmuls + softmax, N x N scores) and of PyTorch SDPA (flash backend for fp16 via
   ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``; PyTorch has no fp32 flash
   kernel, so fp32 uses its memory-efficient backend), and the ratios kernel/PyTorch and
   kernel/dense in throughput (> 1: the kernel is faster).

FLOPs follow the FlashAttention papers: forward 4 B H N^2 D (halved when causal), forward +
backward 3.5x that. Batch: B = max(1, 16384 // N), H = 16 (16K tokens per batch, like the H100
evidence run: N = 4096 -> B = 4, N = 16384 -> B = 1).

    python benchmarks/gpu_flash.py --check-only       # build + correctness, no timing
    python benchmarks/gpu_flash.py --quick            # N in {1024, 4096}, D = 64
    python benchmarks/gpu_flash.py --n 4096 --d 128 --dtype float16 --causal

Exits with status 2 and the reason when no GPU/CuPy/NVRTC is usable; ``--help`` needs neither.
Dense attention whose N x N scores would not fit in memory is reported as "oom".
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time


# ------------------------------------------------------------------ helpers
def _flops(B, H, N, D, causal, backward):
    f = 4.0 * B * H * N * N * D
    if causal:
        f /= 2
    return f * (3.5 if backward else 1.0)


def _timeit(cp, fn, repeat, warmup=3):
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


def _torch():
    """(torch, F, sdpa_kernel, SDPBackend) or None when torch with CUDA is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:          # torch < 2.3: no backend selection, default dispatch
        SDPBackend = sdpa_kernel = None
    return torch, F, sdpa_kernel, SDPBackend


def _sdpa_context(tm, dtype):
    """The PyTorch backend the benchmark compares with, as (context manager factory, name)."""
    import contextlib
    torch, F, sdpa_kernel, SDPBackend = tm
    if sdpa_kernel is None:
        return contextlib.nullcontext, "default"
    if dtype == "float16":
        return (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)), "flash"
    return (lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)), "efficient"


# ------------------------------------------------------------------ 1. build
def build(flash_cuda):
    """Compile every instantiation with NVRTC (one module per dtype/D/causal); returns ok."""
    ok = True
    t0 = time.perf_counter()
    for dt in ("float16", "float32"):
        for D in flash_cuda.SUPPORTED_HEAD_DIMS:
            for causal in (False, True):
                t = time.perf_counter()
                try:
                    mod = flash_cuda._module(dt, D, causal)
                    for kind in ("fwd", "bwd_dkdv", "bwd_dq", "bwd_dot"):
                        mod.get_function(flash_cuda.kernel_name(kind, dt, D, causal))
                    status = "ok"
                except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                    ok = False
                    status = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
                print(f"  build {flash_cuda.family(dt):4s} {dt:7s} D={D:3d} causal={causal!s:5s} "
                      f"{time.perf_counter() - t:6.2f}s {status}", flush=True)
    print(f"build: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f}s")
    return ok


# ------------------------------------------------------------------ 2. check
# (name, B, H, Hkv, Nq, Nk, D, Dv, causal, masking)
CHECK_CASES = [
    ("square", 2, 4, 4, 257, 257, 64, 64, False, None),
    ("square causal", 2, 4, 4, 300, 300, 64, 64, True, None),
    ("Nq<<Nk causal (evidence)", 1, 2, 2, 5, 300, 64, 64, True, None),
    ("Nq>>Nk causal, empty rows", 1, 2, 2, 300, 5, 64, 64, True, None),
    ("decode Nq=1", 2, 8, 2, 1, 1000, 128, 128, True, None),
    ("GQA 8/2 causal", 1, 8, 2, 513, 513, 128, 128, True, None),
    ("MQA 4/1", 1, 4, 1, 333, 129, 32, 32, False, None),
    ("padded D=48 causal", 2, 2, 2, 100, 140, 48, 48, True, None),
    ("Dv != D", 1, 2, 2, 70, 90, 40, 96, False, None),
    ("lengths", 3, 2, 2, 200, 200, 64, 64, False, "lengths"),
    ("key mask + causal", 2, 2, 2, 150, 150, 64, 64, True, "mask"),
    ("fully masked batch", 2, 2, 2, 64, 80, 32, 32, False, "zero_length"),
    ("long causal", 1, 4, 4, 2048, 2048, 128, 128, True, None),
]


def _reference(torch, q, k, v, do, keep, scale):
    """float64 attention with autograd; rows without a kept key -> o = 0, lse = -inf, zero grads."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    do = do.double()
    G = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = (q @ ke.transpose(-1, -2)) * scale
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    o = (p / torch.where(l > 0, l, torch.ones_like(l))) @ ve
    lse = torch.where(l > 0, m + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                      torch.full_like(l, float("-inf")))[..., 0]
    o.backward(do)
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def _keep_mask(torch, B, Nq, Nk, causal, key_mask, lengths, device, top_left=False):
    keep = torch.ones((B, 1, Nq, Nk), dtype=torch.bool, device=device)
    j = torch.arange(Nk, device=device)
    if lengths is not None:
        keep &= (j[None, :] < lengths[:, None])[:, None, None, :]
    if key_mask is not None:
        keep &= key_mask[:, None, None, :]
    if causal:
        i = torch.arange(Nq, device=device)
        off = 0 if top_left else Nk - Nq
        keep &= (j[None, :] <= i[:, None] + off)[None, None]
    return keep


def _max_err(torch, got, ref):
    got, ref = got.double(), ref.double()
    fin = torch.isfinite(ref)
    if not bool(torch.equal(torch.isfinite(got), fin)):
        return float("inf")
    if not bool(fin.any()):
        return 0.0
    return float((got[fin] - ref[fin]).abs().max())


def check(cp, flash_cuda, tm, device="cuda", cases=None):
    """Every kernel family against the float64 reference; returns True when all cases pass.
    (``device``/``cases`` exist so the check itself can be dry-run on the CPU with emulated
    kernels; a real run uses the defaults.)"""
    if tm is None:
        print("check: needs PyTorch with CUDA for the float64 reference (pip install torch)")
        return False
    torch, F = tm[0], tm[1]
    dev = torch.device(device)
    all_ok = True
    print(f"{'case':28s} {'dtype':7s} {'err O':>9s} {'lse':>9s} {'dQ':>9s} {'dK':>9s} {'dV':>9s} "
          f"{'torch O':>9s} {'torch dQ':>9s} {'torch dK':>9s} {'torch dV':>9s}  result")
    for dtype in ("float16", "float32"):
        tdt = getattr(torch, dtype)
        for (name, B, H, Hkv, Nq, Nk, D, Dv, causal, masking) in (cases or CHECK_CASES):
            g = torch.Generator(device=dev).manual_seed(0)
            q = torch.randn(B, H, Nq, D, device=dev, generator=g).to(tdt)
            k = torch.randn(B, Hkv, Nk, D, device=dev, generator=g).to(tdt)
            v = torch.randn(B, Hkv, Nk, Dv, device=dev, generator=g).to(tdt)
            do = torch.randn(B, H, Nq, Dv, device=dev, generator=g).to(tdt)
            lengths = key_mask = None
            if masking == "lengths":
                lengths = torch.tensor([Nk, Nk // 2, 1][:B], device=dev, dtype=torch.int32)
            if masking == "zero_length":
                lengths = torch.tensor([0] + [Nk - 3] * (B - 1), device=dev, dtype=torch.int32)
            if masking == "mask":
                key_mask = torch.rand(B, Nk, device=dev, generator=g) < 0.7
                key_mask[:, -1] = True
            scale = 1.0 / math.sqrt(D)
            keep = _keep_mask(torch, B, Nq, Nk, causal, key_mask, lengths, dev)
            ref = _reference(torch, q, k, v, do, keep, scale)

            cq, ck, cv, cdo = (cp.from_dlpack(x.contiguous()) for x in (q, k, v, do))
            ckm = None if key_mask is None else cp.from_dlpack(key_mask.to(torch.uint8))
            cln = None if lengths is None else cp.from_dlpack(lengths)
            o, lse = flash_cuda.flash_attention_forward(cq, ck, cv, causal=causal, key_mask=ckm,
                                                        lengths=cln)
            dq, dk, dv = flash_cuda.flash_attention_backward(cq, ck, cv, o, lse, cdo, causal=causal,
                                                             key_mask=ckm, lengths=cln)
            got = [torch.from_dlpack(x) for x in (o, lse, dq, dk, dv)]
            errs = [_max_err(torch, a, b) for a, b in zip(got, ref)]

            # PyTorch's own error at this dtype (same mask; GQA expanded; NaN rows ignored)
            G = H // Hkv
            tq, tk, tv = (x.detach().clone().requires_grad_(True) for x in
                          (q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)))
            to = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=keep, scale=scale)
            to.backward(do)
            to = to.detach()
            tdk = tk.grad.reshape(B, Hkv, G, Nk, D).sum(2)
            tdv = tv.grad.reshape(B, Hkv, G, Nk, Dv).sum(2)
            rows = keep.any(-1, keepdim=True).expand(B, H, Nq, 1)
            terr = []
            for a, b in ((to, ref[0]), (tq.grad, ref[2]), (tdk, ref[3]), (tdv, ref[4])):
                a = torch.nan_to_num(a.double(), nan=0.0)
                if a.shape == b.shape and a.shape[2] == Nq:
                    a = torch.where(rows, a, b)      # rows PyTorch fills with NaN: not its error
                terr.append(float((a - b).abs().max()))

            floor = (1e-5 if dtype == "float32" else 1e-3)
            mags = [float(x[torch.isfinite(x)].abs().max()) if bool(torch.isfinite(x).any()) else 0.0
                    for x in ref]
            tol = [2 * terr[0] + floor * max(1, mags[0]), 1e-4 * max(1, mags[1]),
                   2 * terr[1] + floor * max(1, mags[2]), 2 * terr[2] + floor * max(1, mags[3]),
                   2 * terr[3] + floor * max(1, mags[4])]
            ok = all(e <= t for e, t in zip(errs, tol))
            all_ok &= ok
            print(f"{name:28s} {dtype:7s} " + " ".join(f"{e:9.2e}" for e in errs) + " "
                  + " ".join(f"{e:9.2e}" for e in terr) + f"  {'ok' if ok else 'FAIL'}", flush=True)
            if name.startswith("Nq<<Nk"):
                tl = _keep_mask(torch, B, Nq, Nk, causal, key_mask, lengths, dev, top_left=True)
                o_tl = _reference(torch, q, k, v, do, tl, scale)[0]
                print(f"{'':28s} (vs a top-left reference, i.e. PyTorch is_causal=True: max O "
                      f"difference {_max_err(torch, got[0], o_tl):.2f}: the H100 report's 'bug')")
    print(f"check: {'all cases pass' if all_ok else 'SOME CASES FAIL'}")
    return all_ok


# ------------------------------------------------------------------ 3. benchmark
def benchmark(cp, flash_cuda, tm, args):
    dev = cp.cuda.Device()
    hdr = (f"{'pass':8s} {'dtype':7s} {'D':>4s} {'N':>6s} {'B':>3s} {'causal':6s} {'minitx ms':>10s} "
           f"{'TF/s':>7s} {'dense ms':>9s} {'x dense':>7s} {'torch ms':>9s} {'TF/s':>7s} "
           f"{'backend':9s} {'x torch':>7s}")
    print(hdr)
    H = args.heads
    for dt in args.dtype:
        for D in args.d:
            for N in args.n:
                B = args.batch or max(1, args.tokens // N)
                for causal in ([True] if args.causal else [False, True]):
                    rs = cp.random.RandomState(0)
                    q, k, v, do = (rs.standard_normal((B, H, N, D), dtype=cp.float32).astype(dt)
                                   for _ in range(4))
                    scale = 1.0 / math.sqrt(D)
                    passes = [("fwd", False)] + ([] if args.no_backward else [("fwd+bwd", True)])
                    for label, bwd in passes:
                        if bwd:
                            def mine():
                                o2, l2 = flash_cuda.flash_attention_forward(q, k, v, causal=causal)
                                flash_cuda.flash_attention_backward(q, k, v, o2, l2, do, causal=causal)
                        else:
                            def mine():
                                flash_cuda.flash_attention_forward(q, k, v, causal=causal)
                        t_mine = _timeit(cp, mine, args.repeat)
                        fl = _flops(B, H, N, D, causal, bwd)
                        dense_bytes = B * H * N * N * 4 * (4 if bwd else 2)
                        if dense_bytes < 0.6 * dev.mem_info[0]:
                            t_dense = _timeit(cp, lambda: _dense(cp, q, k, v, causal, scale,
                                                                 do if bwd else None), args.repeat)
                            dense_s = f"{t_dense * 1e3:9.3f} {t_dense / t_mine:7.2f}"
                        else:
                            dense_s = f"{'oom':>9s} {'-':>7s}"
                        torch_s = f"{'-':>9s} {'-':>7s} {'-':9s} {'-':>7s}"
                        if tm is not None:
                            torch, F = tm[0], tm[1]
                            ctx, backend = _sdpa_context(tm, dt)
                            tq, tk, tv, tdo = (torch.from_dlpack(x) for x in (q, k, v, do))
                            if bwd:
                                tq, tk, tv = (x.detach().requires_grad_(True) for x in (tq, tk, tv))

                            def sdpa():
                                with ctx():
                                    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                                if bwd:
                                    out.backward(tdo)
                            try:
                                t_t = _timeit(cp, sdpa, args.repeat)
                                torch_s = (f"{t_t * 1e3:9.3f} {fl / t_t / 1e12:7.1f} {backend:9s} "
                                           f"{t_t / t_mine:7.2f}")
                            except RuntimeError as exc:   # no kernel for this backend/shape, OOM
                                torch_s = f"{'err':>9s} {'-':>7s} {backend:9s} {type(exc).__name__[:7]:>7s}"
                        print(f"{label:8s} {dt:7s} {D:4d} {N:6d} {B:3d} {str(causal):6s} "
                              f"{t_mine * 1e3:10.3f} {fl / t_mine / 1e12:7.1f} {dense_s} {torch_s}",
                              flush=True)
                    del q, k, v, do
                    cp.get_default_memory_pool().free_all_blocks()


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Build, check (--check) and benchmark minitx's CUDA flash-attention kernels.",
        epilog="One command on a GPU: python benchmarks/gpu_flash.py --check")
    ap.add_argument("--check", action="store_true",
                    help="run the correctness check against a float64 PyTorch reference first")
    ap.add_argument("--check-only", action="store_true", help="build + check, no benchmark")
    ap.add_argument("--n", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--dtype", nargs="*", default=["float16", "float32"])
    ap.add_argument("--causal", action="store_true", help="only causal (default: both)")
    ap.add_argument("--batch", type=int, default=0, help="B (default: 16384 // N tokens)")
    ap.add_argument("--tokens", type=int, default=16384, help="B * N when --batch is not given")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="N in {1024, 4096}, D = 64")
    ap.add_argument("--no-backward", action="store_true")
    args = ap.parse_args(argv)

    from minitx.backend import cupy_or_none, flash_cuda
    why = flash_cuda.unavailable_reason()
    if why is not None:
        print(f"gpu_flash: no usable GPU ({why}); nothing to build, check or benchmark. The "
              "kernels are still checked without a GPU by `python -m pytest tests/cuda`.",
              file=sys.stderr)
        return 2
    cp = cupy_or_none()
    if args.quick:
        args.n, args.d = [1024, 4096], [64]
    tm = _torch()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"device: {name} (sm_{dev.compute_capability}), CuPy {cp.__version__}, torch "
          f"{tm[0].__version__ if tm else 'not available (no SDPA columns, no --check)'}")
    if not build(flash_cuda):
        return 1
    if args.check or args.check_only:
        if not check(cp, flash_cuda, tm):
            return 1
        if args.check_only:
            return 0
    benchmark(cp, flash_cuda, tm, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
