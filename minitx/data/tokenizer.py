"""A tiny word/character tokenizer and vocabulary.

    vocab = Vocab.build(["the movie was good", "not good"], min_freq=1)
    ids = vocab.encode("the movie was not good")       # list of ints
    vocab.decode(ids)                                   # "the movie was not good"

Special tokens come first, so their ids are fixed: <pad>=0, <unk>=1, <bos>=2, <eos>=3,
<cls>=4.
"""
from __future__ import annotations

import re
from collections import Counter

__all__ = ["tokenize", "Vocab", "CharVocab", "SPECIALS", "PAD", "UNK", "BOS", "EOS", "CLS"]

PAD, UNK, BOS, EOS, CLS = "<pad>", "<unk>", "<bos>", "<eos>", "<cls>"
SPECIALS = (PAD, UNK, BOS, EOS, CLS)

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> list:
    """Lower-case word tokens; punctuation marks become their own tokens; HTML breaks go."""
    text = text.lower().replace("<br />", " ").replace("<br/>", " ")
    return _TOKEN.findall(text)


class Vocab:
    """Word ↔ id mapping with the special tokens first."""

    def __init__(self, tokens):
        self.itos = list(SPECIALS) + [t for t in tokens if t not in SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def build(cls, texts, min_freq: int = 1, max_size: int = None):
        """Count tokens over ``texts`` (strings or token lists); most frequent first."""
        counts = Counter()
        for t in texts:
            counts.update(tokenize(t) if isinstance(t, str) else t)
        words = sorted((w for w, c in counts.items() if c >= min_freq),
                       key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max(0, max_size - len(SPECIALS))]
        return cls(words)

    def __len__(self):
        return len(self.itos)

    pad_id = property(lambda self: self.stoi[PAD])
    unk_id = property(lambda self: self.stoi[UNK])
    bos_id = property(lambda self: self.stoi[BOS])
    eos_id = property(lambda self: self.stoi[EOS])
    cls_id = property(lambda self: self.stoi[CLS])

    def encode(self, text) -> list:
        toks = tokenize(text) if isinstance(text, str) else text
        unk = self.unk_id
        return [self.stoi.get(t, unk) for t in toks]

    def decode(self, ids, skip_specials: bool = True) -> str:
        out = []
        for i in ids:
            t = self.itos[int(i)]
            if skip_specials and t in SPECIALS:
                continue
            out.append(t)
        return " ".join(out)


class CharVocab:
    """Character ↔ id mapping (characters sorted, so a text gives the same ids everywhere)."""

    def __init__(self, text: str):
        self.itos = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self):
        return len(self.itos)

    def encode(self, text: str) -> list:
        return [self.stoi[c] for c in text if c in self.stoi]

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] for i in ids)
