# %% [markdown]
# # Decayed and gated recurrences: a state that does not grow
#
# To decode the next token, softmax attention reads every key and value before it: its cache
# holds $2 \cdot H \cdot D$ numbers per token, and grows with the text. The recurrences of
# 2025 keep one matrix per head instead, a fixed-size memory that each token updates:
#
# | variant | state update, per head |
# |---|---|
# | lightning attention (MiniMax-01) | $S_t = \lambda S_{t-1} + k_t^\top v_t$ |
# | gated DeltaNet (Yang et al. 2025) | $S_t = \alpha_t S_{t-1}(I - \beta_t k_t k_t^\top) + \beta_t v_t k_t^\top$ |
# | Kimi Delta Attention (2025) | as gated DeltaNet, with a decay per key channel, $\operatorname{diag}(\alpha_t)$ |
#
# (the formulas are in `minitx/attention/lightning.py` and `gated_delta.py`). Beside them, the
# two 2025 gates on softmax attention (`gated`, `fox`) keep keys and values, as dense attention
# does. This notebook checks that decoding through each layer's cache gives the full forward's
# output, then counts what each cache holds as $N$ grows.

# %%
import os

import numpy as np

import minitx
from minitx.attention import REGISTRY
from minitx.backend import to_host
from minitx.tour import cached_numbers
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("08_state_against_n.py")   # no matplotlib: one line naming the extra

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")

E, H = 32, 2                      # two heads of D = 16
D = E // H
NAMES = ("mha", "gated", "fox", "lightning", "gated_deltanet", "kda")
RECURRENT = ("lightning", "gated_deltanet", "kda")


def layer(name):
    minitx.manual_seed(SEED)
    return REGISTRY[name](E, H, causal=True).to(dtype="float64").eval()


# %% [markdown]
# ## 1. Decoding through the cache is the same map
#
# A prefill of the first 8 tokens, then one token at a time: each step reads the cache and
# updates it. The outputs must be those of one forward pass over the whole sequence, which the
# recurrences compute by chunks (the state carried from chunk to chunk).

# %%
N_CHECK = 40
x = minitx.tensor(rng.standard_normal((1, N_CHECK, E)), dtype="float64")
decoded = {}
with minitx.no_grad():
    for name in NAMES:
        lay = layer(name)
        whole = to_host(lay(x))
        cache = lay.new_cache()
        steps = [to_host(lay(x[:, :8], kv_cache=cache))]
        steps += [to_host(lay(x[:, t:t + 1], kv_cache=cache)) for t in range(8, N_CHECK)]
        decoded[name] = float(np.abs(np.concatenate(steps, axis=1) - whole).max())
        print(f"{name:<15} decoded token by token − full forward: max |Δ| = "
              f"{decoded[name]:.1e}")

# %% [markdown]
# ## 2. What each cache holds, against N
#
# Prefill $N$ tokens through a fresh cache and count the numbers it holds
# (`minitx.tour.cached_numbers`, read off the cache itself):

# %%
SIZES = [64, 128, 256, 512] if QUICK else [256, 512, 1024, 2048]
# a prefill of N tokens through a fresh cache, then count what the cache holds
held = {name: [] for name in NAMES}
with minitx.no_grad():
    for n in SIZES:
        xn = minitx.tensor(rng.standard_normal((1, n, E)), dtype="float64")
        for name in NAMES:
            lay = layer(name)
            cache = lay.new_cache()
            lay(xn, kv_cache=cache)
            held[name].append(cached_numbers(cache))
# p in count ∝ N^p: the least-squares slope of log count against log N
slope = {name: round(float(np.polyfit(np.log(SIZES), np.log(c), 1)[0]), 6) + 0.0
         for name, c in held.items()}
print(f"{'numbers in the cache':<22}" + "".join(f"{'N = ' + str(n):>11}" for n in SIZES)
      + "   p (∝ N^p)")
for name, c in held.items():
    print(f"{name:<22}" + "".join(f"{v:>11,}" for v in c) + f"   {slope[name]:.2f}")

# log-log axes: the caches that grow are lines of slope 1, the states flat lines
fig, ax = plt.subplots(figsize=(6, 3.8))
for name, c in held.items():
    ax.loglog(SIZES, c, "o-" if name in RECURRENT else "s--",
              label=f"{name} (p = {slope[name]:.2f})")
ax.set(xlabel="tokens seen N", ylabel="numbers in the cache",
       title=f"what a decoder keeps (H = {H}, D = {D})")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# (The three recurrences' lines lie on one another, as do `mha`'s and `gated`'s.) The
# softmax variants keep $2 \cdot H \cdot D$ = 64 numbers per token (FoX one more per token
# and head, its cumulative forget gate), so their caches double with $N$. The three
# recurrences keep $H \cdot D^2$ = 512 numbers — one $D \times D$ matrix per head — however
# long the text: what they remember of it has to fit there, which is why the delta rule
# *corrects* what the state holds for $k_t$ instead of only adding, and why the gates let it
# forget.
#
# ## What this notebook showed, checked

# %%
for name, diff in decoded.items():
    assert diff < 1e-10, f"{name}: decoding through the cache should equal the full forward"
for name in RECURRENT:
    assert held[name] == [H * D * D] * len(SIZES), f"{name} should keep one D × D state per head"
for name in ("mha", "gated"):
    assert held[name] == [2 * H * D * n for n in SIZES], name
assert held["fox"][-1] > held["fox"][0] * (SIZES[-1] // SIZES[0]) * 0.99
for name in NAMES:
    grows = name not in RECURRENT
    assert (slope[name] > 0.99) if grows else (abs(slope[name]) < 1e-9), (name, slope[name])
print("all checks passed")
