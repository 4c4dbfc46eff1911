"""``minitx.functional``: every differentiable op (and, once registered, functional attention).

    import minitx.functional as F
    y = F.softmax(x, axis=-1)
"""
from .ops import *  # noqa: F401,F403
from .ops import unbroadcast  # noqa: F401
from .ops.activation import softmax_jacobian  # noqa: F401
