"""A strict CuPy stand-in: plays ``cupy`` on the CPU and refuses what CuPy refuses.

Why: NumPy forgives what CuPy refuses. A NumPy mask added to a CuPy array, ``np.asarray`` on a
device array, iterating a 0-d array — all fine on the CPU, all ``TypeError`` on a GPU. On an
H100, 669 tests failed for exactly these reasons while the CPU suite was green. With
``MINITX_TEST_BACKEND=strict-cupy`` the test suite's ``conftest.py`` installs this module as
``cupy`` / ``cupyx`` before minitx is imported and selects the ``cupy`` backend, so every
host/device mix fails here, without a GPU, the way it fails on one.

Test code only: minitx itself never imports this module.

What it reproduces, each behaviour read from CuPy's source (github.com/cupy/cupy at commit
6b6d956, CuPy 14) rather than from memory:

- ``ndarray`` is *not* a ``numpy.ndarray``. ``__array__`` raises "Implicit conversion to a NumPy
  array is not allowed. Please use `.get()` to construct a NumPy array explicitly."
  (``cupy/_core/core.pyx``, ``_ndarray_base.__array__``), so ``np.asarray(x)``, ``np.array(x)``,
  ``np.savez(f, x=x)`` and ``np.testing.assert_allclose(x, …)`` fail.
- ``.data`` is a device *memory pointer*, not an array (``MemoryPointer``): code that unwraps
  "anything with a ``.data``" mistakes a device array for something else.
- A NumPy *array* operand (even 0-d) of an elementwise function or operator raises
  "Unsupported type <class 'numpy.ndarray'>" (``_kernel.pyx`` ``_preprocess_arg`` →
  ``_scalar.pyx`` ``CScalar``); NumPy *scalars* and Python numbers pass. Typed routines
  (``matmul``, ``ascontiguousarray``, ``concatenate``, …) refuse host arrays with their own
  ``TypeError``s; here every compute function refuses them with the "Unsupported type" text.
- NumPy ufuncs and functions called *on* device arrays dispatch to CuPy (NEP 13/18:
  ``__array_ufunc__`` for the ``__call__`` method only — ``np.add.at`` returns NotImplemented
  and NumPy raises — and ``__array_function__`` for functions CuPy has): ``np.exp(x)`` returns
  a device array, exactly as in CuPy. The mixed call ``np.add(host, x)`` still fails.
- Binary operators follow ``core.pyx``'s ``_should_use_rop``: an operand with a higher
  ``__array_priority__`` and no ``__array_ufunc__`` (a minitx Tensor) gets its reflected
  operator; comparisons with 0-d host arrays use ``.item()`` (``__richcmp__``).
- ``x[idx]`` accepts host index arrays (``_prepare_slice_list`` converts them); results are
  always device arrays, 0-d for a single element (never NumPy scalars), and reductions return
  0-d device arrays too. ``x[basic] = host_array`` raises "non-scalar numpy.ndarray cannot be
  used for fill" (``_scatter_op`` refuses CPU arrays, gh-2079, through ``fill``); with an
  advanced (array) index the host values are converted.
- A Python int operand outside [-2^63, 2^64) raises ``OverflowError`` ("Python int too large
  to convert to C long", ``_scalar.pyx`` ``CScalar``: packed as int64, or uint64 from 2^63
  on), even next to a float array that NumPy would cast it to.
- ``iter`` / ``len`` of a 0-d array raise "iteration over a 0-d array" / "len() of unsized
  object"; there is no ``__index__`` (``range(x)`` fails); ``bool``/``int``/``float`` of a
  one-element array read it back (``.get()``).
- ``cupyx.scatter_add(target, …)`` needs a device ``target`` (a host one has no ``_scatter_op``).
- Every wait for the device is counted (``SYNCS``, ``counting_syncs()``): a copy to the host,
  a Python value read from an array, a boolean mask's selection, ``nonzero``/``unique``.
- An integer *array* index out of range wraps around (``x[idx]``, ``x[idx] = v``,
  ``take_along_axis``) where NumPy raises IndexError ("Differences between CuPy and NumPy");
  a plain integer out of range still raises.
- What works: ``.get()``, ``cupy.asnumpy``, ``cupy.asarray`` / ``cupy.array`` (host → device),
  ``*_like`` of a host prototype, ``get_array_module``, ``cupy.random``, ``cupy.linalg``,
  ``cupy.fft``, ``cuda.Device``, ``cuda.runtime``, ``is_available()`` (True).
- What is absent: NVRTC (``cuda.nvrtc.getVersion`` raises, ``RawModule`` raises), so minitx's
  CUDA kernels report themselves unavailable and the dispatch decision says so.

Where this stand-in is stricter than CuPy (a few CuPy routines silently ``asarray`` a host
argument), code that passes here also passes on CuPy; where it is laxer (it computes with
NumPy, so e.g. float16 matmul precision differs), the real GPU run is the final word.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import sys
import types
import warnings

import numpy as _np

# Every place where CuPy makes the host wait for the device (a copy to the host, a Python value
# read from an array, an output whose size depends on the data), counted by kind: a GPU pays
# a round trip for each, so a loop that asks the device a question per step is slow there.
SYNCS = collections.Counter()
_SYNCING = {"nonzero": "nonzero", "flatnonzero": "nonzero", "argwhere": "nonzero",
            "unique": "unique"}


def _sync(kind):
    SYNCS[kind] += 1


@contextlib.contextmanager
def counting_syncs():
    """``with counting_syncs() as n:`` … ``n`` is a Counter of the waits inside the block."""
    before = SYNCS.copy()
    seen = collections.Counter()
    try:
        yield seen
    finally:
        seen.update(SYNCS - before)

__all__ = ["make_modules", "install", "ndarray", "IMPLICIT", "unsupported"]

__version__ = "14.2.0+strict-standin"

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")


def unsupported(obj) -> TypeError:
    """CuPy's error for a kernel argument it cannot take (``_scalar.CScalar``)."""
    return TypeError(f"Unsupported type {type(obj)}")


# ---- converting arguments and results --------------------------------------------------------

_SCALARS = (bool, int, float, complex, _np.generic)


def _dev(x):
    """A device argument → its NumPy payload; refuses host arrays anywhere in lists/tuples/dicts."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _np.ndarray):
        raise unsupported(x)
    if isinstance(x, list):
        return [_dev(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_dev(v) for v in x)
    return x


def _host_ok(x):
    """A host-or-device argument (creation functions, indices) → NumPy payload."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, list):
        return [_host_ok(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_host_ok(v) for v in x)
    return x


def _wrap(r):
    """NumPy results → device arrays; NumPy scalars become 0-d device arrays (as in CuPy)."""
    if isinstance(r, _np.ndarray):
        return ndarray(r)
    if isinstance(r, _np.generic):
        return ndarray(_np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def _strict(fn, name=None):
    """``fn`` on device arrays only: host arrays refused, results wrapped."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        args = _dev(args)
        kwargs = {k: _dev(v) for k, v in kwargs.items()}
        return _wrap(fn(*args, **kwargs))
    call.__module__ = "cupy"
    return call


class _Ufunc:
    """A ufunc on device arrays and scalars only (``_kernel.pyx`` ``_preprocess_args``: anything
    else, a list or a host array included, is "Unsupported type"), with CuPy's methods:
    ``at`` (a scatter on a *device* target: ``a._scatter_op``), ``reduce``/``accumulate``
    (add and multiply only), ``outer``."""

    def __init__(self, ufunc):
        self._u = ufunc
        self.__name__ = ufunc.__name__

    @staticmethod
    def _check(args):
        for x in args:
            if x is not None and not isinstance(x, (ndarray,) + _SCALARS):
                raise unsupported(x)
            if type(x) is int and not -2 ** 63 <= x < 2 ** 64:
                # _scalar.pyx: a Python int is packed as int64 (uint64 from 2^63 on) before
                # the kernel's dtype is known, whatever the other operand's dtype
                raise OverflowError("Python int too large to convert to C long")

    def __call__(self, *args, **kwargs):
        self._check(args + tuple(v for k, v in kwargs.items() if k in ("out", "where")))
        return _wrap(self._u(*_dev(args), **{k: _dev(v) for k, v in kwargs.items()}))

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise AttributeError(f"'{type(a).__module__}.{type(a).__name__}' object has no "
                                 "attribute '_scatter_op'")
        if isinstance(b, _np.ndarray) and not _is_advanced(indices):
            raise unsupported(b)
        self._u.at(a._a, _index(indices), b._a if isinstance(b, ndarray) else b)

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        if self.__name__ not in ("add", "multiply"):
            raise NotImplementedError(f"`cupy_{self.__name__}.reduce` is not supported yet")
        self._check((array, out))
        return _wrap(self._u.reduce(_dev(array), axis=axis, dtype=dtype, out=_dev(out),
                                    keepdims=keepdims))

    def accumulate(self, array, axis=0, dtype=None, out=None):
        if self.__name__ not in ("add", "multiply"):
            raise NotImplementedError(f"`cupy_{self.__name__}.accumulate` is not supported yet")
        self._check((array, out))
        return _wrap(self._u.accumulate(_dev(array), axis=axis, dtype=dtype, out=_dev(out)))

    def outer(self, a, b, **kwargs):
        self._check((a, b))
        return _wrap(self._u.outer(_dev(a), _dev(b), **kwargs))


def _lenient(fn):
    """``fn`` that may take host data (``asarray``, ``*_like``): results are device arrays."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        args = _host_ok(args)
        kwargs = {k: _host_ok(v) for k, v in kwargs.items()}
        return _wrap(fn(*args, **kwargs))
    call.__module__ = "cupy"
    return call


# ---- the array -------------------------------------------------------------------------------

def _from_host(a):
    """Unpickling: a host copy back onto the device (CuPy pickles through ``array(get())``)."""
    return ndarray(_np.asarray(a))


class MemoryPointer:
    """What ``cupy.ndarray.data`` is: a pointer to device memory, not an array."""

    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr: int):
        self.ptr, self.device_id = ptr, 0

    def __repr__(self):
        return f"<MemoryPointer 0x{self.ptr:x} device=0>"


def _has_mask(index) -> bool:
    """Does ``index`` hold a boolean array (whose number of True entries sizes the result)?"""
    items = index if isinstance(index, tuple) else (index,)
    return any(getattr(s, "dtype", None) == bool and getattr(s, "ndim", 0) for s in items)


def _is_advanced(index) -> bool:
    """Does ``index`` contain an array/list (advanced indexing) rather than ints and slices?"""
    items = index if isinstance(index, tuple) else (index,)
    for s in items:
        if s is None or s is Ellipsis or isinstance(s, slice):
            continue
        if isinstance(s, (list, tuple, _np.ndarray, ndarray)):
            return True
        if isinstance(s, (bool, _np.bool_)):
            return True
    return False


def _index(index):
    """Host index arrays are converted (``_prepare_slice_list``); device ones unwrapped."""
    if isinstance(index, tuple):
        return tuple(_index(s) for s in index)
    if isinstance(index, ndarray):
        return index._a
    return index


def _wrapped(shape, index):
    """``index`` (unwrapped by ``_index``) with every integer *array* taken modulo its axis's
    length: CuPy wraps an integer array index that is out of range where NumPy raises
    IndexError ("CuPy handles out-of-bounds indices differently by default from NumPy",
    CuPy's "Differences between CuPy and NumPy"), so code that relies on NumPy's error to
    catch a bad index fails here as it would on a GPU. Integers stay checked (CuPy checks them
    too)."""
    items = list(index) if isinstance(index, tuple) else [index]
    items = [_np.asarray(s) if isinstance(s, list) else s for s in items]
    def width(s):                                 # the axes an item consumes
        if s is None or s is Ellipsis:
            return 0
        return s.ndim if isinstance(s, _np.ndarray) and s.dtype == bool else 1
    axis, out = 0, []
    for s in items:
        if s is Ellipsis:
            axis += len(shape) - sum(width(t) for t in items)
        elif isinstance(s, _np.ndarray) and s.dtype.kind in "iu" and s.ndim and s.size \
                and axis < len(shape) and shape[axis] \
                and not -shape[axis] <= s.min() <= s.max() < shape[axis]:
            s = s.astype(_np.int64) % shape[axis]
        out.append(s)
        axis += width(s)
    return tuple(out) if isinstance(index, tuple) else out[0]


def _binary(ufunc_name, reflected=False):
    def op(self, other):
        if not isinstance(other, ndarray) and _should_use_rop(self, other):
            return NotImplemented
        fn = getattr(cupy_module(), ufunc_name)
        return fn(other, self) if reflected else fn(self, other)
    op.__name__ = f"__{'r' if reflected else ''}{ufunc_name}__"
    return op


def _inplace(ufunc_name):
    def op(self, other):
        getattr(cupy_module(), ufunc_name)(self, other, out=self)
        return self
    return op


def _should_use_rop(x, y):
    """``core.pyx``: defer to y's reflected operator when y opts out of ufuncs or outranks us."""
    y_ufunc = getattr(y, "__array_ufunc__", _should_use_rop)
    if y_ufunc is not _should_use_rop:
        return y_ufunc is None
    return getattr(x, "__array_priority__", 0) < getattr(y, "__array_priority__", 0)


def _compare(ufunc_name):
    def op(self, other):
        if isinstance(other, _np.ndarray) and other.ndim == 0:
            other = other.item()                         # __richcmp__'s workaround
        if not isinstance(other, ndarray) and _should_use_rop(self, other):
            return NotImplemented
        return getattr(cupy_module(), ufunc_name)(self, other)
    return op


class ndarray:
    """A device array (its payload is a NumPy array, reachable only through CuPy's API)."""

    __slots__ = ("_a",)
    __array_priority__ = 100                       # as cupy.ndarray

    def __init__(self, a):
        if not isinstance(a, _np.ndarray):
            raise TypeError("strict_cupy.ndarray wraps a numpy.ndarray payload; use "
                            "cupy.asarray(...) to create one")
        self._a = a

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and _np.dtype(dtype) == self._a.dtype:
            return self                            # CuPy returns the array itself
        return ndarray(self._a.astype(dtype, order=order, copy=copy))

    # -- NumPy interop: refused, or dispatched to this module (NEP 13 / NEP 18) ------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method not in ("__call__", "outer", "at", "reduce", "accumulate"):
            return NotImplemented
        if "out" in kwargs:
            out = kwargs["out"]
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            kwargs["out"] = out[0]
        fn = getattr(cupy_module(), ufunc.__name__, None)
        if fn is None:
            return NotImplemented
        if method != "__call__":
            fn = getattr(fn, method)
        for x in inputs + ((kwargs["out"],) if "out" in kwargs else ()):
            if not isinstance(x, (ndarray, _np.ndarray) + _SCALARS):
                return NotImplemented
        if ufunc.__name__ in ("greater", "greater_equal", "less", "less_equal", "equal",
                              "not_equal"):
            inputs = tuple(x.item() if isinstance(x, _np.ndarray) and x.ndim == 0 else x
                           for x in inputs)
        return fn(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        module = cupy_module()
        for part in func.__module__.split(".")[1:]:
            module = getattr(module, part, None)
            if module is None:
                return NotImplemented
        mine = getattr(module, func.__name__, None)
        if mine is None or mine is func:
            return NotImplemented
        if not all(issubclass(t, (ndarray, _np.ndarray)) for t in types):
            return NotImplemented
        return mine(*args, **kwargs)

    # -- attributes ------------------------------------------------------------------------
    @property
    def shape(self):
        return self._a.shape

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    @property
    def dtype(self):
        return self._a.dtype

    @property
    def ndim(self):
        return self._a.ndim

    @property
    def size(self):
        return self._a.size

    @property
    def itemsize(self):
        return self._a.itemsize

    @property
    def nbytes(self):
        return self._a.nbytes

    @property
    def strides(self):
        return self._a.strides

    @property
    def flags(self):
        return self._a.flags

    @property
    def T(self):
        return ndarray(self._a.T)

    @property
    def real(self):
        return ndarray(self._a.real)

    @property
    def imag(self):
        return ndarray(self._a.imag)

    @property
    def data(self):
        return MemoryPointer(self._a.__array_interface__["data"][0])

    @property
    def device(self):
        return cupy_module().cuda.Device(0)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._a.shape, "typestr": self._a.dtype.str,
                "data": (self._a.__array_interface__["data"][0], False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    # -- explicit transfers and Python conversions -----------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True):
        """Device → host copy (the explicit transfer)."""
        _sync("to host")
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order, copy=True)

    def item(self):
        _sync("to host")
        return self._a.item()

    def tolist(self):
        _sync("to host")
        return self._a.tolist()

    def __bool__(self):
        _sync("to host")
        if self._a.size == 0:
            warnings.warn("The truth value of an empty array is ambiguous. Returning False",
                          DeprecationWarning)
            return False
        if self._a.size == 1:
            return bool(self._a.reshape(-1)[0])
        raise ValueError("The truth value of an array with more than one element is "
                         "ambiguous. Use a.any() or a.all()")

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __complex__(self):
        return complex(self.get())

    # no __index__: ``range(x)`` and ``lst[x]`` fail, as in CuPy

    def __len__(self):
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return self._a.shape[0]

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self._a.shape[0]))

    def __repr__(self):
        return repr(self._a)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __copy__(self):
        return ndarray(self._a.copy())

    def __deepcopy__(self, memo):
        return ndarray(self._a.copy())

    def __reduce__(self):
        return (_from_host, (self.get(),))

    # -- indexing ----------------------------------------------------------------------------
    def __getitem__(self, index):
        if _has_mask(index):                        # the output's size is the mask's count
            _sync("boolean index")
        return _wrap(self._a[_wrapped(self._a.shape, _index(index))])

    def __setitem__(self, index, value):
        where = _wrapped(self._a.shape, _index(index))
        if isinstance(value, ndarray):
            self._a[where] = value._a
            return
        if not _is_advanced(index):                 # _scatter_op 'update' → fill(value)
            host = _np.asarray(value)
            if host.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._a[where] = value

    # -- everything else NumPy's ndarray has (methods), strictly -----------------------------
    def __getattr__(self, name):
        if name.startswith("__array") or name in ("ctypes", "tofile", "dump", "dumps"):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if callable(attr):
            return _strict(attr)
        return _wrap(attr)

    # -- operators ---------------------------------------------------------------------------
    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("subtract"), _binary("subtract", True)
    __mul__, __rmul__ = _binary("multiply"), _binary("multiply", True)
    __truediv__, __rtruediv__ = _binary("true_divide"), _binary("true_divide", True)
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _binary("floor_divide", True)
    __mod__, __rmod__ = _binary("remainder"), _binary("remainder", True)
    __pow__, __rpow__ = _binary("power"), _binary("power", True)
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__ = _binary("bitwise_and"), _binary("bitwise_and", True)
    __or__, __ror__ = _binary("bitwise_or"), _binary("bitwise_or", True)
    __xor__, __rxor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True)
    __lshift__, __rlshift__ = _binary("left_shift"), _binary("left_shift", True)
    __rshift__, __rrshift__ = _binary("right_shift"), _binary("right_shift", True)
    __iadd__, __isub__ = _inplace("add"), _inplace("subtract")
    __imul__, __itruediv__ = _inplace("multiply"), _inplace("true_divide")
    __ifloordiv__, __imod__ = _inplace("floor_divide"), _inplace("remainder")
    __ipow__, __imatmul__ = _inplace("power"), _inplace("matmul")
    __iand__, __ior__, __ixor__ = (_inplace("bitwise_and"), _inplace("bitwise_or"),
                                   _inplace("bitwise_xor"))
    __lt__, __le__ = _compare("less"), _compare("less_equal")
    __gt__, __ge__ = _compare("greater"), _compare("greater_equal")
    __eq__, __ne__ = _compare("equal"), _compare("not_equal")
    __hash__ = None

    def __neg__(self):
        return cupy_module().negative(self)

    def __pos__(self):
        return cupy_module().positive(self)

    def __abs__(self):
        return cupy_module().absolute(self)

    def __invert__(self):
        return cupy_module().invert(self)


ndarray.__module__ = "cupy"


# ---- the modules -----------------------------------------------------------------------------

# Functions that take host data by design (CuPy converts or only reads shape/dtype).
_LENIENT = {"array", "asarray", "asanyarray", "empty_like", "zeros_like", "ones_like",
            "full_like"}
# NumPy names CuPy does not have (or not as array functions).
_MISSING = {"asmatrix", "matrix", "save", "savez", "savez_compressed", "load", "loadtxt",
            "savetxt", "genfromtxt", "fromfile", "memmap", "frompyfunc", "vectorize",
            "set_printoptions", "get_printoptions", "printoptions", "testing", "ctypeslib",
            "lib", "ma", "char", "rec", "polynomial", "distutils", "f2py", "typing"}


def _counted(fn, kind):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        _sync(kind)
        return fn(*args, **kwargs)
    return call


class _StrictModule(types.ModuleType):
    """A module whose functions are NumPy's, made strict; types and constants pass through."""

    def __init__(self, name, source):
        super().__init__(name)
        self._source = source

    def __getattr__(self, name):
        if name.startswith("__") or name in _MISSING:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        attr = getattr(self._source, name)
        if isinstance(attr, type) or not callable(attr):
            value = attr                           # dtypes, classes, inf, pi, newaxis
        elif isinstance(attr, _np.ufunc):
            value = _Ufunc(attr)
        elif name in _LENIENT:
            value = _lenient(attr)
        else:
            value = _strict(attr)
        if name in _SYNCING:
            value = _counted(value, _SYNCING[name])
        setattr(self, name, value)                 # cache
        return value


class _Proxy:
    """An object (a random Generator) whose methods return device arrays."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        return _strict(attr) if callable(attr) else _wrap(attr)


class _Random(_StrictModule):
    def default_rng(self, seed=None):
        return _Proxy(_np.random.default_rng(_host_ok(seed)))

    def RandomState(self, seed=None):  # noqa: N802 - CuPy's name
        return _Proxy(_np.random.RandomState(seed))


class _Device:
    """``cupy.cuda.Device``: device 0 of compute capability 9.0 (an H100's)."""

    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        self.compute_capability = "90"
        self.attributes = {"MaxSharedMemoryPerBlockOptin": 227 * 1024,
                           "MultiProcessorCount": 132}

    def synchronize(self):
        pass

    def use(self):
        pass

    @property
    def mem_info(self):
        return (64 << 30, 80 << 30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _no_nvrtc(*args, **kwargs):
    raise RuntimeError("NVRTC is not available: this is the strict CuPy stand-in (CPU only)")


class _MemoryPool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self):
        pass


_MODULES = {}


def make_modules():
    """Build (once) and return the ``cupy`` and ``cupyx`` stand-in modules."""
    if _MODULES:
        return _MODULES["cupy"], _MODULES["cupyx"]
    cp = _StrictModule("cupy", _np)
    cp.__version__ = __version__
    cp.__file__ = __file__
    cp.ndarray = ndarray
    cp.is_available = lambda: True
    cp.asnumpy = lambda a, stream=None, order="C", out=None: (
        a.get(order=order, out=out) if isinstance(a, ndarray) else _np.asarray(a, order=order))
    cp.get_array_module = lambda *args: cp if any(isinstance(a, ndarray) for a in args) else _np

    def ascontiguousarray(a, dtype=None):
        if not isinstance(a, ndarray):
            raise TypeError("Argument 'a' has incorrect type (expected "
                            f"cupy._core.core._ndarray_base, got {type(a).__name__})")
        return ndarray(_np.ascontiguousarray(a._a, dtype=dtype))
    cp.ascontiguousarray = ascontiguousarray

    def asarray(a, dtype=None, order=None, *, blocking=False):
        if isinstance(a, ndarray) and (dtype is None or _np.dtype(dtype) == a.dtype):
            return a                               # no copy: the same array
        return _wrap(_np.array(_host_ok(a), dtype=dtype, order=order or "K", copy=True))
    cp.asarray = cp.asanyarray = asarray

    def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
        for a in tup:
            if not isinstance(a, ndarray):
                raise TypeError("Only cupy arrays can be concatenated")
        return _wrap(_np.concatenate([a._a for a in tup], axis=axis, dtype=dtype,
                                     casting=casting))
    cp.concatenate = concatenate

    cp.random = _Random("cupy.random", _np.random)
    cp.linalg = _StrictModule("cupy.linalg", _np.linalg)
    cp.fft = _StrictModule("cupy.fft", _np.fft)
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device = _Device
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        deviceGetAttribute=lambda attr, dev: 227 * 1024,
        getDeviceProperties=lambda dev: {"name": b"strict CuPy stand-in (CPU)",
                                         "major": 9, "minor": 0, "multiProcessorCount": 132,
                                         "totalGlobalMem": 80 << 30})
    cuda.nvrtc = types.SimpleNamespace(getVersion=_no_nvrtc)
    cuda.get_cuda_path = lambda: None
    cuda.Event = _no_nvrtc
    cp.cuda = cuda
    cp.RawModule = cp.RawKernel = cp.ElementwiseKernel = cp.ReductionKernel = _no_nvrtc
    pool = _MemoryPool()
    cp.get_default_memory_pool = lambda: pool

    def take_along_axis(a, indices, axis):
        """CuPy's: a full fancy index, so an index out of range wraps (``_wrapped``)."""
        if not isinstance(a, ndarray):
            raise unsupported(a)
        if indices.dtype.kind not in "iu":
            raise IndexError("`indices` must be an integer array")
        if a.ndim != indices.ndim:
            raise ValueError("`indices` and `a` must have the same number of dimensions")
        axis = axis % a.ndim
        fancy = [indices if i == axis else cp.arange(n).reshape(
            (1,) * i + (n,) + (1,) * (a.ndim - i - 1)) for i, n in enumerate(a.shape)]
        return a[tuple(fancy)]
    cp.take_along_axis = take_along_axis

    cpx = types.ModuleType("cupyx")

    def scatter_add(a, slices, value):
        """``a[slices] += value`` with repeats accumulating; ``a`` must be a device array."""
        if not isinstance(a, ndarray):
            raise AttributeError(f"'{type(a).__module__}.{type(a).__name__}' object has no "
                                 "attribute '_scatter_op'")
        adv = _is_advanced(slices)
        if isinstance(value, _np.ndarray) and not adv:
            raise unsupported(value)
        _np.add.at(a._a, _index(slices), value._a if isinstance(value, ndarray) else value)
    cpx.scatter_add = scatter_add
    cpx.__version__ = __version__
    _MODULES.update(cupy=cp, cupyx=cpx)
    return cp, cpx


def cupy_module():
    return make_modules()[0]


def install() -> None:
    """Make ``import cupy`` / ``import cupyx`` give the stand-in (call before importing minitx)."""
    cp, cpx = make_modules()
    for name in [n for n in sys.modules if n == "cupy" or n.startswith(("cupy.", "cupyx"))]:
        del sys.modules[name]
    sys.modules.update({"cupy": cp, "cupyx": cpx, "cupy.cuda": cp.cuda,
                        "cupy.random": cp.random, "cupy.linalg": cp.linalg, "cupy.fft": cp.fft})
