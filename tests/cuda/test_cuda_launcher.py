"""Pure-Python parts of the CuPy launcher (no CuPy, no GPU, no compiler needed)."""
import sys

import numpy as np
import pytest

from minitx.backend import flash_cuda as fc


def _qkv(B=2, H=4, Hkv=2, Nq=5, Nk=7, D=32, dtype=np.float32):
    return (np.zeros((B, H, Nq, D), dtype), np.zeros((B, Hkv, Nk, D), dtype),
            np.zeros((B, Hkv, Nk, D), dtype))


def test_cupy_is_not_imported_by_the_launcher_module():
    import minitx  # noqa: F401
    import minitx.backend.cuda_tools  # noqa: F401
    if "cupy" not in sys.modules:          # only meaningful where nothing else imported it
        assert "cupy" not in sys.modules


def test_is_available_never_raises():
    assert fc.is_available() in (True, False)


def test_forward_without_gpu_is_a_clear_error():
    if fc.is_available():
        pytest.skip("a GPU is present")
    q, k, v = _qkv()
    with pytest.raises((RuntimeError, TypeError)):
        fc.flash_attention_forward(q, k, v)


@pytest.mark.parametrize("d,expected", [(1, 32), (32, 32), (33, 64), (48, 64), (64, 64),
                                        (65, 128), (100, 128), (128, 128)])
def test_padding_decision(d, expected):
    assert fc.padded_head_dim(d) == expected


def test_head_dim_too_large():
    with pytest.raises(ValueError, match="<= 128.*129"):
        fc.padded_head_dim(129)


def test_zero_padding_leaves_scores_and_outputs_unchanged():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 6, 48)) for _ in range(3))
    qp, kp, vp = (fc.pad_head_dim(np, x, 64) for x in (q, k, v))
    assert qp.shape == (1, 1, 6, 64) and np.all(qp[..., 48:] == 0)
    s, sp = q @ np.swapaxes(k, -1, -2), qp @ np.swapaxes(kp, -1, -2)
    np.testing.assert_array_equal(s, sp)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose((p @ vp)[..., :48], p @ v)
    assert np.all((p @ vp)[..., 48:] == 0)


def test_shared_memory_arithmetic():
    # fwd: Q,K (32 x (D+1)) + V (32 x D) + P (32 x 33) floats
    assert fc.smem_bytes("fwd", 64) == 4 * (64 * 65 + 32 * 64 + 32 * 33) == 29056
    assert fc.smem_bytes("fwd", 128) == 53632 > fc.DEFAULT_SMEM_LIMIT   # needs the opt-in
    assert fc.smem_bytes("bwd_dkdv", 128) == 74752
    assert fc.smem_bytes("bwd_dq", 128) == 70272
    assert fc.smem_bytes("bwd_dot", 64) == 0
    for D in fc.SUPPORTED_HEAD_DIMS:     # every kernel fits an A100 block (163 KB opt-in)
        for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
            fc.check_shared_memory(fc.smem_bytes(kind, D), 163 * 1024)
    with pytest.raises(ValueError, match="53632 bytes.*allows 49152"):
        fc.check_shared_memory(53632, 49152, "flash_fwd<float, 128, false>")


def test_launch_plans():
    p = fc.plan_launch("fwd", np.float16, B=2, H=3, Nq=70, Nk=10, D=64, causal=True)
    assert p.name == "flash_fwd<__half, 64, true>"
    assert p.grid == (3, 6, 1) and p.block == (128, 1, 1) and p.smem == fc.smem_bytes("fwd", 64)
    p = fc.plan_launch("bwd_dkdv", np.float32, B=1, H=2, Nq=5, Nk=65, D=32)
    assert p.name == "flash_bwd_dkdv<float, 32, false>" and p.grid == (3, 2, 1)
    p = fc.plan_launch("bwd_dot", np.float32, B=1, H=2, Nq=5, Nk=65, D=32)
    assert p.name == "flash_bwd_dot<float>" and p.grid == (3, 1, 1) and p.smem == 0
    with pytest.raises(ValueError, match="B\\*H"):
        fc.plan_launch("fwd", np.float32, B=70000, H=1, Nq=1, Nk=1, D=32)


def test_kernel_names():
    names = fc.all_kernel_names()
    assert len(names) == len(set(names)) == 38
    assert "flash_bwd_dq<__half, 128, true>" in names
    with pytest.raises(TypeError, match="float32 or float16.*float64"):
        fc.kernel_name("fwd", np.float64, 64)


@pytest.mark.parametrize("mutate,exc,msg", [
    (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, "q must be float32 or float16, got float64"),
    (lambda a: a.update(k=a["k"].astype(np.float16)), TypeError, "k must have q's dtype float32, got float16"),
    (lambda a: a.update(q=a["q"][0]), ValueError, "q must be 4-D"),
    (lambda a: a.update(v=a["v"][:, :, :3]), ValueError, "v must have k's shape"),
    (lambda a: a.update(k=a["k"][:1], v=a["v"][:1]), ValueError, "k must have batch size 2"),
    (lambda a: a.update(k=np.zeros((2, 3, 7, 32), np.float32), v=np.zeros((2, 3, 7, 32), np.float32)),
     ValueError, "k heads must divide q heads 4, got 3"),
    (lambda a: a.update(key_mask=np.ones((2, 6), bool)), ValueError, r"key_mask must have shape \(2, 7\)"),
    (lambda a: a.update(key_mask=np.ones((2, 7), np.float32)), TypeError, "key_mask must be bool"),
    (lambda a: a.update(lengths=np.ones((3,), np.int32)), ValueError, r"lengths must have shape \(2,\)"),
    (lambda a: a.update(lengths=np.ones((2,), np.float32)), TypeError, "lengths must be an integer"),
])
def test_validation_messages(mutate, exc, msg):
    q, k, v = _qkv()
    a = dict(q=q, k=k, v=v, key_mask=None, lengths=None)
    mutate(a)
    with pytest.raises(exc, match=msg):
        fc.validate_inputs(a["q"], a["k"], a["v"], a["key_mask"], a["lengths"])


def test_validation_backward_extras():
    q, k, v = _qkv()
    assert fc.validate_inputs(q, k, v) == (2, 4, 2, 5, 7, 32)
    with pytest.raises(ValueError, match="do must have the output's shape"):
        fc.validate_inputs(q, k, v, do=q[:, :, :2])
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 4, 5\)"):
        fc.validate_inputs(q, k, v, lse=np.zeros((2, 4), np.float32))


def test_value_head_dim_may_differ():
    q, k, _ = _qkv()
    v = np.zeros(k.shape[:3] + (100,), np.float32)
    assert fc.validate_inputs(q, k, v) == (2, 4, 2, 5, 7, 32)
    assert fc.compiled_head_dim(q, v) == 128
    o = np.zeros(q.shape[:3] + (100,), np.float32)
    fc.validate_inputs(q, k, v, o=o, do=o)
    with pytest.raises(ValueError, match=r"o must have the output's shape .* \(2, 4, 5, 100\)"):
        fc.validate_inputs(q, k, v, o=q)
    with pytest.raises(ValueError, match="<= 128.*129"):
        fc.validate_inputs(q, k, np.zeros(k.shape[:3] + (129,), np.float32))
