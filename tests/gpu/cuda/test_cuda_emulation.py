"""The CUDA kernels, executed on the CPU by the emulation harness (emu/cuda_emu.h), against a
float64 NumPy reference. The Python side is the real launcher code (flash_cuda._forward /
_backward: family choice by dtype, padding, launch plans, GQA group sums, casts) with a ctypes
``launch``: float32 runs the CUDA-core kernels (*_simt), float16 the tensor-core kernels (*_tc).

Tolerances (cuda_emu_harness.error_bounds, derived there): fp32 outputs within 1e-5 of
max(|ref|, 1); fp16 outputs within first-order bounds of the fp16 roundings the tensor-core
kernels make (P and dS rounded to fp16 before their matmuls, outputs rounded to fp16), with the
float64 reference computed on exactly the fp16 input values. lse (fp32 in both) within 1e-5
relative; -inf rows must match.

The emulation itself is tested too: one mma.m16n8k16 against NumPy with the fragments placed by
the PTX ISA's layout tables (encoded here independently of the emulator), ldmatrix's
lane -> element mapping with and without .trans, and cp.async's group semantics.
"""
import ctypes

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cuda_emu_harness as H
from minitx.backend import flash_cuda as fc

TIMEOUT = 180.0

# (B, H, Hkv, Nq, Nk, D, causal, masking, dtype)
CASES = [
    (1, 2, 2, 1, 1, 32, False, None, "float32"),
    (1, 2, 2, 70, 70, 32, True, "mask", "float32"),
    (2, 2, 2, 65, 65, 64, False, "lengths", "float32"),
    (1, 2, 2, 70, 31, 32, True, "lengths", "float32"),    # Nq > Nk: leading rows fully masked
    (2, 4, 2, 70, 33, 48, True, "lengths", "float32"),    # GQA + padded D (48 -> 64)
    (1, 2, 1, 40, 70, 128, False, "both", "float32"),     # MQA, D = 128 (> 48 KB smem)
    (2, 2, 2, 31, 40, 32, False, "zero_length", "float32"),  # a batch with no keys at all
    (1, 1, 1, 1, 70, 32, True, None, "float32"),          # a single query row sees every key
    (1, 2, 2, 1, 1, 32, False, None, "float16"),
    (2, 2, 2, 31, 33, 64, True, "both", "float16"),
    (1, 4, 2, 70, 70, 32, False, "lengths", "float16"),   # GQA
    (1, 2, 2, 33, 70, 48, True, "mask", "float16"),       # padded D, Nq < Nk
    (1, 2, 1, 40, 70, 128, True, "both", "float16"),      # MQA, D = 128
    (2, 2, 2, 31, 40, 32, False, "zero_length", "float16"),
    (1, 2, 2, 70, 31, 32, True, None, "float16"),         # Nq > Nk
]


def _ids(c):
    B, Hh, Hkv, Nq, Nk, D, causal, masking, dt = c
    return f"B{B}H{Hh}kv{Hkv}-q{Nq}k{Nk}-D{D}-{'causal' if causal else 'full'}-{masking}-{dt}"


def _make(case, seed=0):
    B, Hh, Hkv, Nq, Nk, D, causal, masking, dt = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hh, Nq, D)).astype(dt)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(dt)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(dt)
    do = rng.standard_normal((B, Hh, Nq, D)).astype(dt)
    lengths = key_mask = None
    if masking in ("lengths", "both"):
        lengths = rng.integers(1, Nk + 1, size=B).astype(np.int32)
        lengths[0] = max(1, Nk - 5)
    if masking == "zero_length":
        lengths = np.array([0] + [max(1, Nk // 2)] * (B - 1), dtype=np.int32)
    if masking in ("mask", "both"):
        key_mask = rng.random((B, Nk)) < 0.7
        key_mask[:, -1] = True
    return dict(q=q, k=k, v=v, do=do, causal=causal, lengths=lengths, key_mask=key_mask)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward_backward_match_reference(emu_lib, case):
    a = _make(case)
    dt = case[-1]
    kw = dict(causal=a["causal"], lengths=a["lengths"], key_mask=a["key_mask"])
    o_ref, lse_ref, _ = H.ref_forward(a["q"], a["k"], a["v"], **kw)
    # The backward gets the reference o (rounded to the input dtype) and lse, so forward and
    # backward errors are measured independently.
    o_in = o_ref.astype(dt)
    lse_in = lse_ref.astype(np.float32)

    def work(launch, lib):
        o, lse = H.emu_forward(launch, a["q"], a["k"], a["v"], **kw)
        dq, dk, dv = H.emu_backward(launch, a["q"], a["k"], a["v"], o_in, lse_in, a["do"], **kw)
        return o, lse, dq, dk, dv

    o, lse, dq, dk, dv = H.run_isolated(emu_lib, work, timeout=TIMEOUT)
    for x, ref in ((o, a["q"]), (dq, a["q"]), (dk, a["k"]), (dv, a["v"])):
        assert x.dtype == ref.dtype and x.shape == ref.shape
    bounds = H.error_bounds(a["q"], a["k"], a["v"], o_in, a["do"], dt, **kw)
    H.check_close("o", o, o_ref, bounds["o"])
    H.check_lse(lse, lse_ref)
    dq_ref, dk_ref, dv_ref = H.ref_backward(a["q"], a["k"], a["v"], o_in, a["do"], **kw)
    H.check_close("dq", dq, dq_ref, bounds["dq"])
    H.check_close("dk", dk, dk_ref, bounds["dk"])
    H.check_close("dv", dv, dv_ref, bounds["dv"])


@settings(max_examples=6, derandomize=True, deadline=None)
@given(dtype=st.sampled_from(["float32", "float16"]), Nq=st.integers(1, 140),
       Nk=st.integers(1, 140), D=st.sampled_from([8, 32, 40, 64]), G=st.sampled_from([1, 2]),
       causal=st.booleans(), masking=st.sampled_from([None, "lengths", "mask", "both"]))
def test_ragged_shapes_match_reference(emu_lib, dtype, Nq, Nk, D, G, causal, masking):
    """Ragged sizes (tile edges anywhere), GQA, padded D, masks, causal or not, both families."""
    case = (2, 2 * G, 2, Nq, Nk, D, causal, masking, dtype)
    test_forward_backward_match_reference(emu_lib, case)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fully_masked_rows_are_zero_not_nan(emu_lib, dtype):
    B, Hh, Nq, Nk, D = 1, 2, 33, 70, 32
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s).astype(dtype)
                   for s in ((B, Hh, Nq, D), (B, Hh, Nk, D), (B, Hh, Nk, D), (B, Hh, Nq, D)))
    key_mask = np.zeros((B, Nk), dtype=bool)   # nothing kept anywhere

    def work(launch, lib):
        o, lse = H.emu_forward(launch, q, k, v, key_mask=key_mask)
        g = H.emu_backward(launch, q, k, v, o, lse, do, key_mask=key_mask)
        return (o, lse) + tuple(g)

    o, lse, dq, dk, dv = H.run_isolated(emu_lib, work, timeout=TIMEOUT)
    assert np.all(o == 0) and np.all(lse == -np.inf)
    assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


def test_shared_memory_arithmetic_matches_kernel(emu_lib):
    """The launcher's shared-memory sizes are the kernels' constexpr ones (driver family ids:
    0 simt, 1 tc, 3 tf32; the fp16 levers' own kernels 4 tc_bm128 (forward), 5 tc_kvreg and
    6 tc_onepass (dK/dV))."""
    families = ((0, "float32", "simt", ("fwd", "bwd_dkdv", "bwd_dq")),
                (1, "float16", "tc", ("fwd", "bwd_dkdv", "bwd_dq")),
                (3, "float32", "tf32", ("fwd", "bwd_dkdv", "bwd_dq")),
                (4, "float16", "tc_bm128", ("fwd",)), (5, "float16", "tc_kvreg", ("bwd_dkdv",)),
                (6, "float16", "tc_onepass", ("bwd_dkdv",)))
    index = {"fwd": 0, "bwd_dkdv": 1, "bwd_dq": 2}

    def work(launch, lib):
        return {(dt, fam, kind, D): lib.emu_smem_bytes(f, index[kind], D)
                for f, dt, fam, kinds in families for kind in kinds
                for D in fc.SUPPORTED_HEAD_DIMS}

    got = H.run_isolated(emu_lib, work, timeout=60)
    assert len(got) == 36
    for (dt, fam, kind, D), nbytes in got.items():
        assert nbytes == fc.smem_bytes(kind, dt, D, fam), (dt, fam, kind, D)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_deterministic_across_runs_and_schedules(emu_lib, dtype):
    """No atomics: the same inputs give bitwise identical results under different schedules
    (and different cp.async landing orders)."""
    a = _make((1, 4, 2, 40, 80, 32, True, "lengths", dtype), seed=5)
    kw = dict(causal=True, lengths=a["lengths"])

    def work(launch, lib):
        o, lse = H.emu_forward(launch, a["q"], a["k"], a["v"], **kw)
        return (o, lse) + tuple(H.emu_backward(launch, a["q"], a["k"], a["v"], o, lse, a["do"], **kw))

    r1 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=1, yield_permille=500)
    r2 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=2, yield_permille=0)
    for x, y in zip(r1, r2):
        assert np.array_equal(x, y)


# ------------------------------------------------------------------ the emulation itself
# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (g = lane >> 2,
# t = lane % 4; element i of a fragment is in register i // 2, low half first):
def _a_pos(lane, i):      # A 16x16 f16, a0..a7
    g, t = lane >> 2, lane % 4
    return g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0)


def _b_pos(lane, i):      # B 16x8 f16, b0..b3 (row = k, col = n)
    g, t = lane >> 2, lane % 4
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def _c_pos(lane, i):      # C/D 16x8 f32, c0..c3
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


def _pack(lo, hi):
    return int(np.float16(lo).view(np.uint16)) | (int(np.float16(hi).view(np.uint16)) << 16)


def test_emulated_mma_m16n8k16_matches_numpy(emu_lib):
    rng = np.random.default_rng(11)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.float32)
    for lane in range(32):
        for r in range(4):
            a[lane, r] = _pack(A[_a_pos(lane, 2 * r)], A[_a_pos(lane, 2 * r + 1)])
        for r in range(2):
            b[lane, r] = _pack(B[_b_pos(lane, 2 * r)], B[_b_pos(lane, 2 * r + 1)])
        for i in range(4):
            c[lane, i] = C[_c_pos(lane, i)]

    def work(launch, lib):
        d = np.zeros((32, 4), np.float32)
        ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        assert lib.emu_mma_m16n8k16(ptr(a), ptr(b), ptr(c), ptr(d)) == 0
        return d

    d = H.run_isolated(emu_lib, work, timeout=60)
    ref = A.astype(np.float64) @ B.astype(np.float64) + C
    got = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            got[_c_pos(lane, i)] = d[lane, i]
    # fp16 x fp16 products are exact in fp32; 16 fp32 additions: a few ulps of the sum's terms
    assert np.abs(got - ref).max() <= 1e-5 * (np.abs(A).astype(np.float64) @ np.abs(B) + 1).max()


@pytest.mark.parametrize("trans", [False, True])
def test_emulated_ldmatrix_lane_mapping(emu_lib, trans):
    """ldmatrix.x4: lane l gives the address of row l % 8 of matrix l // 8 (rows need not be
    contiguous); register m of lane l holds matrix m's (row l // 4, cols 2 (l % 4) + {0, 1}),
    or with .trans (rows 2 (l % 4) + {0, 1}, col l // 4), low half first."""
    stride = 40                                   # halves between rows (16-byte multiple)
    bases = [0, 8 * stride + 16, 16, 8 * stride]  # 4 matrices scattered in a 16-row image
    image = np.zeros(16 * stride, np.uint16)
    ident = {}
    for m, base in enumerate(bases):
        for r in range(8):
            for cc in range(8):
                val = 1000 * (m + 1) + 10 * r + cc     # unique, names (matrix, row, col)
                image[base + r * stride + cc] = val
                ident[m, r, cc] = val
    row_off = np.array([bases[l // 8] + (l % 8) * stride for l in range(32)], np.int32)

    def work(launch, lib):
        out = np.zeros((32, 4), np.uint32)
        ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        assert lib.emu_ldmatrix_x4(ptr(image), ctypes.c_int(image.size), ptr(row_off),
                                   ctypes.c_int(int(trans)), ptr(out)) == 0
        return out

    out = H.run_isolated(emu_lib, work, timeout=60)
    for lane in range(32):
        for m in range(4):
            if trans:
                lo, hi = ident[m, 2 * (lane % 4), lane // 4], ident[m, 2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = ident[m, lane // 4, 2 * (lane % 4)], ident[m, lane // 4, 2 * (lane % 4) + 1]
            assert out[lane, m] == lo | (hi << 16), (lane, m)


def test_emulated_cp_async_groups(emu_lib):
    """cp.async semantics the kernels rely on: a copy is only guaranteed after the wait_group
    that retires its group (before it, some lanes still see the NaN poison and some already see
    the data: both orders happen), wait_group 1 retires all but the newest group, and src-size
    < 16 zero fills the rest of the 16 bytes."""
    src = np.arange(1, 64 * 4 + 1, dtype=np.uint32)

    def work(launch, lib):
        runs = []
        for _ in range(3):
            out = np.zeros((32, 9), np.uint32)
            ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
            assert lib.emu_cp_async_probe(ptr(src), ptr(out)) == 0
            runs.append(out)
        return runs

    runs = H.run_isolated(emu_lib, work, timeout=60)
    early = np.concatenate([r[:, 0] for r in runs])
    b_first = np.concatenate([src[4 * (32 + np.arange(32))]] * 3)
    assert np.any(early == 0xFFFFFFFF) and np.any(early == b_first)   # both orders occur
    assert np.all((early == 0xFFFFFFFF) | (early == b_first))
    for out in runs:
        for lane in range(32):
            assert list(out[lane, 1:5]) == list(src[4 * lane: 4 * lane + 4])
            b = list(src[4 * (32 + lane): 4 * (32 + lane) + 4])
            if lane % 2:
                b[2:] = [0, 0]                  # src-size 8: the last 8 bytes are zeros
            assert list(out[lane, 5:9]) == b
