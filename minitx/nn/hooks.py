"""Hook points: named places in a model where an activation can be read, replaced or its
gradient watched — the machinery behind ``run_with_cache`` and activation patching.

A ``HookPoint`` is an identity module placed where a model computes an activation worth a
name (TransformerLens's idea, Nanda & Bloom 2022)::

    self.hook_resid_pre = HookPoint()
    ...
    x = self.hook_resid_pre(x)          # y = x, unless a hook is set

A **forward hook** is ``fn(activation, hook) -> new activation or None``: it sees the
activation (a minitx Tensor) and ``hook`` (the HookPoint, whose ``name`` is the dotted name
the model gave it); returning a Tensor replaces the activation downstream, returning None
keeps it. A **backward hook** has the same signature but receives dL/d(activation) during
``backward`` (a Tensor, no graph) and may return a replacement gradient; the backward hooks
that were set when the forward ran are the ones called, so ``run_with_hooks(...,
bwd_hooks=...)`` followed by ``loss.backward()`` calls them although the context has ended.

When no hook is set a HookPoint returns its input object itself: a model with hook points
runs the same ops as one without (the cost is one Python call per point). Modules that can
take a cheaper fused path (``LayerNorm``, ``MultiheadAttention``) take it unless one of their
hook points is ``active``.

Setting and removing hooks, and listing the names, is shared by every Module
(``Module.hook_names``, ``add_hook``, ``reset_hooks``, the ``hooks(...)`` context manager in
``module.py``); ``HookedModel`` adds ``run_with_hooks`` / ``run_with_cache`` for models.
"""
from __future__ import annotations

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from .module import Module

__all__ = ["HookPoint", "ActivationCache", "HookedModel", "act_name"]


def _check_replacement(out, like: Tensor, hook: "HookPoint", what: str):
    """A hook's return value: None (keep) or a Tensor of the activation's shape."""
    if out is None:
        return None
    if not isinstance(out, Tensor):
        raise TypeError(f"{what} hook on {hook.name!r} must return a minitx Tensor or None, "
                        f"got {type(out).__name__}")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"{what} hook on {hook.name!r} must keep the shape "
                         f"{tuple(like.shape)}, got {tuple(out.shape)}")
    return out


class _GradHook(Function):
    """y = x; dL/dx = the backward hooks applied in turn to dL/dy."""

    @staticmethod
    def forward(ctx, x, *, hook):
        ctx.hook, ctx.fns = hook, tuple(hook.bwd_hooks)   # the hooks set at forward time
        return x

    @staticmethod
    def backward(ctx, grad):
        hook = ctx.hook
        g = Tensor(grad)
        for fn in ctx.fns:
            out = _check_replacement(fn(g, hook), g, hook, "backward")
            if out is not None:
                g = out
        return g.data


class HookPoint(Module):
    """y = x, with optional forward and backward hooks (see the module docstring).

    Attributes: ``name`` (the dotted name, set when a model lists its hook points),
    ``fwd_hooks`` and ``bwd_hooks`` (lists of functions), ``active`` (any hook set).
    """

    is_hook_point = True

    def __init__(self):
        super().__init__()
        self.name = None
        self.fwd_hooks = []
        self.bwd_hooks = []

    @property
    def active(self) -> bool:
        return bool(self.fwd_hooks or self.bwd_hooks)

    # A forward hook fn(x, hook) may return a replacement for x, a backward hook fn(grad, hook)
    # one for the gradient; returning None keeps the value.
    def add_hook(self, fn, dir: str = "fwd") -> None:
        if not callable(fn):
            raise TypeError(f"HookPoint.add_hook: fn must be callable, got {type(fn).__name__}")
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"HookPoint.add_hook: dir must be 'fwd' or 'bwd', got {dir!r}")
        (self.fwd_hooks if dir == "fwd" else self.bwd_hooks).append(fn)

    def remove_hooks(self, dir: str = "both") -> None:
        if dir in ("fwd", "both"):
            self.fwd_hooks = []
        if dir in ("bwd", "both"):
            self.bwd_hooks = []

    # With no hook set the point is the identity and adds no graph node; a backward hook wraps x
    # in a node (_GradHook) whose backward runs the hooks on the gradient.
    def forward(self, x):
        if not (self.fwd_hooks or self.bwd_hooks):
            return x                                     # the zero-cost path
        for fn in self.fwd_hooks:
            out = _check_replacement(fn(x, self), x, self, "forward")
            if out is not None:
                x = out
        if self.bwd_hooks and x.requires_grad:
            x = _GradHook.apply(x, hook=self)
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


# ---- names and the cache ----------------------------------------------------------------------

_ATTN = {"q", "k", "v", "z", "attn_scores", "pattern", "result"}
_MLP = {"pre", "post"}
_LN = {"scale", "normalized"}


def act_name(name: str, layer: int = None, sub: str = None) -> str:
    """TransformerLens's shorthand → full hook name (``get_act_name``)::

        act_name("pattern", 0)          # 'blocks.0.attn.hook_pattern'
        act_name("resid_pre", 2)        # 'blocks.2.hook_resid_pre'
        act_name("pre", 1)              # 'blocks.1.mlp.hook_pre'
        act_name("scale", 0, "ln1")     # 'blocks.0.ln1.hook_scale'
        act_name("normalized", None, "ln_final")   # 'ln_final.hook_normalized'
        act_name("embed")               # 'hook_embed'
    """
    if not isinstance(name, str):
        raise TypeError(f"act_name: name must be a str, got {type(name).__name__}")
    if name.startswith("hook_") or "." in name:
        return name
    if name in _LN:
        if sub is None:
            raise ValueError(f"act_name: {name!r} needs the LayerNorm (sub='ln1', 'ln2' or "
                             "'ln_final')")
        return f"{sub}.hook_{name}" if layer is None else f"blocks.{layer}.{sub}.hook_{name}"
    if layer is None:
        return f"hook_{name}"
    where = "attn." if name in _ATTN else "mlp." if name in _MLP else ""
    return f"blocks.{layer}.{where}hook_{name}"


class ActivationCache(dict):
    """{hook name: Tensor} from ``run_with_cache``, also indexed by TransformerLens's
    shorthand: ``cache["pattern", 0]`` is ``cache["blocks.0.attn.hook_pattern"]``,
    ``cache["scale", 0, "ln1"]`` is ``cache["blocks.0.ln1.hook_scale"]`` (see ``act_name``).
    """

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key = act_name(*key)
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            raise KeyError(f"{key!r} is not in the cache; cached names: "
                           f"{sorted(self)[:8]}{' …' if len(self) > 8 else ''}") from None

    def __contains__(self, key):
        return dict.__contains__(self, act_name(*key) if isinstance(key, tuple) else key)


def _logits_of(out):
    """Models return logits or (logits, loss): the logits."""
    return out[0] if isinstance(out, tuple) else out


class HookedModel:
    """Mixin for models: ``run_with_hooks`` and ``run_with_cache`` over their hook points.

    ``forward`` may return logits or ``(logits, loss)``; both methods return the logits.
    """

    def run_with_hooks(self, *args, fwd_hooks=(), bwd_hooks=(), **kwargs):
        """Run ``self(*args, **kwargs)`` with the hooks set; they are removed afterwards,
        even on an exception. ``fwd_hooks``/``bwd_hooks``: [(name or predicate, fn)]."""
        with self.hooks(fwd_hooks, bwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names_filter=None, incl_bwd: bool = False, metric=None,
                       detach: bool = True, **kwargs):
        """``(logits, cache)``: run the model and keep every activation (or those whose name
        ``names_filter`` accepts: a name, a list of names, or a predicate).

        Cached values are detached (no graph kept alive) unless ``detach=False``. With
        ``incl_bwd=True``, ``metric(logits)`` must give a scalar Tensor; its backward stores
        under ``name + "_grad"`` d metric / d activation for every cached activation (that
        backward also accumulates the parameters' ``.grad``: ``zero_grad()`` before training).
        """
        names = self._filtered_names(names_filter)
        if incl_bwd and metric is None:
            raise ValueError("run_with_cache: incl_bwd=True needs metric, a function from the "
                             "logits to a scalar Tensor")
        # Caching is a forward hook at every chosen point that stores x (and, with incl_bwd, a
        # backward hook that stores the gradient arriving there).
        cache = ActivationCache()

        def keep(x, hook):
            cache[hook.name] = x.detach() if detach else x

        def keep_grad(g, hook):
            cache[hook.name + "_grad"] = g.detach()

        fwd = [(n, keep) for n in names]
        bwd = [(n, keep_grad) for n in names] if incl_bwd else []
        # The hooks are set for this run only; with incl_bwd the metric's backward fills the
        # "_grad" entries.
        with self.hooks(fwd, bwd):
            logits = _logits_of(self(*args, **kwargs))
            if incl_bwd:
                value = metric(logits)
                if not isinstance(value, Tensor) or value.size != 1:
                    raise ValueError("run_with_cache: metric must return a scalar Tensor, got "
                                     f"{type(value).__name__} "
                                     f"{getattr(value, 'shape', '')}")
                value.backward()
        if detach:
            logits = logits.detach()
        return logits, cache

    # names_filter: None (every hook point), a name, a list of names (each must exist) or a
    # predicate on names.
    def _filtered_names(self, names_filter):
        names = self.hook_names()
        if names_filter is None:
            return names
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            return [n for n in names if names_filter(n)]
        wanted = list(names_filter)
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise KeyError(f"run_with_cache: names_filter names unknown hook points {unknown}")
        return wanted

