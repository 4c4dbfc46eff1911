"""Every Unicode code point through minitx's tokenizer front-ends and HuggingFace's
``tokenizers``: where, exactly, do they disagree? (Not a test: about a minute.)

    python benchmarks/tokenizer_unicode_scan.py

For each of the 1,112,064 code points c (surrogates excluded), the strings "a" + c + "b",
" " + c + "1" and c + c + " x" go through

- BERT's basic tokenizer (clean text, CJK spacing, accent stripping, lower-casing, then the
  whitespace/punctuation split): ``minitx.pretrained.wordpiece.basic_normalize`` +
  ``basic_split`` vs ``tokenizers``' BertNormalizer + BertPreTokenizer;
- GPT-2's pre-tokeniser: ``minitx.pretrained.bpe.pretokenize`` vs ``tokenizers``'
  ByteLevel pre-tokeniser (Oniguruma regex).

minitx decides character classes with Python's ``unicodedata``; ``tokenizers`` with the
tables of its Rust dependencies, which are of other Unicode versions (older for the
control/punctuation/mark tests, newer for lower-casing and the regex classes). So the code
points reported are those whose class differs between Unicode versions; the script prints
how many, their categories in Python's database, and which of them were already assigned
in Unicode 3.2 (``unicodedata.ucd_3_2_0``), i.e. changed category since.
"""
from __future__ import annotations

import sys
import unicodedata
from collections import Counter

from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer, ByteLevel

from minitx.pretrained.bpe import bytes_to_unicode, pretokenize
from minitx.pretrained.wordpiece import basic_normalize, basic_split


def scan():
    norm = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                          lowercase=True)
    split, byte_level = BertPreTokenizer(), ByteLevel(add_prefix_space=False)
    table = bytes_to_unicode()
    wordpiece, bpe = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        texts = ("a" + c + "b", " " + c + "1", c + c + " x")
        if any([w for w, _ in split.pre_tokenize_str(norm.normalize_str(t))] !=
               basic_split(basic_normalize(t)) for t in texts):
            wordpiece.append(cp)
        if any([w for w, _ in byte_level.pre_tokenize_str(t)] !=
               ["".join(table[b] for b in w.encode("utf-8")) for w in pretokenize(t)]
               for t in texts):
            bpe.append(cp)
    return wordpiece, bpe


def report(name, cps):
    old = [cp for cp in cps if unicodedata.ucd_3_2_0.category(chr(cp)) != "Cn"]
    cats = Counter(unicodedata.category(chr(cp)) for cp in cps)
    names = [f"U+{cp:04X} {unicodedata.name(chr(cp), '?')}" for cp in old]
    print(f"{name}: {len(cps)} of 1,112,064 code points differ; Python categories "
          f"{dict(cats.most_common())}; assigned in Unicode 3.2 already: {names}")


if __name__ == "__main__":
    print(f"Python {sys.version.split()[0]}, unicodedata {unicodedata.unidata_version}")
    wp, bp = scan()
    report("BERT basic tokenizer", wp)
    report("GPT-2 pre-tokeniser", bp)
