"""CuPy launcher for the hand-written flash-attention kernels in ``kernels/flash_attn.cu``.

Public API (CuPy arrays in, CuPy arrays out)::

    o, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)

Shapes: ``q`` (B, H, Nq, D), ``k`` (B, Hkv, Nk, D), ``v`` (B, Hkv, Nk, Dv) with ``Hkv`` dividing
``H`` (grouped-query attention: q head ``h`` reads kv head ``h // (H // Hkv)``). ``o`` (B, H, Nq, Dv)
has q's dtype, ``lse`` (B, H, Nq) is float32. Inputs may be non-contiguous views (they are copied
into contiguous, padded buffers); ``key_mask``/``lengths`` may be NumPy or CuPy arrays. Masks: ``lengths`` (B,) int keeps keys ``j < lengths[b]``; ``key_mask`` (B, Nk) bool
keeps keys where True; ``causal`` keeps ``j <= i + (Nk - Nq)`` (bottom-right aligned). A query row
that keeps no key gets ``o = 0`` and ``lse = -inf``; its gradients are zero.

Head dims 32/64/128 are compiled; q, k and v are zero padded to the smallest one >= max(D, Dv)
(zero columns of q/k add nothing to the scores, zero columns of v give zero output columns which
are sliced off). ``scale`` defaults to ``1/sqrt(D)`` of the *unpadded* D. :func:`supports` says
(without a GPU) whether given arrays can run here; dispatchers should call it.

The kernels compute dK/dV per *query* head into a float32 (B, H, Nk, D) buffer; for GQA the
``H // Hkv`` heads of a group are summed here, in Python (deterministic, no atomics).

CuPy is imported lazily inside functions only; everything that does not launch a kernel
(validation, padding decisions, launch plans, shared-memory arithmetic) is plain Python and is
unit tested without a GPU. The same ``_forward``/``_backward`` drivers run the kernels in the
CPU emulation harness of ``tests/cuda`` through a different ``launch`` callable.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy

from . import cupy_or_none  # the backend module owns the CuPy import

__all__ = [
    "flash_attention_forward", "flash_attention_backward", "is_available", "supports",
    "decline_reason", "unavailable_reason", "kernel_source",
    "kernel_path", "padded_head_dim", "smem_bytes", "kernel_name", "all_kernel_names",
    "plan_launch", "validate_inputs", "check_shared_memory", "SUPPORTED_HEAD_DIMS",
    "THREADS", "BLOCK_M", "BLOCK_N", "DEFAULT_SMEM_LIMIT",
]

SUPPORTED_HEAD_DIMS = (32, 64, 128)
THREADS = 128          # threads per block (all kernels)
BLOCK_M = 32           # query rows per tile
BLOCK_N = 32           # key rows per tile
DEFAULT_SMEM_LIMIT = 48 * 1024   # per-block dynamic shared memory without the opt-in attribute
_CTYPE = {"float32": "float", "float16": "__half"}
_KINDS = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_dot")


def kernel_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "flash_attn.cu")


def kernel_source() -> str:
    with open(kernel_path(), encoding="utf-8") as fh:
        return fh.read()


# ------------------------------------------------------------------------ pure-Python planning
def padded_head_dim(d: int) -> int:
    """The compiled head dim used for ``d`` (the smallest supported size >= d)."""
    d = int(d)
    if d < 1:
        raise ValueError(f"head dim D must be >= 1, got {d}")
    for s in SUPPORTED_HEAD_DIMS:
        if d <= s:
            return s
    raise ValueError(f"head dim D must be <= {SUPPORTED_HEAD_DIMS[-1]} for the flash kernel, got {d}")


def smem_floats(kind: str, D: int) -> int:
    """Dynamic shared memory (in floats) of one block; mirrors ``*_smem_floats<D>()`` in the .cu."""
    bm, bn = BLOCK_M, BLOCK_N
    if kind == "fwd":
        return (bm + bn) * (D + 1) + bn * D + bm * (bn + 1)
    if kind == "bwd_dkdv":
        return 2 * bn * (D + 1) + 2 * bm * (D + 1) + 2 * bn * (bm + 1) + 2 * bm
    if kind == "bwd_dq":
        return 2 * bm * (D + 1) + 2 * bn * (D + 1) + bm * (bn + 1)
    if kind == "bwd_dot":
        return 0
    raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")


def smem_bytes(kind: str, D: int) -> int:
    return 4 * smem_floats(kind, D)


def _ctype(dtype) -> str:
    name = numpy.dtype(dtype).name
    if name not in _CTYPE:
        raise TypeError(f"dtype must be float32 or float16, got {name}")
    return _CTYPE[name]


def kernel_name(kind: str, dtype, D: int = 64, causal: bool = False) -> str:
    """The C++ name expression of one instantiation, e.g. ``flash_fwd<float, 64, true>``."""
    t = _ctype(dtype)
    if kind == "bwd_dot":
        return f"flash_bwd_dot<{t}>"
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"D must be one of {SUPPORTED_HEAD_DIMS}, got {D}")
    return f"flash_{kind}<{t}, {int(D)}, {'true' if causal else 'false'}>"


def all_kernel_names(dtypes=("float32", "float16"), head_dims=SUPPORTED_HEAD_DIMS,
                     kinds=_KINDS) -> list:
    names = []
    for dt in dtypes:
        for kind in kinds:
            if kind == "bwd_dot":
                names.append(kernel_name(kind, dt))
                continue
            for D in head_dims:
                for causal in (False, True):
                    names.append(kernel_name(kind, dt, D, causal))
    return names


def check_shared_memory(nbytes: int, limit: int, name: str = "kernel") -> None:
    """Raise if a block of ``name`` needs more dynamic shared memory than the device allows."""
    if nbytes > limit:
        raise ValueError(
            f"{name} needs {nbytes} bytes of shared memory per block, the device allows {limit} "
            f"(cudaDevAttrMaxSharedMemoryPerBlockOptin)")


@dataclass(frozen=True)
class LaunchPlan:
    name: str
    grid: tuple
    block: tuple
    smem: int


def plan_launch(kind: str, dtype, *, B: int, H: int, Nq: int, Nk: int, D: int,
                causal: bool = False) -> LaunchPlan:
    """Grid/block/shared memory of one kernel launch (D is the padded, compiled head dim)."""
    if B * H > 65535:
        raise ValueError(f"B*H must be <= 65535 (grid.y), got {B * H}")
    name = kernel_name(kind, dtype, D, causal)
    if kind == "bwd_dot":
        rows = B * H * Nq
        return LaunchPlan(name, (max(1, -(-rows // (THREADS // 32))), 1, 1), (THREADS, 1, 1), 0)
    tiles = -(-Nk // BLOCK_N) if kind == "bwd_dkdv" else -(-Nq // BLOCK_M)
    return LaunchPlan(name, (max(tiles, 1), B * H, 1), (THREADS, 1, 1), smem_bytes(kind, D))


def validate_inputs(q, k, v, key_mask=None, lengths=None, **extra):
    """Check shapes/dtypes (works on NumPy or CuPy arrays); returns (B, H, Hkv, Nq, Nk, D).

    ``extra`` may hold ``o``/``do`` (B, H, Nq, Dv) and ``lse`` (B, H, Nq) for the backward.
    ``v`` may have its own last dim Dv (<= 128 like D).
    """
    for nm, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{nm} must be 4-D (B, H, N, D), got shape {getattr(x, 'shape', None)}")
    dt = numpy.dtype(q.dtype)
    if dt.name not in _CTYPE:
        raise TypeError(f"q must be float32 or float16, got {dt.name}")
    for nm, x in (("k", k), ("v", v)):
        if numpy.dtype(x.dtype) != dt:
            raise TypeError(f"{nm} must have q's dtype {dt.name}, got {numpy.dtype(x.dtype).name}")
    B, H, Nq, D = (int(s) for s in q.shape)
    if tuple(k.shape[:3]) != tuple(v.shape[:3]):
        raise ValueError(f"v must have k's shape (B, Hkv, Nk) = {tuple(k.shape[:3])}, got "
                         f"{tuple(v.shape)}")
    Dv = int(v.shape[3])
    Bk, Hkv, Nk, Dk = (int(s) for s in k.shape)
    if Bk != B:
        raise ValueError(f"k must have batch size {B} (q.shape[0]), got {Bk}")
    if Dk != D:
        raise ValueError(f"k must have head dim {D} (q.shape[3]), got {Dk}")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k heads must divide q heads {H}, got {Hkv}")
    padded_head_dim(max(D, Dv))
    if key_mask is not None:
        if tuple(key_mask.shape) != (B, Nk):
            raise ValueError(f"key_mask must have shape {(B, Nk)}, got {tuple(key_mask.shape)}")
        if numpy.dtype(key_mask.dtype).kind not in "biu":
            raise TypeError(f"key_mask must be bool (or 0/1 integers), got {numpy.dtype(key_mask.dtype).name}")
    if lengths is not None:
        if tuple(lengths.shape) != (B,):
            raise ValueError(f"lengths must have shape {(B,)}, got {tuple(lengths.shape)}")
        if numpy.dtype(lengths.dtype).kind not in "iu":
            raise TypeError(f"lengths must be an integer array, got {numpy.dtype(lengths.dtype).name}")
    for nm in ("o", "do"):
        x = extra.get(nm)
        if x is not None:
            if tuple(x.shape) != (B, H, Nq, Dv):
                raise ValueError(f"{nm} must have the output's shape (B, H, Nq, Dv) = "
                                 f"{(B, H, Nq, Dv)}, got {tuple(x.shape)}")
            if numpy.dtype(x.dtype) != dt:
                raise TypeError(f"{nm} must have q's dtype {dt.name}, got {numpy.dtype(x.dtype).name}")
    lse = extra.get("lse")
    if lse is not None and tuple(lse.shape) != (B, H, Nq):
        raise ValueError(f"lse must have shape {(B, H, Nq)}, got {tuple(lse.shape)}")
    return B, H, Hkv, Nq, Nk, D


def compiled_head_dim(q, v) -> int:
    """The compiled head dim the kernels run with for ``q`` (.., D) and ``v`` (.., Dv)."""
    return padded_head_dim(max(int(q.shape[-1]), int(v.shape[-1])))


def decline_reason(q, k, v, key_mask=None, lengths=None):
    """None when the kernels take these arrays, else why not (shapes, dtypes, D and Dv <= 128,
    the B*H grid limit), as a short sentence.

    Pure Python on ``.shape``/``.dtype``: works for NumPy and CuPy arrays, needs no GPU and does
    not check that a GPU is present (that is :func:`unavailable_reason`).
    """
    try:
        B, H = validate_inputs(q, k, v, key_mask, lengths)[:2]
    except (ValueError, TypeError) as exc:
        return str(exc)
    if B * H > 65535:
        return f"B*H = {B * H} exceeds the grid limit 65535"
    return None


def supports(q, k, v, key_mask=None, lengths=None) -> bool:
    """True when the kernels take these arrays (see :func:`decline_reason`)."""
    return decline_reason(q, k, v, key_mask, lengths) is None


def resolve_scale(scale, D: int) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def pad_head_dim(xp, x, Dp: int):
    """Zero-pad the last axis of ``x`` to ``Dp`` (returns a contiguous array; no copy if equal)."""
    if x.shape[-1] == Dp:
        return xp.ascontiguousarray(x)
    out = xp.zeros(x.shape[:-1] + (Dp,), dtype=x.dtype)
    out[..., : x.shape[-1]] = x
    return out


def _masks(xp, key_mask, lengths):
    """uint8 (B, Nk) keep mask and int32 (B,) lengths, contiguous, in ``xp`` (NumPy masks are
    copied to the device)."""
    km = None if key_mask is None else xp.ascontiguousarray(
        (xp.asarray(key_mask) != 0).astype(numpy.uint8))
    ln = None if lengths is None else xp.ascontiguousarray(xp.asarray(lengths).astype(numpy.int32))
    return km, ln


# ------------------------------------------------------------------------ shared drivers
def _forward(xp, launch, q, k, v, *, causal=False, scale=None, key_mask=None, lengths=None,
             smem_limit=DEFAULT_SMEM_LIMIT):
    """Run the forward with ``launch(plan, args)``; ``xp`` is numpy (emulation) or cupy."""
    B, H, Hkv, Nq, Nk, D = validate_inputs(q, k, v, key_mask, lengths)
    Dv = int(v.shape[-1])
    Dp = compiled_head_dim(q, v)
    sc = resolve_scale(scale, D)
    dt = numpy.dtype(q.dtype)
    o = xp.zeros((B, H, Nq, Dp), dtype=dt)
    lse = xp.full((B, H, Nq), -numpy.inf, dtype=numpy.float32)
    if B * H * Nq == 0:
        return xp.ascontiguousarray(o[..., :Dv]), lse
    qp, kp, vp = (pad_head_dim(xp, x, Dp) for x in (q, k, v))
    km, ln = _masks(xp, key_mask, lengths)
    plan = plan_launch("fwd", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal)
    check_shared_memory(plan.smem, smem_limit, plan.name)
    launch(plan, (qp, kp, vp, o, lse, ln, km, numpy.int32(H), numpy.int32(Hkv), numpy.int32(Nq),
                  numpy.int32(Nk), numpy.float32(sc)))
    if Dp != Dv:
        o = xp.ascontiguousarray(o[..., :Dv])
    return o, lse


def _backward(xp, launch, q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
              lengths=None, smem_limit=DEFAULT_SMEM_LIMIT):
    B, H, Hkv, Nq, Nk, D = validate_inputs(q, k, v, key_mask, lengths, o=o, do=do, lse=lse)
    Dv = int(v.shape[-1])
    Dp = compiled_head_dim(q, v)
    sc = resolve_scale(scale, D)
    dt = numpy.dtype(q.dtype)
    if B * H * Nq == 0 or Nk == 0:
        return (xp.zeros(q.shape, dtype=dt), xp.zeros(k.shape, dtype=dt), xp.zeros(v.shape, dtype=dt))
    qp, kp, vp, op, dop = (pad_head_dim(xp, x, Dp) for x in (q, k, v, o, do))
    lse32 = xp.ascontiguousarray(lse.astype(numpy.float32))
    km, ln = _masks(xp, key_mask, lengths)

    dvec = xp.empty((B, H, Nq), dtype=numpy.float32)
    plan = plan_launch("bwd_dot", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp)
    launch(plan, (op, dop, dvec, numpy.int32(B * H * Nq), numpy.int32(Dp)))

    dk32 = xp.empty((B, H, Nk, Dp), dtype=numpy.float32)
    dv32 = xp.empty((B, H, Nk, Dp), dtype=numpy.float32)
    plan = plan_launch("bwd_dkdv", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal)
    check_shared_memory(plan.smem, smem_limit, plan.name)
    common = (ln, km, numpy.int32(H), numpy.int32(Hkv), numpy.int32(Nq), numpy.int32(Nk),
              numpy.float32(sc))
    launch(plan, (qp, kp, vp, dop, lse32, dvec, dk32, dv32) + common)

    dq = xp.empty((B, H, Nq, Dp), dtype=dt)
    plan = plan_launch("bwd_dq", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal)
    check_shared_memory(plan.smem, smem_limit, plan.name)
    launch(plan, (qp, kp, vp, dop, lse32, dvec, dq) + common)

    G = H // Hkv
    if G > 1:   # GQA: sum the per-q-head gradients of each kv group (heads hk*G .. hk*G+G-1)
        dk32 = dk32.reshape(B, Hkv, G, Nk, Dp).sum(axis=2)
        dv32 = dv32.reshape(B, Hkv, G, Nk, Dp).sum(axis=2)
    dk = xp.ascontiguousarray(dk32[..., :D].astype(dt))
    dv = xp.ascontiguousarray(dv32[..., :Dv].astype(dt))
    dq = xp.ascontiguousarray(dq[..., :D])
    return dq, dk, dv


# ------------------------------------------------------------------------ CuPy side
def _cupy():
    return cupy_or_none()


def unavailable_reason():
    """None when CuPy imports, a CUDA device is usable and NVRTC loads, else why not."""
    cp = _cupy()
    if cp is None:
        return "CuPy is not installed"
    try:
        if not cp.is_available():
            return "no CUDA device is available (cupy.is_available() is False)"
        cp.cuda.nvrtc.getVersion()
    except (RuntimeError, OSError, ImportError, AttributeError) as exc:
        return f"NVRTC cannot be used: {type(exc).__name__}: {exc}"
    return None


def is_available() -> bool:
    """True when the kernels can be compiled and launched here (see :func:`unavailable_reason`)."""
    return unavailable_reason() is None


@functools.lru_cache(maxsize=None)
def _module(dtype_name: str, D: int, causal: bool):
    """Compile (once per dtype/D/causal) the four kernels of one configuration with NVRTC."""
    cp = _cupy()
    names = [kernel_name(kind, dtype_name, D, causal) for kind in _KINDS]
    options = ["-std=c++17"]
    try:
        cuda_path = cp.cuda.get_cuda_path()
        if cuda_path:
            options.append("-I" + os.path.join(cuda_path, "include"))  # cuda_fp16.h
    except Exception:
        pass
    mod = cp.RawModule(code=kernel_source(), options=tuple(options), name_expressions=names)
    return mod


def _device_smem_limit() -> int:
    cp = _cupy()
    try:
        return int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])
    except Exception:
        try:
            # cudaDevAttrMaxSharedMemoryPerBlockOptin == 97
            return int(cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id))
        except Exception:
            return DEFAULT_SMEM_LIMIT


def _cupy_launch(dtype_name: str, D: int, causal: bool):
    cp = _cupy()
    null = numpy.uint64(0)  # a null device pointer (8 bytes)

    def launch(plan: LaunchPlan, args):
        fn = _module(dtype_name, D, causal).get_function(plan.name)
        if plan.smem > DEFAULT_SMEM_LIMIT:
            fn.max_dynamic_shared_size_bytes = plan.smem
        fn(plan.grid, plan.block, tuple(null if a is None else a for a in args),
           shared_mem=plan.smem)

    del cp
    return launch


def _require_gpu(q):
    cp = _cupy()
    if cp is None:
        raise RuntimeError("flash_cuda needs CuPy (pip install cupy-cuda12x) and an NVIDIA GPU")
    if not isinstance(q, cp.ndarray):
        raise TypeError(f"q must be a cupy.ndarray, got {type(q).__name__}")
    return cp


def flash_attention_forward(q, k, v, *, causal=False, scale=None, key_mask=None, lengths=None):
    """Flash-attention forward on CuPy arrays; returns ``(o, lse)``."""
    cp = _require_gpu(q)
    validate_inputs(q, k, v, key_mask, lengths)
    dt = numpy.dtype(q.dtype).name
    launch = _cupy_launch(dt, compiled_head_dim(q, v), bool(causal))
    return _forward(cp, launch, q, k, v, causal=bool(causal), scale=scale, key_mask=key_mask,
                    lengths=lengths, smem_limit=_device_smem_limit())


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
                             lengths=None):
    """Flash-attention backward on CuPy arrays; returns ``(dq, dk, dv)`` in q's dtype.

    ``do`` (the upstream gradient) is cast to q's dtype if it differs (an autograd engine may
    hand a float32 gradient to a float16 graph); ``lse`` is used as float32."""
    cp = _require_gpu(q)
    if getattr(do, "dtype", None) is not None and numpy.dtype(do.dtype) != numpy.dtype(q.dtype):
        do = do.astype(q.dtype)
    validate_inputs(q, k, v, key_mask, lengths, o=o, do=do, lse=lse)
    dt = numpy.dtype(q.dtype).name
    launch = _cupy_launch(dt, compiled_head_dim(q, v), bool(causal))
    return _backward(cp, launch, q, k, v, o, lse, do, causal=bool(causal), scale=scale,
                     key_mask=key_mask, lengths=lengths, smem_limit=_device_smem_limit())
