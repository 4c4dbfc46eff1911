"""The 3xTF32 kernels (``kernels/flash_tf32.cuh``: float32 on the tensor cores, each operand split
into two tf32 numbers and each product taken as three ``mma.sync`` m16n8k8), executed on the CPU
by the emulation harness against the float64 NumPy reference, forward and backward.

The Python side is the real launcher (``flash_cuda._forward`` / ``_backward`` with
``kernel="tf32"``). The tolerance is the fp32 bound every float32 family meets
(``cuda_emu_harness.error_bounds``: 1e-5 of max(|ref|, 1)) plus, derived to first order, what
the split adds: each product errs by up to 3 * 2^-22 of itself (12 times an fp32 product's
rounding), and a score's error is amplified by the exponential, so scores far from 0 (scale = 1
at D = 128) need it. That the bound can see the split at all is tested too: the same kernels
with the two small products removed (plain TF32, one product per multiply) must fail it.

The emulated instructions are tested against NumPy with the fragment layouts of the PTX ISA
encoded here, independently of the emulator: one mma.m16n8k8 with .tf32 operands, and
cvt.rna.tf32.f32's rounding.
"""
import ctypes

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import cuda_emu_harness as H

TIMEOUT = 180.0


def _ptr(x):
    return x.ctypes.data_as(ctypes.c_void_p)


# ------------------------------------------------------------------ the emulated instructions
def _tf32_truncate(x):
    """What a tensor core reads from an fp32 register given as a .tf32 operand: the top 19
    bits (sign, exponent, 10 mantissa bits)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _to_tf32(lib, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.shape, np.uint32)
    assert lib.emu_to_tf32(_ptr(x), _ptr(out), ctypes.c_int(x.size)) == 0
    return out


# PTX ISA, "Matrix Fragments for mma.m16n8k8" with .tf32 (g = lane >> 2, t = lane % 4; one
# element per register):
def _a_pos(lane, i):      # A 16x8: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
    g, t = lane >> 2, lane % 4
    return g + 8 * (i % 2), t + 4 * (i // 2)


def _b_pos(lane, i):      # B 8x8 (row = k, col = n): b0 (t, g), b1 (t + 4, g)
    g, t = lane >> 2, lane % 4
    return t + 4 * i, g


def _c_pos(lane, i):      # C/D 16x8 f32: c0, c1 (g, 2t + {0, 1}), c2, c3 (g + 8, 2t + {0, 1})
    g, t = lane >> 2, lane % 4
    return g + 8 * (i // 2), 2 * t + (i % 2)


@pytest.mark.parametrize("rounded", [True, False])
def test_emulated_mma_m16n8k8_tf32_matches_numpy(emu_lib, rounded):
    """One warp's mma against A @ B + C in float64. Operands rounded to tf32 first (what the
    kernels pass) multiply exactly; raw fp32 operands are read as the hardware reads them, with
    their low 13 bits ignored (so a kernel that skipped its conversion would be caught)."""
    rng = np.random.default_rng(12)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)

    def work(launch, lib):
        a_bits = (_to_tf32(lib, A) if rounded else A.view(np.uint32)).reshape(16, 8)
        b_bits = (_to_tf32(lib, B) if rounded else B.view(np.uint32)).reshape(8, 8)
        a = np.zeros((32, 4), np.uint32)
        b = np.zeros((32, 2), np.uint32)
        c = np.zeros((32, 4), np.float32)
        for lane in range(32):
            for i in range(4):
                a[lane, i] = a_bits[_a_pos(lane, i)]
                c[lane, i] = C[_c_pos(lane, i)]
            for i in range(2):
                b[lane, i] = b_bits[_b_pos(lane, i)]
        d = np.zeros((32, 4), np.float32)
        assert lib.emu_mma_m16n8k8_tf32(_ptr(a), _ptr(b), _ptr(c), _ptr(d)) == 0
        return a_bits, b_bits, d

    a_bits, b_bits, d = H.run_isolated(emu_lib, work, timeout=60)
    Aop = _tf32_truncate(a_bits.view(np.float32)).astype(np.float64)
    Bop = _tf32_truncate(b_bits.view(np.float32)).astype(np.float64)
    ref = Aop @ Bop + C
    got = np.zeros((16, 8))
    for lane in range(32):
        for i in range(4):
            got[_c_pos(lane, i)] = d[lane, i]
    # tf32 x tf32 products are exact in fp32; 8 fp32 additions: a few ulps of the terms
    assert np.abs(got - ref).max() <= 1e-6 * (np.abs(Aop) @ np.abs(Bop) + np.abs(C)).max()
    if not rounded:   # the truncation is visible: fp32 operands would give another product
        assert np.abs(got - (A.astype(np.float64) @ B + C)).max() > 1e-4


def test_cvt_rna_tf32_rounds_to_nearest_ties_away(emu_lib):
    """10 mantissa bits kept, to nearest; a tie (exactly half of the last kept bit) goes away
    from zero; infinities and NaN pass through."""
    ulp = 2.0 ** -10    # tf32's spacing just above 1
    x = np.array([1.0, 1 + ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 - 2.0 ** -23, 1 + 1.5 * ulp,
                  1 + ulp / 2 + 2.0 ** -23, np.inf, -np.inf], np.float32)
    want = np.array([1.0, 1 + ulp, -(1 + ulp), 1.0, 1 + 2 * ulp, 1 + ulp, np.inf, -np.inf])

    def work(launch, lib):
        return _to_tf32(lib, x), _to_tf32(lib, np.array([np.nan], np.float32))

    got, nan = H.run_isolated(emu_lib, work, timeout=60)
    assert np.array_equal(got.view(np.float32).astype(np.float64), want)
    assert np.all(got & 0x1FFF == 0)
    assert np.isnan(nan.view(np.float32)[0])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(x=st.floats(-2.0 ** 100, 2.0 ** 100, width=32).filter(lambda v: abs(v) > 2.0 ** -100))
def test_split_keeps_22_bits(emu_lib_bits, x):
    """big = tf32(x), small = tf32(x - big): big + small is within 2^-22 |x| of x (rounding to
    11 significant bits errs by at most 2^-11 of the value: |x - big| <= 2^-11 |x|, and small
    misses x - big by at most 2^-11 of that), which is what makes three tf32 products an
    fp32-accurate one."""
    big, small = emu_lib_bits(x)
    assert abs(float(big) + float(small) - x) <= 2.0 ** -22 * abs(x)
    assert abs(float(big) - x) <= 2.0 ** -11 * abs(x)


@pytest.fixture(scope="module")
def emu_lib_bits(emu_lib):
    """x -> (big, small) of the split, through the emulation library's cvt.rna.tf32 (loaded in
    this process: emu_to_tf32 launches nothing, so no child process is needed)."""
    lib = ctypes.CDLL(emu_lib)

    def split(x):
        big = _to_tf32(lib, np.array([x], np.float32)).view(np.float32)
        small = _to_tf32(lib, np.float32(x) - big).view(np.float32)
        return big[0], small[0]
    return split


# ------------------------------------------------------------------ the kernels end to end
HEAD_DIMS = st.sampled_from([1, 8, 32, 40, 64, 100, 128])   # 32/64/128 compiled, others padded


# Sizes up to 100: a 64-row block and a part of the next, several key tiles (16 to 64 keys), and
# an emulated run short enough for CI (every mma is a rendezvous of 32 threads, three per product)
@pytest.mark.slow
@settings(max_examples=4, derandomize=True, deadline=None)
@given(Nq=st.integers(1, 100), Nk=st.integers(1, 100), D=HEAD_DIMS,
       Dv=st.one_of(st.none(), HEAD_DIMS), heads=st.sampled_from([(2, 2), (4, 2), (2, 1)]),
       causal=st.booleans(),
       masking=st.sampled_from([None, "lengths", "mask", "both", "empty_batch"]),
       scale=st.one_of(st.none(), st.floats(0.05, 1.0)), seed=st.integers(0, 2 ** 16))
@example(Nq=100, Nk=5, D=64, Dv=None, heads=(2, 2), causal=True, masking=None, scale=None,
         seed=0)                                 # Nq >> Nk: the first 95 rows see no key
@example(Nq=5, Nk=100, D=64, Dv=None, heads=(2, 1), causal=True, masking=None, scale=None,
         seed=0)                                 # decoding against a longer cache, MQA
@example(Nq=65, Nk=81, D=128, Dv=None, heads=(4, 2), causal=True, masking="both",
         scale=None, seed=1)                     # one row past a block, the largest D
@example(Nq=64, Nk=97, D=128, Dv=None, heads=(2, 1), causal=False, masking=None, scale=1.0,
         seed=0)                                 # scores far from 0: the split's error counts
@example(Nq=1, Nk=1, D=1, Dv=None, heads=(2, 2), causal=False, masking=None, scale=None,
         seed=2)
def test_tf32_matches_the_float64_reference(emu_lib, Nq, Nk, D, Dv, heads, causal, masking,
                                            scale, seed):
    Hq, Hkv = heads
    H.check_float32_kernel(emu_lib, "tf32", 2, Hq, Hkv, Nq, Nk, D, D if Dv is None else Dv,
                           causal, masking, scale, seed, timeout=TIMEOUT)


@pytest.mark.slow
def test_plain_tf32_fails_the_bound(emu_lib, single_tf32_lib):
    """Without the split's two small products (one tf32 product per multiply) the same case
    that passes with them is rejected: the fp32 bound is tight enough to see the split."""
    case = (1, 2, 2, 70, 70, 32, 32, True, "mask", None, 0)
    worst = H.check_float32_kernel(emu_lib, "tf32", *case, timeout=TIMEOUT)
    assert worst < 0.5
    with pytest.raises(AssertionError, match="out of bound"):
        H.check_float32_kernel(single_tf32_lib, "tf32", *case, timeout=TIMEOUT)


@pytest.mark.slow
def test_tf32_is_deterministic_across_schedules(emu_lib):
    """Every output element has one writer (no atomics): bitwise equal under any schedule and
    any landing order of the cp.async copies."""
    q, k, v, do, lengths, _ = H.float32_inputs(1, 4, 2, 70, 90, 32, 32, "lengths", seed=5)
    kw = dict(causal=True, lengths=lengths, kernel="tf32")

    def work(launch, lib):
        o, lse = H.emu_forward(launch, q, k, v, **kw)
        return (o, lse) + tuple(H.emu_backward(launch, q, k, v, o, lse, do, **kw))

    r1 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=1, yield_permille=500)
    r2 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=2, yield_permille=0)
    for x, y in zip(r1, r2):
        assert np.array_equal(x, y)


def test_tf32_choice_launches_its_kernels(emu_lib):
    """kernel="tf32" launches the *_tf32 instantiations (plus the shared Dvec pre-pass) on
    float32 arrays, and its forward's o and lse feed any family's backward: the tf32 backward
    of the CUDA-core forward's outputs agrees with the CUDA-core backward to fp32 accuracy."""
    q, k, v, do, _, _ = H.float32_inputs(1, 2, 1, 20, 40, 48, 48, None, seed=7)

    def work(launch, lib):
        names = []

        def spy(plan, args):
            names.append(plan.name)
            launch(plan, args)
        o, lse = H.emu_forward(spy, q, k, v, causal=True, kernel="tf32")
        H.emu_backward(spy, q, k, v, o, lse, do, causal=True, kernel="tf32")
        o2, lse2 = H.emu_forward(launch, q, k, v, causal=True, kernel="tiled")
        g_tf32 = H.emu_backward(launch, q, k, v, o2, lse2, do, causal=True, kernel="tf32")
        g_simt = H.emu_backward(launch, q, k, v, o2, lse2, do, causal=True, kernel="tiled")
        return names, (o, lse, o2, lse2), g_tf32, g_simt

    names, (o, lse, o2, lse2), g_tf32, g_simt = H.run_isolated(emu_lib, work, timeout=TIMEOUT)
    assert names == ["flash_fwd_tf32<64, true>", "flash_bwd_dot<float>",
                     "flash_bwd_dkdv_tf32<64, true>", "flash_bwd_dq_tf32<64, true>"]
    assert np.abs(o - o2).max() <= 1e-5 and np.abs(lse - lse2).max() <= 1e-5
    for a, b in zip(g_tf32, g_simt):
        assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1.0)


# ------------------------------------------------------------------ long loops
def _long_loop_errors(lib, n):
    """max |got - ref| / max |ref| of O over a loop of n keys (64 queries) and of dV over a
    loop of n queries (64 keys), one head, D = 32. Both are sums of positive terms (v and dO
    positive), the case where a one-sided rounding adds up; the backward gets the float64 o and
    lse. (dQ and dK come out of the same product, warp_gemm_acc_kn_tf32, but through dS, whose
    cancellation would blur what is measured here.)"""
    rng = np.random.default_rng(3)
    q, k = ((0.5 * rng.standard_normal((1, 1, m, 32))).astype(np.float32) for m in (64, n))
    v = rng.uniform(0.5, 1.5, (1, 1, n, 32)).astype(np.float32)
    o_ref = H.ref_forward(q, k, v)[0]
    kb, qb = q, k                   # the backward's loop runs over n queries and 64 keys
    vb = rng.uniform(0.5, 1.5, (1, 1, 64, 32)).astype(np.float32)
    dob = rng.uniform(0.5, 1.5, (1, 1, n, 32)).astype(np.float32)
    ob, lseb, _ = H.ref_forward(qb, kb, vb)
    ob, lseb = ob.astype(np.float32), lseb.astype(np.float32)
    dv_ref = H.ref_backward(qb, kb, vb, ob, dob)[2]

    def work(launch, _lib):
        o, _ = H.emu_forward(launch, q, k, v, kernel="tf32")
        return o, H.emu_backward(launch, qb, kb, vb, ob, lseb, dob, kernel="tf32")[2]

    o, dv = H.run_isolated(lib, work, timeout=TIMEOUT)
    return {"o": float(np.abs(o - o_ref).max() / np.abs(o_ref).max()),
            "dv": float(np.abs(dv - dv_ref).max() / np.abs(dv_ref).max())}


# fp32's rounding to nearest keeps a sum of n terms within a few 2^-24 of it (its errors take
# both signs); a tensor core's mma rounds toward zero, up to 2^-23 of the running sum each time,
# and the kernels let such a chain run over one tile only: 3 mmas per 8 keys, at most 8 k-steps
# (the forward's 64-key tile at D = 32), so 24 x 2^-23 ~ 2.9e-6 at worst. Chained over 512 keys
# or queries (192 mmas) the same bias grows to ~2e-5 at worst, which the self-test must show.
LONG_LOOP_BOUND = 24 * 2.0 ** -23


def test_tf32_sums_stay_fp32_accurate_over_a_long_loop(emu_lib, chained_tf32_lib):
    """O sums over 512 keys, dV over 512 queries: the kernels add each tile's partial sum to
    their accumulators in fp32 (warp_gemm_acc_kn_tf32), so the tensor core's rounding toward
    zero does not pile up along the loop. The emulated mma rounds as the hardware does
    (emu/cuda_emu.h, mma_dot); the same kernels with every mma chained through the accumulator
    exceed the bound by more than 2x."""
    errs = _long_loop_errors(emu_lib, 512)
    assert max(errs.values()) <= LONG_LOOP_BOUND, errs
    chained = _long_loop_errors(chained_tf32_lib, 512)
    assert min(chained.values()) > 2 * LONG_LOOP_BOUND, chained
