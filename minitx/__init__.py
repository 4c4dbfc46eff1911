"""minitx: attention and transformers from scratch, on NumPy (or CuPy), with proven gradients.

    import minitx
    import minitx.functional as F

    x = minitx.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    F.softmax(x).sum().backward()

PyTorch's spellings work too: ``minitx.randn(2, 3, requires_grad=True)``, ``t.size()``,
``t.float()``, ``F.softmax(t, dim=-1)``, ``t.sum(dim=0, keepdim=True)``.
"""
__version__ = "0.1.0"

import os as _os
import sys as _sys

# NumPy's OpenBLAS keeps each idle worker thread spinning for 2**28 cycles (about 0.1 s) after
# every matmul. The spinning thread takes a core from the element-wise passes that follow and
# from attention's worker threads (ops/parallel.py). 2**20 cycles (about 0.4 ms) instead: the
# threads are still awake for the next of a run of small matmuls, and asleep during a longer
# element-wise stretch. Measured on 2 cores, with 2**28 / 2**4 / 2**20: TransformerEncoderLayer
# (B = 4, T = 256, E = 256) forward + backward 55 / 42 / 40 ms; 300 steps of the seq2seq
# example 7.2 / 7.6 / 6.0 s. OpenBLAS reads this once, when NumPy loads it, so it only takes
# effect when minitx is imported before NumPy (the CLI, the examples and the benchmarks do);
# a value the user set is kept.
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import backend
from .backend import (get_array_module, get_backend, gpu_available, manual_seed,
                      set_backend)
from .autograd import (Function, Tensor, checkpoint, enable_grad, gradcheck,
                       is_grad_enabled, no_grad, set_grad_enabled, tensor)
from .autograd import (arange, full, full_like, ones, ones_like, rand, randn,  # PyTorch's
                       randn_like, zeros, zeros_like)                          # factories
from . import ops
from . import functional

_SUBPACKAGES = ("nn", "optim", "attention", "models", "pretrained", "interop", "data", "viz",
                "validate")


def __getattr__(name):
    """Import the larger subpackages on first use (``minitx.nn``, ``minitx.attention``, ...)."""
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'minitx' has no attribute {name!r}")


__all__ = ["__version__", "Tensor", "tensor", "Function", "no_grad", "enable_grad",
           "is_grad_enabled", "set_grad_enabled", "gradcheck", "checkpoint", "manual_seed",
           "set_backend", "get_backend", "get_array_module", "gpu_available", "functional",
           "backend", "ops", "zeros", "ones", "full", "rand", "randn", "arange", "zeros_like",
           "ones_like", "full_like", "randn_like"]
