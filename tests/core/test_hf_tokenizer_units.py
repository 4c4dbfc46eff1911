"""``minitx.pretrained.hf_tokenizer`` piece by piece, on tiny hand-made ``tokenizer.json``s:
each pre-tokenizer's behaviour, the BPE model (merge order, byte fallback, unknown tokens,
affixes, ignore_merges), added tokens, post-processors, decoders, the stream decoder, GGUF
metadata, chat templates, and the error messages.

The expected values are literal. Each was produced by HuggingFace's ``tokenizers`` 0.23.3 on
the same JSON when the test was written (``tests/oracles/test_hf_tokenizer.py`` checks the
real files against the library itself); nothing here needs it.
"""
import json
import sys

import numpy as np
import pytest

from support import need

from minitx.pretrained import hf_tokenizer as hft
from minitx.pretrained.bpe import bytes_to_unicode
from minitx.pretrained.hf_tokenizer import (LLM_EXTRA, StreamDecoder, Tokenizer,
                                            gguf_tokenizer_spec, load_tokenizer,
                                            recover_merges)


def _added(i, content, special=True, **flags):
    return {"id": i, "content": content, "special": special, "normalized": False,
            "lstrip": False, "rstrip": False, "single_word": False, **flags}


def byte_level_spec():
    """GPT-2's layout over the 256 byte symbols and a dozen merges."""
    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    merges = [("h", "e"), ("l", "l"), ("ll", "o"), ("he", "llo"), ("Ġ", "w"), ("o", "r"),
              ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("a", "a"), ("aa", "a"), ("Ġ", "Ġ")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    added = [_added(n, "<|end|>"), _added(n + 1, "<tool>", False, lstrip=True, rstrip=True),
             _added(n + 2, "<|end|>x", False), _added(n + 3, "cat", False, single_word=True)]
    return {"added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "use_regex": True},
            "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}


def byte_fallback_spec(fuse_unk=True, byte_fallback=True, bytes_in_vocab=256):
    """SentencePiece's layout (Llama 2): "▁" prefixed, spaces as "▁", <0xXX> byte tokens."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(bytes_in_vocab):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in ["▁", "a", "b", "c", "é", "▁a", "ab", "▁ab", "abc", "▁abc", "bc"]:
        vocab[t] = len(vocab)
    merges = [["▁", "a"], ["a", "b"], ["▁a", "b"], ["▁ab", "c"], ["ab", "c"], ["b", "c"]]
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": "</s>", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                   "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    return {"added_tokens": [_added(0, "<unk>"), _added(1, "<s>"), _added(2, "</s>")],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": None, "post_processor": template,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": fuse_unk,
                      "byte_fallback": byte_fallback, "vocab": vocab, "merges": merges}}


def affix_spec(ignore_merges=False):
    """A continuing-subword prefix ("##") and an end-of-word suffix ("</w>")."""
    vocab = {"[UNK]": 0}
    for t in ["a", "b", "c", "##a", "##b", "##c", "a</w>", "b</w>", "c</w>", "##a</w>",
              "##b</w>", "##c</w>", "ab", "abc</w>", "ab##c</w>", "abc", "##bc</w>", "cab</w>"]:
        vocab[t] = len(vocab)
    return {"normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
            "model": {"type": "BPE", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "end_of_word_suffix": "</w>", "ignore_merges": ignore_merges,
                      "vocab": vocab, "merges": ["a ##b", "ab ##c</w>", "##b ##c</w>"]}}


def words(spec, text):
    """What a pre-tokenizer JSON makes of ``text``."""
    return [w for w, _ in hft._PreTokenizer(spec, "test").run([(text, True)])]


# ---- pre-tokenizers --------------------------------------------------------------------------

SPLITS = {   # Split on the literal "-" over "--a-b--c-", by behaviour and invert
    ("Removed", False): ["a", "b", "c"],
    ("Removed", True): ["-"] * 6,
    ("Isolated", False): ["-", "-", "a", "-", "b", "-", "-", "c", "-"],
    ("Isolated", True): ["-", "-", "a", "-", "b", "-", "-", "c", "-"],
    ("MergedWithPrevious", False): ["-", "-", "a-", "b-", "-", "c-"],
    ("MergedWithPrevious", True): ["-", "-a", "-b", "-", "-c", "-"],
    ("MergedWithNext", False): ["-", "-a", "-b", "-", "-c", "-"],
    ("MergedWithNext", True): ["-", "-", "a-", "b-", "-", "c-"],
    ("Contiguous", False): ["--", "a", "-", "b", "--", "c", "-"],
    ("Contiguous", True): ["--", "a", "-", "b", "--", "c", "-"],
}


@pytest.mark.parametrize("behavior,invert", sorted(SPLITS))
def test_split_behaviours_on_a_literal_pattern(behavior, invert):
    spec = {"type": "Split", "pattern": {"String": "-"}, "behavior": behavior,
            "invert": invert}
    assert words(spec, "--a-b--c-") == SPLITS[behavior, invert]


def test_split_on_a_regex_and_the_empty_text():
    need("regex")
    spec = {"type": "Split", "pattern": {"Regex": "-+| "}, "behavior": "MergedWithPrevious"}
    assert words(spec, "--a b--c  d-") == ["--", "a ", "b--", "c ", " ", "d-"]
    assert words(spec, "") == []


def test_byte_level_prefix_space_and_gpt2_pattern():
    need("regex")
    text = "Hello  world\n\n é"
    assert words({"type": "ByteLevel", "add_prefix_space": True}, text) == \
        ["ĠHello", "Ġ", "Ġworld", "ĊĊ", "ĠÃ©"]
    assert words({"type": "ByteLevel", "add_prefix_space": False}, text) == \
        ["Hello", "Ġ", "Ġworld", "ĊĊ", "ĠÃ©"]
    assert words({"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
                 "Hello  world") == ["HelloĠĠworld"]
    # the prefix space goes on every piece a previous step made
    seq = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"},
        {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]}
    assert words(seq, "a b") == ["Ġa", "Ġb"]


def test_metaspace_prepend_schemes_and_split():
    def meta(scheme, split):
        return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                "split": split}
    assert words(meta("first", True), "hello  world ▁x") == \
        ["▁hello", "▁", "▁world", "▁", "▁x"]
    assert words(meta("never", True), "hello  world") == ["hello", "▁", "▁world"]
    assert words(meta("always", False), "hello  world") == ["▁hello▁▁world"]
    # older files: add_prefix_space instead of prepend_scheme
    assert words({"type": "Metaspace", "add_prefix_space": False, "split": False}, "a b") == \
        ["a▁b"]


def test_metaspace_first_prepends_only_at_the_start_of_the_text():
    """After an added token the piece does not start the text: no "▁" (tokenizers'
    offsets_original().0 == 0 rule)."""
    vocab = {"<unk>": 0, "<s>": 1, "▁": 2, "h": 3, "i": 4, "▁h": 5, "▁hi": 6, "hi": 7}
    spec = {"added_tokens": [_added(1, "<s>")], "normalizer": {"type": "Lowercase"},
            "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "first"},
            "decoder": {"type": "Metaspace", "prepend_scheme": "first"},
            "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "vocab": vocab,
                      "merges": [["h", "i"], ["▁", "h"], ["▁h", "i"]]}}
    tok = Tokenizer(spec)
    assert tok.encode("hi") == [2, 7]
    assert tok.encode("<s>hi") == [1, 7]
    assert tok.encode("HI<s>hi hi") == [2, 7, 1, 7, 2, 7]
    assert tok.decode([2, 7, 1, 7, 2, 7]) == "hi<s>hi hi"


def test_digits_whitespace_punctuation_and_bert():
    need("regex")
    assert words({"type": "Digits", "individual_digits": True}, "a12٣٤²½x三") == \
        ["a", "1", "2", "٣", "٤", "²", "½", "x三"]
    assert words({"type": "Digits", "individual_digits": False}, "a12٣٤²½x三") == \
        ["a", "12٣٤²½", "x三"]
    assert words({"type": "Whitespace"}, "héllo, wörld!! 12_ab  x²") == \
        ["héllo", ",", "wörld", "!!", "12_ab", "x", "²"]
    assert words({"type": "WhitespaceSplit"}, "héllo, wörld!!\u3000 12_ab  x") == \
        ["héllo,", "wörld!!", "12_ab", "x"]
    assert words({"type": "Punctuation", "behavior": "Isolated"}, "a,b!¿c«d»") == \
        ["a", ",", "b", "!", "¿", "c", "«", "d", "»"]
    assert words({"type": "BertPreTokenizer"}, "Hello, world!! ok") == \
        ["Hello", ",", "world", "!", "!", "ok"]


def test_letters_newer_than_tokenizers_unicode_tables_split_as_it_does():
    """U+0558 (Armenian, assigned in Unicode 17.0) is no letter to tokenizers' Oniguruma
    (Unicode 16.0), so Qwen's pattern cuts before it; the regex package alone would not."""
    need("regex")
    qwen = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": hft._QWEN2_PATTERN}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    assert words(qwen, "abc\u0558def") == ["abc", "Õĺdef"]
    assert hft._masked("a\u0558\u0295b") == "a\ufdd0\u0138b"
    assert hft._masked("plain") == "plain"


# ---- the BPE model -------------------------------------------------------------------------

def test_byte_level_merges_added_tokens_and_decode():
    need("regex")
    tok = Tokenizer(byte_level_spec())
    assert tok.tokenize("hello world") == ["hello", "Ġworld"]
    # "aaaa": the leftmost of equal ranks first; "aaaaa": then (aa, a) outranks nothing left
    assert tok.tokenize("aaaa aaaaa") == ["aa", "aa", "Ġ", "aa", "aaa"]
    assert tok.tokenize("  hi   ") == ["Ġ", "Ġ", "h", "i", "ĠĠ", "Ġ"]
    # the longest added token at a position wins; special ones are dropped by skip
    ids = tok.encode("hello<|end|>world")
    assert tok.convert_ids_to_tokens(ids) == ["hello", "<|end|>", "w", "or", "ld"]
    assert tok.decode(ids) == "hello<|end|>world"
    assert tok.decode(ids, skip_special_tokens=True) == "helloworld"
    assert tok.convert_ids_to_tokens(tok.encode("<|end|>x<|end|>")) == ["<|end|>x", "<|end|>"]
    # lstrip / rstrip swallow the spaces beside "<tool>"; "cat" only as a whole word
    assert tok.tokenize("a  <tool>  b") == ["a", "<tool>", "b"]
    assert tok.tokenize("cat catalog cat.") == ["cat", "Ġ", "c", "a", "t", "a", "l", "o", "g",
                                                "Ġ", "cat", "."]
    ids = tok.encode("😀 naïve")
    assert tok.decode(ids) == "😀 naïve"
    assert tok.decode(ids[:2]) == "\ufffd"          # half an emoji: one U+FFFD


def test_the_heap_agrees_with_the_plain_rank_loop():
    """Random words over a random merge table: the heap gives what repeatedly merging the
    leftmost lowest-ranked adjacent pair gives (bpe.py's reference loop)."""
    from minitx.pretrained.bpe import bpe
    rng = np.random.default_rng(0)
    alphabet = list("abcde")
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    while len(merges) < 60:
        a, b = rng.choice(list(vocab)), rng.choice(list(vocab))
        if len(a + b) <= 6 and a + b not in vocab:
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    model = hft._BPE(vocab, merges)
    ranks = {m: r for r, m in enumerate(merges)}
    inverse = {i: t for t, i in vocab.items()}
    for _ in range(300):
        word = "".join(rng.choice(alphabet, size=rng.integers(1, 25)))
        assert [inverse[i] for i in model.tokenize(word)] == bpe(list(word), ranks), word


def test_byte_fallback_unknown_tokens_and_fusing():
    tok = Tokenizer(byte_fallback_spec())
    assert tok.encode("abc") == [1, 268]
    assert tok.convert_ids_to_tokens(tok.encode("a b c")) == ["<s>", "▁a", "▁", "b", "▁", "c"]
    assert tok.convert_ids_to_tokens(tok.encode("xyz ab")) == \
        ["<s>", "▁", "<0x78>", "<0x79>", "<0x7A>", "▁ab"]
    assert tok.convert_ids_to_tokens(tok.encode("é€")) == \
        ["<s>", "▁", "é", "<0xE2>", "<0x82>", "<0xAC>"]
    ids = tok.encode("a😀b")
    assert ids == [1, 264, 243, 162, 155, 131, 261]
    assert tok.decode(ids) == "<s> a😀b" and tok.decode(ids, True) == "a😀b"
    assert tok.encode("") == [1] and tok.encode("", add_special_tokens=False) == []
    assert tok.encode("<s>ab</s>") == [1, 1, 266, 2]
    assert tok.encode("ab", "c") == [1, 266, 2, 259, 262]          # the pair template
    no_fuse = Tokenizer(byte_fallback_spec(fuse_unk=False, byte_fallback=False))
    assert no_fuse.encode("xyz ab") == [1, 259, 0, 0, 0, 266]
    fuse = Tokenizer(byte_fallback_spec(fuse_unk=True, byte_fallback=False))
    assert fuse.encode("aéx😀b") == [1, 264, 263, 0, 261]
    # a character whose bytes are not all tokens is unknown; the next character's byte
    # tokens come before that pending unknown token, as in tokenizers
    partial = Tokenizer(byte_fallback_spec(bytes_in_vocab=0x80))
    assert partial.convert_ids_to_tokens(partial.encode("x€y")) == \
        ["<s>", "▁", "<0x78>", "<0x79>", "<unk>"]


def test_affixes_and_ignore_merges():
    need("regex")
    tok = Tokenizer(affix_spec())
    assert tok.tokenize("abc ab cab ABC") == ["abc</w>", "a", "##b</w>", "c", "##a",
                                              "##b</w>", "abc</w>"]
    assert tok.tokenize("x a") == ["[UNK]", "a</w>"]
    assert tok.decode(tok.encode("cba")) == "c##b##a"
    whole = Tokenizer(affix_spec(ignore_merges=True))
    assert whole.tokenize("abc ab cab") == ["abc", "ab", "c", "##a", "##b</w>"]


def test_normalized_added_tokens_match_the_normalised_text():
    """A ``normalized: true`` token is matched by its normalised content in the normalised
    text, and ``tokenizers`` spells it normalised when decoding."""
    vocab = {"<unk>": 0, "a": 1, "▁": 2}
    spec = {"added_tokens": [{**_added(3, "Big Token", False), "normalized": True},
                             {**_added(4, "ﬁX", True), "normalized": True}],
            "normalizer": {"type": "Lowercase"},
            "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "vocab": vocab,
                      "merges": []}}
    tok = Tokenizer(spec)
    assert tok.encode("a Big Token a ﬁX") == [1, 0, 3, 0, 1, 0, 4]
    assert tok.encode("big token fix") == [3, 0]
    assert tok.decode([3, 4, 1]) == "big token ﬁx a"
    assert tok.decode([3, 4, 1], skip_special_tokens=True) == "big token ﬁx a"
    assert tok.convert_tokens_to_ids(tok.tokenize("a big TOKEN")) == tok.encode("a big TOKEN")


# ---- post-processors and decoders -------------------------------------------------------------

def test_bert_and_roberta_post_processors():
    vocab = {"[CLS]": 0, "[SEP]": 1, "a": 2, "b": 3}
    base = {"model": {"type": "BPE", "vocab": vocab, "merges": []}}
    bert = Tokenizer({**base, "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 1],
                                                 "cls": ["[CLS]", 0]}})
    assert bert.encode("a", "b") == [0, 2, 1, 3, 1]
    assert bert.build_inputs([2], [3])[1] == [0, 0, 0, 1, 1]
    assert bert.encode("ab", add_special_tokens=False) == [2, 3]
    roberta = Tokenizer({**base, "post_processor": {"type": "RobertaProcessing",
                                                    "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]}})
    assert roberta.encode("a", "b") == [0, 2, 1, 1, 3, 1]
    seq = Tokenizer({**base, "post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel"}, {"type": "BertProcessing", "sep": ["[SEP]", 1],
                                "cls": ["[CLS]", 0]}]}})
    assert seq.encode("a") == [0, 2, 1] and seq.num_special_tokens(pair=True) == 3


def test_config_add_bos_and_eos_where_the_post_processor_adds_none():
    vocab = {"<s>": 0, "</s>": 1, "a": 2}
    spec = {"model": {"type": "BPE", "vocab": vocab, "merges": []}}
    tok = Tokenizer(spec, {"bos_token": "<s>", "eos_token": {"content": "</s>"},
                           "add_bos_token": True, "add_eos_token": True})
    assert tok.encode("a") == [0, 2, 1] and tok.encode("a", add_special_tokens=False) == [2]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 1)


DECODERS = [   # (decoder JSON, tokens, tokenizers' text)
    ({"type": "ByteFallback"},
     ["<0xE4>", "<0xBD>", "a", "<0xE4>", "<0xBD>", "<0xA0>", "<0xff>", "<0x4>", "<0xZZ>"],
     "\ufffd\ufffda" + "\ufffd" * 4 + "<0x4><0xZZ>"),       # E4 BD A0 FF: invalid, 4 bytes
    ({"type": "ByteLevel"}, ["Ġh", "ä½", "ł", "Ġ", "<tag>", "你", "ä"], " h你 <tag>你\ufffd"),
    ({"type": "Metaspace", "prepend_scheme": "always"}, ["▁a▁b", "▁c", "▁▁d"], "ab c  d"),
    ({"type": "Metaspace", "prepend_scheme": "never"}, ["▁a▁b", "▁c"], " a b c"),
    ({"type": "Strip", "content": " ", "start": 1, "stop": 2}, ["  a  ", "b   ", "c"], " ab c"),
    ({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
     ["▁I", "▁<0xE2>", "<0x82>", "<0xAC>", "▁x"], "I <0xE2>\ufffd\ufffd x"),
    ({"type": "BPEDecoder", "suffix": "</w>"}, ["ab</w>", "c", "d</w>"], "ab cd"),
]


@pytest.mark.parametrize("spec,tokens,text", DECODERS, ids=lambda v: str(v)[:30])
def test_decoders(spec, tokens, text):
    assert "".join(hft._build_decoder(spec, "test")(tokens)) == text


def test_replace_decoder_with_a_regex():
    need("regex")
    spec = {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "_"}
    assert "".join(hft._build_decoder(spec, "test")(["a  b", "\t"])) == "a_b_"


def test_decode_skips_ids_outside_the_vocabulary_and_takes_arrays():
    tok = Tokenizer(byte_fallback_spec())
    assert tok.decode(np.array([[266, 10 ** 6]])) == "ab"
    assert tok.batch_decode(np.array([[266, 2], [259, 259]]), skip_special_tokens=True) == \
        ["ab", " "]


# ---- the stream decoder --------------------------------------------------------------------

def _stream(tok, ids, skip=False):
    dec = StreamDecoder(tok, skip)
    pieces = [dec.push(i) for i in ids]
    return pieces, dec.flush()


def test_stream_decoder_holds_multibyte_characters_until_complete():
    need("regex")
    tok = Tokenizer(byte_level_spec())
    ids = tok.encode("你好🤗 hello")                      # one token per byte, but "hello"
    pieces, rest = _stream(tok, ids)
    assert pieces[:7] == ["", "", "你", "", "", "好", ""]
    assert "".join(pieces) + rest == tok.decode(ids) == "你好🤗 hello"
    assert pieces[9:11] == ["🤗", " "] and rest == ""
    pieces, rest = _stream(tok, ids[:5])                 # stopped mid-character
    assert "".join(pieces) == "你" and rest == "\ufffd"


def test_stream_decoder_with_byte_fallback_and_a_stripped_first_space():
    tok = Tokenizer(byte_fallback_spec())
    for text in ["a😀b é€ abc", "\x85\x85 ab", "xyz"]:
        ids = tok.encode(text)
        for skip in (False, True):
            pieces, rest = _stream(tok, ids, skip)
            assert "".join(pieces) + rest == tok.decode(ids, skip), text
    pieces, _ = _stream(tok, tok.encode("a😀b"), skip=True)
    assert pieces == ["", "a", "", "", "", "😀", "b"]
    with pytest.raises(TypeError, match="token_id must be an int, got str"):
        StreamDecoder(tok).push("7")


# ---- batching (PretrainedTokenizer's __call__) -------------------------------------------------

def test_call_pads_a_batch_like_the_other_minitx_tokenizers():
    tok = Tokenizer(byte_fallback_spec(), {"pad_token": "</s>", "padding_side": "left"})
    batch = tok(["abc", "a b c"])
    assert batch["input_ids"].tolist() == [[2, 2, 2, 2, 1, 268],
                                           [1, 264, 259, 261, 259, 262]]
    assert batch["attention_mask"].tolist() == [[0, 0, 0, 0, 1, 1], [1] * 6]
    assert tok(["abc"], add_special_tokens=False)["input_ids"].tolist() == [[268]]


# ---- GGUF metadata ---------------------------------------------------------------------------

def _gpt2_metadata(pre="smollm"):
    symbols = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<think>"] + symbols + ["Ġ1", "he", "Ù£"]
    types = [3, 3, 4] + [1] * (len(tokens) - 3)
    return {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["Ġ 1", "h e"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.chat_template": "{{ bos_token }}"}


def test_gguf_byte_level_pre_tokenizers_by_name():
    need("regex")
    need("jinja2")
    smol = Tokenizer.from_gguf_metadata(_gpt2_metadata("smollm"))   # one digit at a time
    gpt2 = Tokenizer.from_gguf_metadata(_gpt2_metadata("gpt-2"))
    assert smol.tokenize("he 1") == ["he", "Ġ", "1"] and gpt2.tokenize("he 1") == ["he", "Ġ1"]
    x = 3 + list(bytes_to_unicode().values()).index("x")
    assert smol.encode("x") == [1, x]                               # add_bos_token
    assert smol.tokenize("<|im_start|><think>") == ["<|im_start|>", "<think>"]
    assert smol.decode(smol.encode("<think>he"), skip_special_tokens=True) == "<think>he"
    assert smol.special_tokens == ("<|endoftext|>", "<|im_start|>")
    assert (smol.bos_token, smol.eos_token) == ("<|im_start|>", "<|endoftext|>")
    assert smol.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == \
        "<|im_start|>"
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'nonesuch' is not one minitx "
                                         "knows; known: .*smollm"):
        Tokenizer.from_gguf_metadata(_gpt2_metadata("nonesuch"))


def test_recovered_merges_order_by_score_then_part_lengths():
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    scores = {"a": 0.0, "b": 0.0, "c": 0.0, "ab": -1.0, "bc": -2.0, "abc": -1.0}
    # abc scores with ab; among equal scores the longer left part first
    assert recover_merges(vocab, scores) == [("ab", "c"), ("a", "bc"), ("a", "b"),
                                             ("b", "c")]


def _sentencepiece_metadata(arch):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["▁", "a", "b", "▁a", "ab", "▁ab", "  ", "▁▁"]
    types = [2, 3, 3] + [6] * 256 + [1] * 8
    return {"general.architecture": arch, "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": [0.0] * 259 + [-1, -2, -3, -4, -5, -6, -7, -8],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_gguf_sentencepiece_llama_and_gemma():
    llama = Tokenizer.from_gguf_metadata(_sentencepiece_metadata("llama"))
    assert llama.tokenize("ab ab") == ["▁ab", "▁ab"]              # Metaspace, a "▁" first
    assert llama.encode("a")[0] == 1                             # add_bos_token by default
    assert llama.decode(llama.encode("ab ab€")) == "<s> ab ab€"
    assert llama.decode(llama.encode("ab ab€"), skip_special_tokens=True) == "ab ab€"
    gemma = Tokenizer.from_gguf_metadata(_sentencepiece_metadata("gemma3"))
    spec, _ = gguf_tokenizer_spec(_sentencepiece_metadata("gemma3"))
    assert "  " not in spec["model"]["vocab"]                     # respelled "▁▁" (id 266)
    assert gemma.tokenize("ab ab") == ["ab", "▁ab"]              # no prefix space
    assert gemma.decode(gemma.encode("a  b")) == "<s>a  b"


# ---- chat templates ------------------------------------------------------------------------

def _chat_tokenizer(template):
    spec = byte_fallback_spec()
    return Tokenizer(spec, {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template})


def test_chat_template_environment():
    need("jinja2")
    # trim_blocks: the newline right after a block tag is dropped
    template = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}"
                "{% if not loop.last %}\n\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '\\n' }}assistant:{% endif %}")
    tok = _chat_tokenizer(template)
    chat = [{"role": "user", "content": " ab "}, {"role": "assistant", "content": "c",
                                                 "tool_calls": None}]
    assert tok.apply_chat_template(chat, tokenize=False) == "<s>user: ab\nassistant: c"
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text.endswith("\nassistant:")
    assert tok.apply_chat_template(chat) == tok.encode(
        tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
    assert tok.apply_chat_template([chat, chat[:1]], tokenize=False)[1] == "<s>user: ab"
    # tojson keeps non-ASCII, raise_exception raises, strftime_now and extra variables work
    tok = _chat_tokenizer("{{ messages | tojson }}|{{ strftime_now('%Y') | length }}|{{ x }}")
    assert tok.apply_chat_template([{"role": "u", "content": "é<"}], tokenize=False, x=7) == \
        '[{"role": "u", "content": "é<"}]|4|7'
    import jinja2
    tok = _chat_tokenizer("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}])
    tok = _chat_tokenizer("{% generation %}{{ messages[0].content }}{% endgeneration %}")
    assert tok.apply_chat_template([{"role": "user", "content": "a"}], tokenize=False) == "a"


def test_continue_final_message_and_the_sandbox():
    jinja2 = need("jinja2")
    tok = _chat_tokenizer("{% for m in messages %}[{{ m.content }}]\n{% endfor %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "partial"}]
    assert tok.apply_chat_template(chat, tokenize=False, continue_final_message=True) == \
        "[a]\n[partial"
    tok = _chat_tokenizer("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template(chat)


def test_chat_template_errors():
    tok = Tokenizer(byte_fallback_spec())
    with pytest.raises(ValueError, match="this tokenizer has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "a"}])
    tok = _chat_tokenizer([{"name": "rag", "template": "x"}])
    with pytest.raises(ValueError, match=r"chat templates \['rag'\] and none is 'default'"):
        tok.apply_chat_template([{"role": "user", "content": "a"}])
    with pytest.raises(ValueError, match="conversation must be a non-empty list"):
        _chat_tokenizer("x").apply_chat_template([])


# ---- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("part,value,message", [
    ("normalizer", {"type": "Precompiled"}, "normalizer 'Precompiled': not supported"),
    ("pre_tokenizer", {"type": "UnicodeScripts"}, "pre_tokenizer 'UnicodeScripts': not supp"),
    ("post_processor", {"type": "Magic"}, "post_processor 'Magic': not supported"),
    ("decoder", {"type": "CTC"}, "decoder 'CTC': not supported"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"String": "x"}, "behavior": "Eaten"},
     "behavior must be one of Removed, Isolated"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Glob": "x"}},
     "pattern must be {'String': ...} or {'Regex': ...}"),
])
def test_unknown_parts_are_refused_by_name(part, value, message):
    spec = byte_fallback_spec()
    spec[part] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Tokenizer(spec, source="x/tokenizer.json")


def test_model_errors():
    spec = byte_fallback_spec()
    with pytest.raises(ValueError, match="model type 'Unigram' is not supported.*"
                                         "WordPieceTokenizer"):
        Tokenizer({**spec, "model": {"type": "Unigram", "vocab": []}})
    with pytest.raises(ValueError, match="dropout=0.1 is random"):
        Tokenizer({**spec, "model": {**spec["model"], "dropout": 0.1}})
    with pytest.raises(ValueError, match="merge 'a' \\+ 'zz' names 'zz', which is not in the "
                                         "vocabulary"):
        Tokenizer({**spec, "model": {**spec["model"], "merges": [["a", "zz"]]}})
    with pytest.raises(TypeError, match="text must be a str, got int"):
        Tokenizer(spec).encode(3)
    with pytest.raises(TypeError, match="text_pair must be a str, got bool"):
        Tokenizer(spec).encode("a", False)
    with pytest.raises(ValueError, match="pad_token '<pad>' is not in the vocabulary"):
        Tokenizer(spec, {"pad_token": "<pad>"})
    with pytest.raises(KeyError, match="id 999 is not in the vocabulary"):
        Tokenizer(spec).convert_ids_to_tokens([999])


def test_files_and_folders(tmp_path):
    need("jinja2")
    with pytest.raises(FileNotFoundError, match="no tokenizer file; expected tokenizer.json, "
                                                "or vocab.json \\+ merges.txt"):
        Tokenizer.from_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="expected a tokenizer.json"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match="neither a folder nor a file"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "tokenizer.json").write_text(json.dumps(byte_fallback_spec()), "utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "chat_template": "ignored", "model_max_length": 1e30}), "utf-8")
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}!", "utf-8")
    for tok in (load_tokenizer(tmp_path), load_tokenizer(tmp_path / "tokenizer.json")):
        assert tok.encode("abc") == [1, 268] and tok.bos_token == "<s>"
    tok = load_tokenizer(tmp_path)
    assert tok.apply_chat_template([{"role": "u", "content": "x"}], tokenize=False) == "<s>!"
    assert tok.model_max_length == 1 << 31
    (tmp_path / "bad.json").write_text("{", "utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        Tokenizer.from_file(tmp_path / "bad.json")


def test_gpt2_vocab_and_merges_files(tmp_path):
    need("regex")
    spec = byte_level_spec()
    (tmp_path / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]), "utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(spec["model"]["merges"])
                                         + "\n", "utf-8")
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.tokenize("hello world") == ["hello", "Ġworld"]


def test_missing_optional_packages_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "regex", None)       # "import regex" now fails
    spec = byte_level_spec()
    with pytest.raises(ImportError, match=r"need the 'regex' package: python -m pip install "
                                          r'"\.\[llm\]"'):
        Tokenizer(spec)
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setattr(hft, "_ENVIRONMENT", None)
    with pytest.raises(ImportError, match="needs the 'jinja2' package: " + LLM_EXTRA.replace(
            ".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        _chat_tokenizer("x").apply_chat_template([{"role": "user", "content": "a"}])


def test_gguf_metadata_errors():
    with pytest.raises(ValueError, match="tokenizer.ggml.model must be 'gpt2' .* or 'llama' "
                                         ".*, got 't5'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "t5",
                                      "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TypeError, match="metadata must be a dict, got list"):
        Tokenizer.from_gguf_metadata([])
    md = _sentencepiece_metadata("llama")
    md["tokenizer.ggml.bos_token_id"] = 10 ** 6
    with pytest.raises(ValueError, match="bos_token_id=1000000 is outside the vocabulary"):
        Tokenizer.from_gguf_metadata(md)
