r"""One tokenizer for today's LLM families: HuggingFace's ``tokenizer.json``, read and run in
Python, equal to the ``tokenizers`` library id for id.

    tok = Tokenizer.from_folder("path/to/Qwen3")        # tokenizer.json + tokenizer_config.json
    tok.encode("Hello world!")                           # [9707, 1879, 0]
    tok.decode([9707, 1879, 0])                          # 'Hello world!'
    tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    load_tokenizer("model.gguf")                         # the same, from a GGUF's metadata

A ``tokenizer.json`` is a pipeline of five parts, each named by its ``type``; this module builds
each part from its JSON and runs them in HuggingFace's order:

1. **Added tokens** (``added_tokens``: "<|im_start|>", "<bos>", "\n\n" …) are cut out of the
   raw text first, left to right, the longest one at the leftmost position where any matches
   (Aho–Corasick's leftmost-longest rule). ``lstrip``/``rstrip`` tokens swallow the white
   space beside them, ``single_word`` ones match only between non-word characters. Tokens
   marked ``normalized: true`` are matched in a second pass, in the normalised text (their
   content normalised the same way). The text between them goes through steps 2–4, piece by
   piece.
2. **Normalise** (``normalizer``): Unicode normal forms (``NFC`` for Qwen), ``Replace``
   (Gemma: " " → "▁"), ``Prepend``, ``Lowercase``, ``Strip`` … in a ``Sequence``.
3. **Pre-tokenise** (``pre_tokenizer``) into words: ``Split`` by a regular expression (Llama 3
   and Qwen split letters, digit runs, punctuation and white space apart), ``ByteLevel``
   (GPT-2: each word's UTF-8 bytes become printable symbols, the space "Ġ"), ``Metaspace``
   (SentencePiece: spaces become "▁"), ``Digits`` … in a ``Sequence``.
4. **Model**: byte-pair encoding of each word. Start from one symbol per character (its
   ``<0xXX>`` byte tokens when the vocabulary lacks it and ``byte_fallback`` is on, else
   ``unk_token``) and apply the merges in rank order: always the adjacent pair with the lowest
   rank, the leftmost of equal ones, with a heap of candidate pairs — O(n log n) per word, and
   each distinct word is merged once (a cache). ``ignore_merges`` (Llama 3) takes a word that
   is itself in the vocabulary whole.
5. **Post-process** (``post_processor``): add the model's special tokens — a
   ``TemplateProcessing`` (``"<bos> $A"``), BERT's and RoBERTa's, or none (``ByteLevel``
   only trims offsets, which this module does not compute).

**Decoding** maps ids back to token strings (dropping special added tokens with
``skip_special_tokens=True``) and runs the ``decoder`` chain over the list: ``ByteLevel``
(symbols → bytes → UTF-8, invalid sequences as U+FFFD), ``Metaspace`` ("▁" → " ", the first
token's dropped), ``Replace``, ``ByteFallback`` ("<0xE4><0xBD><0xA0>" → "你"), ``Fuse``,
``Strip``; the pieces are joined. ``StreamDecoder`` does it one id at a time, holding back a
character whose bytes have not all arrived.

A part this module does not implement is refused by name when the file is read, never skipped:
a tokenizer that silently differs from the model's is worse than none. Supported: normalizers
NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Append, BertNormalizer,
Sequence; pre-tokenizers Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit,
Punctuation, CharDelimiterSplit, BertPreTokenizer, Sequence; the BPE model (``dropout``
refused); post-processors TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing,
Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder,
Sequence. A ``truncation`` or ``padding`` section of the file is not applied (``__call__``
truncates and pads, as the other minitx tokenizers do).

**GGUF files** carry no ``tokenizer.json``: llama.cpp stores the vocabulary, merges (or
scores) and token types as metadata. ``from_gguf_metadata`` writes the ``tokenizer.json`` they
stand for and reads it as above: "gpt2" models are byte-level BPE, their pre-tokenizer named by
``tokenizer.ggml.pre`` (llama.cpp's table of the regexes each value means); "llama" models are
SentencePiece BPE with byte fallback, built as ``transformers`` builds them (Gemma's whitespace
tokens respelled with "▁", merges recovered from the vocabulary). See ``from_gguf_metadata``.

Choices:

- **Regular expressions** with ``\p{L}``/``\p{N}`` (Llama 3, Qwen, GPT-2's own ByteLevel
  pattern) run on the ``regex`` package (an optional extra: ``python -m pip install
  ".[llm]"``), imported when a pattern needs it. GPT-2's pattern uses it too rather than the
  hand-written scanner of ``bpe.py``: that scanner classifies characters with Python's
  ``unicodedata``, whose Unicode version (14.0 in Python 3.11) is older than the tables of
  ``tokenizers``' regex engine (Oniguruma, Unicode 16.0), so letters assigned since would
  split differently. ``regex`` is newer still (17.0): the characters Unicode 17.0 assigned are
  looked at as unassigned ones while a pattern runs (``_masked``; and U+0295 "ʕ", a
  lowercase letter until 16.0, as one), which makes every pattern see Unicode 16.0, as
  ``tokenizers`` does; the matched spans cut the original text. Two differences remain,
  neither in a pattern the known LLM files use: Oniguruma's ``\w`` (in a ``Split`` regex)
  also matches ² ³ ¹ ¼ ½ ¾ and not U+200C/U+200D, where ``regex``'s does the opposite;
  and the normalizers (NFC …) use Python's ``unicodedata``, whose tables may be older than
  the Rust crate's, for characters assigned since.
- Literal patterns (a ``String`` in ``Split``/``Replace``) and added tokens need no ``regex``:
  Gemma's tokenizer runs on the standard library alone.
- ``decode``'s ``skip_special_tokens`` defaults to False, as in ``transformers``; the
  ``tokenizers`` library's own ``decode`` defaults to True.
- Ids outside the vocabulary are skipped by ``decode``, as HuggingFace does (a model's
  embedding table is often padded past its vocabulary).
"""
from __future__ import annotations

import datetime
import heapq
import json
import os
import re
import unicodedata

import numpy as np

from .bpe import bytes_to_unicode
from .gguf import GGUFFile
from .tokenization import PretrainedTokenizer
from .wordpiece import WHITESPACE, _token, basic_normalize

__all__ = ["Tokenizer", "StreamDecoder", "load_tokenizer", "render_chat_template",
           "gguf_tokenizer_spec", "recover_merges", "GGUF_PRE_TOKENIZERS", "GPT2_PATTERN",
           "LLM_EXTRA"]

#: what installs the optional packages this module imports when a file needs them
LLM_EXTRA = 'python -m pip install ".[llm]"'

_WS = "".join(sorted(WHITESPACE))                  # Unicode White_Space, for str.strip
_BYTE_SYMBOLS = bytes_to_unicode()                 # {byte: printable symbol}, GPT-2's map
_SYMBOL_BYTES = {c: b for b, c in _BYTE_SYMBOLS.items()}
# bytes (read as Latin-1 characters) → their symbols, for str.translate
_TO_SYMBOLS = {b: c for b, c in _BYTE_SYMBOLS.items()}


# ---- regular expressions: the regex package, seeing Unicode 16.0 ---------------------------

def _regex():
    """The ``regex`` package, imported on first use (an optional extra)."""
    try:
        import regex
    except ImportError as exc:
        raise ImportError("minitx.pretrained.hf_tokenizer: this tokenizer's regular expression "
                          "uses Unicode classes (\\p{L}, \\p{N}), which need the 'regex' "
                          f"package: {LLM_EXTRA}") from exc
    return regex


# The code points Unicode 17.0 assigned (DerivedAge.txt; checked against tokenizers 0.23.3,
# whose Oniguruma has Unicode 16.0 tables and sees them as unassigned), as hex ranges.
_UNICODE_17_0 = (
    "558 58B-58C 5C8-5C9 88F B53-B54 C5C CDC 1ACF-1AF0 208F 209D-209F 20C1-20C4 2B96 "
    "2E60-2E63 A7CE-A7CF A7D2 A7D4 A7DD A7E2 A7F1 AB6C-AB6D FBC3-FBD2 FD90-FD91 FDC8-FDCE "
    "107BB-107BF 10940-10959 10EC5-10EC7 10EC9-10EEE 10EF0-10EFB 11B0A 11B60-11B67 "
    "11DB0-11DDB 11DE0-11DE9 11DF0-11DF1 1246F 12475-1247F 12550-12686 16EA0-16EB8 "
    "16EBB-16ED3 16FF2-16FF6 187F8-187FF 18CD6-18CDA 18D09-18D20 18D80-18DF2 18E00-19191 "
    "191A0-191D2 1B123-1B128 1B168 1CCFA-1CCFC 1CEBA-1CED0 1CED2-1CED4 1CEDD-1CEFD "
    "1D127-1D128 1D1EB-1D1FF 1D250-1D281 1D6A6 1DB00-1DB1C 1DF1F-1DF24 1DF2B-1DF81 "
    "1DF90-1DF96 1DFCD-1DFFF 1E6C0-1E6DE 1E6E0-1E6F5 1E6FE-1E6FF 1F1AE 1F6D8-1F6D9 "
    "1F777-1F77A 1F7DA-1F7DB 1F7F1-1F7FF 1F8D0-1F8D8 1FA54-1FA57 1FA8A-1FA8E 1FAC8 "
    "1FACC-1FACD 1FADD 1FAEA-1FAEB 1FAEF 1FAF9-1FAFA 1FBFA 2B73A-2B73F 2B81E 2CEA2-2CEAD "
    "323B0-33479 3D000-3FC3F")


def _onig_mask():
    """(pattern finding a character to mask, {code point: stand-in}) — see ``_masked``."""
    spans = []
    for item in _UNICODE_17_0.split():
        lo, _, hi = item.partition("-")
        spans.append((int(lo, 16), int(hi or lo, 16)))
    klass = "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in spans) + "\u0295"
    table = {cp: 0xFDD0 for lo, hi in spans for cp in range(lo, hi + 1)}
    table[0x295] = 0x138           # U+0295 ʕ: Ll up to Unicode 16.0, Lo since; ĸ is an Ll
    return re.compile(f"[{klass}]"), table


_ONIG_MASK = None


def _masked(text: str) -> str:
    """``text`` as Unicode 16.0 sees it, same length: each character Unicode 17.0 assigned
    becomes U+FDD0 (a noncharacter, unassigned forever), so ``\\p{L}``, ``\\w`` … treat it as
    Oniguruma does. Only the spans of matches are used, cut from the original text."""
    global _ONIG_MASK
    if _ONIG_MASK is None:
        _ONIG_MASK = _onig_mask()
    finder, table = _ONIG_MASK
    return text.translate(table) if finder.search(text) else text


class _Pattern:
    """A ``Split``/``Replace`` pattern: ``{"String": s}`` (a literal, the standard ``re``) or
    ``{"Regex": r}`` (Oniguruma syntax, run on the ``regex`` package over ``_masked`` text).
    ``spans(text)`` → [(start, end)] of the non-overlapping matches, left to right."""

    def __init__(self, spec, where: str):
        if isinstance(spec, str):                         # a bare string: a literal
            spec = {"String": spec}
        if not isinstance(spec, dict) or len(spec) != 1 or not set(spec) <= {"String",
                                                                             "Regex"}:
            raise ValueError(f"{where}: pattern must be {{'String': ...}} or {{'Regex': ...}}, "
                             f"got {spec!r}")
        (kind, source), = spec.items()
        self.literal = kind == "String"
        self.source = source
        if self.literal:
            self._re = re.compile(re.escape(source)) if source else None
        else:
            regex = _regex()
            try:
                self._re = regex.compile(source)
            except regex.error as exc:
                raise ValueError(f"{where}: regular expression {source!r} does not compile "
                                 f"({exc})") from exc

    def spans(self, text: str) -> list:
        if self._re is None or not text:
            return []
        target = text if self.literal else _masked(text)
        return [m.span() for m in self._re.finditer(target)]

    def sub(self, text: str, content: str) -> str:
        if self.literal:
            return text.replace(self.source, content) if self.source else text
        out, last = [], 0
        for a, b in self.spans(text):
            out += [text[last:a], content]
            last = b
        return "".join(out) + text[last:]


_BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def _split(text: str, spans: list, behavior: str, invert: bool = False) -> list:
    """Cut ``text`` at the match ``spans`` as HuggingFace's ``split`` does; returns the kept
    (start, end) pieces, empty ones dropped.

    The matches and the text between them tile the text; ``invert`` swaps which are which.
    Removed: keep what is between matches. Isolated: every match and every gap its own
    piece. MergedWithPrevious / MergedWithNext: a match joins the piece before / after it.
    Contiguous: consecutive matches form one piece."""
    tiles, prev = [], 0
    for a, b in spans:
        if a > prev:
            tiles.append((prev, a, invert))
        tiles.append((a, b, not invert))
        prev = b
    if prev < len(text):
        tiles.append((prev, len(text), invert))
    if behavior == "Isolated":
        kept = [(a, b) for a, b, _ in tiles]
    elif behavior == "Removed":
        kept = [(a, b) for a, b, is_match in tiles if not is_match]
    elif behavior == "MergedWithPrevious":
        kept, previous_match = [], False
        for a, b, is_match in tiles:
            if is_match and not previous_match and kept:
                kept[-1] = (kept[-1][0], b)
            else:
                kept.append((a, b))
            previous_match = is_match
    elif behavior == "MergedWithNext":
        kept, previous_match = [], False
        for a, b, is_match in reversed(tiles):
            if is_match and not previous_match and kept:
                kept[-1] = (a, kept[-1][1])
            else:
                kept.append((a, b))
            previous_match = is_match
        kept.reverse()
    elif behavior == "Contiguous":
        kept, previous_match = [], False
        for a, b, is_match in tiles:
            if is_match == previous_match and kept:
                kept[-1] = (kept[-1][0], b)
            else:
                kept.append((a, b))
            previous_match = is_match
    else:
        raise ValueError(f"Split: behavior must be one of {', '.join(_BEHAVIORS)}, got "
                         f"{behavior!r}")
    return [(a, b) for a, b in kept if b > a]


# ---- normalizers: str → str ---------------------------------------------------------------

def _lowercase(text: str) -> str:
    """Character by character, as Rust's ``char::to_lowercase`` (no final-sigma rule)."""
    return "".join(c.lower() for c in text) if "Σ" in text else text.lower()


def _in_order(steps):
    """A ``Sequence`` of normalizers or decoders: each step applied to the last one's result."""
    def sequence(value):
        for step in steps:
            value = step(value)
        return value
    return sequence


def _build_normalizer(spec, where: str):
    """A function str → str from a ``normalizer`` JSON object (None: the identity)."""
    if spec is None:
        return None
    kind = spec.get("type")
    where = f"{where} normalizer {kind!r}"
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text, form=kind: unicodedata.normalize(form, text)
    if kind == "Lowercase":
        return _lowercase
    if kind == "Strip":
        left, right = spec.get("strip_left", True), spec.get("strip_right", True)

        def strip(text):
            text = text.lstrip(_WS) if left else text
            return text.rstrip(_WS) if right else text
        return strip
    if kind == "StripAccents":
        return lambda text: "".join(c for c in text if unicodedata.category(c) != "Mn")
    if kind == "Replace":
        pattern, content = _Pattern(spec["pattern"], where), spec["content"]
        return lambda text: pattern.sub(text, content)
    if kind == "Prepend":
        prefix = spec["prepend"]
        return lambda text: prefix + text if text else text
    if kind == "Append":
        suffix = spec["append"]
        return lambda text: text + suffix if text else text
    if kind == "BertNormalizer":
        options = dict(lowercase=spec.get("lowercase", True),
                       strip_accents=spec.get("strip_accents"),
                       clean_text=spec.get("clean_text", True),
                       handle_chinese_chars=spec.get("handle_chinese_chars", True))
        return lambda text: basic_normalize(text, **options)
    if kind == "Sequence":
        return _in_order([s for s in (_build_normalizer(s, where)
                                      for s in spec["normalizers"]) if s is not None])
    raise ValueError(f"{where}: not supported; minitx reads the normalizers NFC, NFD, NFKC, "
                     "NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Append, "
                     "BertNormalizer and Sequence")


# ---- pre-tokenizers: [(piece, at_start)] → [(word, at_start)] --------------------------------
# ``at_start``: the piece begins at the start of the input text (Metaspace's "first" scheme
# prepends "▁" only there, as HuggingFace's offsets_original().0 == 0).

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
                r"|\s+")


def _cut(pieces, pattern: _Pattern, behavior: str, invert: bool = False) -> list:
    out = []
    for text, at_start in pieces:
        for a, b in _split(text, pattern.spans(text), behavior, invert):
            out.append((text[a:b], at_start and a == 0))
    return out


class _PreTokenizer:
    """Builds a function [(piece, at_start)] → [(word, at_start)] from JSON."""

    def __init__(self, spec, where: str):
        self.kind = spec.get("type")
        self.where = f"{where} pre_tokenizer {self.kind!r}"
        build = getattr(self, f"_build_{self.kind}", None)
        if build is None:
            raise ValueError(f"{self.where}: not supported; minitx reads the pre-tokenizers "
                             "Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, "
                             "Punctuation, CharDelimiterSplit, BertPreTokenizer and Sequence")
        self.run = build(spec)

    def _build_Sequence(self, spec):
        steps = [_PreTokenizer(s, self.where).run for s in spec["pretokenizers"]]

        def sequence(pieces):
            for step in steps:
                pieces = step(pieces)
            return pieces
        return sequence

    def _build_Split(self, spec):
        pattern = _Pattern(spec["pattern"], self.where)
        behavior, invert = spec.get("behavior", "Isolated"), bool(spec.get("invert", False))
        if behavior not in _BEHAVIORS:
            raise ValueError(f"{self.where}: behavior must be one of {', '.join(_BEHAVIORS)}, "
                             f"got {behavior!r}")
        return lambda pieces: _cut(pieces, pattern, behavior, invert)

    def _build_ByteLevel(self, spec):
        # Defaults as tokenizers' serde: add_prefix_space and use_regex on.
        prefix = bool(spec.get("add_prefix_space", True))
        gpt2 = _Pattern({"Regex": GPT2_PATTERN}, self.where) if spec.get("use_regex", True) \
            else None

        def byte_level(pieces):
            if prefix:
                pieces = [(t if t.startswith(" ") else " " + t, s) for t, s in pieces]
            if gpt2 is not None:
                pieces = _cut(pieces, gpt2, "Isolated")
            # UTF-8 bytes → GPT-2's printable symbols ("Ġ" for the space)
            return [(t.encode("utf-8").decode("latin-1").translate(_TO_SYMBOLS), s)
                    for t, s in pieces]
        return byte_level

    def _build_Metaspace(self, spec):
        repl = spec.get("replacement", "▁")
        scheme = spec.get("prepend_scheme")
        if scheme is None:                      # older files: add_prefix_space
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        if scheme not in ("always", "first", "never"):
            raise ValueError(f"{self.where}: prepend_scheme must be 'always', 'first' or "
                             f"'never', got {scheme!r}")
        split = bool(spec.get("split", True))
        marker = _Pattern({"String": repl}, self.where)

        def metaspace(pieces):
            out = []
            for text, at_start in pieces:
                text = text.replace(" ", repl)
                if (scheme == "always" or (scheme == "first" and at_start)) and \
                        not text.startswith(repl):
                    text = repl + text
                out.append((text, at_start))
            return _cut(out, marker, "MergedWithNext") if split else out
        return metaspace

    def _build_Digits(self, spec):
        digit = _Pattern({"Regex": r"\p{N}" if spec.get("individual_digits") else r"\p{N}+"},
                         self.where)       # Rust's char::is_numeric: categories Nd, Nl, No
        return lambda pieces: _cut(pieces, digit, "Isolated")

    def _build_Whitespace(self, spec):
        pattern = _Pattern({"Regex": r"\w+|[^\w\s]+"}, self.where)      # the matches kept
        return lambda pieces: _cut(pieces, pattern, "Removed", invert=True)

    def _build_WhitespaceSplit(self, spec):
        pattern = _Pattern({"Regex": r"\s+"}, self.where)
        return lambda pieces: _cut(pieces, pattern, "Removed")

    def _build_Punctuation(self, spec):
        behavior = spec.get("behavior", "Isolated")
        pattern = _Pattern({"Regex": r"[\p{P}!-/:-@\[-`{-~]"}, self.where)
        return lambda pieces: _cut(pieces, pattern, behavior)

    def _build_CharDelimiterSplit(self, spec):
        pattern = _Pattern({"String": spec["delimiter"]}, self.where)
        return lambda pieces: _cut(pieces, pattern, "Removed")

    def _build_BertPreTokenizer(self, spec):
        ws = self._build_WhitespaceSplit(spec)
        punct = self._build_Punctuation({"behavior": "Isolated"})
        return lambda pieces: punct(ws(pieces))


# ---- the model: byte-pair encoding -----------------------------------------------------------

class _BPE:
    """HuggingFace's BPE model over a ``vocab`` {token: id} and ranked ``merges``.

    ``tokenize(word) → [id]``: one symbol per character (with ``continuing_subword_prefix``
    after the first, ``end_of_word_suffix`` on the last), a missing character as its
    ``<0xXX>`` byte tokens (``byte_fallback``) or ``unk_token`` (consecutive ones fused into
    one with ``fuse_unk``; dropped when there is no unk_token); then the merges by rank
    (module docstring, step 4)."""

    CACHE_SIZE = 200_000

    def __init__(self, vocab: dict, merges, unk_token=None, fuse_unk=False,
                 byte_fallback=False, continuing_subword_prefix=None, end_of_word_suffix=None,
                 ignore_merges=False, where="BPE"):
        self.vocab = vocab
        self.unk_token = unk_token
        self.fuse_unk, self.byte_fallback = bool(fuse_unk), bool(byte_fallback)
        self.prefix = continuing_subword_prefix or ""
        self.suffix = end_of_word_suffix or ""
        self.ignore_merges = bool(ignore_merges)
        # {(left id, right id): (rank, merged id)}; a repeated pair keeps its last rank, as in
        # tokenizers (a HashMap filled in order).
        self.merges = {}
        cut = len(self.prefix)
        for rank, merge in enumerate(merges):
            if isinstance(merge, str):
                a, sep, b = merge.partition(" ")
                if not sep:
                    raise ValueError(f"{where}: merge {merge!r} must be two tokens separated "
                                     "by a space")
            else:
                a, b = merge
            new = a + b[cut:]
            ids = vocab.get(a), vocab.get(b), vocab.get(new)
            if None in ids:
                missing = [t for t, i in zip((a, b, new), ids) if i is None]
                raise ValueError(f"{where}: merge {a!r} + {b!r} names {missing[0]!r}, which "
                                 "is not in the vocabulary")
            self.merges[ids[0], ids[1]] = (rank, ids[2])
        self._bytes = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
        self._cache = {}

    def tokenize(self, word: str) -> list:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
        else:
            ids = self.merge(self.symbols(word))
        if len(self._cache) < self.CACHE_SIZE:
            self._cache[word] = ids
        return ids

    def symbols(self, word: str) -> list:
        """The word's starting symbols, as ids (before any merge)."""
        vocab = self.vocab
        if not self.prefix and not self.suffix:
            try:
                return [vocab[c] for c in word]         # the common case: every char known
            except KeyError:
                pass
        ids, unk, last = [], None, len(word) - 1
        for i, c in enumerate(word):
            s = (self.prefix + c if self.prefix and i > 0 else c) + \
                (self.suffix if self.suffix and i == last else "")
            tid = vocab.get(s)
            if tid is not None:
                if unk is not None:
                    ids.append(unk)
                    unk = None
                ids.append(tid)
                continue
            if self.byte_fallback:
                pieces = [self._bytes[b] for b in s.encode("utf-8")]
                if None not in pieces:
                    ids.extend(pieces)      # (a pending unk stays pending, as in tokenizers)
                    continue
            if self.unk_token is not None:
                unk_id = vocab.get(self.unk_token)
                if unk_id is None:
                    raise ValueError(f"BPE: unk_token {self.unk_token!r} is not in the "
                                     "vocabulary")
                if unk is not None and not self.fuse_unk:
                    ids.append(unk)
                unk = unk_id
        if unk is not None:
            ids.append(unk)
        return ids

    def merge(self, ids: list) -> list:
        """Apply the merges: pop the (rank, position)-smallest candidate pair from a heap,
        skip it if either symbol has changed since it was pushed, else merge and push the two
        new pairs it forms with its neighbours. Symbols live in a linked list (``nxt``/
        ``prv``); a merged-away symbol is None."""
        n = len(ids)
        if n < 2:
            return ids
        get = self.merges.get
        heap = []
        for i in range(n - 1):
            m = get((ids[i], ids[i + 1]))
            if m is not None:
                heap.append((m[0], i, m[1]))
        if not heap:
            return ids
        if n == 2:
            return [heap[0][2]]
        heapq.heapify(heap)
        sym = list(ids)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, i, new = pop(heap)
            left = sym[i]
            j = nxt[i]
            if left is None or j < 0:
                continue
            m = get((left, sym[j]))
            if m is None or m[1] != new:             # an outdated candidate
                continue
            sym[i], sym[j] = new, None
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                m = get((new, sym[k]))
                if m is not None:
                    push(heap, (m[0], i, m[1]))
            p = prv[i]
            if p >= 0:
                m = get((sym[p], new))
                if m is not None:
                    push(heap, (m[0], p, m[1]))
        return [s for s in sym if s is not None]


# ---- added tokens --------------------------------------------------------------------------

class _Literals:
    """Leftmost-longest search for a set of literal strings (what tokenizers' Aho–Corasick
    automaton with MatchKind::LeftmostLongest finds): candidate starts are found by one
    character class; at each, the token lengths that start with that character are tried,
    longest first."""

    def __init__(self, contents):
        by_first = {}
        for s in contents:
            by_first.setdefault(s[0], set()).add(s)
        self._lengths = {c: sorted({len(s) for s in group}, reverse=True)
                         for c, group in by_first.items()}
        self._all = set(contents)
        self._starts = re.compile("[" + "".join(map(re.escape, sorted(by_first))) + "]") \
            if by_first else None

    def finditer(self, text: str):
        """(start, end) of each match, left to right, non-overlapping."""
        if self._starts is None:
            return
        i, search = 0, self._starts.search
        while True:
            m = search(text, i)
            if m is None:
                return
            p = m.start()
            for n in self._lengths[text[p]]:
                if text[p:p + n] in self._all:
                    yield p, p + n
                    i = p + n
                    break
            else:
                i = p + 1


class _AddedVocabulary:
    """The ``added_tokens`` and how they are cut out of a text (module docstring, step 1)."""

    def __init__(self, tokens: list, normalize):
        self.tokens = {}                        # content → token dict (its id and flags)
        for t in tokens:
            if t["content"]:
                self.tokens[t["content"]] = t
        raw = [c for c, t in self.tokens.items() if not t.get("normalized", True)]
        self._raw = _Literals(raw) if raw else None
        # normalized tokens are matched by their normalised content
        self.normalized = {}                    # normalised content → token
        for c, t in self.tokens.items():
            if t.get("normalized", True):
                key = normalize(c) if normalize is not None else c
                if key:
                    self.normalized.setdefault(key, t)
        self._normal = _Literals(list(self.normalized)) if self.normalized else None
        self.special = {c for c, t in self.tokens.items() if t.get("special")}
        self._flags = any(t.get("single_word") or t.get("lstrip") or t.get("rstrip")
                          for t in self.tokens.values())

    def split(self, text: str, normalized: bool):
        """[(piece text, None) or (token content, id)] covering ``text``, empty pieces left
        out, and the start offset of each (for Metaspace's "first")."""
        finder = self._normal if normalized else self._raw
        if finder is None or not text:
            return [(text, None, 0)] if text else []
        lookup = self.normalized if normalized else self.tokens
        out, done = [], 0
        for start, stop in finder.finditer(text):
            token = lookup[text[start:stop]]
            if self._flags:
                if token.get("single_word"):
                    before = start == 0 or not _WORD_END.search(_masked(text[:start]))
                    after = stop == len(text) or not _WORD_START.match(_masked(text[stop:]))
                    if not (before and after):
                        continue
                if token.get("lstrip"):
                    start = max(len(text[:start].rstrip(_WS)), done)
                if token.get("rstrip"):
                    stop += len(text[stop:]) - len(text[stop:].lstrip(_WS))
            if done < start:
                out.append((text[done:start], None, done))
            out.append((text[start:stop], token["id"], start))
            done = stop
        if done < len(text):
            out.append((text[done:], None, done))
        return out


class _WordClass:
    """``\\w`` as Rust's regex crate has it (Unicode word characters), compiled lazily."""

    def __init__(self, source):
        self.source, self._re = source, None

    def _compiled(self):
        if self._re is None:
            self._re = _regex().compile(self.source)
        return self._re

    def search(self, text):
        return self._compiled().search(text)

    def match(self, text):
        return self._compiled().match(text)


_WORD_END, _WORD_START = _WordClass(r"\w$"), _WordClass(r"^\w")


# ---- post-processors: [segment (ids, type ids)] → [segment] ---------------------------------

class _PostProcessor:
    """Builds ``run(segments, add_special) → (ids, type_ids)`` from a ``post_processor``;
    ``segments`` is [(ids,)] for one text or [(a,), (b,)] for a pair."""

    def __init__(self, spec, where: str):
        self.kind = None if spec is None else spec.get("type")
        self.where = f"{where} post_processor {self.kind!r}"
        if spec is None or self.kind == "ByteLevel":
            self.steps = []                                  # nothing to add
        elif self.kind == "Sequence":
            self.steps = []
            for s in spec["processors"]:
                self.steps += _PostProcessor(s, where).steps
        elif self.kind in ("TemplateProcessing", "BertProcessing", "RobertaProcessing"):
            self.steps = [self._template(spec)]
        else:
            raise ValueError(f"{self.where}: not supported; minitx reads the post-processors "
                             "TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing "
                             "and Sequence")

    def _template(self, spec):
        """(single, pair): lists of ("A" | "B", type id) and ([ids], type id) pieces."""
        if self.kind == "TemplateProcessing":
            specials = spec.get("special_tokens", {})

            def pieces(items):
                out = []
                for item in items:
                    if "Sequence" in item:
                        out.append((item["Sequence"]["id"], item["Sequence"]["type_id"]))
                    else:
                        name = item["SpecialToken"]["id"]
                        if name not in specials:
                            raise ValueError(f"{self.where}: special token {name!r} is not in "
                                             "its special_tokens")
                        out.append((list(specials[name]["ids"]),
                                    item["SpecialToken"]["type_id"]))
                return out
            return pieces(spec["single"]), pieces(spec.get("pair") or [])
        cls, sep = [spec["cls"][1]], [spec["sep"][1]]
        if self.kind == "BertProcessing":
            return ([(cls, 0), ("A", 0), (sep, 0)],
                    [(cls, 0), ("A", 0), (sep, 0), ("B", 1), (sep, 1)])
        return ([(cls, 0), ("A", 0), (sep, 0)],                       # RoBERTa
                [(cls, 0), ("A", 0), (sep, 0), (sep, 0), ("B", 0), (sep, 0)])

    def run(self, a: list, b=None, add_special: bool = True):
        """(ids, type ids) of one text ``a`` (or the pair a, b) with the special tokens."""
        segments = [(list(a), [0] * len(a))]
        if b is not None:
            segments.append((list(b), [1] * len(b)))
        if add_special:
            for single, pair in self.steps:
                template = pair if len(segments) == 2 else single
                if len(segments) == 2 and not pair:
                    raise ValueError(f"{self.where}: the template has no 'pair' form, so it "
                                     "cannot encode a text pair")
                ids, types = [], []
                for piece, type_id in template:
                    if piece in ("A", "B"):
                        seg = segments[0 if piece == "A" else 1][0]
                        ids += seg
                        types += [type_id] * len(seg)
                    else:
                        ids += piece
                        types += [type_id] * len(piece)
                segments = [(ids, types)]
        ids, types = [], []
        for seg_ids, seg_types in segments:
            ids += seg_ids
            types += seg_types
        return ids, types


# ---- decoders: [token string] → [string] -----------------------------------------------------

def _byte_level_decode(tokens):
    data = bytearray()
    for t in tokens:
        try:
            data += bytes(_SYMBOL_BYTES[c] for c in t)
        except KeyError:                         # not byte symbols: the token's own UTF-8
            data += t.encode("utf-8")
    return [data.decode("utf-8", errors="replace")]


_HEX = frozenset("0123456789abcdefABCDEF")


def _byte_fallback_decode(tokens):
    out, pending = [], bytearray()

    def flush():
        if pending:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:           # invalid: one U+FFFD per byte
                out.extend(["\ufffd"] * len(pending))
            pending.clear()
    for t in tokens:
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">") and set(t[3:5]) <= _HEX:
            pending.append(int(t[3:5], 16))
        else:
            flush()
            out.append(t)
    flush()
    return out


def _strip(token, content, start, stop):
    """At most ``start`` leading and ``stop`` trailing copies of ``content`` removed."""
    for _ in range(start):
        token = token.removeprefix(content)
    for _ in range(stop):
        token = token.removesuffix(content)
    return token


def _build_decoder(spec, where: str):
    """A function [token string] → [string] from a ``decoder`` (None: join with spaces)."""
    if spec is None:
        return None
    kind = spec.get("type")
    where = f"{where} decoder {kind!r}"
    if kind == "ByteLevel":
        return _byte_level_decode
    if kind == "Metaspace":
        repl = spec.get("replacement", "▁")
        scheme = spec.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        strip_first = scheme != "never"
        # the first token loses every replacement character, as in tokenizers
        return lambda tokens: [t.replace(repl, "" if i == 0 and strip_first else " ")
                               for i, t in enumerate(tokens)]
    if kind == "Replace":
        pattern, content = _Pattern(spec["pattern"], where), spec["content"]
        return lambda tokens: [pattern.sub(t, content) for t in tokens]
    if kind == "ByteFallback":
        return _byte_fallback_decode
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        content, start, stop = spec["content"], int(spec["start"]), int(spec["stop"])
        return lambda tokens: [_strip(t, content, start, stop) for t in tokens]
    if kind == "BPEDecoder":
        suffix = spec.get("suffix", "</w>")
        return lambda tokens: [t.replace(suffix, "" if i == len(tokens) - 1 else " ")
                               for i, t in enumerate(tokens)]
    if kind == "Sequence":
        return _in_order([_build_decoder(s, where) for s in spec["decoders"]])
    raise ValueError(f"{where}: not supported; minitx reads the decoders ByteLevel, Metaspace, "
                     "Replace, ByteFallback, Fuse, Strip, BPEDecoder and Sequence")


# ---- the tokenizer -------------------------------------------------------------------------

def _read_json_file(path, what):
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (expected {what})")
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc


class Tokenizer(PretrainedTokenizer):
    """A ``tokenizer.json`` (a parsed dict), run as HuggingFace's ``tokenizers`` runs it.

    ``Tokenizer(spec, config=None, source="tokenizer.json")``: ``spec`` the file's JSON,
    ``config`` a ``tokenizer_config.json`` dict (special tokens, chat template, lengths);
    usually built by ``from_file``, ``from_folder`` or ``from_gguf_metadata``.

    ``encode(text) → [id]``, ``decode(ids) → str``; ``tok(texts)`` → padded (B, N) int64
    NumPy arrays as the other minitx tokenizers (``PretrainedTokenizer``). ``vocab``: {token:
    id}, added tokens included. ``bos_token``/``eos_token``/``pad_token``/``unk_token`` and
    their ``_id``s come from the config (None when it names none); batches are padded with
    ``pad_token_id``: the pad token's, else the eos token's (the attention mask hides
    padding), else 0. ``chat_template``: the Jinja source, or None.
    """

    def __init__(self, spec: dict, config: dict = None, source: str = "tokenizer.json"):
        if not isinstance(spec, dict):
            raise TypeError(f"Tokenizer: spec must be a tokenizer.json dict, got "
                            f"{type(spec).__name__}")
        config = dict(config or {})
        self.source = source
        model = spec.get("model") or {}
        kind = model.get("type", "BPE" if "merges" in model else None)
        if kind != "BPE":
            raise ValueError(f"{source}: model type {kind!r} is not supported; minitx's "
                             "Tokenizer reads BPE models (BERT's WordPiece: WordPieceTokenizer)")
        if model.get("dropout") not in (None, 0, 0.0):
            raise ValueError(f"{source}: BPE dropout={model['dropout']!r} is random at every "
                             "call; minitx reads deterministic tokenizers only (dropout null)")
        vocab = dict(model.get("vocab") or {})
        if not vocab:
            raise ValueError(f"{source}: the BPE model has an empty vocabulary")
        self._normalize = _build_normalizer(spec.get("normalizer"), source)
        pre = spec.get("pre_tokenizer")
        self._pre_tokenize = None if pre is None else _PreTokenizer(pre, source).run
        self._model = _BPE(vocab, model.get("merges") or [], unk_token=model.get("unk_token"),
                           fuse_unk=model.get("fuse_unk", False),
                           byte_fallback=model.get("byte_fallback", False),
                           continuing_subword_prefix=model.get("continuing_subword_prefix"),
                           end_of_word_suffix=model.get("end_of_word_suffix"),
                           ignore_merges=model.get("ignore_merges", False),
                           where=f"{source} model")
        added = list(spec.get("added_tokens") or [])
        for t in added:
            if "id" not in t or "content" not in t:
                raise ValueError(f"{source}: each added token needs 'id' and 'content', got "
                                 f"{t!r}")
        self._added = _AddedVocabulary(added, self._normalize)
        self._post = _PostProcessor(spec.get("post_processor"), source)
        self._decode_steps = _build_decoder(spec.get("decoder"), source)
        full = dict(vocab)
        full.update({t["content"]: t["id"] for t in added})
        # The config's special tokens (tokenizer_config.json, or a GGUF's ids).
        self.bos_token = _token(config.get("bos_token"), None)
        self.eos_token = _token(config.get("eos_token"), None)
        pad = _token(config.get("pad_token"), None)
        self._named = {name: _token(config.get(name), None) for name in
                       ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token",
                        "sep_token", "cls_token")}
        for name, value in (config.get("extra_special_tokens") or {}).items():
            if isinstance(name, str) and not isinstance(value, (list, tuple)):
                self._named[name] = _token(value, None)
        for name, tok in self._named.items():
            if tok is not None and tok not in full:
                raise ValueError(f"{source}: {name} {tok!r} is not in the vocabulary")
        length = config.get("model_max_length", 1 << 31)
        length = int(min(length, 1 << 31)) if isinstance(length, (int, float)) else 1 << 31
        super().__init__(full, special_tokens=(), pad_token=pad,
                         unk_token=_token(config.get("unk_token"), None),
                         model_max_length=length,
                         padding_side=config.get("padding_side", "right"))
        self.special_tokens = tuple(sorted(self._added.special, key=full.get))
        if pad is None and self.eos_token is not None:
            self.pad_token_id = full[self.eos_token]
        # id → token: the model vocabulary's inverse, as tokenizers' (an id shadowed by a
        # duplicate token has no string), the added tokens over it; a token matched after
        # normalisation is spelled normalised, as tokenizers spells it.
        self.ids_to_tokens = {i: t for t, i in vocab.items()}
        self.ids_to_tokens.update({t["id"]: t["content"] for t in added})
        self._normalized_added = {c: t["id"] for c, t in self._added.normalized.items()}
        self.ids_to_tokens.update({i: c for c, i in self._normalized_added.items()})
        # add_bos_token / add_eos_token: added where the post-processor does not add them
        self._extra_bos = self._extra_eos = None
        probe = self._post.run([], None, True)[0]
        if config.get("add_bos_token") and self.bos_token is not None and \
                full[self.bos_token] not in probe[:1]:
            self._extra_bos = full[self.bos_token]
        if config.get("add_eos_token") and self.eos_token is not None and \
                full[self.eos_token] not in probe[-1:]:
            self._extra_eos = full[self.eos_token]
        self.chat_template = config.get("chat_template")

    # ---- constructors ----------------------------------------------------------------------
    @classmethod
    def from_file(cls, tokenizer_json_path, config_path=None) -> "Tokenizer":
        """Read a ``tokenizer.json`` (and, if given, its ``tokenizer_config.json``). Without a
        config the tokenizer is exactly the file, as ``tokenizers.Tokenizer.from_file``."""
        spec = _read_json_file(tokenizer_json_path, "a tokenizer.json")
        config = None if config_path is None else _read_json_file(config_path,
                                                                   "a tokenizer_config.json")
        return cls(spec, config, source=os.fspath(tokenizer_json_path))

    @classmethod
    def from_folder(cls, folder) -> "Tokenizer":
        """A HuggingFace folder: ``tokenizer.json``, with ``tokenizer_config.json`` and
        ``special_tokens_map.json`` when present (a ``chat_template.jinja`` file overrides the
        config's template), or GPT-2's older ``vocab.json`` + ``merges.txt``."""
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{folder}: not a folder (expected one holding "
                                    "tokenizer.json)")
        config = {}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                for key, value in _read_json_file(path, name).items():
                    config.setdefault(key, value)
        jinja = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as fh:
                config["chat_template"] = fh.read()
        path = os.path.join(folder, "tokenizer.json")
        if os.path.isfile(path):
            return cls(_read_json_file(path, "a tokenizer.json"), config, source=path)
        vocab_path, merges_path = (os.path.join(folder, n) for n in ("vocab.json", "merges.txt"))
        if os.path.isfile(vocab_path) and os.path.isfile(merges_path):
            return cls(_gpt2_files_spec(vocab_path, merges_path, config), config,
                       source=vocab_path)
        raise FileNotFoundError(f"{folder}: no tokenizer file; expected tokenizer.json, or "
                                "vocab.json + merges.txt (GPT-2 style)")

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> "Tokenizer":
        """The tokenizer a GGUF file's ``tokenizer.*`` metadata describes (a dict key → Python
        value, arrays as lists). ``tokenizer.ggml.model``:

        - "gpt2": byte-level BPE; ``tokens`` (spelled in GPT-2's byte symbols; a token in
          plain text is respelled, as transformers does), ``merges`` ("a b"), and the
          pre-tokenizer llama.cpp's ``tokenizer.ggml.pre`` names (``GGUF_PRE_TOKENIZERS``:
          "smollm" is one digit at a time, then GPT-2's pattern, as SmolLM2's own
          tokenizer.json; transformers' GGUF reader knows no "smollm" and keeps GPT-2's
          pattern alone, so its ids differ around numbers).
        - "llama": SentencePiece BPE with byte fallback, as transformers builds it: merges
          recovered from the vocabulary (every split of a token into two tokens, best first
          by the token's score); for Gemma (``general.architecture`` gemma, gemma2, gemma3)
          the score is the token's position instead, whitespace tokens stored as spaces
          ("  ") are respelled "▁▁", and " " → "▁" is a normalizer (no prefix space);
          otherwise spaces become "▁" with one prefixed to the text (Metaspace, "first";
          none when ``add_space_prefix`` is false).

        Token types: 3 (control) become special added tokens, 4 (user-defined) plain added
        ones, both matched whole in the text. ``bos/eos/unknown/padding_token_id`` name the
        special tokens; ``add_bos_token`` (default: true for "llama") / ``add_eos_token``
        the post-processor; ``tokenizer.chat_template`` the chat template."""
        spec, config = gguf_tokenizer_spec(metadata)
        return cls(spec, config, source="GGUF metadata")

    # ---- properties ----------------------------------------------------------------------
    def _id(self, token):
        return None if token is None else self.vocab.get(token)

    @property
    def bos_token_id(self):
        return self._id(self.bos_token)

    @property
    def eos_token_id(self):
        return self._id(self.eos_token)

    @property
    def unk_token_id(self):
        return self._id(self.unk_token)

    @property
    def added_tokens(self) -> dict:
        """{content: id} of the added tokens."""
        return {c: t["id"] for c, t in self._added.tokens.items()}

    # ---- text → ids ------------------------------------------------------------------------
    def _encode_text(self, text: str) -> list:
        """Steps 1–4 of the module docstring: ids without the post-processor's tokens."""
        ids = []
        normalize, pre, model = self._normalize, self._pre_tokenize, self._model.tokenize
        added = self._added
        for piece, tid, start in added.split(text, normalized=False):
            if tid is not None:
                ids.append(tid)
                continue
            if normalize is not None:
                piece = normalize(piece)
            for sub, sub_id, sub_start in added.split(piece, normalized=True):
                if sub_id is not None:
                    ids.append(sub_id)
                    continue
                words = [(sub, start == 0 and sub_start == 0)]
                if pre is not None:
                    words = pre(words)
                for word, _ in words:
                    ids += model(word)
        return ids

    def _check_text(self, text, name="text"):
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__}.encode: {name} must be a str, got "
                            f"{type(text).__name__}")

    def encode(self, text: str, text_pair: str = None, add_special_tokens: bool = True) -> list:
        """``text`` (and an optional second segment ``text_pair``) → a list of ids, with the
        post-processor's special tokens when ``add_special_tokens``, as
        ``tokenizers.Tokenizer.encode(...).ids``."""
        self._check_text(text)
        if text_pair is not None:
            self._check_text(text_pair, "text_pair")
        a = self._encode_text(text)
        b = None if text_pair is None else self._encode_text(text_pair)
        return self.build_inputs(a, b)[0] if add_special_tokens else a + (b or [])

    def tokenize(self, text: str) -> list:
        """``text`` → token strings, no special tokens added (HF's ``tokenize``)."""
        self._check_text(text)
        return [self.ids_to_tokens[i] for i in self._encode_text(text)]

    def build_inputs(self, ids_a, ids_b=None):
        """Add the special tokens (the post-processor; add_bos/eos_token from the config where
        it adds none): returns (ids, token_type_ids)."""
        ids, types = self._post.run(ids_a, ids_b, True)
        if self._extra_bos is not None:
            ids, types = [self._extra_bos] + ids, [0] + types
        if self._extra_eos is not None:
            ids, types = ids + [self._extra_eos], types + [types[-1] if types else 0]
        return ids, types

    def convert_ids_to_tokens(self, ids):
        """ids → token strings (a single int → one string); an id outside the vocabulary
        raises KeyError naming it."""
        if isinstance(ids, (int, np.integer)):
            return self.convert_ids_to_tokens([ids])[0]
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i not in self.ids_to_tokens:
                raise KeyError(f"convert_ids_to_tokens: id {i} is not in the vocabulary "
                               f"(ids 0..{max(self.ids_to_tokens)})")
            out.append(self.ids_to_tokens[i])
        return out

    def convert_tokens_to_ids(self, tokens):
        """Token strings → ids (a single string → one id), unk_token's id for unknown ones
        (KeyError when there is none)."""
        if isinstance(tokens, str):
            return self.convert_tokens_to_ids([tokens])[0]
        extra = self._normalized_added
        if extra:       # normalised added tokens, as tokenize spells them
            return [extra[t] if t not in self.vocab and t in extra else
                    super(Tokenizer, self).convert_tokens_to_ids([t])[0] for t in tokens]
        return super().convert_tokens_to_ids(tokens)

    # ---- ids → text ----------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """ids (a list or a 1-d array) → text, as ``tokenizers``' ``decode``: the token
        strings (special added tokens dropped with ``skip_special_tokens``; ids outside the
        vocabulary skipped) through the decoder chain, joined."""
        ids = np.asarray(ids).reshape(-1).tolist() if not isinstance(ids, list) else ids
        get, special = self.ids_to_tokens.get, self._added.special
        tokens = []
        for i in ids:
            t = get(int(i))
            if t is not None and not (skip_special_tokens and t in special):
                tokens.append(t)
        if self._decode_steps is None:
            return " ".join(tokens)
        return "".join(self._decode_steps(tokens))

    def batch_decode(self, ids, skip_special_tokens: bool = False) -> list:
        """(B, N) ids → B strings."""
        return [self.decode(list(row), skip_special_tokens) for row in np.asarray(ids)]

    # ---- chat ------------------------------------------------------------------------------
    def special_tokens_map(self) -> dict:
        """{name: token} of the named special tokens (bos_token, eos_token, …) the config
        gives: the variables a chat template sees."""
        return {k: v for k, v in self._named.items() if v is not None}

    def apply_chat_template(self, conversation, tools=None, documents=None,
                            chat_template=None, add_generation_prompt: bool = False,
                            continue_final_message: bool = False, tokenize: bool = True,
                            **template_kwargs):
        """Render ``conversation`` ([{"role", "content"}, …], or a list of them) with the
        chat template, as ``transformers``' ``apply_chat_template``: the template sees
        ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special tokens
        (``bos_token``, ``eos_token`` …) and ``template_kwargs``. ``tokenize=True`` (the
        default) returns the ids of the rendered text, encoded without adding special tokens
        (the template writes them); ``tokenize=False`` the text.
        ``continue_final_message``: leave the last message open (no end-of-turn) for the
        model to continue. See ``render_chat_template`` for the environment."""
        template = self._pick_template(chat_template, tools)
        batched = isinstance(conversation, (list, tuple)) and conversation and \
            isinstance(conversation[0], (list, tuple))
        chats = list(conversation) if batched else [conversation]
        variables = {**self.special_tokens_map(), **template_kwargs}
        texts = [render_chat_template(template, chat, tools=tools, documents=documents,
                                      add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message,
                                      **variables) for chat in chats]
        out = [self.encode(t, add_special_tokens=False) for t in texts] if tokenize else texts
        return out if batched else out[0]

    def _pick_template(self, chat_template, tools):
        template = self.chat_template if chat_template is None else chat_template
        if isinstance(template, list):      # [{"name": ..., "template": ...}]
            named = {t["name"]: t["template"] for t in template}
            if chat_template is None and tools is not None and "tool_use" in named:
                return named["tool_use"]
            if "default" in named:
                return named["default"]
            raise ValueError(f"apply_chat_template: the tokenizer has the chat templates "
                             f"{sorted(named)} and none is 'default'; pass chat_template=...")
        if isinstance(template, dict):
            return self._pick_template([{"name": k, "template": v}
                                        for k, v in template.items()], tools)
        if template is None:
            raise ValueError(f"{self.source}: apply_chat_template: this tokenizer has no chat "
                             "template (tokenizer_config.json's chat_template, or a GGUF's "
                             "tokenizer.chat_template); pass chat_template=...")
        if not isinstance(template, str):
            raise TypeError(f"apply_chat_template: chat_template must be a str, got "
                            f"{type(template).__name__}")
        return template


class StreamDecoder:
    """Decode ids one at a time, for printing a generation as it runs.

    ``push(token_id) → str``: the text completed by this token (maybe ""): a character whose
    UTF-8 bytes are split over several tokens (byte-level symbols or ``<0xXX>`` byte
    fallback) comes out once its last byte arrives. ``flush() → str``: whatever is held back,
    at the end. The pieces joined equal ``tokenizer.decode(all ids)``.

    The pending ids are decoded together with the ids of the last piece shown (their
    context), and what they add to the context's own decoding is returned: decoders that
    treat the first token apart (Metaspace's and Strip's leading space) or look at runs of
    byte tokens (ByteFallback) then see a context that decodes the same both times. While the
    decoded text ends with U+FFFD (a character still incomplete), nothing is returned. (A
    stray invalid byte right after a multi-byte character decoded by ByteFallback turns that
    whole run of bytes into U+FFFDs in ``decode``; the stream has shown the character by then.)
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        if not hasattr(tokenizer, "decode"):
            raise TypeError(f"StreamDecoder: tokenizer must have a decode method, got "
                            f"{type(tokenizer).__name__}")
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self._ids, self._context, self._shown = [], 0, ""

    def _new_text(self):
        text = self.tokenizer.decode(self._ids, self.skip_special_tokens)
        same = len(os.path.commonprefix([text, self._shown]))
        return text, text[same:]

    def push(self, token_id) -> str:
        if not isinstance(token_id, (int, np.integer)) or isinstance(token_id, bool):
            raise TypeError(f"StreamDecoder.push: token_id must be an int, got "
                            f"{type(token_id).__name__}")
        self._ids.append(int(token_id))
        text, new = self._new_text()
        if text.endswith("\ufffd"):
            return ""
        self._ids = self._ids[self._context:]          # the ids just shown: the new context
        self._context = len(self._ids)
        self._shown = self.tokenizer.decode(self._ids, self.skip_special_tokens)
        return new

    def flush(self) -> str:
        _, new = self._new_text()
        self._ids, self._context, self._shown = [], 0, ""
        return new


# ---- GPT-2's older files -------------------------------------------------------------------

def _gpt2_files_spec(vocab_path, merges_path, config) -> dict:
    """The tokenizer.json that ``vocab.json`` + ``merges.txt`` stand for (GPT-2's tokenizer:
    ByteLevel with GPT-2's pattern, no prefix space unless the config says so)."""
    vocab = _read_json_file(vocab_path, "a vocab.json")
    with open(merges_path, encoding="utf-8") as fh:
        merges = [line.rstrip("\n") for line in fh
                  if line.strip() and not line.startswith("#version")]
    specials = [_token(config.get(k), None) for k in ("bos_token", "eos_token", "unk_token",
                                                       "pad_token")]
    added = [{"id": vocab[t], "content": t, "special": True, "normalized": False}
             for t in dict.fromkeys(s for s in specials if s is not None) if t in vocab]
    prefix = bool(config.get("add_prefix_space", False))
    return {"model": {"type": "BPE", "vocab": vocab, "merges": merges},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": prefix,
                              "use_regex": True},
            "decoder": {"type": "ByteLevel"}, "added_tokens": added}


# ---- GGUF metadata → tokenizer.json ----------------------------------------------------------

_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                   r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                  r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                   r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                   r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}


_GPT2_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
_DIGITS_THEN_GPT2 = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, _GPT2_BYTES]}


def _pre_table():
    """{tokenizer.ggml.pre value: (pre_tokenizer JSON, ignore_merges)}, after llama.cpp's
    llama-vocab.cpp (each value's regexes) in tokenizer.json's spelling."""
    groups = [
        (("default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion",
          "granite-docling", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "jina-v1-en",
          "jina-v2-code", "roberta-bpe", "gigachat", "a.x-4.0", "mellum", "modern-bert",
          "exaone4"), _GPT2_BYTES, False),
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
          "lfm2", "jina-v5-nano"), _split_then_bytes(_LLAMA3_PATTERN), True),
        (("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), _split_then_bytes(_LLAMA3_PATTERN),
         False),
        (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2"),
         _split_then_bytes(_QWEN2_PATTERN), False),
        (("qwen35",), _split_then_bytes(_QWEN35_PATTERN), False),
        (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
         _DIGITS_THEN_GPT2, False),
        (("gpt-4o", "llama4", "kanana2", "talkie"), _split_then_bytes(_GPT4O_PATTERN), False),
        (("tekken",), _split_then_bytes(_TEKKEN_PATTERN), True),
    ]
    return {name: (pre, ignore) for names, pre, ignore in groups for name in names}


#: tokenizer.ggml.pre → (pre_tokenizer JSON, ignore_merges)
GGUF_PRE_TOKENIZERS = _pre_table()
_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def recover_merges(vocab: dict, scores: dict) -> list:
    """The merges a SentencePiece BPE vocabulary implies (what ``transformers`` derives when a
    GGUF lists none): every way to cut a token into two vocabulary tokens, ordered by the
    token's score (best first), then by the lengths of the two parts (longer first); the
    cuts of one token are listed by the ids of their parts. ``vocab``: {token: id};
    ``scores``: {token: score}, in the order of the file."""
    merges = []
    for token, score in scores.items():
        cuts = [(token[:i], token[i:]) for i in range(1, len(token))
                if token[:i] in vocab and token[i:] in vocab]
        cuts.sort(key=lambda c: (vocab[c[0]], vocab[c[1]]))
        merges += [(a, b, score) for a, b in cuts]
    # descending, ties in their order (a stable sort on the negated key)
    merges.sort(key=lambda m: (-m[2], -len(m[0]), -len(m[1])))
    return [(a, b) for a, b, _ in merges]


def gguf_tokenizer_spec(metadata: dict):
    """(tokenizer.json dict, tokenizer_config dict) from a GGUF's metadata; see
    ``Tokenizer.from_gguf_metadata``."""
    if not isinstance(metadata, dict):
        raise TypeError(f"from_gguf_metadata: metadata must be a dict, got "
                        f"{type(metadata).__name__}")
    model = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, np.ndarray):
        tokens = tokens.tolist()
    if model not in ("gpt2", "llama"):
        raise ValueError(f"GGUF metadata: tokenizer.ggml.model must be 'gpt2' (byte-level BPE) "
                         f"or 'llama' (SentencePiece BPE), got {model!r}")
    if not isinstance(tokens, (list, tuple)) or not tokens:
        raise ValueError("GGUF metadata: tokenizer.ggml.tokens must be a non-empty list of "
                         f"strings, got {type(tokens).__name__}")
    types = metadata.get("tokenizer.ggml.token_type")
    types = [1] * len(tokens) if types is None else [int(k) for k in types]
    if len(types) != len(tokens):
        raise ValueError(f"GGUF metadata: tokenizer.ggml.token_type has {len(types)} entries "
                         f"for {len(tokens)} tokens")
    arch = metadata.get("general.architecture")
    if model == "gpt2":
        spec, vocab = _gguf_byte_level(metadata, tokens)
        # a control token written outside the byte alphabet is a llama.cpp mislabel
        alphabet = set(_SYMBOL_BYTES)
        controls = [t for t, k in zip(tokens, types) if k == 3 and set(t) <= alphabet]
    else:
        spec, vocab = _gguf_sentencepiece(metadata, tokens, arch)
        controls = [t for t, k in zip(tokens, types) if k == 3]
    # The named special tokens from their ids (GemmaTokenizer also names "<mask>").
    config = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        i = metadata.get(f"tokenizer.ggml.{key}")
        if i is not None:
            if not 0 <= int(i) < len(tokens):
                raise ValueError(f"GGUF metadata: tokenizer.ggml.{key}={i} is outside the "
                                 f"vocabulary (0..{len(tokens) - 1})")
            config[name] = _respelled(tokens[int(i)], vocab)
    if model == "llama" and arch in _GEMMA_ARCHITECTURES and "<mask>" in vocab:
        config["mask_token"] = "<mask>"
    # Added tokens, in transformers' order: the named ones and the control tokens special,
    # then the user-defined ones plain; a token keeps its first flags.
    named = [config[n] for n in ("bos_token", "eos_token", "unk_token", "pad_token",
                                 "mask_token") if config.get(n) is not None]
    users = [t for t, k in zip(tokens, types) if k == 4]
    added = {}
    for content, special in [(t, True) for t in named + controls] + [(t, False) for t in users]:
        if content in vocab and content not in added:
            added[content] = {"id": vocab[content], "content": content, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": special}
    spec["added_tokens"] = sorted(added.values(), key=lambda t: t["id"])
    # add_bos_token / add_eos_token → the post-processor's template
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", model == "llama")
    add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
    bos = config.get("bos_token") if add_bos else None
    eos = config.get("eos_token") if add_eos else None

    def template(segment, type_id):
        return ([{"SpecialToken": {"id": bos, "type_id": type_id}}] if bos else []) + \
            [{"Sequence": {"id": segment, "type_id": type_id}}] + \
            ([{"SpecialToken": {"id": eos, "type_id": type_id}}] if eos else [])
    spec["post_processor"] = {
        "type": "TemplateProcessing", "single": template("A", 0),
        "pair": template("A", 0) + template("B", 1),
        "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]}
                           for t in (bos, eos) if t}}
    if metadata.get("tokenizer.chat_template") is not None:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return spec, config


def _respelled(token, vocab):
    """A token as the built vocabulary spells it (Gemma's "  " is "▁▁")."""
    if token in vocab:
        return token
    return "▁" * len(token) if token and not token.strip(" ") else token


def _gguf_byte_level(metadata, tokens):
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ValueError(f"GGUF metadata: tokenizer.ggml.pre {pre!r} is not one minitx knows; "
                         f"known: {', '.join(sorted(GGUF_PRE_TOKENIZERS))}")
    pre_tokenizer, ignore_merges = GGUF_PRE_TOKENIZERS[pre]
    alphabet = set(_SYMBOL_BYTES)
    vocab = {}
    for i, t in enumerate(tokens):
        t = t if set(t) <= alphabet else t.encode("utf-8").decode("latin-1").translate(
            _TO_SYMBOLS)
        vocab[t] = i
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("GGUF metadata: a 'gpt2' tokenizer needs tokenizer.ggml.merges")
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)                     # llama.cpp: the first space after one char
        if cut < 0:
            raise ValueError(f"GGUF metadata: merge {m!r} must be two tokens separated by a "
                             "space")
        pairs.append((m[:cut], m[cut + 1:]))
    spec = {"normalizer": None, "pre_tokenizer": pre_tokenizer,
            "model": {"type": "BPE", "vocab": vocab, "merges": pairs, "unk_token": None,
                      "ignore_merges": ignore_merges},
            "decoder": {"type": "ByteLevel"}}
    return spec, vocab


def _gguf_sentencepiece(metadata, tokens, arch):
    gemma = arch in _GEMMA_ARCHITECTURES
    if gemma:   # whitespace tokens stored as spaces: respelled as Gemma looks them up
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    if metadata.get("tokenizer.ggml.merges") is not None:
        merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    elif gemma:     # Gemma's scores do not follow its merge order; the file order does
        merges = recover_merges(vocab, {t: -i for i, t in enumerate(tokens)})
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ValueError("GGUF metadata: a 'llama' tokenizer without merges needs "
                             "tokenizer.ggml.scores, one per token")
        merges = recover_merges(vocab, dict(zip(tokens, scores)))
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    model = {"type": "BPE", "vocab": vocab, "merges": merges, "fuse_unk": True,
             "byte_fallback": True,
             "unk_token": (tokens[unk] if unk is not None else "<unk>") if gemma else None}
    steps = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
             {"type": "ByteFallback"}, {"type": "Fuse"}]
    if gemma:
        spec = {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                                  "behavior": "MergedWithPrevious", "invert": False}}
    else:
        prefix = metadata.get("tokenizer.ggml.add_space_prefix", True)
        spec = {"normalizer": None,
                "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                                  "prepend_scheme": "first" if prefix else "never",
                                  "split": False}}
        if prefix:
            steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    spec.update(model=model, decoder={"type": "Sequence", "decoders": steps})
    return spec, vocab


# ---- chat templates ------------------------------------------------------------------------

_ENVIRONMENT = None


def _jinja_environment():
    """The sandbox transformers renders chat templates in: ImmutableSandboxedEnvironment
    with trim_blocks and lstrip_blocks, the loopcontrols extension, a ``{% generation %}``
    block (rendered as its body), ``tojson`` without HTML escaping (ensure_ascii=False),
    and the globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict``."""
    global _ENVIRONMENT
    if _ENVIRONMENT is not None:
        return _ENVIRONMENT
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as exc:
        raise ImportError(f"apply_chat_template needs the 'jinja2' package: {LLM_EXTRA}") \
            from exc
    version = tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
    if version < (3, 1, 6):
        raise ImportError(f"apply_chat_template needs jinja2 >= 3.1.6 (older sandboxes can "
                          f"be escaped), got {jinja2.__version__}: {LLM_EXTRA}")

    class Generation(jinja2.ext.Extension):
        """``{% generation %}…{% endgeneration %}``: marks the assistant's text (for masks
        minitx does not compute); renders its body."""
        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body) \
                .set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=lambda *a, **k: dict(*a, **k))
    _ENVIRONMENT = (env, {})
    return _ENVIRONMENT


def _plain(value):
    """``value`` rebuilt from plain JSON-like types (what a sandboxed template may see); any
    other object becomes a placeholder string naming its type, as transformers does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):                 # subclasses lose their extra methods
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return f"<{type(value).__name__}>"


_REASONING = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat_template(template: str, messages, tools=None, documents=None,
                         add_generation_prompt: bool = False,
                         continue_final_message: bool = False, **variables) -> str:
    """Render one conversation with a Jinja chat template, as transformers does: message
    keys whose value is None dropped, a reasoning field copied under "reasoning_content" and
    "thinking", everything rebuilt from plain types; the template sees ``messages``,
    ``tools``, ``documents``, ``add_generation_prompt`` and ``variables``."""
    if not isinstance(template, str):
        raise TypeError(f"render_chat_template: template must be a str, got "
                        f"{type(template).__name__}")
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("apply_chat_template: conversation must be a non-empty list of "
                         f"{{'role': ..., 'content': ...}} dicts, got {messages!r:.80}")
    if continue_final_message and add_generation_prompt:
        raise ValueError("apply_chat_template: continue_final_message and "
                         "add_generation_prompt cannot both be set")
    chat = []
    for m in messages:
        if not isinstance(m, dict):
            raise TypeError(f"apply_chat_template: each message must be a dict, got "
                            f"{type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        chat.append(_plain(m))
    final = None
    if continue_final_message:
        final = chat[-1].get("content")
        if not isinstance(final, str):
            raise ValueError("apply_chat_template: continue_final_message needs a final "
                             "message with string content")
        if "content" not in template:
            raise ValueError("apply_chat_template: continue_final_message is set but the chat "
                             "template never reads a message's 'content'")
        chat[-1]["content"] = final + _CONTINUE_TAG
    env, cache = _jinja_environment()
    compiled = cache.get(template)
    if compiled is None:
        compiled = cache[template] = env.from_string(template)
    text = compiled.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                           add_generation_prompt=add_generation_prompt,
                           **_plain(variables))
    if continue_final_message:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ValueError("apply_chat_template: continue_final_message is set but the "
                             "template dropped part of the final message")
        at = text.rindex(tag)
        text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else \
            text[:at].rstrip()
    return text


# ---- one loader for every kind of path -----------------------------------------------------

def load_tokenizer(path) -> Tokenizer:
    """A Tokenizer from a folder (``Tokenizer.from_folder``), a ``tokenizer.json`` file (with
    the ``tokenizer_config.json`` beside it, if any) or a ``.gguf`` file (its metadata,
    read by ``minitx.pretrained.gguf.GGUFFile``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return Tokenizer.from_folder(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_tokenizer: {path} is neither a folder nor a file "
                                "(expected a folder, a tokenizer.json or a .gguf file)")
    if path.lower().endswith(".gguf"):
        with GGUFFile(path) as reader:
            return Tokenizer.from_gguf_metadata(reader.metadata)
    if path.lower().endswith(".json"):
        config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        return Tokenizer.from_file(path, config if os.path.isfile(config) else None)
    raise ValueError(f"load_tokenizer: {path} is not a tokenizer.json or a .gguf file")
