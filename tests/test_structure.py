"""The package's structure, as tests: layers import only downward, imports sit at the top of
their files, and every registered attention variant's every parameter learns.

The layers (README, "Architecture"), bottom up — a module may import from its own layer or
any layer below, never above:

    0  validate, configuration           option checks; the fast/reference switch and its table
    1  backend                           the array module, devices, the CUDA launcher
    2  autograd, ops, functional         the core: Tensor, Function, engine, the ops
    3  fast, minitx/__init__.py          every CPU speed trick, registered as the ops' twins
    4  nn, optim                         Module, layers, init, positional encodings; optimizers
    5  attention                         the registry and every variant
    6  models                            MultiheadAttention, transformer blocks, models
    7  pretrained, interop, metrics,     built from models: checkpoints, PyTorch hand-off,
       data, viz, patching, checkpoints  measures, data sets, pictures, patching, training
                                         checkpoints (stop and resume)
    8  tour, cli, doctor, chat,          the programs
       __main__, site

Two deliberate exceptions, both documented where they are: ``autograd/tensor.py`` binds the
engine and ``minitx.ops`` at its end (the core is one layer: Tensor's operators are calls into
ops, and both import Tensor), and ``minitx.nn.__getattr__`` offers the names of
``minitx.models`` on request, as PyTorch's ``torch.nn`` does (nothing is imported upward until a
user asks for such a name).
"""
import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minitx
from minitx.attention import REGISTRY

ROOT = pathlib.Path(minitx.__file__).parent
LAYERS = [("validate", "configuration"), ("backend",), ("autograd", "ops", "functional"),
          ("fast", "__init__"),
          ("nn", "optim"),
          ("attention",), ("models",),
          ("pretrained", "interop", "metrics", "data", "viz", "patching", "checkpoints"),
          ("tour", "cli", "doctor", "chat", "__main__", "site")]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _top(module_path: pathlib.Path) -> str:
    """The first component under minitx/ ("ops", "nn", "tour", "__init__" for the root)."""
    rel = module_path.relative_to(ROOT).with_suffix("")
    return rel.parts[0]


def _minitx_imports(path: pathlib.Path):
    """(line, target top-level name, inside a def/class?) for each import of a minitx module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]   # ("minitx", "ops")
    nested = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            nested.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:                                   # relative: resolve against package
                base = list(package[:len(package) - node.level + 1])
                full = base + (node.module.split(".") if node.module else [])
                if len(full) == 1:                           # "from .. import nn, validate"
                    targets = [["minitx", a.name] for a in node.names]
                else:
                    targets = [full]
            elif node.module and node.module.split(".")[0] == "minitx":
                targets = [node.module.split(".")]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names if a.name.split(".")[0] == "minitx"]
        for t in targets:
            if len(t) > 1:
                yield node.lineno, t[1], id(node) in nested


FILES = sorted(ROOT.rglob("*.py"))


def test_every_module_is_placed_in_a_layer():
    assert {_top(p) for p in FILES} <= set(LAYER), {_top(p) for p in FILES} - set(LAYER)


def test_imports_point_down_the_layers():
    upward = []
    for path in FILES:
        own = LAYER[_top(path)]
        for line, target, _ in _minitx_imports(path):
            if LAYER.get(target, -1) > own:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} imports minitx.{target} "
                              f"(layer {LAYER[target]} above {own})")
    assert not upward, "\n".join(upward)


# the one allowed upward shim: minitx.nn offers minitx.models' names on request
SHIMS = {("nn/__init__.py", "models")}


def test_imports_are_at_the_top_of_their_files():
    late = []
    for path in FILES:
        rel = path.relative_to(ROOT).as_posix()
        for line, target, inside in _minitx_imports(path):
            if inside and (rel, target) not in SHIMS:
                late.append(f"{rel}:{line} imports minitx.{target} inside a function or class")
    assert not late, "\n".join(late)


def _fresh_import(module: str) -> set:
    code = (f"import sys, {module}; "
            "print('\\n'.join(m for m in sys.modules if m == 'minitx' or m.startswith('minitx.')))")
    env = {k: v for k, v in os.environ.items()                # a plain interpreter: no
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}   # stand-in, NumPy backend
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(ROOT.parent), env=env)
    return set(out.stdout.split())


@pytest.mark.parametrize("module,forbidden", [
    ("minitx", ("nn", "attention", "models", "pretrained", "data", "viz", "tour", "cli")),
    ("minitx.functional", ("nn", "attention", "models", "tour")),
    ("minitx.nn", ("attention", "models", "pretrained", "tour", "cli")),
    ("minitx.attention", ("models", "pretrained", "tour", "cli")),
    ("minitx.models", ("pretrained", "tour", "cli")),
])
def test_importing_a_layer_pulls_in_nothing_above_it(module, forbidden):
    loaded = _fresh_import(module)
    above = sorted(m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in forbidden)
    assert not above, f"import {module} loaded {above}"


def test_nn_still_offers_the_models_by_their_pytorch_names():
    import minitx.nn as nn
    from minitx import models
    assert nn.MultiheadAttention is models.MultiheadAttention
    assert nn.TransformerEncoderLayer is models.TransformerEncoderLayer
    assert nn.GPT is models.GPT and nn.GPTConfig is models.GPTConfig
    with pytest.raises(AttributeError, match="no attribute 'NotAModule'"):
        nn.NotAModule  # noqa: B018


# ---- every parameter of every registered variant learns ----------------------------------

def _variants():
    for name in sorted(REGISTRY):
        yield name, {}
    for synthesis in ("random", "factorized", "mixture"):
        yield "synthesizer", {"synthesis": synthesis}


@pytest.mark.parametrize("name,options", list(_variants()),
                         ids=[f"{n}-{o.get('synthesis', '')}".rstrip("-") for n, o in _variants()])
def test_every_parameter_of_every_variant_gets_a_gradient(name, options):
    minitx.manual_seed(0)
    layer = REGISTRY[name](16, 2, **options).to(dtype="float64")
    x = minitx.tensor(np.random.default_rng(1).standard_normal((2, 12, 16)), dtype="float64")
    y = layer(x)
    params = dict(layer.named_parameters())
    if not params:                                   # FNet: a fixed transform, nothing to learn
        assert name == "fnet" and layer.projections == () and not y.requires_grad
        return
    (y * minitx.tensor(np.random.default_rng(2).standard_normal(y.shape))).sum().backward()
    dead = [n for n, p in params.items() if p.grad is None or not np.any(p.grad.numpy())]
    assert not dead, f"{name}: parameters that never receive a gradient: {dead}"
    expected = {f"{p}_proj" for p in layer.projections}
    owned = {n.split(".")[0] for n in params if n.endswith("_proj.weight")} | \
        {n.split(".")[0] for n in params if "_proj." in n}
    assert owned == expected, (name, owned, expected)


# ---- the references stay short enough to read in one sitting ---------------------------------

def code_lines(path, name):
    """Code lines of function ``name`` (``Class.method`` for a method) in ``path``: from its
    ``def`` to its end, without its docstring, blank lines and lines holding only a comment."""
    import tokenize
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = name.split(".")
    scope = tree
    for part in parts:
        scope = next(n for n in ast.iter_child_nodes(scope)
                     if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
    lines = set(range(scope.lineno, scope.end_lineno + 1))
    body = scope.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    text = path.read_text(encoding="utf-8").splitlines()
    comment_only = set()
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.COMMENT and not text[tok.start[0] - 1][:tok.start[1]].strip():
                comment_only.add(tok.start[0])
    return sum(1 for n in lines if text[n - 1].strip() and n not in comment_only)


@pytest.mark.parametrize("path,name,limit", [
    ("ops/attention_maths.py", "attention_backward", 20),   # the five equations, in order
    ("ops/attention_maths.py", "attention_forward", 45),    # scores, mask, softmax, dropout, P V
    ("ops/attention_maths.py", "SDPAFunction.forward", 45),
    ("autograd/engine.py", "backward", 45),              # the chain rule, calling ctx.free()
    ("autograd/function.py", "Function.apply", 30),
])
def test_the_reference_functions_stay_short(path, name, limit):
    assert code_lines(ROOT / path, name) <= limit


@pytest.mark.parametrize("name", ["attention_maths.py", "sdpa.py"])
def test_no_function_of_the_attention_op_is_over_60_code_lines(name):
    path = ROOT / "ops" / name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            owner = next((c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                          and node in c.body), None)
            name = f"{owner}.{node.name}" if owner else node.name
            if code_lines(path, name) > 60:
                long.append(name)
    assert not long, long


def test_the_maths_of_attention_reads_in_one_sitting():
    """Attention's maths (formula, backward, mask, grouped heads) in one short file; PyTorch's
    API around it (checks, mask conversion, warnings, dispatch) lives in ``ops/sdpa.py``."""
    lines = (ROOT / "ops" / "attention_maths.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, lines


def test_the_line_counter_counts_what_it_says():
    """The counter above on a known function: a docstring, a comment line and a blank line
    are not counted; code lines with a trailing comment are."""
    import tempfile
    source = ('def f(x):\n    """Doc\n    string."""\n    # a comment\n\n    y = x  # kept\n'
              '    return y\n')
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    assert code_lines(pathlib.Path(f.name), "f") == 3
    os.unlink(f.name)


def test_every_line_of_the_package_fits_in_100_columns():
    long = [f"{p.relative_to(ROOT.parent)}:{i}: {len(line)}" for p in FILES
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > 100]
    assert not long, "\n".join(long)
