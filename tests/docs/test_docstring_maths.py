r"""The maths written in minitx's docstrings and comments parses, and every variant shows its
formula.

The reading site renders ``$…$`` (inline) and ``$$…$$`` (display) in docstrings and comment
blocks as maths. Here every such span in ``minitx/`` is converted with latex2mathml, the
converter the site can use: it must convert without an error, without ``<merror>`` and without
an unknown command left as text (latex2mathml writes ``\foo`` it does not know as ``<mi>\foo``).
A stray ``$`` (a shell variable, a price) that would open maths is caught the same way: its
"formula" is prose and fails, or is found by ``test_no_dollar_outside_maths_and_code``.
"""
import ast
import io
import re
import sys
import tokenize

import pytest

from minitx.attention import REGISTRY
from support import REPO, need

ROOT = REPO / "minitx"
CODE_SPAN = re.compile(r"``.+?``|`[^`\n]+`", re.S)
DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
# as the site reads inline maths: no space just inside the dollars, no digit right after
SHELL_VAR = re.compile(r"\$[A-Z][A-Z0-9]*_[A-Z0-9_]+")
INLINE = re.compile(r"\$(?=[^\s$])([^$\n]*?[^\s$\\])\$(?!\d)|\$([^\s$\\])\$(?!\d)")


def _sources():
    return sorted(p for p in ROOT.rglob("*.py") if "site" not in p.relative_to(ROOT).parts)


def _texts(path):
    """Every docstring and every block of consecutive comment lines of one file."""
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield doc
    block, last = [], None
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            if block and tok.start[0] != last + 1:
                yield "\n".join(block)
                block = []
            block.append(tok.string.lstrip("#").strip())
            last = tok.start[0]
    if block:
        yield "\n".join(block)


def _spans(text):
    """(latex, display) for each maths span of ``text``; code spans are not maths."""
    text = CODE_SPAN.sub(" ", text)
    out = [(m.group(1).strip(), True) for m in DISPLAY.finditer(text)]
    text = DISPLAY.sub(" ", text)
    out += [((m.group(1) or m.group(2)).strip(), False) for m in INLINE.finditer(text)]
    return out


FORMULAS = [(f"{p.relative_to(ROOT.parent)}", latex, display)
            for p in _sources() for t in _texts(p) for latex, display in _spans(t)]


def test_a_shell_variable_is_caught():
    assert SHELL_VAR.search("nvcc ($CUDA_HOME/$CUDA_PATH)") and not SHELL_VAR.search("$x_i$")


def test_the_collector_finds_maths_and_skips_code():
    assert _spans("a ``$HOME`` b $x_i$ c\n$$\n\\frac{a}{b}\n$$ d $ 5 and $3") == \
        [("\\frac{a}{b}", True), ("x_i", False)]


def test_there_are_formulas():
    assert sum(display for _, _, display in FORMULAS) >= 23 + 10


@pytest.mark.parametrize("where, latex, display", FORMULAS,
                         ids=[f"{w}:{i}" for i, (w, _, _) in enumerate(FORMULAS)])
def test_formula_converts(where, latex, display):
    converter = need("latex2mathml.converter")
    assert latex.count("{") == latex.count("}"), (where, latex)
    assert len(re.findall(r"\\left\b", latex)) == len(re.findall(r"\\right\b", latex)), latex
    mathml = converter.convert(latex, display="block" if display else "inline")
    assert "<merror" not in mathml, (where, latex)
    unknown = re.findall(r"<m(?:i|o|text)[^>]*>\s*(\\[A-Za-z]+)", mathml)
    assert not unknown, (where, latex, unknown)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_variant_states_its_formula_once_in_its_module_docstring(name):
    """The formula is display maths in the module docstring; the class docstring's Formula
    section points there and states no formula of its own."""
    cls = REGISTRY[name]
    doc = cls.__doc__ or ""
    formula = doc[doc.find("Formula:"):doc.find("Shapes:")]
    assert "module docstring" in formula, f"{name}: the Formula section does not point to it"
    # the module's own, or the one of the op it names there (``flash`` runs ``ops/flash.py``)
    files = [ROOT.parent / f for f in re.findall(r"``(minitx/\S+?\.py|ops/\S+?\.py)``", formula)]
    module = "\n".join([sys.modules[cls.__module__].__doc__ or ""] + [
        ast.get_docstring(ast.parse(f.read_text(encoding="utf-8"))) or "" for f in
        (f if f.exists() else ROOT / f.relative_to(ROOT.parent) for f in files)])
    assert any(display for _, display in _spans(module)), \
        f"{name}: no $$ … $$ in the docstring of {cls.__module__}"
    assert not any(display for _, display in _spans(formula)), \
        f"{name}: the class docstring states the formula again, as $$ … $$"


# ---- each formula once -----------------------------------------------------------------------

def _laid_out_twins(text):
    """The first line of each hand-laid-out block (indented 4+) that runs straight into a
    ``$$`` display (blank lines only between): the same formula twice, once in Unicode and
    once in LaTeX. The site shows only the LaTeX one, so the Unicode one serves only
    ``help()``, and the two can drift apart."""
    lines, found, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.strip() and not line.strip().startswith("$$") and \
                len(line) - len(line.lstrip()) >= 4:
            j = i
            while j < len(lines) and not lines[j].strip().startswith("$$") and (
                    not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= 4):
                j += 1
            if j < len(lines) and lines[j].strip().startswith("$$"):
                found.append(line.strip())
            i = j
        else:
            i += 1
    return found


def test_the_twin_finder_finds_a_unicode_block_above_its_latex():
    text = "Prose:\n\n    O = softmax(S) V\n\n$$\nO = \\operatorname{softmax}(S) V\n$$\n"
    assert _laid_out_twins(text) == ["O = softmax(S) V"]
    assert _laid_out_twins("Prose:\n\n    a table   of columns\n\nMore prose.\n") == []


def _normalised(latex):
    return re.sub(r"\s+", "", latex)


def test_no_formula_is_stated_twice_in_a_file():
    """Within one file: no ``$$`` display appears twice (whitespace aside), and no docstring
    pairs a laid-out Unicode formula with the same formula in LaTeX below it."""
    twice = []
    for p in _sources():
        where = str(p.relative_to(ROOT.parent))
        displays = [_normalised(latex) for t in _texts(p)
                    for latex, display in _spans(t) if display]
        twice += [(where, d[:60]) for d in sorted(set(displays)) if displays.count(d) > 1]
        twice += [(where, line) for t in _texts(p) for line in _laid_out_twins(t)]
    assert not twice, twice


def test_no_dollar_outside_maths_and_code():
    """A ``$`` that is neither maths nor inside a code span would be read as maths by the
    site (or leave a lone dollar): write it as ``$NAME`` in a code span instead."""
    stray = []
    for p in _sources():
        for t in _texts(p):
            plain = CODE_SPAN.sub(" ", t)
            rest = INLINE.sub(" ", DISPLAY.sub(" ", plain))
            # a shell variable ($CUDA_HOME) outside a code span: maths to the renderer if a
            # second one follows, a stray dollar if not
            if "$" in rest or SHELL_VAR.search(plain):
                stray.append((str(p.relative_to(ROOT.parent)), t[:80]))
    assert not stray, stray
