"""``minitx.functional``: every differentiable op (and, once registered, functional attention).

    import minitx.functional as F
    y = F.softmax(x, axis=-1)
"""
from .ops import *  # noqa: F401,F403
from .ops import unbroadcast  # noqa: F401
from .ops.activation import softmax_jacobian  # noqa: F401


_ATTENTION = {  # functional attention, imported lazily (minitx.attention imports minitx.nn)
    "scaled_dot_product_attention": "exact", "attention_weights": "exact",
    "dot_product_attention": "exact", "flash_attention": "flash",
}


def __getattr__(name):
    if name in _ATTENTION:
        import importlib
        return getattr(importlib.import_module(f"minitx.attention.{_ATTENTION[name]}"), name)
    raise AttributeError(f"module 'minitx.functional' has no attribute {name!r}")
