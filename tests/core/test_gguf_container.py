"""``minitx.pretrained.gguf`` on files written here, byte by byte, from the layout in its
docstring: the header, every metadata value type, the tensor table, the alignment, and each
malformed file's error. The block formats are checked against their formulas evaluated
element by element in plain Python (the bit-equality with llama.cpp's own Python is
``tests/oracles/test_gguf.py``)."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitx.pretrained.gguf import BLOCKS, GGUFError, GGUFFile, dequantize


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALARS = {int: (5, "<i"), float: (6, "<f"), bool: (7, "<?")}


def _value(v, vtype=None) -> bytes:
    """A (type, value) pair as GGUF writes it."""
    if isinstance(v, str):
        return struct.pack("<I", 8) + _string(v)
    if isinstance(v, list):
        etype, body = (8, b"".join(_string(x) for x in v)) if v and isinstance(v[0], str) \
            else (5, b"".join(struct.pack("<i", x) for x in v))
        return struct.pack("<IIQ", 9, etype, len(v)) + body
    if vtype is not None:
        code, fmt = vtype
        return struct.pack("<I", code) + struct.pack(fmt, v)
    code, fmt = _SCALARS[type(v)]
    return struct.pack("<I", code) + struct.pack(fmt, v)


def write_gguf(path, metadata, tensors, alignment=32, magic=b"GGUF", version=3,
               cut=None, type_override=None, offset_shift=0):
    """A GGUF file: ``tensors`` {name: (ggml type id, NumPy shape, raw bytes)}."""
    head = magic + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, v in metadata.items():
        head += _string(key) + (_value(*v) if isinstance(v, tuple) else _value(v))
    data, offsets = b"", []
    for name, (ggml_type, shape, raw) in tensors.items():
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += raw
    for (name, (ggml_type, shape, raw)), off in zip(tensors.items(), offsets):
        head += _string(name) + struct.pack("<I", len(shape))
        head += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        head += struct.pack("<IQ", type_override if type_override is not None else ggml_type,
                            off + offset_shift)
    head += b"\0" * (-len(head) % alignment)
    blob = head + data
    path.write_bytes(blob[:cut] if cut is not None else blob)
    return path


def _f32(shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype("<f4")
    return a, (0, shape, a.tobytes())


def test_the_header_metadata_and_tensors_read_back(tmp_path):
    a, ta = _f32((3, 5))
    b = np.arange(8, dtype="<f2").reshape(2, 4)
    meta = {"general.architecture": "llama", "llama.block_count": 30,
            "llama.rope.freq_base": 10000.0, "tokenizer.ggml.add_bos_token": False,
            "tokenizer.ggml.tokens": ["<s>", "a", "ü"], "tokenizer.ggml.token_type": [3, 1, 1],
            "u64": (2**40 + 3, (10, "<Q")), "f64": (0.1, (12, "<d")),
            "i8": (-5, (1, "<b"))}
    path = write_gguf(tmp_path / "m.gguf", meta, {"a": ta, "b": (1, (2, 4), b.tobytes())})
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == 32
        assert f.metadata["llama.block_count"] == 30
        assert f.metadata["llama.rope.freq_base"] == 10000.0
        assert f.metadata["tokenizer.ggml.add_bos_token"] is False
        assert f.metadata["tokenizer.ggml.tokens"] == ["<s>", "a", "ü"]
        assert f.metadata["tokenizer.ggml.token_type"] == [3, 1, 1]
        assert f.metadata["u64"] == 2**40 + 3 and f.metadata["f64"] == 0.1
        assert f.metadata["i8"] == -5
        assert list(f.tensors) == ["a", "b"]
        assert f.tensors["a"].shape == (3, 5) and f.tensors["a"].type_name == "F32"
        assert f.tensors["b"].offset % 32 == 0
        np.testing.assert_array_equal(f.dequantize("a"), a)
        assert f.dequantize("b", dtype="float64").dtype == np.float64
        np.testing.assert_array_equal(f.dequantize("b"), b.astype(np.float32))
        assert bytes(f.raw("a")) == a.tobytes()


def test_a_larger_alignment_is_honoured(tmp_path):
    a, ta = _f32((1, 3))
    c, tc = _f32((2, 2), seed=1)
    path = write_gguf(tmp_path / "m.gguf", {"general.alignment": (64, (4, "<I"))},
                      {"a": ta, "c": tc}, alignment=64)
    with GGUFFile(path) as f:
        assert f.alignment == 64 and f.data_offset % 64 == 0
        np.testing.assert_array_equal(f.dequantize("c"), c)


@pytest.mark.parametrize("case, match", [
    ("magic", "bad magic number b'GGML'"),
    ("version", "GGUF version 7 is not read"),
    ("truncated header", "truncated: metadata"),
    ("beyond the end", "end beyond the end of the file"),
    ("unknown type", "unknown ggml type 99"),
    ("unread type", r"ggml type 10 \(Q2_K\) is not read"),
    ("off alignment", "is not a multiple of the alignment 32"),
    ("tiny", "truncated: 2 bytes"),
])
def test_a_malformed_file_is_refused_naming_the_place(tmp_path, case, match):
    _, ta = _f32((4, 8))
    meta = {"general.architecture": "llama", "llama.block_count": 3}
    path = tmp_path / "bad.gguf"
    if case == "magic":
        write_gguf(path, meta, {"a": ta}, magic=b"GGML")
    elif case == "version":
        write_gguf(path, meta, {"a": ta}, version=7)
    elif case == "truncated header":
        write_gguf(path, meta, {"a": ta}, cut=40)
    elif case == "beyond the end":
        write_gguf(path, meta, {"a": ta}, cut=-4)
    elif case == "unknown type":
        write_gguf(path, meta, {"a": ta}, type_override=99)
    elif case == "unread type":
        write_gguf(path, meta, {"a": ta}, type_override=10)
    elif case == "off alignment":
        write_gguf(path, meta, {"a": ta}, offset_shift=4)
    else:
        path.write_bytes(b"GG")
    with pytest.raises(GGUFError, match=match) as err:
        GGUFFile(path)
    assert str(path) in str(err.value)


def test_a_tensor_name_missing_is_a_key_error(tmp_path):
    _, ta = _f32((2, 2))
    with GGUFFile(write_gguf(tmp_path / "m.gguf", {}, {"a": ta})) as f:
        with pytest.raises(KeyError, match="no tensor 'b'"):
            f.dequantize("b")


def test_dequantize_checks_its_arguments():
    with pytest.raises(GGUFError, match="whole blocks of 32"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (1, 30))
    with pytest.raises(GGUFError, match="takes 34 bytes, got 33"):
        dequantize(np.zeros(33, np.uint8), "Q8_0", (1, 32))
    with pytest.raises(GGUFError, match="ggml_type must be one of"):
        dequantize(np.zeros(4, np.uint8), "Q9_9", (1,))


# ---- the block formats, from their formulas ------------------------------------------------

def _half(b: bytes, at: int) -> float:
    return float(np.frombuffer(b[at:at + 2], "<f2")[0])


def _f(x):
    return np.float32(x)


def _scale_min_k4(j, s):
    """llama.cpp's get_scale_min_k4, written from its bit layout."""
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def _formula(name: str, b: bytes) -> list:
    """One block's values, element by element, in float32, from the formula of the docstring
    and llama.cpp's bit layout (dequantize_row_* in ggml-quants.c, transcribed)."""
    out = [None] * BLOCKS[name][0]
    if name == "Q8_0":
        d = _f(_half(b, 0))
        return [d * _f(np.int8(np.uint8(q))) for q in b[2:34]]
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        d = _f(_half(b, 0))
        m = _f(_half(b, 2)) if name.endswith("_1") else None
        qh = int.from_bytes(b[4:8] if name == "Q5_1" else b[2:6], "little")
        qs = b[{"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8}[name]:]
        for j in range(16):
            lo, hi = qs[j] & 0x0F, qs[j] >> 4
            if name.startswith("Q5"):
                lo |= ((qh >> j) & 1) << 4
                hi |= ((qh >> (j + 16)) & 1) << 4
            if m is not None:
                out[j], out[j + 16] = d * _f(lo) + m, d * _f(hi) + m
            else:
                off = 8 if name == "Q4_0" else 16
                out[j], out[j + 16] = d * _f(lo - off), d * _f(hi - off)
        return out
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _f(_half(b, 0)), _f(_half(b, 2))
        s = b[4:16]
        qh = b[16:48] if name == "Q5_K" else None
        ql = b[48:] if name == "Q5_K" else b[16:]
        for c in range(4):                                 # 64 values per chunk of 32 bytes
            for half in range(2):
                sc, mn = _scale_min_k4(2 * c + half, s)
                d1, m1 = d * _f(sc), dmin * _f(mn)
                for l in range(32):
                    q = (ql[32 * c + l] >> (4 * half)) & 0x0F
                    if qh is not None:
                        q += 16 * ((qh[l] >> (2 * c + half)) & 1)
                    out[64 * c + 32 * half + l] = d1 * _f(q) - m1
        return out
    if name == "Q6_K":
        ql, qh, sc = b[0:128], b[128:192], np.frombuffer(b[192:208], np.int8)
        d = _f(_half(b, 208))
        for n in range(2):
            for l in range(32):
                i = l // 16
                q1 = ((ql[64 * n + l] & 0xF) | (((qh[32 * n + l] >> 0) & 3) << 4)) - 32
                q2 = ((ql[64 * n + l + 32] & 0xF) | (((qh[32 * n + l] >> 2) & 3) << 4)) - 32
                q3 = ((ql[64 * n + l] >> 4) | (((qh[32 * n + l] >> 4) & 3) << 4)) - 32
                q4 = ((ql[64 * n + l + 32] >> 4) | (((qh[32 * n + l] >> 6) & 3) << 4)) - 32
                base, s8 = 128 * n, 8 * n
                out[base + l] = d * _f(sc[s8 + i]) * _f(q1)
                out[base + l + 32] = d * _f(sc[s8 + i + 2]) * _f(q2)
                out[base + l + 64] = d * _f(sc[s8 + i + 4]) * _f(q3)
                out[base + l + 96] = d * _f(sc[s8 + i + 6]) * _f(q4)
        return out
    raise AssertionError(name)


def _random_blocks(name, n, rng):
    """n random blocks whose float16 fields are finite (every other byte is any value)."""
    per, size = BLOCKS[name]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    halves = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[name]
    for at in halves:
        raw[:, at:at + 2] = rng.uniform(-2, 2, n).astype("<f2").view(np.uint8).reshape(n, 2)
    return raw


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]),
       rows=st.integers(1, 3), blocks=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_each_block_format_is_its_formula(name, rows, blocks, seed):
    per, size = BLOCKS[name]
    raw = _random_blocks(name, rows * blocks, np.random.default_rng(seed))
    got = dequantize(raw.reshape(-1), name, (rows, blocks * per))
    want = np.array([v for blk in raw for v in _formula(name, bytes(blk))], np.float32)
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_bf16_is_the_upper_half_of_a_float32():
    x = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    raw = (x.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    np.testing.assert_array_equal(dequantize(raw, "BF16", (4,)), x)


def test_a_tensor_read_in_many_chunks_equals_it_read_whole(tmp_path, monkeypatch):
    import minitx.pretrained.gguf as gguf_module
    raw = _random_blocks("Q4_K", 10 * 2, np.random.default_rng(4)).reshape(-1)
    path = write_gguf(tmp_path / "m.gguf", {}, {"w": (12, (10, 512), raw.tobytes())})
    monkeypatch.setattr(gguf_module, "CHUNK_BYTES", 3 * 512 * 4)       # 3 rows at a time
    with GGUFFile(path) as f:
        np.testing.assert_array_equal(f.dequantize("w"), dequantize(raw, "Q4_K", (10, 512)))
