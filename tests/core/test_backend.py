"""The array-module switch: numpy/cupy selection, the env variable, device moves, and a
source scan that keeps compute code backend-agnostic (no direct NumPy in ops/attention/nn)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx import backend
from support import REPO, need

ROOT = REPO


@pytest.fixture
def restore_backend():
    name = minitx.get_backend()
    yield
    minitx.set_backend(name)


def test_set_and_get_numpy_backend(restore_backend):
    minitx.set_backend("numpy")
    assert minitx.get_backend() == "numpy"
    assert backend.xp() is np
    t = minitx.tensor([1.0, 2.0])
    assert isinstance(t.data, np.ndarray) and t.device == "cpu"


def test_get_array_module(rng):
    a = rng.standard_normal(3)
    assert minitx.get_array_module(a) is np
    assert minitx.get_array_module(a, 2.0, None) is np
    assert minitx.get_array_module(minitx.tensor(a)) is backend.xp()


def test_unknown_backend_raises_value_error(restore_backend):
    before = minitx.get_backend()
    with pytest.raises(ValueError):
        minitx.set_backend("tensorflow")
    assert minitx.get_backend() == before


def test_cupy_unavailable_raises_and_leaves_backend_unchanged(restore_backend):
    if minitx.gpu_available():
        pytest.skip("CuPy and a GPU are available here: set_backend('cupy') would succeed")
    minitx.set_backend("numpy")
    with pytest.raises(RuntimeError, match=r"CuPy is not installed|no CUDA GPU"):
        minitx.set_backend("cupy")
    assert minitx.get_backend() == "numpy" and backend.xp() is np
    with pytest.raises(RuntimeError):
        minitx.tensor([1.0]).to("cuda")


def _run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=120)


def test_env_variable_selects_backend():
    out = _run_python("import minitx; print(minitx.get_backend())", MINITX_BACKEND="numpy")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "numpy"
    out = _run_python("import minitx; print(minitx.get_backend())", MINITX_BACKEND=" NumPy ")
    assert out.stdout.strip() == "numpy"


def test_env_variable_cupy_without_gpu_fails_clearly():
    if minitx.gpu_available():
        pytest.skip("a GPU is available")
    out = _run_python("import minitx", MINITX_BACKEND="cupy")
    assert out.returncode != 0
    assert "CuPy is not installed" in out.stderr or "no CUDA GPU" in out.stderr


def test_to_cpu_and_device_helpers(rng):
    a = rng.standard_normal((2, 3))
    t = minitx.tensor(a, requires_grad=True)
    c = t.to("cpu")
    assert c.device == "cpu"
    np.testing.assert_array_equal(c.numpy(), a)
    assert backend.device_of(a) == "cpu"
    assert isinstance(backend.to_device(a, "cpu"), np.ndarray)
    with pytest.raises(ValueError):
        backend.to_device(a, "tpu")


def test_scatter_add_accumulates_repeats():
    target = backend.xp().zeros(4)
    backend.scatter_add(target, backend.xp().asarray([0, 0, 3]), backend.xp().asarray([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(backend.to_device(target, "cpu"), [3.0, 0, 0, 5.0])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_scatter_add_refuses_an_index_out_of_range_and_changes_nothing(fast):
    """In both forms (the fast twin's own tests are in tests/fast/test_scatter.py)."""
    for index in ([0, 3], [0, -4]):
        target = np.zeros((3, 2))
        with minitx.using_config(fast=fast), pytest.raises(IndexError):
            backend.scatter_add(target, np.array(index), np.ones((2, 2)))
        assert not target.any()


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), width=st.integers(1, 4), n=st.integers(1, 40),
       kind=st.sampled_from(["rows", "inner rows", "elements", "mask"]),
       seed=st.integers(0, 2 ** 16))
def test_add_at_in_order_sums_what_numpy_add_at_sums(rows, width, n, kind, seed):
    """The device's scatter-add (a sort and rounds, no atomics) against ``numpy.add.at`` on the
    host: the same additions in the same order, so the same bits."""
    r = np.random.default_rng(seed)
    xp = backend.xp()
    target = r.standard_normal((2, rows, width))
    if kind == "rows":              # an embedding's backward: rows, negative indices too
        target = target[0]
        index = r.integers(-rows, rows, n)
    elif kind == "inner rows":      # a sparse pattern's backward: rows of an inner axis
        index = (slice(None), r.integers(0, rows, (n, 2)))
    elif kind == "elements":        # TakeAlongAxis's backward: a full fancy index
        index = (np.arange(2)[:, None, None], np.arange(rows)[:, None], r.integers(0, width, n))
    else:                           # a boolean mask: element by element
        index = r.random(target.shape) < 0.5
    values = r.standard_normal(target[index].shape)
    want = target.copy()
    np.add.at(want, index, values)
    on_device = (lambda i: xp.asarray(i) if isinstance(i, np.ndarray) else i)   # noqa: E731
    device_index = tuple(map(on_device, index)) if isinstance(index, tuple) else on_device(index)
    got = xp.asarray(target)
    backend.add_at_in_order(got, device_index, xp.asarray(values))
    np.testing.assert_array_equal(backend.to_device(got, "cpu"), want)


def test_add_at_in_order_adds_repeats_and_negative_indices():
    xp = backend.xp()
    target = xp.zeros((4, 2))
    backend.add_at_in_order(target, xp.asarray([3, 0, -1, 3, 1, 3]),
                            xp.asarray([[1.0, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]))
    np.testing.assert_array_equal(backend.to_device(target, "cpu"),
                                  [[3, 4], [9, 10], [0, 0], [24, 28]])


def test_add_at_in_order_refuses_an_index_out_of_range_and_changes_nothing():
    xp = backend.xp()
    for index in ([0, 3], [0, -4]):
        target = xp.zeros((3, 2))
        with pytest.raises(IndexError, match="out of bounds for axis 0 with size 3"):
            backend.add_at_in_order(target, xp.asarray(index), xp.ones((2, 2)))
        assert not bool(target.any())


# ---- GPU (skipped without CuPy and a device) ----------------------------------------------

def _need_gpu():
    need("cupy")
    if not minitx.gpu_available():
        pytest.skip("CuPy imports but no CUDA GPU is available")


def test_cupy_backend_round_trip(restore_backend, rng):
    _need_gpu()
    import cupy
    minitx.set_backend("cupy")
    assert backend.xp() is cupy
    a = rng.standard_normal((3, 4))
    x = minitx.tensor(a, requires_grad=True)
    assert isinstance(x.data, cupy.ndarray) and x.device == "cuda"
    import minitx.functional as F
    F.softmax(x * 2.0, -1).sum().backward()
    assert isinstance(x.grad.data, cupy.ndarray)
    c = x.to("cpu")
    assert isinstance(c.data, np.ndarray)
    np.testing.assert_array_equal(c.numpy(), a)


def test_cpu_to_cuda_is_differentiable(restore_backend, rng):
    _need_gpu()
    minitx.set_backend("numpy")
    x = minitx.tensor(rng.standard_normal(3), requires_grad=True)
    y = (x.to("cuda") * 3.0).sum()
    y.backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 3.0)


# ---- compute code must not use NumPy directly -------------------------------------------

SCANNED = ("minitx/ops", "minitx/attention", "minitx/nn")
ALLOWED = ("minitx/backend",)          # the one place that knows which module is which
DIRECT_NUMPY = re.compile(r"^\s*import numpy\b|^\s*from numpy\b|(?<![\w.])np\.", re.M)


def _code_lines(text):
    """Source lines without comments and docstring-only lines (best effort)."""
    out, in_doc = [], False
    for line in text.splitlines():
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_doc:
            if quotes % 2:
                in_doc = False
            continue
        if stripped.startswith(('"""', "'''")):
            if quotes % 2:
                in_doc = True
            continue
        out.append(line.split("#", 1)[0])
    return "\n".join(out)


def test_no_direct_numpy_in_compute_paths():
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            code = _code_lines(path.read_text(encoding="utf-8"))
            for m in DIRECT_NUMPY.finditer(code):
                line = code[:m.start()].count("\n") + 1
                offenders.append(f"{rel}: {code.splitlines()[line - 1].strip()}")
    assert not offenders, ("direct NumPy use in compute code (use get_array_module / "
                           "minitx.backend instead):\n" + "\n".join(offenders))


def test_scanner_catches_violations():
    bad = "import numpy as np\nx = np.zeros(3)\n"
    assert len(DIRECT_NUMPY.findall(_code_lines(bad))) == 2
    good = 'xp = get_array_module(a)\ny = xp.exp(a)  # np.exp would be wrong\n"""np.x in docs"""\n'
    assert not DIRECT_NUMPY.findall(_code_lines(good))
