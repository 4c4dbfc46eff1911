"""The real kernels on a real GPU, against the float64 reference (skips cleanly without one).

Run where CuPy and an NVIDIA GPU are present (``MINITX_BACKEND=cupy python -m pytest
tests/gpu/cuda/test_cuda_gpu.py``): the same cases and error bounds as the emulation tests, but
through ``flash_cuda``'s NVRTC-compiled kernels on the device — ragged shapes, causal with
Nq ≪ Nk and Nq ≫ Nk, grouped heads, key masks, float32 and float16, and for float32 every
family: the tiled CUDA-core kernels, the naive ones and the 3xTF32 tensor-core ones
(``kernel="naive"`` / ``"tf32"``, what ``MINITX_FLASH_KERNEL`` selects), the last within the
bound that adds the split's product error (``error_bounds(..., family="tf32")``), and for float16
the tiled tensor-core kernels and each fp16 lever (``tc_bm128``, ``tc_kvreg``, ``tc_onepass``).
"""
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import cuda_emu_harness as H
from minitx import backend
from minitx.backend import flash_cuda as fc

pytestmark = pytest.mark.skipif(
    fc.unavailable_reason() is not None,
    reason=f"needs the CUDA kernels on a GPU: {fc.unavailable_reason()}")


@settings(max_examples=25, deadline=None)
@given(nq=st.integers(1, 300), nk=st.integers(1, 300), causal=st.booleans(),
       dtype=st.sampled_from(["float32", "float16"]), d=st.sampled_from([24, 64, 128]),
       groups=st.sampled_from([(2, 2), (4, 1), (4, 2)]), masked=st.booleans(),
       seed=st.integers(0, 1000), fp32_kernel=st.sampled_from(["tiled", "naive", "tf32"]),
       fp16_kernel=st.sampled_from(("tiled",) + tuple(fc.LEVERS)))
@example(nq=5, nk=300, causal=True, dtype="float32", d=64, groups=(2, 2), masked=False,
         seed=0, fp32_kernel="tiled", fp16_kernel="tiled")
@example(nq=300, nk=5, causal=True, dtype="float16", d=64, groups=(2, 2), masked=False,
         seed=0, fp32_kernel="tiled", fp16_kernel="tiled")
@example(nq=5, nk=300, causal=True, dtype="float32", d=128, groups=(4, 1), masked=True,
         seed=0, fp32_kernel="naive", fp16_kernel="tiled")
@example(nq=200, nk=300, causal=True, dtype="float32", d=128, groups=(4, 1), masked=True,
         seed=0, fp32_kernel="tf32", fp16_kernel="tiled")
@example(nq=300, nk=70, causal=False, dtype="float32", d=24, groups=(4, 2), masked=False,
         seed=1, fp32_kernel="tf32", fp16_kernel="tiled")
@example(nq=300, nk=200, causal=True, dtype="float16", d=128, groups=(4, 1), masked=True,
         seed=2, fp32_kernel="tiled", fp16_kernel="tc_bm128")
@example(nq=200, nk=300, causal=True, dtype="float16", d=128, groups=(4, 2), masked=True,
         seed=3, fp32_kernel="tiled", fp16_kernel="tc_kvreg")
@example(nq=300, nk=300, causal=False, dtype="float16", d=64, groups=(4, 1), masked=True,
         seed=4, fp32_kernel="tiled", fp16_kernel="tc_onepass")
def test_kernels_match_the_float64_reference_on_the_gpu(nq, nk, causal, dtype, d, groups,
                                                        masked, seed, fp32_kernel, fp16_kernel):
    cp = backend.cupy_or_none()
    rng = np.random.default_rng(seed)
    hq, hkv = groups
    q = rng.standard_normal((2, hq, nq, d)).astype(dtype)
    k = rng.standard_normal((2, hkv, nk, d)).astype(dtype)
    v = rng.standard_normal((2, hkv, nk, d)).astype(dtype)
    do = rng.standard_normal((2, hq, nq, d)).astype(dtype)
    key_mask = (rng.random((2, nk)) < 0.8) if masked else None
    kw = dict(causal=causal, key_mask=key_mask)
    o_ref, lse_ref, _ = H.ref_forward(q, k, v, **kw)
    o_in, lse_in = o_ref.astype(dtype), lse_ref.astype(np.float32)
    dev = [cp.asarray(a) for a in (q, k, v)]
    km = None if key_mask is None else cp.asarray(key_mask)
    kernel = fp32_kernel if dtype == "float32" else fp16_kernel   # each family its dtype
    o, lse = fc.flash_attention_forward(*dev, causal=causal, key_mask=km, kernel=kernel)
    grads = fc.flash_attention_backward(*dev, cp.asarray(o_in), cp.asarray(lse_in),
                                        cp.asarray(do), causal=causal, key_mask=km,
                                        kernel=kernel)
    bounds = H.error_bounds(q, k, v, o_in, do, dtype, family=kernel, **kw)
    H.check_close("o", cp.asnumpy(o), o_ref, bounds["o"])
    H.check_lse(cp.asnumpy(lse), lse_ref)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, H.ref_backward(q, k, v, o_in, do, **kw)):
        H.check_close(name, cp.asnumpy(got), ref, bounds[name])
