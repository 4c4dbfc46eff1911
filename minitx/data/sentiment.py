"""Sentiment data: a generated review corpus whose labels depend on word order, and an IMDB loader.

The generated corpus has one *verdict* clause per review, hidden among neutral sentences:

    "the acting was good"                 → positive
    "the acting was not good"             → negative   (negation flips the adjective)
    "the plot was good but boring"        → negative   (after "but", the second part decides)
    "the plot was boring but not bad"     → positive

Every adjective appears as often in positive as in negative reviews, and "good but boring"
holds the same words as "boring but good", so counting words is not enough: a model has to
look at *which* word follows "not" and which side of "but" an adjective is on. That is
what attention is for. ``rule_label`` is the rule written down; the generator's labels are
checked against it in the tests.
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["POSITIVE", "NEGATIVE", "generate_reviews", "rule_label", "load_imdb"]

POSITIVE = ("good", "great", "excellent", "wonderful", "brilliant", "fun")
NEGATIVE = ("bad", "boring", "awful", "terrible", "dull", "weak")
_SUBJECTS = ("the movie", "the film", "the plot", "the acting", "the story", "the ending",
             "the cast", "the music")
_VERBS = ("was", "is", "felt", "seemed")
_INTENSIFIERS = ("really", "quite", "very", "so")
_FILLERS = ("i saw it on sunday", "my friend picked it", "it runs two hours",
            "we watched it at home", "the tickets were cheap", "i went with my sister",
            "it came out last year", "there is a long dog scene", "the cinema was full",
            "i had popcorn")


def _polarity(word):
    return 1 if word in POSITIVE else 0 if word in NEGATIVE else None


def rule_label(text) -> int:
    """The labelling rule: the last clause after "but" (or the whole review) decides; its
    sentiment adjective counts as positive/negative, flipped when "not" precedes it (with at
    most intensifiers in between). Returns 1 (positive) or 0 (negative); raises ValueError
    when the review holds no sentiment adjective.
    """
    toks = text.split() if isinstance(text, str) else list(text)
    if "but" in toks:
        toks = toks[len(toks) - 1 - toks[::-1].index("but") + 1:]
    for i, t in enumerate(toks):
        pol = _polarity(t)
        if pol is None:
            continue
        j = i - 1
        while j >= 0 and toks[j] in _INTENSIFIERS:
            j -= 1
        negated = j >= 0 and toks[j] == "not"
        return 1 - pol if negated else pol
    raise ValueError(f"no sentiment word in {text!r}")


def _adj_phrase(gen, negate):
    words = []
    if negate:
        words.append("not")
    if gen.random() < 0.3:
        words.append(str(gen.choice(_INTENSIFIERS)))
    words.append(str(gen.choice(POSITIVE + NEGATIVE)))
    return words


def _verdict(gen):
    subject = str(gen.choice(_SUBJECTS)).split()
    verb = [str(gen.choice(_VERBS))]
    form = gen.random()
    if form < 0.4:                                  # "the movie was good"
        return subject + verb + _adj_phrase(gen, False)
    if form < 0.7:                                  # "the movie was not good"
        return subject + verb + _adj_phrase(gen, True)
    return (subject + verb + _adj_phrase(gen, gen.random() < 0.3) + ["but"]   # contrast
            + _adj_phrase(gen, gen.random() < 0.3))


def generate_reviews(n: int, seed: int = 0, max_fillers: int = 2):
    """``n`` (text, label) pairs from the generator described above; labels ≈ balanced."""
    gen = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        clauses = [" ".join(_verdict(gen))]
        for _ in range(int(gen.integers(0, max_fillers + 1))):
            clauses.insert(int(gen.integers(0, len(clauses) + 1)), str(gen.choice(_FILLERS)))
        text = " , ".join(clauses)
        # fillers hold no sentiment words and no "but", so the rule reads the verdict
        out.append((text, rule_label(text)))
    return out


def load_imdb(root, split: str = "train", max_per_class: int = None, seed: int = 0):
    """Read the IMDB folder layout: ``root/{train,test}/{pos,neg}/*.txt``, one review a file.

    Returns a list of (text, label) with label 1 for ``pos`` and 0 for ``neg``, shuffled with
    ``seed``. ``max_per_class`` keeps the first files (sorted by name) of each class.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    items = []
    for label, sub in ((1, "pos"), (0, "neg")):
        folder = os.path.join(root, split, sub)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"IMDB layout expected {folder!r} (root/{split}/{sub}/*.txt)")
        names = sorted(f for f in os.listdir(folder) if f.endswith(".txt"))
        if max_per_class is not None:
            names = names[:max_per_class]
        for name in names:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
                items.append((fh.read().strip(), label))
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order]
