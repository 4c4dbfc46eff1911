"""GPT-2 loaded by ``minitx.pretrained.load`` against ``transformers.GPT2LMHeadModel``
(test-only oracle) on a tiny random checkpoint: logits, gradients, greedy generation."""
import json
import os

import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")
need("tokenizers")

import minitx  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from minitx.models import Decoder  # noqa: E402
from minitx.pretrained.decoders import decoder_from_hf, decoder_state_to_hf  # noqa: E402
from pretrained_util import max_abs, tiny_gpt2  # noqa: E402

TEXTS = ["Attention is all you need.", "The quick brown fox jumps over the lazy dog, happily!",
         "Café 東京 🤗 don't"]
TOL = {"float32": 1e-5, "float64": 1e-10}     # see test_pretrained_bert.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_gpt2(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def batch(folder):
    _, tok = pt.load(folder)
    b = tok(TEXTS)
    assert b["attention_mask"].min() == 0, "the batch must contain padding"
    return b


def hf_model(folder, dtype):
    m = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    return m.double() if dtype == "float64" else m


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logits_match_transformers(folder, batch, dtype):
    model, _ = pt.load(folder, dtype=dtype)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    with torch.no_grad():
        ref = hf_model(folder, dtype)(input_ids=torch.tensor(batch["input_ids"]),
                                      attention_mask=torch.tensor(batch["attention_mask"]))
    assert logits.dtype == np.dtype(dtype) and logits.shape == tuple(ref.logits.shape)
    # right padding: the real tokens never see the padding (causal), and the logits AT
    # padded positions are not meaningful for either library, so only real tokens count
    real = batch["attention_mask"].astype(bool)
    assert max_abs(logits.numpy(), ref.logits.numpy(), real) <= TOL[dtype]


def test_padding_mask_is_applied(folder):
    """Left padding: without the mask the real tokens would attend to the pad tokens.
    (Positions are 0 … N − 1 in both libraries' forward, whatever the padding.)"""
    model, tok = pt.load(folder)
    ids = tok(["the quick brown fox"])["input_ids"]
    pad = np.full((1, 3), tok.pad_token_id)
    padded = np.concatenate([pad, ids], axis=1)
    mask = np.concatenate([np.zeros((1, 3), int), np.ones_like(ids)], axis=1)
    with torch.no_grad():
        ref = hf_model(folder, "float32")(input_ids=torch.tensor(padded),
                                          attention_mask=torch.tensor(mask))
    mine = model(padded, attention_mask=mask).numpy()
    unmasked = model(padded).numpy()
    real = mask.astype(bool)
    assert max_abs(mine, ref.logits.numpy(), real) <= 1e-5
    assert max_abs(mine, unmasked, real) > 1e-3


def test_gradients_match_torch_autograd_float64(folder, batch):
    model, _ = pt.load(folder, dtype="float64")
    ref = hf_model(folder, "float64")
    ids = torch.tensor(batch["input_ids"])
    mask = batch["attention_mask"]
    rng = np.random.default_rng(2)
    weights = rng.standard_normal((*ids.shape, model.config.vocab_size)) * mask[:, :, None]
    emb_t = ref.transformer.wte(ids).detach().requires_grad_(True)
    out = ref(inputs_embeds=emb_t, attention_mask=torch.tensor(mask)).logits
    (out * torch.tensor(weights)).sum().backward()
    emb = minitx.tensor(emb_t.detach().numpy(), requires_grad=True)
    (model(inputs_embeds=emb, attention_mask=mask) * minitx.tensor(weights)).sum().backward()
    assert max_abs(emb.grad.numpy(), emb_t.grad.numpy()) <= 1e-10
    hf_grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    mapped = pt.gpt2_state_from_hf(hf_grads, model.config)
    mine = dict(model.named_parameters())
    assert set(mapped) == set(mine)               # the tied wte gets the head's gradient
    for key, g in mapped.items():
        assert max_abs(mine[key].grad.numpy(), g) <= 1e-10, key


@pytest.mark.parametrize("prompts", [["Attention is"], ["The quick brown", "Café 東京 🤗"]])
def test_greedy_generation_matches_transformers(folder, prompts):
    model, tok = pt.load(folder)
    ids = [tok.encode(p) for p in prompts]
    n = min(len(i) for i in ids)
    ids = np.array([i[:n] for i in ids])          # equal lengths: no padding in generate
    out = model.generate(ids, max_new_tokens=12)
    with torch.no_grad():
        ref = hf_model(folder, "float32").generate(torch.tensor(ids), max_new_tokens=12,
                                                   do_sample=False).numpy()
    assert isinstance(out, np.ndarray) and out.shape == (len(ids), n + 12)
    # HF stops early once every row produced eos; compare what it produced
    assert np.array_equal(out[:, :ref.shape[1]], ref)
    assert np.array_equal(model.generate(ids, max_new_tokens=12, use_cache=False), out)


def test_sampling_is_seeded(folder):
    model, tok = pt.load(folder)
    ids = np.array([tok.encode("the quick")])
    minitx.manual_seed(3)
    a = model.generate(ids, 10, temperature=1.0, top_k=20)
    minitx.manual_seed(3)
    b = model.generate(ids, 10, temperature=1.0, top_k=20)
    assert np.array_equal(a, b)


def test_state_dict_loads_into_minitx_gpt(folder):
    """Same parameter names as ``minitx.nn.GPT``: the state dict moves across as is."""
    model, _ = pt.load(folder)
    c = model.config
    gpt = minitx.nn.GPT(minitx.nn.GPTConfig(vocab_size=c.vocab_size, block_size=c.n_positions,
                                            n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd))
    gpt.load_state_dict(model.state_dict())       # strict: every key and shape agrees
    assert np.array_equal(gpt.wte.weight.numpy(), model.wte.weight.numpy())


def _as_decoder(folder, dtype):
    """The folder's GPT-2 read by the decoder families' root (``families/gpt2.py``)."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    return decoder_from_hf(cfg, pt.load_weights(folder, dtype="float64"), folder, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_lineages_root_builds_gpt2_as_a_decoder(folder, batch, dtype):
    """The same checkpoint read by the decoder families' root (``families/gpt2.py``) as a
    ``Decoder``: HF's logits, the GPT-2 loader's logits, and HF's tensors back from
    ``decoder_state_to_hf`` (Conv1D's transpose and the fused c_attn redone)."""
    model = _as_decoder(folder, dtype)
    assert type(model) is Decoder and model.config.positions == "learned"
    ids, mask = batch["input_ids"], batch["attention_mask"]
    real = mask.astype(bool)
    got = model(ids, attention_mask=mask).numpy()
    with torch.no_grad():
        ref = hf_model(folder, dtype)(input_ids=torch.tensor(ids),
                                      attention_mask=torch.tensor(mask)).logits.numpy()
    assert max_abs(got, ref, real) <= TOL[dtype]
    gpt2, _ = pt.load(folder, dtype=dtype)
    assert max_abs(got, gpt2(ids, attention_mask=mask).numpy(), real) <= TOL[dtype]
    hf = hf_model(folder, "float64").state_dict()
    back = decoder_state_to_hf(model.state_dict(), model)
    mine = {k: v for k, v in back.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert set(mine) == {k for k in hf if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    for key, value in mine.items():
        assert np.allclose(value, hf[key].numpy(), rtol=0, atol=1e-6), key


def test_the_lineages_root_greedy_tokens_match_transformers(folder, batch):
    model = _as_decoder(folder, "float64")
    ids = batch["input_ids"][:1, :5]
    got = model.generate(ids, max_new_tokens=8).numpy()
    with torch.no_grad():          # every token counts, and no stop at eos: 8 new tokens each
        want = hf_model(folder, "float64").generate(
            torch.tensor(ids), max_new_tokens=8, do_sample=False, eos_token_id=None,
            attention_mask=torch.ones(ids.shape, dtype=int), pad_token_id=0).numpy()
    assert got.shape == want.shape == (1, 13) and np.array_equal(got, want)
