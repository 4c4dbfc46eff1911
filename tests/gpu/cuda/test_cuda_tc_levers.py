"""The fp16 levers (``kernels/flash_tc_levers.cuh``, ``MINITX_FLASH_KERNEL=tc_bm128``, ``tc_kvreg``,
``tc_onepass``), executed on the CPU by the emulation harness: each against the float64 NumPy
reference within the fp16 bounds every tensor-core kernel meets (``cuda_emu_harness.error_bounds``),
and, where a lever does the tc kernel's arithmetic in the tc kernel's order, bitwise against tc.

Which outputs a lever may change: tc_bm128 changes the forward only (o, lse), tc_kvreg and
tc_onepass the backward only. tc_bm128 at D <= 64 and tc_kvreg at D <= 64 keep tc's tiles, so
their outputs equal tc's bit for bit; tc_bm128 at D = 128 halves the key tile (the online
softmax rescales at other points) and tc_kvreg at D = 128 the query tile (dK and dV add their
tiles' partial sums in other groups), and tc_onepass adds dQ's per-key-block parts in float32 in
the order the blocks run: those meet the float64 bounds, not tc's bits.

The single pass's extra barrier (dS^T written by every warp before any warp reads it back) is
shown to matter: without it ThreadSanitizer reports a race.
"""
import os
import subprocess

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import cuda_emu_harness as H
from minitx.backend import flash_cuda as fc

TIMEOUT = 240.0
LEVERS = tuple(fc.LEVERS)


def _inputs(B, Hq, Hkv, Nq, Nk, D, masking, seed):
    """fp16 q, k, v, do and the masks of one case (the float32 inputs, rounded)."""
    q, k, v, do, lengths, key_mask = H.float32_inputs(B, Hq, Hkv, Nq, Nk, D, D, masking, seed)
    return tuple(x.astype(np.float16) for x in (q, k, v, do)) + (lengths, key_mask)


def _run(lib, kernels, q, k, v, do, o_in, lse_in, kw, **iso):
    """Forward and backward (from the given o, lse) under each kernel choice, in one child."""
    def work(launch, _lib):
        out = {}
        for kernel in kernels:
            names = []

            def spy(plan, args):
                names.append(plan.name)
                launch(plan, args)
            o, lse = H.emu_forward(spy, q, k, v, kernel=kernel, **kw)
            out[kernel] = (names, o, lse) + tuple(
                H.emu_backward(spy, q, k, v, o_in, lse_in, do, kernel=kernel, **kw))
        return out
    return H.run_isolated(lib, work, timeout=TIMEOUT, **iso)


def check_lever(lib, lever, B, Hq, Hkv, Nq, Nk, D, causal, masking, seed):
    """The lever's o, lse, dq, dk, dv within the float64 bounds; what it leaves to tc equal to
    tc's bit for bit; and, where the lever keeps tc's tiles, its own outputs too."""
    q, k, v, do, lengths, key_mask = _inputs(B, Hq, Hkv, Nq, Nk, D, masking, seed)
    kw = dict(causal=causal, lengths=lengths, key_mask=key_mask)
    o_ref, lse_ref, _ = H.ref_forward(q, k, v, **kw)
    o_in, lse_in = o_ref.astype(np.float16), lse_ref.astype(np.float32)
    got = _run(lib, ("tiled", lever), q, k, v, do, o_in, lse_in, kw)
    names, o, lse, dq, dk, dv = got[lever]
    _, *tc = got["tiled"]
    Dp = fc.padded_head_dim(D)
    own = fc.kernel_name(*(("fwd",) if lever == "tc_bm128" else ("bwd_dkdv",)), np.float16, Dp,
                         causal, lever)
    assert own in names, (own, names)
    assert ("bwd_dq" in " ".join(names)) == (lever != "tc_onepass"), names

    bounds = H.error_bounds(q, k, v, o_in, do, np.float16, **kw)
    refs = (o_ref,) + tuple(H.ref_backward(q, k, v, o_in, do, **kw))
    for name, x, ref in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), refs):
        assert x.dtype == np.float16
        H.check_close(name, x, ref, bounds[name])
    H.check_lse(lse, lse_ref)

    mine = dict(zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv)))
    theirs = dict(zip(("o", "lse", "dq", "dk", "dv"), tc))
    changed = {"tc_bm128": ("o", "lse"), "tc_kvreg": ("dk", "dv"), "tc_onepass": ("dq",)}[lever]
    same_tiles = Dp <= 64 and lever != "tc_onepass"
    for name in mine:
        if name not in changed or same_tiles:
            assert np.array_equal(mine[name], theirs[name]), (lever, name)


# ------------------------------------------------------------------ every lever, small and fast
@pytest.mark.parametrize("lever", LEVERS)
def test_lever_matches_reference_and_tc(emu_lib, lever):
    """One case that crosses tiles in both directions: 130 queries (a 128-row block and part of
    the next), 70 keys (two key blocks), MQA, causal with Nq > Nk, lengths and a key mask."""
    check_lever(emu_lib, lever, 1, 2, 1, 130, 70, 32, True, "both", seed=0)


# ------------------------------------------------------------------ a grid of sizes
HEAD_DIMS = st.sampled_from([8, 32, 40, 64, 100, 128])   # 32/64/128 compiled, others padded


@pytest.mark.slow
@settings(max_examples=4, derandomize=True, deadline=None)
@given(lever=st.sampled_from(LEVERS), Nq=st.integers(1, 140), Nk=st.integers(1, 140),
       D=HEAD_DIMS, heads=st.sampled_from([(2, 2), (4, 2), (2, 1)]), causal=st.booleans(),
       masking=st.sampled_from([None, "lengths", "mask", "both", "empty_batch"]),
       seed=st.integers(0, 2 ** 16))
@example(lever="tc_bm128", Nq=129, Nk=40, D=128, heads=(2, 1), causal=True, masking="lengths",
         seed=1)                      # D = 128: Q from shared memory, 32-key tiles, two blocks
@example(lever="tc_kvreg", Nq=40, Nk=129, D=128, heads=(2, 1), causal=True, masking="mask",
         seed=2)                      # D = 128: 16-query tiles, three key blocks
@example(lever="tc_onepass", Nq=50, Nk=150, D=128, heads=(2, 1), causal=False, masking=None,
         seed=3)                      # D = 128: dQ split over warp pairs; three key blocks add
@example(lever="tc_onepass", Nq=150, Nk=40, D=32, heads=(2, 1), causal=True, masking="both",
         seed=4)                      # Nq > Nk causal: leading rows see no key, dQ = 0 there
def test_levers_over_a_grid_of_sizes(emu_lib, lever, Nq, Nk, D, heads, causal, masking, seed):
    check_lever(emu_lib, lever, 2 if masking == "empty_batch" else 1, heads[0], heads[1], Nq,
                Nk, D, causal, masking, seed)


# ------------------------------------------------------------------ what the levers promise
def test_onepass_dkdv_are_deterministic_across_schedules(emu_lib):
    """dK and dV keep one writer per element in the single pass: bitwise equal under different
    schedules and cp.async landing orders; dQ, the atomics' sum, stays within its bound."""
    q, k, v, do, lengths, _ = _inputs(1, 4, 2, 70, 150, 32, "lengths", seed=5)
    kw = dict(causal=True, lengths=lengths)
    o_ref, lse_ref, _ = H.ref_forward(q, k, v, **kw)
    o_in, lse_in = o_ref.astype(np.float16), lse_ref.astype(np.float32)
    r1 = _run(emu_lib, ("tc_onepass",), q, k, v, do, o_in, lse_in, kw, seed=1,
              yield_permille=500)["tc_onepass"]
    r2 = _run(emu_lib, ("tc_onepass",), q, k, v, do, o_in, lse_in, kw, seed=2,
              yield_permille=0)["tc_onepass"]
    for x, y in zip(r1[4:], r2[4:]):
        assert np.array_equal(x, y)
    bound = H.error_bounds(q, k, v, o_in, do, np.float16, **kw)["dq"]
    dq_ref = H.ref_backward(q, k, v, o_in, do, **kw)[0]
    for r in (r1, r2):
        H.check_close("dq", r[3], dq_ref, bound)


@pytest.mark.slow
def test_onepass_without_its_barrier_is_a_race(onepass_broken_tsan_exe):
    """The single pass with the barrier between writing dS^T and reading it back removed is a
    data race, which ThreadSanitizer reports (the same run of the real kernels reports none:
    test_cuda_harness). The emulation's schedule alone does not lose this race reliably: every
    warp writes its dS^T and then runs two GEMMs before it reads, so the other warps' rows are
    usually there in time; ThreadSanitizer sees the missing happens-before edge whatever the
    timing."""
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
    p = subprocess.run([onepass_broken_tsan_exe, "levers"], capture_output=True, text=True,
                       timeout=300, env=env)
    out = p.stdout + p.stderr
    assert "WARNING: ThreadSanitizer: data race" in out, out[-4000:]
    assert "flash_bwd_dkdv_tc_onepass" in out, out[-4000:]


def test_levers_launch_plans_and_shared_memory():
    """Each lever's plan: its own kernel for the pass it changes, tc's for the others; the
    single pass has no dQ kernel, and asking for one is an error naming the passes it has."""
    p = fc.plan_launch("fwd", np.float16, B=2, H=3, Nq=130, Nk=5, D=64, causal=True,
                       fam="tc_bm128")
    assert (p.name, p.grid, p.smem) == ("flash_fwd_tc_bm128<64, true>", (2, 6, 1),
                                        2 * (128 + 2 * 64) * 72)
    assert fc.smem_bytes("fwd", np.float16, 128, "tc_bm128") == 2 * (128 + 2 * 32) * 136
    assert fc.kernel_name("bwd_dq", np.float16, 64, False, "tc_bm128") == \
        "flash_bwd_dq_tc<64, false>"
    p = fc.plan_launch("bwd_dkdv", np.float16, B=1, H=2, Nq=5, Nk=129, D=128, fam="tc_kvreg")
    assert (p.name, p.grid, p.smem) == ("flash_bwd_dkdv_tc_kvreg<128, false>", (3, 2, 1),
                                        2 * (128 + 4 * 16) * 136 + 16 * 16)
    assert fc.smem_bytes("bwd_dkdv", np.float16, 64, "tc_onepass") == \
        fc.smem_bytes("bwd_dkdv", np.float16, 64, "tc") + 2 * 64 * (64 + 8)
    assert fc.family_kinds("tc_onepass") == ("fwd", "bwd_dkdv", "bwd_dot")
    assert fc.module_names("tc_onepass", 32, True) == ["flash_fwd_tc<32, true>",
                                                       "flash_bwd_dkdv_tc_onepass<32, true>",
                                                       "flash_bwd_dot<__half>"]
    with pytest.raises(ValueError, match=r"the tc_onepass family has no bwd_dq kernel \(its "
                                         r"passes: \('fwd', 'bwd_dkdv', 'bwd_dot'\)\)"):
        fc.kernel_name("bwd_dq", np.float16, 64, False, "tc_onepass")
    with pytest.raises(TypeError, match="the tc_kvreg kernels take float16, got float32"):
        fc.kernel_name("bwd_dkdv", np.float32, 64, False, "tc_kvreg")
    with pytest.raises(ValueError, match=r"MINITX_FLASH_KERNEL=tc_bm128 takes float16 only "
                                         r"\(got float32\)"):
        fc.chosen_kernel(np.float32, "tc_bm128")
    for lever in LEVERS:
        assert fc.chosen_kernel(np.float16, lever) == lever
        for D in fc.SUPPORTED_HEAD_DIMS:
            for kind in fc.family_kinds(lever):
                if kind != "bwd_dot":   # every block fits an A100's opt-in limit
                    fc.check_shared_memory(fc.smem_bytes(kind, np.float16, D, lever), 163 * 1024)
