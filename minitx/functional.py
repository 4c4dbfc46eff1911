"""``minitx.functional``: every differentiable op, functional attention included.

    import minitx.functional as F
    y = F.softmax(x, axis=-1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)

Everything here comes from ``minitx.ops`` (one Function per op); attention's fused ops are
``ops/attention.py`` (``scaled_dot_product_attention``, ``attention_weights``,
``why_not_flash``) and ``ops/flash.py`` (``flash_attention``).
"""
from .ops import *  # noqa: F401,F403
from .ops import unbroadcast  # noqa: F401
from .ops.activation import softmax_jacobian  # noqa: F401
