"""The strict CuPy stand-in (``tests/strict_cupy.py``) refuses what CuPy refuses.

These tests use the stand-in directly (they do not need it installed as ``cupy``), so they run
in both CI passes. Each refusal is the one a real GPU run showed or the one CuPy's source
raises; each permitted transfer is the explicit one CuPy offers.
"""
import copy
import pickle

import numpy as np
import pytest

import strict_cupy

cp, cpx = strict_cupy.make_modules()


@pytest.fixture
def x():
    return cp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))


# ---- refusals ----------------------------------------------------------------------------

def test_device_array_is_not_a_numpy_array(x):
    assert not isinstance(x, np.ndarray)
    assert type(x).__module__ == "cupy" and type(x).__name__ == "ndarray"


@pytest.mark.parametrize("convert", [np.asarray, np.array,
                                     lambda a: np.testing.assert_allclose(a, 0)],
                         ids=["asarray", "array", "assert_allclose"])
def test_implicit_conversion_to_numpy_is_refused(x, convert):
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        convert(x)


@pytest.mark.parametrize("mix", [
    lambda d, h: d + h, lambda d, h: h + d, lambda d, h: d * h, lambda d, h: h - d,
    lambda d, h: d @ h.T, lambda d, h: cp.where(h > 0, d, 0), lambda d, h: cp.maximum(d, h),
    lambda d, h: np.add(h, d), lambda d, h: cp.exp(h), lambda d, h: d < h,
], ids=["add", "radd", "mul", "rsub", "matmul", "where-host-mask", "maximum", "np.add-mixed",
        "exp-of-host", "less"])
def test_host_array_operand_is_unsupported(x, mix):
    host = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        mix(x, host)


def test_zero_d_host_array_is_still_an_array_not_a_scalar(x):
    with pytest.raises(TypeError, match="Unsupported type"):
        x * np.asarray(2.0, dtype=np.float32)


def test_python_list_operand_is_unsupported(x):
    with pytest.raises(TypeError, match="Unsupported type <class 'list'>"):
        cp.add(x, [1.0, 2.0, 3.0])


def test_host_arrays_cannot_be_concatenated_or_made_contiguous(x):
    with pytest.raises(TypeError, match="Only cupy arrays can be concatenated"):
        cp.concatenate([x, np.ones((1, 3), dtype=np.float32)])
    with pytest.raises(TypeError, match="incorrect type"):
        cp.ascontiguousarray(np.ones(3))


def test_basic_slice_assignment_from_host_is_refused_but_advanced_index_converts(x):
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[...] = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[0] = [1.0, 2.0, 3.0]
    x[np.array([1])] = np.full((1, 3), 7.0, dtype=np.float32)       # converted, as in CuPy
    x[0] = 5.0                                                      # a scalar fills
    np.testing.assert_array_equal(x.get(), [[5, 5, 5], [7, 7, 7]])


def test_zero_d_arrays_cannot_be_iterated_or_measured_or_used_as_index(x):
    s = x.sum()
    assert isinstance(s, cp.ndarray) and s.shape == ()               # not a NumPy scalar
    with pytest.raises(TypeError, match="iteration over a 0-d array"):
        iter(s)
    with pytest.raises(TypeError, match="len\\(\\) of unsized object"):
        len(s)
    with pytest.raises(TypeError):
        range(s)
    assert isinstance(x[0, 0], cp.ndarray)                           # an element is 0-d too


def test_data_is_a_memory_pointer_not_an_array(x):
    assert not isinstance(x.data, (np.ndarray, cp.ndarray))
    assert isinstance(x.data.ptr, int)


def test_ufunc_at_needs_a_device_target(x):
    with pytest.raises(AttributeError, match="_scatter_op"):
        cpx.scatter_add(np.zeros(3), np.array([0, 0]), cp.asarray([1.0, 2.0]))
    with pytest.raises(AttributeError, match="_scatter_op"):
        np.add.at(np.zeros(3), cp.asarray([0, 0]), cp.asarray([1.0, 2.0]))
    with pytest.raises(TypeError, match="NotImplemented"):          # a tuple index: NotImplemented
        np.add.at(np.zeros(3), (np.array([0]),), cp.asarray([1.0]))


def test_bool_of_a_multi_element_array_is_ambiguous(x):
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x)


def test_cuda_kernels_cannot_compile_here():
    with pytest.raises(RuntimeError, match="NVRTC is not available"):
        cp.cuda.nvrtc.getVersion()
    with pytest.raises(RuntimeError, match="NVRTC"):
        cp.RawModule(code="")


# ---- what works ----------------------------------------------------------------------------

def test_explicit_transfers_work(x):
    h = x.get()
    assert isinstance(h, np.ndarray) and h.dtype == np.float32
    np.testing.assert_array_equal(cp.asnumpy(x), h)
    y = cp.asarray(h)
    assert isinstance(y, cp.ndarray) and cp.asarray(y) is y
    np.testing.assert_array_equal(cp.asnumpy(np.arange(2)), [0, 1])  # asnumpy of host: identity


def test_numpy_functions_on_device_arrays_dispatch_to_the_device(x):
    e = np.exp(x)                                  # NEP 13, as CuPy's __array_ufunc__
    assert isinstance(e, cp.ndarray)
    np.testing.assert_allclose(e.get(), np.exp(x.get()))
    w = np.where(x > 2, x, 0)                      # NEP 18, as CuPy's __array_function__
    assert isinstance(w, cp.ndarray)
    np.testing.assert_array_equal(w.get(), [[0, 0, 0], [3, 4, 5]])
    assert isinstance(np.concatenate([x, x]), cp.ndarray)


def test_scalars_pass_and_results_stay_on_the_device(x):
    for y in (x + 1, 2.0 * x, x / np.float32(2), -x, abs(x), x ** 2, x[:, 1:], x.T,
              x.reshape(3, 2), x.astype(np.float64), x.max(axis=0), cp.zeros_like(np.ones(2))):
        assert isinstance(y, cp.ndarray)
    assert float(x.sum()) == 15.0 and int(x[1, 2]) == 5 and x[1, 2].item() == 5.0
    x += 1
    x *= cp.asarray(np.float32(2))
    np.testing.assert_array_equal(x.get(), 2 * (np.arange(6).reshape(2, 3) + 1))


def test_get_array_module_random_device_and_availability(x):
    assert cp.get_array_module(x) is cp and cp.get_array_module(np.ones(2)) is np
    assert cp.is_available()
    a = cp.random.default_rng(0).standard_normal((2, 2), dtype=np.float32)
    assert isinstance(a, cp.ndarray) and a.dtype == np.float32
    assert isinstance(cp.random.standard_normal(3), cp.ndarray)
    dev = cp.cuda.Device()
    dev.synchronize()
    assert dev.id == 0 and dev.attributes["MaxSharedMemoryPerBlockOptin"] > 48 * 1024


def test_host_index_arrays_and_scatter_add_on_the_device(x):
    np.testing.assert_array_equal(x[np.array([1, 0])].get(), x.get()[[1, 0]])
    t = cp.zeros(4)
    cpx.scatter_add(t, cp.asarray([0, 0, 3]), cp.asarray([1.0, 2.0, 5.0]))
    np.add.at(t, cp.asarray([1]), cp.asarray([4.0]))     # dispatches to cupy.add.at
    np.testing.assert_array_equal(t.get(), [3.0, 4.0, 0.0, 5.0])


def test_an_index_array_out_of_range_wraps_as_on_cupy(x):
    """CuPy wraps an integer array index out of range where NumPy raises (CuPy's "Differences
    between CuPy and NumPy"): so does the stand-in, so a check that relies on NumPy's error
    fails here as it would on a GPU. A plain integer out of range still raises."""
    np.testing.assert_array_equal(x[np.array([2, -3])].get(), x.get()[[0, 1]])
    np.testing.assert_array_equal(x[:, cp.asarray([3, 4])].get(), x.get()[:, [0, 1]])
    np.testing.assert_array_equal(
        cp.take_along_axis(x, cp.asarray([[5], [-4]]), axis=1).get(), [[2.0], [5.0]])
    y = x.copy()
    y[cp.asarray([2])] = 7.0                         # row 2 of 2 rows: row 0
    np.testing.assert_array_equal(y.get()[0], [7, 7, 7])
    with pytest.raises(IndexError):
        x[5]


def test_copies_and_pickles_stay_device_arrays(x):
    for y in (copy.copy(x), copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert isinstance(y, cp.ndarray)
        np.testing.assert_array_equal(y.get(), x.get())


def test_a_tensor_operand_gets_its_reflected_operator(x):
    import minitx
    t = minitx.tensor(np.ones(3, dtype=np.float32))       # outranks: __array_priority__ 1000
    assert x.__add__(t) is NotImplemented and x.__mul__(t) is NotImplemented
    with pytest.raises(TypeError, match="Unsupported type"):
        x.__add__(np.ones((2, 3)))
