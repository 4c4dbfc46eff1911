"""Shared test fixtures (kept small and generic: other test files build on them).

- ``rng``: a float64 NumPy generator, freshly seeded per test (reproducible failures).
- The hypothesis profiles "ci" (25 examples, no deadline; the default, so property tests stay
  fast and are not flaky on a busy machine) and "thorough" (200 examples), chosen with
  ``MINITX_HYPOTHESIS_PROFILE``.

The test helpers live in ``support.py`` (``from support import tensor, qkv, assert_close,
...``), with the rule every test follows: inputs are built as NumPy arrays on the host and
enter minitx through ``support.tensor`` / ``minitx.tensor``; results leave through
``.numpy()`` / ``to_host``; references are computed on the host (or on the device and read
back), never mixing host and device arrays; parameters get test values with ``copy_``. So the
same tests run on NumPy, on CuPy (``MINITX_BACKEND=cupy``) and on the strict CuPy stand-in
(``MINITX_TEST_BACKEND=strict-cupy``, below), which refuses every host/device mix as a GPU does.
"""
import os

import numpy as np
import pytest

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
    # (MINITX_HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_registry_contract.py)
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
