"""Stop and resume the training examples: a run killed (SIGKILL) at any step and resumed with
``--resume`` ends exactly where the run never stopped ends — every parameter, optimizer moment,
random state and the whole loss trace equal bit for bit, and the same RESULT line (timings
aside). Also: a resume with other options is refused, ``--text`` refusals, and
``python -m minitx train`` finding the examples.

The runs are tiny (a few dozen steps of a one-layer model), in subprocesses with tqdm and
matplotlib off; each kill lands on a checkpoint line the run prints, while the run goes on, so
the moment it takes effect varies (sometimes during the next step or the next save).
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import REPO

from minitx.backend import read_npz

ENV = dict(os.environ, MINITX_NO_TQDM="1", MINITX_NO_MATPLOTLIB="1", MINITX_BACKEND="numpy")
STEPS = 14
TINY = {
    "char_gpt": ["--chars", "20000", "--steps", str(STEPS), "--block", "16", "--d-model", "16",
                 "--layers", "1", "--heads", "2", "--batch-size", "4", "--sample-len", "10"],
    "sentiment": ["--train-size", "64", "--test-size", "32", "--epochs", "2", "--batch-size",
                  "16", "--d-model", "16"],
    "seq2seq": ["--steps", "10", "--train-size", "200", "--test-size", "20", "--min-len", "2",
                "--max-len", "4", "--batch-size", "8", "--d-model", "16", "--heads", "2",
                "--layers", "1"],
    "lra_listops": ["--variants", "mha,performer", "--min-len", "10", "--max-len", "30",
                    "--train-size", "60", "--test-size", "20", "--steps", "6", "--batch-size",
                    "4", "--d-model", "16"],
    "look_inside": ["--chars", "20000", "--steps", "6", "--block", "16", "--d-model", "16",
                    "--features", "16", "--layers", "1", "--heads", "2"],
}
TIMINGS = {"train_time_s", "ms_per_char", "step_ms", "wall_s", "out", "pictures"}


def command(name, out, *extra):
    return [sys.executable, str(REPO / "examples" / f"{name}.py"), *TINY[name], "--out",
            str(out), *extra]


def result(stdout):
    """The RESULT line's JSON without timings and paths, which differ between any two runs."""
    def strip(v):
        return ({k: strip(x) for k, x in v.items() if k not in TIMINGS} if isinstance(v, dict)
                else v)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, stdout[-2000:]
    return strip(json.loads(lines[-1][len("RESULT "):]))


def finish(name, out, *extra):
    proc = subprocess.run(command(name, out, *extra), capture_output=True, text=True, env=ENV,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def killed(name, out, at_line, every):
    """Run until the run prints its ``at_line``-th checkpoint line, then SIGKILL it."""
    proc = subprocess.Popen(command(name, out, "--checkpoint-every", str(every)),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=ENV)
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("checkpoint: step ")
        if seen == at_line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.stdout.close()
    return proc.wait(timeout=240)


def checkpoints(out):
    """{file: {entry: array}} of every checkpoint in ``out``."""
    return {f: read_npz(out / f) for f in sorted(os.listdir(out)) if f.endswith(".npz")}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for f in a:
        assert a[f].keys() == b[f].keys(), f
        for key in a[f]:
            np.testing.assert_array_equal(a[f][key], b[f][key], err_msg=f"{f}: {key}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each example's run never stopped: its RESULT and its checkpoint after the last step."""
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp_path_factory.mktemp(f"whole_{name}")
            stdout = finish(name, out, "--checkpoint-every", "1000")   # only after the last
            cache[name] = result(stdout), checkpoints(out)
        return cache[name]
    return get


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(1, STEPS - 1), every=st.integers(1, 3))
def test_char_gpt_killed_at_a_random_step_resumes_bit_for_bit(uninterrupted, tmp_path_factory,
                                                               at, every):
    whole, final = uninterrupted("char_gpt")
    out = tmp_path_factory.mktemp("killed")
    # the at-th step's checkpoint line (or the last save's, when every > 1)
    code = killed("char_gpt", out, at_line=max(1, at // every), every=every)
    assert code in (-signal.SIGKILL, 0), code
    saved = read_npz(out / "checkpoint.npz")             # a whole file, whenever it was killed
    stdout = finish("char_gpt", out, "--checkpoint-every", str(every), "--resume")
    step = json.loads(str(saved["header"][()]))["step"]
    assert f"resumed from {out / 'checkpoint.npz'} at step {step} of {STEPS}" in stdout
    assert result(stdout) == whole                       # the RESULT line, timings aside
    resumed = checkpoints(out)
    assert_identical(resumed, final)                     # every array, the loss trace too
    losses = json.loads(str(resumed["checkpoint.npz"]["header"][()]))["extra"]["losses"]
    assert len(losses["json"]) == STEPS


@pytest.mark.parametrize("name, at_line", [("sentiment", 3), ("seq2seq", 2),
                                           ("lra_listops", 4), ("look_inside", 2)])
def test_every_training_example_resumes_to_the_same_result(uninterrupted, tmp_path, name,
                                                           at_line):
    whole, final = uninterrupted(name)
    killed(name, tmp_path, at_line=at_line, every=2)
    stdout = finish(name, tmp_path, "--checkpoint-every", "2", "--resume")
    assert "resumed from" in stdout
    assert result(stdout) == whole
    assert_identical(checkpoints(tmp_path), final)


def test_a_resume_with_another_batch_size_is_refused(tmp_path):
    finish("seq2seq", tmp_path, "--checkpoint-every", "5")
    before = (tmp_path / "checkpoint.npz").read_bytes()
    proc = subprocess.run(command("seq2seq", tmp_path, "--checkpoint-every", "5", "--resume",
                                  "--batch-size", "4"), capture_output=True, text=True,
                          env=ENV, timeout=240)
    assert proc.returncode == 2
    assert "--batch-size: checkpoint 8, now 4" in proc.stderr
    assert (tmp_path / "checkpoint.npz").read_bytes() == before


def test_resume_without_a_checkpoint_starts_at_step_zero(tmp_path):
    stdout = finish("seq2seq", tmp_path, "--resume")
    assert "no checkpoint at" in stdout and "starting from step 0" in stdout


# ---- char_gpt --text ----------------------------------------------------------------------

@pytest.mark.parametrize("content, why", [
    (None, "does not exist"), (b"", "is empty"), (b"abc\x00def" * 10, "binary"),
    (b"\xff\xfe caf\xe9" * 10, "not UTF-8"), (b"abcdefgh", "has 8 characters; a context of 16"),
    (b"a" * 40, "one distinct character"), ("folder", "is a folder")])
def test_char_gpt_refuses_a_bad_text_naming_the_file(tmp_path, content, why):
    path = tmp_path / "my text.txt"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    proc = subprocess.run(command("char_gpt", tmp_path / "out", "--text", str(path)),
                          capture_output=True, text=True, env=ENV, timeout=240)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert f"--text {str(path)!r}" in proc.stderr and why in proc.stderr, proc.stderr


def test_char_gpt_trains_on_the_users_text(tmp_path):
    text = "ab\u00e9c" * 4 + "d"                           # 17 characters: context 16 + 1
    path = tmp_path / "mine.txt"
    path.write_text(text, encoding="utf-8")
    stdout = finish("char_gpt", tmp_path / "out", "--text", str(path))
    assert f"17 characters of {path}" in stdout and "5 distinct" in stdout
    r = result(stdout)
    assert set(r["sample"]) <= set(text)                  # it samples the user's characters
    assert r["sample"].startswith(text[:4])               # from the text's opening


def test_train_finds_the_examples_and_passes_help_through(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "minitx", "train", "char_gpt", "--help"],
                          capture_output=True, text=True, env=ENV, timeout=240,
                          cwd=str(REPO))
    assert proc.returncode == 0
    assert "--checkpoint-every" in proc.stdout and "--resume" in proc.stdout
    assert "--text FILE" in proc.stdout
