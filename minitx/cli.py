"""Command-line entry: ``python -m minitx [tour|bench|train|patterns|doctor]``."""
from __future__ import annotations

import argparse

import minitx


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minitx", description=__doc__)
    parser.add_argument("command", nargs="?", default="tour",
                        choices=["tour", "doctor"])
    args = parser.parse_args(argv)
    print(f"minitx {minitx.__version__} — backend: {minitx.get_backend()}")
    return 0
