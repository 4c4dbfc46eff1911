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
    assert fc.is_available() == (fc.unavailable_reason() is None)


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
    # fp16 tensor cores: rows of D + 8 halves; fwd = Q (64) + K (64) + V (64) rows
    assert fc.smem_bytes("fwd", np.float16, 64) == 2 * 3 * 64 * 72 == 27648
    # dK/dV: K, V (64 rows) + 2 stages x (Q, dO) (64 rows each) + 2 stages x (lse, Dvec) floats
    assert fc.smem_bytes("bwd_dkdv", np.float16, 64) == 2 * (128 + 256) * 72 + 4 * 4 * 64 == 56320
    # D = 128 halves the streamed tiles (32 rows) to stay near 70 KB (2 blocks on an A100 SM)
    assert fc.smem_bytes("bwd_dq", np.float16, 128) == 2 * (128 + 4 * 32) * 136 == 69632
    # fp32 CUDA cores: rows of D + 4 floats; fwd = Q (64) + K, V (64 or 32) + P (64 x (BN + 4))
    assert fc.smem_bytes("fwd", np.float32, 64) == 4 * (192 * 68 + 64 * 68) == 69632
    assert fc.smem_bytes("fwd", np.float32, 128) == 4 * (128 * 132 + 64 * 36) == 76800
    assert fc.smem_bytes("bwd_dot", np.float32, 64) == 0
    assert fc.smem_bytes("fwd", np.float16, 32) < fc.DEFAULT_SMEM_LIMIT < fc.smem_bytes("fwd", np.float16, 128)
    for dt in (np.float32, np.float16):   # every kernel fits an A100 block (163 KB opt-in)
        for D in fc.SUPPORTED_HEAD_DIMS:
            for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
                fc.check_shared_memory(fc.smem_bytes(kind, dt, D), 163 * 1024)
                name = fc.kernel_name(kind, dt, D, True)
                assert fc.smem_bytes_of(name) == fc.smem_bytes(kind, dt, D)
    assert fc.smem_bytes_of("flash_bwd_dot<__half>") == 0
    with pytest.raises(ValueError, match="53632 bytes.*allows 49152"):
        fc.check_shared_memory(53632, 49152, "flash_fwd_tc<128, false>")


def test_launch_plans():
    p = fc.plan_launch("fwd", np.float16, B=2, H=3, Nq=130, Nk=10, D=64, causal=True)
    assert p.name == "flash_fwd_tc<64, true>"
    assert p.grid == (3, 6, 1) and p.block == (128, 1, 1) and p.smem == fc.smem_bytes("fwd", np.float16, 64)
    p = fc.plan_launch("bwd_dkdv", np.float32, B=1, H=2, Nq=5, Nk=65, D=32)
    assert p.name == "flash_bwd_dkdv_simt<32, false>" and p.grid == (2, 2, 1)     # 64 keys a block
    p = fc.plan_launch("bwd_dkdv", np.float32, B=1, H=2, Nq=5, Nk=65, D=128)
    assert p.grid == (3, 2, 1)                                                    # 32 keys a block
    p = fc.plan_launch("bwd_dq", np.float32, B=1, H=1, Nq=65, Nk=5, D=128)
    assert p.name == "flash_bwd_dq_simt<128, false>" and p.grid == (3, 1, 1)
    p = fc.plan_launch("bwd_dot", np.float32, B=1, H=2, Nq=5, Nk=65, D=32)
    assert p.name == "flash_bwd_dot<float>" and p.grid == (3, 1, 1) and p.smem == 0
    with pytest.raises(ValueError, match="B\\*H"):
        fc.plan_launch("fwd", np.float32, B=70000, H=1, Nq=1, Nk=1, D=32)


def test_kernel_names_and_families():
    names = fc.all_kernel_names()
    # 38 tiled + 18 naive + 18 tf32 + 18 of the fp16 levers' own (6 each)
    assert len(names) == len(set(names)) == 92
    assert len(fc.all_kernel_names(naive=False, tf32=False, levers=False)) == 38
    assert len(fc.all_kernel_names(naive=False, levers=False)) == 56
    assert len(fc.all_kernel_names(dtypes=("float16",))) == 19 + 18
    assert "flash_bwd_dkdv_tc_onepass<64, true>" in names and "flash_fwd_tc_bm128<32, false>" in names
    assert "flash_bwd_dkdv_tf32<128, true>" in names
    assert "flash_bwd_dq_tc<128, true>" in names and "flash_fwd_simt<32, false>" in names
    assert "flash_bwd_dot<__half>" in names and "flash_bwd_dot<float>" in names
    assert fc.family(np.float16) == "tc" and fc.family(np.float32) == "simt"
    with pytest.raises(TypeError, match="float32 or float16.*float64"):
        fc.kernel_name("fwd", np.float64, 64)


def test_kernel_source_inlines_every_header_once():
    src = fc.kernel_source()
    assert '#include "' not in src.replace('#include "cuda_emu.h"', "")   # self-contained for NVRTC
    for name in ("flash_common.cuh", "flash_naive.cuh", "flash_simt.cuh", "flash_tc.cuh",
                 "flash_tf32.cuh", "flash_tc_levers.cuh"):
        assert src.count(f"// ---- begin {name}") == 1
    files = [f for f in fc.kernel_files() if f.endswith(".cuh")]
    assert len(files) == 6
    for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
        for fam in ("tc", "simt", "naive", "tf32"):
            assert f"flash_{kind}_{fam}(" in src
    for kernel in ("flash_fwd_tc_bm128(", "flash_bwd_dkdv_tc_kvreg(", "flash_bwd_dkdv_tc_onepass("):
        assert kernel in src
    # the naive kernels come first: the file a reader opens first is the one NVRTC sees first
    assert src.index("// ---- begin flash_naive.cuh") < src.index("// ---- begin flash_simt.cuh")


@pytest.mark.parametrize("make,expected", [
    (lambda q, k, v: (q.astype(np.float64), k, v), "dtype float64 (kernels take float32/float16)"),
    (lambda q, k, v: (q, k.astype(np.float16), v), "k dtype float16 differs from q's float32"),
    (lambda q, k, v: (np.zeros((2, 4, 5, 192), np.float32), np.zeros((2, 2, 7, 192), np.float32),
                      np.zeros((2, 2, 7, 192), np.float32)), "head dim 192 > 128"),
    (lambda q, k, v: (q, k, np.zeros((2, 2, 7, 200), np.float32)), "value head dim 200 > 128"),
    (lambda q, k, v: (np.zeros((70000, 1, 1, 32), np.float32), np.zeros((70000, 1, 1, 32), np.float32),
                      np.zeros((70000, 1, 1, 32), np.float32)), "B*H = 70000 exceeds the grid limit 65535"),
    (lambda q, k, v: (q, np.zeros((2, 3, 7, 32), np.float32), np.zeros((2, 3, 7, 32), np.float32)),
     "4 query heads are not a multiple of 3 key/value heads"),
    (lambda q, k, v: (q[0], k, v), "q is 3-D"),
    (lambda q, k, v: ([1.0], k, v), "q is a list, not an array"),
    (lambda q, k, v: (q, k, v[:, :, :3]), "v shape"),
    (lambda q, k, v: (q, k[:1], v[:1]), "k has batch 1, q has 2"),
])
def test_decline_reasons(make, expected):
    q, k, v = make(*_qkv())
    reason = fc.decline_reason(q, k, v)
    assert reason is not None and reason.startswith(expected), reason
    assert fc.supports(q, k, v) is False


def test_decline_reason_masks_and_accepts():
    q, k, v = _qkv()
    assert fc.decline_reason(q, k, v) is None and fc.supports(q, k, v)
    assert fc.decline_reason(q, k, v, key_mask=np.ones((2, 7), bool), lengths=np.ones(2, np.int32)) is None
    assert fc.decline_reason(*_qkv(dtype=np.float16)) is None   # NumPy arrays: no device to ask
    assert "key_mask shape (2, 6)" in fc.decline_reason(q, k, v, key_mask=np.ones((2, 6), bool))
    assert "key_mask dtype float32" in fc.decline_reason(q, k, v, key_mask=np.ones((2, 7), np.float32))
    assert "lengths shape (3,)" in fc.decline_reason(q, k, v, lengths=np.ones(3, np.int32))
    assert "lengths dtype float32" in fc.decline_reason(q, k, v, lengths=np.ones(2, np.float32))


def test_decline_reason_never_raises_on_odd_inputs():
    q, k, v = _qkv()

    class NoDtype:
        shape, ndim, dtype = (2, 4, 5, 32), 4, "not a dtype"
    assert fc.decline_reason(NoDtype(), k, v).startswith("q has no NumPy dtype")
    assert fc.decline_reason(q, k, v, lengths=[1, 2]).startswith("lengths has no NumPy dtype")
    assert fc.decline_reason(q, k, v, key_mask=np.ones((2, 7), object)).startswith("key_mask dtype object")


def test_float16_is_declined_on_gpus_older_than_sm80(monkeypatch):
    """A float16 CuPy array on an sm_75 GPU: no mma.sync m16n8k16 / cp.async -> declined, naming
    the GPU; float32 still runs there; sm_90 takes float16."""
    import minitx.backend as backend

    class Device:
        compute_capability = "75"

    fake = type("cupy", (), {})()
    fake.cuda = type("cuda", (), {"Device": Device})()
    monkeypatch.setitem(backend._cupy, "tried", True)
    monkeypatch.setitem(backend._cupy, "module", fake)
    CupyArray = type("ndarray", (), {"__module__": "cupy._core.core"})

    def arr(shape, dtype):
        a = CupyArray()
        a.shape, a.ndim, a.dtype = shape, len(shape), np.dtype(dtype)
        return a

    q16, k16 = arr((1, 2, 5, 64), np.float16), arr((1, 2, 7, 64), np.float16)
    assert fc.decline_reason(q16, k16, k16) == (
        "float16 needs the tensor-core kernels (mma.sync m16n8k16, cp.async: sm_80+); this GPU is sm_75")
    q32, k32 = arr((1, 2, 5, 64), np.float32), arr((1, 2, 7, 64), np.float32)
    assert fc.decline_reason(q32, k32, k32) is None
    assert fc.decline_reason(q32, k32, k32, kernel="tf32") == (
        "MINITX_FLASH_KERNEL=tf32 needs tensor cores with tf32 (mma.sync m16n8k8, cp.async: "
        "sm_80+); this GPU is sm_75")
    Device.compute_capability = "90"
    assert fc.decline_reason(q16, k16, k16) is None
    assert fc.decline_reason(q32, k32, k32, kernel="tf32") is None


def test_unavailable_reason_without_cupy(monkeypatch):
    import minitx.backend as backend
    monkeypatch.setitem(backend._cupy, "tried", True)
    monkeypatch.setitem(backend._cupy, "module", None)
    monkeypatch.setitem(backend._cupy, "error", "ModuleNotFoundError: No module named 'cupy'")
    assert fc.unavailable_reason() == "CuPy is not installed"
    assert fc.is_available() is False
    monkeypatch.setitem(backend._cupy, "error", "ImportError: libcudart.so.12: cannot open")
    assert fc.unavailable_reason().startswith("CuPy failed to import (ImportError: libcudart")


class _StandIn:
    """A module that looks like CuPy to the launcher (the strict-CuPy-stand-in situation)."""

    def __init__(self, available=True, nvrtc=None):
        self._available = available
        self.cuda = type("cuda", (), {})()
        if nvrtc is not None:
            self.cuda.nvrtc = nvrtc

    def is_available(self):
        return self._available


def test_unavailable_reason_with_a_cupy_stand_in(monkeypatch):
    import minitx.backend as backend
    monkeypatch.setitem(backend._cupy, "tried", True)
    monkeypatch.setitem(backend._cupy, "module", _StandIn(available=False))
    assert fc.unavailable_reason() == "no CUDA device (cupy.is_available() is False)"
    monkeypatch.setitem(backend._cupy, "module", _StandIn())           # no cuda.nvrtc at all
    assert fc.unavailable_reason().startswith("NVRTC failed to load: AttributeError")

    class Raising:
        @staticmethod
        def getVersion():
            raise RuntimeError("nvrtc64 not found")
    monkeypatch.setitem(backend._cupy, "module", _StandIn(nvrtc=Raising))
    assert fc.unavailable_reason() == "NVRTC failed to load: RuntimeError: nvrtc64 not found"

    class Fine:
        @staticmethod
        def getVersion():
            return (13, 0)
    monkeypatch.setitem(backend._cupy, "module", _StandIn(nvrtc=Fine))
    assert fc.unavailable_reason() is None and fc.is_available() is True


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


# ------------------------------------------------------------------ the kernel choice
def test_kernel_choice_reads_the_environment_at_each_call(monkeypatch):
    monkeypatch.delenv("MINITX_FLASH_KERNEL", raising=False)
    assert fc.kernel_choice() == "tiled"
    for value, expected in (("", "tiled"), ("  ", "tiled"), ("naive", "naive"),
                            (" Naive ", "naive"), ("tiled", "tiled"), ("TF32", "tf32")):
        monkeypatch.setenv("MINITX_FLASH_KERNEL", value)
        assert fc.kernel_choice() == expected, value


@pytest.mark.parametrize("value", ["fast", "simt", "tc", "naïve", "0"])
def test_an_unknown_kernel_choice_names_the_variable_the_choices_and_the_value(monkeypatch,
                                                                               value):
    monkeypatch.setenv("MINITX_FLASH_KERNEL", value)
    msg = (f"MINITX_FLASH_KERNEL must be one of ('tiled', 'naive', 'tf32', 'tc_bm128', "
           f"'tc_kvreg', 'tc_onepass'), got {value!r}")
    for call in (fc.kernel_choice, lambda: fc.chosen_kernel(np.float32),
                 lambda: fc.decline_reason(*_qkv())):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == msg
    with pytest.raises(ValueError, match="kernel must be one of"):
        fc.chosen_kernel(np.float32, "fast")


def test_chosen_kernel(monkeypatch):
    monkeypatch.delenv("MINITX_FLASH_KERNEL", raising=False)
    assert fc.chosen_kernel(np.float32) == "simt" and fc.chosen_kernel(np.float16) == "tc"
    assert fc.chosen_kernel("float32", "naive") == "naive"
    with pytest.raises(ValueError, match=r"MINITX_FLASH_KERNEL=naive takes float32 only \(got "
                                         r"float16\)"):
        fc.chosen_kernel(np.float16, "naive")
    monkeypatch.setenv("MINITX_FLASH_KERNEL", "naive")
    assert fc.chosen_kernel(np.float32) == "naive"
    assert fc.chosen_kernel(np.float32, "tiled") == "simt"       # an explicit choice wins
    assert fc.chosen_kernel(np.float32, "tf32") == "tf32"
    with pytest.raises(ValueError, match=r"MINITX_FLASH_KERNEL=tf32 takes float32 only \(got "
                                         r"float16\)"):
        fc.chosen_kernel(np.float16, "tf32")
    with pytest.raises(TypeError, match="float32 or float16"):
        fc.chosen_kernel(np.float64)


def test_tf32_launch_plans_names_and_shared_memory():
    """The 3xTF32 family: 64 rows per block like the fp16 kernels, fp32 tiles with rows D + 4
    floats apart (Tf32Cfg<D>: forward key tiles of 64, 32 at D = 128; dQ's key tiles of 32, 16
    at D = 128; dK/dV's query tiles of 32, 8 at D = 128; double buffered)."""
    p = fc.plan_launch("fwd", np.float32, B=2, H=3, Nq=130, Nk=5, D=64, causal=True, fam="tf32")
    assert (p.name, p.grid, p.smem) == ("flash_fwd_tf32<64, true>", (3, 6, 1),
                                        4 * (64 + 2 * 64) * 68)
    p = fc.plan_launch("bwd_dkdv", np.float32, B=1, H=2, Nq=5, Nk=129, D=128, fam="tf32")
    assert (p.name, p.grid, p.smem) == ("flash_bwd_dkdv_tf32<128, false>", (3, 2, 1),
                                        4 * (128 + 4 * 8) * 132 + 4 * 4 * 8)
    p = fc.plan_launch("bwd_dq", np.float32, B=1, H=1, Nq=64, Nk=500, D=32, fam="tf32")
    assert (p.name, p.grid, p.smem) == ("flash_bwd_dq_tf32<32, false>", (1, 1, 1),
                                        4 * (128 + 4 * 32) * 36)
    assert fc.smem_bytes("fwd", np.float32, 128, "tf32") == 4 * (64 + 2 * 32) * 132
    assert fc.smem_bytes_of("flash_bwd_dq_tf32<64, true>") == 4 * (128 + 4 * 32) * 68
    for D in fc.SUPPORTED_HEAD_DIMS:   # every block fits an A100's opt-in limit
        for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
            fc.check_shared_memory(fc.smem_bytes(kind, np.float32, D, "tf32"), 163 * 1024)
    with pytest.raises(TypeError, match="the tf32 kernels take float32, got float16"):
        fc.kernel_name("fwd", np.float16, 64, False, "tf32")


def test_naive_declines_float16_with_the_reason(monkeypatch):
    q16 = _qkv(dtype=np.float16)
    monkeypatch.setenv("MINITX_FLASH_KERNEL", "naive")
    assert fc.decline_reason(*q16) == "MINITX_FLASH_KERNEL=naive takes float32 only (got float16)"
    assert fc.supports(*q16) is False
    assert fc.decline_reason(*_qkv()) is None                     # float32: taken
    assert fc.decline_reason(*q16, kernel="tiled") is None        # explicit: the env is not read
    # the array checks come first (a float64 call is declined for its dtype, whatever the choice)
    assert fc.decline_reason(*_qkv(dtype=np.float64)).startswith("dtype float64")
    monkeypatch.delenv("MINITX_FLASH_KERNEL")
    assert fc.decline_reason(*q16) is None
    assert fc.decline_reason(*q16, kernel="naive").startswith("MINITX_FLASH_KERNEL=naive")


def test_naive_launch_plans_names_and_shared_memory():
    # one thread per row, 128 rows per block; no shared memory at all
    p = fc.plan_launch("fwd", np.float32, B=2, H=3, Nq=300, Nk=5, D=64, causal=True, fam="naive")
    assert p.name == "flash_fwd_naive<64, true>"
    assert p.grid == (3, 6, 1) and p.block == (128, 1, 1) and p.smem == 0
    p = fc.plan_launch("bwd_dkdv", np.float32, B=1, H=2, Nq=5, Nk=129, D=128, fam="naive")
    assert p.name == "flash_bwd_dkdv_naive<128, false>" and p.grid == (2, 2, 1)   # keys: rows
    p = fc.plan_launch("bwd_dq", np.float32, B=1, H=1, Nq=128, Nk=500, D=32, fam="naive")
    assert p.grid == (1, 1, 1) and p.smem == 0
    p = fc.plan_launch("bwd_dot", np.float32, B=1, H=2, Nq=5, Nk=65, D=32, fam="naive")
    assert p.name == "flash_bwd_dot<float>"                       # the shared Dvec pre-pass
    for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
        assert fc.tile_rows(kind, np.float32, 64, "naive") == fc.THREADS
        for D in fc.SUPPORTED_HEAD_DIMS:
            assert fc.smem_bytes(kind, np.float32, D, "naive") == 0
            assert fc.smem_bytes_of(fc.kernel_name(kind, np.float32, D, True, "naive")) == 0
    assert fc.module_names("naive", 32, False) == [
        "flash_fwd_naive<32, false>", "flash_bwd_dkdv_naive<32, false>",
        "flash_bwd_dq_naive<32, false>", "flash_bwd_dot<float>"]
    assert fc.module_names("tc", 64, True)[0] == "flash_fwd_tc<64, true>"
    with pytest.raises(TypeError, match="the naive kernels take float32, got float16"):
        fc.kernel_name("fwd", np.float16, 64, False, "naive")
    with pytest.raises(ValueError, match="family must be one of"):
        fc.plan_launch("fwd", np.float32, B=1, H=1, Nq=1, Nk=1, D=32, fam="fast")


def test_the_drivers_take_an_explicit_choice():
    """_forward/_backward plan the chosen family's kernels, and refuse float16 under naive
    before launching anything."""
    launched = []

    def launch(plan, args):
        launched.append((plan.name, plan.grid, plan.smem))

    q, k, v = (np.ones(s, np.float32) for s in ((1, 2, 3, 40), (1, 1, 4, 40), (1, 1, 4, 40)))
    fc._forward(np, launch, q, k, v, causal=True, kernel="naive")
    assert launched == [("flash_fwd_naive<64, true>", (1, 2, 1), 0)]
    launched.clear()
    with np.errstate(all="ignore"):        # the fake launch writes nothing: the group sums of
        fc._backward(np, launch, q, k, v, q.copy(), np.zeros((1, 2, 3), np.float32), q.copy(),
                     kernel="naive")       # dK, dV then add up unwritten buffers
    assert [n for n, _, _ in launched] == [
        "flash_bwd_dot<float>", "flash_bwd_dkdv_naive<64, false>", "flash_bwd_dq_naive<64, false>"]
    launched.clear()
    with pytest.raises(ValueError, match="naive takes float32 only"):
        fc._forward(np, launch, *(x.astype(np.float16) for x in (q, k, v)), kernel="naive")
    assert launched == []


def test_the_launch_log_names_the_kernels(monkeypatch, caplog):
    """Each public call logs the family and the instantiations it launches (DEBUG,
    minitx.flash_cuda); the arrays are NumPy here, so only the naming step runs."""
    import logging
    monkeypatch.setenv("MINITX_FLASH_KERNEL", "naive")
    q, k, v = _qkv(D=48)
    with caplog.at_level(logging.DEBUG, logger="minitx.flash_cuda"):
        assert fc._resolve(q, v, None, True, "forward") == ("naive", "naive", 64)
        assert fc._resolve(q, v, "tiled", False, "backward") == ("tiled", "simt", 64)
    lines = [r.getMessage() for r in caplog.records if r.name == "minitx.flash_cuda"]
    assert lines == [
        "forward: naive (MINITX_FLASH_KERNEL=naive): flash_fwd_naive<64, true>",
        "backward: simt (kernel=tiled): flash_bwd_dot<float>, flash_bwd_dkdv_simt<64, false>, "
        "flash_bwd_dq_simt<64, false>"]
