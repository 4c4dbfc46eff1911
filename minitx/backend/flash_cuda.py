"""CuPy launcher for the hand-written flash-attention kernels in ``kernels/`` (``flash_attn.cu``).

Public API (CuPy arrays in, CuPy arrays out)::

    o, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)

Shapes: ``q`` (B, H, Nq, D), ``k`` (B, Hkv, Nk, D), ``v`` (B, Hkv, Nk, Dv) with ``Hkv`` dividing
``H`` (grouped-query attention: q head ``h`` reads kv head ``h // (H // Hkv)``). ``o``
(B, H, Nq, Dv) has q's dtype, ``lse`` (B, H, Nq) is float32. Inputs may be non-contiguous views
(they are copied into contiguous, padded buffers); ``key_mask``/``lengths`` may be NumPy or CuPy
arrays. Masks: ``lengths`` (B,) int keeps keys ``j < lengths[b]``; ``key_mask`` (B, Nk) bool keeps
keys where True; ``causal`` keeps ``j <= i + (Nk - Nq)`` (bottom-right aligned, like
``torch.nn.attention.bias.causal_lower_right``; PyTorch's ``is_causal=True`` is top-left aligned
and differs when Nq != Nk). A query row that keeps no key gets ``o = 0`` and ``lse = -inf``; its
gradients are zero.

Four kernel families. The tiled ones are chosen by dtype (:func:`family`):

* float16 -> ``tc``: tensor cores (``mma.sync`` m16n8k16, ``ldmatrix``, ``cp.async``); needs
  sm_80+ (:func:`decline_reason` declines float16 on an older GPU, naming it);
* float32 -> ``simt``: register-tiled CUDA-core kernels (``cp.async`` on sm_80+, plain 16-byte
  copies below; they run on any GPU CuPy supports);

and two float32-only families chosen by ``MINITX_FLASH_KERNEL``: ``naive``
(``kernels/flash_naive.cuh``, the one to read first: one thread per row, the online softmax,
everything read from global memory), and ``tf32`` (``kernels/flash_tf32.cuh``: float32 on the
tensor cores with the 3xTF32 split, each operand written as two tf32 numbers and each product
taken as three ``mma.sync`` m16n8k8, fp32 accuracy; sm_80+). :func:`kernel_choice` reads that
variable (``tiled``, the default, ``naive``, ``tf32``, or one of the fp16 levers of
:data:`LEVERS`: ``tc_bm128``, ``tc_kvreg``, ``tc_onepass``, each the ``tc`` family with one kernel
replaced, ``kernels/flash_tc_levers.cuh``) at every call; :func:`chosen_kernel` says which
family runs a dtype and :func:`pass_kernel` which kernel runs each of its passes; every launch
is logged at DEBUG level on the ``minitx.flash_cuda`` logger with the kernel's name. A float16
call under ``naive`` or ``tf32``, or a float32 call under a lever, is declined with the reason
(it is not silently computed another way).
The forward and the backward each read the choice when they run; every family writes the same
``o`` and ``lse``, so any backward is exact for any forward's outputs.

Head dims 32/64/128 are compiled; q, k and v are zero padded to the smallest one >= max(D, Dv)
(zero columns of q/k add nothing to the scores, zero columns of v give zero output columns which
are sliced off). ``scale`` defaults to ``1/sqrt(D)`` of the *unpadded* D. The kernels compute
dK/dV per *query* head into a float32 (B, H, Nk, D) buffer; for GQA the ``H // Hkv`` heads of a
group are summed here, in Python (deterministic, no atomics; the one exception is the opt-in
``tc_onepass`` lever, whose dK/dV kernel adds dQ into a float32 buffer with ``atomicAdd``).

Dispatchers ask :func:`decline_reason` (pure Python on ``.shape``/``.dtype``; ``None`` = the kernels
take these arrays) and :func:`unavailable_reason` (``None`` = CuPy, a GPU and NVRTC are usable);
``supports``/``is_available`` are the boolean forms.

CuPy is imported lazily inside functions only; everything that does not launch a kernel
(validation, padding decisions, launch plans, shared-memory arithmetic) is plain Python and is
unit tested without a GPU. The same ``_forward``/``_backward`` drivers run the kernels in the
CPU emulation harness of ``tests/gpu/cuda`` through a different ``launch`` callable.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import re
from dataclasses import dataclass

import numpy

from . import _cupy as _cupy_state, cupy_or_none  # the backend module owns the CuPy import

# The planning helpers (names, tile sizes, shared memory, launch plans, validation) are
# public too, so tests check them without a GPU.
__all__ = [
    "flash_attention_forward", "flash_attention_backward", "is_available", "supports",
    "decline_reason", "unavailable_reason", "family", "kernel_choice", "chosen_kernel",
    "module_names", "kernel_source", "kernel_path", "kernel_files", "padded_head_dim",
    "smem_bytes", "smem_bytes_of", "tile_rows", "kernel_name", "all_kernel_names", "plan_launch",
    "validate_inputs", "check_shared_memory", "SUPPORTED_HEAD_DIMS", "THREADS",
    "DEFAULT_SMEM_LIMIT", "MAX_GRID_Y", "FP16_MIN_CC", "KERNEL_ENV", "KERNEL_CHOICES", "LEVERS",
    "pass_kernel", "family_kinds",
]

# Limits every launch respects: the compiled head dims, the block size, the shared memory a
# block gets without opting in, and grid.y, which holds one (batch, head) pair per row.
SUPPORTED_HEAD_DIMS = (32, 64, 128)
THREADS = 128          # threads per block (all kernels): 4 warps
DEFAULT_SMEM_LIMIT = 48 * 1024   # per-block dynamic shared memory without the opt-in attribute
MAX_GRID_Y = 65535     # grid.y holds B * H
FP16_MIN_CC = 80       # mma.sync m16n8k16 / m16n8k8.tf32 and cp.async need sm_80
# Each dtype's C type and tiled family (fp16 on tensor cores, fp32 on CUDA cores); the naive and
# tf32 families are float32 only.
_CTYPE = {"float32": "float", "float16": "__half"}
_FAMILY = {"float32": "simt", "float16": "tc"}          # the tiled family of each dtype
_FAMILY_DTYPE = {"simt": "float32", "tc": "float16", "naive": "float32", "tf32": "float32",
                 "tc_bm128": "float16", "tc_kvreg": "float16", "tc_onepass": "float16"}
KERNEL_ENV = "MINITX_FLASH_KERNEL"
# tiled: tc for float16, simt for float32; naive and tf32: float32 only, that family; the three
# tc_* levers: float16 only, the tc family with one pass changed (LEVERS)
KERNEL_CHOICES = ("tiled", "naive", "tf32", "tc_bm128", "tc_kvreg", "tc_onepass")
# The fp16 levers, each the tc family with one kernel replaced, so that a GPU run can time each
# change on its own: the pass a lever replaces runs that lever's kernel, the others tc's.
#   tc_bm128:   forward with two 16-row m-tiles per warp (128 query rows a block): every K and
#               V fragment read from shared memory feeds two mma instead of one
#   tc_kvreg:   dK/dV with the block's K and V rows kept as mma A fragments in registers (read
#               from shared memory once, not once per query tile)
#   tc_onepass: dK/dV that also adds dS K into a float32 dQ with atomicAdd (FlashAttention-2's
#               single pass: S and dP are computed once, not twice; dQ's summation order, and
#               so its last bits, then vary from run to run); there is no dQ pass
LEVERS = {"tc_bm128": {"fwd": "tc_bm128"}, "tc_kvreg": {"bwd_dkdv": "tc_kvreg"},
          "tc_onepass": {"bwd_dkdv": "tc_onepass", "bwd_dq": None}}
_TENSOR_CORE_FAMILIES = ("tc", "tf32") + tuple(LEVERS)   # need sm_80+
log = logging.getLogger("minitx.flash_cuda")
_KINDS = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_dot")
_KIND_INDEX = {"fwd": 0, "bwd_dkdv": 1, "bwd_dq": 2}   # the `kind` of *_smem_bytes<D>(kind)


def kernel_path() -> str:
    """The kernel file NVRTC and nvcc compile (it includes the others)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "flash_attn.cu")


def kernel_files() -> list:
    """Every source file of the kernels (the .cu and the .cuh it includes)."""
    d = os.path.dirname(kernel_path())
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith((".cu", ".cuh")))


_INCLUDE = re.compile(r'^\s*#include\s+"([\w.]+\.cuh)"\s*$')


def kernel_source() -> str:
    """The kernels as one self-contained source: ``flash_attn.cu`` with its local ``#include
    "*.cuh"`` lines replaced by the files (once each). NVRTC gets this string, so CuPy's
    compile cache (keyed on the source text) changes whenever any kernel file changes."""
    kdir = os.path.dirname(kernel_path())
    seen = set()

    # Inline each local #include once, as the include guard would, marking where each file
    # begins and ends so compiler errors can be traced to their file.
    def expand(path):
        out = []
        with open(path, encoding="utf-8") as fh:
            for line in fh.read().splitlines():
                m = _INCLUDE.match(line)
                if m and os.path.isfile(os.path.join(kdir, m.group(1))):
                    if m.group(1) not in seen:
                        seen.add(m.group(1))
                        out.append(f"// ---- begin {m.group(1)}")
                        out.extend(expand(os.path.join(kdir, m.group(1))))
                        out.append(f"// ---- end {m.group(1)}")
                    continue
                # '#pragma once' means nothing in one concatenated source, so it is dropped.
                if line.strip() == "#pragma once":
                    continue
                out.append(line)
        return out

    return "\n".join(expand(kernel_path())) + "\n"


# ------------------------------------------------------------------------ pure-Python planning
def padded_head_dim(d: int) -> int:
    """The compiled head dim used for ``d`` (the smallest supported size >= d)."""
    d = int(d)
    if d < 1:
        raise ValueError(f"head dim D must be >= 1, got {d}")
    for s in SUPPORTED_HEAD_DIMS:
        if d <= s:
            return s
    raise ValueError(f"head dim D must be <= {SUPPORTED_HEAD_DIMS[-1]} for the flash kernel, "
                     f"got {d}")


def _dtype_name(dtype) -> str:
    name = numpy.dtype(dtype).name
    if name not in _CTYPE:
        raise TypeError(f"dtype must be float32 or float16, got {name}")
    return name


def family(dtype) -> str:
    """The tiled family of a dtype: ``"tc"`` (fp16, tensor cores) or ``"simt"`` (fp32, CUDA
    cores)."""
    return _FAMILY[_dtype_name(dtype)]


def _checked_choice(value, source: str) -> str:
    choice = str(value).strip().lower()
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{source} must be one of {KERNEL_CHOICES}, got {value!r}")
    return choice


def kernel_choice() -> str:
    """``$MINITX_FLASH_KERNEL`` ("tiled" when unset or empty), validated.

    The one place the variable is read, at every call (not at import), so a test or a notebook
    can switch kernels between calls; an unknown value raises ``ValueError`` naming the variable,
    the allowed values and the value given, rather than silently running the default."""
    value = os.environ.get(KERNEL_ENV, "")
    return "tiled" if not value.strip() else _checked_choice(value, KERNEL_ENV)


def _choice_reason(dtype_name: str, choice: str):
    """Why the chosen kernel cannot take ``dtype_name`` (None when it can)."""
    if choice in ("naive", "tf32") and dtype_name != "float32":
        return f"{KERNEL_ENV}={choice} takes float32 only (got {dtype_name})"
    if choice in LEVERS and dtype_name != "float16":
        return f"{KERNEL_ENV}={choice} takes float16 only (got {dtype_name})"
    return None


def chosen_kernel(dtype, choice=None) -> str:
    """The family that runs arrays of ``dtype``: ``"naive"``, ``"simt"``, ``"tc"``, ``"tf32"`` or
    one of the fp16 levers (:data:`LEVERS`).

    ``choice`` is one of :data:`KERNEL_CHOICES`; None reads :func:`kernel_choice`. Tests
    and dispatchers ask it so that the kernel a call will use is observable, not inferred. Raises
    ``ValueError`` when the choice cannot take the dtype (naive or tf32 and float16, a lever and
    float32)."""
    name = _dtype_name(dtype)
    choice = kernel_choice() if choice is None else _checked_choice(choice, "kernel")
    reason = _choice_reason(name, choice)
    if reason is not None:
        raise ValueError(reason)
    return _FAMILY[name] if choice == "tiled" else choice


# Tile shapes; mirror TcCfg<D> (flash_tc.cuh), Tf32Cfg<D> (flash_tf32.cuh) and SimtCfg<D>
# (flash_simt.cuh).
def _tc_cfg(D):
    return dict(rows=64, stride=D + 8, fwd_bn=64, dq_bn=32 if D == 128 else 64,
                dkdv_bq=32 if D == 128 else 64)


def _tc_bm128_cfg(D):
    # Q in registers for D <= 64 (two m-tiles of D/16 fragments); at D = 128 the two m-tiles'
    # fp32 O accumulators alone take 128 registers, so Q is read from shared memory and the key
    # tile is halved
    return dict(rows=128, stride=D + 8, fwd_bn=32 if D == 128 else 64)


def _tc_kvreg_bq(D):
    # TcKvregCfg<D>::kBQ: at D = 128 the K and V fragments (64 registers) cost half the tile
    return 16 if D == 128 else _tc_cfg(D)["dkdv_bq"]


def _tc_onepass_ds_bytes(D):
    """The tc_onepass dK/dV kernel's extra shared memory: the block's dS^T tile (64 keys x BQ
    queries, fp16, rows padded by 8 halves) read back as dS for dQ += dS K."""
    c = _tc_cfg(D)
    return 2 * c["rows"] * (c["dkdv_bq"] + 8)


def _tf32_cfg(D):
    streamed = 32 if D < 128 else None  # dQ's key tiles and dK/dV's query tiles
    return dict(rows=64, stride=D + 4, fwd_bn=32 if D == 128 else 64, dq_bn=streamed or 16,
                dkdv_bq=streamed or 8)


def _simt_cfg(D):
    return dict(stride=D + 4, fwd_bm=64, fwd_bn=32 if D == 128 else 64,
                dq_bm=32 if D == 128 else 64, dq_bn=32, dkdv_bk=32 if D == 128 else 64, dkdv_bq=32)


def pass_kernel(fam: str, kind: str):
    """The kernel family whose ``kind`` kernel the family ``fam`` launches: ``fam`` itself, or for
    a lever (:data:`LEVERS`) its own kernel for the pass it changes, tc's for the others, None
    for a pass it does not have (tc_onepass computes dQ inside its dK/dV kernel)."""
    if fam not in _FAMILY_DTYPE:
        raise ValueError(f"family must be one of {tuple(_FAMILY_DTYPE)}, got {fam!r}")
    if kind == "bwd_dot":
        return fam
    if kind not in _KIND_INDEX:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if fam in LEVERS:
        return LEVERS[fam].get(kind, "tc")
    return fam


def family_kinds(fam: str) -> tuple:
    """The passes a family launches, in order (every family but tc_onepass has all four)."""
    return tuple(kind for kind in _KINDS if pass_kernel(fam, kind) is not None)


def _family_of(dtype, fam):
    """``fam`` checked against ``dtype`` (None: the tiled family of the dtype)."""
    if fam is None:
        return family(dtype)
    if fam not in _FAMILY_DTYPE:
        raise ValueError(f"family must be one of {tuple(_FAMILY_DTYPE)}, got {fam!r}")
    if _dtype_name(dtype) != _FAMILY_DTYPE[fam]:
        raise TypeError(f"the {fam} kernels take {_FAMILY_DTYPE[fam]}, got {_dtype_name(dtype)}")
    return fam


def _kernel_of(dtype, fam, kind):
    """The kernel family that runs pass ``kind`` of family ``fam`` (checked against ``dtype``);
    ``ValueError`` for a pass the family does not have."""
    fam = _family_of(dtype, fam)
    impl = pass_kernel(fam, kind)
    if impl is None:
        raise ValueError(f"the {fam} family has no {kind} kernel (its passes: "
                         f"{family_kinds(fam)})")
    return impl


def tile_rows(kind: str, dtype, D: int, fam=None) -> int:
    """Rows (queries for fwd/dq, keys for dkdv) one block owns: grid.x = ceil(N / tile_rows).
    ``fam`` None is the tiled family of the dtype; ``"naive"`` owns one row per thread."""
    if kind not in _KIND_INDEX:
        raise ValueError(f"kind must be one of {tuple(_KIND_INDEX)}, got {kind!r}")
    fam = _kernel_of(dtype, fam, kind)
    if fam == "naive":
        return THREADS
    if fam == "tc_bm128":
        return 128  # TcBm128Cfg kRows: 4 warps x 2 m-tiles x 16 rows
    if fam in _TENSOR_CORE_FAMILIES:
        return 64   # TcCfg / Tf32Cfg kRows: 4 warps x 16 rows
    c = _simt_cfg(D)
    return {"fwd": c["fwd_bm"], "bwd_dq": c["dq_bm"], "bwd_dkdv": c["dkdv_bk"]}[kind]


def smem_bytes(kind: str, dtype, D: int, fam=None) -> int:
    """Dynamic shared memory of one block; mirrors ``tc_smem_bytes<D>``, ``tf32_smem_bytes<D>``
    and ``simt_smem_bytes<D>`` (the naive kernels use none)."""
    if kind == "bwd_dot":
        return 0
    if kind not in _KIND_INDEX:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    fam = _kernel_of(dtype, fam, kind)
    if fam == "naive":
        return 0
    if fam == "tc_bm128":        # Q | K | V, fp16
        c = _tc_bm128_cfg(D)
        return 2 * (c["rows"] + 2 * c["fwd_bn"]) * c["stride"]
    extra = _tc_onepass_ds_bytes(D) if fam == "tc_onepass" else 0   # + dS^T
    if fam == "tc_kvreg":        # tc's dK/dV layout with the lever's query tile
        bq = _tc_kvreg_bq(D)
        return 2 * (2 * 64 + 4 * bq) * (D + 8) + 4 * 4 * bq
    # Bytes = element size × (rows of the tiles held at once) × padded row stride. The two
    # tensor-core families share one layout, double-buffered ("2 stages") in the backward: fp16
    # tiles (2 bytes) for tc, fp32 (4 bytes) for tf32; lse and Dvec are fp32 in both.
    if fam in _TENSOR_CORE_FAMILIES:
        c, e = (_tf32_cfg(D), 4) if fam == "tf32" else (_tc_cfg(D), 2)
        S = c["stride"]
        if kind == "fwd":        # Q | K | V
            return e * (c["rows"] + 2 * c["fwd_bn"]) * S
        if kind == "bwd_dkdv":   # K, V | 2 stages x (Q, dO) | 2 stages x (lse, Dvec)
            return e * (2 * c["rows"] + 4 * c["dkdv_bq"]) * S + 4 * 4 * c["dkdv_bq"] + extra
        return e * (2 * c["rows"] + 4 * c["dq_bn"]) * S   # Q, dO | 2 stages x (K, V)
    # SIMT tiles are fp32 (4 bytes), plus a score tile (P or dS) whose rows are padded by 4
    # floats, like the D + 4 stride, to spread rows over shared-memory banks.
    c = _simt_cfg(D)
    S = c["stride"]
    if kind == "fwd":            # Q | K | V | P, fp32
        return 4 * ((c["fwd_bm"] + 2 * c["fwd_bn"]) * S + c["fwd_bm"] * (c["fwd_bn"] + 4))
    if kind == "bwd_dkdv":       # K, V | Q, dO | P^T/dS^T | lse, Dvec
        return 4 * (2 * (c["dkdv_bk"] + c["dkdv_bq"]) * S + c["dkdv_bk"] * (c["dkdv_bq"] + 4)
                    + 2 * c["dkdv_bq"])
    # Q, dO | K, V | dS
    return 4 * (2 * (c["dq_bm"] + c["dq_bn"]) * S + c["dq_bm"] * (c["dq_bn"] + 4))


def kernel_name(kind: str, dtype, D: int = 64, causal: bool = False, fam=None) -> str:
    """The C++ name expression of one instantiation, e.g. ``flash_fwd_tc<64, true>`` (``fam``
    None: the tiled family of the dtype)."""
    name = _dtype_name(dtype)
    if kind == "bwd_dot":
        return f"flash_bwd_dot<{_CTYPE[name]}>"
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"D must be one of {SUPPORTED_HEAD_DIMS}, got {D}")
    fam = _kernel_of(name, fam, kind)
    return f"flash_{kind}_{fam}<{int(D)}, {'true' if causal else 'false'}>"


_NAME = re.compile(r"flash_(fwd|bwd_dkdv|bwd_dq)_(tc_bm128|tc_kvreg|tc_onepass|tc|simt|naive|tf32)"
                   r"<(\d+), (true|false)>$")


def smem_bytes_of(name: str) -> int:
    """Dynamic shared memory of the instantiation ``name`` (0 for ``flash_bwd_dot<T>``)."""
    m = _NAME.match(name)
    if m is None:
        if name.startswith("flash_bwd_dot<"):
            return 0
        raise ValueError(f"not a flash kernel instantiation: {name!r}")
    kind, fam, D = m.group(1), m.group(2), int(m.group(3))
    return smem_bytes(kind, _FAMILY_DTYPE[fam], D, fam)


def all_kernel_names(dtypes=("float32", "float16"), head_dims=SUPPORTED_HEAD_DIMS,
                     kinds=_KINDS, naive=True, tf32=True, levers=True) -> list:
    """Every instantiation, once each: the tiled family of each dtype, then (float32 in
    ``dtypes``) the naive kernels (``naive``) and the 3xTF32 ones (``tf32``), then (float16 in
    ``dtypes``) each fp16 lever's own kernel (``levers``); ``flash_bwd_dot<T>`` once per
    dtype."""
    names = []
    fams = [(dt, None) for dt in dtypes]
    if naive and "float32" in dtypes:
        fams.append(("float32", "naive"))
    if tf32 and "float32" in dtypes:
        fams.append(("float32", "tf32"))
    if levers and "float16" in dtypes:
        fams += [("float16", lever) for lever in LEVERS]
    # Each family: its three kernels for every head dim, causal or not; the Dvec pre-pass once
    # per dtype (it belongs to no family).
    for dt, fam in fams:
        for kind in kinds:
            if kind == "bwd_dot":
                if fam is None:
                    names.append(kernel_name(kind, dt))
                continue
            if fam in LEVERS and pass_kernel(fam, kind) != fam:
                continue          # tc's kernel, or no kernel: listed once, with tc
            for D in head_dims:
                for causal in (False, True):
                    names.append(kernel_name(kind, dt, D, causal, fam))
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
                causal: bool = False, fam=None) -> LaunchPlan:
    """Grid/block/shared memory of one kernel launch (D is the padded, compiled head dim;
    ``fam`` None is the tiled family of the dtype, or ``"naive"``)."""
    if B * H > MAX_GRID_Y:
        raise ValueError(f"B*H must be <= {MAX_GRID_Y} (grid.y), got {B * H}")
    name = kernel_name(kind, dtype, D, causal, fam)
    if kind == "bwd_dot":
        rows = B * H * Nq
        return LaunchPlan(name, (max(1, -(-rows // (THREADS // 32))), 1, 1), (THREADS, 1, 1), 0)
    n = Nk if kind == "bwd_dkdv" else Nq
    tiles = -(-n // tile_rows(kind, dtype, D, fam))
    return LaunchPlan(name, (max(tiles, 1), B * H, 1), (THREADS, 1, 1),
                      smem_bytes(kind, dtype, D, fam))

def validate_inputs(q, k, v, key_mask=None, lengths=None, **extra):
    """Check shapes/dtypes (works on NumPy or CuPy arrays); returns (B, H, Hkv, Nq, Nk, D).

    ``extra`` may hold ``o``/``do`` (B, H, Nq, Dv) and ``lse`` (B, H, Nq) for the backward.
    ``v`` may have its own last dim Dv (<= 128 like D).
    """
    # Ranks and dtypes: every array 4-D, k and v in q's dtype (float32 or float16).
    for nm, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{nm} must be 4-D (B, H, N, D), got shape "
                             f"{getattr(x, 'shape', None)}")
    dt = numpy.dtype(q.dtype)
    if dt.name not in _CTYPE:
        raise TypeError(f"q must be float32 or float16, got {dt.name}")
    for nm, x in (("k", k), ("v", v)):
        if numpy.dtype(x.dtype) != dt:
            raise TypeError(f"{nm} must have q's dtype {dt.name}, got {numpy.dtype(x.dtype).name}")
    # Shapes: k and v share (B, Hkv, Nk); Hkv divides H (grouped-query heads); D and Dv must
    # fit a compiled head dim.
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
    # Masks: key_mask (B, Nk) of bools or 0/1, lengths (B,) of integers.
    if key_mask is not None:
        if tuple(key_mask.shape) != (B, Nk):
            raise ValueError(f"key_mask must have shape {(B, Nk)}, got {tuple(key_mask.shape)}")
        if numpy.dtype(key_mask.dtype).kind not in "biu":
            raise TypeError(f"key_mask must be bool (or 0/1 integers), got "
                            f"{numpy.dtype(key_mask.dtype).name}")
    if lengths is not None:
        if tuple(lengths.shape) != (B,):
            raise ValueError(f"lengths must have shape {(B,)}, got {tuple(lengths.shape)}")
        if numpy.dtype(lengths.dtype).kind not in "iu":
            raise TypeError(f"lengths must be an integer array, got "
                            f"{numpy.dtype(lengths.dtype).name}")
    # Backward only: o and dO have the output's shape (B, H, Nq, Dv), lse one value per row.
    for nm in ("o", "do"):
        x = extra.get(nm)
        if x is not None:
            if tuple(x.shape) != (B, H, Nq, Dv):
                raise ValueError(f"{nm} must have the output's shape (B, H, Nq, Dv) = "
                                 f"{(B, H, Nq, Dv)}, got {tuple(x.shape)}")
            if numpy.dtype(x.dtype) != dt:
                raise TypeError(f"{nm} must have q's dtype {dt.name}, got "
                                f"{numpy.dtype(x.dtype).name}")
    lse = extra.get("lse")
    if lse is not None and tuple(lse.shape) != (B, H, Nq):
        raise ValueError(f"lse must have shape {(B, H, Nq)}, got {tuple(lse.shape)}")
    return B, H, Hkv, Nq, Nk, D


def compiled_head_dim(q, v) -> int:
    """The compiled head dim the kernels run with for ``q`` (.., D) and ``v`` (.., Dv)."""
    return padded_head_dim(max(int(q.shape[-1]), int(v.shape[-1])))


def _tensor_core_reason(q, fam):
    """Why the tensor-core family ``fam`` cannot run ``q`` here (a GPU older than sm_80), else
    None.

    Only asked for CuPy arrays; without CuPy or a device there is nothing to check here
    (:func:`unavailable_reason` says why the kernels cannot run at all)."""
    if type(q).__module__.split(".")[0] != "cupy":
        return None
    cp = _cupy()
    if cp is None:
        return None
    try:
        cc = int(cp.cuda.Device().compute_capability)
    except (AttributeError, RuntimeError, ValueError):   # no device / a CuPy stand-in
        return None
    # Both tensor-core families need sm_80 (mma.sync m16n8k16 and m16n8k8.tf32, cp.async).
    if cc < FP16_MIN_CC:
        if fam == "tf32":
            return (f"{KERNEL_ENV}=tf32 needs tensor cores with tf32 (mma.sync m16n8k8, "
                    f"cp.async: sm_80+); this GPU is sm_{cc}")
        return (f"float16 needs the tensor-core kernels (mma.sync m16n8k16, cp.async: sm_80+); "
                f"this GPU is sm_{cc}")
    return None


def decline_reason(q, k, v, key_mask=None, lengths=None, kernel=None):
    """``None`` when the kernels take these arrays, else a short sentence saying what declined.

    Pure Python on ``.shape``/``.dtype`` (NumPy or CuPy arrays; no GPU needed; never raises on
    odd arrays): 4-D shapes that fit together, float32/float16, head dims <= 128, B*H within the
    grid limit, mask/lengths shapes and dtypes; the kernel choice (``kernel``, or
    :func:`kernel_choice` when None: naive and tf32 take float32 only; an invalid
    ``MINITX_FLASH_KERNEL`` raises ``ValueError``); for CuPy arrays on a tensor-core family
    (float16, or float32 under ``tf32``) also a GPU of sm_80 or newer. Whether a GPU is usable
    at all is :func:`unavailable_reason`.
    """
    choice = kernel_choice() if kernel is None else _checked_choice(kernel, "kernel")
    # The checks of validate_inputs, answered with a sentence instead of an exception:
    # first, are these 4-D arrays at all.
    for nm, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
            return f"{nm} is a {type(x).__name__}, not an array"
        if x.ndim != 4:
            return f"{nm} is {x.ndim}-D (kernels take (B, H, N, D))"
    # Read each dtype defensively (an array-like may have none NumPy understands).
    dts = {}
    for nm, x in (("q", q), ("k", k), ("v", v), ("key_mask", key_mask), ("lengths", lengths)):
        if x is None:
            continue
        try:
            dts[nm] = numpy.dtype(x.dtype)
        except (TypeError, AttributeError):
            return f"{nm} has no NumPy dtype ({getattr(x, 'dtype', None)!r})"
    dt = dts["q"]
    if dt.name not in _CTYPE:
        return f"dtype {dt.name} (kernels take float32/float16)"
    for nm in ("k", "v"):
        if dts[nm] != dt:
            return f"{nm} dtype {dts[nm].name} differs from q's {dt.name}"
    # Shapes: k and v share (B, Hkv, Nk), the batch and D match q's, Hkv divides H.
    B, H, Nq, D = (int(n) for n in q.shape)
    Bk, Hkv, Nk, Dk = (int(n) for n in k.shape)
    Dv = int(v.shape[3])
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        return f"v shape {tuple(v.shape)} does not match k's (B, Hkv, Nk) = {tuple(k.shape[:3])}"
    if Bk != B:
        return f"k has batch {Bk}, q has {B}"
    if Dk != D:
        return f"k head dim {Dk} differs from q's {D}"
    if Hkv < 1 or H % Hkv:
        return f"{H} query heads are not a multiple of {Hkv} key/value heads"
    # Head dims within the compiled sizes, and B·H within grid.y.
    if D < 1 or Dv < 1:
        return "head dim 0"
    if D > SUPPORTED_HEAD_DIMS[-1]:
        return f"head dim {D} > {SUPPORTED_HEAD_DIMS[-1]}"
    if Dv > SUPPORTED_HEAD_DIMS[-1]:
        return f"value head dim {Dv} > {SUPPORTED_HEAD_DIMS[-1]}"
    if B * H > MAX_GRID_Y:
        return f"B*H = {B * H} exceeds the grid limit {MAX_GRID_Y}"
    # Masks of the right shape and dtype.
    if key_mask is not None:
        if tuple(getattr(key_mask, "shape", ())) != (B, Nk):
            return (f"key_mask shape {tuple(getattr(key_mask, 'shape', ()))} is not (B, Nk) = "
                    f"{(B, Nk)}")
        if dts["key_mask"].kind not in "biu":
            return f"key_mask dtype {dts['key_mask'].name} (bool or 0/1 integers)"
    if lengths is not None:
        if tuple(getattr(lengths, "shape", ())) != (B,):
            return f"lengths shape {tuple(getattr(lengths, 'shape', ()))} is not (B,) = {(B,)}"
        if dts["lengths"].kind not in "iu":
            return f"lengths dtype {dts['lengths'].name} (integers)"
    # Last, what the chosen kernel and this GPU can take: naive and tf32 are float32 only, and
    # the tensor-core families (float16, tf32) need sm_80+.
    reason = _choice_reason(dt.name, choice)
    if reason is not None:
        return reason
    fam = _FAMILY[dt.name] if choice == "tiled" else choice
    if fam in _TENSOR_CORE_FAMILIES:
        return _tensor_core_reason(q, fam)
    return None


def supports(q, k, v, key_mask=None, lengths=None, kernel=None) -> bool:
    """True when the kernels take these arrays: ``decline_reason(...) is None``."""
    return decline_reason(q, k, v, key_mask, lengths, kernel) is None


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
             smem_limit=DEFAULT_SMEM_LIMIT, kernel="tiled"):
    """Run the forward with ``launch(plan, args)``; ``xp`` is numpy (emulation) or cupy.
    ``kernel`` is the choice (one of :data:`KERNEL_CHOICES`), explicit here: the public functions
    resolve ``MINITX_FLASH_KERNEL`` before they call this."""
    B, H, Hkv, Nq, Nk, D = validate_inputs(q, k, v, key_mask, lengths)
    Dv = int(v.shape[-1])
    Dp = compiled_head_dim(q, v)
    sc = resolve_scale(scale, D)
    dt = numpy.dtype(q.dtype)
    fam = chosen_kernel(dt, kernel)
    # Outputs start as a fully masked result (o = 0, lse = −inf), which is also the answer
    # when there is nothing to compute.
    o = xp.zeros((B, H, Nq, Dp), dtype=dt)
    lse = xp.full((B, H, Nq), -numpy.inf, dtype=numpy.float32)
    if B * H * Nq == 0:
        return xp.ascontiguousarray(o[..., :Dv]), lse
    # Pad the head dim to a compiled size and launch one block per tile of query rows and per
    # (batch, head); lse = log Σⱼ exp(sᵢⱼ) per row is kept for the backward.
    qp, kp, vp = (pad_head_dim(xp, x, Dp) for x in (q, k, v))
    km, ln = _masks(xp, key_mask, lengths)
    plan = plan_launch("fwd", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal, fam=fam)
    check_shared_memory(plan.smem, smem_limit, plan.name)
    launch(plan, (qp, kp, vp, o, lse, ln, km, numpy.int32(H), numpy.int32(Hkv), numpy.int32(Nq),
                  numpy.int32(Nk), numpy.float32(sc)))
    if Dp != Dv:
        o = xp.ascontiguousarray(o[..., :Dv])
    return o, lse


def _backward(xp, launch, q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
              lengths=None, smem_limit=DEFAULT_SMEM_LIMIT, kernel="tiled"):
    """Run the backward (Dvec pre-pass, dK/dV, dQ) with ``launch(plan, args)``; every family
    takes the same arguments, so only the plans' names differ between them."""
    B, H, Hkv, Nq, Nk, D = validate_inputs(q, k, v, key_mask, lengths, o=o, do=do, lse=lse)
    Dv = int(v.shape[-1])
    Dp = compiled_head_dim(q, v)
    sc = resolve_scale(scale, D)
    dt = numpy.dtype(q.dtype)
    fam = chosen_kernel(dt, kernel)
    if B * H * Nq == 0 or Nk == 0:
        return tuple(xp.zeros(x.shape, dtype=dt) for x in (q, k, v))
    qp, kp, vp, op, dop = (pad_head_dim(xp, x, Dp) for x in (q, k, v, o, do))
    lse32 = xp.ascontiguousarray(lse.astype(numpy.float32))
    km, ln = _masks(xp, key_mask, lengths)

    # Pass 1: Dvec_i = Σ_d dO_id · O_id = rowsum(dO ⊙ O), the term in dS = P ⊙ (dP − Dvec)
    # (with dP = dO Vᵀ) that would otherwise need a whole row of P.
    dvec = xp.empty((B, H, Nq), dtype=numpy.float32)
    plan = plan_launch("bwd_dot", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp)
    launch(plan, (op, dop, dvec, numpy.int32(B * H * Nq), numpy.int32(Dp)))

    # Pass 2, one block per key tile: dV = Pᵀ dO and dK = scale · dSᵀ Q, with P rebuilt
    # from q, k and lse; float32 accumulators, one per query head.
    dk32 = xp.empty((B, H, Nk, Dp), dtype=numpy.float32)
    dv32 = xp.empty((B, H, Nk, Dp), dtype=numpy.float32)
    plan = plan_launch("bwd_dkdv", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal, fam=fam)
    check_shared_memory(plan.smem, smem_limit, plan.name)
    common = (ln, km, numpy.int32(H), numpy.int32(Hkv), numpy.int32(Nq), numpy.int32(Nk),
              numpy.float32(sc))

    if pass_kernel(fam, "bwd_dq") is None:
        # Single pass (tc_onepass): the dK/dV kernel also adds dS K into a float32 dQ.
        dq32 = xp.zeros((B, H, Nq, Dp), dtype=numpy.float32)
        launch(plan, (qp, kp, vp, dop, lse32, dvec, dk32, dv32, dq32) + common)
        dq = (dq32 * numpy.float32(sc)).astype(dt)
    else:
        launch(plan, (qp, kp, vp, dop, lse32, dvec, dk32, dv32) + common)
        # Pass 3, one block per query tile: dQ = scale · dS K.
        dq = xp.empty((B, H, Nq, Dp), dtype=dt)
        plan = plan_launch("bwd_dq", dt, B=B, H=H, Nq=Nq, Nk=Nk, D=Dp, causal=causal, fam=fam)
        check_shared_memory(plan.smem, smem_limit, plan.name)
        launch(plan, (qp, kp, vp, dop, lse32, dvec, dq) + common)
    dq = xp.ascontiguousarray(dq[..., :D])

    # GQA: the G query heads that share a kv head each add their dK, dV to it; then the
    # padding is sliced off and the result cast to q's dtype.
    G = H // Hkv
    if G > 1:   # GQA: sum the per-q-head gradients of each kv group (heads hk*G .. hk*G+G-1)
        dk32 = dk32.reshape(B, Hkv, G, Nk, Dp).sum(axis=2)
        dv32 = dv32.reshape(B, Hkv, G, Nk, Dp).sum(axis=2)
    dk = xp.ascontiguousarray(dk32[..., :D].astype(dt))
    dv = xp.ascontiguousarray(dv32[..., :Dv].astype(dt))
    return dq, dk, dv


# ------------------------------------------------------------------------ CuPy side
def _cupy():
    return cupy_or_none()


def unavailable_reason():
    """``None`` when CuPy imports, a CUDA device is usable and NVRTC loads; else why not.

    Never raises: the failures it expects (CuPy missing or failing to import, no device, a
    CUDA/NVRTC library that does not load, a CuPy stand-in without ``cuda.nvrtc``) become the
    returned sentence, with the underlying error's type and message.
    """
    cp = _cupy()
    if cp is None:
        err = _cupy_state.get("error") or ""
        if err.startswith("ModuleNotFoundError"):
            return "CuPy is not installed"
        return f"CuPy failed to import ({err})" if err else "CuPy is not installed"
    # Then a usable device, then the NVRTC compiler library (the kernels compile at first use).
    try:
        usable = bool(cp.is_available())
    except (AttributeError, RuntimeError, OSError) as exc:
        return f"CuPy cannot query CUDA devices ({type(exc).__name__}: {exc})"
    if not usable:
        return "no CUDA device (cupy.is_available() is False)"
    try:
        cp.cuda.nvrtc.getVersion()
    except (AttributeError, ImportError, RuntimeError, OSError) as exc:
        return f"NVRTC failed to load: {type(exc).__name__}: {exc}"
    return None


def is_available() -> bool:
    """True when CuPy imports, a CUDA device is usable and NVRTC loads: ``unavailable_reason() is
    None`` (never raises)."""
    return unavailable_reason() is None


def module_names(fam: str, D: int, causal: bool) -> list:
    """The name expressions one NVRTC module of family ``fam`` compiles: one per pass it
    launches (:func:`family_kinds`)."""
    return [kernel_name(kind, _FAMILY_DTYPE[fam], D, causal, fam) for kind in family_kinds(fam)]


@functools.lru_cache(maxsize=None)
def _module(dtype_name: str, D: int, causal: bool, fam=None):
    """Compile (once per dtype/D/causal/family; ``fam`` None: the tiled family of the dtype)
    the four kernels of one configuration with NVRTC.

    The source is :func:`kernel_source` (every kernel file inlined), so CuPy's on-disk cache is
    keyed on all of it; NVRTC compiles for the current device's architecture."""
    cp = _cupy()
    names = module_names(_family_of(dtype_name, fam), D, causal)
    options = ["-std=c++17"]
    cuda_path = cp.cuda.get_cuda_path()   # None when CuPy found no CUDA tree (then NVRTC's own)
    if cuda_path:
        options.append("-I" + os.path.join(cuda_path, "include"))  # cuda_fp16.h
    return cp.RawModule(code=kernel_source(), options=tuple(options), name_expressions=names)


def _device_smem_limit() -> int:
    """cudaDevAttrMaxSharedMemoryPerBlockOptin of the current device (A100 163 KB, H100 227 KB)."""
    cp = _cupy()
    attrs = cp.cuda.Device().attributes
    if "MaxSharedMemoryPerBlockOptin" in attrs:
        return int(attrs["MaxSharedMemoryPerBlockOptin"])
    return int(cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id))   # the same, by number


def _cupy_launch(dtype_name: str, D: int, causal: bool, fam=None):
    cp = _cupy()
    null = numpy.uint64(0)  # a null device pointer (8 bytes)

    # A block may use more than 48 KB of dynamic shared memory only once the kernel opts in;
    # an absent mask or lengths array is passed as a null pointer.
    def launch(plan: LaunchPlan, args):
        fn = _module(dtype_name, D, causal, fam).get_function(plan.name)
        if plan.smem > DEFAULT_SMEM_LIMIT:
            fn.max_dynamic_shared_size_bytes = plan.smem
        fn(plan.grid, plan.block, tuple(null if a is None else a for a in args),
           shared_mem=plan.smem)

    del cp
    return launch


# Refusals at the public boundary: CuPy arrays only, and only arrays decline_reason takes.
def _require_gpu(q):
    cp = _cupy()
    if cp is None:
        raise RuntimeError("flash_cuda needs CuPy (pip install cupy-cuda12x) and an NVIDIA GPU")
    if not isinstance(q, cp.ndarray):
        raise TypeError(f"q must be a cupy.ndarray, got {type(q).__name__}")
    return cp


def _refuse_declined(q, k, v, key_mask, lengths, kernel):
    reason = decline_reason(q, k, v, key_mask, lengths, kernel)
    if reason is not None:
        raise ValueError(f"flash_cuda cannot run these arrays: {reason}")


_PASSES = {"forward": ("fwd",), "backward": ("bwd_dot", "bwd_dkdv", "bwd_dq")}


def _resolve(q, v, kernel, causal, what):
    """The choice, family and compiled D of one call (``what``: "forward" or "backward"),
    logged with the names of the kernels it launches, so the kernel that ran is on record."""
    choice = kernel_choice() if kernel is None else _checked_choice(kernel, "kernel")
    fam = chosen_kernel(q.dtype, choice)
    Dp = compiled_head_dim(q, v)
    names = [kernel_name(kind, q.dtype, Dp, bool(causal), fam) for kind in _PASSES[what]
             if pass_kernel(fam, kind) is not None]
    log.debug("%s: %s (%s=%s): %s", what, fam, KERNEL_ENV if kernel is None else "kernel",
              choice, ", ".join(names))
    return choice, fam, Dp


def flash_attention_forward(q, k, v, *, causal=False, scale=None, key_mask=None, lengths=None,
                            kernel=None):
    """Flash-attention forward on CuPy arrays; returns ``(o, lse)``. ``kernel``: one of
    :data:`KERNEL_CHOICES`; None reads ``MINITX_FLASH_KERNEL`` (:func:`kernel_choice`)."""
    cp = _require_gpu(q)
    validate_inputs(q, k, v, key_mask, lengths)
    _refuse_declined(q, k, v, key_mask, lengths, kernel)
    choice, fam, Dp = _resolve(q, v, kernel, causal, "forward")
    launch = _cupy_launch(numpy.dtype(q.dtype).name, Dp, bool(causal), fam)
    return _forward(cp, launch, q, k, v, causal=bool(causal), scale=scale, key_mask=key_mask,
                    lengths=lengths, smem_limit=_device_smem_limit(), kernel=choice)


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
                             lengths=None, kernel=None):
    """Flash-attention backward on CuPy arrays; returns ``(dq, dk, dv)`` in q's dtype.

    ``do`` (the upstream gradient) is cast to q's dtype if it differs (an autograd engine may
    hand a float32 gradient to a float16 graph); ``lse`` is used as float32. ``kernel`` as for
    the forward (any family's backward is exact for any family's ``o`` and ``lse``)."""
    cp = _require_gpu(q)
    if getattr(do, "dtype", None) is not None and numpy.dtype(do.dtype) != numpy.dtype(q.dtype):
        do = do.astype(q.dtype)
    validate_inputs(q, k, v, key_mask, lengths, o=o, do=do, lse=lse)
    _refuse_declined(q, k, v, key_mask, lengths, kernel)
    choice, fam, Dp = _resolve(q, v, kernel, causal, "backward")
    launch = _cupy_launch(numpy.dtype(q.dtype).name, Dp, bool(causal), fam)
    return _backward(cp, launch, q, k, v, o, lse, do, causal=bool(causal), scale=scale,
                     key_mask=key_mask, lengths=lengths, smem_limit=_device_smem_limit(),
                     kernel=choice)
