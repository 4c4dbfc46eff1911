"""The NVRTC path itself, without a GPU: the launcher's exact source (``kernel_source()``), options
and name expressions (``flash_cuda.module_names``), compiled by libnvrtc per module (family, D,
causal; all 24 of the four base families and the nine causal ones of the fp16 levers for sm_80,
the four D = 128 causal ones for sm_90), as CuPy's RawModule does on a GPU; every name expression must lower to the mangled kernel name. The fp32 modules (tiled and
naive) are also compiled for sm_75, where ``cp_async_16`` becomes a plain copy.

Runs where libnvrtc can be found (``$CUDA_PATH``/``$CUDA_HOME``/``/usr/local/cuda`` lib64, the
``nvidia-cuda-nvrtc`` wheel, or the loader path) and skips, saying so, elsewhere."""
import ctypes
import ctypes.util
import glob
import os
import site

import pytest

from minitx.backend import flash_cuda as fc


def _find_nvrtc():
    cands = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            cands += glob.glob(os.path.join(os.environ[env], "lib64", "libnvrtc.so*"))
    cands += glob.glob("/usr/local/cuda/lib64/libnvrtc.so*")
    for sp in site.getsitepackages():
        cands += glob.glob(os.path.join(sp, "nvidia", "*", "lib", "libnvrtc.so*"))
        cands += glob.glob(os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
    cands = [c for c in cands if ".alt." not in c]
    found = ctypes.util.find_library("nvrtc")
    if found:
        cands.append(found)
    for c in cands:
        d = os.path.dirname(c)
        try:   # NVRTC dlopens its builtins library by soname: load it first, globally
            for b in glob.glob(os.path.join(d, "libnvrtc-builtins.so*")) if d else []:
                if ".alt." not in b:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


NVRTC = _find_nvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="libnvrtc not found (install CuPy or "
                                                      "nvidia-cuda-nvrtc to run the NVRTC check)")


def _compile(fam, D, causal, arch):
    lib = NVRTC
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), fc.kernel_source().encode(),
                                  b"flash_attn.cu", 0, None, None) == 0
    names = fc.module_names(fam, D, causal)
    for n in names:
        assert lib.nvrtcAddNameExpression(prog, n.encode()) == 0
    opts = [b"-std=c++17", f"--gpu-architecture={arch}".encode()]
    inc = "/usr/local/cuda/include"
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            inc = os.path.join(os.environ[env], "include")
    opts.append(f"-I{inc}".encode())
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lowered = {}
    if rc == 0:
        for n in names:
            low = ctypes.c_char_p()
            assert lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(low)) == 0
            lowered[n] = low.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(), lowered


def _check_module(fam, D, causal, arch):
    rc, log, lowered = _compile(fam, D, causal, arch)
    assert rc == 0, f"{fam} D={D} causal={causal} {arch}:\n{log}"
    assert "warning" not in log, log
    assert len(lowered) == len(fc.module_names(fam, D, causal))
    assert all(v.startswith("_Z") for v in lowered.values())


@pytest.mark.slow
def test_every_module_compiles_with_nvrtc_for_sm80():
    for fam in ("tc", "simt", "naive", "tf32"):
        for D in fc.SUPPORTED_HEAD_DIMS:
            for causal in (False, True):
                _check_module(fam, D, causal, "sm_80")
    # the levers' modules differ from tc's in one kernel each, whose causal and non-causal
    # instantiations share their source: the causal ones at every D
    for fam in fc.LEVERS:
        for D in fc.SUPPORTED_HEAD_DIMS:
            _check_module(fam, D, True, "sm_80")


def test_largest_modules_compile_with_nvrtc_for_sm90():
    """(sm_90 resources for every instantiation are the nvcc/ptxas test's job.)"""
    for fam in ("tc", "simt", "naive", "tf32"):
        _check_module(fam, 128, True, "sm_90")


@pytest.mark.parametrize("fam", ["simt", "naive"])
def test_fp32_module_compiles_below_sm80_without_cp_async(fam):
    rc, log, lowered = _compile(fam, 64, True, "sm_75")
    assert rc == 0, log
    assert set(lowered) == set(fc.module_names(fam, 64, True))
