"""The first forms: ``simple_attention`` (five lines) equals the fused op, with gradients."""
import numpy as np
import pytest

import minitx
import minitx.functional as F
from minitx.attention import simple_attention
from support import assert_close, qkv, tensor


@pytest.mark.parametrize("nq,nk", [(1, 1), (7, 7), (5, 12)])
def test_simple_attention_equals_the_fused_op(nq, nk):
    q, k, v = qkv(nq, nk, b=2, h=3, d=4, seed=nq)
    allowed = np.random.default_rng(0).random((nq, nk)) < 0.7
    allowed[:, 0] = True
    for mask in (None, allowed):
        got = simple_attention(tensor(q), tensor(k), tensor(v), mask=mask)
        want = F.scaled_dot_product_attention(tensor(q), tensor(k), tensor(v), attn_mask=mask)
        assert_close(got, want, atol=1e-12)


def test_simple_attention_gradients():
    q, k, v = (tensor(a, requires_grad=True) for a in qkv(5, 6, b=1, h=2, d=3))
    mask = np.tri(5, 6, 1, dtype=bool)
    assert minitx.gradcheck(lambda a, b, c: simple_attention(a, b, c, mask=mask), (q, k, v))
