# %% [markdown]
# # From GPT-2 to Llama, one switch at a time
#
# GPT-2 (2019) and Llama (2023) are the same machine: a stack of blocks, each
# $h \leftarrow h + \operatorname{Attn}(\operatorname{Norm} h)$ then
# $h \leftarrow h + \operatorname{MLP}(\operatorname{Norm} h)$, and a head on the last norm.
# What changed is a short list, and in minitx each item is one field of `DecoderConfig`
# (`minitx/models/decoder.py`). We start from a GPT-2-shaped config and flip one switch at a
# time. After each step: the diff (the fields that changed), the parameter count, one forward
# on the same token ids, and what the KV cache holds per token. Each step also measures the
# number that was its reason.
#
# Then the families after Llama, read off minitx's own translation of their published
# configurations: KV-cache bytes per token at real sizes, parameters active per token under a
# mixture of experts, each family as its file's diff from its parent, and a table of every
# family. Last, a tiny random Llama made by HuggingFace
# `transformers` (when it is installed) gives the same logits as minitx.

# %%
import dataclasses
import os
import tempfile
import warnings

import numpy as np

# the decoder, its blocks and the loader's translation of a config.json
import minitx
from minitx.backend import to_host
from minitx.models.decoder import (Decoder, DecoderConfig, check_config, count_parameters,
                                   kv_cache_bytes, kv_cache_bytes_per_token)
from minitx.nn.layers import LayerNorm
from minitx.nn.decoder_layers import DecoderRMSNorm
from minitx.nn.rotary import Rotary
from minitx.pretrained import families
from minitx.pretrained.decoders import decoder_config
from minitx.tour import cached_numbers
from minitx.viz import notebook_pyplot

# the picture is optional here: every number it draws is printed too
plt = notebook_pyplot("06_llama_from_gpt2.py", required=False)

# MINITX_QUICK=1 is the tests' setting; this notebook counts rather than times, and runs the
# same either way.
QUICK = os.environ.get("MINITX_QUICK", "0") == "1"
SEED = int(os.environ.get("MINITX_SEED", "0"))
minitx.manual_seed(SEED)
rng = np.random.default_rng(SEED)

# A small model: V = 256, E = 64, 2 layers, 8 heads of D = 8; 12 tokens in one batch row.
V, E, LAYERS, HEADS, N = 256, 64, 2, 8, 12
ids = rng.integers(0, V, size=(1, N))

# %% [markdown]
# ## GPT-2, as a `DecoderConfig`
#
# LayerNorm with a bias, a GELU MLP of width 4E, a learned table of positions, biases on every
# projection, the head tied to the embedding. `step` builds the model (weights drawn from the
# same seed each time), checks that `count_parameters` — which reads only the config — counts
# what was built, runs the ids through it with a cache, and prints the diff from the step
# before.

# %%
def diff(before, after):
    """The DecoderConfig fields that differ, as 'name: old → new' lines."""
    a, b = (dataclasses.asdict(check_config(dataclasses.replace(c))) for c in (before, after))
    return [f"    {k}: {a[k]!r} → {b[k]!r}" for k in a if a[k] != b[k]]


steps = []       # (title, config, parameters, cache numbers per token and layer, logits)


def step(title, config):
    """Build, count, run one forward through fresh caches; print what changed."""
    minitx.manual_seed(SEED)
    model = Decoder(dataclasses.replace(config)).to(dtype="float64").eval()   # a copy: the
    # model fills in the config's defaults (Hkv, D, F), and each step starts from the last
    built = sum(int(np.prod(p.shape)) for p in model.parameters())
    counted = count_parameters(config)["total"]
    caches = model.new_caches()            # the forward fills them: read what one layer holds
    with minitx.no_grad():
        logits = to_host(model(minitx.tensor(ids), kv_caches=caches))
    per_token = cached_numbers(caches[0]) // N
    if steps:
        print(f"{title}\n" + "\n".join(diff(steps[-1][1], config)))
    else:
        print(title)
    print(f"  parameters {built:,} (counted from the config: {counted:,}); logits "
          f"{logits.shape}, std {logits.std():.4f}; cache: {per_token} numbers per token "
          "and layer")
    steps.append((title, config, built, per_token, logits))
    return model


# GPT-2's switches (the defaults of DecoderConfig are a small Llama's)
gpt2 = DecoderConfig(vocab_size=V, hidden_size=E, num_layers=LAYERS, num_heads=HEADS,
                     norm="layernorm", norm_bias=True, norm_eps=1e-5, mlp="gelu",
                     positions="learned", max_position=64, qkv_bias=True, o_bias=True,
                     mlp_bias=True, tie_embeddings=True)
_ = step("0. GPT-2", gpt2)

# %% [markdown]
# ## 1. RMSNorm instead of LayerNorm
#
# LayerNorm centres and scales, $\gamma \odot (x - \mu)/\sigma + \beta$; RMSNorm (Zhang and
# Sennrich 2019) only scales, $\gamma \odot x / \operatorname{rms}(x)$. Centring bought
# nothing measurable, and it costs a mean, a subtraction and the bias. The diff, then the work
# of the two norms on the same (64, 128, E) batch, counted: floating-point operations per
# element of the reference code (`minitx/site/flops.py`). A count, not a timing: the same on
# every machine, where the time of a kernel this small depends on memory traffic and on what
# else the machine is doing.

# %%
from minitx.site.flops import count_call

rms = dataclasses.replace(gpt2, norm="rmsnorm", norm_bias=False, norm_eps=1e-6)
_ = step("1. norm: LayerNorm → RMSNorm", rms)

x = minitx.tensor(rng.standard_normal((64, 128, E)), dtype="float32")
norm_flops = {}
for label, norm in (("LayerNorm", LayerNorm(E)), ("RMSNorm", DecoderRMSNorm(E))):
    with minitx.no_grad(), minitx.using_config(fast=False):
        norm_flops[label] = count_call(lambda: norm(x), x, *norm.parameters()) / x.data.size

# %% tags=["measured"]
print("  floating-point operations per element: " + ", ".join(
    f"{k} {v:.2f}" for k, v in norm_flops.items())
    + f"; RMSNorm does {norm_flops['RMSNorm'] / norm_flops['LayerNorm']:.2f}× LayerNorm's work")

# %% [markdown]
# ## 2. A gated MLP: SwiGLU
#
# GPT-2's MLP is $W_2\,\operatorname{GELU}(W_1 x)$. SwiGLU (Shazeer 2020) gates one projection
# by another, $W_d(\operatorname{silu}(W_g x) \odot W_u x)$: a lower loss for the same
# parameters. Three matrices instead of two, so the width falls from 4E to about 8E/3
# (rounded up to a multiple of 8), and the MLP keeps its size.

# %%
swiglu = dataclasses.replace(rms, mlp="swiglu", ffn_hidden=None)
_ = step("2. MLP: GELU → SwiGLU", swiglu)
c1, c2 = check_config(dataclasses.replace(rms)), check_config(dataclasses.replace(swiglu))
mlp_before, mlp_after = 2 * E * c1.ffn_hidden, 3 * E * c2.ffn_hidden
print(f"  MLP weights per layer: 2·E·{c1.ffn_hidden} = {mlp_before:,} → "
      f"3·E·{c2.ffn_hidden} = {mlp_after:,} ({mlp_after / mlp_before:.3f}×)")

# %% [markdown]
# ## 3. Rotary positions instead of a learned table
#
# GPT-2 adds a learned vector $P[m]$ to each token: max_position·E parameters, and nothing
# for positions past the table. RoPE (Su et al. 2021, `minitx/nn/rotary.py`) rotates each
# query and key by an angle proportional to its position, so a score depends only on the
# offset: $(R_m q) \cdot (R_n k) = q \cdot R_{n-m} k$. Checked numerically below: the same
# q and k at positions (m, n) and (m + s, n + s) give the same score.

# %%
rope = dataclasses.replace(swiglu, positions="rope")
_ = step("3. positions: learned table → RoPE", rope)
rotary = Rotary(8, {"rope_type": "default", "rope_theta": 10000.0})
q = minitx.tensor(rng.standard_normal((1, 1, 1, 8)))
k = minitx.tensor(rng.standard_normal((1, 1, 1, 8)))


def score(m, n):
    """(R_m q) · (R_n k) for one query and one key."""
    return float(np.sum(to_host(rotary.rotate(q, np.array([m])))
                        * to_host(rotary.rotate(k, np.array([n])))))


shifts = [(3, 1, 100), (7, 7, 1000), (50, 20, 4096)]          # (m, n, shift s)
rope_error = max(abs(score(m + s, n + s) - score(m, n)) for m, n, s in shifts)
print(f"  max |score(m + s, n + s) − score(m, n)| over {len(shifts)} shifts up to 4096: "
      f"{rope_error:.1e} (float64)")

# %% [markdown]
# ## 4. Grouped-query attention
#
# At inference the KV cache, not the weights, fills the memory: every layer keeps each past
# token's keys and values, 2·H·D numbers. Grouped-query attention (Ainslie et al. 2023) lets
# G = H/Hkv query heads share one key/value head: the cache shrinks by G, the quality barely.
# The cache numbers below are read off the caches after the forward.

# %%
gqa = dataclasses.replace(rope, num_kv_heads=2)
_ = step("4. attention: 8 key/value heads → 2 (GQA)", gqa)
print(f"  cache per token and layer: {steps[-2][3]} → {steps[-1][3]} numbers "
      f"({steps[-2][3] // steps[-1][3]}× smaller)")

# %% [markdown]
# ## 5. No biases
#
# Llama drops every bias: they cost little but helped nothing at scale (PaLM, Chowdhery et al.
# 2022, reported steadier training without them).

# %%
llama = dataclasses.replace(gqa, qkv_bias=False, o_bias=False, mlp_bias=False)
_ = step("5. biases: on → off", llama)

# %% [markdown]
# ## That is Llama
#
# minitx's loader turns a HuggingFace `config.json` into a `DecoderConfig`
# (`minitx/pretrained/decoders.py`). Given a Llama config of our sizes, it gives exactly the
# config we reached by hand.

# %%
llama_json = dict(model_type="llama", vocab_size=V, hidden_size=E, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=2,
                  intermediate_size=check_config(dataclasses.replace(llama)).ffn_hidden,
                  rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=True,
                  rope_theta=10000.0)
from_hf = check_config(decoder_config(llama_json))
same = dataclasses.asdict(from_hf) == dataclasses.asdict(check_config(
    dataclasses.replace(llama)))
print(f"the loader's Llama config equals the one built switch by switch: {same}")
if not same:
    print("\n".join(diff(from_hf, llama)))
print("\nstep                                       parameters   cache numbers/token/layer")
for title, _, params, per_token, _ in steps:
    print(f"  {title:<41}{params:>10,}   {per_token:>6}")

# %% [markdown]
# ## After Llama: the KV cache at real sizes
#
# The cache per token of context, summed over layers, in bfloat16 (2 bytes a number),
# counted from each family's published configuration as minitx translates it
# (`minitx/pretrained/families.py`), with the definitions of `minitx/models/decoder.py`:
# `kv_cache_bytes(config, N)` is every layer's cache after N tokens, and
# `kv_cache_bytes_per_token(config)` what it grows by per token once every window is full.
# Full layers keep 2·Hkv·D numbers a token; a sliding layer keeps at most its last W − 1
# tokens (the W-th is the one being decoded), so once full it adds nothing; DeepSeek's
# multi-head latent attention (MLA) keeps one latent of r numbers and one rotary key of D_r.
# Beside each, the same model with every head its own keys and values (MHA), and the part of
# the cache that stops growing: the sliding layers' W − 1 tokens and the hybrids' states.

# %%
kv = {}
print(f"{'family':<12} {'model':<16} {'KiB/token':>10} {'as MHA':>10} {'+ bounded, MiB':>15}"
      "   attention")
for kind in families.TODAY:
    c = families.family_config(kind)
    if c.attention == "mla":                       # MHA: H keys of D_n + D_r, H values of D_v
        mha = c.num_layers * c.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim
                                            + c.v_head_dim) * 2
    else:
        full = sum(t == "full" for t in c.layer_types)
        mha = 2 * full * c.num_heads * c.head_dim * 2
    kv[kind] = (kv_cache_bytes_per_token(c), mha)
    # the bounded part: the total after any N past every window, less the growing part
    past = (c.sliding_window or 0) + 1
    bounded = kv_cache_bytes(c, past) - past * kv[kind][0]
    what = (f"MLA, r + D_r = {c.kv_lora_rank + c.qk_rope_head_dim}" if c.attention == "mla"
            else f"H {c.num_heads}, Hkv {c.num_kv_heads}, D {c.head_dim}, "
            f"{sum(t == 'full' for t in c.layer_types)} of {c.num_layers} layers full")
    print(f"{kind:<12} {families.REPRESENTATIVE[kind][0]:<16} {kv[kind][0] / 1024:>10.1f} "
          f"{kv[kind][1] / 1024:>10.1f} {bounded / 2 ** 20:>15.1f}   {what}")

# %% [markdown]
# ## Mixtures of experts: parameters a token meets
#
# A mixture-of-experts layer (`minitx/nn/moe.py`) holds n expert MLPs and runs each token
# through the k its router picks: the model's size grows with n, a token's compute with k.
# Counted from the published configurations (embedding table included; "without the table":
# the row lookup left out, as some model cards count).

# %%
counts = {}
print(f"{'family':<12} {'model':<16} {'experts':>12} {'total':>9} {'active':>9} "
      f"{'without the table':>18}")
for kind in families.TODAY:
    r = counts[kind] = families.expert_counts(kind)
    if not r["experts"]:
        continue
    chosen = f"{r['top_k']} of {r['experts']}" + (f" +{r['shared']}" if r["shared"] else "")
    print(f"{kind:<12} {families.REPRESENTATIVE[kind][0]:<16} {chosen:>12} "
          f"{r['total'] / 1e9:>8.1f}B {r['active'] / 1e9:>8.2f}B "
          f"{(r['active'] - r['lookup']) / 1e9:>17.2f}B")

# %% [markdown]
# ## Each family, its file's diff from its parent
#
# The switches above are what a family file flips. Each family is one file in
# `minitx/models/families/`, a subclass of its parent's class holding only what changes, as
# HuggingFace's modular files are written: the switches, the config.json keys it reads (or
# stops reading), HF's defaults for keys a file leaves out, the tensor names, and the methods
# it overrides where a table cannot say it. Llama's file, the first step from GPT-2, in full:

# %%
import inspect

from minitx.models.families import FAMILIES, LINEAGE, parent

print(inspect.getsource(type(FAMILIES["llama"])))

# %% [markdown]
# And every family the same way, read off the classes (`families.lineage_rows`): what it
# flips, and what its tables add, change or drop (−) against its parent's. A tensor entry maps
# HF's name to minitx's; a key entry, HF's key to the `DecoderConfig` field.

# %%
lineage = families.lineage_rows()


def short(entries, most=6):
    return ", ".join(entries[:most]) + (f", … ({len(entries)} in all)"
                                        if len(entries) > most else "") or "—"


for r in lineage:
    print(f"{r['family']} ← {r['parent']}   ({r['file']}, {r['lines']} lines)")
    print(f"    switches  {short(r['switches'])}")
    for table in ("keys", "defaults", "tensors"):
        print(f"    {table:<9} {short(r['tables'][table])}")
    print(f"    methods   {short(r['methods'])}")

# %% [markdown]
# ## Today's families, side by side
#
# Generated from the family files (`minitx/pretrained/families.py`): each row is the
# `DecoderConfig` its file's published configuration translates to.

# %%
print("\n".join(families.family_table()))

# %%
if plt is not None:
    names = list(kv)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.bar(np.arange(len(names)) - 0.2, [kv[k][1] / 1024 for k in names], 0.4, label="as MHA")
    ax.bar(np.arange(len(names)) + 0.2, [kv[k][0] / 1024 for k in names], 0.4,
           label="as published")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set(ylabel="KiB per token (bf16)", title="KV cache per token of context")
    ax.legend()
    fig.tight_layout()
    plt.show()
else:
    print("(matplotlib is not installed: the picture is skipped; the numbers are above)")

# %% [markdown]
# ## The same logits as HuggingFace's Llama
#
# A tiny random Llama made by `transformers` itself, saved with `save_pretrained`, loaded by
# `minitx.pretrained.load`: both run the same ids in float64. HuggingFace computes its norms
# and rotary tables in float32 even in a float64 model, which moves its own logits by about
# 1e-7, so they agree to 1e-5, not to 1e-15. Skipped, saying so, when PyTorch or
# transformers is not installed.

# %%
# Jupyter without ipywidgets: tqdm, which transformers imports, warns that it cannot draw bars.
warnings.filterwarnings("ignore", message="IProgress not found")
try:
    import torch
    import transformers
except ImportError:
    torch = transformers = None
    print("transformers or torch is not installed: the HuggingFace comparison is skipped")
hf_error = None
if transformers is not None:
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(SEED)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in llama_json.items() if k != "model_type"})).double().eval()
    with torch.no_grad():                     # redraw every weight: no default 0 or 1 left
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        mine, _ = minitx.pretrained.load(folder, dtype="float64", tokenizer=False)
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    with minitx.no_grad():
        got = to_host(mine(minitx.tensor(ids)))
    hf_error = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"max |minitx − transformers| / max |transformers| over {ref.size} logits: "
          f"{hf_error:.1e}")

# %% [markdown]
# ## What this notebook showed, checked

# %%
params = [s[2] for s in steps]
per_token = [s[3] for s in steps]
assert all(s[2] == count_parameters(s[1])["total"] for s in steps), "counts match the builds"
assert params[1] < params[0] and params[3] == params[2] - 64 * E, "RMSNorm and RoPE save"
assert 0.95 < mlp_after / mlp_before < 1.05, "SwiGLU at 8E/3 keeps the MLP's size"
assert rope_error < 1e-12, f"RoPE scores depend on the offset only: {rope_error}"
assert per_token[4] * 4 == per_token[3] == 2 * E, "GQA: 4 query heads per key/value head"
assert same, "the switches reach the loader's Llama"
assert kv["deepseek_v3"][0] * 50 < kv["deepseek_v3"][1], "MLA caches far less than MHA"
assert kv["llama"][1] == 4 * kv["llama"][0], "Llama-3.2-1B: 32 query heads, 8 key/value"
assert counts["mixtral"]["total"] > 3.5 * counts["mixtral"]["active"], "experts sit idle"
# the lineage: one row per family file, each after its parent, each changing something
assert [r["family"] for r in lineage] == [cls.model_type for cls in LINEAGE], "one per file"
assert all(r["parent"] == parent(FAMILIES[r["family"]]).model_type for r in lineage[1:])
assert all(r["switches"] or any(r["tables"].values()) or r["methods"] for r in lineage), \
    "every family file changes something"
assert lineage[1]["switches"][:3] == ["norm='rmsnorm'", "mlp='swiglu'", "positions='rope'"]
assert all(np.isfinite(s[4]).all() for s in steps)
if hf_error is not None:
    assert hf_error < 1e-5, f"minitx's Llama equals transformers': {hf_error}"
print("all checks passed")
