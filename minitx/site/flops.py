"""Counting the floating-point work of a call: the site's proof of how time grows.

A clock measures the machine: at N = 64–256 a call's fixed overhead (Python, allocation,
other processes) dominates it, so a time exponent fitted there says little about the maths.
The work itself can be counted. ``count_call(call, *tensors)`` views the arrays a call reads —
its inputs, every parameter and buffer — as ``Counted``, a NumPy array subclass that adds the
work of each operation done on it to a counter before NumPy does it, so every operation the
code performs on these arrays or on what is computed from them is counted, wherever it sits
(an op, a ``Function.forward`` on raw arrays, a fast twin). Nothing in minitx reports to the
counter: the arrays count themselves, from their shapes.

The convention (the usual one for counting FLOPs):

- a matrix product (``@``, ``matmul``, ``dot``) of (…, n, k) by (…, k, m): 2·n·k·m per batch
  element (a multiply and an add per term);
- ``einsum``: 2 · the product of the sizes of every index it names (its full loop nest);
- an FFT of length L: 5·L·log₂L per transform (Cooley–Tukey's count);
- ``solve``/``inv``/``pinv`` of an n×n matrix: n³ per matrix;
- every other element-wise operation (``+``, ``exp``, ``where``, a comparison…): one per
  output element; a reduction (``sum``, ``max``): one per input element.

An exp counts as one, like an add: the count proves how work *grows* with N, not how long it
takes. While counting, NumPy's constructors (``empty``, ``zeros``, ``ones``, ``full``, ``eye``,
``arange``) make ``Counted`` arrays too, so a buffer filled tile by tile keeps counting. An
operation between two arrays neither of which descends from a counted one (say, after an
``asarray`` that drops the subclass) would still be missed, so ``count_call`` checks that the
call's output is ``Counted`` — a count that lost track of the work raises instead of
returning a small number.
"""
from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

__all__ = ["Counted", "count_call", "CountLost"]


class CountLost(RuntimeError):
    """The output of a counted call is no longer a ``Counted`` array: some work escaped."""


_lock = threading.Lock()          # fast twins may compute in threads
_total = {"flops": 0, "on": False}


def _add(flops) -> None:
    if _total["on"]:
        with _lock:
            _total["flops"] += int(flops)


def _plain(x):
    return x.view(np.ndarray) if isinstance(x, Counted) else x


def _unwrap(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(y) for y in x)
    return _plain(x)


def _wrap(x):
    if isinstance(x, tuple):
        return tuple(_wrap(y) for y in x)
    return x.view(Counted) if type(x) is np.ndarray else x


def _matmul_flops(a, b) -> int:
    a, b = np.shape(a), np.shape(b)
    n = a[-2] if len(a) > 1 else 1
    k = a[-1]
    m = b[-1] if len(b) > 1 else 1
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return 2 * math.prod(batch) * n * k * m


def _einsum_flops(subscripts, *operands) -> int:
    inputs = subscripts.split("->")[0].replace(" ", "").split(",")
    sizes = {}
    for term, op in zip(inputs, operands):
        shape = np.shape(op)
        if "..." in term:
            head, tail = term.split("...")
            sizes.update({f"…{i}": s for i, s in
                          enumerate(shape[len(head):len(shape) - len(tail)])})
            sizes.update(zip(head, shape[:len(head)]))
            sizes.update(zip(tail, shape[len(shape) - len(tail):]))
        else:
            sizes.update(zip(term, shape))
    return 2 * math.prod(sizes.values())


def _fft_flops(a, axes) -> int:
    shape = np.shape(a)
    total = 0
    for axis in axes:
        length = shape[axis]
        total += 5 * (math.prod(shape) // max(length, 1)) * length * max(math.log2(length), 1)
    return int(total)


def _function_flops(func, args, kwargs, result) -> int:
    name = func.__name__
    module = getattr(func, "__module__", "") or ""
    if name == "einsum" and args and isinstance(args[0], str):
        return _einsum_flops(*args)
    if name in ("dot", "matmul", "inner", "vdot") and len(args) >= 2:
        return _matmul_flops(args[0], args[1])
    if name == "tensordot":
        return 2 * int(np.size(result)) * _contracted(args, kwargs)
    if "fft" in module:
        ndim = np.ndim(args[0])
        if name.endswith("fftn") or name.endswith("fft2"):
            axes = kwargs.get("axes") or (range(ndim) if name.endswith("n") else (-2, -1))
        else:
            axes = (kwargs.get("axis", -1),)
        return _fft_flops(args[0], list(axes))
    if name in ("solve", "inv", "pinv", "lstsq", "det", "slogdet", "cholesky", "qr", "svd",
                "eigh", "eig"):
        shape = np.shape(args[0])
        n = shape[-1]
        return math.prod(shape[:-2]) * n ** 3
    if name in ("sum", "mean", "max", "min", "amax", "amin", "prod", "cumsum", "cumprod",
                "var", "std", "norm", "logsumexp", "argmax", "argmin", "sort", "argsort",
                "partition", "argpartition", "where", "clip", "maximum", "minimum"):
        return int(np.size(args[0])) if args else 0
    return 0                    # copies, reshapes, stacking, indexing: no arithmetic


def _contracted(args, kwargs) -> int:
    a, b = np.shape(args[0]), np.shape(args[1])
    axes = args[2] if len(args) > 2 else kwargs.get("axes", 2)
    if isinstance(axes, int):
        return math.prod(a[len(a) - axes:]) if axes else 1
    return math.prod(a[i] for i in np.atleast_1d(axes[0]))


class Counted(np.ndarray):
    """An ndarray that adds the work of every operation done on it to the running count (see
    the module docstring); results of that work are ``Counted`` too."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        args = [_plain(a) for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(_plain(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*args, **kwargs)
        if method == "__call__":
            if ufunc is np.matmul:
                _add(_matmul_flops(args[0], args[1]))
            else:
                first = result[0] if isinstance(result, tuple) else result
                _add(np.size(first))
        elif method != "at":             # reduce, accumulate, reduceat, outer
            _add(max(np.size(args[0]), np.size(result)))
        else:
            _add(np.size(args[-1]) if len(args) > 2 else np.size(args[1]))
        return _wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        args, kwargs = _unwrap(args), {k: _unwrap(v) for k, v in kwargs.items()}
        result = func(*args, **kwargs)
        _add(_function_flops(func, args, kwargs, result))
        return _wrap(result)


# NumPy's constructors, made to return ``Counted`` arrays while counting: a buffer the code
# fills tile by tile (``out = xp.empty(…); out[i] = …``) holds counted work, and work done on
# it later is counted too. The code looks them up on the module (``xp.empty``) at each call.
_MADE = ("empty", "zeros", "ones", "full", "eye", "arange")


def _counted_maker(make):
    def made(*args, **kwargs):
        return _wrap(make(*args, **kwargs))
    return made


@contextlib.contextmanager
def _counting_on():
    if _total["on"]:
        raise RuntimeError("counting: already counting (counts do not nest)")
    _total.update(flops=0, on=True)
    originals = {name: getattr(np, name) for name in _MADE}
    try:
        for name, make in originals.items():
            setattr(np, name, _counted_maker(make))
        yield
    finally:
        for name, make in originals.items():
            setattr(np, name, make)
        _total["on"] = False


def count_call(call, *tensors):
    """The floating-point operations of ``call()``, counted (module docstring).

    ``tensors``: the minitx Tensors (inputs, parameters, buffers) whose arrays the call reads;
    each is viewed as ``Counted`` for the call and given back its plain array afterwards.
    Raises ``CountLost`` when the call's output (a Tensor or array) is not ``Counted``.
    """
    foreign = [type(t.data).__name__ for t in tensors if not isinstance(t.data, np.ndarray)]
    if foreign:
        raise TypeError(f"count_call counts work on NumPy arrays, got {', '.join(foreign)} (the "
                        "site computes on NumPy: minitx.set_backend('numpy'))")
    saved = [(t, t.data) for t in tensors]
    try:
        for t, data in saved:
            t.data = data.view(Counted)
        with _counting_on():
            out = call()
            flops = _total["flops"]
    finally:
        for t, data in saved:
            t.data = data
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        array = o if isinstance(o, np.ndarray) else getattr(o, "data", None)  # a Tensor's
        if array is not None and not isinstance(array, Counted):
            raise CountLost("counting: the call's output is a plain array, so some of its work "
                            "was done outside the count")
    return flops

