"""Optimizers: SGD (momentum, Nesterov), Adam (+AMSGrad) and AdamW, with PyTorch's formulas.

An optimizer holds *param groups*: a list of dicts, each with its own ``"params"`` and
hyperparameters (``lr``, ``weight_decay``, ...); arguments not given in a group come from the
constructor's defaults::

    opt = Adam([{"params": model.encoder.parameters()},
                {"params": model.head.parameters(), "lr": 1e-4}], lr=1e-3)

``step()`` updates every parameter with a gradient, in place on its raw array ``p.data``
(arithmetic on raw arrays records no graph); parameters whose ``grad`` is None are skipped.
Per-parameter state (moment estimates, step counts) lives in ``opt.state[p]``.

Notation below: θ parameter, g its gradient, t the parameter's step count (1 for its first
update), η the learning rate, λ the weight decay.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

from .. import backend, configuration
from ..autograd.grad_mode import enable_grad
from ..autograd.tensor import Tensor
from ..autograd.versions import mark_written

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


def _check(cond: bool, opt: str, name: str, expected: str, value) -> None:
    if not cond:
        raise ValueError(f"{opt}: {name} must be {expected}, got {value!r}")


def _is_number(x) -> bool:
    # numbers.Real: Python and NumPy scalars alike (np.float32(1e-3) is a learning rate too).
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


class Optimizer:
    """Base class: param groups, ``zero_grad``, ``state_dict``/``load_state_dict``.

    Subclasses define ``_validate(group)`` (raise ValueError for bad hyperparameters) and
    ``_update(p, grad, state, group)`` (one parameter's in-place update on raw arrays).
    """

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.state: dict = {}           # Parameter → its state dict (keys are the objects)
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of Tensors or of "
                            "dicts, got a single Tensor (wrap it in a list)")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        """Add a dict with ``"params"`` and optional hyperparameters (others from defaults)."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"a param group must be a dict with a 'params' key, got {group!r}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__} can only optimize Tensors, got "
                                f"{type(p).__name__}")
            if p.dtype.kind != "f":
                raise TypeError(f"{type(self).__name__} can only optimize floating-point "
                                f"Tensors, got dtype {p.dtype}")
            if p._ctx is not None:
                raise ValueError(f"{type(self).__name__} can only optimize leaf tensors "
                                 "(parameters), got one computed by "
                                 f"{p._ctx.fn.__name__}: optimize the leaf it came from, or "
                                 ".detach().requires_grad_() a copy")
        ids = {id(p) for p in params}
        if len(ids) != len(params):
            raise ValueError("a param group contains the same parameter twice")
        # Identity, not ==: Tensor's == is elementwise.
        if any(id(q) in ids for g in self.param_groups for q in g["params"]):
            raise ValueError("some parameters appear in more than one param group")
        full = {**self.defaults, **group, "params": params}
        self._validate(full)
        self.param_groups.append(full)

    def _validate(self, group: dict) -> None:  # pragma: no cover - overridden
        pass

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self, closure: Callable[[], Tensor] | None = None):
        """Update every parameter that has a gradient. ``closure`` (optional) re-evaluates
        the model and returns the loss, which ``step`` returns."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        n = 0
        for group in self.param_groups:                  # check every gradient first, so a bad
            for p in group["params"]:                    # one leaves every parameter unchanged
                if p.grad is not None and tuple(p.grad.shape) != tuple(p.shape):
                    raise ValueError(f"{type(self).__name__}.step: parameter {n} has shape "
                                     f"{tuple(p.shape)} but its grad has shape "
                                     f"{tuple(p.grad.shape)}; nothing was updated")
                n += 1
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            self._update_group(params, group)
            for p in params:
                mark_written(p.data)      # a graph that saved p before this step now raises
        return loss

    def _update_group(self, params: list, group: dict) -> None:
        """Update ``params`` (a group's parameters that have a gradient): ``_update`` on each.
        Adam's fast twin may take some of them at once."""
        for p in params:
            self._update(p, p.grad.data, self.state.setdefault(p, {}), group)

    def _update(self, p: Tensor, grad, state: dict, group: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    # ---- serialisation ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"state": {index: {name: NumPy array or number}}, "param_groups": [...]}``, with
        parameters referred to by their position across groups (as in PyTorch)."""
        index = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = {
                        k: (backend.to_device(v, "cpu").copy() if hasattr(v, "shape") else v)
                        for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and state saved by ``state_dict`` (same group sizes).
        Arrays go to each parameter's device and dtype. Everything is checked before anything
        changes: a refused state dict leaves the optimizer as it was."""
        who = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{who}: expected a dict with keys 'state' and 'param_groups', got "
                             f"{got}")
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups)):
            raise ValueError(f"{who}: loaded optimizer state has groups of sizes "
                             f"{[len(s['params']) for s in saved]}, this optimizer has "
                             f"{[len(g['params']) for g in self.param_groups]}")
        by_index = {}
        for s, g in zip(saved, self.param_groups):
            by_index.update(zip(s["params"], g["params"]))
        new_state = {}
        for i, entry in state_dict["state"].items():
            p = by_index.get(i if isinstance(i, int) else None)
            if p is None:
                raise ValueError(f"{who}: state for parameter index {i!r}, but the param groups "
                                 f"list indices {sorted(by_index)}")
            for k, v in entry.items():
                if hasattr(v, "shape") and tuple(v.shape) not in ((), tuple(p.shape)):
                    raise ValueError(f"{who}: state {k!r} of parameter {i} has shape "
                                     f"{tuple(v.shape)}, the parameter has {tuple(p.shape)}")
            new_state[p] = entry
        for s, g in zip(saved, self.param_groups):          # hyperparameters checked too
            self._validate({**g, **{k: v for k, v in s.items() if k != "params"}})
        new_state = {p: {k: (backend.to_device(v, p.device).astype(p.dtype)
                             if hasattr(v, "shape") else v) for k, v in entry.items()}
                     for p, entry in new_state.items()}
        for s, g in zip(saved, self.param_groups):
            g.update({k: v for k, v in s.items() if k != "params"})
        self.state = new_state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines) + "\n)"


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (PyTorch's formulation).

        g ← g + λ θ                                     (weight decay, as an L2 term)
        b ← g                      at t = 1
        b ← μ b + (1 − τ) g        afterwards           (momentum μ, dampening τ)
        g ← g + μ b  if nesterov, else  g ← b
        θ ← θ − η g

    Nesterov needs μ > 0 and τ = 0 (Sutskever et al., 2013, in PyTorch's form).
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _validate(self, g: dict) -> None:
        _check(_is_number(g["lr"]) and g["lr"] >= 0, "SGD", "lr", "a number >= 0", g["lr"])
        _check(_is_number(g["momentum"]) and g["momentum"] >= 0, "SGD", "momentum",
               "a number >= 0", g["momentum"])
        _check(_is_number(g["dampening"]), "SGD", "dampening", "a number", g["dampening"])
        _check(_is_number(g["weight_decay"]) and g["weight_decay"] >= 0, "SGD", "weight_decay",
               "a number >= 0", g["weight_decay"])
        if g["nesterov"]:
            _check(g["momentum"] > 0 and g["dampening"] == 0, "SGD", "(momentum, dampening)",
                   "momentum > 0 and dampening == 0 for nesterov=True",
                   (g["momentum"], g["dampening"]))

    def _update(self, p, grad, state, group) -> None:
        lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
        if wd != 0:
            grad = grad + wd * p.data
        if mu != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= mu
                buf += (1.0 - group["dampening"]) * grad
            grad = grad + mu * buf if group["nesterov"] else buf
        p.data -= lr * grad


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with PyTorch's bias correction; AMSGrad optional.

        g ← g + λ θ                                     (L2 weight decay, folded into g)
        m ← β₁ m + (1 − β₁) g                           (first moment)
        v ← β₂ v + (1 − β₂) g²                          (second moment)
        v̂ ← max(v̂, v)  with amsgrad, else v̂ = v        (Reddi et al., 2018)
        θ ← θ − (η / (1 − β₁ᵗ)) · m / (√v̂ / √(1 − β₂ᵗ) + ε)

    Note ε is added after the bias correction of √v̂, as PyTorch does.
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad))

    def _validate(self, g: dict) -> None:
        name = type(self).__name__
        _check(_is_number(g["lr"]) and g["lr"] >= 0, name, "lr", "a number >= 0", g["lr"])
        _check(_is_number(g["eps"]) and g["eps"] >= 0, name, "eps", "a number >= 0", g["eps"])
        betas = g["betas"]
        _check(isinstance(betas, (tuple, list)) and len(betas) == 2, name, "betas",
               "a pair (beta1, beta2)", betas)
        for i, b in enumerate(betas):
            _check(_is_number(b) and 0.0 <= b < 1.0, name, f"betas[{i}]", "in [0, 1)", b)
        _check(_is_number(g["weight_decay"]) and g["weight_decay"] >= 0, name, "weight_decay",
               "a number >= 0", g["weight_decay"])

    def _update_group(self, params, group) -> None:
        """``_update`` on each parameter; the fast layer may update some of them (the small
        ones) at once (``minitx/fast/optim.py``: the same numbers) and leave the others."""
        fast = configuration.twin("adam")
        if fast is not None:
            left = fast([p.data for p in params], [p.grad.data for p in params],
                        [self.state.setdefault(p, {}) for p in params],
                        lr=group["lr"], betas=group["betas"], eps=group["eps"],
                        weight_decay=group["weight_decay"], decoupled=self._decoupled,
                        amsgrad=group["amsgrad"])
            params = [params[i] for i in left]
        super()._update_group(params, group)

    def _update(self, p, grad, state, group) -> None:
        xp = backend.get_array_module(p.data)
        lr, (beta1, beta2) = group["lr"], group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        fast = configuration.twin("adam_in_place")           # the same update, in place
        if fast is not None and fast(p.data, grad, state, lr=lr, betas=group["betas"], eps=eps,
                                     weight_decay=wd, decoupled=self._decoupled,
                                     amsgrad=group["amsgrad"]):
            return
        theta = p.data
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(theta)
            state["exp_avg_sq"] = xp.zeros_like(theta)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = xp.zeros_like(theta)
        state["step"] += 1
        t = state["step"]

        if wd != 0 and self._decoupled:
            theta *= 1.0 - lr * wd                            # AdamW: θ ← θ (1 − η λ)
        elif wd != 0:
            grad = grad + wd * theta                          # Adam: g ← g + λ θ
        # The moments are written into their arrays ([...] =), never replaced: the fast layer
        # may hold them as views of one buffer for the whole group.
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m[...] = beta1 * m + (1.0 - beta1) * grad             # m ← β₁ m + (1 − β₁) g
        v[...] = beta2 * v + (1.0 - beta2) * grad * grad      # v ← β₂ v + (1 − β₂) g²
        if group["amsgrad"]:
            v_max = state["max_exp_avg_sq"]
            v_max[...] = xp.maximum(v_max, v)                 # v̂ ← max(v̂, v)
            v = v_max
        bias_correction1 = 1.0 - beta1 ** t
        bias_correction2 = 1.0 - beta2 ** t
        denom = xp.sqrt(v) / math.sqrt(bias_correction2) + eps     # √v̂ / √(1 − β₂ᵗ) + ε
        theta -= (lr / bias_correction1) * (m / denom)        # θ ← θ − η/(1 − β₁ᵗ) · m / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019):

        θ ← θ (1 − η λ)      before the Adam step, instead of adding λθ to the gradient,

    so the decay is not rescaled by the adaptive denominator. Default λ = 1e-2 (PyTorch's).
    """

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)
