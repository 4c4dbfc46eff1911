"""``Module`` and ``Parameter``: the bookkeeping behind every layer, plus the containers.

A Module is a Python object whose attributes are sorted, on assignment, into three tables:

- ``_parameters``: ``Parameter`` objects (trainable leaf Tensors), e.g. ``self.weight``;
- ``_buffers``: non-trainable state registered with ``register_buffer`` (e.g. a fixed
  positional table); persistent buffers are saved in ``state_dict``;
- ``_modules``: child Modules, e.g. ``self.linear1 = Linear(4, 8)``.

Everything else (``self.eps = 1e-5``) is a plain attribute. Walking the child tables
recursively gives the dotted names PyTorch uses::

    class Block(Module):
        def __init__(self):
            super().__init__()
            self.linear1 = Linear(4, 8)
            self.norm = LayerNorm(8)

    [name for name, _ in Block().named_parameters()]
    # ['linear1.weight', 'linear1.bias', 'norm.weight', 'norm.bias']

``state_dict()`` maps those names to NumPy arrays (parameters, then persistent buffers, for
each module in pre-order), ``load_state_dict`` checks a mapping against them and copies it
in, and ``save``/``load`` store the same mapping as an ``.npz`` file.

The containers ``Sequential``, ``ModuleList`` and ``ModuleDict`` register their members
under the keys "0", "1", ... (or the dict's keys), so ``Sequential(Linear(2, 3))`` has the
state-dict key ``0.weight``, exactly as in PyTorch.
"""
from __future__ import annotations

import numbers
import os
import re
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple

from .. import backend, validate
from ..autograd import versions
from ..autograd.tensor import Tensor

__all__ = ["Parameter", "Module", "Sequential", "ModuleList", "ModuleDict", "IncompatibleKeys"]


# ---- Parameter --------------------------------------------------------------------------------

class Parameter(Tensor):
    """A Tensor that a Module treats as trainable: assigning one to a Module attribute
    registers it in ``parameters()``.

    ``Parameter(data, requires_grad=True)``: ``data`` is anything ``minitx.tensor`` accepts.
    A Tensor's or NumPy array's memory is shared, not copied (like ``torch.from_numpy``), so
    optimizer updates write through to it. Parameters must be floating point.
    """

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        super().__init__(data)
        if self.data.dtype.kind != "f":
            raise TypeError(f"Parameter data must be floating point, got dtype {self.data.dtype}")
        self.requires_grad = bool(requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _copy_to_host(array):
    """A NumPy copy of ``array`` (from the GPU when needed): a snapshot, never a view."""
    host = backend.to_device(array, "cpu")
    return host.copy() if host is array else host


def _check_name(kind: str, name) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    if name == "" or "." in name:
        raise KeyError(f"{kind} name must be non-empty and contain no '.', got {name!r}")


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` skipped: keys the module has that the state
    lacked (``missing_keys``) and keys of the state the module does not have
    (``unexpected_keys``)."""
    missing_keys: list
    unexpected_keys: list


# ---- Module -----------------------------------------------------------------------------------

class Module:
    """Base class of every layer and model.

    Subclasses call ``super().__init__()`` first, assign Parameters, sub-Modules and buffers
    as attributes, and define ``forward``; calling the module runs ``forward``.

    ``training`` (True after construction) is switched recursively by ``train()``/``eval()``
    and read by layers that behave differently when evaluating (``Dropout``).

    A keyword a constructor does not take is named, with the closest option, for every
    subclass: ``Linear(3, 2, baias=False)`` raises "Linear: unknown option 'baias'; did you
    mean 'bias'? (options: in_features, out_features, bias, …)" (an ``OptionError``, hence a
    ``TypeError``; ``validate.catch_unknown_options``).
    """

    def __init_subclass__(cls, **kwargs):
        # one rule for every layer, variant and model: each constructor a subclass defines is
        # wrapped once, here, when the class is created (a good call costs one frame)
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = validate.catch_unknown_options(vars(cls)["__init__"])

    @validate.catch_unknown_options           # a subclass's **kwargs may end up here
    def __init__(self):
        # object.__setattr__: our own __setattr__ needs these tables to exist already.
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- attribute routing ------------------------------------------------------------------
    def _tables(self):
        """(_parameters, _buffers, _modules), or a clear error if super().__init__() was skipped."""
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError("cannot assign parameters, buffers or modules before "
                                 f"{type(self).__name__}.__init__ calls super().__init__()")
        return d["_parameters"], d["_buffers"], d["_modules"]

    def __setattr__(self, name: str, value) -> None:
        """Route an assignment: a Parameter goes to ``_parameters``, a Module to ``_modules``,
        a value for an existing buffer's name to ``_buffers``; anything else is a plain
        attribute. A registered parameter or module can only be replaced by its kind or None."""
        if isinstance(value, (Parameter, Module)):
            self._tables()                       # a readable error before super().__init__()
            self.__dict__.pop(name, None)        # a plain attribute of that name is replaced
            if isinstance(value, Parameter):
                self.register_parameter(name, value)
            else:
                self.add_module(name, value)
            return
        d = self.__dict__
        params, buffers, modules = (d.get(t, {}) for t in ("_parameters", "_buffers", "_modules"))
        if name in params or name in modules:
            kind = "parameter" if name in params else "child module"
            if value is not None:
                expected = "minitx.nn.Parameter" if name in params else "Module"
                raise TypeError(f"cannot assign {type(value).__name__} as {kind} {name!r} "
                                f"(a {expected} or None is expected)")
            (params if name in params else modules)[name] = None
        elif name in buffers:
            buffers[name] = None if value is None else self._as_buffer(name, value)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: look in the three tables.
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    def _claim(self, name: str, kind: str, own: dict) -> None:
        """Remove ``name`` from the *other* tables before registering it in ``own`` (where a
        re-registration keeps its position, so ``seq[0] = m`` stays first)."""
        _check_name(kind, name)
        if name in self.__dict__:
            raise KeyError(f"attribute {name!r} already exists on {type(self).__name__} "
                           f"and is not a {kind}")
        for table in self._tables():
            if table is not own:
                table.pop(name, None)
        self._non_persistent.discard(name)

    # ---- registration -----------------------------------------------------------------------
    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (a Parameter, or None for an absent one such as ``bias=False``)."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot register {type(param).__name__} as parameter {name!r} "
                            "(a minitx.nn.Parameter or None is expected)")
        self._claim(name, "parameter", self._tables()[0])
        self._parameters[name] = param

    def add_module(self, name: str, module: "Module | None") -> None:
        """Register ``module`` as a child called ``name``."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module (child {name!r})")
        self._claim(name, "module", self._tables()[2])
        self._modules[name] = module

    register_module = add_module

    @staticmethod
    def _as_buffer(name, value) -> Tensor:
        if isinstance(value, Parameter):
            raise TypeError(f"buffer {name!r} got a Parameter; register it as a parameter instead")
        if isinstance(value, Tensor):
            return value.detach()
        try:
            return Tensor(value)
        except TypeError as exc:
            raise TypeError(f"buffer {name!r} must be an array or a Tensor, got "
                            f"{type(value).__name__}") from exc

    def register_buffer(self, name: str, value, persistent: bool = True) -> None:
        """Register non-trainable state (a Tensor or array, stored as a Tensor, or None).

        Persistent buffers appear in ``state_dict``; non-persistent ones (e.g. a cache that can
        be recomputed) do not. Buffers move with ``to(device)`` and never require gradients.
        """
        self._claim(name, "buffer", self._tables()[1])
        self._buffers[name] = None if value is None else self._as_buffer(name, value)
        if not persistent:
            self._non_persistent.add(name)

    # ---- traversal --------------------------------------------------------------------------
    def named_modules(self, prefix: str = "",
                      memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        """(name, module) for this module ("" or ``prefix``) and every descendant, pre-order;
        a module reachable twice is yielded once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """(name, module) for the direct children, in assignment order."""
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, table: str, recurse: bool, skip=frozenset()):
        seen = set()
        modules = self.named_modules() if recurse else [("", self)]
        for mod_prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or id(value) in seen or (table == "_buffers" and name in skip):
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value

    def named_parameters(self, recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter) pairs: for each module in pre-order, its own parameters in
        registration order. A parameter shared by two modules (tied weights) appears once,
        under the first name."""
        return self._named_members("_parameters", recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse):
            yield p

    def named_buffers(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse):
            yield b

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Total number of scalars in the (distinct) parameters."""
        return sum(p.size for p in self.parameters() if p.requires_grad or not trainable_only)

    # ---- modes and bulk operations ----------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set ``training = mode`` on this module and every descendant; returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) expects a bool, got {type(mode).__name__}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        """``train(False)``: dropout off, etc. Returns self."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Reset every parameter's ``.grad`` to None (the next backward starts from zero)."""
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Freeze (False) or unfreeze (True) every parameter; returns self."""
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        return self

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every descendant (children first) and then on self; returns self.

        >>> model.apply(lambda m: init.zeros_(m.bias) if isinstance(m, Linear) else None)
        """
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args, device=None, dtype=None) -> "Module":
        """Move parameters, their gradients and buffers to ``device`` ("cpu" or "cuda") and/or
        cast floating ones to ``dtype``, in place (the Parameter objects stay the same, so an
        optimizer built earlier keeps working). Returns self.

        PyTorch's spellings all work: ``to("cuda")``, ``to(numpy.float64)``, ``to("float64")``,
        ``to("cuda", numpy.float32)``, ``to(device=..., dtype=...)``.
        """
        for a in args:                               # positional: a device name or a dtype
            if isinstance(a, str) and a in ("cpu", "cuda", "gpu"):
                if device is not None:
                    raise ValueError(f"to(): two devices given ({device!r} and {a!r})")
                device = a
            else:
                if dtype is not None:
                    raise ValueError(f"to(): two dtypes given ({dtype!r} and {a!r})")
                dtype = a
        if device is not None and device not in ("cpu", "cuda", "gpu"):
            raise ValueError(f"to(): device must be 'cpu' or 'cuda', got {device!r}")
        target = backend.as_dtype(dtype) if dtype is not None else None
        if target is not None and target.kind != "f":
            raise TypeError(f"to(): dtype must be a floating dtype, got {target}")

        def convert(array):
            if device is not None:
                array = backend.to_device(array, device)
            if target is not None and array.dtype.kind == "f":
                array = array.astype(target, copy=False)
            return array

        for m in self.modules():
            for t in list(m._parameters.values()) + list(m._buffers.values()):
                if t is None:
                    continue
                t.data = convert(t.data)
                if t.grad is not None:
                    t.grad = Tensor._wrap(convert(t.grad.data), False)
        return self

    def double(self) -> "Module":
        """Cast floating parameters and buffers to float64 (``to(dtype="float64")``)."""
        return self.to(dtype="float64")

    def float(self) -> "Module":
        """Cast floating parameters and buffers to float32."""
        return self.to(dtype="float32")

    def half(self) -> "Module":
        """Cast floating parameters and buffers to float16."""
        return self.to(dtype="float16")

    def _factory(self, device=None, dtype=None) -> None:
        """PyTorch's ``device=`` / ``dtype=`` construction keywords: applied once the module
        is built (its parameters are created on the active backend, then moved/cast)."""
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    # ---- state dict -------------------------------------------------------------------------
    def _state_entries(self) -> "OrderedDict[str, Tensor]":
        """key → Tensor for everything in ``state_dict`` (tied weights under every name)."""
        entries = OrderedDict()
        for prefix, module in self.named_modules():
            dot = prefix + "." if prefix else ""
            for name, p in module._parameters.items():
                if p is not None:
                    entries[dot + name] = p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    entries[dot + name] = b
        return entries

    def state_dict(self) -> "OrderedDict[str, object]":
        """An ordered mapping from dotted names to NumPy arrays: for each module in pre-order,
        its parameters then its persistent buffers (PyTorch's keys and order).

        The arrays are copies (a snapshot): training afterwards does not change them.
        """
        return OrderedDict((k, _copy_to_host(t.data)) for k, t in self._state_entries().items())

    def load_state_dict(self, state: Mapping, strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Copy ``state`` (name → NumPy array, Tensor, or CuPy array) into the parameters and
        persistent buffers, in place, keeping each one's dtype and device.

        Everything is checked before anything is written: with ``strict=True`` any missing or
        unexpected key, and in every mode any shape mismatch or non-numeric value, raises one
        ``RuntimeError`` listing all problems, and the module is left unchanged. With
        ``strict=False`` the keys present in both are loaded and the skipped ones returned.

        ``assign=True`` (PyTorch's name) makes each array the tensor's data instead of copying
        it, when it already has the tensor's dtype and device and is writable (else a copy):
        a checkpoint then never sits in memory twice. The caller gives the arrays away — a
        later change to one is a change to the model.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict expects a mapping of name -> array, got "
                            f"{type(state).__name__}")
        entries = self._state_entries()
        missing = [k for k in entries if k not in state]
        unexpected = [k for k in state if k not in entries]
        problems, arrays = [], {}
        for key, target in entries.items():
            if key not in state:
                continue
            value = state[key]
            array = value.data if isinstance(value, Tensor) else value
            if not hasattr(array, "shape") or not hasattr(array, "dtype"):
                problems.append(f"{key}: expected an array or Tensor, got {type(value).__name__}")
                continue
            if array.dtype.kind not in "biuf":
                problems.append(f"{key}: expected numeric data, got dtype {array.dtype}")
            elif tuple(array.shape) != tuple(target.shape):
                problems.append(f"{key}: shape {tuple(array.shape)} in the state does not match "
                                f"shape {tuple(target.shape)} in the module")
            else:
                arrays[key] = array
        if strict:
            if missing:
                problems.insert(0, "missing key(s): " + ", ".join(missing))
            if unexpected:
                problems.insert(1 if missing else 0, "unexpected key(s): " + ", ".join(unexpected))
        if problems:
            raise RuntimeError(f"error(s) loading state_dict into {type(self).__name__} "
                               "(nothing was changed):\n  " + "\n  ".join(problems))
        for key, array in arrays.items():
            target = entries[key]
            if assign:
                data = backend.to_device(array, target.device).astype(target.dtype,
                                                                     copy=False)
                writable = getattr(data.flags, "writeable", True)      # CuPy: always
                target.data = data if writable and data.flags.c_contiguous else data.copy()
                versions.mark_written(target.data)
            else:
                target.copy_(array)          # on its device, in its dtype; counted as a write
        return IncompatibleKeys(missing, unexpected)

    @staticmethod
    def _npz_path(path) -> str:
        path = os.fspath(path)
        return path if path.endswith(".npz") else path + ".npz"

    def save(self, path) -> str:
        """Write ``state_dict()`` to an ``.npz`` file (".npz" is appended when missing); returns
        the path written. Plain arrays only, so loading never unpickles. Atomic
        (``backend.npz.write_npz``): a failure or a kill leaves the old file or the new one."""
        return backend.npz.write_npz(self._npz_path(path), self.state_dict())

    def load(self, path, strict: bool = True) -> IncompatibleKeys:
        """Read an ``.npz`` written by ``save`` and ``load_state_dict`` it (``read_npz``: every
        entry's header checked before its data is read; nothing is ever unpickled). A refused
        file changes nothing."""
        return self.load_state_dict(backend.read_npz(self._npz_path(path)), strict=strict)

    # ---- printing ---------------------------------------------------------------------------
    # ---- hook points (see hooks.py) ---------------------------------------------------------
    #: (regex, replacement) pairs turning module paths into the public hook names, applied in
    #: order by the module whose ``hook_names()`` is asked (models set TransformerLens's names).
    hook_renames: tuple = ()

    def hook_points(self) -> "OrderedDict[str, Module]":
        """{public name: HookPoint} for every hook point below this module, in forward order of
        registration; sets each point's ``name``."""
        points = OrderedDict()
        for path, m in self.named_modules():
            if getattr(m, "is_hook_point", False):
                name = path
                for pattern, repl in self.hook_renames:
                    name = re.sub(pattern, repl, name)
                m.name = name
                points[name] = m
        return points

    def hook_names(self) -> list:
        """The names of this module's hook points (``blocks.0.attn.hook_pattern``, …)."""
        return list(self.hook_points())

    def _resolve_hooks(self, name_or_predicate) -> list:
        points = self.hook_points()
        if callable(name_or_predicate):
            return [p for n, p in points.items() if name_or_predicate(n)]
        if name_or_predicate not in points:
            close = [n for n in points if str(name_or_predicate).split(".")[-1] in n][:5]
            raise KeyError(f"{type(self).__name__} has no hook point {name_or_predicate!r}"
                           + (f"; did you mean one of {close}?" if close else
                              "; see hook_names()"))
        return [points[name_or_predicate]]

    def add_hook(self, name_or_predicate, fn, dir: str = "fwd") -> list:
        """Set ``fn`` on the hook point so named (or every one whose name the predicate
        accepts); ``dir`` is "fwd" or "bwd". Returns the HookPoints touched."""
        targets = self._resolve_hooks(name_or_predicate)
        for hp in targets:
            hp.add_hook(fn, dir)
        return targets

    def reset_hooks(self) -> None:
        """Remove every hook from every hook point below this module."""
        for hp in self.hook_points().values():
            hp.remove_hooks()

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=()):
        """``with model.hooks(fwd_hooks=[(name or predicate, fn)], bwd_hooks=[...]):`` sets the
        hooks for the block and removes them on the way out, even on an exception (hooks set
        before the block stay)."""
        added = []
        try:
            for dir, pairs in (("fwd", fwd_hooks), ("bwd", bwd_hooks)):
                for name_or_predicate, fn in pairs:
                    for hp in self.add_hook(name_or_predicate, fn, dir):
                        added.append((hp, dir, fn))
            yield self
        finally:
            for hp, dir, fn in added:
                hooks = hp.fwd_hooks if dir == "fwd" else hp.bwd_hooks
                if fn in hooks:
                    hooks.remove(fn)

    def extra_repr(self) -> str:
        """The text inside ``Name(...)`` for this module's own settings (override in layers)."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        shown = [(n, c) for n, c in self._modules.items()    # hook points: listed by
                 if not getattr(c, "is_hook_point", False)]   # hook_names(), not here
        if not shown:
            return f"{type(self).__name__}({extra})"
        lines = [extra] if extra else []
        for name, child in shown:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {body}")
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


# ---- containers -------------------------------------------------------------------------------

def _norm_index(index: int, length: int, kind: str) -> int:
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise TypeError(f"{kind} indices must be int or slice, got {type(index).__name__}")
    index = int(index)
    if not -length <= index < length:
        raise IndexError(f"{kind} index {index} out of range for length {length}")
    return index % length


class Sequential(Module):
    """Modules applied one after another: ``forward(x) = m_n(...m_2(m_1(x)))``.

    ``Sequential(m1, m2, ...)`` names the members "0", "1", ...; ``Sequential(OrderedDict)``
    uses the dict's keys. Indexing (``seq[0]``, ``seq[-1]``, ``seq[1:]`` → a Sequential),
    ``len`` and iteration work like a list.
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index):
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return items[_norm_index(index, len(items), "Sequential")][1]

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(Module):
    """A list of Modules whose parameters are registered (a plain Python list's are not).

    Members are named "0", "1", ...; supports ``append``, ``extend``, ``insert``, indexing
    and slicing (a slice is a new ModuleList sharing the members), item assignment and
    deletion (names are renumbered), ``len`` and iteration. It has no ``forward``.
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _members(self) -> list:
        return list(self._modules.values())

    def _reset(self, members) -> None:
        self._modules.clear()
        for i, m in enumerate(members):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._members())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ModuleList(self._members()[index])
        return self._members()[_norm_index(index, len(self), "ModuleList")]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_norm_index(index, len(self), "ModuleList")), module)

    def __delitem__(self, index) -> None:
        members = self._members()
        if isinstance(index, slice):
            del members[index]
        else:
            del members[_norm_index(index, len(members), "ModuleList")]
        self._reset(members)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        members = self._members()
        members.insert(index, module)
        self._reset(members)


class ModuleDict(Module):
    """A dict of Modules whose parameters are registered, in insertion order.

    ``md["enc"] = Linear(2, 2)``, ``md["enc"]``, ``del md["enc"]``, ``"enc" in md``, ``len``,
    iteration over keys, ``keys()/values()/items()``, ``update`` and ``pop``.
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        if key not in self._modules:
            raise KeyError(f"ModuleDict has no key {key!r}; keys: {list(self._modules)}")
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        self[key]  # noqa: B018 - raises the readable KeyError
        del self._modules[key]

    def __contains__(self, key) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def keys(self):
        return list(self._modules.keys())

    def values(self):
        return list(self._modules.values())

    def items(self):
        return list(self._modules.items())

    def update(self, modules) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module
