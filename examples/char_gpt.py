"""A character-level GPT trained on Python's own standard-library sources, or on your text.

    python examples/char_gpt.py                  # a few minutes on 2 cores
    python examples/char_gpt.py --quick          # seconds, for tests
    python examples/char_gpt.py --text my.txt    # your own text (UTF-8)
    python examples/char_gpt.py --checkpoint-every 100          # stop it any time, then
    python examples/char_gpt.py --checkpoint-every 100 --resume  # the same run, bit for bit

The default text is on every machine (``minitx.data.stdlib_corpus``: files under
``os.path.dirname(os.__file__)``). Trains with AdamW and a warm-up/cosine schedule, saves the
loss curve, samples through the KV cache (each new character runs one position through the
model; earlier keys/values come from the cache), saves per-head attention maps for one
sample and measures each head's "previous-token" score — the mean attention from position t
to t − 1; a head near 1.0 has learned to look one character back. Ends with
``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

from minitx import nn, optim
from minitx.cli import (Checkpointing, add_checkpoint_args, add_common_args, result_line,
                        setup_run)
from minitx.data import CharVocab, lm_batch, stdlib_corpus
from minitx.viz import heatmap_grid, line_plot
from minitx.backend import to_host


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/char_gpt")
    add_checkpoint_args(p)
    p.add_argument("--text", default=None, metavar="FILE",
                   help="train on this UTF-8 text file instead of the standard library's sources")
    p.add_argument("--chars", type=int, default=300_000,
                   help="characters of the standard-library corpus")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block", type=int, default=64, help="context length")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sample-len", type=int, default=300)
    p.add_argument("--prompt", default=None,
                   help='start of the sample (default "def ", or the first characters of --text)')
    args = p.parse_args(argv)
    if args.quick:
        args.chars, args.steps, args.block, args.d_model = 40_000, 60, 32, 32
        args.sample_len, args.batch_size = 60, 8
    return args


def read_text(path, block):
    """The user's ``--text``: UTF-8, at least ``block + 1`` characters (one window and the
    character after it) of at least two different characters. Anything else is refused, naming
    the file, with exit status 2."""
    def refuse(why):
        print(f"error: --text {path!r}: {why}", file=sys.stderr)
        raise SystemExit(2)
    if not os.path.exists(path):
        refuse("does not exist")
    if os.path.isdir(path):
        refuse("is a folder, not a text file")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        refuse(f"cannot be read ({exc.strerror or exc})")
    if not raw:
        refuse("is empty")
    if b"\0" in raw:
        nul = raw.index(b"\0")
        refuse(f"is binary, not text (a NUL byte at offset {nul})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        refuse(f"is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})")
    if len(text) < block + 1:
        refuse(f"has {len(text)} characters; a context of {block} needs at least {block + 1} "
               "(a window and the character after it; --block sets the context)")
    if len(set(text)) < 2:
        refuse(f"has one distinct character ({text[0]!r}): there is nothing to predict")
    return text


def draw_batch(data, batch_size, block, gen):
    """``lm_batch``'s random windows; a text of exactly ``block + 1`` characters has one window
    (``lm_batch`` needs one character more: it draws a start below ``len - block - 1``)."""
    if len(data) > block + 1:
        return lm_batch(data, batch_size, block, gen)
    return (np.repeat(data[None, :block], batch_size, 0),
            np.repeat(data[None, 1:], batch_size, 0))


def eval_loss(model, data, block, gen, batches=4, batch_size=16):
    model.eval()
    total = 0.0
    with minitx.no_grad():
        for _ in range(batches):
            x, y = draw_batch(data, batch_size, block, gen)
            _, loss = model(minitx.tensor(x), minitx.tensor(y))
            total += float(loss.item())
    model.train()
    return total / batches


def main(argv=None):
    args = parse_args(argv)
    if args.text:               # the user's text: no figure measured on the stdlib applies
        title = f"char_gpt: a character-level GPT on {os.path.basename(args.text)}"
        full_run = (f"The full run (`python examples/char_gpt.py --text {args.text}`) trains "
                    "800 steps by default: its loss starts near the uniform guess printed "
                    "below and falls as the model learns this text.")
    else:
        title = "char_gpt: a character-level GPT on the Python standard library"
        full_run = ("The full run (`python examples/char_gpt.py`; its measured time is in "
                    "docs/benchmarks.md) trains the model: loss 4.30 → 1.94 (held-out 2.00; "
                    "uniform 4.56) and shows a previous-token head (L0H3, score 0.32); an "
                    "untrained head scores near the uniform baseline printed with the scores.")
    out = setup_run(args, title, full_run=full_run)
    text = read_text(args.text, args.block) if args.text else stdlib_corpus(args.chars)
    vocab = CharVocab(text)
    data = np.array(vocab.encode(text), dtype=np.int64)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    source = f"of {args.text}" if args.text else "of stdlib sources"
    if min(len(train), len(val)) < args.block + 1:   # too short to hold a tenth out
        train = val = data
        source += " (too short to hold some out: the held-out loss is on the training text)"
    print(f"corpus: {len(text):,} characters {source}, {len(vocab)} distinct; "
          f"uniform guess loss ln({len(vocab)}) = {math.log(len(vocab)):.3f}")
    cfg = nn.GPTConfig(vocab_size=len(vocab), block_size=args.block, n_layer=args.layers,
                       n_head=args.heads, n_embd=args.d_model, dropout=0.0)
    model = nn.GPT(cfg)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.99))
    sched = optim.WarmupCosine(opt, warmup_steps=max(1, args.steps // 20),
                               total_steps=args.steps, min_lr=args.lr / 10)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"model: {args.layers} layers, {args.heads} heads, d_model {args.d_model}, context "
          f"{args.block}, {n_params:,} parameters; {args.steps} steps of {args.batch_size}")

    # the run's state besides the model, optimizer and schedule: the data generators and the
    # loss history, saved with every checkpoint and restored by --resume
    ckpt = Checkpointing(args, model, opt, sched, total=args.steps)
    start, state = ckpt.start(gen=np.random.default_rng(args.seed),
                              egen=np.random.default_rng(args.seed + 1), losses=[],
                              val_points=[])
    gen, egen, losses = state["gen"], state["egen"], state["losses"]
    val_points = [tuple(p) for p in state["val_points"]]
    bar = ckpt.progress("train")
    t0 = time.perf_counter()
    every = max(1, args.steps // 8)
    for step in range(start, args.steps):
        x, y = draw_batch(train, args.batch_size, args.block, gen)
        _, loss = model(minitx.tensor(x), minitx.tensor(y))
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.item()))
        if (step + 1) % every == 0 or step == args.steps - 1:
            val_points.append((step + 1, eval_loss(model, val, args.block, egen)))
        bar.update({"loss": float(np.mean(losses[-20:]))})
        ckpt.step_done(step + 1, gen=gen, egen=egen, losses=losses, val_points=val_points)
    bar.close()
    train_time = time.perf_counter() - t0
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-20:]))
    print(f"loss: first 10 steps {first:.3f} → last 20 steps {last:.3f}; held-out "
          f"{val_points[-1][1]:.3f}; {train_time:.1f} s "
          f"({1e3 * train_time / max(1, args.steps - start):.0f} ms/step)")
    smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
    curve = line_plot({"train (10-step mean)": (np.arange(10, len(losses) + 1), smooth),
                       "held-out": ([p[0] for p in val_points], [p[1] for p in val_points])},
                      path=os.path.join(out, "loss_curve.png"), title="char GPT: loss",
                      xlabel="step", ylabel="cross-entropy (nats)", quiet=True)
    print(f"loss curve: {curve}")

    prompt_text = args.prompt if args.prompt is not None else \
        text[:min(4, args.block)] if args.text else "def "
    prompt = np.array([vocab.encode(prompt_text)], dtype=np.int64)
    if prompt.size == 0:
        print(f"error: --prompt {prompt_text!r} has no character of the text", file=sys.stderr)
        return 2
    minitx.manual_seed(args.seed)
    t1 = time.perf_counter()
    sample_ids = to_host(model.generate(minitx.tensor(prompt), args.sample_len,
                                        temperature=0.8, top_k=min(10, len(vocab)),
                                        use_cache=True))
    per_char = (time.perf_counter() - t1) / args.sample_len
    sample = vocab.decode(sample_ids[0])
    print(f"sample (temperature 0.8, top-k {min(10, len(vocab))}, KV cache, "
          f"{1e3 * per_char:.1f} ms/char):")
    print("-" * 60 + "\n" + sample + "\n" + "-" * 60)

    # attention maps of every head on the first `block` characters of the sample
    window = sample_ids[:, :args.block]
    model.eval()
    model.record_attention(True)
    with minitx.no_grad():
        model(minitx.tensor(window))
    maps = model.attention_maps()
    model.record_attention(False)
    mats, titles, scores = [], [], {}
    for li, name in enumerate(sorted(maps)):
        a = to_host(maps[name])[0]                                    # (H, T, T)
        for h in range(a.shape[0]):
            t = a.shape[-1]
            prev = float(np.mean([a[h, i, i - 1] for i in range(1, t)]))
            scores[f"L{li}H{h}"] = round(prev, 3)
            mats.append(a[h])
            titles.append(f"layer {li} head {h}: prev-token {prev:.2f}")
    labels = [repr(c)[1:-1] or " " for c in vocab.decode(window[0])]
    grid = heatmap_grid(mats, titles, os.path.join(out, "attention_heads.png"),
                        suptitle="per-head attention on one sample", quiet=True,
                        labels=labels if len(labels) <= 40 else None) if mats else None
    print("previous-token score per head (mean attention from t to t−1; uniform causal "
          f"attention would give ≈ {np.mean([1 / t for t in range(2, args.block + 1)]):.2f}):")
    print("   " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    if scores:
        best = max(scores, key=scores.get)
        print(f"   strongest previous-token head: {best} ({scores[best]:.2f})")
    print(f"attention maps: {grid}")
    result_line({"first_loss": round(first, 4), "final_loss": round(last, 4),
                 "val_loss": round(val_points[-1][1], 4), "uniform_loss": round(
                     math.log(len(vocab)), 4), "prev_token_scores": scores,
                 "train_time_s": round(train_time, 1), "ms_per_char": round(1e3 * per_char, 2),
                 "sample": sample[:200], "pictures": [p for p in (curve, grid) if p],
                 "out": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
