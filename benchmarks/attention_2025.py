"""The 2025 attention variants at long N: time, peak memory, keys read and state kept.

For dense causal softmax attention (``mha``) and the 2025 variants (``gated``, ``fox``,
``lightning``, ``gated_deltanet``, ``kda``, ``dsa``, ``moba``, ``nsa``), each causal, one
head, E = D = 64, batch 1, float32, at N = 1,024 … 8,192 (``--quick``: 128 … 512):

- **time** of one layer forward + backward, ``layer(x)`` then ``backward()`` (the best of
  ``--repeats`` calls after the traced one; a call over 5 s is timed once);
- **peak memory**: the bytes ``tracemalloc`` traces during that call (NumPy reports its
  allocations to it), over what existed before it;
- **keys read per query** by the three that choose keys, counted from their own choice (DSA's
  ``select``, MoBA's and NSA's ``hook_selection``), against N for dense attention;
- **state kept** after a prefill of N tokens through each layer's decode cache
  (``tour.cached_numbers``): a recurrent state stays constant, keys and values grow with N;
- the fitted exponents p (cost ∝ N^p, least squares over every N measured) of time, memory
  and keys read;
- each variant's **memory floor**: the arrays its stated complexity says forward + backward
  must hold at once, counted in float32 at the largest N (``FLOORS`` states each), and the
  measured peak over it.

    python benchmarks/attention_2025.py --quick
    python benchmarks/attention_2025.py                 # N = 1,024 … 8,192 (minutes)
"""
from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

from minitx.attention import REGISTRY
from minitx.attention.gated import FOX_BLOCK
from minitx.backend import to_host
from minitx.tour import cached_numbers

E = D = 64          # one head of 64
BYTES = 4           # float32

# the options of each variant at long N (its constructor's defaults target short sequences)
OPTIONS = {
    "mha": {}, "gated": {}, "fox": {},
    "lightning": {"block": 64},
    "gated_deltanet": {"chunk_size": 64},
    "kda": {"chunk_size": 64},
    "dsa": {"top_k": 64},
    "moba": {"block": 64, "top_k": 2},
    "nsa": {"block": 64, "top_k": 2, "window": 64},
}
NAMES = list(OPTIONS)
CHOOSERS = ("dsa", "moba", "nsa")


def _io(n):
    """What every layer's forward + backward allocates besides attention proper: q, k, v, the
    attention output and the layer output, and the gradient of each (10·N·E numbers)."""
    return 10 * n * E


def _floor_dense(n, o):
    return n * (n + 1) // 2 + _io(n)


def _floor_fox(n, o):
    return n * FOX_BLOCK + 2 * n + _io(n)


def _floor_lightning(n, o):
    c = o["block"]
    return n * c + (n // c) * D * D + _io(n)


def _floor_gdn(n, o):
    c = o["chunk_size"]
    return n * c + 2 * n * D + (n // c) * D * D + _io(n)


def _floor_kda(n, o):
    # Not N·C·D: a chunk's scores are c × c once summed over the key channels, and the decay
    # of each pair per channel, e^{G_t − G_s}, is a function of the N·D log decays — the
    # backward forms it again chunk by chunk, so one chunk's c × c × D is all it holds at once
    c = o["chunk_size"]
    return n * c + 3 * n * D + (n // c) * D * D + c * c * D + _io(n)


def _floor_dsa(n, o):
    k = o["top_k"]
    return 2 * n * k * D + n * k + 4 * 64 * n + _io(n)


def _floor_moba(n, o):
    c = o["top_k"] + 1
    return n * c * o["block"] + n * c * D + n * (n // o["block"]) + _io(n)


def _floor_nsa(n, o):
    k, b, w = o["top_k"], o["block"], o["window"]
    return n * (k * b + 2 * w) + n * (k + 2) * D + n * (n // b) + _io(n)


# The memory floor of each variant, in numbers: what its forward must keep for the backward,
# the terms of its stated memory complexity at their least (as text; the count). Every floor
# adds the 10·N·E numbers of ``_io``. FoX runs by blocks of query rows (``gated.py``; memory
# O(N·(D + b))): its floor is one block's scores and two numbers per row, not dense's.
FLOORS = {
    "mha": ("N(N+1)/2: the causal half of the probabilities (memory O(N²))", _floor_dense),
    "gated": ("N(N+1)/2: as dense (the gate adds N·D)", _floor_dense),
    "fox": (f"N·b + 2·N: one block of b = {FOX_BLOCK} query rows' scores, the row "
            "log-sum-exp and c (memory O(N·(D + b)))", _floor_fox),
    "lightning": ("N·c + (N/c)·D²: in-block scores, one state per block "
                  "(memory O(N·(c + D)))", _floor_lightning),
    "gated_deltanet": ("N·C + 2·N·D + (N/C)·D²: chunk scores, the corrected values and "
                       "keys, one state per chunk (memory O(N·(C + D + D²/C)))", _floor_gdn),
    "kda": ("N·C + 3·N·D + (N/C)·D² + C²·D: as gated DeltaNet, with the log decays per "
            "key channel and one chunk's decays per channel (memory "
            "O(N·(C + D + D²/C) + C²·D))", _floor_kda),
    "dsa": ("2·N·k·D + N·k + h_I·C·N: the gathered keys and values, the probabilities, "
            "one indexer chunk (memory O(N·k·D + h_I·C·N))", _floor_dsa),
    "moba": ("N·(k+1)·b + N·(k+1)·D + N²/b: the probabilities, a copy of each query per "
             "block it reads, the gate (memory O(N²/b + N·k·(b + D)))", _floor_moba),
    "nsa": ("N·(k·b+2w) + N·(k+2)·D + N²/b: the probabilities (the window read as two "
            "blocks of w), a copy of each query per block, the compressed probabilities "
            "(memory O(N²/b + N·(k·b + w) + N·k·D))", _floor_nsa),
}
FLOOR_RATIO = 1.5   # a peak within 1.5× its floor: nothing large beyond what the maths holds


def make(name):
    return REGISTRY[name](E, 1, causal=True, **OPTIONS[name])


def _input(n):
    rng = np.random.default_rng(n)
    return minitx.tensor(rng.standard_normal((1, n, E)).astype(np.float32), requires_grad=True)


def forward_backward(layer, x):
    out = layer(x)
    out.backward(np.ones(out.shape, dtype=np.float32))


def measure(name, n, repeats):
    """(best seconds, peak traced bytes) of one forward + backward at length n."""
    layer, x = make(name), _input(n)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    forward_backward(layer, x)                   # traced; also the warm-up
    first = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    times = []
    for _ in range(repeats if first < 5.0 else 1):
        layer.zero_grad()
        x.grad = None
        gc.collect()
        start = time.perf_counter()
        forward_backward(layer, x)
        times.append(time.perf_counter() - start)
    return min(times), peak


def _keys_in_blocks(chosen, n, block):
    """(…, Nq, nb) chosen blocks → (…, Nq) keys read under causality: block j holds keys
    j·b … j·b + b − 1, and query t reads those ≤ t."""
    t = np.arange(n)[:, None]
    start = np.arange(chosen.shape[-1])[None, :] * block
    inside = np.clip(np.minimum(t - start + 1, n - start), 0, block)       # (Nq, nb)
    return (chosen * inside).sum(axis=-1)


def keys_read(name, n):
    """(Nq,) keys each query reads, counted from the variant's own choice at length n."""
    layer = make(name).eval()
    rng = np.random.default_rng(n + 1)
    q, k, v = (minitx.tensor(rng.standard_normal((1, 1, n, D)).astype(np.float32))
               for _ in range(3))
    with minitx.no_grad():
        if name == "dsa":
            _, valid = layer.select(q, k)                                  # (B, Nq, c)
            return to_host(valid)[0].sum(axis=-1)
        seen = {}
        with layer.hooks([("hook_selection", lambda t, hook: seen.setdefault("s", t))]):
            layer.attend(q, k, v)
    chosen = to_host(seen["s"].data)[0, 0].astype(np.int64)                # (Nq, nb)
    count = _keys_in_blocks(chosen, n, layer.block)
    if name == "nsa":       # + one mean per complete block seen + the window
        t = np.arange(n)
        count = count + (t + 1) // layer.block + np.minimum(layer.window, t + 1)
    return count


def state_numbers(name, n):
    """Numbers in the layer's decode cache after a prefill of n tokens."""
    layer = make(name).eval()
    cache = layer.new_cache()
    with minitx.no_grad():
        layer(_input(n), kv_cache=cache)
    return cached_numbers(cache)


def exponent(ns, values):
    """p in value ∝ N^p: the least-squares slope of log value against log N (0 when it
    rounds to 0, not −0.00)."""
    p = float(np.polyfit(np.log(ns), np.log(np.maximum(values, 1e-12)), 1)[0])
    return 0.0 if abs(p) < 5e-3 else p


def main(argv=None):
    minitx.fast.host.tune_host_allocator()     # measured with the caching host allocator on
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 128 … 512, one repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=",".join(NAMES))
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in OPTIONS]
    if unknown:
        parser.error(f"argument --variants: expected names among {', '.join(NAMES)}, "
                     f"got {', '.join(unknown)}")
    ns = [128, 256, 512] if args.quick else [1024, 2048, 4096, 8192]
    repeats = 1 if args.quick else args.repeats
    print(f"causal, one head, E = D = {D}, batch 1, float32; forward + backward of layer(x); "
          f"time = best of {repeats} after the traced call; memory = tracemalloc peak; "
          f"load average {os.getloadavg()[0]:.1f} at the start\n")

    print("Time and peak memory (exponent p: cost ∝ N^p over every N)")
    print(f"| variant | {' | '.join(f'N = {n:,}' for n in ns)} | time p | memory p |")
    print("|---" * (len(ns) + 3) + "|")
    peaks = {}
    for name in names:
        got = [measure(name, n, repeats) for n in ns]
        peaks[name] = got[-1][1]
        cells = [f"{t * 1e3:,.0f} ms / {p / 2 ** 20:,.1f} MB" for t, p in got]
        print(f"| {name} | {' | '.join(cells)} | {exponent(ns, [g[0] for g in got]):.2f} | "
              f"{exponent(ns, [g[1] for g in got]):.2f} |", flush=True)

    print(f"\nMemory floor at N = {ns[-1]:,} (numbers of 4 bytes; every floor adds the 10·N·E "
          "of q, k, v, the outputs and their gradients)")
    print("| variant | floor | floor MB | peak MB | peak / floor | within 1.5× |")
    print("|---|---|---|---|---|---|")
    for name in names:
        text, count = FLOORS[name]
        floor = count(ns[-1], OPTIONS[name]) * BYTES
        ratio = peaks[name] / floor
        print(f"| {name} | {text} | {floor / 2 ** 20:,.1f} | {peaks[name] / 2 ** 20:,.1f} | "
              f"{ratio:.2f} | {'yes' if ratio <= FLOOR_RATIO else 'no'} |")

    print("\nKeys read per query (counted from each variant's own choice; mean / max over "
          "queries), against dense causal attention's (t + 1)")
    print(f"| variant | {' | '.join(f'N = {n:,}' for n in ns)} | total keys p |")
    print("|---" * (len(ns) + 2) + "|")
    dense = [np.arange(1, n + 1) for n in ns]
    rows = [("mha", dense)] + [(c, [keys_read(c, n) for n in ns]) for c in CHOOSERS
                               if c in names]
    for name, counts in rows:
        cells = [f"{c.mean():,.0f} / {c.max():,}" for c in counts]
        print(f"| {name} | {' | '.join(cells)} | "
              f"{exponent(ns, [c.sum() for c in counts]):.2f} |", flush=True)

    print("\nState kept after a prefill of N tokens (numbers in the decode cache)")
    print(f"| variant | {' | '.join(f'N = {n:,}' for n in ns)} | p |")
    print("|---" * (len(ns) + 2) + "|")
    for name in names:
        counts = [state_numbers(name, n) for n in ns]
        print(f"| {name} | {' | '.join(f'{c:,}' for c in counts)} | "
              f"{exponent(ns, counts):.2f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
