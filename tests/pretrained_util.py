"""Tiny random HuggingFace checkpoints for the pretrained-model tests, built once per session.

``tiny_bert(root)`` / ``tiny_gpt2(root)`` create (seeded) a 2-layer BERT and a 2-layer GPT-2
with ``transformers``, trained WordPiece / byte-level BPE vocabularies with ``tokenizers``,
and save everything with ``save_pretrained`` (safetensors) into a folder, as a HuggingFace
model folder looks. The test oracles (``transformers``, ``tokenizers``, ``torch``) are
test-only: callers skip with ``pytest.importorskip`` first. Every parameter — LayerNorm
gains and biases included — is re-drawn at random, so no term of the model is trivially 1
or 0 and a mis-mapped weight cannot hide.
"""
from __future__ import annotations

import json
import os
import random

import numpy as np

_BUILT = {}

WORDS = ("the quick brown fox jumps over lazy dog attention is all you need transformers "
         "learn to read tokens embedding layer norm residual query key value softmax heads "
         "café naïve résumé über straße 東京 北京 日本語 😀 🤗 don't it's we'll they're "
         "running jumped happily unbelievable tokenization").split()


def corpus(n=400, seed=0):
    """Seeded sentences over a small mixed-script word list (punctuation, digits, accents,
    CJK, emoji, contractions)."""
    g = random.Random(seed)
    out = []
    for _ in range(n):
        words = [g.choice(WORDS) for _ in range(g.randint(3, 12))]
        if g.random() < 0.3:
            words.insert(g.randrange(len(words)), str(g.randint(0, 2025)))
        s = " ".join(words)
        out.append(s[0].upper() + s[1:] + g.choice([".", "!", "?", ",", ""]))
    return out


def _randomize(model, torch, seed, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * scale
            p.copy_((1.0 + noise) if "LayerNorm.weight" in name or "ln_" in name else noise)


def add_bert_post_processor(tok):
    """[CLS] A [SEP] / [CLS] A [SEP] B [SEP], as a real BERT tokenizer.json has (a freshly
    trained ``BertWordPieceTokenizer`` has no post-processor yet)."""
    from tokenizers import processors
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))


def tiny_bert(root):
    """Path of a folder holding a random 2-layer BERT + a trained WordPiece tokenizer."""
    if "bert" in _BUILT:
        return _BUILT["bert"]
    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer

    folder = os.path.join(os.fspath(root), "tiny-bert")
    os.makedirs(folder, exist_ok=True)
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(corpus(), vocab_size=300, min_frequency=1,
                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    add_bert_post_processor(tok)
    tok.save_model(folder)                                         # vocab.txt
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"do_lower_case": True, "tokenize_chinese_chars": True,
                   "strip_accents": None, "model_max_length": 64,
                   "tokenizer_class": "BertTokenizer"}, fh)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
        type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
    model = transformers.BertModel(config).eval()
    _randomize(model, torch, seed=1)
    model.save_pretrained(folder)
    _BUILT["bert"] = folder
    return folder


def tiny_gpt2(root):
    """Path of a folder holding a random 2-layer GPT-2 + a trained byte-level BPE."""
    if "gpt2" in _BUILT:
        return _BUILT["gpt2"]
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = os.path.join(os.fspath(root), "tiny-gpt2")
    os.makedirs(folder, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    tok.model.save(folder)                                         # vocab.json, merges.txt
    eos = tok.token_to_id("<|endoftext|>")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"model_max_length": 64, "eos_token": "<|endoftext|>",
                   "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                   "add_prefix_space": False, "tokenizer_class": "GPT2Tokenizer"}, fh)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model = transformers.GPT2LMHeadModel(config).eval()
    _randomize(model, torch, seed=2)
    model.save_pretrained(folder)
    _BUILT["gpt2"] = folder
    return folder


def minitx_bert(root):
    """A BERT folder written by minitx alone — no ``transformers`` needed: a hand-made
    WordPiece vocabulary and seeded random weights, saved under HuggingFace's key names
    (``bert_state_to_hf`` + ``save_file``). For tests that need a loadable folder (refusals,
    the example) but no oracle."""
    if "minitx-bert" in _BUILT:
        return _BUILT["minitx-bert"]
    import minitx
    import minitx.pretrained as pt
    from minitx.pretrained.safetensors import save_file

    folder = os.path.join(os.fspath(root), "minitx-bert")
    os.makedirs(folder, exist_ok=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(letters + "0123456789.,!?'")
             + sorted({w.lower() for w in WORDS if w.isascii() and w.isalpha()})
             + ["##" + c for c in letters] + ["##s", "##ing", "##ed", "##ly"])
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(vocab) + "\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"do_lower_case": True, "model_max_length": 64}, fh)
    config = dict(model_type="bert", vocab_size=len(vocab), hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
                  layer_norm_eps=1e-12, pad_token_id=0)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    minitx.manual_seed(0)
    model = pt.BertModel(pt.BertConfig.from_dict(config))
    save_file(pt.bert_state_to_hf(model.state_dict()), os.path.join(folder, "model.safetensors"))
    _BUILT["minitx-bert"] = folder
    return folder


def max_abs(a, b, mask=None):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = np.abs(a - b)
    return float(d[mask].max() if mask is not None else d.max())
