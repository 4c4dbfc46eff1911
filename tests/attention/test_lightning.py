"""Lightning attention (MiniMax-01; Lightning Attention-2): MiniMax's decay schedule; the
block form (intra + inter) equals a NumPy double loop written here, the token recurrence and
the one-block form, for any block length; float64 gradients across several blocks; decoding
through GPT with a constant-size state equals the full forward; the hooks tie decay, pattern
and state to the output; bad options are named. The registry contract (gradcheck, causality,
GQA, scales) runs in test_registry_contract.py."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY
from minitx.attention.lightning import lightning_slopes
from minitx.attention.retention import RecurrentState, decayed_recurrence
from minitx.models.gpt import GPT, GPTConfig
from minitx.validate import OptionError
from support import assert_close, qkv, tensor, to_host

E, H = 8, 2
D = E // H


def layer(causal=True, **options):
    minitx.manual_seed(0)
    return REGISTRY["lightning"](E, H, causal=causal, **options).double().eval()


def numpy_lightning(q, k, v, decays, causal=True):
    """o_t = Σ_s λ^{|t−s|} (q_t·k_s) v_s (s ≤ t when causal), written with loops over (t, s)."""
    b, h, n, d = q.shape
    out = np.zeros_like(v)
    for head in range(h):
        for t in range(n):
            for s in range(n if not causal else t + 1):
                w = decays[head] ** abs(t - s) * (q[:, head, t] * k[:, head, s]).sum(-1)
                out[:, head, t] += w[:, None] * v[:, head, s]
    return out


def test_slopes_are_minimaxs_schedule():
    # ALiBi's slopes for 8 heads: 2^-1, 2^-2, …, 2^-8
    assert_close(lightning_slopes(8), 0.5 ** np.arange(1, 9), rtol=1e-15)
    assert_close(lightning_slopes(2), [2 ** -4, 2 ** -8], rtol=1e-15)
    # layer l of L: × (1 − l/(L − 1 + 1e-5) + 1e-5); the last layer decays barely at all
    assert_close(lightning_slopes(4, 0, 5), 2.0 ** -np.arange(2, 10, 2) * (1 + 1e-5))
    last = 1 - 4 / (4 + 1e-5) + 1e-5
    assert_close(lightning_slopes(4, 4, 5), 2.0 ** -np.arange(2, 10, 2) * last, rtol=1e-12)
    assert_close(layer().decays, np.exp(-lightning_slopes(H)), rtol=1e-15)


@settings(deadline=None, max_examples=15)
@given(n=st.integers(1, 23), block=st.integers(1, 9), seed=st.integers(0, 2 ** 16))
def test_blocks_recurrence_and_loops_are_equal(n, block, seed):
    lay = layer(block=block)
    q, k, v = qkv(n, seed=seed)
    out = lay.attend(*(tensor(a) for a in (q, k, v)))
    assert_close(out, numpy_lightning(q, k, v, lay.decays), atol=1e-12, rtol=1e-12)
    log_decay = tensor(np.broadcast_to(-lay.slopes[None, :, None], (1, H, n)).copy())
    with minitx.no_grad():
        rec = decayed_recurrence(*(tensor(a) for a in (q, k, v)), log_decay)[0]
    assert_close(out, rec, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("block", [1, 3, 8, 64])
def test_non_causal_is_the_symmetric_decay(block):
    """Blocks forward plus blocks over the reversed tokens, less the diagonal: λ^{|i−j|}."""
    lay = layer(causal=False, block=block)
    q, k, v = qkv(8, seed=1)
    out = lay.attend(*(tensor(a) for a in (q, k, v)))
    assert_close(out, numpy_lightning(q, k, v, lay.decays, causal=False), atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_across_blocks(causal):
    lay = layer(causal=causal, block=3)            # 8 tokens: blocks of 3, 3 and 2
    arrays = qkv(8, b=1, seed=2, scale=0.7)
    minitx.gradcheck(lay.attend, tuple(tensor(a, requires_grad=True) for a in arrays))


@pytest.mark.parametrize("value", [0, -1, 2.5, "64", True, None])
def test_block_is_validated(value):
    with pytest.raises(OptionError, match="block") as info:
        REGISTRY["lightning"](E, H, block=value)
    assert repr(value) in str(info.value)


def test_layer_index_must_be_below_num_layers():
    with pytest.raises(OptionError, match="layer_index") as info:
        REGISTRY["lightning"](E, H, layer_index=4, num_layers=4)
    assert "4" in str(info.value)
    with pytest.raises(OptionError, match="num_layers"):
        REGISTRY["lightning"](E, H, num_layers=0)


# ---- decoding: a constant-size state through GPT ----------------------------------------------

def gpt(**options):
    minitx.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=H, n_embd=E,
                       attention="lightning", position="none", attention_options=options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("options", [{}, {"block": 3}, {"block": 2, "num_layers": 2}])
def test_prefill_then_token_by_token_equals_the_full_forward(options):
    model = gpt(**options)
    idx = np.random.default_rng(3).integers(0, 11, (2, 13))
    full, _ = model(tensor(idx, dtype=None))
    caches = model.new_caches()
    assert all(isinstance(c, RecurrentState) for c in caches)
    parts = [model(tensor(idx[:, :5], dtype=None), kv_caches=caches)[0]]      # prefill 5
    size = caches[0].nbytes
    assert size == 2 * H * D * D * 8                                         # (B, H, D, D) f64
    for t in range(5, 13):
        parts.append(model(tensor(idx[:, t:t + 1], dtype=None), kv_caches=caches)[0])
        assert len(caches[0]) == t + 1 and caches[0].nbytes == size         # constant size
    got = np.concatenate([to_host(p) for p in parts], axis=1)
    assert_close(got, full, atol=1e-10, rtol=0)


def test_each_layer_of_a_gpt_gets_its_own_decays():
    model = gpt(num_layers=2)
    first, second = (b.attn for b in model.h)
    assert (first.layer_index, second.layer_index) == (0, 1)
    assert np.all(second.slopes < first.slopes)           # the deeper layer remembers longer


# ---- hook points -----------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_hooks_tie_decay_pattern_state_and_output(causal):
    n = 10
    lay = layer(causal=causal, block=4)
    x = np.random.default_rng(4).standard_normal((2, n, E))
    plain = lay(tensor(x))
    seen = {}
    with lay.hooks([(lambda nm: True, lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        hooked = lay(tensor(x))
    assert_close(hooked, plain, atol=1e-12)              # hooks force one block: same values
    q, k, v = (np.swapaxes(seen[f"hook_{s}"], 1, 2) for s in "qkv")
    dist = np.arange(n)[:, None] - np.arange(n)[None, :]
    lam = lay.decays[:, None, None]
    decay = lam ** np.abs(dist) * (dist >= 0 if causal else 1)
    assert_close(seen["hook_decay"], decay[None], rtol=1e-12)
    pattern = np.einsum("bhnd,bhmd->bhnm", q, k) * decay
    assert_close(seen["hook_pattern"], pattern, rtol=1e-10, atol=1e-14)
    assert_close(np.swapaxes(seen["hook_z"], 1, 2), pattern @ v, rtol=1e-10, atol=1e-13)
    # the state after the last token: Σ_m λ^(N−1−m) k_mᵀ v_m (the forward recurrence)
    w = lay.decays[:, None] ** (n - 1 - np.arange(n))
    assert_close(seen["hook_state"], np.einsum("hm,bhmd,bhme->bhde", w, k, v), rtol=1e-10)


def test_replacing_the_decay_by_ones_gives_causal_linear_attention():
    n = 7
    lay = layer()
    x = tensor(np.random.default_rng(5).standard_normal((1, n, E)))
    ones = tensor(np.tril(np.ones((1, H, n, n))))
    seen = {}
    hooks = [("hook_decay", lambda t, hook: ones)] + \
        [(f"hook_{s}", lambda t, hook, s=s: seen.__setitem__(s, to_host(t))) for s in "qkvz"]
    with lay.hooks(hooks):
        lay(x)
    q, k, v, z = (np.swapaxes(seen[s], 1, 2) for s in "qkvz")
    assert_close(z, np.tril(np.einsum("bhnd,bhmd->bhnm", q, k)) @ v, rtol=1e-10, atol=1e-13)


def test_identities_hold():
    rows = REGISTRY["lightning"].identities()
    assert len(rows) >= 2
    for claim, value, limit in rows:
        assert limit <= 1e-6 and value <= limit, (claim, value)
