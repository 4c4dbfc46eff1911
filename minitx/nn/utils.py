"""``minitx.nn.utils``: PyTorch's path to gradient clipping (``torch.nn.utils.clip_grad_norm_``).

The functions are ``minitx.optim``'s (``optim/clip.py``, where their maths is stated), offered
here under PyTorch's module path: ``nn.utils.clip_grad_norm_ is optim.clip_grad_norm_``.
"""
from ..optim.clip import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_"]
