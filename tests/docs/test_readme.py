"""The README's recipes run as written, and what it says they print is what they print: the
block under "A GPT, trained and sampled" is executed as is (with the fast layer on and off),
the anomaly example raises, and the front door stays short."""
import re

import pytest
from support import REPO

import minitx

README = REPO / "README.md"


def readme_section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"(?ms)^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text)
    assert section, f"README has no section '## {heading}'"
    return section.group(1)


def readme_block(heading: str, index: int = 0) -> str:
    """The ``index``-th fenced Python block under the ``## {heading}`` section of the README."""
    blocks = re.findall(r"(?ms)^```python\n(.*?)^```", readme_section(heading))
    assert len(blocks) > index, f"README section '## {heading}' has no ```python block {index}"
    return blocks[index]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_the_gpt_in_ten_lines_prints_what_the_readme_says(capsys, fast):
    code = readme_block("A GPT, trained and sampled")
    for needed in ("GPTConfig(", "GPT(", "model(x, y)", ".backward()", ".step()", ".generate("):
        assert needed in code, needed
    scope = {"__name__": "readme"}
    with minitx.using_config(fast=fast):
        exec(compile(code, str(README), "exec"), scope)
    printed = capsys.readouterr().out.splitlines()
    logits, loss, out = scope["logits"], scope["loss"], scope["out"]
    assert logits.shape == (8, 16, 256)
    assert out.shape == (1, 9 + 18)
    # the README's own words about the run, checked against it
    said = re.search(r"prints a loss of about ([0-9.]+) and `([^`]+)`",
                     " ".join(readme_section("A GPT, trained and sampled").split()))
    assert said, "the README no longer says what the block prints"
    assert abs(loss.item() - float(said.group(1))) < 0.05, loss.item()
    assert printed[-1] == said.group(2)            # the continuation, byte for byte


def test_the_anomaly_example_raises_naming_the_op():
    code = readme_block("Look inside a model", index=1)
    assert "detect_anomaly" in code
    with pytest.raises(minitx.autograd.AnomalyError, match="Log"):
        exec(compile(code, str(README), "exec"), {"__name__": "readme", "minitx": minitx})


def test_the_front_door_is_short_and_links_what_moved():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for doc in ("docs/architecture.md", "docs/testing.md", "docs/benchmarks.md", "docs/gpu.md",
                "docs/look_inside.md", "docs/pretrained.md"):
        assert f"]({doc})" in text, doc
        assert (REPO / doc).is_file(), doc


def test_read_it_gives_the_site_command():
    text = README.read_text(encoding="utf-8")
    assert 'python -m pip install ".[docs]" && python -m minitx site --out site' in text
    assert text.index("## The tour") < text.index("## The course") < \
        text.index("## A GPT, trained and sampled") < text.index("## The examples")
    first_screen = text[:text.index("## Set up")]
    assert "CuPy" not in first_screen.split("\n\n")[1]     # the opening paragraph is the learner's


def setup_commands() -> list:
    """The commands of the "Set up" section's bash block, without their comments."""
    block = re.search(r"(?ms)^```bash\n(.*?)^```", readme_section("Set up")).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_two_setup_commands_are_unchanged():
    assert setup_commands() == [
        "python -m pip install . && python -m minitx",
        'python -m pip install ".[test]" && python -m pytest -n auto --dist loadgroup '
        '-m "not slow"']


def test_ci_first_runs_the_readmes_two_commands_as_the_readme_sets_them_up():
    """CI's first pass runs each part of both commands verbatim (pip quietly), before any oracle
    is installed; the slow lane and the tests that skipped follow, with the oracles (pytest-
    xdist's options are the command's, not setup.cfg's)."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    first_pass = ci[ci.index("== pass 1"):ci.index("pip install --quiet torch")]
    for command in setup_commands():
        for part in command.split(" && "):
            assert part.replace("pip install ", "pip install --quiet ") in first_pass, part
    assert "MINITX_RECORD_SKIPPED" in first_pass and "== pass 2" in ci
    assert ci.count("python -m pytest -p no:cacheprovider -n auto --dist loadgroup") >= 2
    addopts = [line for line in (REPO / "setup.cfg").read_text(encoding="utf-8").splitlines()
               if line.startswith("addopts")]
    assert addopts and not any("-n" in line.split() for line in addopts), addopts
