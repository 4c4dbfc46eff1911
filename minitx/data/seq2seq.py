"""Synthetic sequence-to-sequence tasks: reverse, sort, copy.

Token ids: 0 = <pad>, 1 = <bos>, 2 = <eos>, symbols are 3 … 3 + vocab − 1.

    src: a1 a2 … an <eos> <pad> …          (the encoder's input)
    tgt: <bos> b1 b2 … bn <eos> <pad> …    (teacher forcing: the decoder sees tgt[:-1]
                                            and predicts tgt[1:])

Held-out sequences never appear in the training set (checked, not hoped for).
"""
from __future__ import annotations

import numpy as np

__all__ = ["SEQ_PAD", "SEQ_BOS", "SEQ_EOS", "SEQ_OFFSET", "TASKS", "task_output",
           "make_seq2seq", "seq2seq_split", "strip_special"]

SEQ_PAD, SEQ_BOS, SEQ_EOS, SEQ_OFFSET = 0, 1, 2, 3
TASKS = ("reverse", "sort", "copy")


def task_output(task: str, seq):
    """The target symbols for ``seq`` under ``task``."""
    seq = list(seq)
    if task == "reverse":
        return seq[::-1]
    if task == "sort":
        return sorted(seq)
    if task == "copy":
        return seq
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def _random_seqs(gen, n, vocab, min_len, max_len, exclude=frozenset()):
    seen, out = set(exclude), []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise RuntimeError("not enough distinct sequences: raise vocab or max_len")
        length = int(gen.integers(min_len, max_len + 1))
        seq = tuple(int(t) for t in gen.integers(0, vocab, size=length))
        if seq in seen:
            continue
        seen.add(seq)
        out.append(seq)
    return out


def _to_arrays(task, seqs, max_len):
    src = np.full((len(seqs), max_len + 1), SEQ_PAD, dtype=np.int64)
    tgt = np.full((len(seqs), max_len + 2), SEQ_PAD, dtype=np.int64)
    for i, s in enumerate(seqs):
        sym = [t + SEQ_OFFSET for t in s]
        src[i, :len(s) + 1] = sym + [SEQ_EOS]
        tgt[i, :len(s) + 2] = [SEQ_BOS] + [t + SEQ_OFFSET for t in task_output(task, s)] + [SEQ_EOS]
    return src, tgt


def make_seq2seq(task: str, n: int, vocab: int = 10, min_len: int = 3, max_len: int = 8,
                 seed: int = 0):
    """(src, tgt) int arrays for ``n`` distinct random sequences (see the module docstring)."""
    task_output(task, [])                           # validates the name
    seqs = _random_seqs(np.random.default_rng(seed), n, vocab, min_len, max_len)
    return _to_arrays(task, seqs, max_len)


def seq2seq_split(task: str, n_train: int, n_test: int, vocab: int = 10, min_len: int = 3,
                  max_len: int = 8, seed: int = 0):
    """Train and held-out sets with no sequence in both: ((src, tgt), (src, tgt))."""
    task_output(task, [])
    gen = np.random.default_rng(seed)
    test = _random_seqs(gen, n_test, vocab, min_len, max_len)
    train = _random_seqs(gen, n_train, vocab, min_len, max_len, exclude=set(test))
    return _to_arrays(task, train, max_len), _to_arrays(task, test, max_len)


def strip_special(ids):
    """Symbols of one decoded row: drop a leading <bos>, stop at <eos>, drop <pad>."""
    out = []
    for t in list(ids):
        t = int(t)
        if t == SEQ_EOS:
            break
        if t in (SEQ_PAD, SEQ_BOS):
            continue
        out.append(t - SEQ_OFFSET)
    return out
