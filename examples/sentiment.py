"""Sentiment classification with a 2-layer transformer encoder — and what its attention finds.

    python examples/sentiment.py                 # generated reviews (labels depend on word order)
    python examples/sentiment.py --data aclImdb  # the IMDB folder layout (train/pos, train/neg, ...)
    python examples/sentiment.py --quick         # seconds, for tests
    python examples/sentiment.py --checkpoint-every 50 [--resume]   # stop and resume

The default corpus (``minitx.data.sentiment``) is built so that counting words is not enough:
"the plot was good but boring" is negative, "the plot was boring but good" positive, and
"not" flips the adjective after it. A learned [CLS] token is classified; its attention row in
the last layer shows which words the model reads. Prints accuracy, saves attention heatmaps
for three test reviews, lists the words with the most [CLS] attention, and ends with a
``RESULT {json}`` line.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

import minitx.functional as F
from minitx import nn, optim
from minitx.cli import (Checkpointing, add_checkpoint_args, add_common_args, result_line,
                        setup_run)
from minitx.data import Vocab, generate_reviews, load_imdb, pad_sequences
from minitx.viz import heatmap
from minitx.backend import to_host


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/sentiment")
    add_checkpoint_args(p)
    p.add_argument("--data", default=None, help="IMDB root folder (train/pos, train/neg, ...)")
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=48, help="tokens kept per review")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab-size", type=int, default=20000, help="cap for IMDB vocabularies")
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.test_size, args.epochs = 1200, 300, 4
    return args


def load(args):
    if args.data:
        train = load_imdb(args.data, "train", seed=args.seed)
        test = load_imdb(args.data, "test", seed=args.seed)
        if args.train_size:
            train = train[:args.train_size]
        if args.test_size:
            test = test[:args.test_size]
        source = f"IMDB folder {os.path.abspath(args.data)}"
    else:
        train = generate_reviews(args.train_size, seed=args.seed)
        test = generate_reviews(args.test_size, seed=args.seed + 10_000)
        source = "generated reviews (negation and 'but' decide the label)"
    return train, test, source


def encode(items, vocab, max_len):
    ids = [vocab.encode(text)[:max_len] for text, _ in items]
    length = max(len(i) for i in ids)                   # pad to the longest, not to max_len
    return pad_sequences(ids, vocab.pad_id, length), np.array([y for _, y in items])


def evaluate(model, x, y, batch_size=256):
    model.eval()
    correct = 0
    with minitx.no_grad():
        for s in range(0, len(x), batch_size):
            logits = model(minitx.tensor(x[s:s + batch_size]))
            correct += int((to_host(logits).argmax(-1) == y[s:s + batch_size]).sum())
    model.train()
    return correct / max(len(x), 1)


def main(argv=None):
    args = parse_args(argv)
    out = setup_run(args, "sentiment: 2-layer transformer encoder classifier",
                    full_run="The full run (`python examples/sentiment.py`; timed in "
                    "docs/benchmarks.md) reaches 98.4% test accuracy, and [CLS] puts 0.83 of its weight on "
                    "\"not\"; a smoke run's model is barely trained.")
    train, test, source = load(args)
    vocab = Vocab.build([t for t, _ in train], max_size=args.vocab_size)
    xtr, ytr = encode(train, vocab, args.max_len)
    xte, yte = encode(test, vocab, args.max_len)
    print(f"data: {source}; {len(train)} train / {len(test)} test reviews, vocabulary "
          f"{len(vocab)}, ≤ {args.max_len} tokens; positive share {ytr.mean():.2f}")
    print(f"example: {train[0][0]!r} → {'positive' if train[0][1] else 'negative'}")

    model = nn.EncoderClassifier(len(vocab), 2, d_model=args.d_model, nhead=args.heads,
                                 num_layers=args.layers, dropout=0.0, max_len=args.max_len,
                                 pooling="cls", position="sinusoidal", pad_idx=vocab.pad_id)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps = args.epochs * ((len(xtr) + args.batch_size - 1) // args.batch_size)
    sched = optim.WarmupCosine(opt, warmup_steps=min(50, steps // 10), total_steps=steps)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"{n_params:,} parameters; {steps} steps")

    # one loop over the steps; each epoch draws a new order of the training reviews. A
    # checkpoint holds the generator, the epoch's order (a resume may land mid-epoch) and the
    # loss history
    per_epoch = (len(xtr) + args.batch_size - 1) // args.batch_size
    ckpt = Checkpointing(args, model, opt, sched, total=steps)
    start, state = ckpt.start(gen=np.random.default_rng(args.seed),
                              order=np.arange(len(xtr)), losses=[])
    gen, order, losses = state["gen"], state["order"], state["losses"]
    t0 = time.perf_counter()
    bar = ckpt.progress("train")
    for step in range(start, steps):
        epoch, s = divmod(step, per_epoch)
        if s == 0:
            order = gen.permutation(len(xtr))
        idx = order[s * args.batch_size:(s + 1) * args.batch_size]
        logits = model(minitx.tensor(xtr[idx]))
        loss = F.cross_entropy(logits, minitx.tensor(ytr[idx]))
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.item()))
        bar.update({"loss": float(np.mean(losses[-20:]))})
        if s == per_epoch - 1:
            bar.write(f"epoch {epoch + 1}: mean loss "
                      f"{np.mean(losses[-(len(xtr) // args.batch_size):]):.4f}, test accuracy "
                      f"{evaluate(model, xte, yte):.3f}")
        ckpt.step_done(step + 1, gen=gen, order=order, losses=losses)
    bar.close()
    train_time = time.perf_counter() - t0
    acc = evaluate(model, xte, yte)
    train_acc = evaluate(model, xtr[:1000], ytr[:1000])
    print(f"accuracy: test {acc:.3f}, train {train_acc:.3f} (chance 0.5); training took "
          f"{train_time:.1f} s")

    # attention of the [CLS] token (position 0) in the last layer, averaged over heads
    model.eval()
    model.record_attention(True)
    word_weight = defaultdict(list)
    pictures = []
    with minitx.no_grad():
        for s in range(0, min(len(xte), 512), 128):
            model(minitx.tensor(xte[s:s + 128]))
            maps = model.attention_maps()
            last = to_host(maps[sorted(maps)[-1]])
            cls_row = last.mean(axis=1)[:, 0, 1:]                    # (B, N): CLS → tokens
            for b in range(cls_row.shape[0]):
                for j, tok in enumerate(xte[s + b]):
                    if tok != vocab.pad_id:
                        word_weight[vocab.itos[tok]].append(cls_row[b, j])
        picks = [i for i, (t, _) in enumerate(test) if " but " in f" {t} "][:1] + \
                [i for i, (t, _) in enumerate(test) if " not " in f" {t} " and " but " not in
                 f" {t} "][:1]
        picks += [i for i in range(len(test)) if i not in picks][:3 - len(picks)]
        for k, i in enumerate(picks):
            model(minitx.tensor(xte[i:i + 1]))
            maps = model.attention_maps()
            last = to_host(maps[sorted(maps)[-1]])[0]
            n = int((xte[i] != vocab.pad_id).sum())
            words = ["[CLS]"] + [vocab.itos[t] for t in xte[i][:n]]
            att = last.mean(axis=0)[:n + 1, :n + 1]
            pred = int(to_host(model(minitx.tensor(xte[i:i + 1]))).argmax())
            title = (f"label {'pos' if yte[i] else 'neg'}, predicted {'pos' if pred else 'neg'}"
                     f" — last layer, mean over heads")
            path = heatmap(att, words, words, os.path.join(out, f"attention_{k}.png"), title,
                           quiet=True)
            pictures.append(path)
            top = np.argsort(-att[0, 1:])[:3]
            print(f"review {k}: {' '.join(words[1:])!r}\n   [CLS] attends most to: "
                  + ", ".join(f"{words[1 + j]} ({att[0, 1 + j]:.2f})" for j in top)
                  + f"   → picture {path}")
    model.record_attention(False)
    mean_w = {w: float(np.mean(v)) for w, v in word_weight.items() if len(v) >= 5}
    top_words = sorted(mean_w, key=lambda w: -mean_w[w])[:10]
    print("words with the most [CLS] attention (mean weight over test reviews, last layer):")
    print("   " + ", ".join(f"{w} {mean_w[w]:.3f}" for w in top_words))
    result_line({"accuracy": round(acc, 4), "train_accuracy": round(train_acc, 4),
                 "train_time_s": round(train_time, 1), "steps": steps,
                 "pictures": pictures, "top_words": top_words, "out": out,
                 "final_loss": round(float(np.mean(losses[-20:])), 4)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
