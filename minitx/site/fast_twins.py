"""The appendix "How it was made fast": each trick of ``minitx/fast/`` beside its reference.

``minitx.configuration.twins()`` lists the fast layer: {reference name: fast function}. For
each name this module finds

- the **twin**: the fast function's file and section (its module and qualified name);
- the **reference**: the function of the course that asks ``configuration.twin("name")`` —
  its one dispatch point, where the plain maths runs when the fast layer is off;

and **measures what the twin buys**, at build time: one small workload that goes through the
dispatch point is timed with the whole fast layer on, and again with this one twin switched
off (``configuration.without_twins(name)``, the other twins staying on), in alternating turns.
The speed-up is the ratio of the two least times. It measures the machine, not the maths, so
the site fences it in ``<!--measured-->`` markers: two builds differ only there.
"""
from __future__ import annotations

import ast
import os
import re
import time
from dataclasses import dataclass

import numpy as np

import minitx
import minitx.fast  # noqa: F401 - registers the twins
import minitx.functional as F
from minitx import configuration, nn, optim

__all__ = ["Twin", "find_twins", "measure", "on_and_off", "WORKLOADS"]


@dataclass
class Twin:
    name: str                 # the reference name the twin is registered under
    fast_path: str            # minitx/fast/….py
    fast_anchor: str          # its section on that page
    ref_path: str = ""        # the file whose dispatch point asks for it ("" if none found)
    ref_anchor: str = ""      # the function holding that dispatch point
    speedup: float = None     # reference time / twin time, None when not measured
    times: tuple = ()         # (seconds with the twin, seconds without it)


# ---- where each twin and its reference live -------------------------------------------------

def _anchor_for(qualname: str, anchors) -> str:
    """The deepest section anchor of ``qualname`` the page has (``A.b``, else ``A``)."""
    parts = qualname.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        if name in anchors:
            return name
    return parts[0]


def _enclosing(tree, line):
    """The qualified name of the innermost def/class around ``line``, or ""."""
    found = ""

    def visit(node, prefix):
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if child.lineno <= line <= child.end_lineno:
                    found = prefix + child.name
                    visit(child, found + ".")
    visit(tree, "")
    return found


def find_twins(root: str, sources, anchors_of) -> list:
    """Every registered twin as a ``Twin``, sorted by name. ``sources``: the site's Python
    files (repository paths); ``anchors_of(path)``: the section anchors of that page."""
    asks = {}
    for path in sources:
        if not path.endswith(".py") or path.startswith("minitx/fast/"):
            continue
        with open(os.path.join(root, path), encoding="utf-8") as fh:
            text = fh.read()
        hits = [(m.group(1), text.count("\n", 0, m.start()) + 1)
                for m in re.finditer(r"configuration\.twin\(\s*[\"'](\w+)[\"']", text)]
        if hits:
            tree = ast.parse(text)
            for name, line in hits:
                asks.setdefault(name, (path, _enclosing(tree, line)))
    out = []
    for name, fn in sorted(configuration.twins().items()):
        fast_path = fn.__module__.replace(".", "/") + ".py"
        twin = Twin(name, fast_path, _anchor_for(fn.__qualname__, anchors_of(fast_path)))
        if name in asks:
            path, qualname = asks[name]
            twin.ref_path, twin.ref_anchor = path, _anchor_for(qualname, anchors_of(path))
        out.append(twin)
    return out


# ---- what each twin buys: one workload through its dispatch point --------------------------

def _tensor(rng, shape, grad=False):
    return minitx.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)


def _softmax(rng, n):                       # row_max: softmax's shift
    x = _tensor(rng, (8, n, n))
    return lambda: F.softmax(x, axis=-1)


def _gelu(rng, n):                          # erf
    x = _tensor(rng, (n, 256), grad=True)

    def run():
        F.gelu(x).sum().backward()
    return run


def _silu(rng, n):                          # silu, silu_backward: a SwiGLU's activation
    x = _tensor(rng, (n, 704), grad=True)

    def run():
        F.silu(x).sum().backward()
    return run


def _layer_norm(rng, n):
    x = _tensor(rng, (n, 256), grad=True)
    w, b = _tensor(rng, (256,), grad=True), _tensor(rng, (256,), grad=True)

    def run():
        F.layer_norm(x, (256,), w, b).sum().backward()
    return run


def _sdpa(rng, n):                          # sdpa; map_in_threads through flash
    q, k, v = (_tensor(rng, (1, 4, n, 32), grad=True) for _ in range(3))

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    return run


def _flash(rng, n):
    q, k, v = (_tensor(rng, (1, 4, n, 32)) for _ in range(3))
    return lambda: F.flash_attention(q, k, v, causal=True)


def _embedding_backward(rng, n):            # scatter_add: the embedding's gradient
    table = nn.Embedding(512, 64)
    ids = minitx.tensor(rng.integers(0, 512, size=(n * 8,)))

    def run():
        table(ids).sum().backward()
    return run


def _adam(rng, n):                          # a small model's step: many biases and norms
    minitx.manual_seed(0)
    model = nn.Sequential(*(nn.TransformerEncoderLayer(n, 4, 4 * n, dropout=0.0)
                            for _ in range(4)))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    model(_tensor(rng, (2, 8, n))).sum().backward()   # a gradient for every parameter
    return opt.step


def _adam_large(rng, n):                    # adam_in_place: one large parameter's step
    weight = nn.Parameter(_tensor(rng, (n, 1024)).data)     # (a mixture of experts' stack)
    weight.grad = _tensor(rng, (n, 1024))
    return optim.AdamW([weight], lr=1e-3).step


# name -> workload(rng, size) returning the function to time; sizes (quick, full)
WORKLOADS = {
    "row_max": (_softmax, (128, 256)),
    "erf": (_gelu, (512, 1024)),
    "silu": (_silu, (128, 2048)), "silu_backward": (_silu, (128, 2048)),
    "layer_norm": (_layer_norm, (512, 1024)), "sdpa": (_sdpa, (256, 512)),
    "map_in_threads": (_flash, (256, 1024)), "scatter_add": (_embedding_backward, (256, 1024)),
    "adam": (_adam, (32, 64)), "adam_in_place": (_adam_large, (64, 2048)),
}


def on_and_off(name, size, turns, calls=1, seed=0):
    """(seconds with the twin ``name``, seconds without it) on its workload at ``size``, the
    rest of the fast layer on: the least of ``turns`` turns that alternate the two (on, off,
    then off, on, …, so that a slow stretch of the machine falls on both), each an untimed
    call then ``calls`` timed ones. A busy machine only ever slows a call down, hence the
    least."""
    make, _ = WORKLOADS[name]
    fn = make(np.random.default_rng(seed), size)

    def off():
        with configuration.without_twins(name):
            return fn()

    best = {fn: float("inf"), off: float("inf")}
    with configuration.using_config(fast=True):
        for turn in range(turns):
            for variant in ((fn, off) if turn % 2 == 0 else (off, fn)):
                variant()                        # untimed: warm-up, caches, BLAS threads
                for _ in range(calls):
                    t0 = time.perf_counter()
                    variant()
                    best[variant] = min(best[variant], time.perf_counter() - t0)
    return best[fn], best[off]


def measure(twins, quick=True, seed=0) -> None:
    """Fill in each twin's ``times`` and ``speedup`` (a twin without a workload stays None).
    Runs on NumPy, with the fast layer on; ``benchmarks/twin_gains.py`` runs the same
    measurement, longer."""
    for twin in twins:
        if twin.name not in WORKLOADS:
            continue
        sizes = WORKLOADS[twin.name][1]
        fast, plain = on_and_off(twin.name, sizes[0] if quick else sizes[1],
                                 turns=3 if quick else 6, seed=seed)
        twin.times = (fast, plain)
        twin.speedup = plain / fast if fast > 0 else None
