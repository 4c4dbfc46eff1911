"""GPT-2's tokenizer: byte-level byte-pair encoding (Sennrich et al. 2016; Radford et al. 2019).

    tok = ByteLevelBPETokenizer.from_folder("gpt2")
    tok.tokenize("Hello world!")    # ['Hello', 'Ġworld', '!']  ("Ġ" is the space byte)

Byte-level means the alphabet is the 256 byte values, so any text — emoji, CJK, control
characters — encodes without an unknown token:

1. **Split off special tokens** ("<|endoftext|>") written literally in the text.
2. **Pre-tokenise** with GPT-2's pattern, in regex notation::

       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

   i.e. English contractions; a run of letters, of digits, or of other symbols, each with
   at most one leading space; whitespace. Python's ``re`` has no ``\\p{L}`` (Unicode
   letters, categories L*) or ``\\p{N}`` (numbers, N*), so ``pretokenize`` below is a small
   hand-written scanner that tries the alternatives in order, exactly as the regex engine
   would, with ``unicodedata.category`` deciding letters and numbers and Unicode's
   White_Space property deciding ``\\s``. The one subtle alternative is ``\\s+(?!\\S)``: a
   whitespace run *not followed by* a non-space; when the run is followed by a word, the
   engine backtracks one character, so the last space goes with the word ("a  b" →
   "a", " ", " b").
3. **Bytes to symbols**: each word's UTF-8 bytes are mapped to printable characters
   (``bytes_to_unicode``: the printable Latin-1 bytes stand for themselves, the other 68 —
   space, control bytes, … — are shifted to U+0100 and up, so the space becomes "Ġ").
4. **Merges**: start from one symbol per byte and repeatedly merge the adjacent pair with
   the best (lowest) rank in ``merges.txt``, until no adjacent pair has a rank. Each
   resulting symbol is a vocabulary entry.

No special tokens are added around a text (GPT-2 has no [CLS]/[SEP]). GPT-2 has no pad
token either: batches are padded with ``<|endoftext|>`` (HuggingFace's convention), and
the attention mask marks the padding. ``decode`` maps the symbols back to bytes and
decodes UTF-8 (invalid sequences become U+FFFD, e.g. when decoding half an emoji).
"""
from __future__ import annotations

import functools
import json
import os
import unicodedata

from .tokenization import PretrainedTokenizer
from .wordpiece import WHITESPACE, _read_json, _token

__all__ = ["ByteLevelBPETokenizer", "bytes_to_unicode", "pretokenize", "bpe"]


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict:
    """{byte value: printable character}: printable Latin-1 bytes map to themselves, the
    rest (0–32, 127–160, 173) to U+0100, U+0101, … in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


@functools.lru_cache(maxsize=65536)
def _kind(ch: str) -> str:
    """"S" whitespace, "L" letter, "N" number, "O" anything else."""
    if ch in WHITESPACE:
        return "S"
    cat = unicodedata.category(ch)[0]
    return cat if cat in "LN" else "O"


def _run(text: str, i: int, kind: str) -> int:
    """End of the run of characters of ``kind`` starting at i."""
    n = len(text)
    while i < n and _kind(text[i]) == kind:
        i += 1
    return i


def _match_end(text: str, i: int) -> int:
    """Where the pattern's match starting at i ends (one alternative after another)."""
    n, c = len(text), text[i]
    if c == "'":                                          # 's 't 're 've 'm 'll 'd
        for suffix in _CONTRACTIONS:
            if text.startswith(suffix, i + 1):
                return i + 1 + len(suffix)
    # Otherwise a run of one kind (letters, digits, or other symbols), which may start with one
    # space: the space belongs to the word after it (GPT-2's "Ġworld").
    kind = _kind(c)
    if c == " " and i + 1 < n and _kind(text[i + 1]) != "S":
        return _run(text, i + 1, _kind(text[i + 1]))     # " ?\p{L}+", " ?\p{N}+", " ?[^…]+"
    if kind != "S":
        return _run(text, i, kind)                        # the same without the space
    # Whitespace: a run of spaces keeps its last one for the next word, unless it ends the text.
    end = _run(text, i, "S")
    if end == n:                                          # \s+(?!\S) at the end of the text
        return end
    if end - i >= 2:                                      # \s+(?!\S): give back one space
        return end - 1
    return end                                            # \s+ : a single space before a word


def pretokenize(text: str) -> list:
    """Split ``text`` with GPT-2's pattern (module docstring, step 2)."""
    words, i = [], 0
    while i < len(text):
        j = _match_end(text, i)
        words.append(text[i:j])
        i = j
    return words


def bpe(symbols: list, ranks: dict) -> list:
    """Merge adjacent pairs by rank until none can be merged. ``symbols``: a word as single
    byte-symbols; ``ranks``: {(left, right): rank}, lower merges first."""
    word = list(symbols)
    while len(word) > 1:
        # The adjacent pair with the lowest rank (the earliest merge learned); no pair in the
        # merge table ends the loop.
        pairs = {(word[k], word[k + 1]) for k in range(len(word) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        # Apply that merge wherever it occurs, left to right ("a a a" merges its first pair).
        merged, k = [], 0
        while k < len(word):                              # merge every occurrence, left first
            if k + 1 < len(word) and (word[k], word[k + 1]) == best:
                merged.append(word[k] + word[k + 1])
                k += 2
            else:
                merged.append(word[k])
                k += 1
        word = merged
    return word


class ByteLevelBPETokenizer(PretrainedTokenizer):
    """GPT-2's tokenizer (see the module docstring).

    ``ByteLevelBPETokenizer(vocab, merges, special_tokens=("<|endoftext|>",),
    pad_token=None, eos_token="<|endoftext|>", add_prefix_space=False,
    model_max_length=1024)``; ``vocab`` {symbol string: id}, ``merges`` a list of
    (left, right) pairs, best first. ``from_folder(path)`` reads a HuggingFace folder.
    """

    def __init__(self, vocab: dict, merges, special_tokens=("<|endoftext|>",), pad_token=None,
                 eos_token="<|endoftext|>", bos_token=None, unk_token=None,
                 add_prefix_space: bool = False, model_max_length: int = 1024,
                 ignore_merges: bool = False):
        # GPT-2 has no pad token: it pads with <|endoftext|>, which the attention mask hides.
        specials = [t for t in special_tokens if t in vocab]
        if pad_token is None and eos_token in vocab:
            pad_token = eos_token                          # GPT-2 has no pad token
        super().__init__(vocab, specials, pad_token=pad_token, unk_token=unk_token,
                         model_max_length=model_max_length)
        # A merge's rank is its position in merges.txt: lower ranks were learned earlier and
        # merge first.
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.eos_token, self.bos_token = eos_token, bos_token
        self.add_prefix_space = bool(add_prefix_space)
        self.ignore_merges = bool(ignore_merges)
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}

    @property
    def eos_token_id(self):
        return self.vocab.get(self.eos_token)

    def tokenize_piece(self, text: str) -> list:
        # Per word: UTF-8 bytes → printable symbols (so no byte is ever unknown), then the BPE
        # merges; words are cached, since text repeats them.
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        tokens = []
        for word in pretokenize(text):
            pieces = self._cache.get(word)
            if pieces is None:
                symbols = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
                if self.ignore_merges and symbols in self.vocab:
                    pieces = [symbols]
                else:
                    pieces = bpe(list(symbols), self.ranks)
                self._cache[word] = pieces
            tokens.extend(pieces)
        return tokens

    # Decoding inverts the byte map: symbols → bytes → UTF-8 text (a character cut in two by
    # a token boundary decodes as U+FFFD).
    def decode_tokens(self, tokens) -> str:
        data = bytearray()
        for tok in tokens:
            if tok in self.special_tokens:
                data += tok.encode("utf-8")
            else:
                data += bytes(self.byte_decoder[c] for c in tok)
        return data.decode("utf-8", errors="replace")

    @classmethod
    def from_folder(cls, folder, model_max_length: int = None) -> "ByteLevelBPETokenizer":
        """Read ``tokenizer.json`` (a BPE model) or ``vocab.json`` + ``merges.txt``, and
        ``tokenizer_config.json`` / ``special_tokens_map.json`` for the special tokens."""
        cfg = _read_json(folder, "tokenizer_config.json") or {}
        cfg.update(_read_json(folder, "special_tokens_map.json") or {})
        fast = _read_json(folder, "tokenizer.json")
        add_prefix_space, ignore_merges = cfg.get("add_prefix_space", False), False
        # tokenizer.json (HuggingFace's fast format): vocab, merges (as "a b" strings or pairs)
        # and the pre-tokenizer, which must be GPT-2's ByteLevel.
        if fast is not None and fast.get("model", {}).get("type") == "BPE":
            model = fast["model"]
            vocab = dict(model["vocab"])
            merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
                      for m in model["merges"]]
            ignore_merges = model.get("ignore_merges", False)
            pre = fast.get("pre_tokenizer") or {}
            if pre.get("type") == "ByteLevel":
                add_prefix_space = pre.get("add_prefix_space", add_prefix_space)
            elif pre:
                raise ValueError(f"{folder}: tokenizer.json pre_tokenizer {pre.get('type')!r} "
                                 "is not GPT-2's ByteLevel; minitx reads byte-level BPE only")
        # The older pair of files: vocab.json and merges.txt (after its "#version" line).
        elif os.path.exists(os.path.join(folder, "vocab.json")):
            with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as fh:
                vocab = json.load(fh)
            with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as fh:
                merges = [tuple(line.split()) for line in fh
                          if line.strip() and not line.startswith("#version")]
        else:
            raise FileNotFoundError(f"{folder}: no BPE vocabulary (tokenizer.json with a BPE "
                                    "model, or vocab.json + merges.txt)")
        # Special tokens: tokenizer.json's added tokens plus eos, bos and unk from the configs.
        specials = [t["content"] for t in (fast or {}).get("added_tokens", [])]
        eos = _token(cfg.get("eos_token"), "<|endoftext|>")
        specials += [t for t in (eos, _token(cfg.get("bos_token"), None),
                                 _token(cfg.get("unk_token"), None)) if t is not None]
        length = cfg.get("model_max_length", 1024)
        if model_max_length is not None:
            length = min(length, model_max_length)
        return cls(vocab, merges, special_tokens=specials,
                   pad_token=_token(cfg.get("pad_token"), None), eos_token=eos,
                   bos_token=_token(cfg.get("bos_token"), None),
                   unk_token=_token(cfg.get("unk_token"), None),
                   add_prefix_space=add_prefix_space, model_max_length=int(min(length, 1 << 31)),
                   ignore_merges=ignore_merges)
