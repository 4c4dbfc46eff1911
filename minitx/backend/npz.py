"""Reading and writing ``.npz`` checkpoints safely (``Module.save``/``load``,
``minitx.save_checkpoint``, ``minitx.save``/``load`` of a state dict): host files, host arrays.

Reading: NumPy's ``np.load`` with ``allow_pickle=False`` never unpickles, but it reports a broken
file in its own words and allocates an entry before it knows the file holds it. ``read_npz``
checks every entry's ``.npy`` header against the archive first and names the file and the entry
in every refusal.

Writing: ``write_npz`` never leaves a half-written file where a checkpoint was. It writes the
whole archive to ``<path>.tmp`` beside the target, flushes it and ``fsync``s it to the disk, and
only then renames it over the target with ``os.replace`` (atomic on POSIX and Windows within one
folder), then ``fsync``s the folder so the rename itself survives a power cut (POSIX only). A
failure, a Ctrl-C or a kill at any moment leaves either the old file or the new one:

    kill during the write / flush / fsync   the old file, plus a stray ``<path>.tmp``
    exception or Ctrl-C at the same points  the old file; ``<path>.tmp`` removed
    kill after the rename                   the new file

The temporary has a fixed name, so the next save overwrites a stray one: however many kills,
at most one stray file.
"""
from __future__ import annotations

import contextlib
import os
import zipfile

import numpy
from numpy.lib import format as npy

# the package's one device -> host transfer (backend/__init__.py defines it, then imports us)
from . import to_host

__all__ = ["CheckpointError", "read_npz", "temporary_path", "write_npz", "save", "load"]


class CheckpointError(ValueError):
    """A checkpoint file minitx will not read; the message names the file (and the entry)."""


def read_npz(path) -> dict:
    """The arrays of an ``.npz`` file, read safely: {entry name: NumPy array}.

    Refused, with the file and the entry named, before any entry's data is allocated: a file
    that is not a zip archive (a ``.npy`` or a text file renamed ``.npz``), a truncated or
    corrupt archive, an entry that is not an ``.npy`` array, an object (pickled) array, and an
    entry whose header claims more bytes than the archive holds for it.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"checkpoint {path!r} is a folder, not an .npz file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    with open(path, "rb") as fh:
        head = fh.read(6)
    if not zipfile.is_zipfile(path):
        if head.startswith(b"PK"):
            raise CheckpointError(f"checkpoint {path!r} is truncated or corrupt: its zip "
                                  "directory is missing")
        what = "a .npy array" if head == b"\x93NUMPY" else "not a zip archive"
        raise CheckpointError(f"checkpoint {path!r} is not an .npz archive ({what}); save "
                              "checkpoints with Module.save")
    state = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else None
                if name is None:
                    raise CheckpointError(f"checkpoint {path!r}: entry {info.filename!r} is not "
                                          "an .npy array")
                with archive.open(info) as fp:
                    try:
                        version = npy.read_magic(fp)
                        reader = (npy.read_array_header_1_0 if version == (1, 0)
                                  else npy.read_array_header_2_0)
                        shape, fortran, dtype = reader(fp)
                    except ValueError as exc:
                        raise CheckpointError(f"checkpoint {path!r}: entry {name!r} has no "
                                              f"valid .npy header ({exc})") from exc
                    if dtype.hasobject:
                        raise CheckpointError(f"checkpoint {path!r}: entry {name!r} holds "
                                              "Python objects (pickled data), which minitx never "
                                              "loads")
                    need = dtype.itemsize
                    for n in shape:
                        need *= n
                    have = info.file_size - fp.tell()
                    if need > have:
                        raise CheckpointError(f"checkpoint {path!r}: entry {name!r} claims "
                                              f"{shape} {dtype} ({need} bytes) but holds "
                                              f"{have} bytes")
                    data = fp.read(need)
                array = numpy.frombuffer(data, dtype=dtype)
                state[name] = (array.reshape(shape[::-1]).T if fortran
                               else array.reshape(shape)).copy()
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path!r} is truncated or corrupt: {exc}") from exc
    return state


# --- writing --------------------------------------------------------------------------------

def temporary_path(path) -> str:
    """Where ``write_npz`` writes before the rename: ``<path>.tmp``, in the same folder (a
    rename across folders, possibly across file systems, would not be atomic)."""
    return os.fspath(path) + ".tmp"


def write_npz(path, arrays) -> str:
    """Write ``arrays`` ({entry name: array}) as an uncompressed ``.npz`` at ``path``, atomically
    (module docstring): the old file or the new one, never a broken one. Returns ``path``.

    The layout is ``numpy.savez``'s (one ``<name>.npy`` per entry in a zip archive), written
    here through a file object so that no ``.npz`` suffix is added and any name is an entry
    (``savez(file, **arrays)`` would take an entry called ``file`` as its own argument). Object
    arrays are refused (``allow_pickle=False``), before the target is touched.
    An ``OSError`` (disk full, read-only folder, ...) is raised again naming ``path``.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write checkpoint {path!r}: it is a folder")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write checkpoint {path!r}: folder {folder!r} does not "
                                "exist")
    arrays = {str(name): numpy.asarray(a) for name, a in arrays.items()}
    for name, array in arrays.items():
        if array.dtype.hasobject:
            raise TypeError(f"checkpoint {path!r}: entry {name!r} holds Python objects; only "
                            "plain numeric (or string) arrays are written")
    tmp = temporary_path(path)
    try:
        # 1. the whole archive into <path>.tmp, then flushed from Python's buffer and the OS's
        with open(tmp, "wb") as fh:
            _write_archive(fh, arrays)
            fh.flush()
            os.fsync(fh.fileno())
        # 2. one atomic rename: from here on the target is the new file
        os.replace(tmp, path)
    except BaseException as exc:            # an error, Ctrl-C: no stray file, the old one kept
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"checkpoint not written, the file there before (if any) is "
                          f"unchanged: {exc.strerror or exc}", path) from exc
        raise
    # 3. make the rename durable: fsync the folder's entry list (POSIX; Windows cannot open a
    # folder). Some file systems refuse a folder fsync; the file is in place either way.
    if os.name == "posix":
        with contextlib.suppress(OSError):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return path


def _write_archive(fh, arrays: dict) -> None:
    """``numpy.savez``'s layout on an open binary file: a zip archive (stored, not deflated;
    Zip64 so that entries over 4 GiB work) with one ``.npy`` per entry."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as entry:
                npy.write_array(entry, array, allow_pickle=False)


# --- PyTorch's torch.save / torch.load, for a state dict ----------------------------------------

def save(state_dict, f) -> str:
    """``minitx.save(model.state_dict(), path)``: a state dict (a mapping of names to arrays or
    Tensors) written to ``path`` as an ``.npz`` archive, atomically (``write_npz``), in its
    order. PyTorch's ``torch.save`` pickles any object; this writes plain arrays only, so
    ``load`` never unpickles. Returns ``path`` (no suffix is added)."""
    if not hasattr(state_dict, "items") or not callable(state_dict.items):
        kind = type(state_dict).__name__
        raise TypeError(
            f"save: expects a state dict (a mapping of names to arrays), got {kind}; for a "
            "module write minitx.save(model.state_dict(), path) or model.save(path), for a "
            "training run (model, optimizer, schedule, step) minitx.save_checkpoint")
    for name in state_dict:
        if not isinstance(name, str):
            raise TypeError(f"save: state dict keys must be strings (names), got {name!r}")
    return write_npz(f, {name: to_host(value) for name, value in state_dict.items()})


def load(f, map_location=None, *, weights_only: bool = True) -> dict:
    """``minitx.load(path)``: the state dict ``save`` wrote, as {name: NumPy array} in its
    order (read safely: ``read_npz``), ready for ``model.load_state_dict``, which copies each
    array onto the module's device. ``map_location`` may be None or "cpu" (the arrays are
    read to the host, PyTorch's ``map_location="cpu"``); ``weights_only`` may only be True
    (PyTorch's default since 2.6): nothing is ever unpickled."""
    if map_location not in (None, "cpu"):
        raise ValueError(f"load: map_location must be None or 'cpu' (the arrays are read to "
                         f"the host; load_state_dict moves them to the module's device), got "
                         f"{map_location!r}")
    if weights_only is not True:
        raise ValueError("load: weights_only must be True: minitx reads plain arrays and "
                         f"never unpickles, got {weights_only!r}")
    return read_npz(f)
