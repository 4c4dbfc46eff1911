# %% [markdown]
# # Attention by hand
#
# Scaled dot-product attention, softmax's Jacobian, and why we divide by $\sqrt{d_k}$ — every
# number computed by minitx, nothing pasted. This is `python -m minitx`'s tour as a notebook.
#
# For queries $Q \in \mathbb{R}^{N \times d_k}$, keys $K \in \mathbb{R}^{N \times d_k}$ and
# values $V \in \mathbb{R}^{N \times d_v}$,
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V,$$
#
# where the softmax runs along each row: row $i$ holds how much query $i$ attends to each key.

# %%
import math
import os

import numpy as np

import minitx
import minitx.functional as F
from minitx.backend import to_host
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("01_attention_by_hand.py")   # no matplotlib: one line naming the extra

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")

# %% [markdown]
# ## 1. Three tokens, $d_k = 2$
#
# Take $Q = K = V = X$ with rows $x_1 = (1, 0)$, $x_2 = (0, 1)$ and $x_3 = (1, 1)$ — token 3 is
# the sum of the other two. The scores are $S = X X^\top / \sqrt{2}$: entry $S_{ij}$ measures how
# well query $i$ matches key $j$.

# %%
X = minitx.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype="float64")   # (N, d_k) = (3, 2)
d_k = X.shape[-1]
scores = F.matmul(X, X.T) / math.sqrt(d_k)          # (3, 2) @ (2, 3) -> (3, 3)
weights = F.softmax(scores, axis=-1)                # each row sums to 1
out = F.matmul(weights, X)                          # (3, 3) @ (3, 2) -> (3, 2)
S, W, O = (to_host(t) for t in (scores, weights, out))
np.set_printoptions(precision=4, suppress=True)
print("scores S = Q Kᵀ/√d_k\n", S)
print("weights softmax(S)\n", W)
print("output  softmax(S) V\n", O)

# %% [markdown]
# Each output row is a weighted mix of the value rows. Token 3 matches itself best
# ($x_3 \cdot x_3 / \sqrt 2 = \sqrt 2$), so it keeps most of its weight; tokens 1 and 2 share
# theirs between themselves and token 3, which contains them.

# %%
fig, axes = plt.subplots(1, 2, figsize=(7, 3))
for ax, m, title in ((axes[0], S, "scores $QK^T/\\sqrt{d_k}$"), (axes[1], W, "weights (softmax)")):
    im = ax.imshow(m, cmap="viridis")
    for i in range(3):
        for j in range(3):
            ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", color="w", fontsize=9)
    ax.set_xticks(range(3), ["key 1", "key 2", "key 3"])
    ax.set_yticks(range(3), ["query 1", "query 2", "query 3"])
    ax.set_title(title)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. The Jacobian of softmax
#
# With $s = \operatorname{softmax}(x)$, $s_i = e^{x_i} / \sum_j e^{x_j}$, the derivative is
#
# $$\frac{\partial s_i}{\partial x_j} = s_i(\delta_{ij} - s_j), \qquad J = \operatorname{diag}(s) - s s^\top .$$
#
# Its rows sum to zero (the outputs always sum to 1, so no change of $x$ can change their sum),
# and it is symmetric. minitx's `F.softmax_jacobian` builds $J$ from this formula; autograd
# gets row $i$ independently, by back-propagating $s_i$ alone through `F.softmax`'s backward.

# %%
values = [1.0, 2.0, 0.5, -1.0]
x = minitx.tensor(values, dtype="float64")
J = to_host(F.softmax_jacobian(x))                   # (4, 4) from the closed form
rows = []
for i in range(len(values)):
    xi = minitx.tensor(values, dtype="float64", requires_grad=True)
    F.softmax(xi, axis=-1)[i].backward()             # ∂s_i/∂x by reverse mode
    rows.append(to_host(xi.grad))
J_autograd = np.stack(rows)
s = to_host(F.softmax(x))
jacobian_gap = np.abs(J - J_autograd).max()
print("s =", s)
print("J = diag(s) − s sᵀ\n", J)
print(f"max |J − autograd| = {jacobian_gap:.1e};  max |row sum| = {np.abs(J.sum(1)).max():.1e}")

# %% [markdown]
# The formula and autograd agree to rounding ($\sim 10^{-17}$ in float64). The same check, by
# central differences, is what `minitx.gradcheck` runs for every op:

# %%
xg = minitx.tensor(rng.standard_normal((3, 5)), dtype="float64", requires_grad=True)
gradcheck_ok = minitx.gradcheck(lambda t: F.softmax(t, axis=-1), (xg,))
print("gradcheck of softmax on a (3, 5) input:", gradcheck_ok)

# %% [markdown]
# ## 3. Why divide by $\sqrt{d_k}$
#
# If $q, k \in \mathbb{R}^{d_k}$ have independent entries with mean 0 and variance 1, then
# $q \cdot k = \sum_{m=1}^{d_k} q_m k_m$ is a sum of $d_k$ independent terms of variance 1, so
#
# $$\operatorname{Var}(q \cdot k) = d_k, \qquad \operatorname{Var}\!\left(\frac{q \cdot k}{\sqrt{d_k}}\right) = 1 .$$
#
# Unscaled, the scores spread out as $d_k$ grows; softmax of widely spread scores is nearly
# one-hot, and for a one-hot $s$ the Jacobian $\operatorname{diag}(s) - s s^\top$ is exactly
# zero — the gradient reaching the scores vanishes. Measured:

# %%
dims = (4, 16, 64, 256) if QUICK else (4, 16, 64, 256, 1024)
samples = 4000 if QUICK else 20000
n_keys, n_queries = 16, 200
table = []
# For each d_k: Var(q·k) over many random pairs, and for rows of 16 keys the softmax's
# largest weight and the Frobenius norm of its Jacobian, unscaled and scaled by 1/√d_k.
for d in dims:
    q = rng.standard_normal((samples, d))
    k = rng.standard_normal((samples, d))
    dots = (q * k).sum(-1)
    qs = rng.standard_normal((n_queries, 1, d))
    ks = rng.standard_normal((n_queries, n_keys, d))
    raw = (qs * ks).sum(-1)                          # (queries, keys)
    row = {"d_k": d, "var_raw": dots.var(), "var_scaled": (dots / math.sqrt(d)).var()}
    # ‖J‖_F near 0 means almost no gradient reaches the scores: the softmax has saturated.
    for label, sc in (("raw", raw), ("scaled", raw / math.sqrt(d))):
        t = minitx.tensor(sc, dtype="float64")
        w = to_host(F.softmax(t, axis=-1))
        jac = to_host(F.softmax_jacobian(t))        # (queries, keys, keys)
        row[f"maxw_{label}"] = w.max(-1).mean()
        row[f"J_{label}"] = np.median(np.sqrt((jac ** 2).sum(axis=(-2, -1))))
    table.append(row)
print(f"{'d_k':>5} {'Var(q·k)':>9} {'Var scaled':>10} {'max w raw':>10} {'max w scaled':>12} "
      f"{'‖J‖ raw':>9} {'‖J‖ scaled':>10}")
for r in table:
    print(f"{r['d_k']:>5} {r['var_raw']:>9.1f} {r['var_scaled']:>10.3f} {r['maxw_raw']:>10.3f} "
          f"{r['maxw_scaled']:>12.3f} {r['J_raw']:>9.2e} {r['J_scaled']:>10.2e}")

# %%
d_axis = [r["d_k"] for r in table]
fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
# Left: score variance against d_k (dotted: the line d_k itself).
axes[0].loglog(d_axis, [r["var_raw"] for r in table], "o-", label="$q\\cdot k$")
axes[0].loglog(d_axis, [r["var_scaled"] for r in table], "s-", label="$q\\cdot k/\\sqrt{d_k}$")
axes[0].loglog(d_axis, d_axis, "k:", label="$d_k$")
axes[0].set(xlabel="$d_k$", ylabel="variance", title="score variance")
# Middle: the mean largest weight (dotted: 1/16, uniform attention over the 16 keys).
axes[1].semilogx(d_axis, [r["maxw_raw"] for r in table], "o-", label="unscaled")
axes[1].semilogx(d_axis, [r["maxw_scaled"] for r in table], "s-", label="scaled")
axes[1].axhline(1 / n_keys, color="k", ls=":", label="uniform")
axes[1].set(xlabel="$d_k$", ylabel="mean max weight", title="softmax saturation")
# Right: the Jacobian's size, how much gradient gets through the softmax.
axes[2].loglog(d_axis, [r["J_raw"] for r in table], "o-", label="unscaled")
axes[2].loglog(d_axis, [r["J_scaled"] for r in table], "s-", label="scaled")
axes[2].set(xlabel="$d_k$", ylabel="median $\\|J\\|_F$", title="gradient through softmax")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Unscaled, the variance follows the dotted line $d_k$, the largest weight climbs towards 1 and
# the Jacobian's norm collapses; scaled, all three stay put whatever $d_k$. That is the whole
# reason for the $1/\sqrt{d_k}$ in Vaswani et al. (2017).
#
# ## What this notebook showed, checked

# %%
assert np.allclose(W.sum(-1), 1.0), "softmax rows must sum to 1"
assert W[2].argmax() == 2, "token 3 attends most to itself"
assert np.allclose(O, W @ to_host(X)), "the output is the weighted mix of the values"
assert jacobian_gap < 1e-12, f"softmax Jacobian formula vs autograd: {jacobian_gap:.1e}"
assert np.allclose(J, J.T) and np.abs(J.sum(1)).max() < 1e-12, "J is symmetric, rows sum to 0"
assert gradcheck_ok
for r in table:   # Var(q·k) ≈ d_k (within sampling error), scaled ≈ 1
    assert abs(r["var_raw"] / r["d_k"] - 1) < 0.15, r
    assert abs(r["var_scaled"] - 1) < 0.15, r
assert table[-1]["maxw_raw"] > 0.85 > 0.3 > table[-1]["maxw_scaled"], "unscaled softmax saturates"
assert table[-1]["J_raw"] < 0.1 * table[-1]["J_scaled"], "unscaled: the gradient vanishes"
print("all checks passed")
