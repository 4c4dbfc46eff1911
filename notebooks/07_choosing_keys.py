# %% [markdown]
# # Choosing keys: which keys each query reads, and how many
#
# The sparse patterns of 2020 fix, before any text is seen, which keys a query may read: a
# sliding window (Longformer's local attention), a window plus random and global blocks
# (BigBird). The attention of 2025 lets each query *choose*, by a cheap score, the keys it
# reads:
#
# | variant | what a query reads | keys read per query |
# |---|---|---|
# | DSA (DeepSeek-V3.2) | the $k$ keys its lightning indexer scores highest | $k$ |
# | MoBA (Lu et al. 2025) | its own block and the $k$ past blocks whose mean key it meets best | at most $(k + 1)\,b$ |
# | NSA (Yuan et al. 2025) | one mean per block, the keys of its top-$k$ blocks, a window of $w$ | at most $N/b + k\,b + w$ |
#
# (the formulas are in `minitx/attention/selection.py`). This notebook runs the three on one
# long sequence, draws what each query read beside the two fixed patterns, then counts the keys
# read per query as $N$ grows — from the choices themselves, not from the formulas.

# %%
import os

import numpy as np

import minitx
from minitx.attention import REGISTRY
from minitx.backend import to_host
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("07_choosing_keys.py")   # no matplotlib: one line naming the extra

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")

D, B_SIZE = 16, 32          # one head of 16; blocks (and windows) of 32 keys
TOP_K = 2                   # blocks chosen by score; DSA chooses TOP_K · B_SIZE keys
NSA_K = TOP_K + 3           # NSA's top-k counts its own, previous and first blocks, always read
OPTIONS = {
    "local": {"window": B_SIZE},
    "bigbird": {"block": B_SIZE, "num_random": 2, "num_global": 1},
    "dsa": {"top_k": TOP_K * B_SIZE},
    "moba": {"block": B_SIZE, "top_k": TOP_K},
    "nsa": {"block": B_SIZE, "top_k": NSA_K, "window": B_SIZE},
}


def layer(name):
    minitx.manual_seed(SEED)                  # the same indexer and gate weights at every N
    return REGISTRY[name](D, 1, causal=True, **OPTIONS[name]).to(dtype="float64").eval()


# %% [markdown]
# ## 1. What each query reads
#
# To give the choice something to find, the keys of two blocks (5 and 11) share a direction
# $u$ that every query also carries: a query that reads by content should find them, wherever
# it stands. The rest is noise.
#
# `keys_read` returns, for each query $t$ (a row) and key $s$ (a column), whether $t$ reads
# $s$ — from each variant's own choice: DSA's `select` (the indexer's top-$k$ keys), the
# blocks MoBA and NSA report on their `hook_selection`, spread over each block's keys and cut
# at $s \le t$; NSA adds its window. NSA's third branch reads one mean key per complete block,
# counted apart (`compressed`).

# %%
PLANTED = (5, 11)


def heads(n):
    """(1, 1, n, D) float64 q, k, v: noise, with u in every query and the planted blocks' keys."""
    q, k, v = (rng.standard_normal((1, 1, n, D)) for _ in range(3))
    u = np.zeros(D)
    u[0] = 3.0
    q = q + u
    for block in PLANTED:
        k[:, :, block * B_SIZE:(block + 1) * B_SIZE] += u
    return [minitx.tensor(a, dtype="float64") for a in (q, k, v)]


def keys_read(name, q, k, v):
    """(N, N) bool, True where query t reads key s; and (N,) block means read (NSA)."""
    n = q.shape[2]
    t, s = np.arange(n)[:, None], np.arange(n)[None, :]
    means = np.zeros(n, dtype=int)
    lay = layer(name)
    if name in ("local", "bigbird"):                       # 2020: the pattern is fixed
        return to_host(lay.pattern(n)).astype(bool), means
    with minitx.no_grad():
        if name == "dsa":
            index, valid = (to_host(a)[0] for a in lay.select(q, k))    # (N, c) each
            read = np.zeros((n, n), dtype=bool)
            np.put_along_axis(read, index, valid, axis=1)
            return read & (s <= t), means
        seen = {}
        with lay.hooks([("hook_selection", lambda x, hook: seen.setdefault("blocks", x))]):
            lay.attend(q, k, v)
    blocks = to_host(seen["blocks"].data)[0, 0]                          # (N, nb)
    read = blocks[:, s[0] // B_SIZE] & (s <= t)
    if name == "nsa":
        read |= (s <= t) & (t - s < B_SIZE)                              # the window
        means = (np.arange(n) + 1) // B_SIZE                            # complete blocks
    return read, means


N_DRAW = 512 if QUICK else 1024
q, k, v = heads(N_DRAW)
drawn = {name: keys_read(name, q, k, v) for name in OPTIONS}
for name, (read, means) in drawn.items():
    print(f"{name:<8} keys read per query: mean {read.sum(1).mean():6.1f}, "
          f"max {read.sum(1).max():4d}" + (f" (+ up to {means.max()} block means)"
                                         if means.any() else ""))

# %% [markdown]
# Each panel below is one variant at $N$ = 1,024 (512 in the quick setting): query $t$ down,
# key block across, shaded by the share of the block's keys the query reads (white: none;
# a square-root scale, so that a few keys of a block still show).
# The 2020 patterns are the same for any text; the 2025 choices follow the planted blocks.

# %%
nb = N_DRAW // B_SIZE
fig, axes = plt.subplots(1, len(drawn), figsize=(14, 3.6), sharey=True)
for ax, (name, (read, _)) in zip(axes, drawn.items()):
    share = read.reshape(N_DRAW, nb, B_SIZE).mean(axis=2)               # (N, nb)
    # the square root spreads the small shares (a few keys of a block) over the grey scale
    image = ax.imshow(np.sqrt(share), aspect="auto", cmap="Greys", vmin=0, vmax=1,
                      interpolation="nearest")
    ax.set(title=name + (" (2020)" if name in ("local", "bigbird") else " (2025)"),
           xlabel=f"key block ({B_SIZE} keys)")
    for block in PLANTED:
        ax.axvline(block, color="tab:red", lw=0.6, alpha=0.5)
axes[0].set_ylabel("query t")
bar = fig.colorbar(image, ax=axes, fraction=0.02, pad=0.01)
bar.set_ticks(np.sqrt([0.01, 0.1, 0.5, 1.0]), labels=["1%", "10%", "50%", "all"])
bar.set_label("keys of the block read")
plt.show()

# %% [markdown]
# Local attention reads the diagonal band; BigBird adds its global first block and two
# random blocks per query block, the same whatever the keys say. MoBA reads its own block
# (the diagonal) and, once they are behind it, the two planted blocks (red lines): its gate
# is the query against each block's mean key, and the planted means carry $u$. NSA reads the
# planted blocks too (its compressed branch's probabilities rank the blocks; its top-$k$ of 5
# counts its own and previous blocks and the first, always read), and a window. DSA's indexer
# is an untrained random projection here, so its choice is spread thinly over the past, a few
# keys of many blocks: it chooses key by key, not block by block.
#
# ## 2. Keys read per query, against N
#
# Dense causal attention reads $t + 1$ keys at query $t$: on average $(N + 1)/2$, growing with
# $N$. A sliding window reads at most $w + 1$; the choosers read a fixed budget however long
# the text is. Counted from the choices at each $N$:

# %%
SIZES = [128, 256, 512, 1024] if QUICK else [256, 512, 1024, 2048]
counts = {name: [] for name in ["dense"] + list(OPTIONS)}
for n in SIZES:
    q, k, v = heads(n)
    counts["dense"].append(np.arange(1, n + 1).mean())                 # query t reads t + 1
    for name in OPTIONS:
        read, means = keys_read(name, q, k, v)
        counts[name].append((read.sum(axis=1) + means).mean())
# p in count ∝ N^p: the least-squares slope of log count against log N
slope = {name: float(np.polyfit(np.log(SIZES), np.log(c), 1)[0]) for name, c in counts.items()}
print(f"{'mean keys read per query':<26}" + "".join(f"{'N = ' + str(n):>10}" for n in SIZES)
      + "   p (∝ N^p)")
for name, c in counts.items():
    print(f"{name:<26}" + "".join(f"{x:>10.1f}" for x in c) + f"   {slope[name]:.2f}")

# the same counts on log-log axes: a slope of 1 doubles with N, a flat line is a budget
fig, ax = plt.subplots(figsize=(6, 3.8))
for name, c in counts.items():
    ax.loglog(SIZES, c, "o-", label=f"{name} (p = {slope[name]:.2f})")
ax.set(xlabel="sequence length N", ylabel="mean keys read per query",
       title="keys read per query (NSA: with its block means)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Dense attention's count doubles with $N$ ($p = 1$), so its total work grows like $N^2$. The
# choosers' counts level off at their budgets — DSA's $k$ keys, MoBA's $(k + 1)\,b$, NSA's
# $k\,b + w$ plus one mean per block (that last term does grow, $N/b$: NSA's compressed branch
# is the part of it that still reads everything, $b$ times more cheaply). The totals are
# $O(N \cdot k)$, as the local window's is.
#
# What the count does not show is what reading the keys costs. DSA copies each query's $k$
# chosen keys, $(N, k, D)$ numbers. MoBA and NSA choose whole blocks, and many queries choose
# the same block, so minitx scores each chosen block's keys against all the queries that
# chose it at once (`block_attention`): no key is copied per query.
# `benchmarks/attention_2025.py` measures what each costs at $N$ = 8,192.
#
# ## What this notebook showed, checked

# %%
# MoBA's gate finds the planted blocks: most queries past both read keys of each
read, _ = drawn["moba"]
late = read[(max(PLANTED) + 1) * B_SIZE:]
for block in PLANTED:
    share = late[:, block * B_SIZE:(block + 1) * B_SIZE].any(axis=1).mean()
    assert share > 0.8, f"MoBA should find planted block {block} for most later queries: {share}"
# no variant reads a key after its query
for name, (read, means) in drawn.items():
    t = np.arange(N_DRAW)
    assert not (read & (t[None, :] > t[:, None])).any(), f"{name} read a future key"
# the budgets of the table at the top, and how the counts grow with N
per_query = {n: drawn[n][0].sum(axis=1) for n in ("dsa", "moba", "nsa")}
assert per_query["dsa"].max() <= TOP_K * B_SIZE
assert per_query["moba"].max() <= (TOP_K + 1) * B_SIZE
assert per_query["nsa"].max() <= NSA_K * B_SIZE + B_SIZE
assert slope["dense"] > 0.95, slope
for name in ("local", "dsa", "moba"):
    assert slope[name] < 0.25, f"{name}'s keys per query should level off: p = {slope[name]:.2f}"
assert slope["nsa"] < 0.6, f"NSA: a budget plus N/b means: p = {slope['nsa']:.2f}"
print("all checks passed")
