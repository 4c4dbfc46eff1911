"""nvcc/ptxas check of every kernel instantiation: compiles for sm_80 and sm_90 with
-Xptxas -v,-warn-spills,-warn-lmem-usage,-Werror and asserts no spills and no local memory.
Skips (with the reason) when nvcc is not installed."""
import pytest

from minitx.backend import cuda_tools, flash_cuda


@pytest.mark.slow
def test_every_instantiation_compiles_without_spills(ptxas_report):
    names = flash_cuda.all_kernel_names()
    assert len(names) == 92                       # 38 tiled + 18 naive + 18 tf32 + 18 levers
    assert len(ptxas_report) == 2 * len(names)
    print("\n" + "\n".join(cuda_tools.format_report(ptxas_report)))
    bad = [r for r in ptxas_report if not r["ok"]]
    assert not bad, "\n".join(f"{r['kernel']} {r['arch']}: {r}" for r in bad)
    for r in ptxas_report:
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
        assert r["stack"] == 0, r
        # __launch_bounds__(128, N) is kept: N blocks of this register use fit in an SM
        # (N = 2 tensor-core kernels, 3xTF32 ones and the fp16 levers included, 3 CUDA-core and
        # naive kernels, 4 the Dvec pre-pass)
        occ = cuda_tools.occupancy(r["registers"], r["smem_dynamic"], r["arch"])
        assert 0 < r["registers"] and occ["by_regs"] >= cuda_tools.min_blocks(r["kernel"]), (r, occ)


def test_occupancy_arithmetic():
    # 96 regs: 3072 per warp, 12,288 per 4-warp block -> 5 blocks; 29 KB smem -> 5 on an A100
    occ = cuda_tools.occupancy(96, 29056, "sm_80")
    assert (occ["by_regs"], occ["by_smem"], occ["blocks"], occ["warps"]) == (5, 5, 5, 20)
    # 168 regs (a multiple of 8: 5376 per warp) -> 3 blocks; 176 -> 2
    assert cuda_tools.occupancy(168, 0, "sm_90")["by_regs"] == 3
    assert cuda_tools.occupancy(176, 0, "sm_90")["by_regs"] == 2
    # 70 KB smem: 2 blocks on an A100 (164 KB), 3 on an H100 (228 KB)
    assert cuda_tools.occupancy(128, 70 * 1024, "sm_80")["blocks"] == 2
    assert cuda_tools.occupancy(128, 70 * 1024, "sm_90")["blocks"] == 3
    assert cuda_tools.occupancy(128, 70 * 1024, "sm_80")["limiter"] == "shared memory"


@pytest.mark.slow    # it reads the ptxas report, whose compile the slow lane makes anyway
def test_dynamic_shared_memory_fits_the_devices(ptxas_report):
    for r in ptxas_report:
        assert r["smem_static"] == 0, r       # everything is dynamic (poisonable in emulation)
        limit = 163 * 1024 if r["arch"] == "sm_80" else 227 * 1024
        flash_cuda.check_shared_memory(r["smem_dynamic"], limit, r["kernel"])


def test_demangler_and_parser():
    assert (cuda_tools.demangle("_Z12flash_fwd_tcILi64ELb1EEvPK6__halfS2_S2_PS0_PfPKiPKhiiiif")
            == "flash_fwd_tc<64, true>")
    assert (cuda_tools.demangle("_Z19flash_bwd_dkdv_simtILi128ELb0EEvPKfS1_S1_S1_S1_S1_PfS2_PKiPKhiiiif")
            == "flash_bwd_dkdv_simt<128, false>")
    assert cuda_tools.demangle("_Z13flash_bwd_dotIfEvPKT_") == "flash_bwd_dot<float>"
    assert (cuda_tools.demangle("_Z15flash_fwd_naiveILi128ELb1EEvPKfS1_S1_PfS2_PKiPKhiiiif")
            == "flash_fwd_naive<128, true>")
    assert cuda_tools.min_blocks("flash_bwd_dkdv_naive<128, true>") == 3
    assert cuda_tools.min_blocks("flash_bwd_dkdv_tf32<32, true>") == 2
    assert cuda_tools.demangle("_Z13flash_bwd_dotI6__halfEvPKT_S3_Pfii") == "flash_bwd_dot<__half>"
    out = """ptxas info    : Compiling entry function '_Z14flash_fwd_simtILi32ELb0EEvPKfS1_S1_PfS2_PKiPKhiiiif' for 'sm_80'
ptxas info    : Function properties for _Z14flash_fwd_simtILi32ELb0EEvPKfS1_S1_PfS2_PKiPKhiiiif
    8 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 8 bytes cumulative stack size, 428 bytes cmem[0]
ptxas error   : Registers are spilled to local memory in function '_Z14flash_fwd_simtILi32ELb0EEvPKfS1_S1_PfS2_PKiPKhiiiif'
"""
    p = cuda_tools.parse_ptxas(out)["flash_fwd_simt<32, false>"]
    assert (p["registers"], p["stack"], p["spill_stores"], p["spill_loads"]) == (64, 8, 8, 16)
    assert p["errors"]
    rows = cuda_tools.report_from_outputs(("sm_80",), [(1, out)], ["flash_fwd_simt<32, false>"])
    assert rows[0]["ok"] is False and rows[0]["registers"] == 64


def test_doctor_lines_never_raise():
    lines = cuda_tools.doctor_lines()
    assert any("flash kernel source" in ln for ln in lines)
    assert isinstance(cuda_tools.nvrtc_available(), bool)


def test_doctor_lines_report_the_kernel_choice(monkeypatch):
    monkeypatch.setenv("MINITX_FLASH_KERNEL", "naive")
    assert "flash kernel choice: MINITX_FLASH_KERNEL=naive" in cuda_tools.doctor_lines()
    monkeypatch.setenv("MINITX_FLASH_KERNEL", "fast")     # reported, not raised
    line = [ln for ln in cuda_tools.doctor_lines() if ln.startswith("flash kernel choice")]
    assert line == ["flash kernel choice: invalid (ValueError: MINITX_FLASH_KERNEL must be one "
                    "of ('tiled', 'naive', 'tf32', 'tc_bm128', 'tc_kvreg', 'tc_onepass'), got 'fast')"]


def test_doctor_lines_default_is_fast_and_does_not_compile(monkeypatch):
    import time

    def boom(*a, **k):
        raise AssertionError("doctor_lines() must not compile by default")

    monkeypatch.setattr(cuda_tools, "compile_arch", boom)
    monkeypatch.setattr(cuda_tools, "compile_report", boom)
    t = time.perf_counter()
    lines = cuda_tools.doctor_lines()
    assert time.perf_counter() - t < 10.0
    text = "\n".join(lines)
    for needle in ("numpy", "cupy", "GPU", "nvcc", "NVRTC", "flash instantiations: 92",
                   "dynamic shared memory"):
        assert needle in text, needle


def test_doctor_lines_compile_gives_the_per_instantiation_table(monkeypatch):
    names = flash_cuda.all_kernel_names()
    seen = {}

    def fake_report(archs, jobs, nvcc):
        seen["archs"] = archs
        return [dict(kernel=n, arch=a, registers=96, smem_static=0, smem_dynamic=1024,
                     spill_stores=0, spill_loads=0, stack=0, ok=True, error=None)
                for a in archs for n in names]

    monkeypatch.setattr(cuda_tools, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(cuda_tools, "nvcc_version", lambda nvcc=None: "13.0")
    monkeypatch.setattr(cuda_tools, "compile_report", fake_report)
    lines = cuda_tools.doctor_lines(compile=True)
    assert seen["archs"] == ("sm_80", "sm_90")
    assert any("184/184 ok" in ln for ln in lines)
    for arch in ("sm_80", "sm_90"):
        for n in names:
            assert sum(ln.startswith(n + " ") and f" {arch} " in ln for ln in lines) == 1, (n, arch)
    monkeypatch.setattr(cuda_tools, "find_nvcc", lambda: None)
    assert any("skipped (nvcc not found)" in ln for ln in cuda_tools.doctor_lines(compile=True))
