"""One place for option checks: every public function and constructor validates here.

A bad value gets the same kind of message everywhere — who refused it, the argument, what was
expected, what was given::

    >>> validate.positive_int(0, "window", owner="local")
    OptionError: local: window must be a positive int, got 0

``OptionError`` is both a ``ValueError`` and a ``TypeError`` (a wrong type and a wrong value
of an option are the same mistake to a caller; scikit-learn's parameter validation does the
same), so ``except ValueError`` and ``except TypeError`` both catch it. ``bool`` is never
accepted as a number (``True`` is an int to Python, but ``window=True`` is a bug), and NaN never
passes a range check. Each function returns the value in its canonical type (``int`` / ``float``).

A keyword a constructor does not take (``PerformerAttention(..., nb_features=8)``) is the same
kind of mistake: ``catch_unknown_options`` turns Python's bare "unexpected keyword argument"
into an ``OptionError`` naming the class, the keyword and the closest option (difflib, as the
attention ``REGISTRY`` does for names). Every ``nn.Module`` subclass gets it
(``Module.__init_subclass__``), and so does ``GPTConfig``.

This module imports nothing from minitx: any layer may use it.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers

__all__ = ["OptionError", "integer", "positive_int", "nonnegative_int", "real", "positive_real",
           "nonnegative_real", "probability", "did_you_mean", "choice", "boolean", "int_tuple",
           "mask", "dim_alias", "unknown_options", "constructor_options",
           "catch_unknown_options"]


class OptionError(ValueError, TypeError):
    """An argument with the wrong type or value (see the module docstring)."""


def _who(owner) -> str:
    return f"{owner}: " if owner else ""


def _fail(owner, name, expected, value):
    raise OptionError(f"{_who(owner)}{name} must be {expected}, got {value!r}"
                      + ("" if isinstance(value, (int, float, str, type(None))) else
                         f" ({type(value).__name__})"))


def integer(value, name: str, *, minimum: int = None, maximum: int = None, owner=None,
            expected: str = None) -> int:
    """An int (NumPy integers too, never bool) in [minimum, maximum]."""
    bounds = ("" if minimum is None else f" >= {minimum}") + \
             ("" if maximum is None else f"{' and' if minimum is not None else ''} <= {maximum}")
    expected = expected or "an int" + bounds
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(owner, name, expected, value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        _fail(owner, name, expected, value)
    return int(value)


def positive_int(value, name: str, *, owner=None) -> int:
    """An int >= 1 (a size, a count, a dimension)."""
    return integer(value, name, minimum=1, owner=owner, expected="a positive int")


def nonnegative_int(value, name: str, *, owner=None) -> int:
    """An int >= 0 (a window half-width, an offset)."""
    return integer(value, name, minimum=0, owner=owner)


def real(value, name: str, *, minimum: float = None, maximum: float = None,
         min_open: bool = False, max_open: bool = False, finite: bool = True,
         owner=None, expected: str = None) -> float:
    """A real number (int, float, NumPy scalar; never bool or NaN) in the given range.

    ``min_open`` / ``max_open`` exclude the bound itself; ``finite`` refuses ±inf.
    """
    lo = "" if minimum is None else f"{'>' if min_open else '>='} {minimum}"
    hi = "" if maximum is None else f"{'<' if max_open else '<='} {maximum}"
    expected = expected or "a " + ("finite " if finite else "") + "number" + \
        (f" {lo}" if lo else "") + (" and" if lo and hi else "") + (f" {hi}" if hi else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(owner, name, expected, value)
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        _fail(owner, name, expected, value)
    if minimum is not None and (v < minimum or (min_open and v == minimum)):
        _fail(owner, name, expected, value)
    if maximum is not None and (v > maximum or (max_open and v == maximum)):
        _fail(owner, name, expected, value)
    return v


def positive_real(value, name: str, *, owner=None) -> float:
    """A finite number > 0 (a scale, a temperature, a base, a learning rate)."""
    return real(value, name, minimum=0.0, min_open=True, owner=owner,
                expected="a positive finite number")


def nonnegative_real(value, name: str, *, owner=None) -> float:
    """A finite number >= 0 (an epsilon, a weight decay, a norm bound)."""
    return real(value, name, minimum=0.0, owner=owner, expected="a number >= 0")


def probability(value, name: str, *, allow_one: bool = False, owner=None) -> float:
    """A probability in [0, 1) (a dropout rate), or [0, 1] with ``allow_one``."""
    return real(value, name, minimum=0.0, maximum=1.0, max_open=not allow_one, owner=owner,
                expected="a probability in [0, 1]" if allow_one else "a probability in [0, 1)")


def did_you_mean(value, options) -> str:
    """``"; did you mean 'retention'?"`` for the options closest to a mistyped name
    (``difflib.get_close_matches``, at most three), or ``""`` when none is close or ``value``
    is not a string. The one rule every "unknown name" error follows."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(o) for o in options], n=3)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def choice(value, name: str, options, *, owner=None):
    """One of ``options`` (compared with ``==``; strings are case-sensitive). A string that is
    not one of them is refused naming the closest options (``did_you_mean``), then all."""
    options = tuple(options)
    if isinstance(value, bool) and not any(isinstance(o, bool) for o in options):
        _fail(owner, name, f"one of {options}", value)
    try:
        ok = value in options
    except TypeError:
        ok = False
    if not ok:
        hint = did_you_mean(value, [o for o in options if isinstance(o, str)])
        if hint:
            raise OptionError(f"{_who(owner)}{name} must be one of {options}, got {value!r}"
                              f"{hint}")
        _fail(owner, name, f"one of {options}", value)
    return value


def boolean(value, name: str, *, owner=None) -> bool:
    """``True`` or ``False`` (a NumPy bool too), not a truthy string or number."""
    if type(value).__name__ not in ("bool", "bool_"):
        _fail(owner, name, "True or False", value)
    return bool(value)


def int_tuple(value, name: str, *, minimum: int = None, owner=None) -> tuple:
    """A tuple/list of ints (each >= ``minimum`` when given) → a tuple of Python ints."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        _fail(owner, name, "a tuple of ints", value)
    return tuple(integer(v, f"{name}[{i}]", minimum=minimum, owner=owner)
                 for i, v in enumerate(value))


def mask(value, name: str, *, shape=None, dims="", kinds: str = "bf", owner=None,
         hint: str = ""):
    """An array (or Tensor) mask of an allowed dtype kind and, when given, of ``shape``.

    ``kinds``: the allowed ``dtype.kind`` letters, "b" (bool) and/or "f" (float). ``shape``:
    the expected shape, or a list of the allowed ones; ``dims`` names their axes for the
    message ("(N, S)", or a list matching ``shape``). ``hint`` is appended (the polarity
    the caller expects, how to convert). Returns ``value`` unchanged::

        >>> validate.mask(np.zeros((2, 5), int), "key_padding_mask", shape=(2, 5),
        ...               dims="(N, S)", owner="MultiheadAttention")
        OptionError: MultiheadAttention: key_padding_mask must be a bool or float array
        (N, S) = (2, 5), got int64 (2, 5)
    """
    shapes = [] if shape is None else \
        [tuple(shape)] if all(isinstance(e, numbers.Integral) for e in shape) else \
        [tuple(s) for s in shape]
    names = [dims] if isinstance(dims, str) else list(dims)
    names += [""] * (len(shapes) - len(names))
    kind_names = " or ".join({"b": "bool", "f": "float"}[k] for k in kinds)
    where = " or ".join(f"{d} = {s}" if d else f"{s}" for d, s in zip(names, shapes)) or \
        " or ".join(names)
    expected = f"a {kind_names} array" + (f" {where}" if where else "")
    dtype, got_shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is None or got_shape is None:
        given = "a " + type(value).__name__
    else:
        given = f"{dtype} {tuple(got_shape)}"
    if given.startswith("a ") or getattr(dtype, "kind", None) not in kinds or \
            (shapes and tuple(got_shape) not in shapes):
        raise OptionError(f"{_who(owner)}{name} must be {expected}, got {given}"
                          + (f". {hint}" if hint else ""))
    return value


_TORCH_SPELLINGS = (("dim", "axis"), ("keepdim", "keepdims"))


def dim_alias(fn=None, *, torch_differs: str = None):
    """Decorator: ``fn(..., axis=, keepdims=)`` also takes PyTorch's ``dim=`` and ``keepdim=``.

    ``F.softmax(x, dim=-1)`` is then ``F.softmax(x, axis=-1)``. Passing both spellings of
    one argument is an ``OptionError`` naming both. ``torch_differs``: where PyTorch's
    ``dim=`` means something else (``torch.max(x, dim=1)`` returns values *and* indices),
    ``dim=`` is refused with this explanation instead of being taken silently.
    """
    if fn is None:
        return functools.partial(dim_alias, torch_differs=torch_differs)
    who = fn.__qualname__                  # "softmax", or "Tensor.sum" for a method

    @functools.wraps(fn)
    def with_torch_spellings(*args, **kwargs):
        for torch_name, name in _TORCH_SPELLINGS:
            if torch_name not in kwargs:
                continue
            if torch_differs and torch_name == "dim":
                raise OptionError(f"{who}: dim= is PyTorch's spelling and means something "
                                  f"else here: {torch_differs}")
            if name in kwargs:
                raise OptionError(f"{who}: pass {name}= or its PyTorch spelling "
                                  f"{torch_name}=, not both (got {name}={kwargs[name]!r} and "
                                  f"{torch_name}={kwargs[torch_name]!r})")
            kwargs[name] = kwargs.pop(torch_name)
        return fn(*args, **kwargs)
    return with_torch_spellings


# ---- keywords a constructor does not take ----------------------------------------------------
# Python says "__init__() got an unexpected keyword argument 'nb_features'" and stops there. The
# wrapper below says which class refused it, what the closest option is and what the options
# are. It costs a good call nothing but one function frame: the signature is read only after
# the constructor has raised a TypeError, to decide whether the keywords were its cause.

_CATCHES = "__minitx_catches_unknown_options__"      # marks a wrapped __init__ (no re-wrap)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_options(names, options, *, owner=None) -> OptionError:
    """The error for keywords ``owner`` does not take: each name with its closest options
    (``difflib.get_close_matches``), then every option. Returned, for the caller to raise::

        >>> raise validate.unknown_options(["nb_features"], ["num_features", "causal"],
        ...                                owner="PerformerAttention")
        OptionError: PerformerAttention: unknown option 'nb_features'; did you mean
        'num_features'? (options: num_features, causal)
    """
    options = [str(o) for o in options]
    parts = [f"{name!r}" + did_you_mean(str(name), options) for name in names]
    label = "unknown option " if len(parts) == 1 else "unknown options "
    return OptionError(f"{_who(owner)}{label}{', '.join(parts)} (options: {', '.join(options)})")


def constructor_options(cls) -> list:
    """The keywords ``cls(...)`` takes: its ``__init__``'s named parameters and, while an
    ``__init__`` passes ``**kwargs`` on, those of the next ``__init__`` up the MRO (a variant
    handing ``**options`` to its base class)."""
    names = []
    for klass in cls.__mro__[:-1]:                            # every class but object
        init = vars(klass).get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]      # without self
        names += [p.name for p in params if p.kind in _NAMED and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def _raise_if_unknown_keywords(init, self, args, kwargs) -> None:
    """After ``init(self, *args, **kwargs)`` raised a TypeError: raise ``unknown_options`` when
    keywords ``init`` does not take were the cause; return (the caller re-raises) otherwise."""
    signature = inspect.signature(init)
    try:
        signature.bind(self, *args, **kwargs)
        return                                  # the arguments fit: the body raised it
    except TypeError:
        pass
    params = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    takes = {p.name for p in params if p.kind in _NAMED}
    unknown = [k for k in kwargs if k not in takes]
    if unknown:                                 # (a missing argument is left to Python's words)
        raise unknown_options(unknown, constructor_options(type(self)),
                              owner=type(self).__name__) from None


def catch_unknown_options(init):
    """Wrap a constructor (an ``__init__``, or a class: its ``__init__``) so that a keyword it
    does not take raises ``unknown_options`` naming the class instead of Python's bare
    "unexpected keyword argument". An ``OptionError`` is a ``TypeError``: ``except TypeError``
    still catches it.

    Only that case changes: a TypeError raised inside the constructor's body, or for a missing
    or surplus positional argument, propagates unchanged. The wrapper keeps the signature
    (``functools.wraps``; ``inspect.signature`` follows ``__wrapped__``); it is a plain
    function on the class, so pickling and ``copy.deepcopy`` (which never call ``__init__``)
    are untouched.
    """
    if isinstance(init, type):
        init.__init__ = catch_unknown_options(vars(init)["__init__"])
        return init
    if getattr(init, _CATCHES, False):
        return init

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except TypeError:
            if kwargs:
                _raise_if_unknown_keywords(init, self, args, kwargs)
            raise
    setattr(__init__, _CATCHES, True)
    return __init__
