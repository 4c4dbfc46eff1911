"""Offline tooling for the CUDA kernels: find nvcc / NVRTC, compile every instantiation of
``kernels/flash_attn.cu`` with nvcc and report ptxas resource usage (registers, shared memory,
spills, stack). Used by the compile-check tests and by ``python -m minitx doctor``.

Nothing here needs a GPU; nothing here imports CuPy at module import time.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

from . import _cupy, cupy_or_none, flash_cuda, gpu_available

__all__ = ["find_nvcc", "nvcc_version", "nvrtc_available", "instantiation_source",
           "compile_arch", "parse_ptxas", "demangle", "compile_report", "report_from_outputs",
           "format_report", "doctor_lines", "occupancy", "min_blocks",
           "PTXAS_FLAGS", "SM_LIMITS"]

PTXAS_FLAGS = "-v,-warn-spills,-warn-lmem-usage,-Werror"

# Per-SM resources (CUDA C Programming Guide, "Compute capabilities" table): A100 = sm_80,
# H100 = sm_90. 1 KB of shared memory per block is reserved by the system.
SM_LIMITS = {
    "sm_80": dict(gpu="A100", regs=65536, smem=164 * 1024, threads=2048, blocks=32),
    "sm_90": dict(gpu="H100", regs=65536, smem=228 * 1024, threads=2048, blocks=32),
}


def min_blocks(name: str) -> int:
    """The minimum-blocks-per-SM of an instantiation's __launch_bounds__(128, N) (mirrors the
    kernel sources: flash_tc.cuh, flash_tc_levers.cuh, flash_tf32.cuh, flash_simt.cuh,
    flash_naive.cuh, flash_common.cuh)."""
    if name.startswith("flash_bwd_dot<"):
        return 4
    if "_tf32<" in name or "_tc_bm128<" in name or "_tc_kvreg<" in name or "_tc_onepass<" in name:
        return 2
    if "_simt<" in name or "_naive<" in name:
        return 3
    D = int(re.search(r"<(\d+),", name).group(1))
    if name.startswith("flash_fwd_tc<"):
        return 4 if D <= 64 else 2
    if name.startswith("flash_bwd_dq_tc<"):
        return 3 if D <= 64 else 2
    return 3 if D <= 32 else 2          # flash_bwd_dkdv_tc


def occupancy(registers: int, smem: int, arch: str, threads: int = 128) -> dict:
    """Blocks per SM of a kernel using ``registers`` per thread and ``smem`` bytes of dynamic
    shared memory per block: registers are allocated per warp in units of 256, and 1 KB of
    shared memory per block is reserved. Returns blocks, warps, and each limit."""
    lim = SM_LIMITS[arch]
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = (lim["regs"] // per_warp) // warps
    by_smem = lim["smem"] // (smem + 1024) if smem else lim["blocks"]
    by_threads = lim["threads"] // threads
    blocks = min(by_regs, by_smem, by_threads, lim["blocks"])
    limiter = ("registers" if blocks == by_regs else "shared memory" if blocks == by_smem
               else "threads")
    return dict(blocks=blocks, warps=blocks * warps, by_regs=by_regs, by_smem=by_smem,
                by_threads=by_threads, limiter=limiter,
                occupancy=blocks * warps / (lim["threads"] // 32))


def find_nvcc():
    """Path of nvcc (``$CUDA_HOME``/``$CUDA_PATH``, ``PATH``, /usr/local/cuda) or None."""
    cands = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root:
            cands.append(os.path.join(root, "bin", "nvcc"))
    which = shutil.which("nvcc")
    if which:
        cands.append(which)
    cands.append("/usr/local/cuda/bin/nvcc")
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def nvcc_version(nvcc=None):
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release ([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else None


def nvrtc_available() -> bool:
    """True when CuPy imports and its NVRTC binding works (never raises; no GPU needed)."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        cp.cuda.nvrtc.getVersion()
    except (AttributeError, ImportError, RuntimeError, OSError):   # no/broken NVRTC, a stand-in
        return False
    return True


def instantiation_source(names, kernel_file=None) -> str:
    """A .cu that includes the kernel file and odr-uses each name expression (instantiating it)."""
    kernel_file = kernel_file or flash_cuda.kernel_path()
    lines = [f'#include "{kernel_file}"', "void* minitx_instantiations[] = {"]
    lines += [f"    (void*)&{n}," for n in names]
    lines.append("};")
    return "\n".join(lines) + "\n"


def compile_arch(arch, names=None, nvcc=None, workdir=None, kernel_file=None, timeout=900):
    """Compile all ``names`` for ``arch`` to a cubin; returns (returncode, ptxas/nvcc output)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return 127, "nvcc not found"
    names = list(names or flash_cuda.all_kernel_names())
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="minitx_cuda_")
    try:
        src = os.path.join(workdir, f"instantiate_{arch}.cu")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(instantiation_source(names, kernel_file))
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-Xptxas", PTXAS_FLAGS, src,
               "-o", os.path.join(workdir, f"flash_{arch}.cubin")]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, f"nvcc timed out after {timeout}s"
        return p.returncode, p.stdout + p.stderr
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------ a tiny Itanium demangler
# Enough for our kernels: _Z<len><name>I<args>E<params>, args: f, d, i, <len><id>, L<type><val>E.
_BUILTIN = {"f": "float", "d": "double", "i": "int", "j": "unsigned int", "b": "bool",
            "h": "unsigned char", "c": "char", "l": "long", "m": "unsigned long"}


def demangle(sym: str) -> str:
    """``_Z9flash_fwdIfLi64ELb1EEv...`` -> ``flash_fwd<float, 64, true>`` (else ``sym``)."""
    m = re.match(r"_Z(\d+)", sym)
    if not m:
        return sym
    pos = m.end()
    n = int(m.group(1))
    name = sym[pos:pos + n]
    pos += n
    if pos >= len(sym) or sym[pos] != "I":
        return name
    pos += 1
    args = []
    try:
        while sym[pos] != "E":
            c = sym[pos]
            if c == "L":
                typ = sym[pos + 1]
                end = sym.index("E", pos)
                val = sym[pos + 2:end].replace("n", "-")
                args.append(("true" if val == "1" else "false") if typ == "b" else val)
                pos = end + 1
            elif c.isdigit():
                mm = re.match(r"\d+", sym[pos:])
                ln = int(mm.group(0))
                pos += len(mm.group(0))
                args.append(sym[pos:pos + ln])
                pos += ln
            elif c in _BUILTIN:
                args.append(_BUILTIN[c])
                pos += 1
            else:
                return sym
    except (IndexError, ValueError):
        return sym
    return f"{name}<{', '.join(args)}>"


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_ERR = re.compile(r"ptxas (?:error|warning)\s*: (.*?)(?:function )?'([^']+)'")


def parse_ptxas(output: str) -> dict:
    """Map demangled kernel name -> {registers, smem_static, spill_stores, spill_loads, stack,
    errors} from ``ptxas -v`` output (one arch)."""
    res = {}
    cur = None
    for line in output.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = demangle(m.group(1))
            res.setdefault(cur, {"registers": None, "smem_static": 0, "spill_stores": None,
                                 "spill_loads": None, "stack": None, "errors": []})
            continue
        m = _ERR.search(line)
        if m:
            nm = demangle(m.group(2))
            res.setdefault(nm, {"registers": None, "smem_static": 0, "spill_stores": None,
                                "spill_loads": None, "stack": None, "errors": []})
            res[nm]["errors"].append(m.group(1).strip())
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            stack, stores, loads = map(int, m.groups())
            res[cur].update(stack=stack, spill_stores=stores, spill_loads=loads)
            continue
        m = _USED.search(line)
        if m:
            res[cur]["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            res[cur]["smem_static"] = int(s.group(1)) if s else 0
    return res


def compile_report(archs=("sm_80", "sm_90"), names=None, jobs=2, nvcc=None, kernel_file=None):
    """Compile every instantiation for each arch (``jobs`` nvcc processes in parallel).

    Returns a list of dicts ``{kernel, arch, registers, smem_static, smem_dynamic, spill_stores,
    spill_loads, stack, ok, error}``; ``ok`` means compiled with 0 spills and 0 stack/local memory.
    """
    names = list(names or flash_cuda.all_kernel_names())
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return [dict(kernel=n, arch=a, registers=None, smem_static=None, smem_dynamic=None,
                     spill_stores=None, spill_loads=None, stack=None, ok=False,
                     error="nvcc not found") for a in archs for n in names]
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        outs = list(pool.map(lambda a: compile_arch(a, names, nvcc, kernel_file=kernel_file),
                             archs))
    return report_from_outputs(archs, outs, names)


def report_from_outputs(archs, outs, names=None):
    """Rows of :func:`compile_report` from the ``(returncode, output)`` of :func:`compile_arch`."""
    names = list(names or flash_cuda.all_kernel_names())
    rows = []
    for arch, (rc, out) in zip(archs, outs):
        parsed = parse_ptxas(out)
        for n in names:
            dyn = flash_cuda.smem_bytes_of(n)
            p = parsed.get(n)
            if p is None:
                tail = out.strip().splitlines()[-5:] if out.strip() else []
                rows.append(dict(kernel=n, arch=arch, registers=None, smem_static=None,
                                 smem_dynamic=dyn, spill_stores=None, spill_loads=None, stack=None,
                                 ok=False,
                                 error=f"not in ptxas output (rc={rc}): " + " | ".join(tail)))
                continue
            err = "; ".join(p["errors"]) or None
            ok = (err is None and p["registers"] is not None and p["spill_stores"] == 0
                  and p["spill_loads"] == 0 and p["stack"] == 0)
            rows.append(dict(kernel=n, arch=arch, registers=p["registers"],
                             smem_static=p["smem_static"], smem_dynamic=dyn,
                             spill_stores=p["spill_stores"], spill_loads=p["spill_loads"],
                             stack=p["stack"], ok=ok, error=err))
    return rows


def format_report(rows) -> list:
    lines = [f"{'kernel':34s} {'arch':5s} {'regs':>4s} {'smem(dyn)':>9s} {'spill st/ld':>11s} "
             f"{'stack':>5s} ok"]
    for r in rows:
        lines.append(f"{r['kernel']:34s} {r['arch']:5s} {str(r['registers']):>4s} "
                     f"{str(r['smem_dynamic']):>9s} "
                     f"{str(r['spill_stores']) + '/' + str(r['spill_loads']):>11s} "
                     f"{str(r['stack']):>5s} {'yes' if r['ok'] else 'NO ' + str(r['error'] or '')}")
    return lines


def _safe(fn, default):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - doctor output must never raise
        return default.format(err=f"{type(exc).__name__}: {exc}")


def _gpu_line() -> str:
    cp = cupy_or_none()
    if cp is None or not gpu_available():
        return "GPU: none usable (CuPy missing or no CUDA device)"
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props.get("name", b"?")
    name = name.decode() if isinstance(name, bytes) else str(name)
    cc = str(dev.compute_capability)
    return (f"GPU: {name} (sm_{cc}, {props.get('totalGlobalMem', 0) / 2**30:.1f} GiB, shared "
            f"memory per block opt-in {flash_cuda._device_smem_limit()} B)")


def doctor_lines(compile: bool = False, archs=("sm_80", "sm_90"), jobs: int = 2) -> list:
    """Backend and kernel lines for ``python -m minitx doctor``; never raises.

    Default: fast (well under a second without a GPU; no compilation): Python/NumPy/CuPy
    versions, the GPU, nvcc, NVRTC, the kernel source, its instantiations and their dynamic
    shared memory, and whether the CPU emulation tests (``pytest tests/gpu/cuda``) can build.
    ``compile=True`` also compiles every instantiation with nvcc for each of ``archs`` (``jobs``
    nvcc processes; about a minute per arch) and appends the per-instantiation ptxas table
    (registers, dynamic shared memory, spills, stack) plus a summary line.
    """
    import platform

    import numpy


    lines = [f"python {platform.python_version()}, numpy {numpy.__version__}"]
    cp = _safe(cupy_or_none, "")
    lines.append(f"cupy {cp.__version__}" if cp else
                 f"cupy: not installed ({_cupy.get('error') or 'not importable'})")
    lines.append(_safe(_gpu_line, "GPU: unknown ({err})"))
    path = flash_cuda.kernel_path()
    present = "present" if os.path.isfile(path) else "MISSING"
    lines.append(f"flash kernel source: {path} ({present})")
    nvcc = _safe(find_nvcc, "")
    lines.append(f"nvcc: {nvcc} (CUDA {_safe(lambda: nvcc_version(nvcc), '?')})" if nvcc
                 else "nvcc: not found (set CUDA_HOME or put nvcc on PATH; needed only for "
                      "the ptxas check)")
    lines.append(f"NVRTC via CuPy: {'available' if nvrtc_available() else 'not available'}")
    why = flash_cuda.unavailable_reason()
    lines.append("flash kernel on GPU: " + ("available" if why is None else
                                            f"not available ({why}); the NumPy tiled flash "
                                            "attention runs instead"))
    lines.append(f"flash instantiations: {len(flash_cuda.all_kernel_names())} "
                 f"(fp16 -> tensor-core kernels *_tc, fp32 -> CUDA-core kernels *_simt; "
                 f"MINITX_FLASH_KERNEL=naive -> *_naive, fp32, one thread per row; =tf32 -> "
                 f"*_tf32, fp32 as 3xTF32; =tc_bm128 / tc_kvreg / tc_onepass -> the fp16 "
                 f"levers, tc with one kernel replaced; D in "
                 f"{flash_cuda.SUPPORTED_HEAD_DIMS}, causal or not; other D, Dv <= 128 zero "
                 f"padded)")
    lines.append("flash kernel choice: " + _safe(
        lambda: f"{flash_cuda.KERNEL_ENV}={flash_cuda.kernel_choice()}", "invalid ({err})"))
    for dt in ("float16", "float32"):
        smem = ", ".join(
            f"{kind} " + "/".join(str(flash_cuda.smem_bytes(kind, dt, D))
                                  for D in flash_cuda.SUPPORTED_HEAD_DIMS)
            for kind in ("fwd", "bwd_dkdv", "bwd_dq"))
        lines.append(f"dynamic shared memory per block, {flash_cuda.family(dt)} ({dt}), "
                     f"D=32/64/128 (bytes): {smem}; above {flash_cuda.DEFAULT_SMEM_LIMIT} needs "
                     f"the opt-in attribute")
    gxx = shutil.which(os.environ.get("CXX") or "g++")
    lines.append("CPU emulation tests (pytest tests/gpu/cuda): "
                 + (f"g++ {gxx}" if gxx else "g++ not found: skipped"))
    if compile:
        if not nvcc:
            lines.append("ptxas table: skipped (nvcc not found)")
            return lines
        try:
            rows = compile_report(archs=tuple(archs), jobs=jobs, nvcc=nvcc)
        except Exception as exc:  # noqa: BLE001
            lines.append(f"ptxas table: failed ({type(exc).__name__}: {exc})")
            return lines
        bad = [r for r in rows if not r["ok"]]
        regs = [r["registers"] for r in rows if r["registers"] is not None]
        lines.append(f"ptxas ({', '.join(archs)}, -Xptxas {PTXAS_FLAGS}): "
                     f"{len(rows) - len(bad)}/{len(rows)} ok, registers "
                     f"{min(regs) if regs else '?'}..{max(regs) if regs else '?'} per thread, "
                     f"spills/stack/local memory: {'none' if not bad else 'SEE TABLE'}")
        lines.extend(format_report(rows))
    return lines
