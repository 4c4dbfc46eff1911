"""The autograd engine: Tensor, Function, the backward engine, no_grad, gradcheck, checkpoint."""
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .tensor import Tensor, tensor
from .function import Context, Function
from .engine import backward, topological_order
from .gradcheck import GradcheckError, gradcheck
from .checkpoint import checkpoint
from .factories import (arange, full, full_like, ones, ones_like, rand, randn, randn_like,
                        zeros, zeros_like)

__all__ = ["Tensor", "tensor", "Function", "Context", "backward", "topological_order",
           "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled", "gradcheck",
           "GradcheckError", "checkpoint", "zeros", "ones", "full", "rand", "randn", "arange",
           "zeros_like", "ones_like", "full_like", "randn_like"]
