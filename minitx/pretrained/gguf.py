r"""Read a GGUF file — llama.cpp's model container — and dequantize its tensors, plainly.

The layout (little-endian throughout; version 3, and 2, which has the same layout)::

    ┌───────────────────────────────────────────────┐
    │ magic  "GGUF"           4 bytes               │
    │ version                 uint32 (2 or 3)       │
    │ tensor count T          uint64                │
    │ metadata count K        uint64                │
    ├───────────────────────────────────────────────┤
    │ K × (key: string, type: uint32, value)        │  the metadata: "llama.block_count" = 30 …
    ├───────────────────────────────────────────────┤
    │ T × (name: string, n_dims: uint32,            │  the tensor table
    │      dims: n_dims × uint64, type: uint32,     │
    │      offset: uint64)                          │
    ├───────────────────────────────────────────────┤
    │ padding to a multiple of the alignment A      │  A = general.alignment, default 32
    ├───────────────────────────────────────────────┤
    │ the data section: tensor i at start + offset  │  each offset a multiple of A
    └───────────────────────────────────────────────┘

A string is a uint64 byte length and UTF-8 bytes. A value's type is one of ``VALUE_TYPES``; an
array is an element type (uint32), a count (uint64) and the elements. A tensor's ``dims`` are
ggml's order, the fastest-varying first: dims (576, 49152) is the NumPy shape (49152, 576),
and ``TensorInfo.shape`` gives it NumPy's way round.

**Block formats.** A quantized tensor is a run of blocks, each of a fixed number of bytes that
codes a fixed number of consecutive values (rows of the NumPy shape are whole blocks). Within
a block, $d$ and $m$ are float16 scales, $q$ small unsigned integers, and ``dequantize`` gives
the float32 values:

- ``F32``, ``F16``, ``BF16``: the numbers themselves (BF16: the upper half of a float32).
- ``Q8_0`` (32 values, 34 bytes): $x_i = d\,q_i$, $q_i$ a signed byte.
- ``Q4_0`` (32 values, 18 bytes): $x_i = d\,(q_i - 8)$, $q_i$ four bits.
- ``Q4_1`` (32 values, 20 bytes): $x_i = d\,q_i + m$.
- ``Q5_0`` (32 values, 22 bytes): $x_i = d\,(q_i - 16)$, $q_i$ five bits.
- ``Q5_1`` (32 values, 24 bytes): $x_i = d\,q_i + m$, $q_i$ five bits.
- ``Q4_K`` (256 values, 144 bytes): a super-block of 8 sub-blocks of 32, each with a 6-bit
  scale $s_j$ and a 6-bit minimum $n_j$: $x_i = (d\,s_j)\,q_i - d_{min}\,n_j$, $q_i$ four bits.
- ``Q5_K`` (256 values, 176 bytes): the same with five-bit $q_i$.
- ``Q6_K`` (256 values, 210 bytes): 16 sub-blocks of 16, each with a signed 8-bit scale
  $s_j$: $x_i = (d\,s_j)\,(q_i - 32)$, $q_i$ six bits.

Where the bits of $q$ sit (the low four bits of one byte hold value $i$ and its high four bits
value $i + 16$, or $i + 32$ in a K-quant …) is spelled out in each decoder below. Each is
written plainly from the formula and proven bit-equal to the ``gguf`` package's
``quants.dequantize`` (llama.cpp's own Python, the test oracle) on every tensor of SmolLM2's
and Gemma 3's files and on random blocks of every format. The products are taken in the order
the formulas write them, in float32 (that order is what makes the results bit-equal).

Errors — a bad magic number, an unknown version or type, a truncated file, a tensor that ends
beyond the file, an offset off the alignment — are a ``GGUFError`` (a ValueError) naming the
file and, where there is one, the tensor or key. The file is memory-mapped: a tensor's bytes
are read from disk when it is dequantized, and nothing is loaded twice.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "dequantize", "GGML_TYPES", "VALUE_TYPES",
           "BLOCKS"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
CHUNK_BYTES = 4 << 20      # GGUFFile.dequantize decodes about this many output bytes at a time

#: metadata value type id → (name, NumPy dtype or None for string/array/bool)
VALUE_TYPES = {0: ("uint8", "<u1"), 1: ("int8", "<i1"), 2: ("uint16", "<u2"),
               3: ("int16", "<i2"), 4: ("uint32", "<u4"), 5: ("int32", "<i4"),
               6: ("float32", "<f4"), 7: ("bool", "<u1"), 8: ("string", None),
               9: ("array", None), 10: ("uint64", "<u8"), 11: ("int64", "<i8"),
               12: ("float64", "<f8")}

#: ggml tensor type id → name (the ones this reader dequantizes; others are refused by name)
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
# names of the other ggml types, so that a refusal names what it met
_OTHER_TYPES = {9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
                18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
                23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
                29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}

#: format name → (values per block, bytes per block)
BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18),
          "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q4_K": (256, 144),
          "Q5_K": (256, 176), "Q6_K": (256, 210)}


class GGUFError(ValueError):
    """A GGUF file that cannot be read as one (the message names the file and the place)."""


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table. ``shape`` is NumPy's order (ggml's dims reversed);
    ``offset`` is from the start of the file; ``n_bytes`` is what its blocks take."""
    name: str
    shape: tuple
    ggml_type: int
    type_name: str
    offset: int
    n_bytes: int


# ---------------------------------------------------------------------------- block decoders
# Each takes the blocks as a (n_blocks, bytes per block) uint8 array and returns the values,
# (n_blocks, values per block) float32.

def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row → the float16 they hold, as float32 (n_blocks, 1)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes → (n, 2k): the low four bits of byte i are value i, the high four bits
    value i + k."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q8_0(b):
    """Q8_0: d (f16) · 32 signed bytes q; x_i = d q_i."""
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b):
    """Q4_0: d · 16 bytes of nibbles; x_i = d (q_i − 8)."""
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return _f16(b[:, :2]) * q.astype(np.float32)


def _q4_1(b):
    """Q4_1: d, m · 16 bytes of nibbles; x_i = d q_i + m."""
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's four bytes, a little-endian uint32 whose bit i is bit 4 of value i."""
    bits = np.ascontiguousarray(qh).view("<u4")                       # (n, 1)
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(b):
    """Q5_0: d · 4 bytes of fifth bits · 16 bytes of nibbles; x_i = d (q_i − 16)."""
    q = (_nibbles(b[:, 6:]) | (_fifth_bits(b[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)
    return _f16(b[:, :2]) * q.astype(np.float32)


def _q5_1(b):
    """Q5_1: d, m · 4 bytes of fifth bits · 16 bytes of nibbles; x_i = d q_i + m."""
    q = _nibbles(b[:, 8:]) | (_fifth_bits(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _k_scales(s: np.ndarray):
    """The 12 scale bytes of Q4_K/Q5_K → eight 6-bit scales and eight 6-bit minima.

    Bytes 0–3 hold scales 0–3 in their low six bits, bytes 4–7 minima 0–3; scales and minima
    4–7 take their low four bits from bytes 8–11 (low and high nibble) and their top two bits
    from the top two bits of bytes 0–3 (scales) and 4–7 (minima)."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scale = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    minimum = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """K-quant nibbles: each 32-byte chunk c holds sub-block 2c in its low four bits and
    sub-block 2c + 1 in its high four bits → (n, sub-blocks, 32)."""
    chunks = qs.reshape(len(qs), -1, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(len(qs), -1, 32)


def _q4_k(b):
    """Q4_K: d, d_min (f16) · 12 scale bytes · 128 bytes of nibbles;
    x = (d s_j) q − d_min n_j in sub-block j."""
    n = len(b)
    scale, minimum = _k_scales(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * scale)[:, :, None]
    dm = (_f16(b[:, 2:4]) * minimum)[:, :, None]
    q = _k_nibbles(b[:, 16:]).astype(np.float32)
    return (d * q - dm).reshape(n, 256)


def _q5_k(b):
    """Q5_K: d, d_min · 12 scale bytes · 32 bytes of fifth bits · 128 bytes of nibbles.

    Bit j of fifth-bit byte l is bit 4 of value l of sub-block j."""
    n = len(b)
    scale, minimum = _k_scales(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * scale)[:, :, None]
    dm = (_f16(b[:, 2:4]) * minimum)[:, :, None]
    qh = (b[:, 16:48][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (_k_nibbles(b[:, 48:]) | (qh << 4)).astype(np.float32)
    return (d * q - dm).reshape(n, 256)


def _q6_k(b):
    """Q6_K: 128 bytes of low nibbles (ql) · 64 bytes of high bit pairs (qh) · 16 signed
    scale bytes · d; x = (d s_j)(q − 32), sub-block j of 16 values.

    Each half (128 values) uses 64 ql bytes and 32 qh bytes: its four runs of 32 values take
    the low nibbles of ql[0:32], of ql[32:64], the high nibbles of ql[0:32], of ql[32:64],
    and bits 0–1, 2–3, 4–5, 6–7 of qh[0:32] as their top two bits."""
    n = len(b)
    ql = b[:, :128].reshape(n, 2, 2, 32)                                # half, ql run, l
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)                  # half, run of 4, l
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
    q = (low | ((qh & 3) << 4)).astype(np.int8) - np.int8(32)
    d = (_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


_DECODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def _type_name(ggml_type: int, where: str) -> str:
    if ggml_type in GGML_TYPES:
        return GGML_TYPES[ggml_type]
    known = _OTHER_TYPES.get(ggml_type)
    what = f"ggml type {ggml_type} ({known})" if known else f"unknown ggml type {ggml_type}"
    raise GGUFError(f"{where}: {what} is not read by minitx; it reads "
                    f"{', '.join(GGML_TYPES.values())}")


def n_bytes(type_name: str, shape) -> int:
    """Bytes a tensor of this format and NumPy shape takes (its last axis whole blocks)."""
    per_block, size = BLOCKS[type_name]
    count = int(np.prod(shape, dtype=np.int64))
    return count // per_block * size


def dequantize(raw, ggml_type, shape, dtype="float32") -> np.ndarray:
    """The values of one tensor from its raw bytes: ``raw`` a uint8 buffer of exactly
    ``n_bytes``, ``ggml_type`` an id or a name of ``BLOCKS``, ``shape`` NumPy's order.
    Float32 for the quantized formats (then cast to ``dtype``)."""
    name = ggml_type if isinstance(ggml_type, str) else _type_name(int(ggml_type), "dequantize")
    if name not in BLOCKS:
        raise GGUFError(f"dequantize: ggml_type must be one of {', '.join(BLOCKS)}, got {name!r}")
    shape = tuple(int(s) for s in shape)
    per_block, size = BLOCKS[name]             # values and bytes per block
    if shape and shape[-1] % per_block:        # blocks run along the last axis, never across rows
        raise GGUFError(f"dequantize: a {name} tensor's last axis must be whole blocks of "
                        f"{per_block}, got shape {shape}")
    raw = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if raw.size != n_bytes(name, shape):
        raise GGUFError(f"dequantize: a {name} tensor of shape {shape} takes "
                        f"{n_bytes(name, shape)} bytes, got {raw.size}")
    # the float formats are views (BF16 is float32's top half); the others decode block by block
    if name == "F32":
        out = raw.view("<f4")
    elif name == "F16":
        out = raw.view("<f2")
    elif name == "BF16":
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        out = _DECODERS[name](raw.reshape(-1, size))
    return out.reshape(shape).astype(dtype, copy=False)


# ------------------------------------------------------------------------------- the reader

class _Cursor:
    """Reads little-endian fields from the mapped header, naming the file when it runs out."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str):
        """The next ``n`` bytes; ``what`` names the field in the error when the file ends."""
        if self.pos + n > len(self.buf):
            raise GGUFError(f"{self.path}: truncated: {what} at byte {self.pos} needs {n} "
                            f"bytes, the file has {len(self.buf)}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, dtype: str, what: str):
        """One number of NumPy ``dtype`` (little-endian), as a Python int or float."""
        dt = np.dtype(dtype)
        return np.frombuffer(self.take(dt.itemsize, what), dtype=dt)[0].item()

    def string(self, what: str) -> str:
        length = self.scalar("<u8", what)
        try:
            return bytes(self.take(length, what)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{self.path}: {what} is not UTF-8 ({exc})") from None

    def value(self, vtype: int, what: str):
        """One metadata value of type id ``vtype``: a number, a bool, a string or an array."""
        if vtype not in VALUE_TYPES:
            raise GGUFError(f"{self.path}: {what} has unknown value type {vtype}; expected "
                            f"one of {sorted(VALUE_TYPES)}")
        name, dtype = VALUE_TYPES[vtype]
        if name == "string":
            return self.string(what)
        if name == "array":                            # element type, count, elements
            etype = self.scalar("<u4", what)
            count = self.scalar("<u8", what)
            if etype in VALUE_TYPES and VALUE_TYPES[etype][1] is not None:
                dt = np.dtype(VALUE_TYPES[etype][1])   # numbers: one read, not count reads
                arr = np.frombuffer(self.take(count * dt.itemsize, what), dtype=dt)
                return (arr != 0).tolist() if etype == 7 else arr.tolist()
            return [self.value(etype, f"{what}[{i}]") for i in range(count)]
        v = self.scalar(dtype, what)
        return bool(v) if name == "bool" else v


class GGUFFile:
    """An open GGUF file: ``metadata`` {key: value} (str, int, float, bool or list),
    ``tensors`` {name: TensorInfo} in the file's order, ``version``, ``alignment``.

    ``raw(name)`` is a tensor's bytes (a read-only view of the mapped file), ``dequantize(name,
    dtype)`` its values. Use it in a ``with`` block, or call ``close()``."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = open(self.path, "rb")
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size < 4:
                raise GGUFError(f"{self.path}: truncated: {size} bytes, not a GGUF file")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._buf = np.frombuffer(self._map, dtype=np.uint8)
            self._read_header()
        except BaseException:
            self.close()
            raise

    def _read_header(self):
        cur = _Cursor(self._buf, self.path)
        # the header: magic, version, the two counts, then the metadata as (key, type, value)
        magic = bytes(cur.take(4, "the magic number"))
        if magic != MAGIC:
            raise GGUFError(f"{self.path}: bad magic number {magic!r}; a GGUF file starts "
                            f"with {MAGIC!r}")
        self.version = cur.scalar("<u4", "the version")
        if self.version not in VERSIONS:
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not read; minitx "
                            f"reads versions {', '.join(map(str, VERSIONS))}")
        n_tensors = cur.scalar("<u8", "the tensor count")      # versions 2 and 3: 64-bit
        n_kv = cur.scalar("<u8", "the metadata count")
        self.metadata = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}")
            vtype = cur.scalar("<u4", f"the type of {key!r}")
            self.metadata[key] = cur.value(vtype, f"metadata {key!r}")
        # tensors start at multiples of the alignment (32 bytes unless the metadata says)
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment must be a power of two, got "
                            f"{self.alignment}")
        # the tensor table: name, rank, dims (fastest first: reversed into NumPy's order), type
        # and offset from the data section, which starts at the next multiple of the alignment
        table = []
        for i in range(n_tensors):
            name = cur.string(f"tensor name {i}")
            n_dims = cur.scalar("<u4", f"the rank of tensor {name!r}")
            dims = [cur.scalar("<u8", f"the dims of tensor {name!r}") for _ in range(n_dims)]
            ggml_type = cur.scalar("<u4", f"the type of tensor {name!r}")
            offset = cur.scalar("<u8", f"the offset of tensor {name!r}")
            table.append((name, tuple(reversed(dims)), ggml_type, offset))
        start = -(-cur.pos // self.alignment) * self.alignment
        self.data_offset = start
        # every entry checked before any is read: whole blocks, aligned, inside the file, unique
        self.tensors = {}
        for name, shape, ggml_type, offset in table:
            where = f"{self.path}: tensor {name!r}"
            type_name = _type_name(ggml_type, where)
            per_block = BLOCKS[type_name][0]
            if shape and shape[-1] % per_block:
                raise GGUFError(f"{where}: shape {shape} is not whole {type_name} blocks of "
                                f"{per_block}")
            if offset % self.alignment:
                raise GGUFError(f"{where}: offset {offset} is not a multiple of the "
                                f"alignment {self.alignment}")
            size = n_bytes(type_name, shape)                # blocks × bytes per block
            if start + offset + size > len(self._buf):
                raise GGUFError(f"{where}: its {size} bytes at {start + offset} end beyond the "
                                f"end of the file ({len(self._buf)} bytes)")
            if name in self.tensors:
                raise GGUFError(f"{where}: the name appears twice in the tensor table")
            self.tensors[name] = TensorInfo(name, shape, ggml_type, type_name, start + offset,
                                            size)

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return self.tensors[name]

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a read-only uint8 view of the mapped file."""
        info = self._info(name)
        return self._buf[info.offset:info.offset + info.n_bytes]

    def dequantize(self, name: str, dtype="float32") -> np.ndarray:
        """The tensor's values, NumPy's shape, a new array of ``dtype``.

        Decoded a few rows at a time into the result, and the file's pages handed back to the
        system once read, so that loading a model holds its weights once and little else."""
        info = self._info(name)
        out = np.empty(info.shape, dtype=dtype)
        raw = self.raw(name)
        if out.size:
            rows = out.reshape(-1, info.shape[-1]) if out.ndim else out.reshape(1)
            row_bytes = info.n_bytes // len(rows)
            step = max(1, CHUNK_BYTES // max(1, rows.shape[-1] * 4))
            for r in range(0, len(rows), step):
                part = raw[r * row_bytes:(r + step) * row_bytes]
                rows[r:r + step] = dequantize(part, info.type_name,
                                              (len(part) // row_bytes,) + rows.shape[1:])
        del raw
        self._release(info.offset, info.n_bytes)
        return out

    def _release(self, offset: int, size: int) -> None:
        """Drop the mapped pages of these bytes from memory (clean pages of a read-only file:
        read again from disk if touched again)."""
        if hasattr(mmap, "MADV_DONTNEED") and size:
            start = offset - offset % mmap.PAGESIZE
            self._map.madvise(mmap.MADV_DONTNEED, start, offset + size - start)

    def close(self):
        """Release the mapping and the file (arrays from ``dequantize`` stay valid)."""
        self._buf = None
        if getattr(self, "_map", None) is not None:
            try:
                self._map.close()
            except BufferError:     # a raw() view is still alive; the GC releases it
                pass
            self._map = None
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"GGUFFile({self.path!r}, version {self.version}, {len(self.tensors)} tensors, "
                f"{len(self.metadata)} metadata keys)")
