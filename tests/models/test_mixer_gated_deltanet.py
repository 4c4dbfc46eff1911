"""Qwen3-Next's layers in minitx's ``Decoder``: the ``gated_deltanet`` mixer
(``models/mixers/gated_deltanet.py``) against its module docstring's formulas written out in
NumPy token by token, float64 gradient checks of the mixer and of the output-gated attention
(``DecoderConfig.attn_output_gate``), decoding through its constant-size cache as the full
forward does, left padding that leaves no trace, the counts from the configuration, and bad
options refused by name. Equality with HuggingFace's Qwen3-Next is
``tests/oracles/test_hybrid_qwen3_next.py``.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.models import Decoder, DecoderConfig, count_parameters
from minitx.models.decoder import kv_cache_bytes
from minitx.models.mixers import MIXERS
from support import assert_close, tensor, to_host

SIZES = dict(vocab_size=31, hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4,
             norm_eps=0.05, qk_norm="head", norm_unit_offset=True, attn_output_gate=True,
             rope={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5})


def _config(hk=2, hv=4, dk=3, dv=5, kernel=3, chunk=4, layers=("gated_deltanet", "full")):
    return DecoderConfig(num_layers=len(layers), layer_types=layers, **SIZES, mixer_options={
        "gated_deltanet": dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv,
                               conv_kernel=kernel, chunk_size=chunk)})


def _model(config, seed=0):
    """A float64 decoder with every parameter redrawn (gains near 1, A_log near 0)."""
    model = Decoder(config).to(dtype="float64")
    rng = np.random.default_rng(seed)
    for _, p in model.named_parameters():
        p.copy_(rng.standard_normal(p.shape) * 0.4)
    return model


def _softplus(x):
    return np.logaddexp(0, x)


def _silu(x):
    return x / (1 + np.exp(-x))


def _reference(layer, x, keep=None):
    """The module docstring's formulas on host arrays, token by token, with the paper's
    state S (D_v × D_k): S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = τ S_t q_t."""
    hk, hv, dk, dv = layer.sizes
    r, kernel = hv // hk, layer.conv1d.kernel
    p = {k: to_host(v.data) for k, v in layer.named_parameters()}
    if keep is not None:
        x = x * keep[:, :, None]
    b, n, _ = x.shape
    # HF's per-key-head layout: [q (Dk), k (Dk), v (r·Dv), z (r·Dv)] and [b (r), a (r)]
    qkvz = (x @ p["in_proj_qkvz.weight"].T).reshape(b, n, hk, 2 * dk + 2 * r * dv)
    ba = (x @ p["in_proj_ba.weight"].T).reshape(b, n, hk, 2 * r)
    q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
    v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(b, n, hv, dv)
    z = qkvz[..., 2 * dk + r * dv:].reshape(b, n, hv, dv)
    beta_in, a = ba[..., :r].reshape(b, n, hv), ba[..., r:].reshape(b, n, hv)
    chans = np.concatenate([q.reshape(b, n, -1), k.reshape(b, n, -1), v.reshape(b, n, -1)], -1)
    # the causal depthwise convolution, then SiLU
    w = p["conv1d.weight"][:, 0, :]                                   # (C, K)
    padded = np.concatenate([np.zeros((b, kernel - 1, chans.shape[-1])), chans], axis=1)
    u = _silu(np.stack([sum(w[:, j] * padded[:, t + j] for j in range(kernel))
                        for t in range(n)], axis=1))
    q = u[..., :hk * dk].reshape(b, n, hk, dk)
    k = u[..., hk * dk:2 * hk * dk].reshape(b, n, hk, dk)
    v = u[..., 2 * hk * dk:].reshape(b, n, hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-beta_in))
    alpha = np.exp(-np.exp(p["A_log"]) * _softplus(a + p["dt_bias"]))
    out = np.zeros((b, n, hv, dv))
    for i in range(b):
        for h in range(hv):
            s = np.zeros((dv, dk))
            kq = h // r                                          # the key head it reads
            for t in range(n):
                kt = k[i, t, kq]
                s = alpha[i, t, h] * s @ (np.eye(dk) - beta[i, t, h] * np.outer(kt, kt)) \
                    + beta[i, t, h] * np.outer(v[i, t, h], kt)
                out[i, t, h] = s @ q[i, t, kq]
    # the gated RMSNorm per head, then out_proj
    normed = out / np.sqrt((out * out).mean(-1, keepdims=True) + layer.norm.eps)
    y = normed * p["norm.weight"] * _silu(z)
    return y.reshape(b, n, hv * dv) @ p["out_proj.weight"].T


@settings(max_examples=12, deadline=None)
@given(heads=st.sampled_from([(1, 1), (1, 3), (2, 4)]), dk=st.sampled_from([2, 3]),
       dv=st.sampled_from([2, 5]), kernel=st.sampled_from([1, 2, 4]),
       chunk=st.sampled_from([1, 3, 64]), n=st.integers(1, 9))
def test_the_mixer_is_its_formula(heads, dk, dv, kernel, chunk, n):
    config = _config(heads[0], heads[1], dk, dv, kernel, chunk)
    layer = _model(config).blocks[0].attn
    x = np.random.default_rng(n).standard_normal((2, n, 16))
    assert_close(layer(tensor(x)), _reference(layer, x), rtol=1e-10, atol=1e-12)


def test_the_mixer_zeroes_the_inputs_of_padding_tokens():
    layer = _model(_config()).blocks[0].attn
    x = np.random.default_rng(3).standard_normal((2, 7, 16))
    keep = np.ones((2, 7), dtype=bool)
    keep[0, :2] = keep[1, 4] = False
    from minitx.backend import xp
    got = layer(tensor(x), keep=xp().asarray(keep))
    assert_close(got, _reference(layer, x, keep.astype(float)), rtol=1e-10, atol=1e-12)


def test_the_mixer_and_the_gated_attention_have_their_gradients():
    model = _model(_config(kernel=3, chunk=2))
    x = np.random.default_rng(4).standard_normal((2, 5, 16)) * 0.5
    for block in model.blocks:
        minitx.gradcheck(lambda t: block.attn(t), (tensor(x, requires_grad=True),))
    # every parameter of the mixer, one random direction each
    layer = model.blocks[0].attn
    params = [p for _, p in layer.named_parameters()]
    minitx.gradcheck(lambda *ps: layer(tensor(x)), tuple(params), fast=True)


def test_the_attention_output_gate_is_applied():
    """With ``attn_output_gate`` q_proj's rows come per head as [q_h (D), gate_h (D)], and
    the heads' output is multiplied by σ(gate) before o_proj; without it q_proj has no gate."""
    gated = _model(_config(layers=("full",))).blocks[0].attn
    assert gated.q_proj.weight.shape == (2 * 4 * 4, 16)
    x = np.random.default_rng(5).standard_normal((1, 4, 16))
    seen = {}
    gated.hook_z.add_hook(lambda t, h: seen.__setitem__("z", t.numpy()))
    gated.hook_out_gate.add_hook(lambda t, h: seen.__setitem__("gate", t.numpy()))
    out = gated(tensor(x)).numpy()
    w = to_host(gated.q_proj.weight.data).reshape(4, 2, 4, 16)      # (H, [q, gate], D, E)
    gate = np.einsum("bne,hde->bnhd", x, w[:, 1]).reshape(1, 4, 16)
    assert_close(seen["gate"], gate, rtol=1e-12)
    z = seen["z"].reshape(1, 4, 16) / (1 + np.exp(-gate))
    assert_close(out, z @ to_host(gated.o_proj.weight.data).T, rtol=1e-12)
    plain = Decoder(DecoderConfig(**{**SIZES, "attn_output_gate": False}, num_layers=1))
    assert plain.blocks[0].attn.q_proj.weight.shape == (16, 16)
    assert not hasattr(plain.blocks[0].attn, "hook_out_gate")


def test_cached_decoding_equals_the_full_forward_and_the_cache_stays_small():
    config = _config(chunk=3, layers=("gated_deltanet", "full", "gated_deltanet"))
    model = _model(config)
    ids = np.random.default_rng(6).integers(0, 31, (2, 11))
    full = model(ids).numpy()
    caches = model.new_caches()
    steps = [model(ids[:, :5], kv_caches=caches).numpy()]
    sizes = []
    for i in range(5, 11):
        steps.append(model(ids[:, i:i + 1], kv_caches=caches).numpy())
        sizes.append(caches[0].nbytes)
    assert_close(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    assert [len(c) for c in caches] == [11, 11, 11]
    assert len(set(sizes)) == 1                               # constant, whatever the length
    # conv inputs (K − 1 = 2 of C = 2·2·3 + 4·5) and S (H_v, D_k, D_v), per batch row
    assert caches[0].conv.shape == (2, 2, 32) and caches[0].state.shape == (2, 4, 3, 5)
    # per batch row: the two linear layers' caches, and 2·Hkv·D numbers a token in the full one
    linear = (caches[0].nbytes + caches[2].nbytes) // 2
    assert kv_cache_bytes(config, 11, bytes_per_number=8) == linear + 2 * 2 * 4 * 11 * 8


def test_left_padding_leaves_no_trace_in_the_linear_layers():
    """A left-padded prompt gives its real tokens the logits of the unpadded prompt: the
    padding's zeroed inputs leave the convolution and the state at zero, attention masks the
    padding keys, and rotary scores depend on offsets only."""
    model = _model(_config(chunk=4, layers=("gated_deltanet", "full", "gated_deltanet")))
    ids = np.random.default_rng(8).integers(3, 31, (1, 6))
    alone = model(ids).numpy()
    padded = np.concatenate([np.zeros((1, 3), dtype=ids.dtype), ids], axis=1)
    keep = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    assert_close(model(padded, attention_mask=keep).numpy()[:, 3:], alone, rtol=1e-10,
                 atol=1e-12)
    # without the mask the padding tokens do leave a trace
    assert np.abs(model(padded).numpy()[:, 3:] - alone).max() > 1e-4
    # generate with a left-padded batch: each row as if alone
    both = np.concatenate([padded, np.concatenate([ids[:, :3], ids], axis=1)])
    out = model.generate(both, 4, attention_mask=np.concatenate([keep, np.ones_like(keep)]))
    assert np.array_equal(out.numpy()[0, 3:], model.generate(ids, 4).numpy()[0])


def test_counts_come_from_the_configuration():
    config = _config(hk=1, hv=3, dk=2, dv=5, kernel=4,
                     layers=("gated_deltanet", "full", "gated_deltanet"))
    model = Decoder(config)
    assert count_parameters(config)["total"] == sum(p.size for p in model.parameters())
    mixer = MIXERS["gated_deltanet"]
    assert mixer.parameter_count(config) == sum(p.size for p in
                                                model.blocks[0].attn.parameters())
    assert mixer.state_numbers(config, 0) == 0
    assert mixer.state_numbers(config, 7) == (2 * 2 + 3 * 5) * 3 + 3 * 2 * 5


@pytest.mark.parametrize("options, message", [
    (dict(num_k_heads=3, num_v_heads=4), "num_v_heads (4) must be a multiple of num_k_heads"),
    (dict(conv_kernal=4), "did you mean 'conv_kernel'"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(head_k_dim=2.5), "head_k_dim"),
])
def test_bad_mixer_options_are_refused_by_name(options, message):
    config = DecoderConfig(num_layers=1, layer_types=("gated_deltanet",), **SIZES,
                           mixer_options={"gated_deltanet": options})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Decoder(config)


def test_the_output_gate_switch_is_checked():
    with pytest.raises(ValueError, match="attn_output_gate"):
        Decoder(DecoderConfig(**{**SIZES, "attn_output_gate": "yes"}))


def test_the_hooks_see_and_replace_the_gates_and_the_state():
    """The hook points' shapes (heads in TransformerLens's layout), and β replaced by 0: the
    rule then writes nothing, the state stays zero and the layer outputs zero."""
    model = _model(_config())
    ids = np.random.default_rng(9).integers(0, 31, (2, 7))
    _, cache = model.run_with_cache(ids)
    shapes = {name: tuple(cache[f"blocks.0.attn.hook_{name}"].shape) for name in
              ("q", "k", "v", "beta", "log_alpha", "state", "out_gate", "z")}
    assert shapes == {"q": (2, 7, 4, 3), "k": (2, 7, 4, 3), "v": (2, 7, 4, 5),
                      "beta": (2, 4, 7), "log_alpha": (2, 4, 7), "state": (2, 4, 3, 5),
                      "out_gate": (2, 7, 4, 5), "z": (2, 7, 4, 5)}
    assert (cache["blocks.0.attn.hook_log_alpha"].numpy() < 0).all()
    layer = model.blocks[0].attn
    layer.hook_beta.add_hook(lambda t, h: t * 0.0)
    seen = {}
    layer.hook_state.add_hook(lambda t, h: seen.__setitem__("state", t.numpy()))
    x = np.random.default_rng(10).standard_normal((2, 7, 16))
    assert np.abs(layer(tensor(x)).numpy()).max() == 0.0
    assert np.abs(seen["state"]).max() == 0.0
