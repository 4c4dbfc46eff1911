"""``benchmarks/gpu_run.py``, the prepared GPU run, rehearsed on the CPU: its dry run passes end
to end on the strict CuPy stand-in, prints each step's budget once (together at most 300 s),
writes at most 8 small files and a summary naming every step; a step made to fail is reported
as failed while the others still run, a step that hangs is killed by its watchdog; the suite's
budget plugin skips the tests it has no time for, naming the budget; the JUnit XML is read
into the summary's counts."""
import gzip
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from support import REPO

ROOT = str(REPO)
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_run.py")
STEP_NAMES = ("versions", "suite", "programs", "flash kernels", "engine", "sanitizers",
              "models")


def _gpu_run():
    """The script as a module (registered first: its dataclasses look themselves up)."""
    if "gpu_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_run", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_run"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gpu_run"]


def _run(out, *args, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    e.update(PYTHON=sys.executable, **(env or {}))
    return subprocess.run([sys.executable, SCRIPT, "--dry-run", *args, str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=e)


def _status_rows(summary):
    """{step number: (status, cell of key numbers)} from summary.md's table."""
    rows = {}
    for m in re.finditer(r"^\| (\d) ([a-z ]+) \| ([A-Z ]+) \| [^|]+ \| (.*) \|$", summary, re.M):
        rows[int(m.group(1))] = (m.group(3), m.group(4))
    return rows


@pytest.mark.slow
def test_dry_run_end_to_end_with_one_step_failing(tmp_path):
    out = tmp_path / "out"
    p = _run(out, env={"GPU_RUN_FAIL_STEP": "3"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    budgets = [int(b) for b in re.findall(r"budget (\d+) s", p.stdout)]
    assert len(budgets) == len(STEP_NAMES), p.stdout[:2000]       # each printed once
    assert sum(budgets) <= 300

    files = sorted(os.listdir(out))
    assert len(files) <= 8 and "summary.md" in files, files
    for f in files:
        assert (out / f).stat().st_size < 250_000, f
    with gzip.open(out / "suite-junit.xml.gz", "rt") as fh:
        assert "<testsuite" in fh.read()

    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary in p.stdout                                   # printed at the end too
    rows = _status_rows(summary)
    assert sorted(rows) == list(range(1, len(STEP_NAMES) + 1)), summary
    for n, name in enumerate(STEP_NAMES, 1):
        assert f"| {n} {name} |" in summary
    # the injected failure is reported, and it is the step's only failure: its programs ran
    assert rows[3][0] == "FAILED"
    section = summary.split("### step 3 programs: FAILED")[1].split("###")[0]
    assert "injected failure (GPU_RUN_FAIL_STEP=3)" in section
    assert [ln for ln in section.splitlines() if ln.startswith("- ")] == \
        ["- injected failure (GPU_RUN_FAIL_STEP=3): exit 1"]
    assert "tour" in rows[3][1] and "within noise" in rows[3][1]
    # every other step ran after it, each passing or saying why it skipped in a dry run
    for n in (1, 2, 5):
        assert rows[n][0] == "OK", (n, rows[n])
    assert rows[6][0] == "SKIPPED" and "skipped in dry run" in rows[6][1]
    assert "passed" in rows[2][1] and "failed" not in rows[2][1]
    # step 7: every 2025 variant, one pretrained family per kind, the decoders, each named
    assert rows[7][0] == "OK", rows[7]
    assert "variants: 8 of 8 agree with NumPy in float64" in rows[7][1], rows[7]
    assert "pretrained (float32 logits, CuPy vs NumPy): dense " in rows[7][1], rows[7]
    assert "MoE " in rows[7][1] and "decoders on CuPy: llama fwd+bwd" in rows[7][1], rows[7]
    assert "GOAL" not in summary and "engine per op" in summary   # the goals' section
    if importlib.util.find_spec("torch") is None:
        # step 4's check compares each family with PyTorch's float64 SDPA: without PyTorch
        # (the README's set-up) the step skips, naming it
        assert rows[4][0] == "SKIPPED", rows[4]
        assert "skipped in dry run: needs PyTorch" in rows[4][1], rows[4]
        return
    assert rows[4][0] == "OK", rows[4]
    # step 4's dry run checks every kernel family in the emulation, each with its own kernels
    # (gpu_flash selects a family through MINITX_FLASH_KERNEL: the emulated launcher reads it)
    flash = (out / "flash.log").read_text(encoding="utf-8")
    errors = {}
    for ln in flash.splitlines():
        m = re.match(r".{28} (tc|simt|naive|tf32) +(\S+ +\S+ +\S+ +\S+ +\S+) .* ok$", ln)
        if m:
            errors.setdefault(m.group(1), []).append(m.group(2))
    assert sorted(errors) == ["naive", "simt", "tc", "tf32"], flash[-3000:]
    assert errors["tf32"] != errors["simt"] and errors["naive"] != errors["simt"]
    assert "check all cases pass" in rows[4][1]


def test_a_hanging_step_is_killed_and_the_next_still_runs(tmp_path):
    out = tmp_path / "out"
    p = _run(out, "--steps", "1,6", env={"GPU_RUN_FAIL_STEP": "1:timeout"}, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = _status_rows((out / "summary.md").read_text(encoding="utf-8"))
    assert sorted(rows) == [1, 6]
    assert rows[1][0] == "TIMEOUT"
    assert rows[6][0] == "SKIPPED"          # ran: a dry run skips the sanitizers, saying why
    budgets = {s.number: str(s.budget) for s in _gpu_run().STEPS}
    assert re.findall(r"budget (\d+) s", p.stdout) == [budgets[1], budgets[6]]   # these only


def test_usage_errors_exit_2(tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, "--steps", "8", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--steps" in p.stderr
    p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "OUT_DIR" in p.stderr


@pytest.mark.parametrize("past, outcome", [(True, "2 skipped"), (False, "2 passed")])
def test_the_suite_budget_plugin_skips_tests_started_after_the_deadline(tmp_path, past, outcome):
    (tmp_path / "test_two.py").write_text("def test_a():\n    pass\n\n\ndef test_b():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.path.join(ROOT, "benchmarks")
    env["GPU_RUN_SUITE_DEADLINE"] = "0" if past else "1e12"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_run", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "-rs", "test_two.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert outcome in p.stdout, p.stdout + p.stderr
    if past:
        assert _gpu_run().BUDGET_SKIP in p.stdout


def test_the_plugin_deselects_tests_that_use_the_emulation_harness(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef emu_lib():\n    return 'lib'\n")
    (tmp_path / "test_mixed.py").write_text(
        "def test_host(emu_lib):\n    pass\n\n\ndef test_device():\n    pass\n")
    listed = tmp_path / "deselected.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=os.path.join(ROOT, "benchmarks"), GPU_RUN_DESELECTED=str(listed))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_run", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "test_mixed.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert "1 passed, 1 deselected" in p.stdout, p.stdout + p.stderr
    assert listed.read_text().split() == ["test_mixed.py::test_host"]


def test_junit_results_are_counted(tmp_path):
    g = _gpu_run()
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.test_a" name="test_bad" time="0.1">'
        '<failure message="AssertionError: 1 != 2">trace</failure></testcase>'
        '<testcase classname="tests.test_a" name="test_cpu" time="0">'
        '<skipped type="pytest.skip" message="needs nvcc">x</skipped></testcase>'
        f'<testcase classname="tests.test_b" name="test_late" time="0">'
        f'<skipped type="pytest.skip" message="{g.BUDGET_SKIP}">x</skipped></testcase>'
        '</testsuite></testsuites>', encoding="utf-8")
    counts, failed, skips, left = g._suite_results(str(xml), "")
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "left out by the budget": 1}
    assert failed == ["tests.test_a::test_bad — AssertionError: 1 != 2"]
    assert dict(skips) == {"needs nvcc": 1} and left == ["tests.test_b::test_late"]


def test_every_cpu_only_file_named_exists():
    """The suite's one selection names files that exist (else the GPU run would run them)."""
    g = _gpu_run()
    missing = [name for name in g.CPU_ONLY_BY_DESIGN if not g._find_tests(name)]
    assert not missing, f"CPU_ONLY_BY_DESIGN names files that are gone: {missing}"
    assert all(g._find_tests(name) for name in g.DRY_RUN_SUITE)


def test_a_rerun_takes_what_failed_errored_or_was_left_out(tmp_path):
    """``--rerun-from``: the node ids of an earlier run's JUnit XML that did not pass, in pytest's
    spelling (file path, class, name with its parameters); passed and skipped tests stay out,
    and so do files now CPU-only by design."""
    g = _gpu_run()
    cases = [
        '<testcase classname="tests.fast.test_adam" name="test_bits[a-1]"><failure message="x"/>'
        '</testcase>',
        '<testcase classname="tests.core.test_backend" name="test_ok"/>',
        '<testcase classname="tests.attention.test_registry_contract" name="test_gradcheck[mla]">'
        f'<skipped message="{g.BUDGET_SKIP}"/></testcase>',
        '<testcase classname="tests.nn.test_nn" name="test_skip"><skipped message="no GPU"/>'
        '</testcase>',
        '<testcase classname="tests.fast.test_erf" name="test_e"><error message="boom"/></testcase>',
        '<testcase classname="" name="tests.docs.test_course_notes"><error message="import"/>'
        '</testcase>',
    ]
    xml = '<testsuites><testsuite name="pytest">' + "".join(cases) + "</testsuite></testsuites>"
    with gzip.open(tmp_path / "suite-junit.xml.gz", "wt", encoding="utf-8") as fh:
        fh.write(xml)
    assert g.rerun_ids(str(tmp_path)) == [
        "tests/fast/test_adam.py::test_bits[a-1]",
        "tests/attention/test_registry_contract.py::test_gradcheck[mla]",
        "tests/fast/test_erf.py::test_e"]            # test_course_notes.py: CPU-only by design
    p = _run(tmp_path / "out", "--steps", "2", "--rerun-from", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "--rerun-from needs an earlier OUT_DIR" in p.stderr


def test_a_dry_rerun_runs_those_tests_on_the_stand_in(tmp_path):
    xml = ('<testsuites><testsuite><testcase classname="tests.ops.test_softmax" '
           'name="test_jacobian_times_g_equals_backward[shape1--1]"><failure message="x"/>'
           '</testcase></testsuite></testsuites>')
    with gzip.open(tmp_path / "suite-junit.xml.gz", "wt", encoding="utf-8") as fh:
        fh.write(xml)
    out = tmp_path / "out"
    p = _run(out, "--steps", "2", "--rerun-from", str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "rerun of 1 tests" in summary and "1 passed" in summary, summary
