"""GPT, the encoder–decoder Transformer and EncoderClassifier: shapes, tied weights,
causality, cached generation = uncached generation, padding invariance, attention maps,
gradients of parameters."""
import numpy as np
import pytest

import minitx
import minitx.nn as nn
from support import assert_equal, to_host


def gpt(**kw):
    cfg = dict(vocab_size=11, block_size=10, n_layer=2, n_head=2, n_embd=8)
    cfg.update(kw)
    minitx.manual_seed(0)
    return nn.GPT(nn.GPTConfig(**cfg)).eval()


# ---- GPT ---------------------------------------------------------------------------------

def test_gpt_forward_loss_and_tied_head(rng):
    model = gpt()
    idx = rng.integers(0, 11, (2, 7))
    logits, loss = model(idx, targets=idx)
    assert logits.shape == (2, 7, 11) and loss.shape == ()
    assert abs(float(loss.item()) - np.log(11)) < 0.5             # small init: near uniform
    keys = list(model.state_dict())
    assert "wte.weight" in keys and "wpe.weight" in keys and "lm_head.weight" not in keys
    assert "h.1.attn.q_proj.weight" in keys and "ln_f.weight" in keys
    loss.backward()
    assert model.wte.weight.grad is not None
    untied = gpt(tie_weights=False)
    assert "lm_head.weight" in untied.state_dict()


def test_gpt_gradcheck_parameters(rng):
    model = gpt(n_layer=1, n_embd=4, vocab_size=5, block_size=7).to(dtype="float64")
    idx = rng.integers(0, 5, (1, 7))
    minitx.gradcheck(lambda w: model(idx)[0], (model.wte.weight,))
    minitx.gradcheck(lambda w: model(idx)[0], (model.h[0].attn.q_proj.weight,))


@pytest.mark.parametrize("position,attention,kv", [
    ("learned", "mha", None), ("learned", "gqa", None), ("rope", "mha", 1),
    ("alibi", "alibi", None), ("relative", "mha", None), ("sinusoidal", "local", None),
    ("none", "mqa", None)])
def test_gpt_is_causal(rng, position, attention, kv):
    opts = {"window": 3} if attention == "local" else {}
    model = gpt(position=position, attention=attention, num_kv_heads=kv,
                attention_options=opts)
    idx = rng.integers(0, 11, (2, 9))
    logits = model(idx)[0].numpy()
    for t in (0, 3, 7):
        idx2 = idx.copy()
        idx2[:, t + 1:] = rng.integers(0, 11, idx2[:, t + 1:].shape)
        np.testing.assert_allclose(model(idx2)[0].numpy()[:, :t + 1], logits[:, :t + 1],
                                   atol=1e-5)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "relative"])
def test_gpt_cached_generation_equals_uncached(rng, position):
    model = gpt(position=position, num_kv_heads=1 if position == "rope" else None)
    idx = rng.integers(0, 11, (2, 3))
    greedy = to_host(model.generate(idx, 12, top_k=1, use_cache=False))  # past block_size=10
    assert greedy.shape == (2, 15)
    assert_equal(model.generate(idx, 12, top_k=1), greedy)
    assert_equal(model.generate(idx, 12, temperature=0, paged=True), greedy)
    np.testing.assert_array_equal(greedy[:, :3], idx)
    minitx.manual_seed(5)
    a = model.generate(idx, 6, temperature=0.8, top_k=4)
    minitx.manual_seed(5)
    b = model.generate(idx, 6, temperature=0.8, top_k=4, use_cache=False)
    assert_equal(a, b)                                           # same seed, same samples


def test_gpt_uncacheable_variant_falls_back(rng):
    model = gpt(attention="local", attention_options={"window": 3}, position="sinusoidal")
    assert not model.supports_kv_cache
    idx = rng.integers(0, 11, (1, 2))
    assert model.generate(idx, 4, top_k=1).shape == (1, 6)


def test_gpt_attention_maps_and_errors(rng):
    model = gpt()
    model.record_attention(True)
    model(rng.integers(0, 11, (2, 6)))
    maps = model.attention_maps()
    assert set(maps) == {"h.0.attn", "h.1.attn"} and maps["h.0.attn"].shape == (2, 2, 6, 6)
    np.testing.assert_allclose(np.triu(to_host(maps["h.1.attn"])[0, 0], 1), 0)
    model.record_attention(False)
    assert model.attention_maps() == {}
    with pytest.raises(ValueError, match="exceeds block_size=10"):
        model(rng.integers(0, 11, (1, 11)))
    with pytest.raises(ValueError, match="position must be one of"):
        gpt(position="spiral")
    with pytest.raises(ValueError, match="position='rope' selects"):
        gpt(position="rope", attention="local")
    with pytest.raises(ValueError, match="must be a .B, T. integer array"):
        model(np.zeros((2, 3)))


# ---- encoder–decoder ---------------------------------------------------------------------

def seq2seq(**kw):
    minitx.manual_seed(0)
    return nn.Transformer(9, 10, d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                          dim_feedforward=16, dropout=0.0, pad_idx=0, **kw).eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_greedy_decode_cached_equals_uncached(rng, norm_first):
    model = seq2seq(norm_first=norm_first)
    src = rng.integers(1, 9, (3, 6))
    src[1, 4:] = 0                                               # padding
    out = to_host(model.greedy_decode(src, 8, bos_idx=1))
    assert_equal(out, model.greedy_decode(src, 8, bos_idx=1, use_cache=False))
    assert out.shape == (3, 8) and np.all(out[:, 0] == 1)
    eos = int(out[0, 1])
    short = model.greedy_decode(src[:1], 8, bos_idx=1, eos_idx=eos)
    assert short.shape == (1, 2)


def test_transformer_causal_decoder_padding_and_cross_attention_maps(rng):
    model = seq2seq()
    src, tgt = rng.integers(1, 9, (2, 5)), rng.integers(1, 10, (2, 6))
    src[0, 3:] = 0
    logits = model(src, tgt).numpy()
    assert logits.shape == (2, 6, 10)
    tgt2 = tgt.copy()
    tgt2[:, 4:] = 3
    np.testing.assert_allclose(model(src, tgt2).numpy()[:, :4], logits[:, :4], atol=1e-5)
    model.record_attention(True)
    model(src, tgt)
    cross = to_host(model.attention_maps()["decoder.layers.1.multihead_attn"])
    assert cross.shape == (2, 2, 6, 5)
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
    assert np.all(cross[0, :, :, 3:] == 0)                       # padded source positions
    loss = minitx.functional.cross_entropy(
        minitx.functional.reshape(model(src, tgt), (12, 10)), tgt.reshape(-1))
    loss.backward()
    assert model.src_embed.weight.grad is not None


# ---- classifier --------------------------------------------------------------------------

@pytest.mark.parametrize("pooling,position", [("mean", "sinusoidal"), ("cls", "learned"),
                                              ("mean", "none")])
def test_classifier_padding_invariance_and_maps(rng, pooling, position):
    minitx.manual_seed(0)
    model = nn.EncoderClassifier(12, 3, d_model=8, nhead=2, num_layers=2, pooling=pooling,
                                 position=position, pad_idx=0, dropout=0.0).eval()
    tokens = rng.integers(1, 12, (2, 7))
    tokens[1, 5:] = 0
    logits = model(tokens).numpy()
    assert logits.shape == (2, 3)
    longer = np.concatenate([tokens, np.zeros((2, 3), tokens.dtype)], axis=1)
    np.testing.assert_allclose(model(longer).numpy(), logits, atol=1e-5)
    model.record_attention(True)
    model(tokens)
    maps = model.attention_maps()
    n = 8 if pooling == "cls" else 7
    assert maps["encoder.layers.0.self_attn"].shape == (2, 2, n, n)


def test_classifier_gradcheck_and_variant(rng):
    model = nn.EncoderClassifier(6, 2, d_model=4, nhead=2, num_layers=1, dropout=0.0,
                                 pooling="cls").to(dtype="float64")
    tokens = rng.integers(0, 6, (2, 5))
    minitx.gradcheck(lambda c: model(tokens), (model.cls_token,))
    minitx.gradcheck(lambda w: model(tokens), (model.encoder.layers[0].linear1.weight,))
    swapped = nn.EncoderClassifier(6, 2, d_model=8, nhead=2, attention="performer",
                                   pooling="mean")
    assert swapped(tokens).shape == (2, 2)
    with pytest.raises(ValueError, match="pooling must be 'mean' or 'cls'"):
        nn.EncoderClassifier(6, 2, pooling="max")
