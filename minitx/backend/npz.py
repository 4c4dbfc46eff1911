"""Reading ``.npz`` checkpoints safely (``Module.load``): host files, host arrays.

NumPy's ``np.load`` with ``allow_pickle=False`` never unpickles, but it reports a broken file in
its own words and allocates an entry before it knows the file holds it. This reader checks every
entry's ``.npy`` header against the archive first and names the file and the entry in every
refusal.
"""
from __future__ import annotations

import os
import zipfile

import numpy
from numpy.lib import format as npy

__all__ = ["read_npz", "CheckpointError"]


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
