"""Build, check and benchmark minitx's hand-written CUDA flash-attention kernels on a GPU.

One command on a GPU machine does all three:

    python benchmarks/gpu_flash.py --check

1. build: compiles every kernel instantiation of every family in ``KERNEL_FAMILIES`` with NVRTC
   (the fp16 tensor-core kernels *_tc, the fp32 CUDA-core kernels *_simt, the naive kernels
   *_naive, the fp32 3xTF32 tensor-core kernels *_tf32 and the fp16 levers *_tc_bm128,
   *_tc_kvreg, *_tc_onepass, D = 32/64/128, causal or not) and prints the compile time;
   ``--jobs`` processes compile the modules at once
   first, into CuPy's kernel cache, so the build itself then mostly loads them;
2. check (``--check``): runs each kernel family against a float64 PyTorch reference on the GPU
   (ragged N, Nq != Nk causal with bottom-right alignment, GQA/MQA, D = 32/48/64/80/128 and
   Dv != D, lengths, key masks, fully masked rows and batches) and prints the max errors of O,
   lse, dQ, dK, dV next to PyTorch's own SDPA error at the same dtype. FlashAttention's rule: a
   case fails when the kernel's error exceeds twice PyTorch's (plus a small floor: 1e-3 of the
   reference's magnitude in fp16, 1e-5 in fp32) or anything is non-finite. A ``GOAL`` line
   gives the 3xTF32 family's dK and dV errors at Nq = Nk = 2048, D = 128 causal (its long
   accumulation loops) against PyTorch's own under that rule;
3. benchmark: for N = 512 .. 16384, D = 64/128, each family, causal or not, forward and
   forward+backward, the median time and TFLOP/s of the kernel, of CuPy dense attention (cuBLAS
   matmuls + softmax, N x N scores) and of PyTorch SDPA (flash backend for fp16 via
   ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``; PyTorch has no fp32 flash
   kernel, so fp32 uses its memory-efficient backend), and the ratios kernel/PyTorch and
   kernel/dense in throughput (> 1: the kernel is faster). N = 4096 runs first, and the run ends
   with one ``GOAL`` line per target: fp16 forward+backward at N = 4096, D = 64 and 128, as a
   percentage of PyTorch's flash SDPA throughput (goal >= 80 %) for the best fp16 family (tc or
   one of the levers; the line names each one's percentage), and fp32 as a multiple of
   PyTorch's fp32 memory-efficient SDPA (goal >= 1.0x) for the best float32 family (the
   faster of the 3xTF32 and the CUDA-core kernels; the line names both).

FLOPs follow the FlashAttention papers: forward 4 B H N^2 D (halved when causal), forward +
backward 3.5x that. Batch: B = max(1, 16384 // N), H = 16 (16K tokens per batch: N = 4096 ->
B = 4, N = 16384 -> B = 1).

    python benchmarks/gpu_flash.py --check-only       # build + correctness, no timing
    python benchmarks/gpu_flash.py --quick            # N in {1024, 4096}, D = 64
    python benchmarks/gpu_flash.py --n 4096 --d 128 --dtype float16 --causal
    python benchmarks/gpu_flash.py --check --keep-going --budget 40   # what gpu_run.py runs
    python benchmarks/gpu_flash.py --smoke            # one small forward + backward per family
                                                      # (no PyTorch; for compute-sanitizer)

``--budget SECONDS`` stops starting benchmark rows once that many seconds have passed since the
script started (the rows not run are listed); ``--keep-going`` runs the check and the benchmark
even after a build or check failure (the exit status is still 1). ``--smoke`` turns CuPy's
memory pool off, so that every array is its own allocation and memcheck sees its real bounds.

Exits with status 2 and the reason when no GPU/CuPy/NVRTC is usable; ``--help`` needs neither.
Dense attention whose N x N scores would not fit in memory is reported as "oom".
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

# The kernel families every part of this script runs: (family, dtype, environment while it
# runs). A family the launcher selects through the environment is one more row here, e.g.
# ("naive", "float32", {"MINITX_FLASH_KERNEL": "naive"}) where the launcher has that choice.
KERNEL_FAMILIES = [
    ("tc", "float16", {}),        # fp16 on the tensor cores (mma.sync, ldmatrix, cp.async)
    ("simt", "float32", {}),      # fp32 register-tiled, CUDA cores
    ("naive", "float32", {"MINITX_FLASH_KERNEL": "naive"}),   # one thread per row: read first
    ("tf32", "float32", {"MINITX_FLASH_KERNEL": "tf32"}),     # fp32 on the tensor cores, 3xTF32
    # the fp16 levers: tc with one kernel replaced (flash_cuda.LEVERS), each timed on its own
    ("tc_bm128", "float16", {"MINITX_FLASH_KERNEL": "tc_bm128"}),      # fwd: 2 m-tiles a warp
    ("tc_kvreg", "float16", {"MINITX_FLASH_KERNEL": "tc_kvreg"}),      # dK/dV: K, V in registers
    ("tc_onepass", "float16", {"MINITX_FLASH_KERNEL": "tc_onepass"}),  # dQ by atomics, no dQ pass
]
TILED = ("tc", "simt")            # the families the launcher picks by dtype alone
KINDS = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_dot")

GOAL_N = 4096
# (families, D, what the ratio is, goal); each is printed for causal False and True. A goal is
# met by the best family of its dtype: fp16 by the fastest of the tc kernels and the levers,
# fp32 by the faster of the 3xTF32 tensor-core kernels and the CUDA-core kernels the launcher
# picks by default (the line names each one's ratio).
GOALS = [
    (("tc", "tc_bm128", "tc_kvreg", "tc_onepass"), 64, "pct", 0.80),
    (("tc", "tc_bm128", "tc_kvreg", "tc_onepass"), 128, "pct", 0.80),
    (("tf32", "simt"), 64, "times", 1.0),
    (("tf32", "simt"), 128, "times", 1.0),
]
# The order in which the benchmark measures the families at N = GOAL_N, so that a budget that
# runs out leaves out the least needed: tc and tf32 first (the fp16 baseline, and the fp32
# kernels never timed before), then the levers, then the CUDA-core kernels (timed on the first
# hardware run).
GOAL_FAMILIES = ("tc", "tf32", "tc_bm128", "tc_onepass", "tc_kvreg", "simt")


# ------------------------------------------------------------------ helpers
def _flops(B, H, N, D, causal, backward):
    f = 4.0 * B * H * N * N * D
    if causal:
        f /= 2
    return f * (3.5 if backward else 1.0)


@contextlib.contextmanager
def family_env(env):
    """Set ``env`` (a family's environment, e.g. the launcher's kernel choice) while inside."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def select_families(names=None, dtypes=None):
    """The rows of ``KERNEL_FAMILIES`` named in ``names`` / of a dtype in ``dtypes`` (None: all)."""
    out = [f for f in KERNEL_FAMILIES
           if (names is None or f[0] in names) and (dtypes is None or f[1] in dtypes)]
    if not out:
        raise SystemExit(f"gpu_flash: no kernel family matches --family {names} --dtype {dtypes} "
                         f"(families: {[f[:2] for f in KERNEL_FAMILIES]})")
    return out


class CudaTiming:
    """What the benchmark needs from the GPU: random device arrays, CUDA-event timing, free
    memory. (The CPU dry run of ``benchmarks/gpu_run.py`` passes a host twin of this class.)"""

    def __init__(self, cp):
        self.xp = self.cp = cp

    def randn(self, shapes, dtype, seed=0):
        rs = self.cp.random.RandomState(seed)
        return [rs.standard_normal(s, dtype=self.cp.float32).astype(dtype) for s in shapes]

    def time(self, fn, repeat, warmup=3):
        """Median seconds of ``fn`` over ``repeat`` runs after ``warmup``, by CUDA events."""
        cp = self.cp
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

    def free_bytes(self):
        return self.cp.cuda.Device().mem_info[0]

    def release(self):
        self.cp.get_default_memory_pool().free_all_blocks()


def _dense(xp, q, k, v, causal, scale, do=None):
    """Dense attention with the array module (cuBLAS on a GPU); with ``do`` the manual backward."""
    s = xp.matmul(q, k.swapaxes(-1, -2)).astype(xp.float32) * scale
    if causal:
        n, m = s.shape[-2:]
        i = xp.arange(n)[:, None]
        j = xp.arange(m)[None, :]
        s = xp.where(j <= i + (m - n), s, -xp.inf)
    s -= s.max(-1, keepdims=True)
    p = xp.exp(s)
    p /= p.sum(-1, keepdims=True)
    pc = p.astype(q.dtype)
    o = xp.matmul(pc, v)
    if do is None:
        return o
    dv = xp.matmul(pc.swapaxes(-1, -2), do)
    dp = xp.matmul(do, v.swapaxes(-1, -2)).astype(xp.float32)
    ds = (p * (dp - (dp * p).sum(-1, keepdims=True))).astype(q.dtype)
    dq = xp.matmul(ds, k) * scale
    dk = xp.matmul(ds.swapaxes(-1, -2), q) * scale
    return o, dq, dk, dv


def _torch(device="cuda"):
    """(torch, F, sdpa_kernel, SDPBackend) or None when torch (with CUDA, for "cuda") is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:          # torch < 2.3: no backend selection, default dispatch
        SDPBackend = sdpa_kernel = None
    return torch, F, sdpa_kernel, SDPBackend


def _sdpa_context(tm, dtype):
    """The PyTorch backend the benchmark compares with, as (context manager factory, name)."""
    torch, F, sdpa_kernel, SDPBackend = tm
    if sdpa_kernel is None:
        return contextlib.nullcontext, "default"
    if dtype == "float16":
        return (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)), "flash"
    return (lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)), "efficient"


# ------------------------------------------------------------------ 1. build
def _compile(flash_cuda, fam, dt, D, causal):
    """NVRTC-compile one module (four kernels) of family ``fam``; a tiled family is the
    launcher's default for its dtype, any other is named to the launcher."""
    extra = () if fam in TILED else (fam,)
    mod = flash_cuda._module(dt, D, causal, *extra)
    for kind in KINDS:
        mod.get_function(flash_cuda.kernel_name(kind, dt, D, causal, *extra))


def _prebuild_one(task):
    """In a fresh interpreter: compile one module, so that CuPy's on-disk cache holds it."""
    from minitx.backend import flash_cuda
    try:
        _compile(flash_cuda, *task)
        return None
    except Exception as exc:  # noqa: BLE001 - build() compiles it again and reports the error
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def prebuild(families, head_dims, jobs):
    """Compile every module in ``jobs`` processes at once (NVRTC takes seconds per module):
    the compiled modules land in CuPy's kernel cache on disk, where ``build`` then finds them.
    Any failure here only means ``build`` compiles that module itself."""
    import concurrent.futures
    import multiprocessing
    tasks = [(fam, dt, D, causal) for fam, dt, _env in families for D in head_dims
             for causal in (False, True)]
    t = time.perf_counter()
    try:
        with concurrent.futures.ProcessPoolExecutor(
                min(jobs, len(tasks)), mp_context=multiprocessing.get_context("spawn")) as pool:
            errors = [e for e in pool.map(_prebuild_one, tasks) if e]
    except Exception as exc:  # noqa: BLE001 - the serial build still runs
        print(f"prebuild: {type(exc).__name__}: {exc}; build() compiles serially")
        return
    print(f"prebuild: {len(tasks)} modules in {min(jobs, len(tasks))} processes, "
          f"{time.perf_counter() - t:.1f}s" + (f", {len(errors)} failed" if errors else ""),
          flush=True)


def build(flash_cuda, families=None):
    """Compile every instantiation with NVRTC (one module per family/D/causal); returns ok."""
    ok = True
    t0 = time.perf_counter()
    for fam, dt, _env in families or KERNEL_FAMILIES:
        for D in flash_cuda.SUPPORTED_HEAD_DIMS:
            for causal in (False, True):
                t = time.perf_counter()
                try:
                    _compile(flash_cuda, fam, dt, D, causal)
                    status = "ok"
                except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                    ok = False
                    status = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
                print(f"  build {fam:10s} {dt:7s} D={D:3d} causal={causal!s:5s} "
                      f"{time.perf_counter() - t:6.2f}s {status}", flush=True)
    print(f"build: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f}s")
    return ok


# ------------------------------------------------------------------ 2. check
# (name, B, H, Hkv, Nq, Nk, D, Dv, causal, masking)
CHECK_CASES = [
    ("square", 2, 4, 4, 257, 257, 64, 64, False, None),
    ("square causal", 2, 4, 4, 300, 300, 64, 64, True, None),
    ("Nq<<Nk causal", 1, 2, 2, 5, 300, 64, 64, True, None),
    ("Nq>>Nk causal, empty rows", 1, 2, 2, 300, 5, 64, 64, True, None),
    ("decode Nq=1", 2, 8, 2, 1, 1000, 128, 128, True, None),
    ("GQA 8/2 causal", 1, 8, 2, 513, 513, 128, 128, True, None),
    ("MQA 4/1 D=32", 1, 4, 1, 333, 129, 32, 32, False, None),
    ("D=80 GQA 4/2 Nq<Nk causal", 1, 4, 2, 200, 331, 80, 80, True, None),
    ("padded D=48 causal", 2, 2, 2, 100, 140, 48, 48, True, None),
    ("Dv != D", 1, 2, 2, 70, 90, 40, 96, False, None),
    ("lengths", 3, 2, 2, 200, 200, 64, 64, False, "lengths"),
    ("key mask + causal", 2, 2, 2, 150, 150, 64, 64, True, "mask"),
    ("fully masked batch", 2, 2, 2, 64, 80, 32, 32, False, "zero_length"),
    ("key mask, one batch all out", 2, 4, 2, 90, 70, 128, 128, True, "mask_empty"),
    ("long causal", 1, 4, 4, 2048, 2048, 128, 128, True, None),
]
# (Nq, Nk, D, Dv, causal) of the case whose tf32 dK/dV errors are the accumulation's GOAL line
TF32_ACCURACY_CASE = (2048, 2048, 128, 128, True)


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


def _case_inputs(torch, dev, tdt, case):
    name, B, H, Hkv, Nq, Nk, D, Dv, causal, masking = case
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
    if masking in ("mask", "mask_empty"):
        key_mask = torch.rand(B, Nk, device=dev, generator=g) < 0.7
        key_mask[:, -1] = True
        if masking == "mask_empty":
            key_mask[0] = False              # every row of batch 0 keeps no key
    return q, k, v, do, key_mask, lengths


def check(xp, flash_cuda, tm, device="cuda", cases=None, families=None):
    """Every kernel family against the float64 reference; returns True when all cases pass.
    (``xp``, ``device`` and ``cases`` exist so the check itself can be dry-run on the CPU with
    emulated kernels: ``benchmarks/gpu_run.py --dry-run``; a real run uses the defaults.)"""
    if tm is None:
        print("check: needs PyTorch with CUDA for the float64 reference (pip install torch)")
        return False
    torch, F = tm[0], tm[1]
    dev = torch.device(device)
    all_ok = True
    tf32_long = None
    print("FlashAttention's rule: each error <= 2x PyTorch's own SDPA error at the same dtype "
          "(+ a floor); lse within 1e-4")
    print(f"{'case':28s} {'family':10s} {'err O':>9s} {'lse':>9s} {'dQ':>9s} {'dK':>9s} {'dV':>9s} "
          f"{'torch O':>9s} {'torch dQ':>9s} {'torch dK':>9s} {'torch dV':>9s}  result")
    for fam, dtype, env in families or KERNEL_FAMILIES:
        tdt = getattr(torch, dtype)
        for case in cases or CHECK_CASES:
            name, B, H, Hkv, Nq, Nk, D, Dv, causal, masking = case
            q, k, v, do, key_mask, lengths = _case_inputs(torch, dev, tdt, case)
            scale = 1.0 / math.sqrt(D)
            keep = _keep_mask(torch, B, Nq, Nk, causal, key_mask, lengths, dev)
            ref = _reference(torch, q, k, v, do, keep, scale)

            cq, ck, cv, cdo = (xp.from_dlpack(x.contiguous()) for x in (q, k, v, do))
            ckm = None if key_mask is None else xp.from_dlpack(key_mask.to(torch.uint8))
            cln = None if lengths is None else xp.from_dlpack(lengths)
            try:
                with family_env(env):
                    o, lse = flash_cuda.flash_attention_forward(
                        cq, ck, cv, causal=causal, key_mask=ckm, lengths=cln)
                    dq, dk, dv = flash_cuda.flash_attention_backward(
                        cq, ck, cv, o, lse, cdo, causal=causal, key_mask=ckm, lengths=cln)
            except Exception as exc:  # noqa: BLE001 - a launch error fails this case, not the run
                all_ok = False
                print(f"{name:28s} {fam:10s} FAILED: {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
                continue
            got = [torch.from_dlpack(x) for x in (o, lse, dq, dk, dv)]
            errs = [_max_err(torch, a, b) for a, b in zip(got, ref)]

            # PyTorch's own error at this dtype (same mask, GQA expanded). A row with no kept
            # key is NaN in PyTorch (minitx: O = 0, zero gradients): PyTorch sees every key
            # there and gets no gradient from it (dO = 0), and its O and dQ on those rows are
            # not compared, so no NaN reaches the sums over rows in dK and dV.
            G = H // Hkv
            rows = keep.any(-1, keepdim=True)                        # (B, 1 or H, Nq, 1)
            tq, tk, tv = (x.detach().clone().requires_grad_(True) for x in
                          (q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)))
            to = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=keep | ~rows,
                                                scale=scale)
            to.backward(do * rows)
            to = to.detach()
            tdk = tk.grad.reshape(B, Hkv, G, Nk, D).sum(2)
            tdv = tv.grad.reshape(B, Hkv, G, Nk, Dv).sum(2)
            terr = [float((torch.where(rows, a.double(), b) - b).abs().max())
                    for a, b in ((to, ref[0]), (tq.grad, ref[2]))]
            terr += [float((a.double() - b).abs().max()) for a, b in ((tdk, ref[3]), (tdv, ref[4]))]

            floor = (1e-5 if dtype == "float32" else 1e-3)
            mags = [float(x[torch.isfinite(x)].abs().max()) if bool(torch.isfinite(x).any())
                    else 0.0 for x in ref]
            tol = [2 * terr[0] + floor * max(1, mags[0]), 1e-4 * max(1, mags[1]),
                   2 * terr[1] + floor * max(1, mags[2]), 2 * terr[2] + floor * max(1, mags[3]),
                   2 * terr[3] + floor * max(1, mags[4])]
            ok = all(e <= t for e, t in zip(errs, tol))
            all_ok &= ok
            if fam == "tf32" and case[4:9] == TF32_ACCURACY_CASE:
                tf32_long = [(errs[i], terr[i - 1], tol[i]) for i in (3, 4)]
            print(f"{name:28s} {fam:10s} " + " ".join(f"{e:9.2e}" for e in errs) + " "
                  + " ".join(f"{e:9.2e}" for e in terr) + f"  {'ok' if ok else 'FAIL'}", flush=True)
            if name.startswith("Nq<<Nk"):
                tl = _keep_mask(torch, B, Nq, Nk, causal, key_mask, lengths, dev, top_left=True)
                o_tl = _reference(torch, q, k, v, do, tl, scale)[0]
                print(f"{'':28s} (vs a top-left reference, i.e. PyTorch is_causal=True: max O "
                      f"difference {_max_err(torch, got[0], o_tl):.2f}: bottom-right is not top-left)")
    print(tf32_accuracy_goal(tf32_long))
    print(f"check: {'all cases pass' if all_ok else 'SOME CASES FAIL'}")
    return all_ok


def tf32_accuracy_goal(found):
    """The ``GOAL`` line of the 3xTF32 kernels' accumulation: their dK and dV error at
    ``TF32_ACCURACY_CASE`` (long key loops, where partial sums drift) against PyTorch's own
    fp32 error there, under the check's rule. ``found``: [(error, PyTorch's, limit)] for dK
    and dV, or None when that case or the family did not run."""
    Nq, Nk, D, _, causal = TF32_ACCURACY_CASE
    what = (f"GOAL 3xTF32 dK/dV error at Nq={Nq} Nk={Nk} D={D} "
            f"{'causal' if causal else 'non-causal'} within 2x PyTorch's own (+ floor):")
    if found is None:
        return f"{what} not checked (that case or the tf32 family did not run)"
    parts = [f"{name} {e:.2e} = {e / t if t > 0 else float('inf'):.1f}x PyTorch's {t:.2e}"
             f" (limit {lim:.2e})" for name, (e, t, lim) in zip(("dK", "dV"), found)]
    met = "met" if all(e <= lim for e, _, lim in found) else "not met"
    return f"{what} {'; '.join(parts)} ({met})"


# ------------------------------------------------------------------ 3. benchmark
def _configs(args, families):
    """Benchmark configurations: the goals' first (N = GOAL_N, the families of ``GOAL_FAMILIES``
    in that order), so that they are measured before a budget runs out; then the naive kernel
    at GOAL_N; then the other N in increasing order."""
    ns = sorted(args.n, key=lambda n: (n != GOAL_N, n))
    out = []
    for N in ns:
        for D in args.d:
            for fam in families:
                for causal in ([True] if args.causal else [False, True]):
                    out.append((N, D, fam, causal))
    rank = {fam: i for i, fam in enumerate(GOAL_FAMILIES)}
    return sorted(out, key=lambda c: (c[0] != GOAL_N, rank.get(c[2][0], len(rank))))


def _one_config(timing, flash_cuda, tm, args, N, D, family, causal, peers=None):
    """Rows (one per pass) of one configuration. ``peers`` (a dict) keeps the dense and PyTorch
    times of each (N, D, dtype, causal, pass): the families of one dtype share them, so that a
    lever costs only its own timing."""
    peers = {} if peers is None else peers
    fam, dt, env = family
    xp = timing.xp
    H = args.heads
    B = args.batch or max(1, args.tokens // N)
    q, k, v, do = timing.randn([(B, H, N, D)] * 4, dt)
    scale = 1.0 / math.sqrt(D)
    rows = []
    passes = [("fwd", False)] + ([] if args.no_backward else [("fwd+bwd", True)])
    from minitx.backend.flash_cuda import LEVERS, pass_kernel
    if fam in LEVERS and pass_kernel(fam, "fwd") == "tc" and len(passes) == 2:
        passes = passes[1:]   # a backward lever runs tc's forward: its fwd row would be tc's
    for label, bwd in passes:
        if bwd:
            def mine():
                o2, l2 = flash_cuda.flash_attention_forward(q, k, v, causal=causal)
                flash_cuda.flash_attention_backward(q, k, v, o2, l2, do, causal=causal)
        else:
            def mine():
                flash_cuda.flash_attention_forward(q, k, v, causal=causal)
        row = dict(label=label, fam=fam, dtype=dt, D=D, N=N, B=B, causal=causal,
                   flops=_flops(B, H, N, D, causal, bwd), dense=None, torch=None, backend="-")
        with family_env(env):
            row["mine"] = timing.time(mine, args.repeat)
        key = (N, D, dt, causal, label)
        if key in peers:
            row["dense"], row["torch"], row["backend"] = peers[key]
            rows.append(row)
            continue
        dense_bytes = B * H * N * N * 4 * (4 if bwd else 2)
        if dense_bytes < 0.6 * timing.free_bytes():
            row["dense"] = timing.time(lambda: _dense(xp, q, k, v, causal, scale,
                                                      do if bwd else None), args.repeat)
        else:
            row["dense"] = "oom"
        if tm is not None:
            torch, F = tm[0], tm[1]
            ctx, row["backend"] = _sdpa_context(tm, dt)
            tq, tk, tv, tdo = (torch.from_dlpack(x) for x in (q, k, v, do))
            if bwd:
                tq, tk, tv = (x.detach().requires_grad_(True) for x in (tq, tk, tv))

            def sdpa():
                with ctx():
                    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                if bwd:
                    out.backward(tdo)
            try:
                row["torch"] = timing.time(sdpa, args.repeat)
            except RuntimeError as exc:   # no kernel for this backend/shape, OOM
                row["torch"] = type(exc).__name__
        peers[key] = (row["dense"], row["torch"], row["backend"])
        rows.append(row)
    return rows


def _format_row(r):
    mine = r["mine"]
    if isinstance(r["dense"], float):
        dense_s = f"{r['dense'] * 1e3:9.3f} {r['dense'] / mine:7.2f}"
    else:
        dense_s = f"{'oom':>9s} {'-':>7s}"
    if isinstance(r["torch"], float):
        t = r["torch"]
        torch_s = f"{t * 1e3:9.3f} {r['flops'] / t / 1e12:7.1f} {r['backend']:9s} {t / mine:7.2f}"
    elif r["torch"] is None:
        torch_s = f"{'-':>9s} {'-':>7s} {'-':9s} {'-':>7s}"
    else:
        torch_s = f"{'err':>9s} {'-':>7s} {r['backend']:9s} {r['torch'][:7]:>7s}"
    return (f"{r['label']:8s} {r['fam']:10s} {r['dtype']:7s} {r['D']:4d} {r['N']:6d} {r['B']:3d} "
            f"{str(r['causal']):6s} {mine * 1e3:10.3f} {r['flops'] / mine / 1e12:7.1f} "
            f"{dense_s} {torch_s}")


def benchmark(timing, flash_cuda, tm, args, families=None, deadline=None):
    """Time every configuration (``_configs``) until ``deadline`` (a ``time.perf_counter()``
    value; None: no limit); returns the rows measured."""
    print(f"{'pass':8s} {'fam':10s} {'dtype':7s} {'D':>4s} {'N':>6s} {'B':>3s} {'causal':6s} "
          f"{'minitx ms':>10s} {'TF/s':>7s} {'dense ms':>9s} {'x dense':>7s} {'torch ms':>9s} "
          f"{'TF/s':>7s} {'backend':9s} {'x torch':>7s}")
    rows, skipped, peers = [], [], {}
    for N, D, family, causal in _configs(args, families or KERNEL_FAMILIES):
        if deadline is not None and time.perf_counter() > deadline:
            skipped.append(f"{family[0]} N={N} D={D}{' causal' if causal else ''}")
            continue
        try:
            new = _one_config(timing, flash_cuda, tm, args, N, D, family, causal, peers)
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is reported
            print(f"{family[0]} N={N} D={D} causal={causal}: FAILED: {type(exc).__name__}: "
                  f"{str(exc)[:300]}", flush=True)
            continue
        finally:
            timing.release()           # the configuration's arrays are gone: free the pool
        for r in new:
            print(_format_row(r), flush=True)
        rows += new
    if skipped:
        print(f"budget: {len(skipped)} configurations not run: {', '.join(skipped)}")
    return rows


def goal_lines(rows):
    """One ``GOAL`` line per target (``GOALS``), from the rows at N = GOAL_N, forward+backward;
    a target of several families is judged on the fastest of those measured."""
    names = {"tc": "fp16 tensor-core kernel", "simt": "fp32 CUDA-core kernel",
             "tf32": "fp32 3xTF32 tensor-core kernel"}
    dtype_of = {f[0]: f[1] for f in KERNEL_FAMILIES}
    lines = []
    for fams, D, kind, target in GOALS:
        for causal in (False, True):
            short = {"float16": "fp16", "float32": "fp32"}[dtype_of[fams[0]]]
            who = names.get(fams[0], fams[0]) if len(fams) == 1 else \
                f"{short} best {dtype_of[fams[0]]} family (" + " or ".join(fams) + ")"
            what = (f"GOAL {who} fwd+bwd N={GOAL_N} D={D} "
                    f"{'causal' if causal else 'non-causal'}:")
            found = [r for r in rows if r["fam"] in fams and r["D"] == D and r["N"] == GOAL_N
                     and r["causal"] == causal and r["label"] == "fwd+bwd"]
            timed = [r for r in found if isinstance(r.get("torch"), float)]
            if not timed:
                why = "not measured" if not found else f"no PyTorch time ({found[0].get('torch')})"
                lines.append(f"{what} {why}")
                continue
            ratios = {r["fam"]: r["torch"] / r["mine"] for r in timed}   # theirs' time over ours
            row = max(timed, key=lambda r: ratios[r["fam"]])
            ratio = ratios[row["fam"]]
            mine_tf = row["flops"] / row["mine"] / 1e12
            torch_tf = row["flops"] / row["torch"] / 1e12
            met = "met" if ratio >= target else "not met"
            peer = f"PyTorch {row['backend']} SDPA {torch_tf:.1f} TF/s"
            if kind == "pct":
                each = ", ".join(f"{f} {100 * ratios[f]:.1f}%" if f in ratios
                                 else f"{f} not measured" for f in fams)
                lines.append(f"{what} {row['fam']} {mine_tf:.1f} TF/s = {100 * ratio:.1f}% of "
                             f"{peer} (goal >= {100 * target:.0f}%: {met}"
                             + (f"; {each})" if len(fams) > 1 else ")"))
            else:
                each = ", ".join(f"{f} {ratios[f]:.2f}x" if f in ratios else f"{f} not measured"
                                 for f in fams)
                lines.append(f"{what} {row['fam']} {mine_tf:.1f} TF/s = {ratio:.2f}x {peer} "
                             f"(goal >= {target:.1f}x: {met}; {each})")
    return lines


# ------------------------------------------------------------------ smoke (for compute-sanitizer)
def smoke(cp, flash_cuda, families=None):
    """One small forward + backward per family: ragged N, Nq != Nk causal, GQA, a key mask.
    Returns True when every output is finite."""
    cp.cuda.set_allocator(None)   # every array its own cudaMalloc: memcheck sees its bounds
    ok = True
    B, H, Hkv, Nq, Nk, D = 1, 4, 2, 70, 130, 64
    for fam, dt, env in families or KERNEL_FAMILIES:
        rs = cp.random.RandomState(0)
        q = rs.standard_normal((B, H, Nq, D), dtype=cp.float32).astype(dt)
        k, v = (rs.standard_normal((B, Hkv, Nk, D), dtype=cp.float32).astype(dt)
                for _ in range(2))
        do = rs.standard_normal((B, H, Nq, D), dtype=cp.float32).astype(dt)
        key_mask = rs.random_sample((B, Nk)) < 0.7
        key_mask[:, -1] = True
        with family_env(env):
            o, lse = flash_cuda.flash_attention_forward(q, k, v, causal=True, key_mask=key_mask)
            dq, dk, dv = flash_cuda.flash_attention_backward(q, k, v, o, lse, do, causal=True,
                                                             key_mask=key_mask)
        cp.cuda.Device().synchronize()
        finite = all(bool(cp.isfinite(x).all()) for x in (o, dq, dk, dv))
        ok &= finite
        print(f"smoke {fam} {dt}: forward + backward (B={B} H={H}/{Hkv} Nq={Nq} Nk={Nk} D={D} "
              f"causal, key mask): {'finite' if finite else 'NON-FINITE OUTPUT'}", flush=True)
    return ok


def main(argv=None):
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(
        description="Build, check (--check) and benchmark minitx's CUDA flash-attention kernels.",
        epilog="One command on a GPU: python benchmarks/gpu_flash.py --check")
    ap.add_argument("--check", action="store_true",
                    help="run the correctness check against a float64 PyTorch reference first")
    ap.add_argument("--check-only", action="store_true", help="build + check, no benchmark")
    ap.add_argument("--smoke", action="store_true",
                    help="only one small forward + backward per family (for compute-sanitizer)")
    ap.add_argument("--n", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--dtype", nargs="*", default=None,
                    help="only the families of these dtypes (default: every family)")
    ap.add_argument("--family", nargs="*", default=None,
                    help=f"only these kernel families (of {[f[0] for f in KERNEL_FAMILIES]})")
    ap.add_argument("--causal", action="store_true", help="only causal (default: both)")
    ap.add_argument("--batch", type=int, default=0, help="B (default: 16384 // N tokens)")
    ap.add_argument("--tokens", type=int, default=16384, help="B * N when --batch is not given")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="N in {1024, 4096}, D = 64")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="start no benchmark row after SECONDS since the start (rows not run "
                         "are listed)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes compiling the modules at once before the build (default: "
                         "min(12, cores); 1: compile one after the other)")
    ap.add_argument("--keep-going", action="store_true",
                    help="check and benchmark even after a build or check failure (exit 1)")
    args = ap.parse_args(argv)
    families = select_families(args.family, args.dtype)

    from minitx.backend import cupy_or_none, flash_cuda
    why = flash_cuda.unavailable_reason()
    if why is not None:
        print(f"gpu_flash: no usable GPU ({why}); nothing to build, check or benchmark. The "
              "kernels are still checked without a GPU by `python -m pytest tests/gpu/cuda`.",
              file=sys.stderr)
        return 2
    cp = cupy_or_none()
    if args.smoke:
        return 0 if smoke(cp, flash_cuda, families) else 1
    if args.quick:
        args.n, args.d = [1024, 4096], [64]
    tm = _torch()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"device: {name} (sm_{dev.compute_capability}), CuPy {cp.__version__}, torch "
          f"{tm[0].__version__ if tm else 'not available (no SDPA columns, no --check)'}; "
          f"families {[f[0] for f in families]}")
    failed = False
    if args.jobs > 1:
        prebuild(families, flash_cuda.SUPPORTED_HEAD_DIMS, args.jobs)
    if not build(flash_cuda, families):
        failed = True
        if not args.keep_going:
            return 1
    if args.check or args.check_only:
        if not check(cp, flash_cuda, tm, families=families):
            failed = True
            if not args.keep_going:
                return 1
        if args.check_only:
            return 1 if failed else 0
    deadline = None if args.budget is None else t_start + args.budget
    rows = benchmark(CudaTiming(cp), flash_cuda, tm, args, families, deadline)
    for line in goal_lines(rows):
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
