"""Saying what the build is doing: each stage with its count and the elapsed time.

A build spends most of its time in two places a reader cannot see — the proofs and the
notebooks — so it says, stage by stage, how far it is: ``proofs``, then ``notebooks 2/5``,
then ``pages 40/130``, each with the seconds since the build began. With ``tqdm`` installed
(the ``[viz]`` extra) and the output going to a terminal, each counted stage is a progress bar;
otherwise it is plain lines through ``log`` (every item of a slow stage, every
``every``-th item of a fast one, and the last).
"""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


def _tqdm():
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional, the [viz] extra
    except ImportError:
        return None
    return tqdm


class Progress:
    """``with progress.stage("pages", total) as tick: … tick(label)``; ``progress.say(text)``.

    ``log``: where plain lines go (None: nowhere); ``bars``: tqdm bars on stderr (None: when
    tqdm is installed, ``log`` is ``print`` and stderr is a terminal).
    """

    def __init__(self, log=print, bars=None):
        self.log = log or (lambda *_: None)
        self.start = time.perf_counter()
        tqdm = _tqdm()
        if bars is None:
            bars = tqdm is not None and log is print and sys.stderr.isatty()
        self.tqdm = tqdm if bars and tqdm is not None else None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def say(self, text: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {text}"
        if self.tqdm is not None:
            self.tqdm.write(line, file=sys.stderr)
        else:
            self.log(line)

    def stage(self, name: str, total: int, every: int = 1):
        return _Stage(self, name, total, every)


class _Stage:
    def __init__(self, progress, name, total, every):
        self.p, self.name, self.total, self.every = progress, name, total, max(1, every)
        self.done, self.bar = 0, None

    def __enter__(self):
        if self.p.tqdm is not None and self.total:
            self.bar = self.p.tqdm(total=self.total, desc=self.name, unit="",
                                   file=sys.stderr, leave=True, dynamic_ncols=True)
        return self.tick

    def tick(self, label: str = "") -> None:
        """One item done (``label``: what it was)."""
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label[-40:], refresh=False)
            self.bar.update(1)
        elif self.done % self.every == 0 or self.done == self.total:
            self.p.say(f"{self.name} {self.done}/{self.total}" + (f": {label}" if label else ""))

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
