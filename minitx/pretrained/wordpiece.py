"""BERT's tokenizer: a "basic" normaliser/word splitter, then WordPiece (Wu et al. 2016;
Devlin et al. 2019).

    tok = WordPieceTokenizer.from_folder("all-MiniLM-L6-v2")
    tok.tokenize("Héllo, wörld! 東京")   # ['hello', ',', 'world', '!', '東', '京']
    tok(["a short one", "and a longer sentence"])["input_ids"]   # (2, N), [CLS] … [SEP] [PAD]

1. **Normalise** (each step switchable, as in ``tokenizer_config.json`` / ``tokenizer.json``):
   - clean text: drop NUL, U+FFFD and control characters (Unicode category C*, except tab,
     newline and carriage return), turn every whitespace character into a space;
   - CJK: put spaces around every CJK ideograph, so each becomes its own word (Chinese is
     written without spaces; Japanese kana and Korean Hangul are left alone);
   - strip accents (on by default when lower-casing): decompose (NFD, "é" → "e" + U+0301)
     and drop the non-spacing marks (category Mn);
   - lower-case, character by character.
2. **Pre-tokenise**: split on whitespace, and make every punctuation character (ASCII
   punctuation, or Unicode category P*) a word of its own.
3. **WordPiece**, per word: greedy longest match first. Take the longest prefix that is in
   the vocabulary, then the longest continuation, written with the prefix "##", and so on::

       "unaffable" → "un", "##aff", "##able"

   If at some point no piece matches, or the word is longer than
   ``max_input_chars_per_word`` (100) characters, the whole word becomes "[UNK]".
4. **Special tokens**: [CLS] A [SEP] (one text) or [CLS] A [SEP] B [SEP] (a pair; token
   type 0 up to the first [SEP], 1 after).

Details chosen to agree with HuggingFace's ``tokenizers`` (the fast tokenizer that
``transformers`` runs by default), checked on thousands of strings in the tests:
whitespace is Unicode's White_Space property; lower-casing maps each character on its own
(so a final capital sigma "Σ" becomes "σ", not the word-final "ς" that Python's
``str.lower`` would give); and the CJK ranges are those of ``tokenizers``, whose
Extension E range starts at U+2B920 where the original BERT code has U+2B820 — we follow
``tokenizers``, since that is what the checkpoints are used with.
"""
from __future__ import annotations

import json
import os
import unicodedata

from .tokenization import PretrainedTokenizer

__all__ = ["WordPieceTokenizer", "basic_normalize", "basic_split", "WHITESPACE"]

# Unicode's White_Space property (what Rust's char::is_whitespace tests).
WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                       "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_control(ch: str) -> bool:
    """Control (Cc), format (Cf), private-use (Co) or surrogate (Cs), except \\t \\n \\r.
    Unassigned code points (Cn) are kept, as the reference implementation keeps them."""
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    ascii_punct = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    return ascii_punct or unicodedata.category(ch).startswith("P")


def _lower(text: str) -> str:
    """Per-character lower-casing. ``str.lower`` differs only by its word-final sigma rule."""
    return "".join(c.lower() for c in text) if "Σ" in text else text.lower()


def basic_normalize(text: str, lowercase: bool = True, strip_accents: bool = None,
                    clean_text: bool = True, handle_chinese_chars: bool = True) -> str:
    """Step 1 of the module docstring. ``strip_accents=None`` follows ``lowercase``."""
    if clean_text:
        text = "".join(" " if c in WHITESPACE else c for c in text
                       if c not in "\x00\ufffd" and not _is_control(c))
    if handle_chinese_chars:
        text = "".join(f" {c} " if is_cjk(c) else c for c in text)
    if lowercase if strip_accents is None else strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text)
                       if unicodedata.category(c) != "Mn")
    if lowercase:
        text = _lower(text)
    return text


def basic_split(text: str) -> list:
    """Step 2: split on whitespace, isolate punctuation characters."""
    words, current = [], []
    for c in text:
        if c in WHITESPACE or _is_punctuation(c):
            if current:
                words.append("".join(current))
                current = []
            if c not in WHITESPACE:
                words.append(c)
        else:
            current.append(c)
    if current:
        words.append("".join(current))
    return words


class WordPieceTokenizer(PretrainedTokenizer):
    """BERT's tokenizer (see the module docstring).

    ``WordPieceTokenizer(vocab, do_lower_case=True, strip_accents=None,
    tokenize_chinese_chars=True, clean_text=True, unk_token="[UNK]", cls_token="[CLS]",
    sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]", max_input_chars_per_word=100,
    model_max_length=512)``; ``vocab`` {token: id}. ``from_folder(path)`` reads a
    HuggingFace folder.
    """

    returns_token_type_ids = True

    def __init__(self, vocab: dict, do_lower_case: bool = True, strip_accents: bool = None,
                 tokenize_chinese_chars: bool = True, clean_text: bool = True,
                 unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                 mask_token="[MASK]", max_input_chars_per_word: int = 100,
                 continuing_subword_prefix: str = "##", model_max_length: int = 512,
                 extra_special_tokens=()):
        # Every special token the model uses is matched literally in the text and never split.
        specials = [t for t in (pad_token, unk_token, cls_token, sep_token, mask_token)
                    if t is not None] + list(extra_special_tokens)
        super().__init__(vocab, specials, pad_token=pad_token, unk_token=unk_token,
                         model_max_length=model_max_length)
        self.do_lower_case, self.strip_accents = bool(do_lower_case), strip_accents
        self.tokenize_chinese_chars, self.clean_text = bool(tokenize_chinese_chars), clean_text
        self.cls_token, self.sep_token, self.mask_token = cls_token, sep_token, mask_token
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self.prefix = continuing_subword_prefix

    # ---- steps 1–3 -------------------------------------------------------------------------
    def tokenize_piece(self, text: str) -> list:
        text = basic_normalize(text, self.do_lower_case, self.strip_accents, self.clean_text,
                               self.tokenize_chinese_chars)
        tokens = []
        for word in basic_split(text):
            pieces = self._cache.get(word)
            if pieces is None:
                pieces = self._cache[word] = self.wordpiece(word)
            tokens.extend(pieces)
        return tokens

    def wordpiece(self, word: str) -> list:
        """Greedy longest-match-first: one word → its pieces, or [unk_token]."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):          # longest candidate first
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return [self.unk_token]                      # nothing matches: the whole word
            pieces.append(piece)
            start = end
        return pieces

    # ---- step 4 ----------------------------------------------------------------------------
    def build_inputs(self, ids_a, ids_b=None):
        """[CLS] A [SEP] (types 0…0), or [CLS] A [SEP] B [SEP] (types 0…0 1…1)."""
        cls, sep = self.vocab[self.cls_token], self.vocab[self.sep_token]
        ids = [cls, *ids_a, sep]
        types = [0] * len(ids)
        if ids_b is not None:
            ids += [*ids_b, sep]
            types += [1] * (len(ids_b) + 1)
        return ids, types

    def decode_tokens(self, tokens) -> str:
        """Join pieces: "##" continues the previous word, others start a new one; then the
        usual clean-up of spaces before punctuation and in English contractions."""
        out = []
        for i, tok in enumerate(tokens):
            if i and tok.startswith(self.prefix):
                tok = tok[len(self.prefix):]
            elif i:
                tok = " " + tok
            out.append(_cleanup(tok))
        return "".join(out)

    # ---- a HuggingFace folder ----------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder, model_max_length: int = None) -> "WordPieceTokenizer":
        """Read ``vocab.txt`` (one token per line, id = line number) or the vocabulary in
        ``tokenizer.json``, and the settings of ``tokenizer_config.json``; when
        ``tokenizer.json`` is present its normaliser settings win (they are what HF's fast
        tokenizer, the default in ``transformers``, actually runs)."""
        cfg = _read_json(folder, "tokenizer_config.json") or {}
        fast = _read_json(folder, "tokenizer.json")
        vocab = None
        # The vocabulary: tokenizer.json's WordPiece model if there is one, else vocab.txt, where
        # a token's id is its line number (a repeated line keeps its first id).
        if fast is not None and fast.get("model", {}).get("type") == "WordPiece":
            vocab = dict(fast["model"]["vocab"])
        elif os.path.exists(os.path.join(folder, "vocab.txt")):
            with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as fh:
                vocab = {}
                for line in fh:
                    vocab.setdefault(line.rstrip("\n"), len(vocab))
        if vocab is None:
            raise FileNotFoundError(f"{folder}: no WordPiece vocabulary (vocab.txt, or "
                                    "tokenizer.json with a WordPiece model)")
        # Normaliser settings from tokenizer_config.json, overridden by tokenizer.json's
        # BertNormalizer and model settings when that file exists.
        opts = dict(do_lower_case=cfg.get("do_lower_case", True),
                    strip_accents=cfg.get("strip_accents"),
                    tokenize_chinese_chars=cfg.get("tokenize_chinese_chars", True))
        unk = _token(cfg.get("unk_token"), "[UNK]")
        if fast is not None:
            norm = fast.get("normalizer") or {}
            if norm.get("type") == "BertNormalizer":
                opts = dict(do_lower_case=norm.get("lowercase", True),
                            strip_accents=norm.get("strip_accents"),
                            tokenize_chinese_chars=norm.get("handle_chinese_chars", True),
                            clean_text=norm.get("clean_text", True))
            model = fast.get("model", {})
            opts["max_input_chars_per_word"] = model.get("max_input_chars_per_word", 100)
            opts["continuing_subword_prefix"] = model.get("continuing_subword_prefix", "##")
            unk = model.get("unk_token", unk)
        # The length limit is the smaller of the config's and the caller's; configs write "no
        # limit" as a huge number, capped here to fit an int.
        length = cfg.get("model_max_length", 512)
        if model_max_length is not None:
            length = min(length, model_max_length)
        extra = [t["content"] for t in (fast or {}).get("added_tokens", [])
                 if t.get("special") and t["content"] in vocab]
        return cls(vocab, unk_token=unk, cls_token=_token(cfg.get("cls_token"), "[CLS]"),
                   sep_token=_token(cfg.get("sep_token"), "[SEP]"),
                   pad_token=_token(cfg.get("pad_token"), "[PAD]"),
                   mask_token=_token(cfg.get("mask_token"), "[MASK]"),
                   model_max_length=int(min(length, 1 << 31)), extra_special_tokens=extra,
                   **opts)


# HuggingFace's clean_up_tokenization: remove the spaces the join put before punctuation
# and inside English contractions.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"),
            (" 're", "'re"))


def _cleanup(text: str) -> str:
    for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text


def _read_json(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _token(value, default):
    """A special token from a config: a string, or {"content": ...} (AddedToken's form)."""
    if value is None:
        return default
    return value["content"] if isinstance(value, dict) else value
