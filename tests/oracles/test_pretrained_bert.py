"""BERT loaded by ``minitx.pretrained.load`` against ``transformers.BertModel`` (test-only
oracle) on a tiny random checkpoint: hidden states, pooler, attention maps, gradients with
respect to the input embeddings and to every parameter, float32 and float64."""
import numpy as np
import pytest

from support import need

torch = need("torch")
transformers = need("transformers")
need("tokenizers")

import minitx  # noqa: E402
import minitx.pretrained as pt  # noqa: E402
from pretrained_util import max_abs, tiny_bert  # noqa: E402

TEXTS = ["Attention is all you need.", "The quick brown fox jumps over the lazy dog, happily!",
         "Café 東京 🤗", "it's"]
# float32: 2 layers of O(1) activations, LayerNorm eps 1e-12, a few ulps (6e-8) per op;
# float64: the same sums in double precision
TOL = {"float32": 1e-5, "float64": 1e-10}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_bert(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def batch(folder):
    _, tok = pt.load(folder)
    b = tok(TEXTS)
    assert b["attention_mask"].min() == 0, "the batch must contain padding"
    rng = np.random.default_rng(0)
    b["token_type_ids"] = rng.integers(0, 2, size=b["input_ids"].shape) * b["attention_mask"]
    return b


def hf_model(folder, dtype, eager=False):
    kw = {"attn_implementation": "eager"} if eager else {}
    m = transformers.BertModel.from_pretrained(folder, **kw).eval()
    return m.double() if dtype == "float64" else m


def as_torch(b):
    return {k: torch.tensor(v) for k, v in b.items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hidden_states_and_pooler_match_transformers(folder, batch, dtype):
    model, _ = pt.load(folder, dtype=dtype)
    assert all(p.dtype == np.dtype(dtype) for p in model.parameters())
    h = model(batch["input_ids"], attention_mask=batch["attention_mask"],
              token_type_ids=batch["token_type_ids"])
    with torch.no_grad():
        ref = hf_model(folder, dtype)(**as_torch(batch))
    assert h.shape == tuple(ref.last_hidden_state.shape)
    # HF computes padded query rows like any other (padding keys masked), so every
    # position is compared, padded ones included
    assert max_abs(h.numpy(), ref.last_hidden_state.numpy()) <= TOL[dtype]
    assert max_abs(model.pool(h).numpy(), ref.pooler_output.numpy()) <= TOL[dtype]


def test_token_type_ids_matter_and_default_to_zero(folder, batch):
    model, _ = pt.load(folder)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    h0 = model(ids, attention_mask=mask).numpy()
    hz = model(ids, attention_mask=mask, token_type_ids=np.zeros_like(ids)).numpy()
    h1 = model(ids, attention_mask=mask, token_type_ids=batch["token_type_ids"]).numpy()
    assert np.array_equal(h0, hz)
    assert max_abs(h0, h1) > 1e-3


def test_attention_maps_match_transformers(folder, batch):
    model, _ = pt.load(folder)
    model.record_attention(True)
    model(batch["input_ids"], attention_mask=batch["attention_mask"])
    maps = model.attention_maps()
    assert list(maps) == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    with torch.no_grad():
        ref = hf_model(folder, "float32", eager=True)(
            input_ids=torch.tensor(batch["input_ids"]),
            attention_mask=torch.tensor(batch["attention_mask"]), output_attentions=True)
    for mine, theirs in zip(maps.values(), ref.attentions):
        mine = minitx.backend.to_host(mine)
        assert mine.shape == tuple(theirs.shape)              # (B, H, N, N)
        assert max_abs(mine, theirs.numpy()) <= 1e-6          # probabilities in [0, 1]
    padding_keys = np.broadcast_to((batch["attention_mask"] == 0)[:, None, None, :], mine.shape)
    assert padding_keys.any() and np.all(mine[padding_keys] == 0)
    model.record_attention(False)
    assert model.attention_maps() == {}


def test_gradients_match_torch_autograd_float64(folder, batch):
    model, _ = pt.load(folder, dtype="float64")
    ref = hf_model(folder, "float64")
    ids = torch.tensor(batch["input_ids"])
    mask = batch["attention_mask"]
    rng = np.random.default_rng(1)
    weights = rng.standard_normal((*ids.shape, 32)) * mask[:, :, None]   # real tokens only
    # oracle: torch autograd through HF's model
    emb_t = ref.embeddings.word_embeddings(ids).detach().requires_grad_(True)
    out = ref(inputs_embeds=emb_t, attention_mask=torch.tensor(mask),
              token_type_ids=torch.tensor(batch["token_type_ids"])).last_hidden_state
    (out * torch.tensor(weights)).sum().backward()
    # minitx
    emb = minitx.tensor(emb_t.detach().numpy(), requires_grad=True)
    h = model(inputs_embeds=emb, attention_mask=mask, token_type_ids=batch["token_type_ids"])
    (h * minitx.tensor(weights)).sum().backward()
    assert max_abs(emb.grad.numpy(), emb_t.grad.numpy()) <= 1e-10
    # every parameter's gradient, mapped with the same HF → minitx key mapping as the weights
    hf_grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    mapped = pt.bert_state_from_hf(hf_grads)
    mine = dict(model.named_parameters())
    compared = 0
    for key, g in mapped.items():
        if key.startswith("embeddings.word_embeddings"):
            continue                      # inputs_embeds bypasses the word table in both
        assert mine[key].grad is not None, key
        assert max_abs(mine[key].grad.numpy(), g) <= 1e-10, key
        compared += 1
    assert compared == len(mine) - 1 - 2          # all but word embeddings and the pooler
