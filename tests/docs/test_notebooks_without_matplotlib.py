"""The notebooks in a Python without matplotlib (the README's ``pip install ".[test]"``): each
takes pyplot from ``minitx.viz.notebook_pyplot``, which stops the notebook with one line naming
the extra to install and no traceback. Needs nothing beyond the test extra:
``MINITX_NO_MATPLOTLIB=1`` hides matplotlib where it is installed."""
import ast
import os
import subprocess
import sys

import pytest
from support import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.py"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_takes_pyplot_from_the_one_helper(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m and m.startswith("matplotlib") for m in imported), path.name
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "notebook_pyplot"]
    assert [c.args[0].value for c in calls] == [path.name]


def test_a_notebook_without_matplotlib_says_which_extra_in_one_line():
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env.update(MINITX_NO_MATPLOTLIB="1", MINITX_QUICK="1",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    script = REPO / "notebooks" / "01_attention_by_hand.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=str(REPO))
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.splitlines() == [
        '01_attention_by_hand.py draws its figures with matplotlib, which is not installed '
        'here: python -m pip install ".[viz]" (or ".[docs]")'], p.stdout + p.stderr
