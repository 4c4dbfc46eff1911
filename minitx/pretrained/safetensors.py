"""Read (and write) the safetensors checkpoint format, validating every byte we trust.

The format (https://huggingface.co/docs/safetensors) is deliberately tiny::

    ┌──────────────┬──────────────────────────────┬──────────────────────────────────┐
    │ 8 bytes      │ N bytes                      │ the data section                 │
    │ N (uint64,   │ a JSON object (UTF-8):       │ raw little-endian tensors, one   │
    │ little-end.) │ {name: {"dtype": "F32",      │ after another; tensor `name`     │
    │              │         "shape": [2, 3],     │ occupies bytes [begin, end) of   │
    │              │         "data_offsets":      │ this section                     │
    │              │             [begin, end]},   │                                  │
    │              │  "__metadata__": {str: str}} │                                  │
    └──────────────┴──────────────────────────────┴──────────────────────────────────┘

Why minitx reads it itself instead of importing the ``safetensors`` package: the format fits
in a screenful of code, a dependency is avoided, and — the point of the format — a checkpoint
is *data*, never code, so the reader's job is to validate before it trusts. ``read_header``
checks, before any tensor byte is touched:

- the header length is sane (≤ 100 MB, the reference implementation's limit) and inside
  the file; the header is valid UTF-8 JSON, an object of objects;
- every dtype is known, every shape a list of non-negative ints, every ``data_offsets`` a
  pair of ints 0 ≤ begin ≤ end;
- the byte length end − begin equals prod(shape) · itemsize;
- the tensors tile the data section exactly: sorted by offset they start at 0, do not
  overlap, leave no gap and end at the end of the file (**strict**, as the reference
  implementation is: a gap or trailing bytes would be bytes no tensor accounts for).

Every error is a ``SafetensorsError`` (a ValueError) naming the file and, where there is
one, the tensor's key. Tensors are then read with ``numpy.memmap`` — pages are read from
disk on demand and nothing is loaded twice — as read-only arrays; ``copy=True`` gives
ordinary in-memory arrays.

Pickle-based PyTorch checkpoints (``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``)
are refused: unpickling runs whatever code the file names (``refuse_pickle``).

bfloat16 has no NumPy dtype. A bfloat16 number is the upper 16 bits of a float32 (same sign
and 8-bit exponent, mantissa cut from 23 to 7 bits), so widening is exact and needs only
integer bit operations: ``(u16.astype(uint32) << 16).view(float32)``. ``load_file(...,
dtype="float32")`` does it (and widens float16 too); without a dtype a BF16 tensor raises.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

__all__ = ["SafetensorsError", "UnsafeCheckpointError", "DTYPES", "read_header", "load_file",
           "save_file", "bf16_to_float32", "float32_to_bf16", "refuse_pickle",
           "PICKLE_SUFFIXES"]

MAX_HEADER_BYTES = 100_000_000

# safetensors dtype name → NumPy dtype (little-endian). BF16 is stored as its raw uint16 bits.
DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAME_OF = {v.newbyteorder("="): k for k, v in DTYPES.items() if k != "BF16"}  # for save_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class SafetensorsError(ValueError):
    """A malformed or unsupported safetensors file (the message names the file and key)."""


class UnsafeCheckpointError(ValueError):
    """A pickle-based checkpoint, which minitx refuses to open."""


def refuse_pickle(path) -> None:
    """Raise ``UnsafeCheckpointError`` for a pickle-based checkpoint (``.bin``, ``.pt``, ...)."""
    raise UnsafeCheckpointError(
        f"{os.fspath(path)}: a pickle-based PyTorch checkpoint. minitx does not open these: "
        "unpickling can execute arbitrary code stored in the file. Use the model's "
        "model.safetensors instead (most HuggingFace models ship one), or convert it once in "
        "an environment you trust: `import torch; from safetensors.torch import save_file; "
        "save_file(torch.load(path, weights_only=True), 'model.safetensors')`.")


# ---- bfloat16 ----------------------------------------------------------------------------

def bf16_to_float32(bits):
    """uint16 bfloat16 bit patterns → float32 (exact): the bits become the float32's top half."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x):
    """float32 → uint16 bfloat16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))   # to nearest even
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # keep quiet NaN
    return out


# ---- the header --------------------------------------------------------------------------

def _fail(path, message, key=None):
    where = f"{path}" if key is None else f"{path}: tensor {key!r}"
    raise SafetensorsError(f"{where}: {message}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_header(path):
    """Parse and validate the header of ``path``.

    Returns ``(entries, metadata, data_start)``: entries {name: (dtype name, shape tuple,
    begin, end)} with offsets relative to the data section, metadata {str: str} (empty when
    absent) and the file offset where the data section starts (8 + N).
    """
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size < 8:
        _fail(path, f"file of {size} bytes is too short for the 8-byte header length")
    # The first 8 bytes hold N, the header's length (little-endian uint64): check it against
    # the limit and the file size before reading N bytes.
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n > MAX_HEADER_BYTES:
            _fail(path, f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes "
                        "(corrupt file, or not safetensors)")
        if 8 + n > size:
            _fail(path, f"header length {n} runs past the end of the file ({size} bytes): "
                        "truncated or not safetensors")
        raw = fh.read(n)
    # The header is a UTF-8 JSON object; "__metadata__" is its one entry that is not a tensor.
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        _fail(path, f"header is not valid UTF-8 JSON ({exc})")
    if not isinstance(header, dict):
        _fail(path, f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        _fail(path, "__metadata__ must map strings to strings")
    # Each tensor entry: exactly the three keys, a known dtype, a shape of non-negative ints
    # and a pair of integer offsets.
    data_size = size - 8 - n
    entries = {}
    for key, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            _fail(path, "entry must be an object with exactly dtype, shape and data_offsets, "
                        f"got {info!r}", key)
        dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in DTYPES:
            _fail(path, f"unknown dtype {dt!r} (known: {', '.join(DTYPES)})", key)
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            _fail(path, f"shape must be a list of non-negative ints, got {shape!r}", key)
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) for o in offsets)):
            _fail(path, f"data_offsets must be two ints [begin, end], got {offsets!r}", key)
        # Its byte range lies inside the data section and holds exactly prod(shape)·itemsize bytes.
        begin, end = offsets
        if not 0 <= begin <= end:
            _fail(path, f"data_offsets [{begin}, {end}] must satisfy 0 ≤ begin ≤ end", key)
        if end > data_size:
            _fail(path, f"data_offsets [{begin}, {end}] run past the data section of "
                        f"{data_size} bytes (truncated file?)", key)
        expected = math.prod(shape) * DTYPES[dt].itemsize
        if end - begin != expected:
            _fail(path, f"holds {end - begin} bytes but dtype {dt} and shape {shape} need "
                        f"{expected}", key)
        entries[key] = (dt, tuple(shape), begin, end)
    # strict tiling: sorted by offset the tensors must cover [0, data_size) with no overlap/gap
    cursor, previous = 0, None
    for key, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < cursor:
            _fail(path, f"bytes [{begin}, {end}) overlap tensor {previous!r} (which ends at "
                        f"{cursor})", key)
        if begin > cursor:
            _fail(path, f"gap of {begin - cursor} unaccounted bytes before it (at "
                        f"[{cursor}, {begin}))", key)
        cursor, previous = end, key
    if cursor != data_size:
        _fail(path, f"{data_size - cursor} bytes after the last tensor belong to no tensor")
    return entries, metadata, 8 + n


# ---- reading -----------------------------------------------------------------------------

def load_file(path, dtype=None, copy: bool = False, keys=None):
    """Read the tensors of a safetensors file: {name: NumPy array} (after ``read_header``).

    ``dtype``: None keeps each stored dtype (a BF16 tensor then raises, NumPy has no
    bfloat16); a floating dtype (e.g. "float32") converts every *floating* tensor to it
    (BF16 and F16 are widened exactly), integer and bool tensors are kept. ``copy=False``
    returns read-only arrays backed by a ``numpy.memmap`` of the file (a converted tensor is
    always a new array); ``copy=True`` returns ordinary writable arrays. ``keys``: read only
    these names (a missing one raises KeyError naming the file).
    """
    path = os.fspath(path)
    if path.lower().endswith(PICKLE_SUFFIXES):
        refuse_pickle(path)
    target = None if dtype is None else np.dtype(dtype)
    if target is not None and target.kind != "f":
        raise TypeError(f"load_file: dtype must be a floating dtype or None, got {target}")
    # Validate the whole header before touching a tensor byte; keys picks a subset.
    entries, _, start = read_header(path)
    if keys is not None:
        missing = [k for k in keys if k not in entries]
        if missing:
            raise KeyError(f"{path}: no tensor(s) named {missing}")
        entries = {k: entries[k] for k in keys}
    # Map the file once: each tensor is a zero-copy view of its byte range, reinterpreted with
    # its dtype and shape.
    whole = np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))   # pages load on demand
    out = {}
    for key, (dt, shape, begin, end) in entries.items():
        raw = whole[start + begin:start + end]
        arr = raw.view(DTYPES[dt]).reshape(shape)        # a view: no bytes copied yet
        # Conversions make new arrays: bf16 → float32 by a bit shift, a floating tensor to the
        # requested dtype, big-endian bytes to the host's order; copy=True copies the rest.
        if dt == "BF16":
            if target is None:
                _fail(path, "is bfloat16, which NumPy cannot hold; pass dtype='float32' "
                            "(or 'float64') to widen it", key)
            arr = bf16_to_float32(arr)
        if target is not None and arr.dtype.kind == "f" and arr.dtype != target:
            arr = arr.astype(target)
        elif not arr.dtype.isnative:                     # a big-endian host: swap once
            arr = arr.astype(arr.dtype.newbyteorder("="))
        elif copy:
            arr = np.array(arr)
        out[key] = arr
    return out


# ---- writing -----------------------------------------------------------------------------

def save_file(tensors, path, metadata=None) -> str:
    """Write {name: array} to ``path`` in the safetensors format (little-endian, tensors
    packed in name order, header padded with spaces to a multiple of 8 bytes as the
    reference writer does). ``metadata``: optional {str: str}. Returns the path."""
    path = os.fspath(path)
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("save_file: metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    # Tensors are packed back to back in name order; offsets count from the data section's start.
    for name in sorted(tensors):
        arr = np.asarray(getattr(tensors[name], "data", tensors[name]))
        if type(arr).__module__.startswith("cupy"):
            raise TypeError(f"save_file: tensor {name!r} is on the GPU; pass host arrays")
        native = arr.dtype.newbyteorder("=")
        if native not in _NAME_OF:
            raise TypeError(f"save_file: tensor {name!r} has unsupported dtype {arr.dtype}")
        blob = np.ascontiguousarray(arr, dtype=native.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAME_OF[native], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    # The header, padded with spaces to a multiple of 8 bytes (so the data section starts
    # 8-byte aligned), then the file: its length, the header, the tensor bytes.
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for blob in blobs:
            fh.write(blob)
    return path
