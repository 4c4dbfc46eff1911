# %% [markdown]
# # Attention as recurrence: retention, the delta rule and SSD
#
# Causal softmax attention has to look back at every earlier token: its decoding cache grows
# with the sequence. Take the softmax away and attention becomes a *recurrence* over a fixed-size
# matrix state $S$ (one $D \times D$ matrix per head), and the same map can be computed in
# several forms:
#
# | variant | recurrence (per head) | quadratic form |
# |---|---|---|
# | retention (Sun et al. 2023) | $S_n = \gamma S_{n-1} + k_n^\top v_n,\; o_n = q_n S_n$ | $(QK^\top \odot \mathcal{D})V,\; \mathcal{D}_{nm} = \gamma^{n-m}$ |
# | delta rule (Schlag et al. 2021; Yang et al. 2024) | $S_t = S_{t-1}(I - \beta_t k_t k_t^\top) + \beta_t v_t k_t^\top$ | $(QK^\top \odot M)(I + A)^{-1}\operatorname{diag}(\beta) V$ |
# | SSD (Dao & Gu 2024) | $h_t = a_t h_{t-1} + B_t^\top x_t,\; y_t = C_t h_t$ | $(L \odot CB^\top) X,\; L_{ts} = a_{s+1}\cdots a_t$ |
#
# This notebook computes each variant in its forms with minitx, shows they agree (float64),
# and counts what each form costs as the sequence length $N$ grows.

# %%
import os
import time

import numpy as np

import minitx
import minitx.functional as F

# The registered layers, and the functions they are built from (the chunk, the recurrence,
# the scan), so that each form can be called on its own.
from minitx.attention import REGISTRY, linear_attention
from minitx.attention.delta_rule import delta_chunk, delta_rule_recurrent
from minitx.attention.retention import (RecurrentState, decayed_chunk, decayed_recurrence,
                                        run_in_chunks)
from minitx.attention.ssd import ssd_scan
from minitx.backend import to_host
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("05_attention_and_recurrence.py")   # no matplotlib: one line naming the extra

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")


def heads(n, d=4, h=2):
    """Random (1, h, n, d) float64 query, key and value heads."""
    return [minitx.tensor(rng.standard_normal((1, h, n, d)), dtype="float64") for _ in range(3)]


def max_diff(a, b):
    return float(np.abs(to_host(a) - to_host(b)).max())


# %% [markdown]
# ## 1. Retention: parallel, chunkwise, recurrent
#
# Retention replaces the softmax by a fixed decay: head $h$ weighs the key $m$ steps back by
# $\gamma_h^{m}$, with the paper's schedule $\gamma_h = 1 - 2^{-5-h}$. Three forms of one map:
#
# - **parallel**: $O = (QK^\top/\sqrt{D} \odot \mathcal{D})V$ — a masked matrix product, like
#   attention (training);
# - **recurrent**: $S_n = \gamma S_{n-1} + k_n^\top v_n/\sqrt{D}$, $o_n = q_n S_n$ — one token at a
#   time with a $D \times D$ state (decoding);
# - **chunkwise**: the parallel form inside chunks of $C$ tokens, the state between chunks.

# %%
N = 37
retention = REGISTRY["retention"](8, 2, causal=True).to(dtype="float64")
q, k, v = heads(N)
# One layer, three forms: chunk_size None is the parallel form, 8 the chunkwise one; the
# recurrence takes keys pre-scaled by 1/√D and log γ per head.
with minitx.no_grad():
    parallel = retention.attend(q, k, v)
    retention.chunk_size = 8
    chunkwise = retention.attend(q, k, v)
    retention.chunk_size = None
    recurrent, _ = decayed_recurrence(q, k * retention.scale, v, retention.log_decay(N, q))
diffs = {"retention: chunkwise (C = 8) vs parallel": max_diff(chunkwise, parallel),
         "retention: recurrent vs parallel": max_diff(recurrent, parallel)}
for claim, value in diffs.items():
    print(f"{claim:<45} max |Δ| = {value:.1e}")

# The decay mask D_nm = γ^(n−m) (zero above the diagonal) of both heads: the closer γ is to
# 1, the further back a head reads.
decay = retention.decay_matrix(16)                                     # (H, 16, 16)
fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
for h, ax in enumerate(axes):
    ax.imshow(decay[h], cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"D, head {h}: γ = {retention.gammas[h]:.4f}", xlabel="key m", ylabel="query n")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. The delta rule: chunkwise (UT transform) and recurrent
#
# Linear attention only adds to its memory. The delta rule reads what the memory holds for
# $k_t$ and writes the difference: $S_t = S_{t-1} + \beta_t (v_t - S_{t-1} k_t) k_t^\top$. Over a
# chunk, the corrections $u_t$ solve a unit lower-triangular system,
# $(I + A)\,U = \operatorname{diag}(\beta)(V - K S_0^\top)$ with $A_{ts} = \beta_t\, k_t \cdot k_s$
# $(s < t)$ — Yang et al.'s chunkwise form. Both forms agree:

# %%
q, k, v = heads(N)
qn, kn = (x / F.sqrt((x * x).sum(axis=-1, keepdims=True)) for x in (q, k))    # unit rows
beta = minitx.tensor(rng.uniform(0.1, 1.0, (1, 2, N)), dtype="float64")
with minitx.no_grad():
    by_token, _ = delta_rule_recurrent(qn, kn, v, beta)
    for c in (4, 16):
        chunked, _ = run_in_chunks(delta_chunk, qn, kn, v, beta, None, c)
        diffs[f"delta rule: chunkwise (C = {c}) vs recurrent"] = max_diff(chunked, by_token)
for claim, value in list(diffs.items())[-2:]:
    print(f"{claim:<45} max |Δ| = {value:.1e}")

# %% [markdown]
# Why the correction matters: write $k \to v_1$, then $k \to v_2$ with $\beta = 1$, and read $k$.
# The delta rule returns $v_2$ (the association was overwritten); linear attention returns
# $v_1 + v_2$, a mix it cannot undo.

# %%
key = np.array([0.6, 0.8, 0.0, 0.0])
v1, v2 = np.array([1.0, 0.0, 0.0, 2.0]), np.array([0.0, 0.0, 3.0, -1.0])
keys = minitx.tensor(np.stack([key, key])[None, None], dtype="float64")        # (1, 1, 2, 4)
values = minitx.tensor(np.stack([v1, v2])[None, None], dtype="float64")
with minitx.no_grad():
    delta_read = to_host(delta_rule_recurrent(keys, keys, values,
                                              minitx.tensor(np.ones((1, 1, 2))))[0])[0, 0, 1]
    linear_read = to_host(linear_attention(keys, keys, values, feature_map="identity",
                                           causal=True, normalize=False))[0, 0, 1]
print("v2                  ", v2)
print("delta rule reads    ", np.round(delta_read, 12))
print("linear attention    ", np.round(linear_read, 12))

# %% [markdown]
# ## 3. SSD: a state-space model is masked attention
#
# Mamba-2's selective SSM with a scalar decay $a_t$ per step unrolls to
# $y_t = \sum_{s \le t} (a_{s+1} \cdots a_t)\,(C_t \cdot B_s)\,x_s$: masked attention with queries $C$,
# keys $B$, values $X$ and the mask $L$ in place of the softmax. Retention is the case $a_t = \gamma$.
# Quadratic (attention), scan (recurrent) and chunked forms:

# %%
# Random C, B, X and decays a_t ∈ (0.6, 1), passed as log a: the forms add logs (prefix
# sums) instead of multiplying long products.
c_, b_, x_ = heads(N)
log_a = minitx.tensor(np.log(rng.uniform(0.6, 1.0, (1, 2, N))), dtype="float64")
with minitx.no_grad():
    quadratic, _ = decayed_chunk(c_, b_, x_, log_a)
    scanned, _ = ssd_scan(c_, b_, x_, log_a)
    chunks, _ = run_in_chunks(decayed_chunk, c_, b_, x_, log_a, None, 8)
diffs["SSD: scan vs masked attention"] = max_diff(scanned, quadratic)
diffs["SSD: chunked (Q = 8) vs masked attention"] = max_diff(chunks, quadratic)
for claim, value in list(diffs.items())[-2:]:
    print(f"{claim:<45} max |Δ| = {value:.1e}")

# A layer's L: a_t is computed from the input (selective), so unlike retention's fixed
# γ^(n−m) the decay changes along each row.
ssd = REGISTRY["ssd"](8, 2, causal=True).to(dtype="float64")
with minitx.no_grad():
    big_l = to_host(ssd.decay_matrix(heads(16)[2]))[0, 0]                       # (16, 16)
fig, ax = plt.subplots(figsize=(3.6, 3.2))
ax.imshow(big_l, cmap="viridis", vmin=0, vmax=1)
ax.set(title="SSD's L: input-dependent decay", xlabel="key s", ylabel="query t")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 4. What each form costs
#
# Multiply–adds per head for $N$ tokens of head dimension $D$ (keys and values alike), counted
# from the formulas as minitx computes them (the full $N \times N$ product, upper half included):
#
# | form | multiply–adds | memory besides the inputs |
# |---|---|---|
# | parallel / masked attention | $2N^2D + N^2$ | $N^2$ |
# | recurrent / scan | $3ND^2$ | $D^2$ |
# | chunkwise, chunk $C$ | $N(2CD + C + 3D^2)$ | $NC + D^2$ |
# | delta rule, chunkwise | $N(4CD + C^2/3 + 3D^2)$ | $NC + D^2$ |
#
# The quadratic form wins while $N$ is below about $1.5D$; beyond, the recurrence does. The
# chunkwise form keeps the matrix products of the quadratic one (what hardware is good at) at
# a cost linear in $N$.

# %%
D_HEAD, C = 64, 64
lengths = 2.0 ** np.arange(4, 17)


def counts(n, d=D_HEAD, c=C):
    return {"parallel (quadratic)": 2 * n * n * d + n * n,
            "recurrent": 3 * n * d * d,
            f"chunkwise (C = {c})": n * (2 * c * d + c + 3 * d * d),
            f"delta rule chunkwise (C = {c})": n * (4 * c * d + c * c / 3 + 3 * d * d)}


# Each count for N = 16 … 65536; the slope on log–log axes is the exponent of N: 2 for the
# quadratic form, 1 for the others.
table = {name: np.array([counts(n)[name] for n in lengths]) for name in counts(1)}
slopes = {name: float(np.polyfit(np.log(lengths), np.log(y), 1)[0]) for name, y in table.items()}
fig, ax = plt.subplots(figsize=(6, 4))
for name, y in table.items():
    ax.loglog(lengths, y, "o-", ms=3, label=f"{name} (slope {slopes[name]:.2f})")
ax.set(xlabel="sequence length N", ylabel="multiply–adds per head",
       title=f"counted cost, D = {D_HEAD}")
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()
# The first N where the quadratic form costs more than the recurrence: 2N²D + N² > 3ND²,
# i.e. N above about 1.5·D.
crossover = next(n for n in lengths if table["parallel (quadratic)"][list(lengths).index(n)]
                 > table["recurrent"][list(lengths).index(n)])
print(f"the quadratic form costs more than the recurrence from N = {int(crossover)} on "
      f"(1.5·D = {1.5 * D_HEAD:.0f})")

# %% [markdown]
# And the time minitx takes here, forward only, $D = 16$, two heads. These numbers are
# **illustrative**: one small shared machine, NumPy, and a Python loop per token in the
# recurrent form (its cost per step is mostly interpreter overhead, not arithmetic).

# %% tags=["measured"]
TIME_SIZES = [64, 128, 256, 512] if QUICK else [128, 256, 512, 1024]


def best_time(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


# Retention's three forms on the same inputs: parallel (one chunk), chunks of 64, and the
# token-by-token recurrence (timed once: it is the slowest).
def timed_forms(n):
    q, k, v = heads(n, d=16)
    log_g = retention.log_decay(n, q)
    with minitx.no_grad():
        return {"parallel": best_time(lambda: decayed_chunk(q, k, v, log_g)),
                "chunkwise (C = 64)": best_time(
                    lambda: run_in_chunks(decayed_chunk, q, k, v, log_g, None, 64)),
                "recurrent": best_time(lambda: decayed_recurrence(q, k, v, log_g), repeats=1)}


# Time against N on log–log axes (expected slopes: 2 parallel, 1 chunkwise and recurrent).
measured = [timed_forms(n) for n in TIME_SIZES]
fig, ax = plt.subplots(figsize=(6, 4))
for name in measured[0]:
    ax.loglog(TIME_SIZES, [m[name] * 1e3 for m in measured], "o-", label=name)
ax.set(xlabel="sequence length N", ylabel="forward time (ms)",
       title="retention's forms: measured time (illustrative)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for n, m in zip(TIME_SIZES, measured):
    print(f"N = {n:>5}: " + ", ".join(f"{k} {t * 1e3:.1f} ms" for k, t in m.items()))

# %% [markdown]
# ## 5. Decoding with a constant-size state
#
# Through a GPT, each recurrent variant's decode cache is its state (`RecurrentState`): after a
# prefill, one token at a time, the logits equal the full forward's, and the cache does not grow.

# %%
logit_diffs, state_sizes = {}, {}
idx = rng.integers(0, 32, (1, 24))
for name in ("retention", "deltanet", "ssd"):
    # Reseeded so each model's weights repeat; position "none": the decay alone orders tokens.
    minitx.manual_seed(SEED)
    model = minitx.models.GPT(minitx.models.GPTConfig(
        vocab_size=32, block_size=32, n_layer=2, n_head=2, n_embd=16, attention=name,
        position="none")).to(dtype="float64").eval()
    # The full forward, then a prefill of 8 tokens and 16 single-token steps through the caches,
    # recording the first layer's cache bytes after each call.
    with minitx.no_grad():
        full, _ = model(minitx.tensor(idx))
        caches = model.new_caches()
        parts = [model(minitx.tensor(idx[:, :8]), kv_caches=caches)[0]]
        sizes = [caches[0].nbytes]
        for t in range(8, 24):
            parts.append(model(minitx.tensor(idx[:, t:t + 1]), kv_caches=caches)[0])
            sizes.append(caches[0].nbytes)
    logit_diffs[name] = max_diff(np.concatenate([to_host(p) for p in parts], axis=1), full)
    state_sizes[name] = sorted(set(sizes))
    print(f"{name:<10} decoded logits vs full forward: max |Δ| = {logit_diffs[name]:.1e}; "
          f"state bytes after 8 … 24 tokens: {state_sizes[name]}")

# %% [markdown]
# ## What this notebook showed, checked

# %%
for claim, value in diffs.items():
    assert value < 1e-10, f"{claim}: the forms should agree, max |Δ| = {value:.1e}"
assert np.abs(delta_read - v2).max() < 1e-12, "the delta rule should return the new value"
assert np.abs(linear_read - (v1 + v2)).max() < 1e-12, "linear attention returns the sum"
assert abs(slopes["parallel (quadratic)"] - 2) < 0.05 and abs(slopes["recurrent"] - 1) < 1e-9
assert D_HEAD <= crossover <= 2 * D_HEAD, crossover
for name in logit_diffs:
    assert logit_diffs[name] < 1e-10, (name, logit_diffs[name])
    assert len(state_sizes[name]) == 1, f"{name}: the state should not grow"
assert isinstance(caches[0], RecurrentState)
print("all checks passed")
