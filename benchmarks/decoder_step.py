"""One float32 training step of today's decoders: minitx (NumPy) beside transformers on
PyTorch (CPU), the same weights, in the same run.

    python benchmarks/decoder_step.py [--repeats 10] [--batch 8] [--tokens 128] [--threads N]
                                      [--model {all,llama,moe,gemma4}] [--quick]

Three models, each 2 layers with E = 256 (4 heads sharing 2 key/value heads, V = 1024):

- a Llama (SwiGLU of width 704, RMSNorm, RoPE);
- a Mixtral-style mixture of experts (8 SwiGLU experts of width 704, 2 per token);
- a Gemma-4-style decoder (``gemma4_text``): a sliding layer (window 64) and a global layer
  whose one key/value head of 128 is also its values, the proportional rope, values
  normalised, the sandwich norms, GeGLU of width 704, layer scalars.

Each is built once in minitx (``Decoder``), handed to ``transformers`` by
``interop.to_torch`` (the same weights), and trained one step at a time in both: forward,
next-token cross-entropy, backward, AdamW. The two libraries are timed alternately after a
warm-up step, so that a change in machine load hits both; medians and minima are printed with
the ratio minitx / torch (above 1: minitx is slower), the thread counts, and the load average
before and after (figures taken while other jobs compete for the cores are not comparable).
The ``paired`` column is the median over the repeats of each minitx step over the torch step
timed right after it, which a load that changes from one repeat to the next disturbs less; the
last line repeats the mixture of experts' ratios. ``--model moe`` (or ``llama``, ``gemma4``)
times one model.
``--threads N`` sets both libraries' thread count (BLAS through OMP/OPENBLAS/MKL_NUM_THREADS,
set before NumPy is imported; PyTorch through ``torch.set_num_threads``). ``--quick``: B = 2,
T = 16, 2 repeats (a smoke run, no figures to quote). Without PyTorch and transformers only
minitx is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

E, LAYERS, HEADS, KV_HEADS, VOCAB, WIDTH = 256, 2, 4, 2, 1024, 704


LLAMA, MOE = "llama (E=256, 2 layers)", "mixtral-style MoE (8 experts, top 2)"
GEMMA4 = "gemma-4-style (sliding + global, K = V)"


def configs(model="all"):
    from minitx.models import DecoderConfig
    base = dict(vocab_size=VOCAB, hidden_size=E, num_layers=LAYERS, num_heads=HEADS,
                num_kv_heads=KV_HEADS, ffn_hidden=WIDTH, norm_eps=1e-5, tie_embeddings=False,
                rope={"rope_type": "default", "rope_theta": 10000.0})
    gemma4 = dict(base, rope={"rope_type": "proportional", "partial_rotary_factor": 0.25,
                              "rope_theta": 1e6},
                  local_rope={"rope_type": "default", "rope_theta": 1e4}, mlp="geglu",
                  norm_placement="sandwich", norm_scale_in_float32=True, qk_norm="head",
                  embed_scale=True, query_pre_attn_scalar=1.0, sliding_window=64,
                  layer_types=("sliding", "full"), full_head_dim=128, full_kv_heads=1,
                  attention_k_eq_v=True, v_norm=True, layer_scalars=True, tie_embeddings=True)
    every = {LLAMA: DecoderConfig(**base),
             MOE: DecoderConfig(**base, mlp="moe", num_experts=8, top_k=2, expert_hidden=WIDTH),
             GEMMA4: DecoderConfig(**gemma4)}
    wanted = {"all": (LLAMA, MOE, GEMMA4), "llama": (LLAMA,), "moe": (MOE,),
              "gemma4": (GEMMA4,)}[model]
    return {name: every[name] for name in wanted}


def minitx_step(model, opt, ids):
    from minitx.ops.loss import cross_entropy
    from minitx.ops.shape import reshape
    logits = model(ids[:, :-1])
    loss = cross_entropy(reshape(logits, (-1, logits.shape[-1])), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())


def torch_step(torch, model, opt, ids):
    out = model(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                             ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def timed(fn):
    t = time.perf_counter()
    loss = fn()
    return time.perf_counter() - t, loss


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--model", choices=("all", "llama", "moe", "gemma4"), default="all")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.batch, args.tokens = 2, 2, 16
    if args.threads:                       # before NumPy's BLAS starts its thread pool
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import numpy as np

    import minitx
    import minitx.interop as interop
    from minitx.models import Decoder
    from minitx.optim import AdamW
    try:
        import torch
        import transformers
    except ImportError:
        torch = None
    if torch is not None and args.threads:
        torch.set_num_threads(args.threads)
    print(f"one training step (forward, backward, AdamW), float32, B={args.batch}, "
          f"T={args.tokens}, {args.repeats} repeats; load average {os.getloadavg()[0]:.2f}")
    if torch is None:
        print("PyTorch or transformers is not installed: minitx only")
    else:
        print(f"threads: torch {torch.get_num_threads()}, "
              f"BLAS {os.environ.get('OMP_NUM_THREADS', 'default')}")
    ids = np.random.default_rng(0).integers(0, VOCAB, (args.batch, args.tokens + 1))
    print(f"{'model':40s} {'minitx ms':>10s} {'torch ms':>10s} {'ratio':>7s} {'paired':>7s}"
          "  (median; min)")
    moe_line = None
    for name, config in configs(args.model).items():
        minitx.manual_seed(0)
        model = Decoder(config)
        model.train()
        theirs = None
        if torch is not None:
            # the same weights in HF's model as it runs by default (its grouped expert
            # products in float32; to_torch picks the eager loop, which also runs float64)
            eager = interop.to_torch(model)
            cfg = transformers.AutoConfig.for_model(**eager.config.to_diff_dict())
            theirs = transformers.AutoModelForCausalLM.from_config(cfg).train()
            theirs.load_state_dict(eager.state_dict())
            t_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
            t_ids = torch.tensor(ids)
        opt = AdamW(model.parameters(), lr=1e-3)
        mine, ref = [], []
        for r in range(args.repeats + 1):                  # the first step warms up
            t, loss = timed(lambda: minitx_step(model, opt, ids))
            if r:
                mine.append(t)
            if theirs is not None:
                t, t_loss = timed(lambda: torch_step(torch, theirs, t_opt, t_ids))
                if r:
                    ref.append(t)
                if r == 0:                                 # the same weights, the same loss
                    assert abs(loss - t_loss) <= 1e-4 * abs(t_loss), (loss, t_loss)
        m = statistics.median(mine) * 1e3
        if ref:
            t = statistics.median(ref) * 1e3
            paired = statistics.median(a / b for a, b in zip(mine, ref))
            print(f"{name:40s} {m:10.1f} {t:10.1f} {m / t:6.2f}× {paired:6.2f}×  "
                  f"(min {min(mine) * 1e3:.1f} / {min(ref) * 1e3:.1f})")
            if name == MOE:
                moe_line = (f"mixture of experts, minitx / torch: {m / t:.2f}× (medians), "
                            f"{paired:.2f}× (paired), {min(mine) / min(ref):.2f}× (minima)")
        else:
            print(f"{name:40s} {m:10.1f} {'—':>10s} {'—':>7s}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if moe_line:
        print(moe_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
