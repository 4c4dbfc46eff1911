"""The CUDA kernels, executed on the CPU by the emulation harness (emu/cuda_emu.h), against a
float64 NumPy reference. The Python side is the real launcher code (flash_cuda._forward /
_backward: padding, launch plans, GQA group sums, casts) with a ctypes ``launch``.

Tolerances
----------
fp32: max |kernel - ref| <= 1e-5 * max(|ref|, 1) per output (norm-relative; the kernel
accumulates in fp32, so the error is a few fp32 ulps times the reduction length).

fp16: the inputs are fp16 values; ``ref`` is the float64 result on exactly those values. The
kernel accumulates in fp32 and rounds only its outputs to fp16, so the best any fp16-output
implementation can do is the correctly rounded reference. We define the fp16 NumPy baseline as
``ref.astype(float16)`` (float64 math on the fp16-rounded inputs, then fp16 rounding of the
outputs) and require max |kernel - ref| <= 2 * max |baseline - ref| (+ 1e-6 * max|ref| so that
exactly representable outputs, where the baseline error is 0, are allowed fp32 noise). Twice the
output-rounding error leaves room for the fp32 accumulation flipping a rounding near a tie, but
catches any real bug (a wrong mask or a lost rescale is an O(1) error, >> 1 fp16 ulp).
lse is float32 in both cases and is compared with the fp32 tolerance; -inf entries must match.
"""
import numpy as np
import pytest

import cuda_emu_harness as H
from minitx.backend import flash_cuda as fc

TIMEOUT = 180.0

# (B, H, Hkv, Nq, Nk, D, causal, masking, dtype)
CASES = [
    (1, 2, 2, 1, 1, 32, False, None, "float32"),
    (1, 2, 2, 31, 31, 32, True, None, "float32"),
    (2, 2, 2, 33, 33, 64, False, "lengths", "float32"),
    (1, 2, 2, 70, 70, 32, True, "mask", "float32"),
    (1, 2, 2, 31, 70, 32, True, None, "float32"),         # Nq < Nk, bottom-right causal
    (1, 2, 2, 70, 31, 32, True, "lengths", "float32"),    # Nq > Nk: leading rows fully masked
    (2, 4, 2, 33, 70, 32, False, "mask", "float32"),      # GQA
    (2, 4, 2, 70, 33, 48, True, "lengths", "float32"),    # GQA + padded D (48 -> 64)
    (1, 2, 1, 33, 33, 128, False, "both", "float32"),     # MQA, D = 128 (> 48 KB smem)
    (2, 2, 2, 31, 40, 32, False, "zero_length", "float32"),  # a batch with no keys at all
    (1, 1, 1, 1, 70, 32, True, None, "float32"),          # a single query row sees every key
    (2, 2, 2, 31, 33, 64, True, "both", "float16"),
    (1, 4, 2, 70, 70, 32, False, "lengths", "float16"),
    (1, 2, 2, 33, 70, 48, True, "mask", "float16"),
    (1, 2, 2, 1, 31, 32, False, None, "float16"),
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


def _check(name, got, ref, dtype):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    err = np.abs(got - ref).max(initial=0.0)
    mag = np.abs(ref).max(initial=0.0)
    if dtype == "float32":
        tol = 1e-5 * max(mag, 1.0)
    else:
        base = np.abs(ref.astype(np.float16).astype(np.float64) - ref).max(initial=0.0)
        tol = 2.0 * base + 1e-6 * max(mag, 1.0)
    assert err <= tol, f"{name}: max error {err:.3e} > tolerance {tol:.3e} (max |ref| {mag:.3e})"


def _check_lse(got, ref):
    assert got.dtype == np.float32
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), fin), "lse: -inf rows differ"
    assert np.all(got[~fin] == -np.inf)
    if fin.any():
        err = np.abs(got[fin] - ref[fin]).max()
        assert err <= 1e-5 * max(np.abs(ref[fin]).max(), 1.0), f"lse: max error {err:.3e}"


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
    _check("o", o, o_ref, dt)
    _check_lse(lse, lse_ref)
    dq_ref, dk_ref, dv_ref = H.ref_backward(a["q"], a["k"], a["v"], o_in, a["do"], **kw)
    _check("dq", dq, dq_ref, dt)
    _check("dk", dk, dk_ref, dt)
    _check("dv", dv, dv_ref, dt)


def test_fully_masked_rows_are_zero_not_nan(emu_lib):
    B, Hh, Nq, Nk, D = 1, 2, 33, 40, 32
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s).astype(np.float32)
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
    def work(launch, lib):
        return {(kind, D): lib.emu_smem_floats(i, D)
                for i, kind in enumerate(("fwd", "bwd_dkdv", "bwd_dq")) for D in fc.SUPPORTED_HEAD_DIMS}

    got = H.run_isolated(emu_lib, work, timeout=60)
    for (kind, D), floats in got.items():
        assert floats == fc.smem_floats(kind, D), (kind, D)


def test_deterministic_across_runs_and_schedules(emu_lib):
    """No atomics: the same inputs give bitwise identical gradients under different schedules."""
    a = _make((1, 4, 2, 40, 50, 32, True, "lengths", "float32"), seed=5)
    kw = dict(causal=True, lengths=a["lengths"])

    def work(launch, lib):
        o, lse = H.emu_forward(launch, a["q"], a["k"], a["v"], **kw)
        return (o, lse) + tuple(H.emu_backward(launch, a["q"], a["k"], a["v"], o, lse, a["do"], **kw))

    r1 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=1, yield_permille=500)
    r2 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=2, yield_permille=0)
    for x, y in zip(r1, r2):
        assert np.array_equal(x, y)
