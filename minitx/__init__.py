"""minitx: attention and transformers from scratch, on NumPy (or CuPy), with proven gradients.

    import minitx
    import minitx.functional as F

    x = minitx.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    F.softmax(x).sum().backward()

``minitx.config.fast`` (default True; ``MINITX_FAST=0``, ``using_config(fast=False)``) switches
the fast layer (``minitx/fast/``) on and off; the reference maths is the same either way.

PyTorch's spellings work too: ``minitx.randn(2, 3, requires_grad=True)``, ``t.size()``,
``t.float()``, ``F.softmax(t, dim=-1)``, ``t.sum(dim=0, keepdim=True)``.
"""
__version__ = "0.1.0"

from . import configuration
from .configuration import config, using_config
# The fast layer first: its set-up (OpenBLAS's thread timeout, minitx/fast/host.py) must come
# before NumPy loads; importing it registers every fast twin (minitx/fast/__init__.py).
from . import fast
from . import backend
from .backend import (get_array_module, get_backend, gpu_available, manual_seed,
                      set_backend)
from .autograd import (Function, Tensor, checkpoint, enable_grad, gradcheck,
                       is_grad_enabled, no_grad, set_grad_enabled, tensor)
from .autograd import (arange, full, full_like, ones, ones_like, rand, randn,  # PyTorch's
                       randn_like, zeros, zeros_like)                          # factories
from . import ops
from . import functional
from .ops.shape import cat                      # PyTorch's torch.cat (= functional.concatenate)

_SUBPACKAGES = ("nn", "optim", "attention", "models", "pretrained", "interop", "data", "viz",
                "validate")


# training checkpoints (minitx/checkpoints.py, built on the models' layer: imported on use)
_CHECKPOINTS = ("save_checkpoint", "load_checkpoint")


def __getattr__(name):
    """Import the larger subpackages on first use (``minitx.nn``, ``minitx.attention``, ...),
    and ``minitx.save_checkpoint`` / ``load_checkpoint`` from ``minitx.checkpoints``."""
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name in _CHECKPOINTS:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.checkpoints"), name)
    raise AttributeError(f"module 'minitx' has no attribute {name!r}")


__all__ = ["__version__", "Tensor", "tensor", "Function", "no_grad", "enable_grad",
           "is_grad_enabled", "set_grad_enabled", "gradcheck", "checkpoint", "manual_seed",
           "set_backend", "get_backend", "get_array_module", "gpu_available", "functional",
           "backend", "ops", "zeros", "ones", "full", "rand", "randn", "arange", "zeros_like",
           "ones_like", "full_like", "randn_like", "cat",
           "config", "using_config", "configuration", "fast", "save_checkpoint",
           "load_checkpoint"]
