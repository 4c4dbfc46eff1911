"""Turning text into HTML: Markdown with maths, docstrings, highlighted code, the page frame.

Maths: LaTeX → **MathML** at build time with ``latex2mathml``, which Chromium, Firefox and
Safari draw natively — no fonts, CSS, JavaScript or Node. KaTeX (``markdown-katex``: a 37 MB
bundled node binary, 0.1 s a formula against 0.4 ms) typesets more finely and parses strictly;
``latex2mathml`` drew 54 of 55 formulas of our kind (``aligned`` is rewritten to an ``array``),
and ``check_mathml`` supplies the strictness: a broken formula raises ``MathError`` naming page
and formula (balanced braces and ``\\left``/``\\right``, no unknown command, argument counts).
"""
from __future__ import annotations

import html
import re
import textwrap
import xml.etree.ElementTree as ET

import numpy as np

from latex2mathml.converter import convert as _latex_to_mathml
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from pygments import lex
from pygments.formatters import HtmlFormatter
from pygments.lexers import CudaLexer, PythonLexer
from pygments.token import STANDARD_TYPES

__all__ = ["MathError", "Renderer", "math_html", "docstring_markdown", "highlight_lines",
           "pygments_css", "esc", "svg_plot"]

esc = html.escape


class MathError(ValueError):
    """A formula that does not parse; the build stops and names the page and the formula."""

    def __init__(self, page: str, formula: str, why: str):
        super().__init__(f"page {page!r}: formula does not parse ({why}): {formula!r}")
        self.page, self.formula, self.why = page, formula, why


# ---- maths --------------------------------------------------------------------------------

_MATHML = "{http://www.w3.org/1998/Math/MathML}"
_ARITY = {"mfrac": 2, "mroot": 2, "msub": 2, "msup": 2, "msubsup": 3, "munder": 2,
          "mover": 2, "munderover": 3}


def _braces_balanced(latex: str) -> bool:
    depth = 0
    for m in re.finditer(r"\\.|[{}]", latex):
        tok = m.group()
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def check_mathml(latex: str, mathml: str) -> str | None:
    """Why ``mathml`` (converted from ``latex``) is broken, or None when it is sound."""
    if not _braces_balanced(latex):
        return "unbalanced braces"
    if len(re.findall(r"\\left\b", latex)) != len(re.findall(r"\\right\b", latex)):
        return r"unbalanced \left / \right"
    if len(re.findall(r"\\begin\{", latex)) != len(re.findall(r"\\end\{", latex)):
        return r"unbalanced \begin / \end"
    try:
        root = ET.fromstring(mathml)
    except ET.ParseError as exc:
        return f"malformed MathML ({exc})"
    for node in root.iter():
        tag = node.tag.replace(_MATHML, "")
        if tag in _ARITY and len(node) != _ARITY[tag]:
            return f"{tag} needs {_ARITY[tag]} arguments, got {len(node)}"
        if tag in ("mi", "mo", "mtext") and node.text and "\\" in node.text:
            return f"unknown command {node.text.strip()}"
    return None


_NESTED_MO = re.compile(r"<mo([^>]*)><mrow>((?:<mo[^>]*>[^<]*</mo>)+)</mrow></mo>")


def _flatten_operators(mathml: str) -> str:
    """latex2mathml writes ``\\mathrel{+=}`` (and ``\\mathbin``, ``\\mathop``) as an ``<mo>``
    holding an ``<mrow>`` of ``<mo>``s, which MathML does not allow (an operator holds text):
    Chromium then draws "+" and "=" apart or not at all. One ``<mo>`` with the text joined
    is what was written."""
    return _NESTED_MO.sub(lambda m: f"<mo{m.group(1)}>"
                          + "".join(re.findall(r"<mo[^>]*>([^<]*)</mo>", m.group(2))) + "</mo>",
                          mathml)


def math_html(latex: str, display: bool, page: str) -> str:
    """MathML for ``latex``; raises MathError (naming ``page``) when it does not parse."""
    # latex2mathml reads "aligned" as text: the same rows as a right|left array
    latex = re.sub(r"\\begin\{aligned\}", r"\\begin{array}{rl}", latex)
    latex = re.sub(r"\\end\{aligned\}", r"\\end{array}", latex)
    # \mathrel{+}= is one operator, "+=", as written: the "=" goes inside the relation
    latex = re.sub(r"\\mathrel\{([^{}]*)\}\s*=", r"\\mathrel{\1=}", latex)
    try:
        mathml = _latex_to_mathml(latex, display="block" if display else "inline")
    except Exception as exc:  # noqa: BLE001 - any converter failure is a formula error
        raise MathError(page, latex, f"{type(exc).__name__}: {exc}") from exc
    mathml = _flatten_operators(mathml)
    why = check_mathml(latex, mathml)
    if why:
        raise MathError(page, latex, why)
    return mathml


# ---- Markdown -----------------------------------------------------------------------------

class Renderer:
    """Markdown (CommonMark + tables + ``$…$``/``$$…$$``) to HTML for one page.

    ``link`` maps a link target to a site-relative URL, or None for an outside link (shown as
    text with its address, never as a live reference); ``image`` maps an image source to the
    site-relative path of its copy; ``code_link`` maps the text of a code span (a file path,
    a module, a function on the page) to the URL it names, or None. ``formulas`` counts the
    formulas rendered.
    """

    def __init__(self, page: str, link=None, image=None, code_link=None):
        self.page = page
        self.code_link = code_link or (lambda text: None)
        self.formulas = 0
        self.resolve_link = link or (lambda href: href if _internal(href) else None)
        self.resolve_image = image or (lambda src: src if _internal(src) else None)
        md = MarkdownIt("commonmark", {"html": False}).enable("table")
        md.use(dollarmath_plugin, allow_space=False, allow_digits=False, double_inline=True)
        for rule, method in (("math_inline", self._math_inline),
                             ("math_inline_double", self._math_block),
                             ("math_block", self._math_block),
                             ("math_block_label", self._math_block),
                             ("link_open", self._link_open), ("link_close", self._link_close),
                             ("image", self._image), ("code_inline", self._code_inline)):
            # markdown-it binds a rule to its renderer: wrap so ours keeps this object
            md.add_render_rule(rule, lambda _r, tokens, idx, options, env, m=method:
                               m(tokens, idx, options, env))
        self.md = md
        self._outside = []

    def _math_inline(self, tokens, idx, options, env):
        self.formulas += 1
        return math_html(tokens[idx].content.strip(), False, self.page)

    def _math_block(self, tokens, idx, options, env):
        self.formulas += 1
        return f'<div class="math">{math_html(tokens[idx].content.strip(), True, self.page)}</div>'

    def _link_open(self, tokens, idx, options, env):
        href = tokens[idx].attrGet("href") or ""
        target = self.resolve_link(href)
        self._outside.append(None if target is not None else href)
        if target is None:
            return '<span class="outside">'
        return f'<a href="{esc(target)}">'

    def _link_close(self, tokens, idx, options, env):
        href = self._outside.pop()
        if href is None:
            return "</a>"
        return f'</span> <span class="address">({esc(href)})</span>'

    def _code_inline(self, tokens, idx, options, env):
        text = tokens[idx].content
        code = f"<code>{esc(text)}</code>"
        target = None if self._outside else self.code_link(text)   # no link inside a link
        return f'<a class="ref" href="{esc(target)}">{code}</a>' if target else code

    def _image(self, tokens, idx, options, env):
        token = tokens[idx]
        src = self.resolve_image(token.attrGet("src") or "")
        alt = esc(token.content)
        if src is None:
            return f'<span class="outside">[image: {alt}]</span>'
        return f'<img src="{esc(src)}" alt="{alt}" loading="lazy">'

    def __call__(self, text: str) -> str:
        return self.md.render(text)


def _internal(href: str) -> bool:
    return not re.match(r"^([a-z][a-z0-9+.-]*:|//|/)", href, re.I)


def docstring_markdown(doc: str) -> str:
    """A plain-text docstring (or comment) as Markdown that reads as it does in ``help()``.

    Text laid out by hand stays as laid out: an indented block (a formula, an example) and a
    run of column-aligned lines (a table: text with gaps of 3+ spaces) become a preformatted
    block, with the line that leads into an aligned block (``c0 -> row g`` above ``c2 -> …``)
    kept in it. A block that is one ``$$ … $$`` formula becomes display maths; the lines
    under a list item continue it. ``double backticks`` are already Markdown code spans.

    A formula is shown once: a laid-out block followed directly (blank lines only) by a
    ``$$ … $$`` formula is that formula in Unicode, kept in the docstring for ``help()``,
    and left out here, where the rendered one stands in its place.
    """
    out, prev, in_math = [], "", False
    lines = doc.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        starts = line.strip() and not in_math and (
            _tabular(line) or _indent(line) >= 4 and (not prev.strip() or _indent(prev) < 4))
        if starts:
            j = i
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= 4
                                      or _tabular(lines[j])):
                j += 1
            while j > i and not lines[j - 1].strip():
                j -= 1
            block = lines[i:j]
            if prev.strip() and _leads_into(prev, _indent(line)) and out and out[-1] == \
                    _escape_plain(prev):
                out.pop()                        # the lead line belongs to the layout
                block = [prev] + block
            text = textwrap.dedent("\n".join(block))
            if text.strip().startswith("$$") and text.strip().endswith("$$"):
                out += ["", text.strip(), ""]
            elif _prose_list_continuation(prev) and not _tabular(line):
                out += lines[i:j]
            elif not _maths_follows(lines, j):   # else its rendered twin stands in for it
                out += ["", textwrap.indent(text, "    "), ""]
            prev = lines[j - 1]
            i = j
            continue
        if line.strip().startswith("$$") and line.count("$$") == 1:
            in_math = not in_math                  # a $$ … $$ formula over several lines
        out.append(line if in_math or line.strip().startswith("$$") else _escape_plain(line))
        prev = line
        i += 1
    return "\n".join(out)


def _maths_follows(lines, j) -> bool:
    """True when the line after the blank lines from ``j`` opens a ``$$`` display formula:
    the plain-text formula just above it is its Unicode twin (what ``help()`` reads), and
    the page shows the formula once, rendered."""
    while j < len(lines) and not lines[j].strip():
        j += 1
    return j < len(lines) and lines[j].strip().startswith("$$")


def _tabular(line: str) -> bool:
    """Column-aligned text: a gap of 3+ spaces between words (not counting the indent)."""
    return bool(re.search(r"\S {3,}\S", line.strip())) and "$$" not in line


def _leads_into(prev: str, column: int) -> bool:
    """True when ``prev`` has a word starting at ``column`` after a gap: the first row of
    the aligned block below it (``accumulator C: c0, c1 -> row g`` over ``c2, c3 -> …``)."""
    return column >= 4 and len(prev) > column and prev[column - 1] == " " and \
        prev[column] != " "


_KEEP = re.compile(r"(``.+?``|`[^`]+`|\$\$.+?\$\$|\$[^$\s][^$]*?\$)")


def _escape_plain(line: str) -> str:
    """Escape ``_`` outside code spans and maths: in a plain docstring ``d_k`` or ``Σ_j`` is
    a subscript written in text, never Markdown's emphasis."""
    parts = _KEEP.split(line)
    return "".join(p if k % 2 else p.replace("_", "\\_") for k, p in enumerate(parts))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _prose_list_continuation(prev: str) -> bool:
    """True when ``prev`` is a list item whose text is continued by deeper-indented lines."""
    return bool(re.match(r"^\s{2,}[-*] |\s{2,}\d+[.)] ", prev))


# ---- code ---------------------------------------------------------------------------------

def _css_class(ttype) -> str:
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def highlight_lines(text: str, language: str) -> list:
    """The highlighted HTML of each line of ``text`` (the whole file is lexed at once, so a
    line keeps its context), newline characters kept at the ends."""
    lexer = (CudaLexer if language == "cuda" else PythonLexer)(stripnl=False, ensurenl=False,
                                                               stripall=False, tabsize=0)
    lines, cur = [], []
    for ttype, value in lex(text, lexer):
        cls = _css_class(ttype)
        parts = value.split("\n")
        for k, part in enumerate(parts):
            if part:
                cur.append(f'<span class="{cls}">{esc(part, quote=False)}</span>' if cls
                           else esc(part, quote=False))
            if k < len(parts) - 1:
                lines.append("".join(cur) + "\n")
                cur = []
    if cur:
        lines.append("".join(cur))
    return lines


def pygments_css() -> str:
    return HtmlFormatter(style="friendly").get_style_defs(".code")


# ---- plots --------------------------------------------------------------------------------

_COLOURS = ("#1f5fa8", "#c2410c", "#15803d", "#7e22ce", "#b45309")


def _nice(v: float, unit: str = "") -> str:
    """A tick label: integers as written, bytes in B/KiB/MiB/GiB, seconds in s/ms/µs, counts
    ("n") in k/M/G."""
    if unit == "n":
        for scale, name in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
            if abs(v) >= scale:
                return f"{v / scale:.3g}{name}"
        return f"{v:.0f}"
    if unit == "B":
        for scale, name in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
            if abs(v) >= scale:
                return f"{v / scale:.3g} {name}"
        return f"{v:.0f} B"
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(v) >= scale:
                return f"{v / scale:.3g} {name}"
        return f"{v * 1e9:.3g} ns"
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e7 else f"{v:.3g}"


def svg_plot(series: dict, xlabel: str, ylabel: str, log=True, width=260, height=150,
             unit: str = "") -> str:
    """A small line plot as inline SVG, drawn by hand so the bytes depend only on the numbers.

    ``series``: {label: [(x, y), …]}; ``log``: both axes logarithmic (a power law is a line,
    its slope the exponent); ``unit``: "B", "s" or "n" writes the y ticks in KiB/MiB, ms/µs or
    k/M/G.
    """
    tx = (lambda v: float(np.log10(v))) if log else float
    pts = {k: [(tx(x), tx(max(y, 1e-30)) if log else float(y)) for x, y in v]
           for k, v in series.items() if v}
    xs = [p[0] for v in pts.values() for p in v]
    ys = [p[1] for v in pts.values() for p in v]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    # margins wide enough for "512 KiB" on the left and a four-digit N under the last point
    left, right, top, bottom = 54, 18, 18, 30
    sx = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    sy = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    raw = [(x, y) for v in series.values() for x, y in v]
    scale = "log–log" if log else "linear"
    out = [f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="{esc(ylabel)} against {esc(xlabel)}">',
           f'<rect x="{left}" y="{top}" width="{width - left - right}" '
           f'height="{height - top - bottom}" fill="#fafafa" stroke="#ccc"/>']
    ticks = sorted({x for x, _ in raw})
    for i, x in enumerate(ticks):
        px = sx(tx(x))
        if len(ticks) > 6 and 0 < i < len(ticks) - 1 and i % 2:
            continue                     # every other label when they would crowd
        out.append(f'<text x="{px:.1f}" y="{height - bottom + 12}" text-anchor="middle">'
                   f'{_nice(x)}</text>')
    for y in (min(y for _, y in raw), max(y for _, y in raw)):
        py = sy(tx(max(y, 1e-30)) if log else y)
        out.append(f'<text x="{left - 3}" y="{py + 3:.1f}" text-anchor="end">'
                   f'{_nice(y, unit)}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 4}" '
               f'text-anchor="middle">{esc(xlabel)} ({scale})</text>')
    for i, (name, v) in enumerate(sorted(pts.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in v)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.4" fill="{colour}"/>'
                for x, y in v]
        out.append(f'<text x="{left + 110 * i}" y="{top - 6}" fill="{colour}">'
                   f'{esc(name)}</text>')                  # the legend, above the frame
    out.append("</svg>")
    return "".join(out)
