"""Transformer blocks: gradients, keys, every registered variant dropped into every block,
masks reaching the variants, incremental decoding through a decoder layer, errors."""
import numpy as np
import pytest

import minitx
import minitx.nn as nn
from minitx.attention import REGISTRY, KVCache
from support import tensor


def enc_layer(**kw):
    kw = {"dim_feedforward": 6, "dropout": 0.0, "batch_first": True, **kw}
    return nn.TransformerEncoderLayer(4, 2, **kw).to(dtype="float64")


def dec_layer(**kw):
    kw = {"dim_feedforward": 6, "dropout": 0.0, "batch_first": True, **kw}
    return nn.TransformerDecoderLayer(4, 2, **kw).to(dtype="float64")


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("n", [1, 7])
def test_encoder_layer_gradcheck(rng, norm_first, n):
    layer = enc_layer(norm_first=norm_first, activation="gelu")
    pad = np.zeros((2, n), bool)
    pad[0, -1] = n > 1
    x = tensor(rng.standard_normal((2, n, 4)), requires_grad=True)
    minitx.gradcheck(lambda x: layer(x, src_key_padding_mask=pad, is_causal=True), (x,))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradcheck(rng, norm_first):
    layer = dec_layer(norm_first=norm_first)
    x, m = (tensor(rng.standard_normal(s), requires_grad=True) for s in ((2, 5, 4), (2, 3, 4)))
    minitx.gradcheck(lambda x, m, w: layer(x, m, tgt_is_causal=True),
                     (x, m, layer.multihead_attn.in_proj_weight))


def test_state_dict_keys_are_pytorchs():
    keys = set(nn.TransformerEncoderLayer(8, 2).state_dict())
    assert keys == {"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                    "self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear1.weight",
                    "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight",
                    "norm1.bias", "norm2.weight", "norm2.bias"}
    dkeys = set(nn.TransformerDecoderLayer(8, 2).state_dict())
    assert dkeys == keys | {"multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias",
                            "multihead_attn.out_proj.weight", "multihead_attn.out_proj.bias",
                            "norm3.weight", "norm3.bias"}
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 2, norm=nn.LayerNorm(8))
    assert "layers.1.linear2.bias" in stack.state_dict() and "norm.weight" in stack.state_dict()
    swapped = nn.TransformerEncoderLayer(8, 2, attention="rope")
    assert "self_attn.q_proj.weight" in swapped.state_dict()


def _build(cls, name, **kw):
    return cls(8, 2, dim_feedforward=8, dropout=0.0, batch_first=True, attention=name, **kw)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_variant_drops_into_every_block(rng, name):
    x = tensor(rng.standard_normal((2, 8, 8)))
    m = tensor(rng.standard_normal((2, 5, 8)))
    enc = _build(nn.TransformerEncoderLayer, name)
    assert enc(x).shape == (2, 8, 8)
    assert type(enc.self_attn) is REGISTRY[name]
    if not getattr(REGISTRY[name], "supports_causal", True):
        # the decoder's self-attention is causal: a variant that cannot mask the future
        # must refuse it loudly (any other ValueError, or none, fails the test)
        with pytest.raises(ValueError, match="causal"):
            _build(nn.TransformerDecoderLayer, name)
        return
    dec = _build(nn.TransformerDecoderLayer, name)
    assert dec(x, m).shape == (2, 8, 8)
    assert dec.self_attn.causal                                  # decoder: causal by default
    # the decoder self-attention never looks ahead
    x2 = x.numpy().copy()
    x2[:, 5:] += 1.0
    np.testing.assert_allclose(dec(tensor(x2), m).numpy()[:, :5], dec(x, m).numpy()[:, :5],
                               atol=1e-5)


def test_masks_reach_exact_variants_and_are_refused_by_others(rng):
    x = tensor(rng.standard_normal((2, 6, 4)))
    layer = enc_layer(attention="mha")
    pad = np.zeros((2, 6), bool)
    pad[1, 4:] = True
    y = layer(x, src_key_padding_mask=pad).numpy()
    x2 = x.numpy().copy()
    x2[1, 4:] = 9.0                                             # padding content is ignored
    np.testing.assert_allclose(layer(tensor(x2), src_key_padding_mask=pad).numpy()[1, :4],
                               y[1, :4], atol=1e-12)
    local = nn.TransformerEncoderLayer(4, 2, 6, attention="local", batch_first=True,
                                       attention_options={"window": 2})
    with pytest.raises(ValueError, match="attention='local' does not accept masks"):
        local(x.astype("float32"), src_key_padding_mask=pad)


def test_variant_in_seq_first_layout_matches_batch_first(rng):
    bf = enc_layer(attention="alibi", attention_options={"causal": True})
    sf = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, attention="alibi",
                                    attention_options={"causal": True}).to(dtype="float64")
    sf.load_state_dict(bf.state_dict())
    x = rng.standard_normal((2, 5, 4))
    np.testing.assert_allclose(sf(tensor(x.transpose(1, 0, 2))).numpy().transpose(1, 0, 2),
                               bf(tensor(x)).numpy(), atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("attention", [None, "gqa", "rope"])
def test_decoder_layer_incremental_equals_full(rng, norm_first, attention):
    layer = dec_layer(norm_first=norm_first, attention=attention)
    x, m = rng.standard_normal((2, 6, 4)), tensor(rng.standard_normal((2, 3, 4)))
    full = layer(tensor(x), m, tgt_is_causal=True).numpy()
    cache = KVCache()
    steps = [layer(tensor(x[:, t:t + 1]), m, tgt_is_causal=True, kv_cache=cache).numpy()
             for t in range(6)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)


def test_stack_decoder_with_caches(rng):
    dec = nn.TransformerDecoder(dec_layer(), 2, norm=nn.LayerNorm(4).to(dtype="float64"))
    x, m = rng.standard_normal((1, 4, 4)), tensor(rng.standard_normal((1, 3, 4)))
    full = dec(tensor(x), m, tgt_is_causal=True).numpy()
    caches = [KVCache(), KVCache()]
    steps = [dec(tensor(x[:, t:t + 1]), m, tgt_is_causal=True, kv_caches=caches).numpy()
             for t in range(4)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)
    with pytest.raises(ValueError, match="one cache per layer"):
        dec(tensor(x), m, kv_caches=[KVCache()])


def test_activation_callable_and_errors(rng):
    layer = enc_layer(activation=minitx.functional.tanh)
    assert layer(tensor(rng.standard_normal((1, 3, 4)))).shape == (1, 3, 4)
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or a callable"):
        nn.TransformerEncoderLayer(4, 2, activation="swish")
    with pytest.raises(ValueError, match="attention must be None or one of"):
        nn.TransformerEncoderLayer(4, 2, attention="nope")
    with pytest.raises(ValueError, match=r"embed_dim \(6\) must be divisible by num_heads \(4\)"):
        nn.TransformerEncoderLayer(6, 4)
    with pytest.raises(ValueError, match=r"src must be \(S, N, E\) with E=4"):
        nn.TransformerEncoderLayer(4, 2)(tensor(np.zeros((3, 2, 5)), requires_grad=True))
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2), 0)
    with pytest.raises(ValueError, match="attention_options"):
        nn.TransformerEncoderLayer(4, 2, attention_options={"window": 2})
