"""A float mask of 0s and 1s meant as "1 = attend" is added to the scores and masks nothing:
every entry point that takes a mask warns, at the caller's line, and real additive masks
(0 / −inf, ALiBi's biases, learned biases) never do."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx import nn
from minitx.attention import REGISTRY, alibi_bias
from minitx.ops.sdpa import is_binary_float_mask

MESSAGE = "a float mask of 0s and 1s"


def _qkv(n=5, d=4, seed=0):
    g = np.random.default_rng(seed)
    return [minitx.tensor(g.standard_normal((1, 2, n, d)), dtype="float32") for _ in range(3)]


def _no_warning(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_a_zero_one_float_mask_warns_at_the_callers_line_and_masks_nothing():
    q, k, v = _qkv()
    m = np.tril(np.ones((5, 5), dtype=np.float32))          # meant: 1 = may attend, causal
    with pytest.warns(UserWarning, match=MESSAGE) as record:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert record[0].filename == __file__, record[0].filename
    text = str(record[0].message)
    assert "m.astype(bool)" in text and "numpy.where(m == 1, 0.0, -numpy.inf)" in text
    assert "True = may attend" in text and "True = NOT allowed" in text
    # the trap itself: the mask shifts some scores by 1 and hides no key
    causal = _no_warning(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    fixed = _no_warning(lambda: F.scaled_dot_product_attention(q, k, v,
                                                               attn_mask=m.astype(bool)))
    np.testing.assert_allclose(fixed.numpy(), causal.numpy(), atol=1e-6)
    assert np.abs(out.numpy() - causal.numpy()).max() > 1e-2


def test_real_additive_masks_do_not_warn():
    q, k, v = _qkv()
    n = 5
    causal = np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf).astype(np.float32)
    alibi = alibi_bias(2, n, n)                             # (H, N, N): −m_h·|i − j|
    for m in (np.zeros((n, n), np.float32), causal, alibi,
              np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)):
        _no_warning(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))


def test_a_zero_one_mask_merged_with_a_bool_one_still_warns():
    # -inf entries (a bool mask merged in) are left out of the rule: the rest is 0s and 1s
    m = np.array([[0.0, 1.0, -np.inf], [1.0, 1.0, -np.inf]], dtype=np.float32)
    assert is_binary_float_mask(m)
    assert not is_binary_float_mask(np.array([[0.0, -np.inf]], dtype=np.float32))
    assert not is_binary_float_mask(np.array([[0.0, 1.0, 2.0]], dtype=np.float32))
    assert not is_binary_float_mask(np.ones((2, 2), dtype=bool))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 2 ** 31 - 1), binary=st.booleans())
def test_the_rule_on_random_masks(n, seed, binary):
    """0/1 masks with a 1 in them always warn; 0/−inf masks never do, whatever the size."""
    g = np.random.default_rng(seed)
    hit = g.random((n, n)) < 0.5
    hit[g.integers(n), g.integers(n)] = True
    m = (hit if binary else np.where(hit, 0.0, -np.inf)).astype(np.float32)
    q, k, v = _qkv(n)
    if binary:
        with pytest.warns(UserWarning, match=MESSAGE):
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    else:
        m[np.arange(n), np.arange(n)] = 0.0            # own position kept: no polarity warning
        _no_warning(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))


def test_multihead_attention_warns_for_both_of_its_masks_once():
    minitx.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = minitx.tensor(np.random.default_rng(0).standard_normal((2, 4, 8)), dtype="float32")
    attend = np.tril(np.ones((4, 4), np.float32))
    with pytest.warns(UserWarning, match=MESSAGE) as record:
        mha(x, x, x, attn_mask=attend)
    assert [str(w.message).startswith(MESSAGE) for w in record].count(True) == 1
    assert record[0].filename == __file__
    hf = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=np.float32)
    with pytest.warns(UserWarning, match=MESSAGE):
        mha(x, x, x, key_padding_mask=hf)
    _no_warning(lambda: mha(x, x, x, key_padding_mask=hf == 0))
    _no_warning(lambda: mha(x, x, x, attn_mask=np.where(attend == 1, 0.0, -np.inf)
                            .astype(np.float32)))


def test_a_registry_variant_warns_too():
    minitx.manual_seed(0)
    layer = REGISTRY["mha"](8, 2).eval()
    q, k, v = _qkv(5, 4)
    m = np.tril(np.ones((5, 5), np.float32))
    with pytest.warns(UserWarning, match=MESSAGE):
        layer.attend(q, k, v, attn_mask=m)
