"""The fast layer: every CPU speed trick of minitx, each beside the reference it stands in for.

The course (``minitx/autograd``, ``ops``, ``nn``, ``optim``, ``attention``, ``models``) is
written as its maths. Everything that exists only for speed on the CPU lives here instead: each
function names its reference twin and says in a sentence why it computes the same thing, each
has a parity test in ``tests/fast/``, and its measured gain is in ``benchmarks/README.md``.
A reader who never opens this folder still has all the maths.

How it plugs in, keeping the layers one-way (as minitorch's ``fast_ops`` builds on
``tensor_ops``): this package sits just above the ops, imports what it reuses from them, and
registers each twin into the table of ``minitx.configuration`` under its reference's name. The
reference asks for its twin at one visible point, at call time::

    fast = configuration.twin("row_max")
    if fast is not None:
        return fast(x)
    return x.max(axis=-1, keepdims=True)            # the reference

The ops never import this package. One switch turns the whole layer off:
``minitx.config.fast = False``, ``with minitx.using_config(fast=False):`` or ``MINITX_FAST=0``
in the environment (read at import); ``minitx.configuration.why_not_fast(name)`` says why a
reference runs.
"""
# First, before anything here loads NumPy: OpenBLAS reads its thread timeout only then.
from . import host

host.prepare_blas()

# Then the core, in its own order (the Tensor binds the ops at its end), and the twins: each
# import below registers its twins (their order does not matter).
from .. import autograd  # noqa: E402,F401
from . import erf, norm, optim, parallel, reductions, scatter, sdpa, silu  # noqa: E402,F401

__all__ = ["host", "erf", "norm", "optim", "parallel", "reductions", "scatter", "sdpa",
           "silu"]
