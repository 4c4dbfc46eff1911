"""Shared test fixtures (kept small and generic: other test files build on them).

- ``rng``: a float64 NumPy generator, freshly seeded per test (reproducible failures).
- The hypothesis profiles "ci" (25 examples, no deadline; the default, so property tests stay
  fast and are not flaky on a busy machine) and "thorough" (200 examples), chosen with
  ``MINITX_HYPOTHESIS_PROFILE``.
- ``MINITX_RECORD_SKIPPED=PATH``: the run writes the node ids of the tests it skipped to PATH,
  for CI's second pass (``.ci/run``; at the end of this file).

The test helpers live in ``support.py`` (``from support import tensor, qkv, assert_close,
...``), with the rule every test follows: inputs are built as NumPy arrays on the host and
enter minitx through ``support.tensor`` / ``minitx.tensor``; results leave through
``.numpy()`` / ``to_host``; references are computed on the host (or on the device and read
back), never mixing host and device arrays; parameters get test values with ``copy_``. So the
same tests run on NumPy, on CuPy (``MINITX_BACKEND=cupy``) and on the strict CuPy stand-in
(``MINITX_TEST_BACKEND=strict-cupy``, below), which refuses every host/device mix as a GPU does.
"""
import os


def _threads_per_worker():
    """The cores each pytest-xdist worker may use: all of them divided among the workers, at
    least one; None outside xdist or with a single worker."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "PYTEST_XDIST_WORKER" not in os.environ or workers < 2:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // workers)


# The suite runs one pytest-xdist worker per core (``-n auto``, the test command). Each worker
# then gets its share of the cores (one, on a machine with as many workers as cores) for minitx's
# attention threads, NumPy's BLAS and PyTorch; the notebooks' kernels and the examples'
# subprocesses inherit it. With every worker using every core, the workers took the cores
# from each other: in the full NumPy pass (9 m 38 s, now about 5 m) notebook 03 took 207 s
# (17 s alone) and the site build 266 s (36–48 s now). The threaded paths are still tested:
# the tests of ``tests/fast/test_fast_parallel.py`` run with two threads (its ``two_threads``
# fixture).
# The variables reach the subprocesses and the libraries loaded later; NumPy may already be
# loaded here (by a plugin), so its BLAS is also limited directly, below.
_SHARE = _threads_per_worker()
if _SHARE is not None:
    for _var in ("MINITX_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_SHARE))
# OpenBLAS's idle threads sleep after about 0.4 ms instead of spinning for 0.1 s after every
# matmul (minitx/fast/host.py says why; it can only do so where it is imported before NumPy).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

if _SHARE is not None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a test dependency
        pass
    else:
        threadpool_limits(limits=int(os.environ["OPENBLAS_NUM_THREADS"]), user_api="blas")

# MINITX_TEST_BACKEND=strict-cupy: run the whole suite on the strict CuPy stand-in
# (tests/strict_cupy.py), installed as `cupy` before minitx is imported, with the cupy backend
# selected — so every host/device mix fails here the way it fails on a GPU.
STRICT_CUPY = os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy"
if STRICT_CUPY:
    import strict_cupy

    strict_cupy.install()
    os.environ["MINITX_BACKEND"] = "cupy"

try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    settings = None

if settings is not None:
    # "ci": every property test, fast; "thorough": 200 examples each, for a deliberate hunt
    # (MINITX_HYPOTHESIS_PROFILE=thorough python -m pytest
    # tests/attention/test_registry_contract.py)
    settings.register_profile("ci", max_examples=25, deadline=None)
    settings.register_profile("thorough", max_examples=200, deadline=None)
    settings.load_profile(os.environ.get("MINITX_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    """A seeded ``numpy.random.Generator`` (draws float64 by default)."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def notebook_cache(tmp_path_factory):
    """One folder per test session where executed notebooks are kept (keyed by their source and
    settings), so the notebook tests and the site build execute each notebook once."""
    return tmp_path_factory.mktemp("executed-notebooks")


def pytest_collection_finish(session):
    """With ``--dist loadgroup`` every test marked ``xdist_group`` must carry its group in its
    node id (pytest-xdist's scheduler reads it there), or the site and notebook tests scatter
    over the workers and each builds the site again. pytest 9 no longer lets pytest-xdist 3.8
    change node ids, hence the pin in the test extra; this says so loudly if it happens again."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if any(True for _ in item.iter_markers("xdist_group")) and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist's loadgroup did not group {len(lost)} tests (e.g. {lost[0]}): "
            f"pytest {pytest.__version__} with this pytest-xdist does not keep the group in "
            "the node id; install the versions the [test] extra pins")


# ---- the tests a run skipped, for CI's second pass ---------------------------------------------
# CI runs the README's test command first, in the README's set-up (the [test] extra, no oracles):
# every test that needs PyTorch, transformers, the docs extra … skips there, naming the package.
# With MINITX_RECORD_SKIPPED=PATH the run writes those tests' node ids to PATH (one a line; a
# test file skipped whole at its import is named by its path), and CI's second pass, with the
# oracles installed, runs exactly them (.ci/run). The command itself is unchanged by it.
_SKIPPED: set = set()


def _recording(config) -> bool:
    # the pytest-xdist controller (or a run without xdist) sees every report; workers don't write
    return bool(os.environ.get("MINITX_RECORD_SKIPPED")) and not hasattr(config, "workerinput")


def _selectable(nodeid: str) -> str:
    """The node id as a command-line argument: without the "@group" that ``--dist loadgroup``
    appends to a grouped test's id (``test_notebooks.py::test_run[01]@site``)."""
    head, at, group = nodeid.rpartition("@")
    return head if at and not any(c in group for c in "[]/:") else nodeid


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.add(_selectable(report.nodeid))


def pytest_collectreport(report):
    if report.skipped:
        _SKIPPED.add(_selectable(report.nodeid))


def pytest_sessionfinish(session):
    if _recording(session.config):
        with open(os.environ["MINITX_RECORD_SKIPPED"], "w", encoding="utf-8") as fh:
            fh.writelines(f"{nodeid}\n" for nodeid in sorted(_SKIPPED))
