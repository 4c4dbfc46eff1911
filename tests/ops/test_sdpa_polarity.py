"""The mask-polarity trap, warned about in one place (``ops.sdpa.warn_if_polarity_inverted``).

``scaled_dot_product_attention``'s bool mask is True = may attend; ``MultiheadAttention``'s is
True = NOT allowed (both PyTorch's rules). Either one given the other's mask runs without an
error and computes the wrong attention: in self-attention a causal mask becomes anti-causal.
The tell is a mask that hides every query's own position. It warns, at the caller's line,
naming both polarities; correct masks, cross-attention shapes (where the diagonal means
nothing) and masks broadcast along the queries stay silent."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY
from minitx.nn import MultiheadAttention, TransformerEncoderLayer
from minitx.ops.sdpa import hides_own_positions
from support import qkv, tensor

TRAP = "attn_mask hides every query's own position"


def _polarity_warnings(call):
    """The polarity warnings ``call()`` raises (every one: the filter is "always")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if TRAP in str(w.message)]


def _silent(call):
    """``call()`` raises no polarity warning (any other warning is not this test's concern)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=TRAP)
        call()


def _sdpa(n, mask, nk=None, **kw):
    q, k, v = (tensor(a) for a in qkv(n, nk, b=1, h=2, d=4))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


# ---- the trap fires: MultiheadAttention's causal mask given to SDPA -----------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9))
def test_the_modules_causal_mask_given_to_sdpa_warns_naming_both_polarities(n):
    module_causal = np.triu(np.ones((n, n), bool), 1)        # True = NOT allowed (modules)
    caught = _polarity_warnings(lambda: _sdpa(n, module_causal))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "True = may attend" in message                    # SDPA's polarity, named
    assert "True where attention is NOT allowed" in message  # the modules', named
    assert "MultiheadAttention" in message and "~mask" in message
    assert caught[0].filename == __file__                     # at the caller's line


def test_an_inverted_float_mask_and_the_composed_form_warn_too():
    n = 5
    lower = np.tril(np.ones((n, n), bool))
    inverted_bias = np.where(lower, -np.inf, 0.0)            # −inf on and below the diagonal
    assert len(_polarity_warnings(lambda: _sdpa(n, inverted_bias))) == 1
    q, k, _ = (tensor(a) for a in qkv(n, b=1, h=2, d=4))
    upper = np.triu(np.ones((n, n), bool), 1)
    for fn in (F.attention_weights, F.attention_scores):
        assert len(_polarity_warnings(lambda: fn(q, k, attn_mask=upper))) == 1, fn.__name__


def test_an_sdpa_polarity_mask_given_to_multihead_attention_warns_once_at_the_callers_line():
    minitx.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True).double()
    x = tensor(np.random.default_rng(0).standard_normal((2, 5, 8)))
    sdpa_causal = np.tril(np.ones((5, 5), bool))              # True = may attend (SDPA's)
    caught = _polarity_warnings(lambda: mha(x, x, x, attn_mask=sdpa_causal))
    assert len(caught) == 1 and caught[0].filename == __file__
    per_head = np.broadcast_to(sdpa_causal, (2 * 2, 5, 5))    # (N·H, L, S) masks alike
    assert len(_polarity_warnings(lambda: mha(x, x, x, attn_mask=per_head))) == 1


def test_a_layer_with_a_registry_variant_and_the_variant_itself_warn():
    minitx.manual_seed(0)
    x = tensor(np.random.default_rng(1).standard_normal((1, 4, 8)))
    layer = TransformerEncoderLayer(8, 2, dim_feedforward=8, attention="mha",
                                    batch_first=True).double()
    sdpa_causal = np.tril(np.ones((4, 4), bool))
    assert len(_polarity_warnings(lambda: layer(x, src_mask=sdpa_causal))) == 1
    variant = REGISTRY["mha"](8, 2).double()                  # the registry: True = may attend
    assert len(_polarity_warnings(lambda: variant(x, attn_mask=~sdpa_causal))) == 1


# ---- ... and stays silent where the mask is right or the diagonal means nothing ----------

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 7), st.integers(0, 2**16))
def test_a_mask_that_lets_some_query_see_itself_is_silent(n, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random((n, n)) < 0.5
    mask[rng.integers(n), :] = False
    i = rng.integers(n)
    mask[i, i] = True                                         # one query sees itself
    _silent(lambda: _sdpa(n, mask))
    assert hides_own_positions(mask & ~np.eye(n, dtype=bool), n, n)   # the same, without it


@pytest.mark.parametrize("n", [1, 2, 6])
def test_correct_masks_are_silent(n):
    lower = np.tril(np.ones((n, n), bool))
    _silent(lambda: _sdpa(n, lower))                                   # SDPA's causal mask
    _silent(lambda: _sdpa(n, np.where(lower, 0.0, -np.inf)))           # as a float mask
    _silent(lambda: _sdpa(n, None, is_causal=True))
    _silent(lambda: _sdpa(n, np.zeros((n, n))))                        # a zero bias
    minitx.manual_seed(0)
    mha = MultiheadAttention(8, 2, batch_first=True).double()
    x = tensor(np.random.default_rng(0).standard_normal((2, n, 8)))
    _silent(lambda: mha(x, x, x, attn_mask=~lower))                    # the module's own
    _silent(lambda: mha(x, x, x, attn_mask=np.where(lower, 0.0, -np.inf)))


@pytest.mark.parametrize("nq,nk", [(3, 5), (5, 3), (1, 4)])
def test_cross_attention_shapes_are_silent(nq, nk):
    nothing_on_the_diagonal = ~np.eye(nq, nk, dtype=bool)     # "diagonal" means nothing here
    _silent(lambda: _sdpa(nq, nothing_on_the_diagonal, nk=nk))
    assert not hides_own_positions(nothing_on_the_diagonal, nq, nk)


def test_a_key_padding_mask_broadcast_along_queries_is_silent():
    n = 4
    first_key_hidden = np.array([False, True, True, True])[None, None, None, :]  # (1, 1, 1, Nk)
    _silent(lambda: _sdpa(n, first_key_hidden))
    single = np.zeros((1, 1), bool)                           # a scalar-like mask: not judged
    _silent(lambda: _sdpa(n, single))


def test_the_rule_reads_tensors_and_extra_leading_dims():
    n = 3
    upper = np.triu(np.ones((2, 2, n, n), bool), 1)           # (B, H, N, N)
    assert hides_own_positions(upper, n, n)
    diagonal_blocked = np.where(np.eye(n, dtype=bool), -np.inf, 0.0)  # a float mask, a Tensor
    assert hides_own_positions(tensor(diagonal_blocked), n, n)
    assert not hides_own_positions(tensor(diagonal_blocked.T[::-1].copy()), n, n)
    partly = upper.copy()
    partly[1, 0, 2, 2] = True                                  # one head of one batch sees itself
    assert not hides_own_positions(partly, n, n)
    assert not hides_own_positions(np.zeros((2, 0, 0), bool), 0, 0)   # nothing to judge
