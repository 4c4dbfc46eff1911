# %% [markdown]
# # Where the KV cache went
#
# To decode token $T + 1$, softmax attention reads the keys and values of the $T$ tokens before
# it, so a decoder keeps them: $2 \cdot H_{kv} \cdot D$ numbers per token in every layer. At
# today's sizes and contexts that cache, not the weights, is what fills a GPU. Each design
# since 2019 has removed a part of it:
#
# | step | what a layer keeps per token | models |
# |---|---|---|
# | MHA | $2 \cdot H \cdot D$ | GPT-2, OLMo 2 |
# | GQA | $2 \cdot H_{kv} \cdot D$, $H_{kv} < H$ | Llama 3, Qwen3 |
# | MLA | one latent and one rotary key, $r + D_r$ | DeepSeek-V3 |
# | windows and chunks | nothing more once the window is full | Gemma 3, gpt-oss, Llama 4 |
# | compressed | one entry per $m$ tokens ($m$ = 4 or 128) beside a window | DeepSeek-V4 |
# | shared across layers | nothing in the layers that read an earlier layer's | Gemma 4 |
# | a fixed state | nothing per token: one matrix per head | Qwen3-Next, Qwen3.5, LFM2 |
#
# This notebook counts each at its real size from the configuration alone
# (`minitx.models.kv_cache_bytes`, no model built), in bfloat16, after 128k tokens, and checks
# the counts against caches that tiny models actually fill.

# %%
import dataclasses
import os

import numpy as np

import minitx
from minitx.attention import REGISTRY
from minitx.models import PRESETS, Decoder, DecoderConfig
from minitx.models.decoder import check_config, kv_cache_bytes, kv_cache_bytes_per_token
from minitx.tour import cached_numbers
from minitx.viz import notebook_pyplot

plt = notebook_pyplot("10_where_the_kv_cache_went.py")   # no matplotlib: one line naming it

QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)
print(f"quick setting: {QUICK}, seed: {SEED}")

T = 128 * 1024                    # the context the table is counted at
KIB, GIB = 1024, 1024 ** 3

# %% [markdown]
# ## 1. The presets: MHA, GQA, MLA, windows, chunks and states
#
# `kv_cache_bytes(config, T)` adds up what every layer's cache holds after $T$ tokens: a full
# layer $2 H_{kv} D$ numbers per token, a sliding one at most its last $W - 1$ tokens, a
# chunked one at most $C - 1$, an MLA layer $r + D_r$, a recurrent layer its fixed state. Each
# row below is a published model (`PRESETS`; `docs/decoders.md` names each source), and the
# last column is the same model with every layer a plain full GQA layer of its own heads.

# %%
def plain_bytes(c, tokens):
    """Every layer full attention with the model's own H_kv and D: what the design saved."""
    return 2 * 2 * c.num_kv_heads * c.head_dim * c.num_layers * tokens


def mha_equivalent(c, tokens):
    """MLA's comparison: each of its H heads caching a key (D_n + D_r) and a value (D_v)."""
    per_head = c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim
    return 2 * c.num_heads * per_head * c.num_layers * tokens


ROWS = [("MHA", "OLMo-2-1B"), ("GQA", "Llama-3.2-1B"), ("MLA", "DeepSeek-V3"),
        ("sliding windows", "Gemma-3-270M"), ("chunks", "Llama-4-Scout-17B-16E"),
        ("a fixed state", "Qwen3-Next-80B-A3B"), ("a fixed state", "Qwen3.5-35B-A3B")]
table = []
for step, name in ROWS:
    c = check_config(dataclasses.replace(PRESETS[name]))      # the defaults filled in
    held = kv_cache_bytes(c, T)
    plain = mha_equivalent(c, T) if c.attention == "mla" else plain_bytes(c, T)
    table.append((step, name, kv_cache_bytes_per_token(c) / KIB, held / GIB, plain / GIB))
print(f"{'step':<16}{'model':<24}{'KiB/token':>10}{'GiB at 128k':>13}{'plain GQA':>11}")
for step, name, per_token, held, plain in table:
    print(f"{step:<16}{name:<24}{per_token:>10.1f}{held:>13.2f}{plain:>11.2f}")

# %% [markdown]
# (For DeepSeek-V3 the last column is multi-head attention over its 128 heads, keys of 192
# and values of 128, which MLA replaced.) Grouped-query attention divides MHA's cache by
# $H / H_{kv}$, four for Llama 3.2; MLA keeps 576 numbers per layer and token where its heads
# would keep 40 960; a window or a chunk bounds what its layers hold, so only the few global
# layers grow; and the hybrids' recurrent layers hold one state whatever $T$ is.
#
# ## 2. Compressed: DeepSeek-V4
#
# DeepSeek-V4's layers keep a window of the last 128 raw keys, and beside it one compressed
# entry for every $m$ tokens: CSA layers $m = 4$ (each entry with its indexer key, so the
# indexer can choose among them), HCA layers $m = 128$. Its one key/value head of $D = 512$
# is both the key and the value, so each entry is one vector. Counted from HF's
# `DeepseekV4Config` defaults (43 layers, the alternation its class builds):

# %%
def compressed_numbers(kind, tokens, d, d_index, m, window):
    """Numbers one compressed layer's cache holds after ``tokens`` (``CompressedCache``): the
    window's last n_win − 1 raw keys (K = V: one vector each); the finished entries (a CSA
    entry with its indexer key); the partial block's content and gate rows (CSA's are twice
    as wide, for its overlap, and its indexer has its own); and CSA's last complete block's
    first halves, which the next entry pools."""
    raw = min(tokens, window - 1) * d
    if kind == "heavily_compressed":
        return raw + (tokens // m) * d + (tokens % m) * 2 * d
    return (raw + (tokens // m) * (d + d_index) + (tokens % m) * 2 * (2 * d + 2 * d_index)
            + (m * 2 * (d + d_index) if tokens >= m else 0))


V4 = dict(layers=43, head_dim=512, window=128, index_head_dim=128,
          rates={"compressed_sparse": 4, "heavily_compressed": 128})
# HF's class: two HCA layers, then CSA and HCA alternating
v4_types = ["heavily_compressed"] * 2 + [
    "compressed_sparse" if i % 2 else "heavily_compressed" for i in range(V4["layers"] - 2)]


def v4_numbers(tokens):
    return sum(compressed_numbers(t, tokens, V4["head_dim"], V4["index_head_dim"],
                                  V4["rates"][t], V4["window"]) for t in v4_types)


v4 = 2 * v4_numbers(T)
v4_plain = 2 * 2 * 1 * V4["head_dim"] * V4["layers"] * T      # one K and one V head, full
per_token = 2 * (v4_numbers(T + 512) - v4_numbers(T)) / 512
print(f"CSA layers: {v4_types.count('compressed_sparse')}, HCA layers: "
      f"{v4_types.count('heavily_compressed')}")
print(f"DeepSeek-V4 at 128k: {v4 / GIB:.2f} GiB, {per_token / KIB:.2f} KiB per token; "
      f"plain attention of the same head, K and V: {v4_plain / GIB:.2f} GiB "
      f"({v4_plain / v4:.1f}× more)")

# %% [markdown]
# ## 3. Shared across layers: Gemma 4
#
# Gemma 4's last layers keep their own queries and read the keys and values of the last
# earlier layer of their type (`attention/shared_kv.py`; the decoder's `kv_shared_layers`).
# Gemma 4 E4B, as NVIDIA's Megatron-Bridge recipe describes it: 42 layers, five sliding
# layers (window 512, 2 KV heads of 256) to one global layer (2 KV heads of 512), the last 18
# layers sharing. Its two head sizes are more than `DecoderConfig` holds (one head dim), so
# the count is written per layer here, and then checked against `kv_cache_bytes` on a
# config of one head size.

# %%
def layered_numbers(types, shared, tokens, heads, window):
    """Numbers cached after ``tokens`` by layers of ``types`` ('sliding' or 'full'), the last
    ``shared`` of which read an earlier layer's; ``heads[t]`` = (H_kv, D)."""
    total = 0
    for i, t in enumerate(types):
        if i >= len(types) - shared:
            continue                                  # it borrows: it keeps nothing
        hkv, d = heads[t]
        total += 2 * hkv * d * (min(tokens, window - 1) if t == "sliding" else tokens)
    return total


E4B = dict(types=["full" if (i + 1) % 6 == 0 else "sliding" for i in range(42)],
           heads={"sliding": (2, 256), "full": (2, 512)}, window=512)
gemma4 = {s: 2 * layered_numbers(E4B["types"], s, T, E4B["heads"], E4B["window"])
          for s in (0, 18)}
gemma4_plain = 2 * sum(2 * E4B["heads"][t][0] * E4B["heads"][t][1] * T for t in E4B["types"])
print(f"Gemma 4 E4B at 128k: {gemma4[18] / GIB:.2f} GiB sharing 18 layers, "
      f"{gemma4[0] / GIB:.2f} GiB without sharing, {gemma4_plain / GIB:.2f} GiB with every "
      "layer full")

# the per-layer count against the library's, where one head size is enough
one = DecoderConfig(vocab_size=8, hidden_size=512, num_layers=42, num_heads=8,
                    num_kv_heads=2, head_dim=256, sliding_window=512,
                    layer_types=tuple(E4B["types"]), kv_shared_layers=18)
same_heads = {"sliding": (2, 256), "full": (2, 256)}
for tokens in (100, 511, 5000):
    assert kv_cache_bytes(one, tokens) == \
        2 * layered_numbers(E4B["types"], 18, tokens, same_heads, 512), tokens
print("the per-layer count agrees with kv_cache_bytes")

# %% [markdown]
# ## 4. The counts are what caches hold
#
# The counts are arithmetic; a tiny model shows them true. A four-layer decoder of one head
# size, its last two layers borrowing, a window of 4 on its sliding layers: after a prompt
# of $N$ tokens, the numbers its caches hold (read off the caches) equal `kv_cache_bytes / 2`,
# and its logits through the caches equal the full forward's.

# %%
tiny = DecoderConfig(vocab_size=31, hidden_size=16, num_layers=4, num_heads=4,
                     num_kv_heads=2, sliding_window=4,
                     layer_types=("sliding", "full", "sliding", "full"), kv_shared_layers=2)
model = Decoder(tiny).to(dtype="float64").eval()
N = 9
ids = rng.integers(0, 31, (1, N))
# the full forward, then a prompt of 5 and one token at a time through the caches
with minitx.no_grad():
    full = model(ids).numpy()
    caches = model.new_caches()
    steps = [model(ids[:, :5], kv_caches=caches).numpy()]
    steps += [model(ids[:, t:t + 1], kv_caches=caches).numpy() for t in range(5, N)]
# what the caches hold, read off them, beside the count; the decoded logits beside the full's
held_tiny = sum(cached_numbers(cache) for cache in caches)
gap = float(np.abs(np.concatenate(steps, axis=1) - full).max())
print(f"cache numbers held: {held_tiny} (kv_cache_bytes / 2: {kv_cache_bytes(tiny, N) // 2}); "
      f"decoded − full forward: {gap:.1e}")
print("caches:", [type(cache).__name__ for cache in caches])

# the compressed layers' caches, read off them, against the count of section 2
def held_numbers(cache):
    """Every array a ``CompressedCache`` holds: the window's keys, and each compressor's
    pending rows, last block and entries."""
    arrays = [cache.keys]
    for state in (cache.compressor, cache.index):
        for part in (() if state is None else (state.pending, state.before, state.entries)):
            arrays += list(part) if isinstance(part, tuple) else [part]
    return sum(int(np.prod(a.shape)) for a in arrays if a is not None)


# a CSA and an HCA layer fed 41 tokens in three steps, the cache read after each
compared = []
for kind, opts in (("compressed_sparse", dict(compress=4, top_k=2, window=4)),
                   ("heavily_compressed", dict(compress=8, window=4))):
    lay = REGISTRY[kind](16, 2, causal=True, num_kv_heads=1, **opts).to(dtype="float64")
    x = minitx.tensor(rng.standard_normal((1, 41, 16)), dtype="float64")
    cache = lay.eval().new_cache()
    with minitx.no_grad():
        for a, b in ((0, 5), (5, 23), (23, 41)):
            lay(x[:, a:b], kv_cache=cache)
            # section 2's count at the same tokens (HCA has no indexer: d_I = 0)
            d_index = cache.index.entries.shape[-1] if cache.index is not None else 0
            count = compressed_numbers(kind, b, lay.head_dim, d_index, opts["compress"], 4)
            compared.append((kind, b, held_numbers(cache), count))
for kind, tokens, held, count in compared:
    print(f"{kind:<19} after {tokens:>2} tokens holds {held:>4} numbers; the count: {count}")

# %% [markdown]
# ## 5. The picture
#
# Bytes after 128k tokens, each design beside its model's plain full-attention cache (log
# scale: each step is a factor, not a difference).

# %%
# in the order of the table at the top: the two counted by hand before the fixed states
bars = [(f"{step}\n{name}", held, plain) for step, name, _, held, plain in table]
bars[-2:-2] = [("compressed\nDeepSeek-V4", v4 / GIB, v4_plain / GIB),
               ("shared layers\nGemma 4 E4B", gemma4[18] / GIB, gemma4_plain / GIB)]
labels, held_gib, plain_gib = (list(col) for col in zip(*bars))
# two bars a design: its model's plain full-attention cache, and the cache it holds
fig, ax = plt.subplots(figsize=(8, 5.0))
ypos = np.arange(len(labels))
ax.barh(ypos + 0.2, plain_gib, height=0.4, color="#cccccc",
        label="every layer full attention, its own KV heads (MLA: each head's K and V)")
ax.barh(ypos - 0.2, held_gib, height=0.4, color="#3b6ea5", label="the model's own cache")
ax.set_xscale("log")
ax.set_yticks(ypos, labels, fontsize=7)
ax.invert_yaxis()
ax.set(xlabel="GiB after 128k tokens (bfloat16, one sequence)",
       title="where the KV cache went")
ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What this notebook showed, checked

# %%
rows = {name: row for _, name, *row in [(r[0], r[1], *r[2:]) for r in table]}
assert rows["OLMo-2-1B"][1] == rows["OLMo-2-1B"][2]                  # MHA: nothing saved
llama = check_config(dataclasses.replace(PRESETS["Llama-3.2-1B"]))
mha_llama = 2 * 2 * llama.num_heads * llama.head_dim * llama.num_layers * T
assert mha_llama == 4 * kv_cache_bytes(llama, T)                      # H / H_kv = 32 / 8
assert rows["DeepSeek-V3"][0] * KIB == 61 * 576 * 2                  # r + D_r per layer
assert rows["Llama-4-Scout-17B-16E"][0] == 48                        # 12 NoPE layers grow
assert gemma4[18] < gemma4[0] < gemma4_plain
assert all(held == count for *_, held, count in compared)
assert 10 < v4_plain / v4 < 20                                       # compression's factor
assert gap < 1e-10 and held_tiny == kv_cache_bytes(tiny, N) // 2
print("all checks passed")
