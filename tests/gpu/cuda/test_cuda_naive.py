"""The naive CUDA kernels (``kernels/flash_naive.cuh``: one thread per row, fp32), executed on the
CPU by the emulation harness exactly as the tiled kernels are, against the float64 NumPy
reference, forward and backward.

The Python side is the real launcher (``flash_cuda._forward`` / ``_backward`` with
``kernel="naive"``: padding, launch plans, the Dvec pre-pass, GQA group sums). A naive block is
128 rows, so hypothesis draws Nq and Nk up to 300 (one to three blocks, edges anywhere), every
compiled head dim and padded ones (D and Dv from 1 to 128), GQA and MQA, scales, causal with
Nq != Nk, lengths, key masks, a batch with no key at all. Tolerance: the fp32 bound of
``cuda_emu_harness.error_bounds`` (1e-5 of max(|ref|, 1)), the same as the CUDA-core kernels':
the naive kernels accumulate in fp32 over the same lengths. Rows that see no key must give
exact zeros (o, dq) and lse = -inf, and keys no row sees exact zeros in dk and dv.
"""
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import cuda_emu_harness as H

TIMEOUT = 180.0


HEAD_DIMS = st.sampled_from([1, 8, 32, 40, 64, 100, 128])   # 32/64/128 compiled, others padded


@pytest.mark.slow
@settings(max_examples=14, derandomize=True, deadline=None)
@given(Nq=st.integers(1, 300), Nk=st.integers(1, 300), D=HEAD_DIMS,
       Dv=st.one_of(st.none(), HEAD_DIMS), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
       causal=st.booleans(),
       masking=st.sampled_from([None, "lengths", "mask", "both", "empty_batch"]),
       scale=st.one_of(st.none(), st.floats(0.05, 1.0)), seed=st.integers(0, 2 ** 16))
@example(Nq=300, Nk=5, D=64, Dv=None, heads=(2, 2), causal=True, masking=None, scale=None,
         seed=0)                                 # Nq >> Nk: the first 295 rows see no key
@example(Nq=5, Nk=300, D=64, Dv=None, heads=(4, 1), causal=True, masking=None, scale=None,
         seed=0)                                 # decoding against a long cache, MQA
@example(Nq=129, Nk=129, D=128, Dv=None, heads=(4, 2), causal=True, masking="both",
         scale=None, seed=1)                     # one row past a block, the largest D
@example(Nq=1, Nk=1, D=1, Dv=None, heads=(2, 2), causal=False, masking=None, scale=None,
         seed=2)
def test_naive_matches_the_float64_reference(emu_lib, Nq, Nk, D, Dv, heads, causal, masking,
                                             scale, seed):
    Hq, Hkv = heads
    H.check_float32_kernel(emu_lib, "naive", 2, Hq, Hkv, Nq, Nk, D, D if Dv is None else Dv, causal, masking, scale, seed)


def test_fully_masked_everything_is_zero_not_nan(emu_lib):
    """A key mask that keeps nothing: o = 0, lse = -inf, and all gradients exactly zero."""
    B, Hq, Nq, Nk, D = 1, 2, 33, 70, 32
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s).astype(np.float32)
                   for s in ((B, Hq, Nq, D), (B, Hq, Nk, D), (B, Hq, Nk, D), (B, Hq, Nq, D)))
    key_mask = np.zeros((B, Nk), dtype=bool)

    def work(launch, lib):
        o, lse = H.emu_forward(launch, q, k, v, key_mask=key_mask, kernel="naive")
        grads = H.emu_backward(launch, q, k, v, o, lse, do, key_mask=key_mask, kernel="naive")
        return (o, lse) + tuple(grads)

    o, lse, dq, dk, dv = H.run_isolated(emu_lib, work, timeout=TIMEOUT)
    assert np.all(o == 0) and np.all(lse == -np.inf)
    assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


def test_naive_is_deterministic_across_schedules(emu_lib):
    """Every output element has one writer (no atomics): bitwise equal under any schedule."""
    q, k, v, do, lengths, _ = H.float32_inputs(1, 4, 2, 140, 150, 32, 32, "lengths", seed=5)
    kw = dict(causal=True, lengths=lengths, kernel="naive")

    def work(launch, lib):
        o, lse = H.emu_forward(launch, q, k, v, **kw)
        return (o, lse) + tuple(H.emu_backward(launch, q, k, v, o, lse, do, **kw))

    r1 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=1, yield_permille=500)
    r2 = H.run_isolated(emu_lib, work, timeout=TIMEOUT, seed=2, yield_permille=0)
    for x, y in zip(r1, r2):
        assert np.array_equal(x, y)


def test_naive_and_tiled_launch_their_own_kernels(emu_lib):
    """kernel="naive" launches the *_naive instantiations (plus the shared Dvec pre-pass), and
    the default launches the tiled CUDA-core ones, on the same arrays."""
    q, k, v, do, _, _ = H.float32_inputs(1, 2, 1, 20, 40, 48, 48, None, seed=7)

    def work(launch, lib):
        seen = {}
        for kernel in ("naive", "tiled"):
            names = []

            def spy(plan, args):
                names.append(plan.name)
                launch(plan, args)
            o, lse = H.emu_forward(spy, q, k, v, causal=True, kernel=kernel)
            H.emu_backward(spy, q, k, v, o, lse, do, causal=True, kernel=kernel)
            seen[kernel] = names
        return seen

    seen = H.run_isolated(emu_lib, work, timeout=TIMEOUT)
    assert seen["naive"] == ["flash_fwd_naive<64, true>", "flash_bwd_dot<float>",
                             "flash_bwd_dkdv_naive<64, true>", "flash_bwd_dq_naive<64, true>"]
    assert seen["tiled"] == ["flash_fwd_simt<64, true>", "flash_bwd_dot<float>",
                             "flash_bwd_dkdv_simt<64, true>", "flash_bwd_dq_simt<64, true>"]
