"""Every registered variant gives the same outputs and gradients on the NumPy and the CuPy
backend, from the same seed and inputs (skips cleanly without CuPy and a GPU).

Under ``MINITX_TEST_BACKEND=strict-cupy`` the "GPU" is the strict stand-in (it computes with
NumPy, so the numbers agree exactly; what is tested there is that the device path runs); on a
real GPU, float32 sums are ordered differently by cuBLAS than by the CPU's BLAS, hence the
float32 tolerance below: 1e-4 relative and 2e-5 absolute (a few float32 ulps times the longest
reduction, N·D = 512, plus headroom for the softmax's exponentials).
"""
import copy

import numpy as np
import pytest

import minitx
from minitx import backend
from minitx.attention import REGISTRY

pytestmark = pytest.mark.skipif(not minitx.gpu_available(), reason="needs CuPy and a CUDA GPU")
RTOL, ATOL = 1e-4, 2e-5


def _run(layer, x, g, device):
    layer = layer.to(device)
    t = minitx.tensor(x).to(device)
    t.requires_grad_(True)
    out = layer(t)
    (out * minitx.tensor(g).to(device)).sum().backward()
    # None: a parameter the output does not reach in eval mode (dsa's indexer learns from an
    # auxiliary loss attached only while training); both devices must agree on which
    grads = {n: None if p.grad is None else p.grad.numpy() for n, p in layer.named_parameters()}
    return out.numpy(), t.grad.numpy(), grads


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_variant_is_the_same_on_numpy_and_cupy(name):
    minitx.manual_seed(0)
    layer = REGISTRY[name](32, 4, causal=name in ("strided", "fixed")).eval()
    r = np.random.default_rng(0)
    x = r.standard_normal((2, 24, 32)).astype(np.float32)
    g = r.standard_normal((2, 24, 32)).astype(np.float32)
    cpu = _run(copy.deepcopy(layer), x, g, "cpu")
    gpu = _run(copy.deepcopy(layer), x, g, "cuda")
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=RTOL, atol=ATOL, err_msg=f"{name}: output")
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=RTOL, atol=ATOL, err_msg=f"{name}: dx")
    for pname, gc in cpu[2].items():
        assert (gpu[2][pname] is None) == (gc is None), f"{name}: d{pname} on one device only"
        if gc is not None:
            np.testing.assert_allclose(gpu[2][pname], gc, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: d{pname}")


def test_the_gpu_run_used_the_device():
    """The parity above compares two devices, not one twice."""
    x = minitx.tensor(np.ones(3, dtype=np.float32)).to("cuda")
    assert x.device == "cuda" and backend.device_of(x.data) == "cuda"
