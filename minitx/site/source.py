"""The section model: a source file cut into (prose, code) sections, losing nothing.

A literate page pairs notes with the code they explain. Here a file's lines are read once and
each line is given one of three roles:

- **prose**: a docstring (module, class or function) or a block of full-line comments;
- **head**: the ``def``/``class`` line(s) (and decorators) that own the docstring just below —
  shown at the top of the code column, beside their docstring;
- **code**: everything else, blank lines included.

Consecutive lines are then grouped into ``Section``s, each ``head + prose + code``. Every line
of the file lands in exactly one section, in order, so

    "".join(s.source for s in sections) == file text

holds byte for byte (the tests check it on every page). CUDA sources (``.cu``/``.cuh``) use
the same model: ``//`` comment runs and ``/* … */`` blocks are the prose.
"""
from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field

__all__ = ["Section", "python_sections", "cuda_sections", "file_sections", "module_summary"]


@dataclass
class Section:
    """One row of a page: ``prose`` (Markdown, already cleaned of quotes and ``#``) on the left,
    ``head + code`` on the right. ``*_src`` keep the file's exact text of each part."""
    anchor: str
    prose: str = ""
    head_src: list = field(default_factory=list)     # lines, each ending in "\n" (except last)
    prose_src: list = field(default_factory=list)
    code_src: list = field(default_factory=list)
    names: list = field(default_factory=list)        # further anchors: defs in the code

    @property
    def source(self) -> str:
        return "".join(self.head_src + self.prose_src + self.code_src)

    @property
    def code(self) -> str:
        """What the code column shows: the head, then the code (the prose is on the left)."""
        return "".join(self.head_src + self.code_src)


def _lines(text: str) -> list:
    """The lines of ``text``, each with its "\\n" — split on "\\n" only, as Python counts lines
    (``str.splitlines`` would also split on form feeds and Unicode separators)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


# ---- Python -------------------------------------------------------------------------------

def _alone(expr, lines) -> bool:
    """True when the docstring ``expr`` has its lines to itself (not ``def f(): "doc"``)."""
    first, last = lines[expr.lineno - 1], lines[expr.end_lineno - 1]
    before = first.encode("utf-8")[:expr.col_offset].decode("utf-8")
    after = last.encode("utf-8")[expr.end_col_offset:].decode("utf-8")
    return not before.strip() and not after.strip()


def _as_help_shows(node, doc: str) -> str:
    """An attention variant's docstring says ``{complexity}``; ``attention/base.py`` fills it
    in from the class's ``complexity`` string when the class is registered — do the same."""
    if isinstance(node, ast.ClassDef) and "{complexity}" in doc:
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "complexity" for t in stmt.targets) \
                    and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                return doc.replace("{complexity}", stmt.value.value)
    return doc


def _docstring_owners(tree, lines):
    """{first docstring line: (anchor, head first line, docstring last line, text)}, 1-based,
    for every module/class/function docstring that stands on lines of its own."""
    owners = {}

    def visit(node, prefix):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            return
        doc = ast.get_docstring(node, clean=True) if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
        expr = body[0] if body else None
        if doc is not None and _alone(expr, lines):
            if isinstance(node, ast.Module):
                anchor, head = "module", expr.lineno
            else:
                anchor = prefix + node.name
                head = min([node.lineno] + [d.lineno for d in node.decorator_list])
            owners[expr.lineno] = (anchor, head, expr.end_lineno, _as_help_shows(node, doc))
        inner = prefix + node.name + "." if isinstance(node, ast.ClassDef) else (
            "" if isinstance(node, ast.Module) else prefix + node.name + ".")
        for child in body:
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, inner)

    visit(tree, "")
    return owners


def _comment_lines(text):
    """1-based numbers of the lines whose first token is a comment (not inside a string)."""
    found = set()
    lines = _lines(text)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            line = lines[row - 1]
            if col == len(line) - len(line.lstrip()):
                found.add(row)
    return found


_RULE = re.compile(r"^[-=]{3,}\s*(.*?)\s*[-=]{3,}\s*$")


def _heading(line: str) -> str:
    """A ruled comment, "---- the fused Functions ----", becomes a Markdown heading."""
    m = _RULE.match(line.strip())
    return f"### {m.group(1)}" if m and m.group(1) else line


def _uncomment(lines):
    """'# text' lines -> Markdown text (the '#' and one space removed, relative indent kept;
    a ruled line becomes a heading)."""
    out = []
    for line in lines:
        body = line.strip()
        if not body:
            continue
        body = body[1:]
        out.append(_heading(body[1:] if body.startswith(" ") else body))
    return "\n".join(out).strip("\n")


_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")


def python_sections(text: str) -> list:
    """Cut Python source ``text`` into sections (see the module docstring)."""
    lines = _lines(text)
    tree = ast.parse(text)
    owners = _docstring_owners(tree, lines)
    comments = _comment_lines(text)
    role = ["code"] * (len(lines) + 1)      # 1-based
    doc_at = {}                             # first line of a prose run -> (anchor, markdown)
    head_at = {}                            # first head line -> anchor
    for first, (anchor, head, last, doc) in owners.items():
        for i in range(head, first):
            role[i] = "head"
        for i in range(first, last + 1):
            role[i] = "doc"
        doc_at[first] = (anchor, doc)
        if head < first:
            head_at[head] = anchor
    for i in comments:
        if role[i] == "code":
            role[i] = "comment"

    sections, cur = [], None
    new = _namer(sections)

    i = 1
    while i <= len(lines):
        r, line = role[i], lines[i - 1]
        if r == "head":
            if i in head_at:
                cur = new(head_at[i])
            cur.head_src.append(line)
        elif r == "doc":
            anchor, doc = doc_at[i]
            owned = cur is not None and cur.head_src and not cur.prose_src and not cur.code_src
            if not owned and (cur is None or cur.code_src or cur.head_src):
                cur = new(anchor)
            last = owners[i][2]
            cur.prose_src.extend(lines[i - 1:last])
            cur.prose = (cur.prose + "\n\n" + doc).strip("\n")
            i = last + 1
            continue
        elif r == "comment":
            j = i
            while j <= len(lines) and role[j] == "comment":
                j += 1
            if cur is None or cur.code_src:
                cur = new(slug(_uncomment(lines[i - 1:j - 1])))
            cur.prose_src.extend(lines[i - 1:j - 1])
            cur.prose = (cur.prose + "\n\n" + _uncomment(lines[i - 1:j - 1])).strip("\n")
            i = j
            continue
        else:
            if cur is None:
                cur = new("top")
            if not line.strip() and not cur.code_src and cur.prose_src:
                cur.prose_src.append(line)     # blank lines after prose stay with it
            else:
                cur.code_src.append(line)
                m = _DEF.match(line)
                if m and not line.startswith((" ", "\t")):
                    cur.names.append(m.group(1))
        i += 1
    _unique_names(sections)
    return sections


def slug(text: str, words: int = 6) -> str:
    """A stable anchor from the first words of a comment: "---- 3. every variant ----" ->
    "c-3-every-variant" (it moves only when the comment itself changes)."""
    found = re.findall(r"[a-z0-9]+", text.split("\n")[0].lower())[:words]
    return "c-" + "-".join(found) if found else "c"


def _namer(sections):
    """``new(anchor)``: append a Section whose anchor is made unique in the file (-2, -3 …)."""
    used = {}

    def new(anchor):
        count = used.get(anchor, 0) + 1
        used[anchor] = count
        sec = Section(anchor if count == 1 else f"{anchor}-{count}")
        sections.append(sec)
        return sec
    return new


def _unique_names(sections):
    taken = {s.anchor for s in sections}
    for s in sections:
        keep = []
        for name in s.names:
            if name not in taken:
                taken.add(name)
                keep.append(name)
        s.names = keep


# ---- CUDA ---------------------------------------------------------------------------------

_CU_FUNC = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(?:__global__|__device__|inline|static|"
                      r"__forceinline__|\s)*[\w:<>,\s\*&]+?\b([A-Za-z_]\w*)\s*\(")


def _uncomment_c(lines):
    out = []
    for line in lines:
        s = line.strip()
        if s.startswith("//"):
            s = s[2:]
        else:
            s = re.sub(r"^/\*+", "", s)
            s = re.sub(r"\*+/$", "", s)
            s = re.sub(r"^\*(?!\*)", "", s)
        out.append(_heading(s[1:] if s.startswith(" ") else s))
    return "\n".join(out).strip("\n")


def cuda_sections(text: str) -> list:
    """Cut a CUDA/C++ source into sections: comment runs are the prose."""
    lines = _lines(text)
    sections, cur = [], None
    new = _namer(sections)
    i = 0
    while i < len(lines):
        s = lines[i].lstrip()
        if s.startswith("//") or s.startswith("/*"):
            j = i
            if s.startswith("/*"):
                while j < len(lines) and "*/" not in lines[j]:
                    j += 1
                j += 1
            while j < len(lines) and lines[j].lstrip().startswith("//"):
                j += 1
            block = lines[i:j]
            if cur is None or cur.code_src:
                cur = new(slug(_uncomment_c(block)))
            cur.prose_src.extend(block)
            cur.prose = (cur.prose + "\n\n" + _uncomment_c(block)).strip("\n")
            i = j
            continue
        if cur is None:
            cur = new("top")
        if not s.strip() and not cur.code_src and cur.prose_src:
            cur.prose_src.append(lines[i])
        else:
            cur.code_src.append(lines[i])
            if "__global__" in lines[i]:
                m = re.search(r"\b([A-Za-z_]\w*)\s*\(", lines[i].split("__global__", 1)[1])
                if m:
                    cur.names.append(m.group(1))
        i += 1
    _unique_names(sections)
    return sections


def file_sections(path: str, text: str) -> list:
    """Sections of the file at ``path`` (its ``text`` already read, exactly)."""
    if path.endswith((".cu", ".cuh")):
        return cuda_sections(text)
    return python_sections(text)


def module_summary(text: str) -> str:
    """The first paragraph of a Python module's docstring (for the index), or ""."""
    doc = ast.get_docstring(ast.parse(text)) or ""
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")
