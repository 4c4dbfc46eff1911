"""Learning-rate schedules: set each param group's ``lr`` as a function of the step count.

Usage (PyTorch's protocol)::

    sched = warmup_cosine(opt, warmup_steps=100, total_steps=1000)
    for batch in data:
        loss.backward(); opt.step(); opt.zero_grad()
        sched.step()

Constructing a scheduler sets the lr for step s = 0 (the first optimizer step); each
``sched.step()`` advances s by one and sets the lr for the next optimizer step. ``s`` is
stored as ``last_epoch`` (PyTorch's name), ``base_lrs`` are the groups' lrs at construction.

Schedules (b = base lr, w = warmup_steps, T = total_steps, s = step):

    warmup_cosine:        b · s / w                                              s < w
                          min_lr + (b − min_lr) · ½ (1 + cos(π (s − w)/(T − w)))  w ≤ s ≤ T
                          min_lr                                                 s > T
    inverse_sqrt_warmup:  factor · d_model^(−½) · min(n^(−½), n · w^(−3/2)),  n = s + 1
                          (Vaswani et al., 2017, §5.3; n counts steps from 1 as in the paper;
                          the lr rises linearly for w steps, peaks at n = w, then decays as
                          1/√n. It ignores the optimizer's lr.)
    LambdaLR:             b · lr_lambda(s)
    StepLR:               b · γ^⌊s / step_size⌋
    CosineAnnealingLR:    η_min + (b − η_min) · ½ (1 + cos(π s / T_max))
                          (PyTorch's closed form; past T_max the cosine rises again, as there)

``minitx.optim.lr_scheduler`` offers ``LambdaLR``, ``StepLR`` and ``CosineAnnealingLR`` under
PyTorch's module path (``torch.optim.lr_scheduler``).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from .. import validate
from .optimizers import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR", "WarmupCosine",
           "InverseSqrtWarmup", "warmup_cosine", "inverse_sqrt_warmup"]


def _require_optimizer(optimizer, sched: str) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{sched} expects a minitx.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")


class LRScheduler:
    """Base class: subclasses define ``lr_at(step, base_lr)``; ``step()`` applies it."""

    def __init__(self, optimizer: Optimizer):
        _require_optimizer(optimizer, type(self).__name__)
        self.optimizer = optimizer
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()

    def lr_at(self, step: int, base_lr: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """The lrs for the current step ``last_epoch``, one per param group."""
        return [self.lr_at(self.last_epoch, base) for base in self.base_lrs]

    def step(self) -> None:
        """Advance one step and write the new lr into every param group."""
        self.last_epoch += 1
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The lrs set by the latest ``step()`` (or the constructor), one per param group."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        """Resume: restore the step count and base lrs, and set the lrs for that step."""
        self.last_epoch, self.base_lrs = int(state["last_epoch"]), list(state["base_lrs"])
        self.last_epoch -= 1
        self.step()


class LambdaLR(LRScheduler):
    """lr = base_lr · lr_lambda(step); ``lr_lambda`` is one callable or one per param group."""

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]]):
        _require_optimizer(optimizer, "LambdaLR")
        n = len(optimizer.param_groups)
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * n
        else:
            self.lr_lambdas = list(lr_lambda)
            if len(self.lr_lambdas) != n or not all(callable(f) for f in self.lr_lambdas):
                raise ValueError(f"LambdaLR: lr_lambda must be a callable or a list of {n} "
                                 f"callables (one per param group), got {lr_lambda!r}")
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """base_lr · factor per group; a factor that is not a finite number >= 0 (a NaN, a
        negative value, a string) is refused before any group's lr changes."""
        factors = [validate.nonnegative_real(f(self.last_epoch), f"lr_lambda({self.last_epoch})",
                                             owner="LambdaLR") for f in self.lr_lambdas]
        return [base * factor for base, factor in zip(self.base_lrs, factors)]


class StepLR(LRScheduler):
    """PyTorch's ``StepLR(optimizer, step_size, gamma=0.1)``: the lr times ``gamma`` every
    ``step_size`` steps (formula in the module docstring)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size = validate.integer(step_size, "step_size", minimum=1, owner="StepLR")
        self.gamma = validate.nonnegative_real(gamma, "gamma", owner="StepLR")
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """PyTorch's ``CosineAnnealingLR(optimizer, T_max, eta_min=0.0)``: a half cosine from the
    base lr down to ``eta_min`` over ``T_max`` steps (formula in the module docstring; no
    warm-up: ``warmup_cosine`` has one)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):  # noqa: N803
        self.T_max = validate.integer(T_max, "T_max", minimum=1, owner="CosineAnnealingLR")
        self.eta_min = validate.nonnegative_real(eta_min, "eta_min", owner="CosineAnnealingLR")
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * step / self.T_max))
        return self.eta_min + (base_lr - self.eta_min) * cosine


class WarmupCosine(LRScheduler):
    """Linear warm-up from 0 to the base lr over ``warmup_steps`` steps, then a half cosine
    down to ``min_lr`` at ``total_steps``, then ``min_lr`` (formula in the module docstring)."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 min_lr: float = 0.0):
        who = "warmup_cosine"
        self.warmup_steps = validate.integer(warmup_steps, "warmup_steps", minimum=0, owner=who)
        self.total_steps = validate.integer(total_steps, "total_steps",
                                            minimum=self.warmup_steps + 1, owner=who)
        min_lr = validate.nonnegative_real(min_lr, "min_lr", owner=who)
        self.min_lr = float(min_lr)
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float) -> float:
        w, total = self.warmup_steps, self.total_steps
        if step < w:
            return base_lr * step / w
        if step > total:
            return self.min_lr
        progress = (step - w) / (total - w)
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


class InverseSqrtWarmup(LRScheduler):
    """The original Transformer schedule (Vaswani et al., 2017):
    lr = factor · d_model^(−½) · min(n^(−½), n · warmup^(−3/2)) with n = step + 1."""

    def __init__(self, optimizer: Optimizer, d_model: int, warmup_steps: int,
                 factor: float = 1.0):
        who = "inverse_sqrt_warmup"
        self.d_model = validate.integer(d_model, "d_model", minimum=1, owner=who)
        self.warmup_steps = validate.integer(warmup_steps, "warmup_steps", minimum=1, owner=who)
        self.factor = validate.positive_real(factor, "factor", owner=who)
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float) -> float:
        n = step + 1
        return self.factor * self.d_model ** -0.5 * min(n ** -0.5, n * self.warmup_steps ** -1.5)


def warmup_cosine(optimizer: Optimizer, warmup_steps: int, total_steps: int,
                  min_lr: float = 0.0) -> WarmupCosine:
    """Linear warm-up then cosine decay to ``min_lr`` (see ``WarmupCosine``)."""
    return WarmupCosine(optimizer, warmup_steps, total_steps, min_lr)


def inverse_sqrt_warmup(optimizer: Optimizer, d_model: int, warmup_steps: int,
                        factor: float = 1.0) -> InverseSqrtWarmup:
    """The "Noam" schedule of "Attention Is All You Need" (see ``InverseSqrtWarmup``)."""
    return InverseSqrtWarmup(optimizer, d_model, warmup_steps, factor)
