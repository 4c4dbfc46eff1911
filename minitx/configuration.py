"""One switch between minitx's two layers: the reference maths and its fast twins.

Every op in the course is written in its reference form: the maths, plainly. Some have a *fast
twin* in ``minitx/fast/`` that computes the same thing faster on the CPU (blocks sized for the
cache, threads over heads, a softmax without its shift when no score can overflow, …). One
switch, in Chainer's manner, chooses between them::

    minitx.config.fast                      # True unless MINITX_FAST=0 was set at import
    with minitx.using_config(fast=False):   # every op takes its reference form in here
        out = F.scaled_dot_product_attention(q, k, v)
    minitx.config.fast = False              # or for the rest of the process

The fast layer registers each twin here, under the name of the reference it stands in for
(``register_twin``); an op asks for it at its one dispatch point, at call time (``twin``), and
``why_not_fast(name)`` says why the reference runs. With the switch off no code under
``minitx/fast/`` runs. The setting is one per process, not per thread: attention's worker
threads must see the choice of the thread that called the op.

This module imports nothing from minitx but ``validate``: any layer may read the switch.
"""
from __future__ import annotations

import contextlib
import os

from . import validate

__all__ = ["config", "using_config", "register_twin", "twin", "twins", "why_not_fast",
           "without_twins", "fast_from_env"]


def fast_from_env(value=None) -> bool:
    """``MINITX_FAST`` as a bool: unset, "" or "1" → True, "0" → False; anything else raises."""
    value = os.environ.get("MINITX_FAST", "1") if value is None else value
    value = value.strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"MINITX_FAST must be 0 (the reference code only) or 1 (the fast "
                         f"layer on), got {value!r}")
    return value == "1"


class Config:
    """minitx's settings (one: ``fast``). Assigning a setting checks its value; an unknown
    name is refused, naming the settings there are."""

    __slots__ = ("fast",)

    def __setattr__(self, name, value):
        if name not in Config.__slots__:
            raise AttributeError(f"minitx.config has no setting {name!r} (settings: "
                                 f"{', '.join(Config.__slots__)})")
        object.__setattr__(self, name, validate.boolean(value, name, owner="minitx.config"))

    def __repr__(self) -> str:
        return f"minitx.config(fast={self.fast})"


config = Config()
config.fast = fast_from_env()


@contextlib.contextmanager
def using_config(**settings):
    """Change settings for the ``with`` block and restore them after it, even on an error:
    ``with minitx.using_config(fast=False): …``. Every name and value is checked before any
    is changed."""
    checked = {}
    for name, value in settings.items():
        if name not in Config.__slots__:
            raise AttributeError(f"using_config: minitx.config has no setting {name!r} "
                                 f"(settings: {', '.join(Config.__slots__)})")
        checked[name] = validate.boolean(value, name, owner="using_config")
    before = {name: getattr(config, name) for name in checked}
    try:
        for name, value in checked.items():
            setattr(config, name, value)
        yield config
    finally:
        for name, value in before.items():
            setattr(config, name, value)


_TWINS = {}        # reference name -> its fast twin


def register_twin(name: str, function):
    """Make ``function`` the fast twin of the reference called ``name`` (done by
    ``minitx/fast/`` at import). Returns ``function``, so it also works as a decorator."""
    if name in _TWINS and _TWINS[name] is not function:
        raise ValueError(f"register_twin: {name!r} already has a fast twin "
                         f"({_TWINS[name].__module__}.{_TWINS[name].__qualname__})")
    _TWINS[name] = function
    return function


def twin(name: str):
    """The fast twin of ``name`` when the fast layer is on and has one, else None (then the
    caller runs its reference). Read at every call: the switch may change between calls."""
    return _TWINS.get(name) if config.fast else None


def twins() -> dict:
    """Every registered twin: {reference name: fast function} (a copy)."""
    return dict(_TWINS)


@contextlib.contextmanager
def without_twins(*names):
    """Run the references of ``names`` only, inside the ``with`` block, the rest of the fast
    layer staying on: what one trick buys is the time with it minus the time without it
    (``benchmarks/cpu_vs_torch.py --tricks``). Unknown names are refused."""
    unknown = [n for n in names if n not in _TWINS]
    if unknown:
        raise KeyError(f"without_twins: no fast twin named {', '.join(map(repr, unknown))} "
                       f"(twins: {', '.join(sorted(_TWINS))})")
    saved = {n: _TWINS.pop(n) for n in names}
    try:
        yield
    finally:
        _TWINS.update(saved)


def why_not_fast(name: str):
    """None when ``name`` runs its fast twin, else why its reference runs (a short sentence)."""
    if name not in _TWINS:
        return f"{name!r} has no fast twin"
    if not config.fast:
        return "minitx.config.fast is False (MINITX_FAST=0 or using_config(fast=False))"
    return None
