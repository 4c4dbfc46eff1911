"""Build and run the CUDA kernels on the CPU (see emu/cuda_emu.h), plus the NumPy reference.

Every emulated computation runs in a forked child process with a timeout: a divergent
``__syncthreads`` shows up as a hang, which the parent kills and reports instead of hanging CI.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import subprocess
import traceback

import numpy as np

from minitx.backend import flash_cuda as fc

HERE = os.path.dirname(os.path.abspath(__file__))
EMU_DIR = os.path.join(HERE, "emu")
DRIVER = os.path.join(EMU_DIR, "driver.cpp")
KERNEL_DIR = os.path.dirname(fc.kernel_path())
GXX = os.environ.get("CXX") or shutil.which("g++")
BASE_FLAGS = ["-std=c++20", "-O1", "-pthread", "-DMINITX_EMULATION", f"-I{EMU_DIR}",
              f"-I{KERNEL_DIR}"]
# The barrier between loading a K/V tile into shared memory and computing scores from it.
BROKEN_MARKER = "__syncthreads();  // [fwd:kv-loaded]"
SMEM_LIMIT = 163 * 1024   # A100 opt-in per-block limit; the emulation arena holds 256 KiB


class EmuTimeout(AssertionError):
    pass


def _run(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"build failed ({' '.join(cmd)}):\n{p.stdout}\n{p.stderr}")
    return p


def build_shared(out_path, small=False, kernel_file=None):
    """The ctypes library (extern "C" launchers) from driver.cpp."""
    cmd = [GXX, *BASE_FLAGS, "-shared", "-fPIC"]
    if small:
        cmd.append("-DEMU_SMALL")
    if kernel_file:
        cmd.append(f'-DKERNEL_FILE="{kernel_file}"')
    _run(cmd + [DRIVER, "-o", out_path])
    return out_path


def build_tsan_exe(out_path, kernel_file=None):
    """A standalone ThreadSanitizer executable (TSan cannot be dlopen'ed into Python)."""
    cmd = [GXX, *BASE_FLAGS, "-g", "-fsanitize=thread", "-DEMU_SMALL", "-DEMU_MAIN"]
    if kernel_file:
        cmd.append(f'-DKERNEL_FILE="{kernel_file}"')
    _run(cmd + [DRIVER, "-o", out_path])
    return out_path


def broken_source(src: str) -> str:
    """The forward kernel without the barrier between loading K/V and using them."""
    n = src.count(BROKEN_MARKER)
    if n != 1:
        raise AssertionError(f"expected the marker {BROKEN_MARKER!r} exactly once, found {n}")
    return src.replace(BROKEN_MARKER, "/* barrier removed by the harness self-test */")


# ------------------------------------------------------------------ ctypes launching
def _c_arg(a):
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, np.ndarray):
        if not a.flags.c_contiguous:
            raise ValueError("emulated kernels need C-contiguous arrays")
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    if isinstance(a, (np.integer, int)):
        return ctypes.c_int(int(a))
    raise TypeError(f"unsupported kernel argument {type(a)}")


def make_launch(lib):
    """A ``launch(plan, args)`` for flash_cuda._forward/_backward that runs the emulation."""
    def launch(plan, args):
        family = plan.name.split("<")[0]
        fn = getattr(lib, family + "_launch")
        fn.restype = ctypes.c_int
        dims = [ctypes.c_uint(int(x)) for x in tuple(plan.grid) + tuple(plan.block)]
        rc = fn(plan.name.encode(), *dims, ctypes.c_size_t(plan.smem), *map(_c_arg, args))
        if rc != 0:
            raise RuntimeError(f"emulated launch of {plan.name} failed with code {rc}")
    return launch


def run_isolated(lib_path, fn, timeout=120.0, yield_permille=None, seed=None):
    """Run ``fn(launch, lib)`` in a forked child that loads ``lib_path``; return its result.

    Raises EmuTimeout if the child does not answer within ``timeout`` seconds (it is killed).
    """
    ctx = multiprocessing.get_context("fork")
    recv_end, send_end = ctx.Pipe(duplex=False)

    def target():
        try:
            lib = ctypes.CDLL(lib_path)
            if yield_permille is not None:
                lib.emu_set_yield_permille(ctypes.c_int(int(yield_permille)))
            if seed is not None:
                lib.emu_set_seed(ctypes.c_ulonglong(int(seed)))
            res = fn(make_launch(lib), lib)
            send_end.send(("ok", res))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            send_end.send(("err", traceback.format_exc()))
        finally:
            send_end.close()
            os._exit(0)

    proc = ctx.Process(target=target, daemon=True)
    proc.start()
    send_end.close()
    try:
        if not recv_end.poll(timeout):
            proc.kill()
            proc.join(10)
            raise EmuTimeout(f"emulated kernel run did not finish within {timeout:.0f}s "
                             "(divergent __syncthreads / deadlock?)")
        try:
            status, res = recv_end.recv()
        except EOFError:
            proc.join(10)
            raise RuntimeError(f"emulation child died (exit code {proc.exitcode})") from None
    finally:
        recv_end.close()
    proc.join(10)
    if status == "err":
        raise RuntimeError("emulation child raised:\n" + res)
    return res


def emu_forward(launch, q, k, v, **kw):
    return fc._forward(np, launch, q, k, v, smem_limit=SMEM_LIMIT, **kw)


def emu_backward(launch, q, k, v, o, lse, do, **kw):
    return fc._backward(np, launch, q, k, v, o, lse, do, smem_limit=SMEM_LIMIT, **kw)


# ------------------------------------------------------------------ NumPy float64 reference
def keep_mask(B, Nq, Nk, causal=False, key_mask=None, lengths=None):
    """(B, 1, Nq, Nk) bool: which keys each query row attends to (same rules as the kernel)."""
    keep = np.ones((B, 1, Nq, Nk), dtype=bool)
    j = np.arange(Nk)
    if lengths is not None:
        keep &= (j[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]
    if key_mask is not None:
        keep &= np.asarray(key_mask, dtype=bool)[:, None, None, :]
    if causal:
        i = np.arange(Nq)
        keep &= (j[None, :] <= i[:, None] + (Nk - Nq))[None, None]
    return keep


def _expand(x, H):
    return np.repeat(x, H // x.shape[1], axis=1)


def ref_forward(q, k, v, causal=False, scale=None, key_mask=None, lengths=None):
    """Dense softmax attention in float64; rows without a kept key -> o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    k, v = _expand(k, H), _expand(v, H)
    keep = keep_mask(B, Nq, Nk, causal, key_mask, lengths)
    s = np.where(keep, np.einsum("bhid,bhjd->bhij", q, k) * scale, -np.inf)
    any_row = keep.any(-1)                                   # (B, 1, Nq)
    m = np.where(any_row, s.max(-1, initial=-np.inf), 0.0)
    p = np.where(keep, np.exp(s - m[..., None]), 0.0)
    l = p.sum(-1)
    P = p / np.where(l > 0, l, 1.0)[..., None]
    o = P @ v
    lse = np.where(any_row & (l > 0), m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    return o, np.broadcast_to(lse, (B, H, Nq)).copy(), P


def ref_backward(q, k, v, o, do, causal=False, scale=None, key_mask=None, lengths=None):
    """Gradients of sum(o * do) in float64. The backward is a function of (q, k, v, o, do):
    Dvec = rowsum(do * o) uses the *given* o, exactly like the kernel."""
    q, k, v, o, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, o, do))
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    _, _, P = ref_forward(q, k, v, causal, scale, key_mask, lengths)
    ke, ve = _expand(k, H), _expand(v, H)
    dv = np.swapaxes(P, -1, -2) @ do
    dP = do @ np.swapaxes(ve, -1, -2)
    Dvec = (do * o).sum(-1, keepdims=True)
    dS = P * (dP - Dvec)
    dq = dS @ ke * scale
    dk = np.swapaxes(dS, -1, -2) @ q * scale
    G = H // Hkv
    dk = dk.reshape(B, Hkv, G, Nk, D).sum(2)
    dv = dv.reshape(B, Hkv, G, Nk, dv.shape[-1]).sum(2)
    return dq, dk, dv
