"""Live proofs: the numbers printed beside the code, recomputed at every build.

For each key op and each registered attention variant:

- **gradient**: float64 ``minitx.gradcheck`` (central differences) passes, and the largest
  |analytic − numerical| over every input element, measured here the same way;
- **reference**: the relative error ‖out − ref‖_F / ‖ref‖_F against what the code claims to
  compute — a NumPy formula for the ops; dense softmax attention for exact variants; dense
  attention under the variant's own ``pattern(N)`` for masked ones; the variant's own dense
  ``reference`` for score variants; exact softmax attention for the approximations
  (``minitx.metrics``), except Reformer (shared-QK attention under its no-self rule) — and
  Routing, whose windows within clusters approximate exact attention only as clusters → 1;
- **growth**, proven by counts, never by a clock: the floating-point operations of the forward,
  counted from the shapes of every matrix product and element-wise step it performs
  (``flops.py``: the same on a busy machine and an idle one), and the peak memory
  ``tracemalloc`` traces (the bytes the forward allocates, on one thread), over a few N. The
  fitted exponent p of each (count ∝ N^p) is checked against the limit the *stated* complexity
  sets (≤ 1.4 where the docstring's time or memory term is linear in N, ≤ 2.4 where it is
  N²). The
  forward's wall-clock time is drawn too, fenced as measured and judged by nothing: at these
  N a call's fixed overhead and the machine's other work dominate the clock, so it shows what
  one call costs here and now, not how the cost grows;
- **budget**: for the approximations, the error against budget (features, rank, rounds,
  clusters) — it must fall as the budget grows;
- **identities**: a variant may state its own (``identities()``: the absorbed form equals the
  naive one, the recurrent form equals the parallel one…), each a number against its limit.

A proof whose number misses its threshold raises ``ProofFailure``, which fails the build.
"""
from __future__ import annotations

import gc
import time
import tracemalloc
from dataclasses import dataclass, field

import numpy as np

import minitx
import minitx.functional as F
from minitx.attention import REGISTRY, causal_pattern, dense_attention_array
from minitx.autograd.gradcheck import GradcheckError
from minitx.backend import to_device
from minitx.metrics import APPROX_BUDGETS, approx_distances
from minitx.tour import _init_options, compute_threads, time_call

from .flops import count_call

__all__ = ["Proof", "ProofFailure", "Sizes", "op_proofs", "variant_proof", "all_proofs",
           "OP_PAGES"]


class ProofFailure(AssertionError):
    """A proof missed its threshold: the build stops and names it."""


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one build: ``quick`` (seconds, for tests) or full."""
    quick: bool
    grad_n: int = 6             # gradcheck: N, and E = 8, H = 2 (D = 4)
    ref_n: int = 32             # reference error at this N
    growth: tuple = (64, 128, 256)
    approx_n: int = 64          # error-versus-budget at this N (minitx.metrics regime)

    @classmethod
    def make(cls, quick: bool):
        if quick:
            return cls(True)
        return cls(False, grad_n=7, ref_n=128, growth=(128, 256, 512, 1024), approx_n=128)


@dataclass
class Proof:
    """One proof box on a page: measured lines, plots, and whether each met its threshold."""
    name: str
    anchor: str                             # the section it sits beside
    lines: list = field(default_factory=list)   # (claim, value, threshold, passed, measured)
    time: list = field(default_factory=list)    # [(N, seconds)]
    flops: list = field(default_factory=list)   # [(N, counted floating-point operations)]
    memory: list = field(default_factory=list)  # [(N, bytes)]
    budget: list = field(default_factory=list)  # [(budget, error)]
    budget_label: str = ""
    note: str = ""

    def check(self, claim, value: float, limit: float, fmt="{:.1e}", below=True, measured=False):
        """Record ``value`` against its threshold; raise :class:`ProofFailure` if it misses.

        ``measured``: the value describes this machine and moment (time, traced memory), so two
        builds may differ in it; the page fences it in ``<!--measured-->`` markers.
        """
        passed = bool(np.isfinite(value) and (value <= limit if below else value >= limit))
        rel = "≤" if below else "≥"
        if fmt == "{:.1e}" and _whole(value) and _whole(limit) and limit >= 1:
            fmt = "{:,.0f}"            # a count (cache entries, numbers per token): as a count
        self.lines.append((claim, fmt.format(value), f"{rel} {fmt.format(limit)}", passed,
                           measured))
        if not passed:
            raise ProofFailure(f"proof {self.name!r}: {claim} = {fmt.format(value)}, "
                               f"threshold {rel} {fmt.format(limit)}")

    def report(self, claim, value: str, measured=False):
        """A verdict with no number (``gradcheck``: pass), or — ``measured`` — a number that
        describes this machine and moment: it is labelled *illustrative* and never judged."""
        self.lines.append((claim, value, "illustrative" if measured else "", True, measured))


def _whole(x) -> bool:
    return bool(np.isfinite(x)) and float(x).is_integer()


def _host(x):
    return np.asarray(to_device(x.data if hasattr(x, "data") else x, "cpu"))


def _rel(x, y) -> float:
    return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-300))


# ---- gradients ----------------------------------------------------------------------------

def max_gradient_error(fn, arrays, eps=1e-6, seed=0) -> float:
    """max |∂L/∂x − (L(x + eps) − L(x − eps)) / 2eps| over every element of every input, with
    L = Σ r ⊙ fn(x) for a fixed random r (the quantity ``minitx.gradcheck`` tests)."""
    tensors = [minitx.tensor(a, dtype="float64", requires_grad=True) for a in arrays]
    out = fn(*tensors)
    r = np.random.default_rng(seed).standard_normal(out.shape)
    (out * minitx.tensor(r, dtype="float64")).sum().backward()
    worst = 0.0
    for i, a in enumerate(arrays):
        grad = tensors[i].grad                  # None: the output does not depend on it
        analytic = np.zeros_like(a) if grad is None else _host(grad)
        flat = a.reshape(-1)
        for j in range(flat.size):
            old = flat[j]
            values = []
            for step in (eps, -eps):
                flat[j] = old + step
                with minitx.no_grad():
                    y = fn(*[minitx.tensor(b, dtype="float64") for b in arrays])
                values.append(float((_host(y) * r).sum()))
            flat[j] = old
            worst = max(worst, abs(analytic.reshape(-1)[j] - (values[0] - values[1]) / (2 * eps)))
    return worst


def _gradient(proof, fn, arrays, limit=1e-6):
    """``minitx.gradcheck`` must pass (it raises, naming the input, when it does not), and the
    box shows the largest |analytic − numerical| against its limit."""
    try:
        minitx.gradcheck(fn, tuple(minitx.tensor(a, dtype="float64", requires_grad=True)
                                   for a in arrays), eps=1e-6, atol=1e-5, rtol=1e-3)
    except GradcheckError as exc:        # a wrong gradient; any other error is a bug: it rises
        raise ProofFailure(f"proof {proof.name!r}: float64 gradcheck failed: {exc}") from exc
    shapes = " · ".join("×".join(map(str, a.shape)) for a in arrays)
    proof.check(f"float64 gradcheck passes; max |analytic − numerical| gradient, inputs "
                f"{shapes}", max_gradient_error(fn, arrays), limit)


# ---- growth -------------------------------------------------------------------------------

def _measure(run, sizes, repeats=3):
    """[(N, seconds)], [(N, peak bytes)], [(N, FLOPs)] of ``run(N)``, a call whose
    ``.tensors`` are the Tensors it reads: its CPU time on one thread as the tour and bench
    measure it (``tour.time_call``: the best of ``repeats`` loops after a warm-up call), the
    peak memory traced during one more call, and the floating-point operations of
    one call of the reference code (``minitx.using_config(fast=False)``), counted
    (``flops.count_call``)."""
    times, memory, flops = [], [], []
    for n in sizes:
        # counted first, on a call just made: a layer that draws at each call (hashing,
        # clustering) draws the same numbers in every build, however many calls the timing took
        fresh = run(n)
        with minitx.using_config(fast=False):   # the code the course shows
            flops.append((n, count_call(fresh, *fresh.tensors)))
        call = run(n)
        with compute_threads(1):       # the CPU time of one thread: no waits for a core
            times.append((n, time_call(call, repeat=repeats, clock=time.process_time)))
        gc.collect()                   # no garbage of earlier calls freed inside this one:
        gc.disable()                   # the same peak whatever ran before
        was_tracing = tracemalloc.is_tracing()
        try:
            tracemalloc.start()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            with compute_threads(1):   # on several threads the peak is when their tiles meet
                call()
            memory.append((n, tracemalloc.get_traced_memory()[1] - base))
        finally:
            if not was_tracing:
                tracemalloc.stop()
            gc.enable()
    return times, memory, flops


def exponent(points) -> float:
    """p in cost ∝ N^p: the least-squares slope of log cost against log N."""
    x = np.log([p[0] for p in points])
    y = np.log([max(p[1], 1e-12) for p in points])
    return float(np.polyfit(x, y, 1)[0])


def stated_memory_power(complexity: str) -> int:
    """The power of N in the memory term of a stated complexity, at fixed window, features,
    rank, buckets and stride: 2 when it holds N² (or a stride's N/l, as in N·(l + N/l)), else 1.

    ``"time O(B·H·N²·D), memory O(B·H·N²)"`` → 2; ``"…, memory O(B·H·N·m)"`` → 1."""
    memory = complexity.split("memory", 1)[1] if "memory" in complexity else complexity
    return 2 if any(t in memory for t in ("N²", "N^2", "/l", "N·N")) else 1


def stated_time_power(complexity: str) -> int:
    """The power of N in the time term of a stated complexity (the text before "memory"), at
    fixed window, features, rank, buckets and stride: 2 when it holds N², a stride's N/l, or a
    factor that grows with N beside another (N·(L + N)), else 1 (N log N counts as 1: the limit's
    slack holds its log).

    ``"time O(B·H·N²·D), memory O(B·H·N)"`` → 2; ``"time O(B·H·N·m·D), …"`` → 1."""
    time_term = complexity.split("memory", 1)[0]
    return 2 if any(t in time_term for t in ("N²", "N^2", "/l", "N·N", "+ N)")) else 1


# The limit on a fitted exponent (of counted FLOPs or traced bytes) for each stated power: the
# slack covers the fixed costs (parameters, small buffers, the projections' O(N) work) that
# flatten the fit at small N, and never admits the next power.
LIMIT = {1: 1.4, 2: 2.4}
MEMORY_LIMIT = LIMIT
OP_MEMORY_POWER = {"scaled_dot_product_attention": 2, "flash_attention": 1}
OP_TIME_POWER = {"scaled_dot_product_attention": 2, "flash_attention": 2}


def _growth(proof, run, sizes, power, time_power):
    """Count, trace and time ``run`` over ``sizes``; check the counted-FLOPs exponent against
    the stated time power and the traced-memory exponent against the stated memory power."""
    proof.time, proof.memory, proof.flops = _measure(run, sizes)
    ns = ", ".join(map(str, sizes))
    square = {1: "", 2: "²"}
    last = exponent(proof.flops[-2:])    # the slope where the leading term weighs most
    proof.check(f"work exponent p (counted floating-point operations ∝ N^p, N = {ns}; "
                f"{last:.2f} between the two largest; stated time O(N{square[time_power]}))",
                exponent(proof.flops), LIMIT[time_power], fmt="{:.2f}")
    proof.check(f"memory exponent p (peak traced bytes ∝ N^p, N = {ns}; stated O(N"
                f"{square[power]}))", exponent(proof.memory), LIMIT[power],
                fmt="{:.2f}", measured=True)     # its verdict is steady; its last digit may move


# ---- the ops ------------------------------------------------------------------------------

def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# page of each op proof: (module path, anchor)
OP_PAGES = {
    "softmax": ("minitx/ops/activation.py", "softmax"),
    "log_softmax": ("minitx/ops/activation.py", "log_softmax"),
    "scaled_dot_product_attention": ("minitx/ops/sdpa.py", "scaled_dot_product_attention"),
    "flash_attention": ("minitx/ops/flash.py", "flash_attention"),
    "layer_norm": ("minitx/ops/norm.py", "layer_norm"),
    "matmul": ("minitx/ops/linalg.py", "matmul"),
    "linear": ("minitx/ops/linalg.py", "linear"),
    "cross_entropy": ("minitx/ops/loss.py", "cross_entropy"),
}


def op_proofs(sizes: Sizes, seed: int) -> list:
    """One Proof per key op (see ``OP_PAGES``)."""
    g = np.random.default_rng(seed)
    n, big = sizes.grad_n, sizes.ref_n
    proofs = []

    def new(name):
        proof = Proof(name, OP_PAGES[name][1])
        proofs.append(proof)
        return proof

    x = g.standard_normal((3, n))
    xr = g.standard_normal((4, big)) * 3
    p = new("softmax")
    _gradient(p, lambda t: F.softmax(t, axis=-1), [x.copy()])
    p.check(f"error vs exp(x)/Σexp(x) in NumPy, shape 4×{big}",
            _rel(_host(F.softmax(minitx.tensor(xr), axis=-1)), _np_softmax(xr)), 1e-14)

    p = new("log_softmax")
    _gradient(p, lambda t: F.log_softmax(t, axis=-1), [x.copy()])
    p.check(f"error vs log(softmax(x)) in NumPy, shape 4×{big}",
            _rel(_host(F.log_softmax(minitx.tensor(xr), axis=-1)), np.log(_np_softmax(xr))),
            1e-14)

    q, k, v = (g.standard_normal((1, 2, n, 4)) for _ in range(3))
    qb, kb, vb = (g.standard_normal((1, 2, big, 8)) for _ in range(3))
    for name, fn in (("scaled_dot_product_attention",
                      lambda a, b, c, causal=False: F.scaled_dot_product_attention(
                          a, b, c, is_causal=causal)),
                     ("flash_attention",
                      lambda a, b, c, causal=False: F.flash_attention(
                          a, b, c, causal=causal, block_q=4, block_k=4))):
        p = new(name)
        _gradient(p, lambda a, b, c: fn(a, b, c, True), [q.copy(), k.copy(), v.copy()])
        for causal in (False, True):
            out = _host(fn(*(minitx.tensor(t) for t in (qb, kb, vb)), causal=causal))
            allowed = causal_pattern(big) if causal else None     # the one dense reference:
            ref = dense_attention_array(qb, kb, vb, allowed=allowed)   # ops.sdpa's, on arrays
            p.check(f"error vs the dense reference softmax(QKᵀ/√D)V"
                    f"{', causal' if causal else ''}, N = {big}, D = 8", _rel(out, ref), 1e-13)

        def run(m, fn=fn):
            t = [minitx.tensor(np.random.default_rng(3).standard_normal((1, 2, m, 16)),
                               dtype="float32") for _ in range(3)]

            def call():
                with minitx.no_grad():
                    return fn(*t)
            call.tensors = t
            return call
        _growth(p, run, sizes.growth, OP_MEMORY_POWER[name], OP_TIME_POWER[name])

    p = new("layer_norm")
    w, b = g.standard_normal(5), g.standard_normal(5)
    _gradient(p, lambda t, ww, bb: F.layer_norm(t, (5,), ww, bb), [g.standard_normal((3, 5)),
                                                                   w.copy(), b.copy()])
    xl = g.standard_normal((4, big))
    ref = (xl - xl.mean(-1, keepdims=True)) / np.sqrt(xl.var(-1, keepdims=True) + 1e-5)
    p.check(f"error vs (x − mean)/√(var + 1e-5) in NumPy, shape 4×{big}",
            _rel(_host(F.layer_norm(minitx.tensor(xl), (big,))), ref), 1e-13)

    p = new("matmul")
    _gradient(p, F.matmul, [g.standard_normal((2, 3, 4)), g.standard_normal((4, 5))])
    a, bm = g.standard_normal((big, big)), g.standard_normal((big, big))
    p.check(f"error vs NumPy's @, {big}×{big}", _rel(_host(F.matmul(minitx.tensor(a),
                                                                      minitx.tensor(bm))), a @ bm),
            1e-14)

    p = new("linear")
    _gradient(p, F.linear, [g.standard_normal((3, 4)), g.standard_normal((5, 4)),
                            g.standard_normal(5)])
    xw, ww, bw = g.standard_normal((big, 8)), g.standard_normal((6, 8)), g.standard_normal(6)
    p.check("error vs x Wᵀ + b in NumPy", _rel(_host(F.linear(*(minitx.tensor(t) for t in
                                                                (xw, ww, bw)))),
                                                  xw @ ww.T + bw), 1e-14)

    p = new("cross_entropy")
    target = g.integers(0, 5, size=4)
    _gradient(p, lambda t: F.cross_entropy(t, minitx.tensor(target)), [g.standard_normal((4, 5))])
    logits = g.standard_normal((big, 7))
    labels = g.integers(0, 7, size=big)
    ref = -np.mean(np.log(_np_softmax(logits))[np.arange(big), labels])
    got = float(_host(F.cross_entropy(minitx.tensor(logits), minitx.tensor(labels))))
    p.check(f"error vs −mean log softmax(x)[y] in NumPy, {big} rows", abs(got - ref) / abs(ref),
            1e-14)
    return proofs


# ---- the variants -------------------------------------------------------------------------

def _layer(cls, embed, heads, n, seed, dtype="float64"):
    """A variant in eval mode, its parameters drawn from ``seed`` (so every build draws the
    same ones, whatever ran before: hashing and clustering depend on them)."""
    minitx.manual_seed(seed)
    return cls(embed, heads, **_init_options(cls, n)).to(dtype=dtype).eval()


_BUDGET_WORDS = {"num_features": "random features m", "proj_dim": "projected length k",
                 "n_hashes": "hash rounds", "num_clusters": "clusters (fewer = more budget)"}
# output error vs the reference at the middle budget: what these untrained layers reach at
# the stated N (q, k ~ N(0, 0.5²)); the budget curve proves convergence.
_APPROX_LIMIT = {"performer": 0.5, "linformer": 0.1, "reformer": 2.0, "routing": 2.5}


def variant_proof(name: str, sizes: Sizes, seed: int) -> Proof:
    """The proof for one registered variant (see the module docstring)."""
    cls = REGISTRY[name]
    proof = Proof(name, cls.__name__)
    g = np.random.default_rng(seed)
    n = sizes.grad_n
    layer = _layer(cls, 8, 2, n, seed)
    _gradient(proof, lambda a, b, c: layer.attend(a, b, c),
              [g.standard_normal((1, 2, n, 4)) for _ in range(3)], limit=1e-5)

    kind = cls.kind
    m = sizes.ref_n
    if kind == "approximate":
        option, budgets, fixed = APPROX_BUDGETS[name]
        n_a = sizes.approx_n
        budgets = [b for b in budgets if not (name == "linformer" and b > n_a)]
        curve = [(b, approx_distances(name, option, b, n=n_a, fixed=fixed, seed=seed)[1])
                 for b in budgets]
        proof.budget, proof.budget_label = curve, _BUDGET_WORDS.get(option, option)
        ref = ("shared-QK attention under its no-self rule (its one-bucket limit): Reformer "
               "approximates a different attention from softmax(QKᵀ/√D)V" if name == "reformer"
               else "exact softmax attention — but Routing computes a different attention "
               "(softmax within k-means clusters and windows), which meets it only at one "
               "cluster with the window covering N" if name == "routing" else
               "exact softmax attention softmax(QKᵀ/√D)V")
        proof.note = (f"Reference: {ref}. Output error ‖O − O*‖/‖O*‖, N = {n_a}, "
                      "q, k ~ N(0, 0.5²).")
        mid = curve[len(curve) // 2]
        proof.check(f"output error vs reference at {proof.budget_label} = {mid[0]}, N = {n_a}",
                    mid[1], _APPROX_LIMIT.get(name, 1.0))
        first, last = curve[0][1], curve[-1][1]
        proof.check(f"error at the largest budget / error at the smallest ({curve[-1][0]} vs "
                    f"{curve[0][0]})", last / first, 0.5, fmt="{:.2f}")
    else:
        layer = _layer(cls, 16, 2, m, seed)
        q, k, v = (g.standard_normal((1, 2, m, 8)) for _ in range(3))
        with minitx.no_grad():
            out = _host(layer.attend(*(minitx.tensor(t, dtype="float64") for t in (q, k, v))))
        if kind in ("exact", "masked"):
            allowed = _host(layer.pattern(m))
            ref = dense_attention_array(q, k, v, allowed=allowed)
            what = ("dense softmax attention" if kind == "exact" else
                    f"dense attention under its own pattern({m}) "
                    f"({allowed.mean():.0%} of pairs kept)")
        elif hasattr(layer, "reference"):
            ref = _host(layer.reference(q, k, v))
            what = "its own dense formula (reference)"
        else:
            allowed = causal_pattern(m) if getattr(layer, "causal", False) else None
            ref = dense_attention_array(q, k, v, allowed=allowed)
            what = "dense softmax attention"
        proof.check(f"error vs {what}, N = {m}", _rel(out, _host(ref)), 1e-12)

    def run(n_, cls=cls):
        lay = _layer(cls, 32, 2, n_, seed, dtype="float32")
        x = minitx.tensor(np.random.default_rng(3).standard_normal((1, n_, 32)), dtype="float32")

        def call():
            with minitx.no_grad():
                return lay(x)
        call.tensors = [x, *lay.parameters(), *(b for b in lay.buffers() if b is not None)]
        return call
    _growth(proof, run, sizes.growth, stated_memory_power(cls.complexity),
            stated_time_power(cls.complexity))
    for claim, value, limit in (cls.identities(seed) if hasattr(cls, "identities") else ()):
        proof.check(claim, float(value), float(limit))
    proof.note = (proof.note + " " if proof.note else "") + f"Stated complexity: {cls.complexity}."
    return proof


def all_proofs(quick: bool, seed: int) -> dict:
    """{module path: [Proof]} for every op in OP_PAGES, every registered variant and the
    decoders' files (``decoder_proofs``)."""
    sizes = Sizes.make(quick)
    pages = {}
    for proof in op_proofs(sizes, seed):
        pages.setdefault(OP_PAGES[proof.name][0], []).append(proof)
    for name in sorted(REGISTRY):
        path = REGISTRY[name].__module__.replace(".", "/") + ".py"
        pages.setdefault(path, []).append(variant_proof(name, sizes, seed))
    for path, found in _decoders.decoder_proofs(sizes, seed).items():
        pages.setdefault(path, []).extend(found)
    return pages


# The decoders' proofs build on this module's Proof and checks, so they are imported once
# those exist: here, after them, not at the top.
from . import decoder_proofs as _decoders  # noqa: E402
