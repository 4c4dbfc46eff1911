"""Session-wide builds for tests/gpu/cuda, compiled once and in parallel (2 workers: CI has 2 cores).

Builds: the full emulation library (ctypes), a ThreadSanitizer executable, the deliberately
broken emulation library, one whose 3xTF32 kernels lost the split's small products, a
ThreadSanitizer executable whose single-pass backward lost its dS^T barrier, and the
nvcc/ptxas compile of every instantiation for sm_80 and sm_90.
Only the builds that the collected tests need are started; they all start together (at the first
request of any of them) on a shared ThreadPoolExecutor(2), so g++ and nvcc overlap.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

import cuda_emu_harness as H
from minitx.backend import cuda_tools, flash_cuda

ARCHS = ("sm_80", "sm_90")
# fixture name -> builds it needs
_FIXTURE_BUILDS = {
    "emu_lib": ("emu",),
    "tsan_exe": ("tsan",),
    "broken_lib": ("broken",),
    "single_tf32_lib": ("single_tf32",),
    "chained_tf32_lib": ("chained_tf32",),
    "onepass_broken_tsan_exe": ("onepass_broken",),
    "ptxas_report": ("nvcc_sm_80", "nvcc_sm_90"),
}
_ORDER = ("emu", "nvcc_sm_80", "nvcc_sm_90", "tsan", "broken", "single_tf32", "chained_tf32",
          "onepass_broken")


# The files that compile the kernels or run them in the CPU emulation hand NumPy arrays to the
# launcher's drivers and never touch minitx's array backend: the suite's NumPy pass runs them,
# and its pass on the strict CuPy stand-in (MINITX_TEST_BACKEND=strict-cupy), which exists to
# catch host/device mixes in the backend, skips them rather than build and run them again.
BACKEND_FREE = ("test_cuda_emulation.py", "test_cuda_harness.py", "test_cuda_causal_alignment.py",
                "test_cuda_naive.py", "test_cuda_tf32.py", "test_cuda_compile.py",
                "test_cuda_nvrtc.py", "test_cuda_tc_levers.py")
STRICT_CUPY = os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy"


@pytest.hookimpl(trylast=True)    # after -m / -k deselection: only the builds of what will run
def pytest_collection_modifyitems(config, items):
    needed = set()
    skip = pytest.mark.skip(reason="builds or emulates the kernels on NumPy arrays, whatever the "
                                   "backend: the NumPy pass runs it")
    for item in items:
        if STRICT_CUPY and os.path.basename(str(item.fspath)) in BACKEND_FREE:
            item.add_marker(skip)
            continue
        for name in getattr(item, "fixturenames", ()):
            needed.update(_FIXTURE_BUILDS.get(name, ()))
    config._minitx_cuda_builds = needed


class _Builds:
    def __init__(self, root, needed):
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.futures = {}
        self.nvcc = cuda_tools.find_nvcc()
        self.gxx = H.GXX
        for name in _ORDER:
            if name in needed:
                self._submit(name)

    def _job(self, name):
        if name == "emu":
            return H.build_shared(os.path.join(self.root, "libminitx_emu.so"))
        if name == "tsan":
            return H.build_tsan_exe(os.path.join(self.root, "emu_tsan"))
        if name == "broken":
            src = flash_cuda.kernel_source()   # every kernel file inlined: one file to edit
            path = os.path.join(self.root, "flash_attn_broken.cu")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(H.broken_source(src))
            return H.build_shared(os.path.join(self.root, "libminitx_emu_broken.so"), small=True,
                                  kernel_file=path)
        if name == "single_tf32":
            path = os.path.join(self.root, "flash_attn_single_tf32.cu")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(H.single_tf32_source(flash_cuda.kernel_source()))
            return H.build_shared(os.path.join(self.root, "libminitx_emu_single_tf32.so"),
                                  small=True, kernel_file=path)
        if name == "chained_tf32":
            path = os.path.join(self.root, "flash_attn_chained_tf32.cu")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(H.chained_tf32_source(flash_cuda.kernel_source()))
            return H.build_shared(os.path.join(self.root, "libminitx_emu_chained_tf32.so"),
                                  kernel_file=path)
        if name == "onepass_broken":
            path = os.path.join(self.root, "flash_attn_onepass_broken.cu")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(H.onepass_broken_source(flash_cuda.kernel_source()))
            return H.build_tsan_exe(os.path.join(self.root, "emu_tsan_onepass_broken"),
                                    kernel_file=path)
        if name.startswith("nvcc_"):
            arch = name[len("nvcc_"):]
            wd = os.path.join(self.root, name)
            os.makedirs(wd, exist_ok=True)
            return cuda_tools.compile_arch(arch, nvcc=self.nvcc, workdir=wd)
        raise KeyError(name)

    def _submit(self, name):
        if name in self.futures:
            return
        if name.startswith("nvcc_") and self.nvcc is None:
            return
        if not name.startswith("nvcc_") and self.gxx is None:
            return
        self.futures[name] = self.pool.submit(self._job, name)

    def get(self, name):
        self._submit(name)
        if name not in self.futures:
            what = "nvcc" if name.startswith("nvcc_") else "g++"
            pytest.skip(f"{what} not found: cannot build {name}")
        return self.futures[name].result()


@pytest.fixture(scope="session")
def cuda_builds(tmp_path_factory, pytestconfig):
    needed = getattr(pytestconfig, "_minitx_cuda_builds", set())
    b = _Builds(str(tmp_path_factory.mktemp("minitx_cuda_build")), needed)
    yield b
    b.pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def emu_lib(cuda_builds):
    return cuda_builds.get("emu")


@pytest.fixture(scope="session")
def tsan_exe(cuda_builds):
    return cuda_builds.get("tsan")


@pytest.fixture(scope="session")
def broken_lib(cuda_builds):
    return cuda_builds.get("broken")


@pytest.fixture(scope="session")
def single_tf32_lib(cuda_builds):
    return cuda_builds.get("single_tf32")


@pytest.fixture(scope="session")
def chained_tf32_lib(cuda_builds):
    return cuda_builds.get("chained_tf32")


@pytest.fixture(scope="session")
def onepass_broken_tsan_exe(cuda_builds):
    return cuda_builds.get("onepass_broken")


@pytest.fixture(scope="session")
def ptxas_report(cuda_builds):
    if cuda_builds.nvcc is None:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH): ptxas check skipped")
    outs = [cuda_builds.get(f"nvcc_{a}") for a in ARCHS]
    return cuda_tools.report_from_outputs(ARCHS, outs)
