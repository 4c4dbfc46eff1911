"""Shared test fixtures (kept small and generic: other test files build on them).

- ``rng``: a float64 NumPy generator, freshly seeded per test (reproducible failures).
- The hypothesis profile "ci" (25 examples, no deadline) is registered and loaded, so
  property tests stay fast and are not flaky on a busy machine.

Tests create tensors with ``minitx.tensor(numpy_array)`` and read results with
``.numpy()``; both go through the active backend, so the same tests exercise CuPy arrays
when run with ``MINITX_BACKEND=cupy``.
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
    settings.register_profile("ci", max_examples=25, deadline=None)
    settings.load_profile("ci")


@pytest.fixture
def rng():
    """A seeded ``numpy.random.Generator`` (draws float64 by default)."""
    return np.random.default_rng(1234)
