"""GPT-2 (Radford et al. 2019) from HuggingFace checkpoints: logits, gradients and greedy or
sampled generation through minitx's KV cache.

    model, tok = minitx.pretrained.load("gpt2")
    batch = tok(["Attention is", "The cat sat on the"])
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])   # (B, N, V)
    out = model.generate(tok("Attention is")["input_ids"], max_new_tokens=20)    # greedy

The model, for token ids t (B, N) at positions p::

    h₀ = W_te[t] + W_pe[p]
    h_l = h + Attn(LN₁(h)),   then   h + W₂ GELU_tanh(W₁ LN₂(h) + b₁) + b₂     (pre-norm)
    logits = LN_f(h_L) W_teᵀ                                      (head tied to W_te)

with causal multi-head attention softmax(QKᵀ/√D + M) V, M = −∞ above the diagonal and on
padding keys. GPT-2's activation "gelu_new" is the tanh approximation of GELU, not the exact
one, and its LayerNorms use ``layer_norm_epsilon`` (1e-5).

Why not ``minitx.nn.GPT``: its blocks use the exact GELU (GPT-2 needs the tanh one), its
forward takes no padding mask and returns ``(logits, loss)``. The blocks here are the same
shape and use the same parameter names (``wte``, ``wpe``, ``h.{i}.ln_1``,
``h.{i}.attn.q_proj`` …, ``h.{i}.c_fc``, ``h.{i}.c_proj``, ``ln_f``), so a state dict moves
between the two; the attention is the registry's exact ``"mha"`` variant, causal.

GPT-2 stores its linear layers as ``Conv1D``: y = x W + b with W (in, out), the transpose
of ``Linear``'s (out, in). Checkpoint keys (HuggingFace → minitx; ``L.`` = ``h.{i}.``):

=========================================  ==================================================
HuggingFace (``transformer.`` stripped)    minitx
=========================================  ==================================================
wte.weight (V, E), wpe.weight (P, E)       wte.weight, wpe.weight
L.ln_1.*, L.ln_2.*, ln_f.*                 the same names
L.attn.c_attn.weight (E, 3E)               L.attn.q_proj/k_proj/v_proj.weight = the three
                                           (E, E) column blocks, each transposed
L.attn.c_attn.bias (3E,)                   L.attn.q_proj/k_proj/v_proj.bias (thirds)
L.attn.c_proj.weight (E, E) / .bias        L.attn.out_proj.weight (transposed) / .bias
L.mlp.c_fc.weight (E, F) / .bias           L.c_fc.weight (F, E) (transposed) / .bias
L.mlp.c_proj.weight (F, E) / .bias         L.c_proj.weight (E, F) (transposed) / .bias
lm_head.weight (V, E)                      tied to wte.weight (checked equal); a separate
                                           lm_head.weight only when tie_word_embeddings is false
=========================================  ==================================================

The old causal-mask buffers ``L.attn.bias`` / ``L.attn.masked_bias`` are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .. import backend
from ..autograd.grad_mode import no_grad
from ..attention import REGISTRY, KVCache, cached_length
from ..functional import linear
from ..functional import broadcast_to
from ..models.gpt import GPT, sample_next
from ..nn import (Dropout, Embedding, HookedModel, HookPoint, LayerNorm, Linear, Module,
                  ModuleList)
from ..models.common import AttentionMaps
from .common import activation, device_xp, padding_mask, token_array

__all__ = ["GPT2Config", "GPT2Block", "GPT2Model", "gpt2_state_from_hf", "gpt2_state_to_hf"]


# The model's shape and dropout rates, read from the checkpoint's config.json.
@dataclass
class GPT2Config:
    """The ``config.json`` fields GPT-2 needs (HuggingFace's names and defaults)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    # n_inner None means the usual MLP width 4·n_embd; "gelu_new" is GELU's tanh approximation.
    n_inner: int = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    bos_token_id: int = 50256
    eos_token_id: int = 50256

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "GPT2Config":
        """Known fields from a parsed ``config.json``; refuses options minitx does not run."""
        refused = {"scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
                   "scale_attn_weights": True}
        for key, ok in refused.items():
            if key in cfg and bool(cfg[key]) != ok:
                raise ValueError(f"{source}: {key}={cfg[key]!r} is not supported by "
                                 f"minitx's GPT-2 (only {ok})")
        activation(cfg.get("activation_function", "gelu_new"), f"{source}: activation_function")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})


class GPT2Block(Module):
    """Pre-norm causal block: x + Attn(LN₁(x)), then x + MLP(LN₂(x)). (B, T, E) → (B, T, E)."""

    def __init__(self, c: GPT2Config):
        super().__init__()
        inner = c.n_inner or 4 * c.n_embd
        # Pre-norm: LN₁ feeds the causal attention, LN₂ the MLP E → inner → E; the residual stream
        # itself is never normalised inside the block.
        self.ln_1 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.attn = REGISTRY["mha"](c.n_embd, c.n_head, causal=True, bias=True,
                                    dropout=c.attn_pdrop)
        self.ln_2 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.c_fc = Linear(c.n_embd, inner)
        self.c_proj = Linear(inner, c.n_embd)
        self.drop = Dropout(c.resid_pdrop)
        self.act = activation(c.activation_function, "GPT2Block")
        # One hook point per named activation of the residual stream and the MLP.
        self.hook_resid_pre = HookPoint()      # hook points as minitx's GPT (TransformerLens's
        self.hook_attn_out = HookPoint()       # names through GPT.hook_renames)
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_pre = HookPoint()
        self.hook_mlp_post = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x, attn_mask=None, kv_cache=None):
        """``attn_mask``: bool (B, 1, 1, Nk), True = may attend (ANDed with causality)."""
        x = self.hook_resid_pre(x)
        a = self.drop(self.attn(self.ln_1(x), attn_mask=attn_mask, kv_cache=kv_cache))
        x = self.hook_resid_mid(x + self.hook_attn_out(a))
        h = self.hook_mlp_post(self.act(self.hook_mlp_pre(self.c_fc(self.ln_2(x)))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.drop(self.c_proj(h))))


class GPT2Model(Module, AttentionMaps, HookedModel):
    """GPT-2 with its language-model head (HuggingFace's ``GPT2LMHeadModel``).

    ``forward(input_ids=None, attention_mask=None, inputs_embeds=None, kv_caches=None)`` →
    logits (B, T, V) as a Tensor. ``attention_mask`` (B, T) in HuggingFace's polarity
    (1 = token, 0 = padding; with ``kv_caches``, (B, cached + T)). Positions are 0 … T − 1
    (offset by what the caches hold), as HuggingFace's default. Pad on the right: with
    causal attention the real tokens then never see the padding, and the logits at padded
    positions are meaningless. ``generate`` extends prompts token by token.

    Hook points, ``run_with_cache`` and ``run_with_hooks`` under TransformerLens's names, as
    minitx's ``GPT`` (``hook_embed`` fires for ``input_ids`` only).
    """

    hook_renames = GPT.hook_renames

    def __init__(self, config: GPT2Config):
        super().__init__()
        c = self.config = config
        self.wte = Embedding(c.vocab_size, c.n_embd)
        self.wpe = Embedding(c.n_positions, c.n_embd)
        self.drop = Dropout(c.embd_pdrop)
        self.h = ModuleList([GPT2Block(c) for _ in range(c.n_layer)])
        self.ln_f = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.hook_embed = HookPoint()          # (B, T, E) wte[input_ids]
        self.hook_pos_embed = HookPoint()      # (B, T, E) wpe[positions]
        self.lm_head = None if c.tie_word_embeddings else Linear(c.n_embd, c.vocab_size,
                                                                  bias=False)

    def new_caches(self):
        """One empty ``KVCache`` per block."""
        return [KVCache() for _ in self.h]

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, kv_caches=None):
        xp = device_xp(self)
        # Embed: W_te[t] for token ids, or embeddings given directly (inputs_embeds).
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("GPT2Model: pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            input_ids = token_array(input_ids, xp)
            x = self.hook_embed(self.wte(input_ids))                   # (B, T, E)
        else:
            x = inputs_embeds
        # Positions continue after what the KV caches hold, so decoding one token at a time gives
        # each token its true position offset … offset + T − 1.
        b, t = x.shape[0], x.shape[1]
        offset = cached_length(kv_caches, len(self.h), owner="GPT2Model")
        if offset + t > self.config.n_positions:
            raise ValueError(f"GPT2Model: {offset + t} positions exceed n_positions="
                             f"{self.config.n_positions}")
        pos = self.wpe(xp.arange(offset, offset + t))                  # (T, E)
        if self.hook_pos_embed.active:
            pos = self.hook_pos_embed(broadcast_to(pos, x.shape))
        x = self.drop(x + pos)
        # attention_mask (1 = token) becomes a (B, 1, 1, Nk) "may attend" mask that broadcasts over
        # heads and queries; each block ANDs it with causality.
        pad = padding_mask(attention_mask, (b, offset + t), xp)        # (B, Nk), True = pad
        allowed = None if pad is None else (~pad)[:, None, None, :]    # (B, 1, 1, Nk)
        for i, block in enumerate(self.h):
            x = block(x, allowed, None if kv_caches is None else kv_caches[i])
        # Final LayerNorm, then logits = LN_f(h) W_teᵀ: the head reuses the embedding table (tied).
        x = self.ln_f(x)
        w = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return linear(x, w)                                            # (B, T, V)

    def generate(self, input_ids, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = None, use_cache: bool = True):
        """Extend prompts (B, T) — equal lengths, no padding — by ``max_new_tokens`` tokens.

        ``temperature=0`` (default) is greedy, as HuggingFace's ``generate(do_sample=False)``;
        otherwise tokens are sampled from softmax(logits/temperature), limited to the
        ``top_k`` most likely (seeded by ``minitx.manual_seed``). With ``use_cache`` each
        step runs only the newest token through the model, reading earlier keys and values
        from per-block KV caches. Returns a NumPy (B, T + max_new_tokens) int64 array.
        """
        xp = device_xp(self)
        tokens = token_array(input_ids, xp).astype(np.int64)           # on the device
        if tokens.shape[1] + max_new_tokens > self.config.n_positions:
            raise ValueError(f"GPT2Model.generate: {tokens.shape[1]} + {max_new_tokens} "
                             f"tokens exceed n_positions={self.config.n_positions}")
        # With caches, step 0 runs the whole prompt and each later step only the newest token; the
        # logits are the same, the cache only spares recomputing earlier keys and values.
        caches = self.new_caches() if use_cache else None
        with no_grad():
            for step in range(max_new_tokens):
                if caches is None:
                    logits = self(tokens)
                else:
                    logits = self(tokens if step == 0 else tokens[:, -1:], kv_caches=caches)
                nxt = sample_next(logits.data[:, -1, :], temperature, top_k)   # (B, 1)
                tokens = xp.concatenate([tokens, nxt.astype(tokens.dtype)], axis=1)
        return backend.to_device(tokens, "cpu")                       # read back once

    @classmethod
    def from_hf(cls, config: dict, tensors: dict, source: str = "checkpoint",
                dtype=None) -> "GPT2Model":
        """Build from a parsed ``config.json`` and {HF key: array}; parameters in ``dtype``
        (default float32)."""
        c = GPT2Config.from_dict(config, source)
        model = cls(c)
        if dtype is not None:
            model.to(dtype=dtype)               # before loading: no float32 round trip
        model.load_state_dict(gpt2_state_from_hf(tensors, c, source))
        return model


# ---- key mapping -------------------------------------------------------------------------

_SAME = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")
_CONV = {"attn.c_proj": "attn.out_proj", "mlp.c_fc": "c_fc", "mlp.c_proj": "c_proj"}


def gpt2_state_from_hf(tensors: dict, config: GPT2Config, source: str = "checkpoint") -> dict:
    """{HuggingFace GPT-2 key: array} → {minitx ``GPT2Model`` key: array} (module docstring's
    table): Conv1D weights transposed, ``c_attn`` split into q/k/v. Unknown keys raise
    ValueError naming them and ``source``."""
    e = config.n_embd
    state, unknown, lm_head = {}, [], None
    for key, value in tensors.items():
        k = key[len("transformer."):] if key.startswith("transformer.") else key
        parts = k.split(".")
        # Top-level tensors keep their names; lm_head is held back to compare with wte.
        if k in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
            state[k] = value
        elif k == "lm_head.weight":
            lm_head = value
        # Block tensors h.{i}.…: LayerNorms keep their names; c_attn (E, 3E) splits into q, k, v
        # column blocks, each transposed to Linear's (out, in).
        elif parts[0] == "h" and len(parts) >= 4 and parts[1].isdigit():
            i, inner = parts[1], ".".join(parts[2:])
            pre = f"h.{i}."
            if inner in _SAME:
                state[pre + inner] = value
            elif inner in ("attn.bias", "attn.masked_bias"):
                continue                                    # old causal-mask buffers
            elif inner == "attn.c_attn.weight":            # (E, 3E): x W = [q | k | v]
                w = np.asarray(value)
                for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
                    state[f"{pre}attn.{p}.weight"] = np.ascontiguousarray(w[:, j * e:(j + 1) * e].T)
            elif inner == "attn.c_attn.bias":
                bias = np.asarray(value)
                for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
                    state[f"{pre}attn.{p}.bias"] = bias[j * e:(j + 1) * e]
            # The other Conv1D layers (attention's c_proj, the MLP's c_fc and c_proj): transposed.
            elif inner.rsplit(".", 1)[0] in _CONV:
                mod, leaf = inner.rsplit(".", 1)
                v = np.asarray(value)
                if leaf == "weight":                       # Conv1D (in, out) → Linear (out, in)
                    v = np.ascontiguousarray(v.T)
                state[f"{pre}{_CONV[mod]}.{leaf}"] = v
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"{source}: unexpected GPT-2 checkpoint key(s): {', '.join(unknown)}")
    # A tied checkpoint may still store lm_head.weight: it must then equal wte.weight.
    if lm_head is not None:
        if config.tie_word_embeddings:
            if "wte.weight" in state and not np.array_equal(np.asarray(lm_head),
                                                            np.asarray(state["wte.weight"])):
                raise ValueError(f"{source}: lm_head.weight differs from wte.weight but "
                                 "config.json says tie_word_embeddings=true")
        else:
            state["lm_head.weight"] = lm_head
    return state


def gpt2_state_to_hf(state: dict, config: GPT2Config) -> dict:
    """The inverse of ``gpt2_state_from_hf`` (keys with the ``transformer.`` prefix of
    ``GPT2LMHeadModel``; ``lm_head.weight`` = ``wte.weight`` when tied)."""
    out, qkv = {}, {}
    back = {v: k for k, v in _CONV.items()}
    # Top-level tensors take the "transformer." prefix (lm_head.weight excepted).
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] != "h":
            out["transformer." + key if key != "lm_head.weight" else key] = value
            continue
        # Block tensors: q, k, v are collected per block, Linear weights transposed back to
        # Conv1D's (in, out).
        i, inner, leaf = parts[1], ".".join(parts[2:-1]), parts[-1]
        pre = f"transformer.h.{i}."
        if inner in ("ln_1", "ln_2"):
            out[pre + inner + "." + leaf] = value
        elif inner in ("attn.q_proj", "attn.k_proj", "attn.v_proj"):
            qkv[(i, inner[-6], leaf)] = value
        elif inner in back:
            if leaf == "weight":                           # Linear (out, in) → Conv1D (in, out)
                value = np.ascontiguousarray(value.T)
            out[f"{pre}{back[inner]}.{leaf}"] = value
        else:
            raise ValueError(f"gpt2_state_to_hf: unexpected minitx key {key!r}")
    # c_attn: [W_qᵀ | W_kᵀ | W_vᵀ], (E, 3E), and the three biases end to end.
    for i in sorted({i for i, _, _ in qkv}, key=int):
        w = [qkv[(i, p, "weight")] for p in "qkv"]
        out[f"transformer.h.{i}.attn.c_attn.weight"] = np.ascontiguousarray(
            np.concatenate([a.T for a in w], axis=1))                    # (E, 3E)
        out[f"transformer.h.{i}.attn.c_attn.bias"] = np.concatenate(
            [qkv[(i, p, "bias")] for p in "qkv"])
    if config.tie_word_embeddings:
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out
