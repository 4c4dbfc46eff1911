"""``minitx.optim.lr_scheduler``: PyTorch's module path to the learning-rate schedules
(``torch.optim.lr_scheduler.LambdaLR`` …). The classes and their formulas are in
``schedules.py``; PyTorch's protocol holds: construct after the optimizer, call
``sched.step()`` after ``opt.step()``, read ``get_last_lr()`` and ``last_epoch``.
"""
from .schedules import CosineAnnealingLR, LambdaLR, LRScheduler, StepLR

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR"]
