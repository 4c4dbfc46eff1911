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
# The barrier of the fp16 tensor-core forward between waiting for a K tile's cp.async copies and
# computing scores from it (it also keeps the V(t) copy from overwriting V(t-1) under a slow warp).
BROKEN_MARKER = "__syncthreads();  // [tc_fwd:k-landed]"
# The naive forward's rescale of its output row when the running max grows; the broken copy adds
# p v_j to the unscaled sum (a classic online-softmax slip), which no schedule can hide.
NAIVE_RESCALE = "acc[d] = alpha * acc[d] + p * vj[d];"
NAIVE_BROKEN = "acc[d] = acc[d] + p * vj[d];  /* rescale removed by the harness self-test */"
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


# The single-pass backward's barrier between every warp writing its dS^T rows to shared memory
# and the block reading them back as dS for dQ += dS K.
ONEPASS_BARRIER = "__syncthreads();  // [tc_onepass_dkdv:ds-written]"


def onepass_broken_source(src: str) -> str:
    """The kernels (``flash_cuda.kernel_source()``) with the single pass's dS^T barrier removed:
    the harness self-test that the emulation sees it."""
    n = src.count(ONEPASS_BARRIER)
    if n != 1:
        raise AssertionError(f"expected the marker {ONEPASS_BARRIER!r} exactly once, found {n}")
    return src.replace(ONEPASS_BARRIER, "/* barrier removed by the harness self-test */  "
                                        + ONEPASS_BARRIER[ONEPASS_BARRIER.index("//"):])


# The 3xTF32 split's two small products; without them each product is one tf32 multiply (a
# relative error of ~2^-11 per operand), which the fp32 bounds must reject.
TF32_SMALL_TERMS = """    mma_1688(acc, a_small, b_big);
    mma_1688(acc, a_big, b_small);
"""


def single_tf32_source(src: str) -> str:
    """The kernels (``flash_cuda.kernel_source()``) with the 3xTF32 kernels reduced to one tf32
    product per multiply (plain TF32): the harness self-test that the fp32 bounds see the split."""
    n = src.count(TF32_SMALL_TERMS)
    if n != 1:
        raise AssertionError(f"expected the split's small products exactly once, found {n}")
    return src.replace(TF32_SMALL_TERMS, "    /* small products removed by the harness self-test */\n")


# The 3xTF32 kernels' per-tile partial sums of P B (warp_gemm_acc_kn_tf32); without them every
# mma chains through the long-lived accumulator, and its rounding toward zero drifts with N.
TF32_PART_MMA = "                mma_3xtf32(part[j], ab, as, bb, bs);\n"
TF32_PART_ADD = ("            for (int i = 0; i < 4; ++i) add_in_order(acc[n0 + j][i], "
                 "part[j][i]);\n")


def chained_tf32_source(src: str) -> str:
    """The kernels with the 3xTF32 products of P B chained through the accumulator (no partial
    sum per tile): the harness self-test that the long-chain check sees the tensor core's
    rounding toward zero."""
    for marker in (TF32_PART_MMA, TF32_PART_ADD):
        n = src.count(marker)
        if n != 1:
            raise AssertionError(f"expected {marker!r} exactly once, found {n}")
    src = src.replace(TF32_PART_MMA, "                mma_3xtf32(acc[n0 + j], ab, as, bb, bs);\n")
    return src.replace(TF32_PART_ADD, "            ;   /* partial sums removed by the harness */\n")


def broken_source(src: str) -> str:
    """The kernels (``flash_cuda.kernel_source()``, every file inlined) without the fp16
    forward's barrier after its K tile lands, and with the naive forward not rescaling its
    output row (two independent breaks: the fp16 tests run the first, the naive ones the
    second)."""
    for marker in (BROKEN_MARKER, NAIVE_RESCALE):
        n = src.count(marker)
        if n != 1:
            raise AssertionError(f"expected the marker {marker!r} exactly once, found {n}")
    src = src.replace(NAIVE_RESCALE, NAIVE_BROKEN)
    return src.replace(BROKEN_MARKER, "/* barrier removed by the harness self-test */  "
                                      + BROKEN_MARKER[BROKEN_MARKER.index("//"):])


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


# ------------------------------------------------------------------ tolerances
# fp16 unit roundoff (round to nearest): |fl16(x) - x| <= U16 |x|.
U16 = 2.0 ** -11
# Relative error of the fp32 parts of the fp16 kernels (scores accumulated in fp32 over D <= 128
# terms, exp2 of them, fp32 sums). Worst case D * eps32 * |s| is ~1e-4 for |s| ~ 10; it is
# 5x below U16, so the fp16 terms dominate and an O(1) bug (a wrong mask, a lost rescale) is
# still thousands of times larger than the bound.
C32 = 1e-4
# fp16's absolute rounding error below its smallest normal number (2^-14), where its spacing is
# the fixed 2^-24: |fl16(x) - x| <= U16 |x| + ETA16 (Higham's model with gradual underflow). A
# probability or a gradient element can be that small (a GPU run met dK = 3.2e-6 off by 1.9e-8,
# under U16 |dK| = 1.6e-9 but under ETA16); an O(1) bug stays ~1e7 times larger.
ETA16 = 2.0 ** -25
# Relative error of one 3xTF32 product a b ~ a_small b_big + a_big b_small + a_big b_big: each
# operand's two tf32 parts miss it by at most 2^-22 |x| (the small part is rounded to 11
# significant bits of a residual <= 2^-11 |x|), and the dropped a_small b_small is <= 2^-22 |a b|:
# |error| <= 3 * 2^-22 |a b| to first order, 12 times fp32's rounding of a product (2^-24).
U_3XTF32 = 3 * 2.0 ** -22


def _tf32_terms(q, k, v, o_in, do, P, scale):
    """First-order error bounds (o, dq, dk, dv) of the 3xTF32 products alone (see error_bounds);
    every matmul A B of the kernels errs by at most U_3XTF32 (|A| |B|) elementwise."""
    u = U_3XTF32
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    ke, ve = _expand(k, Hq), _expand(v, Hq)
    aq, ak, av, ado = np.abs(q), np.abs(ke), np.abs(ve), np.abs(do)
    # forward: S = scale Q K^T errs by E; P = softmax(S) then by P (E + P E) (the softmax's
    # derivative dP = P (dS - rowsum(P dS)), with |.| on each part); O = P V by that times |V|
    # plus the product's own error
    E = u * scale * (aq @ np.swapaxes(ak, -1, -2))
    eP = P * (E + (P * E).sum(-1, keepdims=True))
    tol_o = eP @ av + u * (P @ av)
    # backward (o and lse given): P = exp(S - lse) errs by P E; dP = dO V^T by u |dO| |V|^T;
    # dS = P (dP - Dvec) by P E |dP - Dvec| + P u |dO| |V|^T; dV = P^T dO, dQ = scale dS K and
    # dK = scale dS^T Q by their operands' errors plus their own products' errors
    dP = do @ np.swapaxes(ve, -1, -2)
    dvec = (do * o_in).sum(-1, keepdims=True)
    dS = P * (dP - dvec)
    edS = P * E * np.abs(dP - dvec) + P * u * (ado @ np.swapaxes(av, -1, -2))
    tol_dv = (np.swapaxes(P * E, -1, -2) @ ado + u * (np.swapaxes(P, -1, -2) @ ado))
    tol_dq = scale * (edS @ ak + u * (np.abs(dS) @ ak))
    tol_dk = scale * (np.swapaxes(edS, -1, -2) @ aq + u * (np.swapaxes(np.abs(dS), -1, -2) @ aq))
    group = lambda x: x.reshape(B, Hkv, G, Nk, x.shape[-1]).sum(2)  # noqa: E731 - GQA sums
    return {"o": tol_o, "dq": tol_dq, "dk": group(tol_dk), "dv": group(tol_dv)}


def error_bounds(q, k, v, o_in, do, dtype, causal=False, scale=None, key_mask=None,
                 lengths=None, family=None):
    """Per-element error bounds for (o, dq, dk, dv) of the kernels, as a dict of arrays.

    float32: ``1e-5 * max(|ref|, 1)`` (norm-relative; fp32 accumulation, a few ulps times the
    reduction length), broadcast to the output's shape. For dQ and dK, where the result can
    cancel far below its terms, elementwise at least ``1e-5`` times the root-sum-square of the
    terms' magnitudes (written out below).

    float16 (tensor-core kernels: fp16 operands, exact products, fp32 accumulation), derived
    from where the kernels round to fp16 (first order in U16; inputs are already fp16 values
    and the reference is float64 on exactly those values). Each rounding below also carries
    fp16's absolute error ETA16 in its subnormal range (left out of the formulas for brevity):

    * forward: P = exp(S - m) is rounded to fp16 before P @ V (the row sum l stays fp32), then
      O is rounded to fp16:  |dO_i| <= (U16 + C32) (P |V|)_i + U16 |O_i|;
    * dV = P^T dO with P rounded: (U16 + C32) (P^T |dO|)_j + U16 |dV_j|  (summed over a GQA
      group before the final rounding);
    * dS = P (dP - Dvec) is rounded to fp16 before dQ = dS K and dK = dS^T Q; with
      E = U16 |dS| + C32 P (|dO| |V|^T + |Dvec|):  |ddQ| <= scale (E |K|) + U16 |dQ| and
      |ddK| <= scale (E^T |Q|) + U16 |dK|.

    Every bound is multiplied by 1.05 for second-order terms.

    float32 with ``family="tf32"`` (the 3xTF32 tensor-core kernels): the float32 bound plus 1.05
    times the first-order effect of each product's U_3XTF32 relative error, propagated through
    the softmax (``_tf32_terms``). Scores far from 0 (a large ``scale`` times |q| |k|) make a
    3xTF32 error there ~12 times an fp32 one, which the norm-relative float32 bound alone does
    not follow.
    """
    dtype = np.dtype(dtype).name
    o_ref, _, P = ref_forward(q, k, v, causal, scale, key_mask, lengths)
    dq_ref, dk_ref, dv_ref = ref_backward(q, k, v, o_in, do, causal, scale, key_mask, lengths)
    if dtype == "float32":
        out = {name: np.full(ref.shape, 1e-5 * max(np.abs(ref).max(initial=0.0), 1.0))
               for name, ref in (("o", o_ref), ("dq", dq_ref), ("dk", dk_ref), ("dv", dv_ref))}
        # dS = P (dP - Dvec) cancels when dP ~ Dvec (a row that sees one key has dS = 0 exactly,
        # computed as the difference of two O(1) fp32 dot products, dO . V and dO . O), so dQ and
        # dK can be ~0 while each of their terms carries an fp32 error of its own size
        # (A = P (|dO| |V|^T + |Dvec|) per unit of K or Q). Rounding errors of independent terms
        # add like a random walk (Higham and Mary, 2019: sqrt(n) u, not n u), so the bound takes
        # 1e-5 times the root-sum-square of the terms where that exceeds the norm-relative one.
        # Without it an example such as Nq = 236, Nk = 1 fails both the tiled and the naive
        # kernels with errors of 1.1e-5 (terms of size ~30, summed over 472 query rows); an
        # O(1) bug (a wrong mask, a lost rescale) is still >= 1e3 times the bound.
        q64, k64, v64, o64, do64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v, o_in, do))
        B, Hq, Nq, D = q64.shape
        Hkv, Nk = k64.shape[1], k64.shape[2]
        sc = 1.0 / np.sqrt(D) if scale is None else scale
        dvec = np.abs((do64 * o64).sum(-1, keepdims=True))
        A2 = (P * (np.abs(do64) @ np.swapaxes(np.abs(_expand(v64, Hq)), -1, -2) + dvec)) ** 2
        rss_dq = sc * np.sqrt(A2 @ _expand(k64, Hq) ** 2)
        rss_dk = sc * np.sqrt((np.swapaxes(A2, -1, -2) @ q64 ** 2)
                              .reshape(B, Hkv, Hq // Hkv, Nk, D).sum(2))
        out["dq"] = np.maximum(out["dq"], 1e-5 * rss_dq)
        out["dk"] = np.maximum(out["dk"], 1e-5 * rss_dk)
        if family == "tf32":
            extra = _tf32_terms(q64, k64, v64, o64, do64, P, sc)
            out = {name: out[name] + 1.05 * extra[name] for name in out}
        return out
    q, k, v, o_in, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, o_in, do))
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    ke, ve = np.abs(_expand(k, Hq)), np.abs(_expand(v, Hq))
    seen = (P > 0).astype(np.float64)          # where an fp16 P or dS is rounded (0 stays 0)
    tol_o = (U16 + C32) * (P @ ve) + ETA16 * (seen @ ve) + U16 * np.abs(o_ref) + ETA16
    pdo = (U16 + C32) * (np.swapaxes(P, -1, -2) @ np.abs(do)) \
        + ETA16 * (np.swapaxes(seen, -1, -2) @ np.abs(do))                   # (B, H, Nk, Dv)
    tol_dv = pdo.reshape(B, Hkv, G, Nk, -1).sum(2) + U16 * np.abs(dv_ref) + ETA16
    dP = do @ np.swapaxes(_expand(v, Hq), -1, -2)
    dvec = (do * o_in).sum(-1, keepdims=True)
    dS = P * (dP - dvec)
    E = U16 * np.abs(dS) + ETA16 * seen \
        + C32 * P * (np.abs(do) @ np.swapaxes(ve, -1, -2) + np.abs(dvec))
    tol_dq = scale * (E @ ke) + U16 * np.abs(dq_ref) + ETA16
    tol_dk = (scale * (np.swapaxes(E, -1, -2) @ np.abs(q))).reshape(B, Hkv, G, Nk, D).sum(2)
    tol_dk = tol_dk + U16 * np.abs(dk_ref) + ETA16
    return {"o": 1.05 * tol_o, "dq": 1.05 * tol_dq, "dk": 1.05 * tol_dk, "dv": 1.05 * tol_dv}


def check_close(name, got, ref, bound):
    """Every element within its bound (finite, same shape)."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    err = np.abs(got - ref)
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{name}: {int(bad.sum())} elements out of bound; worst at {i}: "
                             f"got {got[i]:.6g}, ref {ref[i]:.6g}, error {err[i]:.3e} > bound "
                             f"{bound[i]:.3e} (max |ref| {np.abs(ref).max(initial=0):.3e})")


def check_lse(got, ref):
    """lse is float32 in both families: -inf rows equal, the rest within 1e-5 relative."""
    assert got.dtype == np.float32
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), fin), "lse: -inf rows differ"
    assert np.all(got[~fin] == -np.inf)
    if fin.any():
        err = np.abs(got[fin] - ref[fin]).max()
        assert err <= 1e-5 * max(np.abs(ref[fin]).max(), 1.0), f"lse: max error {err:.3e}"


# ------------------------------------------------------------------ float32 families end to end
def float32_inputs(B, Hq, Hkv, Nq, Nk, D, Dv, masking, seed):
    """q, k, v, do (standard normal float32) and the masks of one case: ``masking`` is None,
    "lengths", "mask", "both" or "empty_batch" (a key mask that keeps nothing in batch 0)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Nq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Nk, Dv)).astype(np.float32)
    do = rng.standard_normal((B, Hq, Nq, Dv)).astype(np.float32)
    lengths = key_mask = None
    if masking in ("lengths", "both"):
        lengths = rng.integers(0, Nk + 1, size=B).astype(np.int32)
    if masking in ("mask", "both", "empty_batch"):
        key_mask = rng.random((B, Nk)) < 0.7
    if masking == "empty_batch":
        key_mask[0] = False                    # batch 0: every row fully masked
    return q, k, v, do, lengths, key_mask


def check_float32_kernel(lib, kernel, B, Hq, Hkv, Nq, Nk, D, Dv, causal, masking, scale, seed,
                         timeout=180.0):
    """Run the ``kernel`` choice ("tiled", "naive" or "tf32") forward and backward on float32
    inputs in the emulation library ``lib`` and check every output against the float64
    reference within the fp32 bounds of :func:`error_bounds`; rows that see no key must give
    exact zeros (o, dq) and lse = -inf, keys no row sees exact zeros in dk and dv. Returns the
    largest error / bound ratio over o, dq, dk, dv (below 1 when the check passes)."""
    q, k, v, do, lengths, key_mask = float32_inputs(B, Hq, Hkv, Nq, Nk, D, Dv, masking, seed)
    kw = dict(causal=causal, scale=scale, lengths=lengths, key_mask=key_mask)
    o_ref, lse_ref, _ = ref_forward(q, k, v, **kw)
    # The backward gets the reference o and lse, so forward and backward errors are measured
    # independently (test_cuda_integration chains the kernels' own o and lse).
    o_in, lse_in = o_ref.astype(np.float32), lse_ref.astype(np.float32)

    def work(launch, _lib):
        o, lse = emu_forward(launch, q, k, v, kernel=kernel, **kw)
        grads = emu_backward(launch, q, k, v, o_in, lse_in, do, kernel=kernel, **kw)
        return (o, lse) + tuple(grads)

    o, lse, dq, dk, dv = run_isolated(lib, work, timeout=timeout)
    bounds = error_bounds(q, k, v, o_in, do, np.float32, family=kernel, **kw)
    refs = (o_ref,) + tuple(ref_backward(q, k, v, o_in, do, **kw))
    worst = 0.0
    for name, got, ref in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), refs):
        assert got.dtype == np.float32, (name, got.dtype)
        check_close(name, got, ref, bounds[name])
        worst = max(worst, float((np.abs(got - ref) / bounds[name]).max(initial=0.0)))
    check_lse(lse, lse_ref)

    keep = keep_mask(B, Nq, Nk, causal, key_mask, lengths)[:, 0]         # (B, Nq, Nk)
    empty_rows, unseen_keys = ~keep.any(-1), ~keep.any(-2)               # (B, Nq), (B, Nk)
    rows = lambda x, sel: np.swapaxes(x, 1, 2)[sel]  # noqa: E731 - (B, H, N, ..)[(B, N) mask]
    assert np.all(rows(o, empty_rows) == 0) and np.all(rows(dq, empty_rows) == 0)
    assert np.all(rows(lse[..., None], empty_rows) == -np.inf)
    assert np.all(rows(dk, unseen_keys) == 0) and np.all(rows(dv, unseen_keys) == 0)
    return worst
