"""``minitx.functional``: every differentiable op, functional attention included.

    import minitx.functional as F
    y = F.softmax(x, axis=-1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)

Everything here comes from ``minitx.ops`` (one Function per op); attention's fused ops are
``ops/sdpa.py`` (``scaled_dot_product_attention``, ``attention_scores``, ``attention_weights``,
``why_not_flash``) and ``ops/flash.py`` (``flash_attention``).

Every op with an ``axis`` also takes PyTorch's ``dim=`` (and ``keepdim=`` for ``keepdims``):
``F.softmax(x, dim=-1)``. Where PyTorch's ``dim=`` means something else (``max``/``min``
return indices too, ``var`` is unbiased, ``split`` cuts pieces of a length) it is refused with
minitx's spelling named (``minitx.validate.dim_alias``). PyTorch's names of ops sit beside
NumPy's in the op's own file: ``cat`` (also ``minitx.cat``) is ``concatenate``, in
``ops/shape.py``.
"""
from .ops import *  # noqa: F401,F403
from .ops import unbroadcast  # noqa: F401
from .ops.activation import softmax_jacobian  # noqa: F401
