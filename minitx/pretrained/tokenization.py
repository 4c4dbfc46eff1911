"""What every pretrained tokenizer shares: special tokens, batching, padding, truncation.

A tokenizer turns text into the integer ids a checkpoint was trained on, in four steps —
the same pipeline HuggingFace's ``tokenizers`` library runs:

    1. split off special tokens ("[CLS]", "<|endoftext|>", ...) written literally in the text;
    2. normalise and pre-tokenise each remaining piece into words (family-specific);
    3. cut each word into vocabulary pieces (WordPiece: longest match; BPE: merges by rank);
    4. add the model's special tokens ([CLS] … [SEP] for BERT, nothing for GPT-2), then
       truncate and pad a batch into rectangular arrays.

``tokenizer(texts)`` returns, like HuggingFace with ``return_tensors="np"``::

    {"input_ids":      (B, N) int64, padded with the pad id,
     "attention_mask": (B, N) int64, 1 = a real token, 0 = padding,
     "token_type_ids": (B, N) int64  (BERT only: 0 = first segment, 1 = second)}

Differences from HuggingFace's defaults, on purpose: padding to the longest sequence and
truncation to ``model_max_length`` are on by default (HF: off), and a single string still
gives a batch of one, (1, N). The arrays are NumPy (host) arrays: move them to the model's
device once per batch (``minitx.tensor(ids)``; the pretrained models do it themselves).
"""
from __future__ import annotations

import re

import numpy as np

__all__ = ["PretrainedTokenizer"]


class PretrainedTokenizer:
    """Base class: subclasses implement ``tokenize_piece(text) → [token]`` (steps 2–3),
    ``build_inputs(ids_a, ids_b) → (ids, type_ids)`` (step 4) and ``decode_tokens``.

    ``vocab``: {token: id}. ``special_tokens``: strings matched literally in the input and
    never split (each must be in ``vocab``). ``pad_token``: the padding token (None: pad
    with id 0, which the attention mask hides anyway).
    """

    returns_token_type_ids = False

    def __init__(self, vocab: dict, special_tokens=(), pad_token=None, unk_token=None,
                 model_max_length: int = 512, padding_side: str = "right"):
        if not isinstance(vocab, dict) or not vocab:
            raise ValueError("tokenizer: vocab must be a non-empty dict {token: id}")
        self.vocab = vocab
        self.ids_to_tokens = {i: t for t, i in vocab.items()}
        missing = [t for t in special_tokens if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer: special token(s) {missing} are not in the vocabulary")
        self.special_tokens = tuple(dict.fromkeys(special_tokens))     # ordered, unique
        # longest first, so that the leftmost match at a position is the longest one
        alternatives = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = (re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
                            if alternatives else None)
        self.pad_token, self.unk_token = pad_token, unk_token
        self.pad_token_id = vocab[pad_token] if pad_token is not None else 0
        self.model_max_length = int(model_max_length)
        if padding_side not in ("right", "left"):
            raise ValueError(f"tokenizer: padding_side must be 'right' or 'left', got "
                             f"{padding_side!r}")
        self.padding_side = padding_side
        self._cache = {}

    # ---- text → tokens -------------------------------------------------------------------
    def tokenize_piece(self, text: str) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def tokenize(self, text: str) -> list:
        """``text`` → token strings (no [CLS]/[SEP]): special tokens first, then the rest."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize: text must be a str, got {type(text).__name__}")
        if self._special_re is None:
            return self.tokenize_piece(text)
        tokens = []
        for i, part in enumerate(self._special_re.split(text)):
            if i % 2:                       # odd parts are the captured special tokens
                tokens.append(part)
            elif part:
                tokens.extend(self.tokenize_piece(part))
        return tokens

    # Tokens → ids: a token outside the vocabulary becomes unk_token's id, or is an error when
    # the tokenizer has no unk_token (GPT-2's byte-level BPE never needs one).
    def convert_tokens_to_ids(self, tokens):
        unk = self.vocab.get(self.unk_token) if self.unk_token is not None else None
        ids = []
        for t in tokens:
            i = self.vocab.get(t, unk)
            if i is None:
                raise KeyError(f"tokenizer: token {t!r} is not in the vocabulary and there is "
                               "no unk_token")
            ids.append(i)
        return ids

    def convert_ids_to_tokens(self, ids):
        return [self.ids_to_tokens[int(i)] for i in ids]

    def encode(self, text: str, text_pair: str = None, add_special_tokens: bool = True) -> list:
        """One text (or pair) → a list of ids, with the model's special tokens, no padding."""
        a = self.convert_tokens_to_ids(self.tokenize(text))
        b = None if text_pair is None else self.convert_tokens_to_ids(self.tokenize(text_pair))
        if not add_special_tokens:
            return a + (b or [])
        return self.build_inputs(a, b)[0]

    def build_inputs(self, ids_a, ids_b=None):
        """Add the model's special tokens: returns (ids, token_type_ids). Default: none."""
        ids = list(ids_a) + list(ids_b or [])
        return ids, [0] * len(ids_a) + [1] * len(ids_b or [])

    def num_special_tokens(self, pair: bool) -> int:
        """How many tokens ``build_inputs`` adds to one text (or a pair)."""
        return len(self.build_inputs([], [] if pair else None)[0])

    # ---- a batch -------------------------------------------------------------------------
    def __call__(self, text, text_pair=None, padding=True, truncation=True, max_length=None,
                 add_special_tokens: bool = True, return_token_type_ids: bool = None,
                 return_tensors: str = "np"):
        """Tokenise a string or a list of strings (and optional second segments) into padded
        (B, N) int64 NumPy arrays (see the module docstring).

        ``padding``: True / "longest" (pad to the longest), "max_length" (pad to
        ``max_length``), False (all sequences must then have the same length).
        ``truncation``: True cuts every sequence to ``max_length`` (default
        ``model_max_length``) tokens, special tokens included; for pairs the longer segment
        is cut first ("longest_first", as the fast tokenizers do). False: a longer sequence
        raises ValueError. ``return_tensors``: only "np" (NumPy), accepted for HF habits.
        """
        if return_tensors not in (None, "np"):
            raise ValueError(f"tokenizer: return_tensors must be 'np' (minitx tokenizers return "
                             f"NumPy arrays), got {return_tensors!r}")
        # A single string is a batch of one; text_pair, if given, holds one second segment per text.
        texts = [text] if isinstance(text, str) else list(text)
        pairs = None
        if text_pair is not None:
            pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            if len(pairs) != len(texts):
                raise ValueError(f"tokenizer: text_pair must have one entry per text "
                                 f"({len(texts)}), got {len(pairs)}")
        if not texts:
            raise ValueError("tokenizer: got an empty list of texts")
        # Each text (and its pair) → ids; extra counts the special tokens build_inputs will add.
        limit = self.model_max_length if max_length is None else int(max_length)
        rows, types = [], []
        for k, t in enumerate(texts):
            a = self.convert_tokens_to_ids(self.tokenize(t))
            b = None if pairs is None else self.convert_tokens_to_ids(self.tokenize(pairs[k]))
            if add_special_tokens:
                extra = self.num_special_tokens(b is not None)
            else:
                extra = 0
            # Truncate the two segments together (longest first) so the row, special tokens
            # included, fits the limit; then add the special tokens and the segment ids.
            total = len(a) + len(b or []) + extra
            if total > limit:
                if not truncation:
                    raise ValueError(f"tokenizer: text {k} has {total} tokens, more than "
                                     f"max_length={limit}; pass truncation=True")
                a, b = _truncate_longest_first(a, b, limit - extra)
            ids, tt = self.build_inputs(a, b) if add_special_tokens else (
                a + (b or []), [0] * len(a) + [1] * len(b or []))
            rows.append(ids)
            types.append(tt)
        # The batch width: the longest row, max_length, or (no padding) the one length all rows
        # must already share.
        if padding in (True, "longest"):
            width = max(len(r) for r in rows)
        elif padding == "max_length":
            width = limit
        elif padding is False or padding == "do_not_pad":
            width = len(rows[0])
            if any(len(r) != width for r in rows):
                raise ValueError("tokenizer: sequences have different lengths "
                                 f"({sorted({len(r) for r in rows})}); pass padding=True")
        else:
            raise ValueError(f"tokenizer: padding must be True, 'longest', 'max_length' or "
                             f"False, got {padding!r}")
        # Fill (B, width) arrays with the pad id and copy each row in at its padding side;
        # attention_mask is 1 over the real tokens, so attention can hide the padding.
        n = len(rows)
        input_ids = np.full((n, width), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((n, width), dtype=np.int64)
        token_type_ids = np.zeros((n, width), dtype=np.int64)
        for i, (ids, tt) in enumerate(zip(rows, types)):
            cols = slice(0, len(ids)) if self.padding_side == "right" else \
                slice(width - len(ids), width)
            input_ids[i, cols] = ids
            attention_mask[i, cols] = 1
            token_type_ids[i, cols] = tt
        out = {"input_ids": input_ids, "attention_mask": attention_mask}
        if return_token_type_ids or (return_token_type_ids is None and
                                     self.returns_token_type_ids):
            out["token_type_ids"] = token_type_ids
        return out

    # ---- ids → text ----------------------------------------------------------------------
    def decode_tokens(self, tokens) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """ids (a list, or a 1-d array) → text. Special tokens are dropped unless
        ``skip_special_tokens=False``."""
        ids = np.asarray(ids).reshape(-1).tolist()
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in self.special_tokens]
        return self.decode_tokens(tokens)

    def batch_decode(self, ids, skip_special_tokens: bool = True) -> list:
        """(B, N) ids → B strings."""
        return [self.decode(row, skip_special_tokens) for row in np.asarray(ids)]

    def __len__(self) -> int:
        return len(self.vocab)


def _truncate_longest_first(a, b, budget):
    """Cut a (and b) so that len(a) + len(b) ≤ budget, as HuggingFace's fast tokenizers do
    for "longest_first": the shorter segment keeps its length when the longer one can make
    room; otherwise each gets half of the budget (the longer one the odd token)."""
    if budget < 0:
        raise ValueError("tokenizer: max_length is smaller than the number of special tokens")
    if b is None:
        return list(a[:budget]), None
    n1, n2 = len(a), len(b)
    swap = n1 > n2                          # make n1 the shorter
    if swap:
        n1, n2 = n2, n1
    n2 = max(n1, budget - n1)
    if n1 + n2 > budget:
        n1, n2 = budget // 2, budget // 2 + budget % 2
    if swap:
        n1, n2 = n2, n1
    return list(a[:n1]), list(b[:n2])
