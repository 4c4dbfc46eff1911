"""Mini ListOps (from Long Range Arena, Tay et al. 2020), generated procedurally.

An expression is a tree of list operators over digits 0–9, written in prefix form:

    [MAX 2 9 [MIN 4 7 ] 0 ]          → 9
    [SM 3 8 [MED 1 4 ] ]             → (3 + 8 + 2) mod 10 = 3

Operators: ``MAX``, ``MIN``, ``MED`` (median, rounded down — ``int(np.median(args))`` as in
LRA) and ``SM`` (sum modulo 10). The answer is a digit, so this is 10-way classification of
a long sequence whose answer depends on tokens far apart — a test of long-range attention.
"""
from __future__ import annotations

import numpy as np

__all__ = ["OPERATORS", "LISTOPS_TOKENS", "evaluate_listops", "generate_listops",
           "listops_dataset"]

OPERATORS = ("MAX", "MIN", "MED", "SM")
LISTOPS_TOKENS = ("<pad>", "<cls>") + tuple(f"[{op}" for op in OPERATORS) + ("]",) + \
    tuple(str(d) for d in range(10))


def _apply(op, args):
    if not args:
        raise ValueError(f"operator {op} has no arguments")
    if op == "MAX":
        return max(args)
    if op == "MIN":
        return min(args)
    if op == "MED":
        return int(np.median(args))
    if op == "SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate_listops(expr) -> int:
    """The value (0–9) of a ListOps expression given as a string or a token list.

    Uses an explicit stack (no recursion), so deep expressions are fine. Raises ValueError on
    malformed input (unbalanced brackets, unknown tokens, empty lists).
    """
    toks = expr.split() if isinstance(expr, str) else list(expr)
    stack = []                                   # frames: [op, args]
    result = None
    for t in toks:
        if t.startswith("["):
            stack.append([t[1:], []])
        elif t == "]":
            if not stack:
                raise ValueError("unbalanced ']' in ListOps expression")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                if result is not None:
                    raise ValueError("more than one top-level expression")
                result = value
        elif t.isdigit() and len(t) == 1:
            if not stack:
                if result is not None or len(toks) != 1:
                    raise ValueError(f"digit {t} outside any list")
                result = int(t)
            else:
                stack[-1][1].append(int(t))
        else:
            raise ValueError(f"unknown ListOps token {t!r}")
    if stack or result is None:
        raise ValueError("unbalanced or empty ListOps expression")
    return result


def _tree(gen, budget, depth, max_depth, max_args):
    """An expression of roughly ``budget`` tokens: split the budget among 2..max_args children."""
    if budget < 4 or depth >= max_depth:
        return [str(int(gen.integers(0, 10)))]
    op = OPERATORS[int(gen.integers(0, len(OPERATORS)))]
    k = int(gen.integers(2, max_args + 1))
    shares = gen.dirichlet(np.ones(k)) * (budget - 2)
    out = ["[" + op]
    for share in shares:
        out += _tree(gen, int(round(share)), depth + 1, max_depth, max_args)
    return out + ["]"]


def generate_listops(n: int, min_len: int = 20, max_len: int = 100, max_depth: int = 10,
                     max_args: int = 5, seed: int = 0):
    """``n`` (tokens, value) pairs with min_len ≤ len(tokens) ≤ max_len.

    Each expression is grown towards a token budget drawn uniformly from the range (the
    budget is split at random among an operator's arguments), then kept if its length falls
    in the range — so long sequences are deep and wide rather than padded.
    """
    gen = np.random.default_rng(seed)
    out = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"could not generate ListOps of length {min_len}–{max_len}; "
                               "raise max_depth/max_args or widen the range")
        toks = _tree(gen, int(gen.integers(min_len, max_len + 1)), 0, max_depth, max_args)
        if min_len <= len(toks) <= max_len:
            out.append((toks, evaluate_listops(toks)))
    return out


def listops_dataset(n: int, min_len: int, max_len: int, seed: int = 0, **kw):
    """Arrays for training: ids (n, max_len + 1) with <cls> first and <pad>=0, labels (n,)."""
    stoi = {t: i for i, t in enumerate(LISTOPS_TOKENS)}
    ids = np.zeros((n, max_len + 1), dtype=np.int64)
    labels = np.zeros(n, dtype=np.int64)
    for row, (toks, value) in enumerate(generate_listops(n, min_len, max_len, seed=seed, **kw)):
        ids[row, 0] = stoi["<cls>"]
        ids[row, 1:len(toks) + 1] = [stoi[t] for t in toks]
        labels[row] = value
    return ids, labels
