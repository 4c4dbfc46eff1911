"""A real LLM's speed on the CPU: SmolLM2-135M-Instruct in float32, minitx beside
``transformers`` on the same weights and threads, in one run.

```
python benchmarks/llm_speed.py [--prompt 128] [--new 128] [--prefill 512] [--repeats 3]
```

Each library runs in its own child process (so that each one's peak memory is its own), on the
same dequantized weights (the GGUF file, which both read), the same token ids and the same
number of threads (``--threads``, default all cores, torch.set_num_threads and BLAS alike):

- **decode**: a ``--prompt``-token prompt, then ``--new`` tokens through the KV cache, greedy,
  every token generated (no stop); tokens per second of the new tokens after the first;
- **prefill**: a ``--prefill``-token prompt through fresh KV caches to its next token's
  logits (the logits of the last position only: ``logits_to_keep=1`` on both sides, as in
  generation), seconds;
- **peak memory**: the child's peak RSS, against the float32 weights plus the KV cache of the
  decode (``kv_cache_bytes``) — what a model of this size must hold;
- **the physical floor of decoding**: each new token reads every weight once (the tied
  embedding as the unembedding), so a token takes at least the weights' bytes divided by the
  machine's memory bandwidth, measured here as a large NumPy copy's bytes read plus written per
  second. The ratio decode time ÷ floor says how close to the memory system a decode step is.

Prints the load average (a noisy run is no evidence) and each figure's min / median / max over
``--repeats``. Needs the model (``python -m minitx fetch smollm2``) and, for the peer,
``torch`` and ``transformers`` with ``gguf``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)


def _child_minitx(path, prompt, new, prefill, repeats, threads):
    import numpy as np  # noqa: PLC0415 - the child's own imports
    import minitx
    import minitx.pretrained as pt
    from minitx.models import kv_cache_bytes
    minitx.fast.host.tune_host_allocator()
    t0 = time.perf_counter()
    model, _ = pt.load(path, dtype="float32")
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (1, prompt))
    long = rng.integers(0, model.config.vocab_size, (1, prefill))
    decode, pre = [], []
    with minitx.no_grad():
        model(minitx.tensor(long[:, :16]))                                   # warm-up
        for _ in range(repeats):
            stamps = []
            model.generate(minitx.tensor(ids), new,
                           on_token=lambda step, _ids: stamps.append(time.perf_counter()))
            decode.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            t0 = time.perf_counter()
            model(minitx.tensor(long), kv_caches=model.new_caches(), logits_to_keep=1)
            pre.append(time.perf_counter() - t0)
    weights = sum(int(np.prod(p.shape)) * 4 for p in model.parameters())
    cache = kv_cache_bytes(model.config, prompt + new, bytes_per_number=4)
    return {"decode": decode, "prefill": pre, "weights": weights, "cache": cache,
            "load_s": load_s}


def _child_transformers(path, prompt, new, prefill, repeats, threads):
    import numpy as np  # noqa: PLC0415
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor
    torch.set_num_threads(threads)
    folder, name = os.path.split(path)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, model.config.vocab_size, (1, prompt)))
    long = torch.from_numpy(rng.integers(0, model.config.vocab_size, (1, prefill)))

    class Stamp(LogitsProcessor):                 # called once per new token, as it is chosen
        def __init__(self):
            self.stamps = []

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            return scores
    decode, pre = [], []
    with torch.no_grad():
        model(long[:, :16])
        for _ in range(repeats):
            stamp = Stamp()
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           logits_processor=[stamp])
            decode.append((len(stamp.stamps) - 1) / (stamp.stamps[-1] - stamp.stamps[0]))
            t0 = time.perf_counter()
            model(long, use_cache=True, logits_to_keep=1)
            pre.append(time.perf_counter() - t0)
    return {"decode": decode, "prefill": pre, "load_s": load_s}


def _bandwidth() -> float:
    """Bytes read plus written per second of a 512 MiB float32 copy, the best of 5."""
    import numpy as np  # noqa: PLC0415
    a = np.ones(2 ** 27, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best


def _run_child(which, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), MINITX_THREADS=str(args.threads),
               TOKENIZERS_PARALLELISM="false")
    code = (f"import json, sys; sys.path.insert(0, {HERE!r}); "
            f"import benchmarks.llm_speed as b; "
            f"r = b._child_{which}({args.model!r}, {args.prompt}, {args.new}, {args.prefill}, "
            f"{args.repeats}, {args.threads}); "
            f"import resource; r['rss'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss "
            f"* 1024; print('RESULT ' + json.dumps(r))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=HERE)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{which} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def _mmm(values, fmt="{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values),
                                              max(values)))


def main(argv=None) -> int:
    from minitx.pretrained import real  # noqa: PLC0415
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2's)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--new", type=int, default=128, help="new tokens (default 128)")
    ap.add_argument("--prefill", type=int, default=512, help="prefill tokens (default 512)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads of each library (default: every core)")
    args = ap.parse_args(argv)
    args.model = args.model or (str(real.smollm2_gguf()) if real.smollm2_gguf() else None)
    if args.model is None:
        raise SystemExit(f"no model: {real.FETCH_COMMAND} smollm2, or --model PATH")
    print(f"load average at the start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{args.threads} thread(s); {os.path.basename(args.model)}, float32, batch 1")
    ours = _run_child("minitx", args)
    theirs = _run_child("transformers", args)
    bw = _bandwidth()
    floor = ours["weights"] / bw                                  # seconds per token
    print(f"memory bandwidth (a 512 MiB copy, read + written): {bw / 1e9:.1f} GB/s; float32 "
          f"weights {ours['weights'] / 2 ** 20:.0f} MiB, so a token takes at least "
          f"{floor * 1e3:.1f} ms")
    print(f"decode, {args.prompt}-token prompt then {args.new} new tokens, tokens/s "
          f"(min / median / max): minitx {_mmm(ours['decode'])}, transformers "
          f"{_mmm(theirs['decode'])}; minitx ÷ transformers "
          f"{statistics.median(ours['decode']) / statistics.median(theirs['decode']):.2f}×")
    best = max(ours["decode"])
    print(f"decode time ÷ the floor: {1 / best / floor:.2f}× (minitx's best), "
          f"{1 / max(theirs['decode']) / floor:.2f}× (transformers')")
    print(f"prefill of {args.prefill} tokens, s (min / median / max): minitx "
          f"{_mmm(ours['prefill'], '{:.3f}')}, transformers {_mmm(theirs['prefill'], '{:.3f}')}; "
          f"speed minitx ÷ transformers "
          f"{statistics.median(theirs['prefill']) / statistics.median(ours['prefill']):.2f}×")
    need = ours["weights"] + ours["cache"]
    print(f"peak RSS: minitx {ours['rss'] / 2 ** 20:.0f} MiB = {ours['rss'] / need:.2f}× the "
          f"weights + cache ({need / 2 ** 20:.0f} MiB); transformers "
          f"{theirs['rss'] / 2 ** 20:.0f} MiB")
    print(f"load time: minitx {ours['load_s']:.1f} s, transformers {theirs['load_s']:.1f} s")
    print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}  "
          f"({time.strftime('%Y-%m-%d %H:%M')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
