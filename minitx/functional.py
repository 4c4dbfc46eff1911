"""``minitx.functional``: every differentiable op (and, once registered, functional attention).

    import minitx.functional as F
    y = F.softmax(x, axis=-1)
"""
from .ops import *  # noqa: F401,F403
from .ops import unbroadcast  # noqa: F401
from .ops.activation import softmax_jacobian  # noqa: F401


def __getattr__(name):  # functional attention, imported lazily (minitx.attention imports minitx.nn)
    if name in ("scaled_dot_product_attention", "attention_weights", "dot_product_attention"):
        from .attention import exact
        return getattr(exact, name)
    raise AttributeError(f"module 'minitx.functional' has no attribute {name!r}")
