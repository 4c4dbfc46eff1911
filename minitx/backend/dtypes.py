"""PyTorch's dtype names, each NumPy's dtype: ``minitx.float32`` is ``numpy.float32``.

    minitx.zeros(2, 3, dtype=minitx.float64)
    t.dtype == minitx.float32

Every ``dtype=`` in minitx takes a NumPy dtype, its name or its type, so these are for code
written with PyTorch's ``torch.float32``, ``torch.long`` … NumPy has no bfloat16, so neither
does minitx (``minitx.bfloat16`` says what to use instead).
"""
from numpy import bool_ as bool  # noqa: A004 - PyTorch's name (torch.bool)
from numpy import float16, float32, float64, int8, int16, int32, int64, uint8

# PyTorch's second names: torch.half, torch.float, torch.double, torch.short, torch.int,
# torch.long
half, float, double = float16, float32, float64  # noqa: A001
short, int, long = int16, int32, int64  # noqa: A001

__all__ = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
           "half", "float", "double", "short", "int", "long"]
