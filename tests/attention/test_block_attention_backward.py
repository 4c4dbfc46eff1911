"""``BlockAttention``'s own backward (probabilities recomputed block by block from the saved
log-sum-exp, each query's gradient summed over the blocks it read) against central
differences in float64, on a hypothesis grid of sizes, blocks (repeated, partial) and masks
(rows with nothing allowed included). Its equality with ``gathered_attention``, outputs and
gradients, is test_block_attention.py's."""
import math

import numpy as np
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention.selection import block_attention
from support import qkv, tensor


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 7), extra=st.integers(0, 4), block=st.integers(1, 4),
       c=st.integers(1, 3), share=st.floats(0.2, 1.0), seed=st.integers(0, 2 ** 16))
def test_gradcheck(n, extra, block, c, share, seed):
    rng = np.random.default_rng(seed)
    nk = n + extra
    nb = -(-nk // block)
    arrays = qkv(n, nk, b=1, h=2, d=3, dv=2, seed=seed)
    blocks = rng.integers(0, nb, (1, 2, n, c))               # repeats allowed, the last partial
    keys = blocks[..., None] * block + np.arange(block)
    allowed = (rng.random((1, 2, n, c, block)) < share) & (keys < nk)
    blocks, allowed = tensor(blocks, dtype=None).data, tensor(allowed, dtype=None).data
    minitx.gradcheck(lambda q, k, v: block_attention(q, k, v, blocks, allowed, block,
                                                     1 / math.sqrt(3)),
                     tuple(tensor(a, requires_grad=True) for a in arrays))
