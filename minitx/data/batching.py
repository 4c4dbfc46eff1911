"""Batching helpers: padding, shuffled index batches, language-model windows."""
from __future__ import annotations

import numpy as np

__all__ = ["pad_sequences", "iterate_batches", "lm_batch", "train_test_split"]


def pad_sequences(seqs, pad_id: int = 0, length: int = None, truncate: str = "end"):
    """Lists of ids → an int64 array (len(seqs), length), padded on the right with ``pad_id``.

    Longer sequences are cut (keeping the start when ``truncate="end"``, the end when
    ``truncate="start"``).
    """
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = np.full((len(seqs), length), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        s = list(s)
        s = s[:length] if truncate == "end" else s[-length:] if length else []
        out[i, :len(s)] = s
    return out


def iterate_batches(n: int, batch_size: int, shuffle: bool = True, seed=None, drop_last=False):
    """Yield index arrays covering range(n) in batches (shuffled with a seeded generator)."""
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield order[start:start + batch_size]


def lm_batch(data, batch_size: int, block: int, gen):
    """Random windows of a 1-d id array: x (B, block) and the next-token targets y (B, block)."""
    starts = gen.integers(0, len(data) - block - 1, size=batch_size)
    x = np.stack([data[s:s + block] for s in starts])
    y = np.stack([data[s + 1:s + block + 1] for s in starts])
    return x, y


def train_test_split(items, test_fraction: float = 0.2, seed: int = 0):
    """Shuffle ``items`` (a list) with ``seed`` and split it: (train, test)."""
    order = np.random.default_rng(seed).permutation(len(items))
    n_test = int(round(len(items) * test_fraction))
    return [items[i] for i in order[n_test:]], [items[i] for i in order[:n_test]]
