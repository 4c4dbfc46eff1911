"""``minitx.optim.lr_scheduler``: PyTorch's module path to the learning-rate schedules
(``torch.optim.lr_scheduler.LambdaLR`` …). The classes and their formulas are in
``schedules.py``; PyTorch's protocol holds: construct after the optimizer, call
``sched.step()`` after ``opt.step()``, read ``get_last_lr()`` and ``last_epoch``.
"""
from .schedules import CosineAnnealingLR, LambdaLR, LRScheduler, StepLR

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR"]


def __getattr__(name):
    """PyTorch's other schedulers (``OneCycleLR``, ``ReduceLROnPlateau`` …) are not here: the
    error names what is, and that ``LambdaLR`` writes any schedule of the step."""
    raise AttributeError(
        f"module 'minitx.optim.lr_scheduler' has no attribute {name!r}; its schedulers are "
        f"{', '.join(__all__[1:])} (and minitx.optim.warmup_cosine, inverse_sqrt_warmup); any "
        "schedule of the step is LambdaLR(optimizer, lambda step: factor)")
