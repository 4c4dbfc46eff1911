"""The decoder chapters' proof boxes: each file of those chapters gets its boxes, each box sits
beside a section its page has, and a wrong number fails the build. The proofs are computed
as the build computes them, on NumPy whatever the backend (``build.numpy_backend``)."""
import pytest

from support import need

need("markdown_it")

from minitx.site import build as site_build  # noqa: E402
from minitx.site import decoder_proofs, proofs  # noqa: E402
from minitx.site.source import file_sections  # noqa: E402

from support import REPO  # noqa: E402

FILES = ("minitx/nn/decoder_layers.py", "minitx/nn/rotary.py", "minitx/nn/moe.py",
         "minitx/models/decoder.py", "minitx/pretrained/families.py")


@pytest.fixture(scope="module")
def pages():
    with site_build.numpy_backend():
        return decoder_proofs.decoder_proofs(proofs.Sizes.make(True), seed=0)


def test_each_decoder_file_is_in_the_course_and_has_proofs(pages):
    course = {path for _, _, files in site_build.COURSE for path in files}
    for path in FILES:
        assert path in course, path
        assert pages.get(path), f"no proof box for {path}"


def test_each_box_sits_beside_a_section_of_its_page(pages):
    for path, found in pages.items():
        with open(f"{REPO}/{path}", encoding="utf-8") as fh:
            sections = file_sections(path, fh.read())
        anchors = {s.anchor for s in sections} | {n for s in sections for n in s.names}
        for proof in found:
            assert proof.anchor in anchors, (path, proof.anchor)
            assert all(line[3] for line in proof.lines), (path, proof.name)


def test_the_family_table_box_names_every_family(pages):
    """The table is a note (descriptions, not numbers: no threshold to show beside them)."""
    table = next(p for p in pages["minitx/pretrained/families.py"] if p.name == "family_table")
    assert not table.lines
    for kind in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma3_text",
                 "olmo2", "gpt_oss", "deepseek_v3"):
        assert f"{kind} (" in table.note, kind
    assert "llama (Llama-3.2-1B): RMSNorm, pre · SwiGLU · RoPE llama3 · GQA 32/8" in table.note


def test_all_proofs_includes_the_decoders(monkeypatch):
    monkeypatch.setattr(proofs, "op_proofs", lambda sizes, seed: [])
    monkeypatch.setattr(proofs, "REGISTRY", {})
    with site_build.numpy_backend():
        found = proofs.all_proofs(quick=True, seed=0)
    assert set(FILES) <= set(found)


def test_a_missed_threshold_fails_the_build():
    box = proofs.Proof("x", "x")
    with pytest.raises(proofs.ProofFailure, match="decoding"):
        box.check("decoding through the caches vs the full forward", 1e-3, 1e-12)
