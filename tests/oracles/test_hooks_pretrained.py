"""Hook points of the pretrained BERT and GPT-2 against ``transformers`` (test-only oracle)
on the tiny random checkpoints: the cached patterns are HuggingFace's attentions and the cached
residual stream is HuggingFace's hidden states, in float64."""
import numpy as np

from support import need

torch = need("torch")
transformers = need("transformers")
need("tokenizers")

import minitx.pretrained as pt  # noqa: E402
from pretrained_util import max_abs, tiny_bert, tiny_gpt2  # noqa: E402

TEXTS = ["Attention is all you need.", "The quick brown fox jumps over the lazy dog!"]
TOL = 1e-10                  # float64 on both sides


def _hf(cls, folder, batch):
    model = cls.from_pretrained(folder, attn_implementation="eager").eval().double()
    with torch.no_grad():
        return model(input_ids=torch.tensor(batch["input_ids"]),
                     attention_mask=torch.tensor(batch["attention_mask"]),
                     output_attentions=True, output_hidden_states=True)


def test_gpt2_cache_matches_transformers_attentions_and_hidden_states(tmp_path_factory):
    folder = tiny_gpt2(tmp_path_factory.getbasetemp())
    model, tok = pt.load(folder, dtype="float64")
    batch = tok(TEXTS)
    logits, cache = model.run_with_cache(batch["input_ids"],
                                         attention_mask=batch["attention_mask"])
    ref = _hf(transformers.GPT2LMHeadModel, folder, batch)
    real = batch["attention_mask"].astype(bool)                       # (B, T)
    n = model.config.n_layer
    seen = set(cache)
    assert seen == set(model.hook_names())
    for i in range(n):
        pattern = cache["pattern", i].numpy()                          # (B, H, T, T)
        keys = np.broadcast_to(real[:, None, None, :], pattern.shape)
        rows = np.broadcast_to(real[:, None, :, None], pattern.shape)
        assert max_abs(pattern, ref.attentions[i].numpy(), keys & rows) <= TOL
        # HF's hidden_states[i] enters block i (the last one is after ln_f)
        assert max_abs(cache["resid_pre", i].numpy(), ref.hidden_states[i].numpy(),
                       real) <= TOL
    assert max_abs(cache["normalized", None, "ln_final"].numpy() * model.ln_f.weight.numpy()
                   + model.ln_f.bias.numpy(), ref.hidden_states[n].numpy(), real) <= TOL
    assert max_abs(logits.numpy(), ref.logits.numpy(), real) <= TOL


def test_bert_cache_matches_transformers_attentions_and_hidden_states(tmp_path_factory):
    folder = tiny_bert(tmp_path_factory.getbasetemp())
    model, tok = pt.load(folder, dtype="float64")
    batch = tok(TEXTS)
    hidden, cache = model.run_with_cache(batch["input_ids"],
                                         attention_mask=batch["attention_mask"])
    ref = _hf(transformers.BertModel, folder, batch)
    real = batch["attention_mask"].astype(bool)
    assert set(cache) == set(model.hook_names())
    for name in ("hook_embed", "hook_pos_embed", "hook_token_type_embed",
                 "embed.ln.hook_normalized", "blocks.1.attn.hook_pattern",
                 "blocks.0.mlp.hook_post"):
        assert name in cache
    n = model.config.num_hidden_layers
    for i in range(n):
        pattern = cache["pattern", i].numpy()
        keys = np.broadcast_to(real[:, None, None, :], pattern.shape)
        assert max_abs(pattern, ref.attentions[i].numpy(), keys) <= TOL
        assert max_abs(cache["resid_pre", i].numpy(), ref.hidden_states[i].numpy()) <= TOL
    assert max_abs(hidden.numpy(), ref.hidden_states[n].numpy()) <= TOL
