"""Notes every few lines: in the course's Python files, no more than 15 lines of code in a row
without a note.

A *note* line is a line that carries a comment — its own line (``# …``) or the end of a line of
code (``x = f(y)  # why``) — or a line inside a docstring (module, class or function); blank
lines are neutral; every other line is *code*. A *run* is a maximal sequence of code lines with
no note line between them (blank lines do not break a run). The course's files are those of the
site's chapters before the appendices (``minitx.site.build.COURSE``), notebooks included.

A trailing comment counts because a note serves reading where it stands: beside the line it
explains is the best place for it, and the rule must never push a note away from its line to
a line of its own, or ask for a note where the code already says everything.

A failure names each file and the line ranges of its runs that are too long.
"""
import ast
import io
import os
import tokenize


from support import REPO, need

MAX_RUN = 15

need("markdown_it")
from minitx.site.build import COURSE  # noqa: E402


def note_lines(text: str) -> set:
    """1-based numbers of the note lines of Python source ``text``."""
    notes = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                notes.update(range(body[0].lineno, body[0].end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:                # its own line, or trailing
            notes.add(tok.start[0])
    return notes


def code_runs(text: str) -> list:
    """[(first line, last line, code lines)] of every run of code lines, in order."""
    notes = note_lines(text)
    runs, start, last, count = [], None, None, 0
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue                                   # blank: neutral
        if number in notes:
            if count:
                runs.append((start, last, count))
            start, count = None, 0
            continue
        if count == 0:
            start = number
        last, count = number, count + 1
    if count:
        runs.append((start, last, count))
    return runs


def course_python_files() -> list:
    return [path for _, _, files in COURSE for path in files
            if path.endswith(".py") and os.path.exists(os.path.join(REPO, path))]


# ---- the rule itself, on sources whose runs are known ---------------------------------------

def test_a_run_counts_code_lines_and_blank_lines_do_not_break_it():
    text = ('"""Module docstring,\n\nover three lines."""\n'    # 1-3: notes
            "import os\n\nx = 1\n"                              # 4, 6: code (5 blank)
            "# a note\n"                                        # 7: note
            "def f():\n"                                        # 8: code
            '    """f\'s docstring."""\n'                       # 9: note
            "    y = '# not a note: a string'\n"                # 10: code
            "    z = y\n"                                       # 11: code
            "    return z  # a trailing comment is a note\n")   # 12: note
    assert sorted(note_lines(text)) == [1, 2, 3, 7, 9, 12]
    assert code_runs(text) == [(4, 6, 2), (8, 8, 1), (10, 11, 2)]


def test_a_long_stretch_of_code_is_one_run():
    text = "# start\n" + "".join(f"v{i} = {i}\n" for i in range(20)) + "# end\nw = 0\n"
    assert code_runs(text) == [(2, 21, 20), (23, 23, 1)]


# ---- the course -----------------------------------------------------------------------------

def test_the_course_has_python_files_to_check():
    files = course_python_files()
    assert "minitx/attention/classic.py" in files and "minitx/ops/sdpa.py" in files
    assert "minitx/ops/attention_maths.py" in files
    assert not any(path.startswith("minitx/fast/") for path in files)


def test_no_more_than_15_lines_of_code_without_a_note():
    offenders = []
    for path in course_python_files():
        with open(os.path.join(REPO, path), encoding="utf-8") as fh:
            long_runs = [r for r in code_runs(fh.read()) if r[2] > MAX_RUN]
        if long_runs:
            ranges = ", ".join(f"{a}-{b} ({n} lines)" for a, b, n in long_runs)
            offenders.append(f"{path}: {ranges}")
    assert not offenders, (f"{len(offenders)} course files have more than {MAX_RUN} lines of "
                           "code without a note:\n" + "\n".join(offenders))
