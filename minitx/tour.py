"""The tour that ``python -m minitx`` prints: attention, worked through, with every number computed.

Sections (each a function returning lines of text, so tests and the CLI can call them alone):

1. ``worked_example``: softmax(Q Kᵀ/√d_k) V for three 2-d tokens, step by step;
2. ``jacobian_section``: the softmax Jacobian diag(s) − s sᵀ, checked row by row against
   autograd;
3. ``variant_table``: every registered attention variant — kind, gradcheck, relative error
   against a named reference (a legend says what each compares), time and peak memory at
   N = 1,024, then each complexity; every line fits in 100 columns (``WIDTH``);
4. ``scale_section``: why 1/√d_k — the variance of q·k grows like d_k, and without the scale
   softmax saturates and its gradient vanishes;
5. ``pattern_section``: text pictures of the sparse attention patterns;
6. ``cache_section``: what each variant's decode cache holds per token;
7. ``decoder_section``: today's decoder families as minitx's loader reads them.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
import textwrap
import time
import tracemalloc

import numpy as np

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY, causal_pattern, dense_attention_array
from minitx.backend import to_host
from minitx.metrics import APPROX_BUDGETS, approx_distances
from minitx.models import kv_cache_bytes_per_token
from minitx.pretrained import families
from minitx.viz import render_mask

__all__ = ["worked_example", "jacobian_section", "variant_rows", "variant_table",
           "scale_section", "pattern_section", "decoder_section", "PATTERN_VARIANTS", "run_tour",
           "fmt_matrix", "fmt_bytes"]

PATTERN_VARIANTS = ("local", "dilated", "longformer", "bigbird", "strided", "fixed", "chunked")
# the default block (4) fills n = 16; chunks of 5 show a boundary that is not a block's
_PATTERN_OPTIONS = {"bigbird": {"block": 2}, "chunked": {"chunk_size": 5, "causal": True}}


def fmt_matrix(m, decimals: int = 4, indent: str = "    ") -> list:
    """Rows of a 2-d array as text lines, fixed decimals (what the tests search for)."""
    m = to_host(m).astype(float)
    return [indent + "[" + "  ".join(f"{v:{decimals + 3}.{decimals}f}" for v in row) + "]"
            for row in m]


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---- 1. the worked example ----------------------------------------------------------------

def worked_example() -> list:
    """Q = K = V = [[1,0],[0,1],[1,1]], d_k = 2: scores, weights, output, computed by minitx."""
    X = minitx.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype="float64")
    q = k = v = X
    d_k = q.shape[-1]
    scores = F.matmul(q, k.T) / math.sqrt(d_k)
    weights = F.softmax(scores, axis=-1)
    out = F.matmul(weights, v)
    lines = ["1. Attention by hand: three tokens, d_k = 2",
             "   Q = K = V = [[1, 0], [0, 1], [1, 1]]   (token 3 is the sum of tokens 1 and 2)",
             "",
             "   scores = Q Kᵀ / √d_k   (how well each query matches each key)"]
    lines += fmt_matrix(scores)
    lines += ["", "   weights = softmax(scores) along each row   (each row sums to 1)"]
    lines += fmt_matrix(weights)
    lines += ["", "   output = weights · V   (each token becomes a weighted mix of the values)"]
    lines += fmt_matrix(out)
    w = to_host(weights)
    lines += ["",
              f"   Token 3 matches itself best (score {float(to_host(scores)[2, 2]):.4f}), so it "
              f"keeps weight {w[2, 2]:.4f} on itself;",
              f"   tokens 1 and 2 split theirs between themselves and token 3 "
              f"({w[0, 0]:.4f} / {w[0, 1]:.4f} / {w[0, 2]:.4f})."]
    return lines


# ---- 2. the softmax Jacobian --------------------------------------------------------------

def jacobian_section() -> list:
    """J = diag(s) − s sᵀ from ``softmax_jacobian``, row i against autograd's ∂s_i/∂x."""
    values = [1.0, 2.0, 0.5, -1.0]
    x = minitx.tensor(values, dtype="float64")
    J = to_host(F.softmax_jacobian(x))
    rows = []
    for i in range(len(values)):
        xi = minitx.tensor(values, dtype="float64", requires_grad=True)
        F.softmax(xi, axis=-1)[i].backward()
        rows.append(to_host(xi.grad))
    auto = np.stack(rows)
    s = to_host(F.softmax(x))
    lines = ["2. The softmax Jacobian, checked against autograd",
             f"   x = {values},  s = softmax(x) = [" + ", ".join(f"{v:.4f}" for v in s) + "]",
             "   J = diag(s) − s sᵀ   (F.softmax_jacobian):"]
    lines += fmt_matrix(J)
    lines += ["   row i from autograd (backward of s_i alone):"]
    lines += fmt_matrix(auto)
    lines += [f"   max |J − autograd| = {np.abs(J - auto).max():.1e};  row sums of J: "
              f"max |Σ_j J_ij| = {np.abs(J.sum(1)).max():.1e}",
              "   (softmax outputs always sum to 1, so each row of J sums to 0)"]
    return lines


# ---- 3. every registered variant ----------------------------------------------------------

def _init_options(cls, n):
    """Options a variant needs to accept sequences of length ``n`` (e.g. ``max_len``)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return {}
    opts = {}
    if "max_len" in params:
        opts["max_len"] = max(n, 16)
    return opts


def _qkv(gen, b, h, n, d, dtype="float64", requires_grad=False):
    return [minitx.tensor(gen.standard_normal((b, h, n, d)), dtype=dtype,
                          requires_grad=requires_grad) for _ in range(3)]


def _gradcheck_variant(cls, name, embed=8, heads=2, n=6):
    layer = cls(embed, heads, **_init_options(cls, n))
    layer.to(dtype="float64")
    layer.eval()
    gen = np.random.default_rng(1)
    q, k, v = _qkv(gen, 1, heads, n, embed // heads, requires_grad=True)
    # fast: one random direction per input (two forwards each, not two per element); the
    # element-by-element check of every variant runs in tests/attention/test_registry_contract.py
    minitx.gradcheck(lambda a, b_, c: layer.attend(a, b_, c), (q, k, v), eps=1e-6, atol=1e-5,
                     rtol=1e-3, fast=True)
    return "pass"


def _reference_error(cls, embed=16, heads=2, n=32):
    """Relative error ‖out − ref‖/‖ref‖ of ``attend`` against the variant's reference."""
    layer = cls(embed, heads, **_init_options(cls, n))
    layer.to(dtype="float64")
    layer.eval()
    gen = np.random.default_rng(2)
    q, k, v = _qkv(gen, 1, heads, n, embed // heads)
    with minitx.no_grad():
        out = to_host(layer.attend(q, k, v))
    kind = layer.kind
    if kind in ("exact", "masked"):
        ref = dense_attention_array(q.data, k.data, v.data, allowed=layer.pattern(n))
        label = "dense" if kind == "exact" else "dense∘pattern"
    elif kind == "approximate":
        # The regime of benchmarks/approx_quality.py (minitx.metrics): a mid-sized budget,
        # q, k ~ N(0, 0.5²), N = 128; output distance ‖O − O*‖/‖O*‖ from exact attention.
        # Every row on the same random inputs (the legend adds Linformer on smooth ones).
        if cls.name in APPROX_BUDGETS:
            option, budgets, fixed = APPROX_BUDGETS[cls.name]
            budget = budgets[-2]
            _, err = approx_distances(cls.name, option, budget, fixed=fixed, smooth=False)
            short = {"num_features": "m", "proj_dim": "k", "n_hashes": "rounds",
                     "num_clusters": "clusters"}.get(option, option)
            return f"{err:.1e} full, {short}={budget}"
        allowed = causal_pattern(n) if layer.causal else None
        ref = dense_attention_array(q.data, k.data, v.data, allowed=allowed)
        label = "full"
    elif hasattr(layer, "reference"):
        ref = layer.reference(q.data, k.data, v.data)
        label = "formula"
    else:
        return "n/a"
    ref = to_host(ref)
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300)
    return f"{err:.1e} {label}"


def time_call(call, repeat: int = 5, loop_seconds: float = 0.02, clock=time.perf_counter,
              warm_up: bool = True, budget_s: float | None = None):
    """Seconds one ``call()`` takes, measured as ``timeit`` measures: one warm-up call first (a
    first call pays for caches, lazy imports and the allocator growing; ``warm_up=False`` when
    the caller has just made one), then up to ``repeat`` timed loops of ``number`` calls each,
    ``number`` doubled until one loop lasts ``loop_seconds`` (that loop is the first timed one);
    returns the best loop's time per call — the one least disturbed by other processes (the
    spread of the others is noise from the machine, never from the code). ``budget_s``: stop
    once the timed loops have taken this long, so that a slow call is timed once (on one
    thread, in CPU time, single warm calls of the slowest variants were measured to vary by
    under 3%). ``clock``: the wall clock, or ``time.process_time`` for the CPU time this
    process used (see ``_time_and_memory``)."""
    if warm_up:
        call()
    number, loops, spent, best = 1, 0, 0.0, float("inf")
    while True:                                   # calibrate: the last loop counts as timed
        t0 = clock()
        for _ in range(number):
            call()
        took = clock() - t0
        if took >= loop_seconds or number >= 1024:
            break
        number *= 2
    while True:
        loops, spent, best = loops + 1, spent + took, min(best, took / number)
        if loops >= repeat or (budget_s is not None and spent >= budget_s):
            return best
        t0 = clock()
        for _ in range(number):
            call()
        took = clock() - t0


# The tour times every variant in a few seconds: loops of at least 1 ms, the best of 3, and one
# call only where a call alone takes 20 ms. ``python -m minitx bench`` keeps the defaults.
TOUR_TIMING = {"repeat": 3, "loop_seconds": 0.001, "budget_s": 0.02}
BENCH_TIMING = {"repeat": 5, "loop_seconds": 0.02, "budget_s": None}


def timing_said(timing) -> str:
    """How ``timing`` (``TOUR_TIMING``, ``BENCH_TIMING``) measures, in words."""
    said = f"the best of {timing['repeat']} timed loops of at least " \
           f"{timing['loop_seconds'] * 1e3:g} ms"
    if timing["budget_s"]:
        said += f" (one call where a call takes over {timing['budget_s'] * 1e3:g} ms)"
    return said


@contextlib.contextmanager
def compute_threads(n):
    """BLAS and minitx's own worker threads (``MINITX_THREADS``) at ``n`` while inside; None
    leaves both as they are. BLAS is limited through ``threadpoolctl`` (the [fast] extra);
    without it only minitx's threads are. Why time on one thread: on a busy machine, threads
    that wait for each other's descheduled siblings make one loop 10–100× slower than the next,
    and no number of repeats recovers the figure."""
    if n is None:
        yield
        return
    before = os.environ.get("MINITX_THREADS")
    os.environ["MINITX_THREADS"] = str(n)
    try:
        try:
            from threadpoolctl import threadpool_limits  # noqa: PLC0415 - optional extra
        except ImportError:
            yield
        else:
            with threadpool_limits(limits=n, user_api="blas"):
                yield
    finally:
        if before is None:
            del os.environ["MINITX_THREADS"]
        else:
            os.environ["MINITX_THREADS"] = before


def _time_and_memory(cls, n, embed, heads, batch=1, threads=1, timing=None):
    """(seconds per forward, as ``time_call`` measures it with ``timing`` (default
    ``TOUR_TIMING``) and ``threads`` compute threads — see ``compute_threads`` — in CPU time on
    one thread, else wall-clock; peak bytes ``tracemalloc`` traces in the first forward) of
    variant ``cls`` at length ``n``, in float32 under ``no_grad``. The traced forward is also
    the timing's warm-up call: on every variant its peak was measured equal to a warm
    forward's, to within 0.2 MiB (the first call's caches are small), and one call fewer keeps
    the tour fast."""
    layer = cls(embed, heads, **_init_options(cls, n))
    layer.eval()
    x = minitx.tensor(np.random.default_rng(3).standard_normal((batch, n, embed)),
                      dtype="float32")
    # On one thread the CPU time the process used is the time the work takes, and it leaves
    # out the time spent waiting for a core, which on a busy machine can multiply the wall
    # clock of a short call. On several threads only the wall clock says how long the caller
    # waits.
    # On a GPU the host's CPU time says nothing of the device's work: there the wall clock,
    # each call waiting for its result (one element read back).
    on_gpu = minitx.get_backend() == "cupy"
    clock = time.process_time if threads == 1 and not on_gpu else time.perf_counter

    def call():
        y = layer(x)
        if on_gpu:
            to_host(y.data.reshape(-1)[:1])
    with minitx.no_grad(), compute_threads(None if on_gpu else threads):
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        peak = tracemalloc.get_traced_memory()[1] - base
        if not was_tracing:
            tracemalloc.stop()
        elapsed = time_call(call, clock=clock, warm_up=False, **(timing or TOUR_TIMING))
    return elapsed, peak


def _short(exc) -> str:
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return "error: " + (msg[:60] + "…" if len(msg) > 61 else msg)


# Variants timed at a shorter length than the table's, and why (the table marks them †).
# Additive attention forms a tanh feature per (query, key, hidden unit): 256 MiB at N = 1,024,
# and the first touch of that much fresh memory cost the tour more than the other 38 rows.
SHORTER_N = {"additive": 512}
SHORTER_WHY = {"additive": "its (N, N, A) tanh features alone are 256 MiB at N = 1,024"}


def variant_rows(names=None, n: int = 1024, embed: int = 32, heads: int = 2):
    """One dict per registered variant: name, kind, gradcheck, error, time_s, peak_bytes,
    n (the length timed: ``n``, or ``SHORTER_N``'s where shorter), complexity. A failing step
    puts "error: …" in its cell instead of raising."""
    rows = []
    for name in (names or sorted(REGISTRY)):
        row = {"name": name, "kind": "?", "gradcheck": "-", "error": "-", "time_s": None, "n": n,
               "peak_bytes": None, "complexity": "?", "note": ""}
        cls = REGISTRY.get(name)
        if cls is None:
            row["note"] = "error: not registered"
            rows.append(row)
            continue
        row["kind"] = getattr(cls, "kind", "?")
        row["complexity"] = cls.complexity
        try:
            row["gradcheck"] = _gradcheck_variant(cls, name)
        except Exception as exc:  # noqa: BLE001 - the tour reports, never crashes
            row["gradcheck"] = "FAIL" if isinstance(exc, AssertionError) else _short(exc)
        try:
            row["error"] = _reference_error(cls)
        except Exception as exc:  # noqa: BLE001
            row["error"] = _short(exc)
        try:
            row["n"] = min(n, SHORTER_N.get(name, n))
            row["time_s"], row["peak_bytes"] = _time_and_memory(cls, row["n"], embed, heads)
        except Exception as exc:  # noqa: BLE001
            row["note"] = _short(exc)
        rows.append(row)
    return rows


WIDTH = 100   # every line the tour prints fits in 100 columns


def name_width() -> int:
    """The width of the variant-name column: the longest registered name."""
    return max(len(name) for name in REGISTRY)

_PAD = " " * 20
ERROR_LEGEND = [
    "   rel. error = ‖O − O_ref‖/‖O_ref‖ in float64 (N = 32; approximations N = 128 at the budget",
    "   shown), where O_ref is:",
    "     dense          full softmax(QKᵀ/√D)V: the exact kinds compute it (error ~1e-16)",
    "     dense∘pattern  full softmax under the variant's own mask: the masked kinds (~1e-16)",
    "     formula        the variant's own scores, computed densely: the score kinds (~1e-16)",
    "     full           full softmax attention. Performer and Linformer estimate it, so their",
    _PAD + "error shrinks with the budget (m, k). Reformer (shared-QK LSH attention,",
    _PAD + "a token attending to itself only when nothing else is allowed; O_ref uses",
    _PAD + "the same shared keys) and Routing (attention within k-means clusters)",
    _PAD + "compute a different, sparser attention: with near-flat rows O_ref averages",
    _PAD + "all N values, so their ~1 error says how different, not that they are broken.",
]


def _linformer_smooth_line(rows) -> list:
    """The legend's line on Linformer's own regime, measured, when its row is in the table."""
    if not any(r["name"] == "linformer" and r["error"][:1].isdigit() for r in rows):
        return []
    option, budgets, fixed = APPROX_BUDGETS["linformer"]
    _, err = approx_distances("linformer", option, budgets[-2], fixed=fixed, smooth=True)
    return _wrapped([f"Every row's inputs are random. Linformer's pooling projections assume "
                     f"smooth keys and values: on cumulative means of the same draws its error "
                     f"is {err:.1e}."], _PAD, _PAD)


def variant_table(names=None, n: int = 1024, embed: int = 32, heads: int = 2) -> list:
    """The variants as a table (kind, gradcheck, error against a named reference, time, peak
    memory), a legend saying what each error compares, and each variant's complexity."""
    rows = variant_rows(names, n, embed, heads)
    w = name_width()
    head = (f"   {'variant':<{w}} {'kind':<11} {'gradcheck':<9} {'rel. error':>10}  "
            f"{'O_ref':<22} {'time':>9} {'peak mem':>10}")
    lines = _wrapped([f"3. Every registered attention variant (forward at N = {n:,}, B = 1, "
                      f"E = {embed}, H = {heads}; gradcheck in float64 on N = 6, along a random "
                      "direction per input; peak mem: the peak tracemalloc traces in the first "
                      "forward; time: CPU time on one thread, "
                      f"{timing_said(TOUR_TIMING)} after it)"], "", "   ")
    lines += ["", head, "   " + "-" * (len(head) - 3)]
    notes = []
    shorter = []
    for r in rows:
        t = f"{r['time_s'] * 1e3:7.1f} ms" if r["time_s"] is not None else "-"
        mem = fmt_bytes(r["peak_bytes"])
        if r["n"] != n and r["time_s"] is not None:         # marked, in the same width
            t, mem = f"{r['time_s'] * 1e3:6.1f} ms†", mem + "†"
            shorter.append(r)
        gc = r["gradcheck"] if len(r["gradcheck"]) <= 9 else "error"
        err, _, ref = r["error"].partition(" ")
        if err == "error:" or r["error"] in ("-", "n/a"):
            err, ref = ("error" if err == "error:" else r["error"]), ""
        lines.append(f"   {r['name']:<{w}} {r['kind']:<11} {gc:<9} {err:>10}  {ref:<22} "
                     f"{t:>9} {mem:>10}".rstrip())
        notes += [f"{r['name']}: {cell}" for cell in (r["gradcheck"], r["error"], r["note"])
                  if cell.startswith("error:")]
    lines += [f"   † time and peak mem at N = {r['n']:,}: {SHORTER_WHY[r['name']]}"
              for r in shorter]
    lines += [""] + ERROR_LEGEND + _linformer_smooth_line(rows)
    if notes:
        lines += ["", "   Failures:"] + _wrapped(notes, "   ", "     ")
    lines += ["", "   Complexity (B batch, H heads, N length, D head size; the other letters as in "
              "each", "   variant's docstring, ``help(minitx.attention.REGISTRY[name])``):"]
    for r in rows:
        lines += _wrapped([r["complexity"]], f"   {r['name']:<{w}} ", " " * (w + 4))
    return lines


def _wrapped(texts, first, rest) -> list:
    """``texts`` wrapped to the tour's width, the first line after ``first``."""
    out = []
    for text in texts:
        out += textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest,
                             break_on_hyphens=False) or [first.rstrip()]
    return out


# ---- 4. why 1/√d_k ------------------------------------------------------------------------

def scale_section(dims=(4, 16, 64, 256), samples: int = 10000, n_keys: int = 16,
                  queries: int = 200) -> list:
    """Var(q·k) ≈ d_k for unit-variance q, k (``samples`` pairs: the variance is estimated to
    about √(2/samples), 1.4%); softmax saturation and its Jacobian without the scale, over
    ``queries`` queries of ``n_keys`` keys, measured."""
    gen = np.random.default_rng(0)
    lines = ["4. Why divide by √d_k",
             f"   q, k with independent N(0, 1) entries: Var(q·k) = d_k. With {n_keys} keys per "
             "query, softmax",
             "   of unscaled scores saturates as d_k grows (max weight → 1), and its Jacobian "
             "diag(s) − s sᵀ",
             "   shrinks (it is exactly 0 for a one-hot s), so less and less gradient reaches "
             "the scores.",
             f"   Measured on {samples:,} pairs (the variances) and {queries} queries (max w: "
             "the mean over the queries",
             "   of the largest softmax weight; ‖J‖F: the median of the Jacobian's Frobenius "
             "norm):",
             "",
             f"   {'d_k':>5} {'Var(q·k)':>9} {'Var(q·k/√d_k)':>14} {'max w raw':>10} "
             f"{'max w scaled':>13} {'‖J‖F raw':>10} {'‖J‖F scaled':>12}"]
    for d in dims:
        q = gen.standard_normal((samples, d))
        k = gen.standard_normal((samples, d))
        dots = (q * k).sum(-1)
        var_raw, var_scaled = dots.var(), (dots / math.sqrt(d)).var()
        qs = gen.standard_normal((queries, 1, d))
        ks = gen.standard_normal((queries, n_keys, d))
        raw = (qs * ks).sum(-1)                                    # (queries, n_keys)
        out = {}
        for label, s in (("raw", raw), ("scaled", raw / math.sqrt(d))):
            x = minitx.tensor(s, dtype="float64")
            w = to_host(F.softmax(x, axis=-1))
            J = to_host(F.softmax_jacobian(x))
            # ‖J‖F per query, then the median: the typical query's sensitivity
            out[label] = (w.max(-1).mean(), np.median(np.sqrt((J ** 2).sum(axis=(-2, -1)))))
        lines.append(f"   {d:>5} {var_raw:>9.2f} {var_scaled:>14.3f} {out['raw'][0]:>10.3f} "
                     f"{out['scaled'][0]:>13.3f} {out['raw'][1]:>10.2e} {out['scaled'][1]:>12.2e}")
    lines.append(f"   (uniform weights over {n_keys} keys would give max w = {1 / n_keys:.4f})")
    return lines


# ---- 5. sparsity patterns -----------------------------------------------------------------

def pattern_section(n: int = 16, names=PATTERN_VARIANTS) -> list:
    lines = [f"5. Sparse attention patterns at n = {n} (■ = query row may attend to key "
             "column, · = masked)"]
    for name in names:
        cls = REGISTRY.get(name)
        if cls is None:
            lines += ["", f"   {name}: not registered"]
            continue
        try:
            layer = cls(16, 2, **_init_options(cls, n), **_PATTERN_OPTIONS.get(name, {}))
            mask = to_host(layer.pattern(n)).astype(bool)
            opts = _describe_options(layer)
            lines += [""] + _wrapped([f"{name} ({opts}; {mask.sum()} of {n * n} pairs, "
                                      f"{mask.sum() / n:.1f} keys per query)"], "   ", "     ")
            lines += ["   " + row for row in render_mask(mask).splitlines()]
        except Exception as exc:  # noqa: BLE001
            lines += ["", f"   {name}: {_short(exc)}"]
    return lines


def _describe_options(layer):
    keys = ("window", "dilation", "block", "block_size", "num_random", "num_global",
            "global_tokens", "stride", "summary", "chunk_size")
    parts = [f"{k}={getattr(layer, k)}" for k in keys
             if isinstance(getattr(layer, k, None), (int, tuple, list))]
    return ", ".join(parts) if parts else "defaults"


# ---- 6. what a decoder keeps ---------------------------------------------------------------

CACHE_VARIANTS = (("mha", {}), ("gqa", {"num_kv_heads": 2}), ("mqa", {}), ("mla", {}),
                  ("sink", {}), ("retention", {}), ("deltanet", {}), ("ssd", {}),
                  ("gated_deltanet", {}), ("kda", {}), ("gated", {}), ("fox", {}),
                  ("lightning", {}), ("short_conv", {}), ("chunked", {"chunk_size": 40}),
                  ("dsa", {}), ("moba", {}), ("nsa", {}), ("block_indexer", {}),
                  ("mamba2", {}), ("compressed_sparse", {}), ("heavily_compressed", {}))


def cached_numbers(cache) -> int:
    """How many numbers a decode cache holds now, read off the cache itself."""
    if hasattr(cache, "latent"):                       # MLA: the latent and the RoPE key
        parts = (cache.latent, cache.rope_keys)
    elif hasattr(cache, "state"):                      # a recurrent state (Mamba-2: + conv)
        parts = (cache.state, getattr(cache, "conv", None))
    elif hasattr(cache, "compressor"):                 # DeepSeek-V4: window, then entries
        parts = [cache.keys]
        for state in (cache.compressor, cache.index):
            for part in (() if state is None else (state.pending, state.before,
                                                   state.entries)):
                parts += list(part) if isinstance(part, tuple) else [part]
    else:                                              # keys and values
        parts = (cache.keys, cache.values, getattr(cache, "cumulative", None))  # FoX: + c
    return sum(int(np.prod(p.shape)) for p in parts if p is not None)


def cache_section(embed: int = 64, heads: int = 8, lengths=(32, 96)) -> list:
    """Decode ``max(lengths)`` tokens through each variant's own cache and count what it holds:
    keys and values grow by 2·H·D numbers a token; GQA and MQA share key/value heads; MLA keeps
    one latent and one RoPE key; sinks keep a bounded window; the recurrent forms one state."""
    d = embed // heads
    w = max(len(name) for name, _ in CACHE_VARIANTS)
    head = f"   {'variant':<{w}} " + " ".join(f"{'N = ' + str(n):>10}" for n in lengths)
    lines = [f"6. What a decoder keeps: numbers in each layer's cache after N tokens "
             f"(E = {embed}, H = {heads}, D = {d};",
             f"   MHA's keys and values: 2·H·D = {2 * heads * d} numbers a token)", "",
             head + "   per token", "   " + "-" * (len(head) + 9)]
    x = minitx.tensor(np.random.default_rng(4).standard_normal((1, max(lengths), embed)))
    for name, opts in CACHE_VARIANTS:
        if name not in REGISTRY:
            continue
        try:
            layer = REGISTRY[name](embed, heads, causal=True, **opts).eval()
            cache, counts, seen = layer.new_cache(), [], 0
            with minitx.no_grad():
                for n in lengths:                      # a prefill, then the rest in one step
                    layer(x[:, seen:n], kv_cache=cache)
                    seen = n
                    counts.append(cached_numbers(cache))
            grows = counts[-1] - counts[0]
            # a bounded cache may also shrink (chunked attention drops a chunk at its end)
            per = (f"{grows // (lengths[-1] - lengths[0])}" if grows > 0 else "0 (bounded)")
            lines.append(f"   {name:<{w}} " + " ".join(f"{c:>10,}" for c in counts)
                         + f"   {per}")
        except Exception as exc:  # noqa: BLE001 - the tour reports, never crashes
            lines.append(f"   {name:<{w}} {_short(exc)}")
    return lines


# ---- 7. today's decoders ------------------------------------------------------------------

def decoder_section() -> list:
    """One line per decoder family of ``minitx.pretrained.families``: the published model,
    its attention and windows as minitx's loader reads them, and its KV cache per token; a
    family the loader lacks says so. Columns as wide as their longest entry (flush left, so
    the longest names fit the tour's width; each family's MLP is in the course's table,
    docs/decoders.md)."""
    rows = {kind: families.family_row(kind) for kind in families.TODAY}
    names = ("model", "attention", "window pattern")
    wide = {name: max([len(name)] + [len(r[name]) for r in rows.values() if name in r])
            for name in names}
    family = max(len(k) for k in rows)
    lines = ["7. Today's decoders: GPT-2 plus a few switches each, read from the published "
             "configurations", "   (python -m minitx site: the course chapter "
             "\"From GPT-2 to today's decoders\")",
             "   KiB: what the caches grow by per token of context once every sliding "
             "window is full, in bf16",
             "   (models.kv_cache_bytes_per_token: full layers only; a sliding layer keeps at "
             "most W − 1 past",
             "   tokens, a recurrent one a state of fixed size; by W: every layer is bounded)",
             "",
             f"{'family':<{family}} " + " ".join(f"{n:<{wide[n]}}" for n in names)
             + "   KiB"]
    for kind, row in rows.items():
        head = f"{kind:<{family}} {row['model']:<{wide['model']}}"
        if "status" in row:
            lines.append(f"{head} {row['status']}"[:WIDTH])
            continue
        kib = kv_cache_bytes_per_token(families.family_config(kind)) / 1024
        cells = " ".join(f"{row[n]:<{wide[n]}}" for n in names[1:])
        lines.append(f"{head} {cells} " + (f"{kib:>5.1f}" if kib else f"{'by W':>5}"))
    return lines


# ---- the whole tour -----------------------------------------------------------------------

def run_tour(out=print, n: int = 1024) -> None:
    t0 = time.perf_counter()
    out(f"minitx {minitx.__version__} — a guided tour of attention (backend: "
        f"{minitx.get_backend()}; running on: {minitx.backend.describe_device()})")
    out("=" * 78)
    sections = (worked_example, jacobian_section, lambda: variant_table(n=n), scale_section,
                pattern_section, cache_section, decoder_section)
    for section in sections:
        try:
            lines = section()
        except Exception as exc:  # noqa: BLE001
            lines = [_short(exc)]
        out("")
        for line in lines:
            out(line)
    out("")
    out(f"Tour done in {time.perf_counter() - t0:.1f} s.")
    out("Next: the course, a reading site that starts at attention and walks the code with notes "
        "and")
    out("live proofs: `python -m pip install \".[docs]\" && python -m minitx site --out site`, "
        "then open")
    out("site/index.html. Also: `python -m minitx bench`, `python -m minitx train char_gpt`.")
