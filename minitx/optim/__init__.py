"""``minitx.optim``: optimizers, learning-rate schedules and gradient clipping.

    from minitx import optim

    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = optim.warmup_cosine(opt, warmup_steps=100, total_steps=2000)
    # or PyTorch's: optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2000)
    ...
    loss.backward()
    optim.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step(); opt.zero_grad(); sched.step()
"""
from .optimizers import *  # noqa: F401,F403
from .schedules import *  # noqa: F401,F403
from .clip import *  # noqa: F401,F403
from . import lr_scheduler  # noqa: F401 - PyTorch's torch.optim.lr_scheduler
from .optimizers import __all__ as _optimizers_all
from .schedules import __all__ as _schedules_all
from .clip import __all__ as _clip_all

__all__ = ["lr_scheduler", *_optimizers_all, *_schedules_all, *_clip_all]
