"""A character corpus present on every machine: Python's own standard-library sources."""
from __future__ import annotations

import os

__all__ = ["stdlib_corpus", "stdlib_dir"]


def stdlib_dir() -> str:
    """The folder holding the standard library's .py files (where ``os.py`` lives)."""
    return os.path.dirname(os.__file__)


def stdlib_corpus(max_chars: int = 200_000, files=None) -> str:
    """Concatenated standard-library sources, printable ASCII and newlines only, tabs → spaces.

    ``files`` (names inside ``stdlib_dir()``) picks the modules; by default a fixed list of
    plain, common modules is read in order, then the rest alphabetically, until
    ``max_chars`` characters are collected — so the text is the same on every run.
    """
    root = stdlib_dir()
    preferred = ["textwrap.py", "string.py", "bisect.py", "heapq.py", "fnmatch.py",
                 "colorsys.py", "shlex.py", "glob.py", "copy.py", "queue.py", "sched.py",
                 "random.py", "statistics.py", "fractions.py", "calendar.py"]
    if files is None:
        rest = sorted(f for f in os.listdir(root) if f.endswith(".py") and f not in preferred)
        files = [f for f in preferred if os.path.exists(os.path.join(root, f))] + rest
    parts, total = [], 0
    for name in files:
        try:
            with open(os.path.join(root, name), encoding="utf-8", errors="ignore") as fh:
                text = fh.read()
        except OSError:
            continue
        text = "".join(c for c in text.replace("\t", "    ")
                       if c == "\n" or 32 <= ord(c) < 127)
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if not parts:
        raise FileNotFoundError(f"no Python sources found under {root!r}")
    return "".join(parts)[:max_chars]
