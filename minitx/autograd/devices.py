"""Where a Tensor's array lives and what it may hold: the dtype and device rules, and the
array protocols a Tensor speaks (NumPy's ``np.asarray(t)``, Python's ``float(t)``, ``len(t)``).

Three rules, each enforced in one place:

- **what a Tensor holds** (``to_array``, for ``Tensor(data)``): bool, integer or floating
  arrays. Python floats become float32, as in PyTorch; NumPy and CuPy arrays keep their dtype
  (a bool mask stays bool); complex, string and object data are refused;
- **where it lives**: on the active backend's device (``minitx.set_backend``); ``t.to("cuda")``
  moves it, differentiably;
- **one device per op** (``one_device``, called by ``Function.apply`` once CuPy is loaded): the
  Tensors of one call share a device; a NumPy array given with device Tensors (a mask, an
  index array, a constant) is copied there once; a device array given with host Tensors is an
  error — NumPy would forgive the mix where a GPU refuses it.

``ArrayMethods``, a mixin that ``Tensor`` inherits (as it inherits ``PyTorchSpellings``), holds
the methods that convert a Tensor to NumPy and to Python numbers, move it, cast it and print it.
None of this is autograd: a first reading of the engine can skip it.
"""
from __future__ import annotations

import numpy

from .. import backend
from . import tensor as _tensor   # the module (tensor.py imports this one at its top)

__all__ = ["KINDS", "to_array", "one_device", "ArrayMethods"]

KINDS = "biuf"          # bool, signed/unsigned ints, floats: what a Tensor holds


def to_array(data, dtype):
    """Turn ``data`` into an array of the active backend, applying minitx's dtype rules."""
    xp = backend.xp()
    # a Tensor gives its array; a NumPy or CuPy array (anything with the CUDA array
    # interface) is taken as it is, dtype and all
    if isinstance(data, _tensor.Tensor):
        array = data.data
    elif isinstance(data, (numpy.ndarray, numpy.generic)) or \
            hasattr(data, "__cuda_array_interface__"):
        array = data
    else:
        # Python scalars and (nested) lists: floats become float32, like PyTorch.
        try:
            array = numpy.asarray(data)
        except ValueError as exc:                     # ragged nested lists
            raise ValueError(f"tensor: data must be a rectangular nested list or an array, "
                             f"got {type(data).__name__}: {exc}") from exc
        if array.dtype == numpy.float64 and dtype is None:
            array = array.astype(numpy.float32)
    if array.dtype.kind not in KINDS:
        raise TypeError(f"tensor: data must be bool, integer or floating point, got dtype "
                        f"{array.dtype} (from {type(data).__name__}); complex, string and "
                        "object arrays are not supported")
    # then onto the active backend's device, and into the dtype asked for
    if backend.get_array_module(array) is not xp:
        array = backend.to_device(array, "cuda" if xp is not numpy else "cpu")
    if dtype is not None:
        target = backend.as_dtype(dtype)
        if target.kind not in KINDS:
            raise TypeError(f"tensor: dtype must be bool, integer or floating point, got {target}")
        array = array.astype(target, copy=False)
    elif not hasattr(array, "shape"):
        array = xp.asarray(array)
    return xp.asarray(array)


def one_device(fn, inputs, arrays, kwargs):
    """The device rule, enforced here for every op: Tensors of one call live on one device;
    a NumPy array given with device Tensors (a mask, an index array, a constant) is copied to
    the device once; a device array given with host Tensors is an error."""
    devices = {a.device for a in inputs if isinstance(a, _tensor.Tensor)}
    if len(devices) > 1:
        where = ", ".join(f"input {i} on {a.device}" for i, a in enumerate(inputs)
                          if isinstance(a, _tensor.Tensor))
        raise RuntimeError(f"{fn.__name__}: expected all tensors on one device, got {where}; "
                           "move them with .to('cuda') or .to('cpu')")
    # device Tensors: every host array of the call (arguments and keywords) moves to them
    if devices == {"cuda"}:
        move = backend.to_device_of
        like = next(a for a in arrays if backend.device_of(a) == "cuda")
        arrays = [_deep(move, a, like) for a in arrays]
        kwargs = {k: _deep(move, v, like) for k, v in kwargs.items()}
    # host Tensors: a device array among the arguments is refused, never copied back silently
    elif devices == {"cpu"}:
        for a in list(arrays) + list(kwargs.values()):
            if backend.device_of(a) == "cuda":
                raise RuntimeError(f"{fn.__name__}: a CUDA array was given with CPU tensors; "
                                   "move it with minitx.backend.to_host(...) or the tensors "
                                   "with .to('cuda')")
    return arrays, kwargs


def _deep(move, value, like):
    """``move`` applied to ``value`` and to the arrays inside a tuple/list (an index)."""
    if isinstance(value, tuple):
        return tuple(_deep(move, v, like) for v in value)
    if isinstance(value, list):
        return [_deep(move, v, like) for v in value]
    return move(value, like)


class ArrayMethods:
    """A Tensor's conversions, device moves, casts and printing (see the module docstring).
    A mixin with no state of its own (``__slots__ = ()``: a Tensor keeps no ``__dict__``)."""

    __slots__ = ()
    __array_priority__ = 1000  # make `ndarray <op> Tensor` call Tensor's reflected operator

    # ---- where it lives; moves and casts (both differentiable) ----------------------------
    @property
    def device(self) -> str:
        """"cpu" or "cuda"."""
        return backend.device_of(self.data)

    def to(self, device: str):
        """A copy on "cpu" or "cuda" (differentiable: gradients flow back to this device)."""
        if device == self.device:
            return self
        return _tensor._F.to_device(self, device)

    def astype(self, dtype):
        """Cast to ``dtype`` (differentiable between floating dtypes)."""
        return _tensor._F.astype(self, dtype)

    # ---- to NumPy: explicit (.numpy()) or through NumPy's protocol (np.asarray(t)) ---------
    def numpy(self):
        """The data as a NumPy array (copied from the GPU when needed)."""
        return backend.to_device(self.data, "cpu")

    def __array__(self, dtype=None, copy=None):
        # a device array never reaches the host behind the user's back (DESIGN: host/device)
        if self.device != "cpu":
            raise TypeError("can't convert a cuda Tensor to NumPy implicitly; use .numpy()")
        return self.data if dtype is None else self.data.astype(dtype)

    def tolist(self):
        return self.numpy().tolist()

    # ---- to Python numbers: one-element tensors only ------------------------------------
    def item(self):
        """The value of a one-element tensor as a Python scalar."""
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.reshape(()).item()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        # t as a list index or a range bound: integer tensors only, as NumPy's rule
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}")
        return int(self.item())

    def __len__(self) -> int:
        return len(self.data)

    # ---- printing: PyTorch's layout, dtype and device shown only when not the default ----
    def __repr__(self) -> str:
        body = numpy.array2string(self.numpy(), precision=4, separator=", ", prefix="tensor(")
        extra = ""
        if self.dtype != numpy.float32 and self.dtype.kind == "f" or self.dtype.kind != "f":
            extra += f", dtype={self.dtype}"
        if self.device != "cpu":
            extra += f", device='{self.device}'"
        if self._ctx is not None:
            extra += f", grad_fn=<{self._ctx.fn.__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"
