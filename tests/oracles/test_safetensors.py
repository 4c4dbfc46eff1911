"""minitx's safetensors reader: against the ``safetensors`` package (a test-only oracle)
for good files, and every kind of bad file raises ``SafetensorsError`` naming the file and
the key before any tensor is read."""
import json
import struct

import numpy as np
import pytest

from support import need

from minitx.pretrained.safetensors import (SafetensorsError, UnsafeCheckpointError,
                                           bf16_to_float32, float32_to_bf16, load_file,
                                           read_header, save_file)


def write_raw(path, header: dict, data: bytes, header_len=None):
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw) if header_len is None else header_len))
        fh.write(raw)
        fh.write(data)
    return str(path)


def good_tensors(rng):
    return {"w": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float64),
            "h": rng.standard_normal((2, 2)).astype(np.float16),
            "i": np.arange(-3, 3, dtype=np.int64), "u": np.arange(5, dtype=np.uint8),
            "m": np.array([True, False, True]), "e": np.zeros((0, 7), np.int32),
            "s": np.array(2.5, dtype=np.float32)}


def test_reads_what_the_reference_writes(tmp_path, rng):
    st = need("safetensors.numpy")
    tensors = good_tensors(rng)
    path = str(tmp_path / "ref.safetensors")
    st.save_file(tensors, path, metadata={"format": "np"})
    got = load_file(path)
    assert set(got) == set(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v)
        assert not got[k].flags.writeable                   # memory-mapped, read-only
    assert all(load_file(path, copy=True)[k].flags.writeable for k in tensors)
    entries, meta, start = read_header(path)
    assert meta == {"format": "np"} and start > 8 and entries["w"][:2] == ("F32", (3, 4))


def test_reference_reads_what_we_write(tmp_path, rng):
    st = need("safetensors.numpy")
    tensors = good_tensors(rng)
    path = save_file(tensors, tmp_path / "ours.safetensors", metadata={"who": "minitx"})
    got = st.load_file(path)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)


def test_bfloat16_widening_matches_torch(tmp_path, rng):
    torch = need("torch")
    st = need("safetensors.torch")
    x = torch.tensor(rng.standard_normal(1000) * 100, dtype=torch.float32)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    path = str(tmp_path / "bf16.safetensors")
    st.save_file({"x": x.to(torch.bfloat16), "f16": x.to(torch.float16)}, path)
    got = load_file(path, dtype="float32")
    want = x.to(torch.bfloat16).float().numpy()
    assert got["x"].dtype == np.float32
    assert np.array_equal(got["x"], want, equal_nan=True)                     # exact
    assert np.array_equal(got["f16"], x.to(torch.float16).float().numpy(), equal_nan=True)
    assert load_file(path, dtype="float64")["x"].dtype == np.float64
    with pytest.raises(SafetensorsError, match=r"bf16\.safetensors: tensor 'x'.*bfloat16"):
        load_file(path)                                    # NumPy has no bfloat16
    # our rounding (to nearest even) agrees with torch's float32 → bfloat16 conversion
    bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(float32_to_bf16(x.numpy())[4:], bits[4:])
    assert np.array_equal(bf16_to_float32(bits), want, equal_nan=True)


# ---- bad files: the error names the file and the key -------------------------------------

def test_truncated_file(tmp_path, rng):
    path = save_file({"w": np.ones((4, 4), np.float32)}, tmp_path / "t.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-10])
    with pytest.raises(SafetensorsError, match=r"t\.safetensors: tensor 'w'.*past the data"):
        load_file(path)
    open(path, "wb").write(data[:5])
    with pytest.raises(SafetensorsError, match=r"t\.safetensors.*too short"):
        load_file(path)


def test_header_length_out_of_file(tmp_path):
    path = write_raw(tmp_path / "h.safetensors", {}, b"", header_len=10_000)
    with pytest.raises(SafetensorsError, match=r"h\.safetensors.*past the end of the file"):
        read_header(path)
    path = write_raw(tmp_path / "huge.safetensors", {}, b"", header_len=2 ** 40)
    with pytest.raises(SafetensorsError, match=r"huge\.safetensors.*exceeds the limit"):
        read_header(path)


def test_header_not_json(tmp_path):
    path = tmp_path / "j.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(SafetensorsError, match=r"j\.safetensors.*not valid UTF-8 JSON"):
        read_header(str(path))
    path.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(SafetensorsError, match="must be a JSON object"):
        read_header(str(path))


@pytest.mark.parametrize("entry, message", [
    ({"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}, "unknown dtype 'F8_E4M3'"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "non-negative ints"),
    ({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}, "non-negative ints"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, "two ints"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "0 ≤ begin ≤ end"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, "holds 8 bytes but dtype F32"),
    ({"dtype": "F32", "shape": [2]}, "exactly dtype, shape and data_offsets"),
])
def test_bad_entries_name_the_key(tmp_path, entry, message):
    path = write_raw(tmp_path / "e.safetensors", {"layer.weight": entry}, b"\0" * 8)
    with pytest.raises(SafetensorsError, match=r"e\.safetensors: tensor 'layer\.weight'") as info:
        load_file(path)
    assert message in str(info.value)


def test_overlapping_gapped_and_out_of_file_offsets(tmp_path):
    f32 = lambda a, b: {"dtype": "F32", "shape": [(b - a) // 4], "data_offsets": [a, b]}  # noqa
    path = write_raw(tmp_path / "o.safetensors", {"a": f32(0, 8), "b": f32(4, 12)}, b"\0" * 12)
    with pytest.raises(SafetensorsError, match=r"o\.safetensors: tensor 'b'.*overlap tensor 'a'"):
        load_file(path)
    path = write_raw(tmp_path / "g.safetensors", {"a": f32(0, 4), "b": f32(8, 12)}, b"\0" * 12)
    with pytest.raises(SafetensorsError, match=r"tensor 'b'.*gap of 4 unaccounted bytes"):
        load_file(path)
    path = write_raw(tmp_path / "x.safetensors", {"a": f32(0, 4), "b": f32(4, 16)}, b"\0" * 12)
    with pytest.raises(SafetensorsError, match=r"x\.safetensors: tensor 'b'.*past the data"):
        load_file(path)
    path = write_raw(tmp_path / "tail.safetensors", {"a": f32(0, 4)}, b"\0" * 12)
    with pytest.raises(SafetensorsError, match=r"tail\.safetensors: 8 bytes after the last"):
        load_file(path)


def test_bad_metadata(tmp_path):
    path = write_raw(tmp_path / "m.safetensors", {"__metadata__": {"n": 3}}, b"")
    with pytest.raises(SafetensorsError, match="__metadata__ must map strings to strings"):
        read_header(path)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "x.ckpt"])
def test_pickle_checkpoints_are_refused(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"\x80\x04K\x01.")                    # a valid pickle of the int 1
    with pytest.raises(UnsafeCheckpointError, match=r"execute arbitrary code") as info:
        load_file(str(path))
    assert name in str(info.value) and "safetensors" in str(info.value)
