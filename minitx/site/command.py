"""``python -m minitx site --out DIR [--seed N] [--quick] [--notebooks run|reuse|skip]
[--cell-timeout SECONDS]``: the command-line hook.

The site's tools are the ``[docs]`` extra. This module imports none of them, so ``minitx.cli``
can offer the command on a bare install: ``run`` first checks the extra is there (else it says
``pip install ".[docs]"`` and returns 2), then loads the builder.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

__all__ = ["DOCS_EXTRA", "BUILD_TIMES", "missing_tools", "add_parser", "run"]

# import name -> the package that provides it (the [docs] extra in setup.cfg)
DOCS_EXTRA = {"markdown_it": "markdown-it-py", "mdit_py_plugins": "mdit-py-plugins",
              "pygments": "pygments", "latex2mathml": "latex2mathml"}
NOTEBOOK_TOOLS = {"jupytext": "jupytext", "nbclient": "nbclient", "nbformat": "nbformat"}


def missing_tools(names=DOCS_EXTRA) -> list:
    """The packages of ``names`` that are not installed."""
    return [pkg for mod, pkg in names.items() if importlib.util.find_spec(mod) is None]


# What --help says a build costs, measured on an idle 2-core x86-64 machine (NumPy's BLAS).
BUILD_TIMES = ("How long: on an idle 2-core machine a quick build (--quick) takes about 40 s, "
               "a full build about 100 s; most of it is the proofs and executing the "
               "notebooks. A busy machine can take many times as long: --notebooks skip builds "
               "without executing them, --cache DIR keeps executions for --notebooks reuse, "
               "and --cell-timeout raises the limit of one cell.")


def add_parser(sub):
    p = sub.add_parser("site", help="build the reading site (notes beside code, live proofs, "
                                    "executed notebooks) into a folder; needs the [docs] extra",
                       description="Build the reading site: the course (one page per source "
                                   "file, notes beside code), live proofs and the executed "
                                   "notebooks, into a folder of static pages. The build "
                                   "computes on NumPy whatever MINITX_BACKEND says, and shows "
                                   "its progress (tqdm bars where tqdm is installed).",
                       epilog=BUILD_TIMES)
    p.add_argument("--out", default="minitx_out/site",
                   help="output folder (default minitx_out/site); open its index.html")
    p.add_argument("--seed", type=int, default=0, help="seed of the proofs and notebooks")
    p.add_argument("--quick", action="store_true",
                   help="small proof sizes and quick notebooks (times: see below)")
    p.add_argument("--cache", default=None,
                   help="folder to keep executed notebooks in between builds")
    p.add_argument("--notebooks", choices=("run", "reuse", "skip"), default="run",
                   help="run: execute each notebook (reading it back from --cache when it was "
                        "executed there before, same source, setting and seed); reuse: only "
                        "read earlier executions back from --cache, executing nothing; skip: "
                        "execute none. A notebook not executed keeps its page, its code shown "
                        "without outputs under a note saying why (default run)")
    p.add_argument("--cell-timeout", type=_seconds, default=600, metavar="SECONDS",
                   help="the most seconds one notebook cell may run before the build stops "
                        "(default 600; raise it on a slow or busy machine)")
    return p


def _seconds(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1, got {text!r}")
    return value


def run(args) -> int:
    missing = missing_tools()
    if missing:
        print(f"error: the site needs the docs extra ({', '.join(missing)} missing): "
              'pip install ".[docs]"', file=sys.stderr)
        return 2
    with_notebooks = not missing_tools(NOTEBOOK_TOOLS)
    if not with_notebooks:
        print("note: jupytext/nbclient/nbformat missing, building without notebooks "
              '(pip install ".[docs]")')
    if args.notebooks == "reuse" and args.cache is None:
        print("error: --notebooks reuse reads earlier executions from --cache DIR: give the "
              "folder a build with --cache kept them in", file=sys.stderr)
        return 2
    build = importlib.import_module(".build", __package__)   # the extra is there: load it
    try:
        build.build_site(args.out, seed=args.seed, quick=args.quick, cache_dir=args.cache,
                         notebooks=with_notebooks, notebook_mode=args.notebooks,
                         cell_timeout=args.cell_timeout)
    except (build.MathError, build.proofs_mod.ProofFailure, build.NotebookError,
            *build.NOTEBOOK_ERRORS) as exc:
        print(f"error: site build failed: {exc}", file=sys.stderr)
        return 1
    return 0
