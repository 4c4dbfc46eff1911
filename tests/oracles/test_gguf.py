"""``minitx.pretrained.gguf`` against the ``gguf`` package (llama.cpp's own Python reader,
the oracle): every tensor of SmolLM2-135M-Instruct's and Gemma 3 270M's files dequantizes
bit for bit as ``gguf.quants.dequantize`` does, in the same shape; the metadata reads the
same; and random blocks of every format minitx reads dequantize bit for bit too."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import need

from minitx.pretrained import real
from minitx.pretrained.gguf import BLOCKS, GGML_TYPES, GGUFFile, dequantize

gguf = need("gguf")

FILES = {"smollm2": (real.smollm2_gguf, {"F32", "Q4_1", "Q8_0"}),
         "gemma3": (real.gemma3_gguf, {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"})}


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_every_tensor_and_key_of_the_real_files_equals_the_gguf_package(name):
    find, formats = FILES[name]
    path = find()
    if path is None:
        pytest.skip(f"needs {name}'s GGUF file: {real.FETCH_COMMAND}")
    ref = gguf.GGUFReader(str(path))
    with GGUFFile(path) as mine:
        assert list(mine.tensors) == [t.name for t in ref.tensors]
        seen = set()
        for t in ref.tensors:
            want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            got = mine.dequantize(t.name)
            seen.add(mine.tensors[t.name].type_name)
            assert got.shape == want.shape, t.name
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
        assert seen == formats
        fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert mine.metadata.keys() == fields.keys()
        for key, value in fields.items():
            assert mine.metadata[key] == value, key


_QUANTS = [n for n in BLOCKS if n not in ("F32", "F16", "BF16")]
_IDS = {v: k for k, v in GGML_TYPES.items()}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(_QUANTS), n=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_random_blocks_of_every_format_equal_the_gguf_package(name, n, seed):
    """Any bytes at all, but float16 scales that are finite (an infinite scale times a zero
    q is NaN on both sides, and NaN payloads need not agree)."""
    per, size = BLOCKS[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    halves = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[name]
    for at in halves:
        raw[:, at:at + 2] = (rng.standard_normal(n) * 4.0 ** rng.integers(-6, 4, n)).astype(
            "<f2").view(np.uint8).reshape(n, 2)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(_IDS[name]))
    got = dequantize(raw.reshape(-1), name, (n, per))
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
