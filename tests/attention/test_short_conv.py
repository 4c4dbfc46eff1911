"""The gated short convolution (LFM2's mixer, ``attention/short_conv.py``): the convolution
equals a NumPy double loop written here over every size, kernel and tap offset; the variant's
dense form (the banded Toeplitz matrix) equals the same loop; decoding through its cache in any
split equals the full forward; float64 gradients reach the kernel and the bias; the hooks tie
the product, the filter and the state to the output; bad options are named. The registry
contract (gradcheck of q, k, v, causality, GQA, scales) runs in test_registry_contract.py;
HF's ``Lfm2ShortConv`` is the oracle in tests/oracles/test_hybrid_lfm2.py."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.retention import RecurrentState
from minitx.attention.short_conv import causal_conv, short_conv_matrix
from minitx.nn.module import Parameter
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["short_conv"](E, H, causal=causal, **options).double().eval()


def numpy_conv(u, w, lookahead=0):
    """y[:, t] = Σ_j w[..., j] u[:, t − K + 1 + s + j] (zero outside 0 … N − 1), by loops."""
    n, k = u.shape[1], w.shape[-1]
    out = np.zeros_like(u)
    for t in range(n):
        for j in range(k):
            s = t - k + 1 + lookahead + j
            if 0 <= s < n:
                out[:, t] += w[..., j] * u[:, s]
    return out


@settings(deadline=None, max_examples=40)
@given(n=st.integers(1, 12), k=st.integers(1, 5), c=st.integers(1, 3),
       centred=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_convolution_and_its_matrix_equal_the_loop(n, k, c, centred, seed):
    g = np.random.default_rng(seed)
    u, w = g.standard_normal((2, n, c)), g.standard_normal((c, k))
    s = (k - 1) // 2 if centred else 0
    want = numpy_conv(u, w, s)
    got, last = causal_conv(tensor(u), tensor(w), lookahead=s)
    assert_close(got, want, atol=1e-12)
    # the matrix form: y = T u per channel, T (C, N, N) banded
    t = short_conv_matrix(w, n, s)
    assert_close(np.einsum("cts,bsc->btc", t, u), want, atol=1e-12)
    assert np.count_nonzero(t[0]) <= n * k
    # the last K − 1 inputs of the causal stream, zeros before, whatever the taps' offset
    padded = np.concatenate([np.zeros((2, k - 1, c)), u], axis=1)
    assert np.array_equal(to_host(last), padded[:, n:])


@pytest.mark.parametrize("causal", [True, False])
def test_attend_is_the_gate_times_the_filtered_product(causal):
    lay = layer(causal, kernel_size=4, conv_bias=True)
    lay.conv_bias.data[...] = tensor(np.random.default_rng(2).standard_normal((H, D))).data
    q, k, v = qkv(9, b=2, h=H, hkv=1, d=D, seed=3)
    got = lay.attend(tensor(q), tensor(k), tensor(v)).numpy()
    u = (k * v).repeat(H, axis=1).transpose(0, 2, 1, 3)                 # (B, N, H, D)
    filt = numpy_conv(u, to_host(lay.conv_weight.data), 0 if causal else 1)
    want = q * (filt + to_host(lay.conv_bias.data)).transpose(0, 2, 1, 3)
    assert_close(got, want, atol=1e-12)
    ref = lay.reference(*(tensor(a).data for a in (q, k, v)))     # on the layer's device
    assert_close(to_host(ref), want, atol=1e-12)


@settings(deadline=None, max_examples=25)
@given(cuts=st.lists(st.integers(1, 13), min_size=1, max_size=5, unique=True),
       k=st.integers(1, 5))
def test_decoding_in_any_split_equals_the_full_forward(cuts, k):
    lay = layer(True, kernel_size=k)
    x = np.random.default_rng(k).standard_normal((2, 14, E))
    with minitx.no_grad():
        full = lay(tensor(x)).numpy()
        cache, steps, start = lay.new_cache(), [], 0
        for end in sorted(cuts) + [14]:
            steps.append(lay(tensor(x[:, start:end]), kv_cache=cache).numpy())
            start = end
    assert isinstance(cache, RecurrentState) and len(cache) == 14
    assert cache.state.shape == (2, k - 1, H, D)              # (K − 1)·H·D numbers a row
    assert_close(np.concatenate(steps, axis=1), full, atol=1e-12)


def test_gradients_reach_the_kernel_and_the_bias():
    lay = layer(True, kernel_size=3, conv_bias=True)
    q, k, v = (tensor(a) for a in qkv(7, b=1, h=H, d=D, seed=5))
    w = Parameter(lay.conv_weight.data.copy())
    b = Parameter(tensor(np.random.default_rng(6).standard_normal((H, D))).data)

    def out(w_, b_):
        lay.conv_weight, lay.conv_bias = w_, b_
        return lay.attend(q, k, v)
    minitx.gradcheck(out, (w, b))


def test_hooks_see_the_product_the_filter_and_the_state():
    """Zeroing ``hook_product`` leaves only the bias through the gate, q ⊙ β; ``hook_conv``
    is what the gate multiplies; ``hook_state`` with a cache is what the cache keeps."""
    lay = layer(True, kernel_size=3, conv_bias=True)
    lay.conv_bias.data[...] = 0.5
    x = tensor(np.random.default_rng(7).standard_normal((2, 6, E)))
    seen = {}
    lay.hook_conv.add_hook(lambda t, hook: seen.__setitem__("conv", t.numpy()))
    lay.hook_q.add_hook(lambda t, hook: seen.__setitem__("q", t.numpy()))
    lay.hook_z.add_hook(lambda t, hook: seen.__setitem__("z", t.numpy()))
    lay(x)
    assert_close(seen["z"], seen["q"] * seen["conv"], atol=1e-12)          # (B, N, H, D)
    lay.hook_product.add_hook(lambda t, hook: t * 0.0)
    lay(x)
    assert_close(seen["z"], seen["q"] * 0.5, atol=1e-12)
    lay.hook_product.remove_hooks()
    lay.hook_state.add_hook(lambda t, hook: seen.__setitem__("state", t.numpy()))
    cache = lay.new_cache()
    with minitx.no_grad():
        lay(x, kv_cache=cache)
    assert np.array_equal(seen["state"], to_host(cache.state))


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="kernel_size"):
        REGISTRY["short_conv"](E, H, kernel_size=0)
    with pytest.raises((ValueError, TypeError), match="conv_bias"):
        REGISTRY["short_conv"](E, H, conv_bias="yes")
    u = tensor(np.zeros((1, 4, 2)))
    with pytest.raises(ValueError, match="lookahead"):
        causal_conv(u, tensor(np.ones((2, 3))), past=np.zeros((1, 2, 2)), lookahead=1)
    with pytest.raises(ValueError, match="causal=True"):
        layer(False)(tensor(np.zeros((1, 2, E))), kv_cache=RecurrentState())
