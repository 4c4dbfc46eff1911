"""``minitx.interop``: models handed to PyTorch (and back) compute the same numbers —
outputs, losses and gradients — with PyTorch itself as the oracle."""
import sys

import numpy as np
import pytest

from support import need

import minitx
import minitx.interop as interop
from minitx import nn

torch = need("torch")

from pretrained_util import max_abs  # noqa: E402


def t64(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("attention, tie", [("mha", True), ("gqa", False)])
def test_gpt_exported_to_torch_gives_the_same_loss_and_gradients(attention, tie):
    """The claim of the docs: export a minitx GPT and go on training it under PyTorch (DDP,
    FSDP …) — same loss, same gradient for every parameter (float64)."""
    minitx.manual_seed(0)
    cfg = nn.GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32,
                       attention=attention, tie_weights=tie)
    model = nn.GPT(cfg).to(dtype=np.float64)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 50, size=(3, 12))
    targets = rng.integers(0, 50, size=(3, 12))
    targets[0, :4] = -100                                   # ignored positions
    logits, loss = model(minitx.tensor(idx), minitx.tensor(targets))
    loss.backward()
    tm = interop.to_torch(model)
    assert next(tm.parameters()).dtype == torch.float64
    t_logits, t_loss = tm(torch.tensor(idx), torch.tensor(targets))
    t_loss.backward()
    assert abs(float(loss.item()) - float(t_loss.detach())) <= 1e-12
    assert max_abs(logits.numpy(), t_logits.detach().numpy()) <= 1e-10
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    t_grads = {k: p.grad.numpy() for k, p in tm.named_parameters()}
    assert set(grads) == set(t_grads)
    for k in grads:
        assert max_abs(grads[k], t_grads[k]) <= 1e-10, k
    # one optimizer step in PyTorch, then back: the minitx model continues from there
    opt = torch.optim.SGD(tm.parameters(), lr=0.1)
    opt.step()
    back = interop.from_torch(tm)
    for k, v in back.state_dict().items():
        assert np.array_equal(v, tm.state_dict()[k].numpy()), k
    _, loss2 = back(minitx.tensor(idx), minitx.tensor(targets))
    with torch.no_grad():
        t_loss2 = float(tm(torch.tensor(idx), torch.tensor(targets))[1])
    assert abs(float(loss2.item()) - t_loss2) <= 1e-12


def test_multihead_attention_both_ways(rng):
    mha = nn.MultiheadAttention(16, 4, batch_first=True).to(dtype=np.float64)
    tm = interop.to_torch(mha).eval()
    x = rng.standard_normal((2, 5, 16))
    pad = np.array([[False] * 5, [False] * 3 + [True] * 2])
    out, w = mha(minitx.tensor(x), minitx.tensor(x), minitx.tensor(x), key_padding_mask=pad)
    t_out, t_w = tm(t64(x), t64(x), t64(x), key_padding_mask=torch.tensor(pad))
    assert max_abs(out.numpy(), t_out.detach().numpy()) <= 1e-12
    assert max_abs(w.numpy(), t_w.detach().numpy()) <= 1e-12
    back = interop.from_torch(tm)
    assert isinstance(back, nn.MultiheadAttention) and back.batch_first
    for k, v in mha.state_dict().items():
        assert np.array_equal(back.state_dict()[k], v)


@pytest.mark.parametrize("norm_first, activation", [(False, "gelu"), (True, "relu")])
def test_encoder_stack_both_ways(rng, norm_first, activation):
    layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if norm_first else None)
    enc.to(dtype=np.float64).eval()
    tm = interop.to_torch(enc)
    assert not tm.training
    x = rng.standard_normal((2, 6, 16))
    pad = np.zeros((2, 6), bool)
    pad[1, 4:] = True
    got = enc(minitx.tensor(x), src_key_padding_mask=pad).numpy()
    want = tm(t64(x), src_key_padding_mask=torch.tensor(pad)).detach().numpy()
    real = ~pad
    assert max_abs(got, want, real) <= 1e-12
    back = interop.from_torch(tm)
    assert np.array_equal(back(minitx.tensor(x), src_key_padding_mask=pad).numpy(), got)


def test_decoder_layer_both_ways(rng):
    dec = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    dec.to(dtype=np.float64).eval()
    tm = interop.to_torch(dec)
    tgt, mem = rng.standard_normal((2, 4, 16)), rng.standard_normal((2, 7, 16))
    got = dec(minitx.tensor(tgt), minitx.tensor(mem), tgt_is_causal=True).numpy()
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    want = tm(t64(tgt), t64(mem), tgt_mask=causal, tgt_is_causal=True).detach().numpy()
    assert max_abs(got, want) <= 1e-12
    assert isinstance(interop.from_torch(tm), nn.TransformerDecoderLayer)


def test_pretrained_models_go_to_transformers_and_back(tmp_path_factory):
    transformers = need("transformers")
    need("tokenizers")
    import minitx.pretrained as pt
    from pretrained_util import tiny_bert, tiny_gpt2
    root = tmp_path_factory.getbasetemp()
    for folder, hf_cls in ((tiny_bert(root), transformers.BertModel),
                           (tiny_gpt2(root), transformers.GPT2LMHeadModel)):
        model, tok = pt.load(folder, dtype="float64")
        b = tok(["attention is all you need", "the dog"])
        exported = interop.to_torch(model)
        assert isinstance(exported, hf_cls) and not exported.training
        ours = model(b["input_ids"], attention_mask=b["attention_mask"]).numpy()
        with torch.no_grad():
            out = exported(input_ids=torch.tensor(b["input_ids"]),
                           attention_mask=torch.tensor(b["attention_mask"]))
        theirs = (out.last_hidden_state if hf_cls is transformers.BertModel else out.logits)
        real = b["attention_mask"].astype(bool)
        assert max_abs(ours, theirs.numpy(), real) <= 1e-10
        back = interop.from_torch(exported)
        for k, v in model.state_dict().items():
            assert np.array_equal(back.state_dict()[k], v), k


def test_refusals():
    with pytest.raises(ValueError, match="no PyTorch counterpart for Linear"):
        interop.to_torch(nn.Linear(2, 2))
    layer = nn.TransformerEncoderLayer(8, 2, 16, attention="local",
                                       attention_options={"window": 2})
    with pytest.raises(ValueError, match="attention='local' has no PyTorch counterpart"):
        interop.to_torch(layer)
    with pytest.raises(ValueError, match="no minitx counterpart for Conv1d"):
        interop.from_torch(torch.nn.Conv1d(2, 2, 3))


def test_missing_torch_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="minitx.interop needs PyTorch: `pip install torch`"):
        interop.to_torch(nn.MultiheadAttention(4, 2))
