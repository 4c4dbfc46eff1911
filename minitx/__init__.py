"""minitx: attention and transformers from scratch, on NumPy (or CuPy), with proven gradients.

    import minitx
    import minitx.functional as F

    x = minitx.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    F.softmax(x).sum().backward()

``minitx.config.fast`` (default True; ``MINITX_FAST=0``, ``using_config(fast=False)``) switches
the fast layer (``minitx/fast/``) on and off; the reference maths is the same either way.

PyTorch's spellings work too: ``minitx.randn(2, 3, requires_grad=True)``, ``t.size()``,
``t.float()``, ``F.softmax(t, dim=-1)``, ``t.sum(dim=0, keepdim=True)``, ``minitx.randint``,
``minitx.stack``, ``minitx.tril``, ``minitx.float32`` (NumPy's dtypes under PyTorch's names),
``minitx.save(model.state_dict(), path)`` / ``minitx.load(path)`` (plain arrays in an
``.npz``, never pickled), ``import minitx.nn.functional as F``. A PyTorch name minitx does
without (``minitx.bfloat16``, ``minitx.cuda``) says what to use instead.
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
from .autograd import (arange, full, full_like, ones, ones_like, rand, randint,  # PyTorch's
                       randn, randn_like, zeros, zeros_like)                     # factories
from .backend.dtypes import *  # noqa: F401,F403 - PyTorch's dtype names (minitx.float32, ...)
from .backend.npz import load, save              # torch.save / torch.load of a state dict
from . import ops
from . import functional
from .ops.shape import cat                      # PyTorch's torch.cat (= functional.concatenate)
from .ops.shape import stack, tril, triu         # and torch.stack, torch.tril, torch.triu

_SUBPACKAGES = ("nn", "optim", "attention", "models", "pretrained", "interop", "data", "viz",
                "validate")


# training checkpoints (minitx/checkpoints.py, built on the models' layer: imported on use)
_CHECKPOINTS = ("save_checkpoint", "load_checkpoint")


# PyTorch names minitx does without, and what to use instead
_INSTEAD = {
    "bfloat16": "NumPy has no bfloat16; use minitx.float16 (or float32)",
    "cuda": "minitx.gpu_available() says whether a GPU is usable and "
            "minitx.set_backend('cupy') runs on it (t.cuda() moves one tensor there)",
    "device": "devices are the strings 'cpu' and 'cuda' (t.to('cuda'), module.to('cuda'))",
    "compile": "minitx runs its code as written; its speed-ups are the fast layer "
               "(minitx.config.fast)",
    "from_numpy": "minitx.tensor(array)",
}


def __getattr__(name):
    """Import the larger subpackages on first use (``minitx.nn``, ``minitx.attention``, ...),
    and ``minitx.save_checkpoint`` / ``load_checkpoint`` from ``minitx.checkpoints``; a PyTorch
    name minitx does without raises an ``AttributeError`` naming what to use instead."""
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name in _CHECKPOINTS:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.checkpoints"), name)
    if name in _INSTEAD:
        raise AttributeError(f"module 'minitx' has no attribute {name!r} (PyTorch's "
                             f"torch.{name}): {_INSTEAD[name]}")
    raise AttributeError(f"module 'minitx' has no attribute {name!r}")


__all__ = ["__version__", "Tensor", "tensor", "Function", "no_grad", "enable_grad",
           "is_grad_enabled", "set_grad_enabled", "gradcheck", "checkpoint", "manual_seed",
           "set_backend", "get_backend", "get_array_module", "gpu_available", "functional",
           "backend", "ops", "zeros", "ones", "full", "rand", "randn", "arange", "zeros_like",
           "ones_like", "full_like", "randn_like", "randint", "cat", "stack", "tril", "triu",
           "save", "load",
           "config", "using_config", "configuration", "fast", "save_checkpoint",
           "load_checkpoint"]
