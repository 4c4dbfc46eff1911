"""``python -m minitx doctor``: what this machine gives minitx, in the lines a learner needs.

The default report answers a CPU user's questions in well under ten seconds, compiling
nothing: which array backend runs, whether the fast layer is on and on how many threads, which
optional packages are present and which are missing (each with the command that installs it),
and whether a GPU can be used. ``doctor --kernels`` is the CUDA kernels' report
(``backend/cuda_tools.doctor_lines``: the sources, NVRTC, nvcc and, unless ``--quick``, the
ptxas table of every instantiation for sm_80 and sm_90, which takes minutes).

The optional packages are read from minitx's own package metadata (the extras of
``setup.cfg``), so the list is never written twice.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re

import minitx

from .backend import cuda_tools, cupy_or_none, gpu_available
from .fast.parallel import thread_count

__all__ = ["extras", "install_command", "report_lines", "kernel_lines"]

# What each extra is for, in the learner's words (the extras themselves: setup.cfg)
PURPOSE = {
    "viz": "pictures and progress bars",
    "fast": "the fast layer's threads (BLAS held at one thread while heads run in parallel)",
    "docs": "the reading site and the notebooks in Jupyter",
    "gpu": "CuPy: the same code on an NVIDIA GPU",
    "test": "the test suite",
    "llm": "today's tokenizers and chat templates: a real LLM, text to text",
}


def install_command(extra: str) -> str:
    """The README's command for an extra: ``python -m pip install ".[viz]"``."""
    return f'python -m pip install ".[{extra}]"'


def extras() -> dict:
    """{extra: [distribution names]} from minitx's installed metadata; {} when minitx runs
    from a folder that was never installed (no metadata to read)."""
    try:
        requires = importlib.metadata.metadata("minitx").get_all("Requires-Dist") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out = {}
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+).*;\s*extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if m:
            out.setdefault(m.group(2), []).append(m.group(1))
    return out


def _version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _blas() -> str:
    """NumPy's BLAS, by name and version, when NumPy says (``numpy.show_config``)."""
    import numpy  # noqa: PLC0415 - only for the report
    try:
        info = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older NumPy: no dict form
        return "BLAS unknown"


def _threads() -> str:
    try:
        n = thread_count()
    except ValueError as exc:
        return f"threads: {exc}"
    blas = "BLAS threads unknown"
    if importlib.util.find_spec("threadpoolctl"):
        from threadpoolctl import threadpool_info  # noqa: PLC0415 - optional extra
        counts = [i.get("num_threads") for i in threadpool_info() if i.get("user_api") == "blas"]
        blas = f"BLAS {', '.join(map(str, counts)) or '?'} thread(s)"
    return f"{n} worker thread(s) (MINITX_THREADS sets them), {blas}"


def _gpu() -> str:
    cp = cupy_or_none()
    if cp is None:
        return (f"GPU: not usable here, CuPy is not installed ({install_command('gpu')} on a "
                "machine with an NVIDIA GPU and CUDA 12)")
    if not gpu_available():
        return "GPU: not usable here, CuPy is installed but finds no CUDA device"
    return cuda_tools._gpu_line() + "; run with --backend cupy"


def report_lines() -> list:
    """The default report (module docstring); never raises, compiles nothing."""
    import numpy  # noqa: PLC0415

    lines = [f"minitx {minitx.__version__}: Python {platform.python_version()}, NumPy "
             f"{numpy.__version__} ({_blas()}), {os.cpu_count()} CPU core(s)",
             f"backend: {minitx.get_backend()} (MINITX_BACKEND or --backend picks it)"]
    twins = minitx.configuration.twins()
    lines.append(f"fast layer: {'on' if minitx.config.fast else 'off (MINITX_FAST=0)'}, "
                 f"{len(twins)} speed tricks beside their references; {_threads()}")
    lines.append(_gpu())
    table = extras()
    if not table:
        lines.append("optional packages: unknown (minitx runs from a folder that was not "
                     "installed: python -m pip install .)")
    else:
        lines.append("optional packages (the extras):")
    for extra, dists in table.items():
        have = [d for d in dists if _version(d)]
        missing = [d for d in dists if d not in have]
        what = PURPOSE.get(extra, extra)
        if not missing:
            lines.append(f"  [{extra}] {what}: installed")
        else:
            lines.append(f"  [{extra}] {what}: missing {', '.join(missing)} "
                         f"({install_command(extra)})")
    lines.append("the test oracles (PyTorch, transformers): docs/testing.md")
    lines.append("the CUDA kernels' report (sources, nvcc, NVRTC, the ptxas table): "
                 "python -m minitx doctor --kernels")
    return lines


def kernel_lines(compile: bool = True) -> list:
    """``doctor --kernels``: the CUDA kernels' report; ``compile=False`` (``--quick``) skips
    the ptxas table."""
    return [str(line) for line in cuda_tools.doctor_lines(compile=compile)]
