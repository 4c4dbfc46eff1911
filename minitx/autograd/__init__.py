"""The autograd engine: Tensor, Function, the backward engine, no_grad, gradcheck, checkpoint,
and two debugging aids: anomaly mode and saved-array version checks.

The course reads ``function.py``, ``engine.py`` and ``tensor.py``; what a first reading skips is
in ``checks.py`` (the engine's checks and errors), ``devices.py`` (dtype and device rules, the
array protocols), ``inplace.py`` (in-place writes), ``spellings.py`` (PyTorch's names),
``versions.py`` and ``anomaly.py`` (the debugging aids)."""
# tensor before function and engine: it binds the engine and the ops at its end (they import
# Tensor from it)
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .tensor import Tensor, tensor
from .function import Context, Function
from .engine import backward, topological_order
from .gradcheck import GradcheckError, gradcheck
from .checkpoint import checkpoint
from .anomaly import AnomalyError, detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .versions import SavedArrayModified
from .factories import (arange, full, full_like, ones, ones_like, rand, randint, randn,
                        randn_like, zeros, zeros_like)

# minitx/__init__.py re-exports most of these at the top level (minitx.tensor, minitx.no_grad)
__all__ = ["Tensor", "tensor", "Function", "Context", "backward", "topological_order",
           "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled", "gradcheck",
           "GradcheckError", "checkpoint", "detect_anomaly", "set_detect_anomaly",
           "is_anomaly_enabled", "AnomalyError", "SavedArrayModified", "zeros", "ones", "full",
           "rand", "randn", "randint", "arange", "zeros_like", "ones_like", "full_like",
           "randn_like"]
