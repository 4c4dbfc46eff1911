"""How fast minitx's ``tokenizer.json`` reader (``minitx.pretrained.hf_tokenizer``) encodes,
next to HuggingFace's ``tokenizers`` (Rust) on the same text, in one run.

    python benchmarks/tokenizer_speed.py            # Qwen3 and Llama 3, 1 MB of mixed text
    python benchmarks/tokenizer_speed.py --mb 0.25

The text (deterministic for a checkout and a Python version): a third prose (this repository's
Markdown files), a third code (Python standard-library modules), a third seeded words in eight
scripts and digits — many distinct words, so the per-word cache does not do all the work. It
is cut into documents of about 4 KB. Measured for each tokenizer file:

- minitx, a freshly loaded tokenizer encoding every document (cold: every new word merged),
  then the same documents again (warm: words from the cache);
- ``tokenizers`` single-threaded (``RAYON_NUM_THREADS=1``, ``TOKENIZERS_PARALLELISM=false``,
  set before it is imported) and with its default thread pool, each in its own subprocess
  (the variables are read once, when the library starts), both with ``encode_batch`` on
  the same documents, cold.

Prints seconds, MB/s and the ratios, the load average before and after, and checks that both
give the same ids. Not a test: timings depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import sysconfig
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCRIPTS = {   # syllables to build words from, per script
    "latin": "ba be bi bo bu ca ce ci co da de di do fa fe la le li lo ma me mi mo na ne ni "
             "no pa pe ra re ri ro sa se si so ta te ti to va ve é è à ç ñ ü ö".split(),
    "cyrillic": "ба бе би бо ва ве ви да де ди ка ке ки ла ле ли ма ме ми на не ни ра ре ри "
                "са се си та те ти ё ж щ ы".split(),
    "greek": "κα κε κι λα λε λι μα με μι να νε νι πα πε πι τα τε τι ω ή ό".split(),
    "arabic": "با بي تا تي سا سي كا كي لا لي ما مي نا ني را ري".split(),
    "devanagari": "क का कि की ग गा त ता ति न ना नि म मा मि र रा रि स सा सि ्".split(),
    "cjk": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会"),
    "thai": "กา กิ ขา คา งา จา ชา ดา ตา นา บา ปา มา ยา รา ลา วา สา หา อา".split(),
    "hangul": list("가나다라마바사아자차카타파하고노도로모보소오조초코토포호"),
}


def mixed_text(megabytes: float) -> str:
    """About ``megabytes`` MB (UTF-8) of prose, code and many-script words, interleaved."""
    third = int(megabytes * 1_000_000 / 3)
    prose = "".join(p.read_text(encoding="utf-8", errors="replace")
                    for p in sorted(REPO.rglob("*.md")) if ".venv" not in p.parts)
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    code = "".join(p.read_text(encoding="utf-8", errors="replace")
                   for sub in ("json", "email", "asyncio", "http", "logging", "unittest")
                   for p in sorted((stdlib / sub).glob("*.py")))
    g = random.Random(0)
    words, size = [], 0
    while size < third:
        script = g.choice(list(SCRIPTS))
        word = "".join(g.choice(SCRIPTS[script]) for _ in range(g.randint(1, 4)))
        if g.random() < 0.1:
            word = str(g.randint(0, 10 ** g.randint(1, 9)))
        word += g.choice([" ", " ", " ", ", ", ". ", "\n"])
        words.append(word)
        size += len(word.encode("utf-8"))
    parts = [_cut_bytes(prose, third), _cut_bytes(code, third), "".join(words)]
    # interleave in 4 KB slices so that every document mixes kinds
    slices = [[p[i:i + 4000] for i in range(0, len(p), 4000)] for p in parts]
    out = []
    for k in range(max(len(s) for s in slices)):
        out += [s[k] for s in slices if k < len(s)]
    return "".join(out)


def _cut_bytes(text: str, n: int) -> str:
    while len(text.encode("utf-8")) < n and text:
        text += text
    return text.encode("utf-8")[:n].decode("utf-8", errors="ignore")


def documents(text: str, size: int = 4000) -> list:
    return [text[i:i + size] for i in range(0, len(text), size)]


_HF = """
import json, sys, time
import tokenizers
docs = json.load(open(sys.argv[2], encoding="utf-8"))
tok = tokenizers.Tokenizer.from_file(sys.argv[1])
t = time.perf_counter()
out = tok.encode_batch(docs, add_special_tokens=False)
seconds = time.perf_counter() - t
json.dump({"seconds": seconds, "ids": [e.ids for e in out]}, open(sys.argv[3], "w"))
"""


def hf_encode(path: str, docs_file: str, single_thread: bool) -> tuple:
    """(seconds, ids) of ``tokenizers`` encoding the documents, in a subprocess."""
    env = dict(os.environ)
    if single_thread:
        env.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    else:
        env.pop("RAYON_NUM_THREADS", None)
        env.pop("TOKENIZERS_PARALLELISM", None)
    out_file = docs_file + (".one.json" if single_thread else ".default.json")
    subprocess.run([sys.executable, "-c", _HF, path, docs_file, out_file], env=env,
                   check=True)
    with open(out_file, encoding="utf-8") as fh:
        result = json.load(fh)
    return result["seconds"], result["ids"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=1.0, help="megabytes of text (default 1)")
    parser.add_argument("--names", nargs="*", default=["qwen3", "llama3"],
                        help="tokenizer files of minitx.pretrained.real (default qwen3 llama3)")
    args = parser.parse_args(argv)
    from minitx.pretrained import real
    from minitx.pretrained.hf_tokenizer import Tokenizer

    text = mixed_text(args.mb)
    docs = documents(text)
    megabytes = len(text.encode("utf-8")) / 1e6
    print(f"text: {megabytes:.2f} MB in {len(docs)} documents; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    docs_file = str(pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "minitx_tok_docs.json")
    with open(docs_file, "w", encoding="utf-8") as fh:
        json.dump(docs, fh)
    rows = []
    for name in args.names:
        folder = real.tokenizer_folder(name)
        if folder is None:
            print(f"{name}: no tokenizer file; fetch it with `{real.FETCH_COMMAND}`")
            continue
        path = str(folder / "tokenizer.json")
        t = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load = time.perf_counter() - t
        t = time.perf_counter()
        ids = [tok.encode(d, add_special_tokens=False) for d in docs]
        cold = time.perf_counter() - t
        t = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        warm = time.perf_counter() - t
        one, hf_ids = hf_encode(path, docs_file, single_thread=True)
        default, _ = hf_encode(path, docs_file, single_thread=False)
        same = ids == hf_ids
        rows.append((name, load, cold, warm, one, default, same, sum(map(len, ids))))
    print(f"\n{'file':8} {'minitx load':>11} {'minitx cold':>11} {'warm':>7} "
          f"{'tokenizers 1 thread':>19} {'default':>8} {'cold/1 thread':>13} "
          f"{'cold/default':>12}  same ids")
    for name, load, cold, warm, one, default, same, n in rows:
        print(f"{name:8} {load:10.2f}s {cold:10.2f}s {warm:6.2f}s {one:18.3f}s {default:7.3f}s "
              f"{cold / one:12.1f}x {cold / default:11.1f}x  {same} ({n} tokens)")
    for name, load, cold, warm, one, default, same, n in rows:
        print(f"{name}: minitx {megabytes / cold:.2f} MB/s cold, {megabytes / warm:.2f} MB/s "
              f"warm; tokenizers {megabytes / one:.1f} MB/s on one thread, "
              f"{megabytes / default:.1f} MB/s by default")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    os.remove(docs_file)
    return rows


if __name__ == "__main__":
    main()
