"""A decoder-only ``GPT`` (Radford et al. 2018/2019), small enough to read in one sitting.

Token + position embeddings, ``n_layer`` pre-norm causal blocks, final LayerNorm, a
language-model head tied to the token embedding (Press & Wolf 2017). ``generate`` decodes
through a KV cache.

Attention maps for visualisation: ``model.record_attention(True)``, run the model, then
``model.attention_maps()`` → {module name: (B, H, Nq, Nk) Tensor} for every attention module
that keeps its weights (MultiheadAttention and the exact/position variants).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import backend, validate

# Any registered attention variant can fill the blocks; the KV caches (plain or paged) make
# generation feed one new token a step.
from ..attention import (REGISTRY, ExactSelfAttention, KVCache, PagedKVCache,
                         cached_length)
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..nn import init
from ..nn.layers import Dropout, Embedding, LayerNorm, Linear
from ..nn.hooks import HookedModel, HookPoint
from ..nn.module import Module, ModuleList
from ..nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

# With tied weights the LM head is a plain linear map by wteᵀ, trained by cross-entropy.
from ..ops.linalg import linear
from ..ops.loss import cross_entropy
from ..ops.shape import broadcast_to, reshape
from .common import AttentionMaps, token_ids
from .transformer import get_activation

__all__ = ["GPTConfig", "GPT", "GPTBlock", "sample_next"]

# How positions enter: added to the embeddings (learned, sinusoidal), inside attention (rope,
# alibi, relative: each selects that attention variant), or not at all (none).
_POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "relative", "none")


def sample_next(logits, temperature: float = 1.0, top_k: int = None, top_p: float = None,
                generator=None):
    """Pick the next token per row of ``logits`` (B, V) (raw array): argmax when
    ``temperature == 0`` (or ``top_k == 1``), else sample softmax(logits / temperature)
    restricted to the ``top_k`` largest, then to the smallest set of most likely tokens whose
    probabilities sum to at least ``top_p`` (nucleus sampling, Holtzman et al. 2020; the most
    likely token is always kept). ``generator``: a ``numpy.random.Generator`` for the draws
    (default ``minitx.manual_seed``'s). Returns (B, 1) ints.

    Computed as exp((logits − max) / temperature), so a tiny temperature tends to the argmax
    instead of overflowing (no NaN for any finite temperature ≥ 0).
    """
    temperature = validate.nonnegative_real(temperature, "temperature", owner="sample_next")
    vocab = logits.shape[-1]
    if top_k is not None:
        top_k = validate.integer(top_k, "top_k", minimum=1, maximum=vocab, owner="sample_next")
    if top_p is not None:
        top_p = validate.real(top_p, "top_p", minimum=0.0, maximum=1.0, owner="sample_next")
        if top_p == 0.0:
            raise validate.OptionError("sample_next: top_p must be in (0, 1], got 0.0 (use "
                                       "temperature=0 for greedy decoding)")
    xp = backend.get_array_module(logits)
    if temperature == 0 or top_k == 1:
        return logits.argmax(axis=-1)[:, None]
    # Sampling by the inverse CDF: shift by the max so exp never overflows, cut to the top k
    # and the nucleus, then take the first token whose cumulative probability reaches r.
    z = logits.astype("float64")
    z = (z - z.max(axis=-1, keepdims=True)) / temperature               # ≤ 0, max at 0
    if top_k is not None:
        kth = xp.sort(z, axis=-1)[:, -top_k][:, None]
        z = xp.where(z < kth, -xp.inf, z)
    p = xp.exp(z)                                                       # the max entry is 1
    p = p / p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        # keep a token iff the tokens more likely than it sum to less than top_p
        order = xp.argsort(-p, axis=-1, kind="stable")                  # most likely first
        ranked = xp.take_along_axis(p, order, axis=-1)
        before = xp.cumsum(ranked, axis=-1) - ranked                    # mass ranked above
        keep = xp.zeros(p.shape, dtype=bool)
        keep[xp.arange(p.shape[0])[:, None], order] = before < top_p    # back to vocab order
        p = xp.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    cdf = xp.cumsum(p, axis=-1)
    draw = (generator or backend.rng()).random((z.shape[0], 1))
    r = backend.to_device(draw, backend.device_of(z))
    return xp.minimum((cdf < r).sum(axis=-1), vocab - 1)[:, None]


@validate.catch_unknown_options      # GPTConfig(n_heads=4): "... did you mean 'n_head'?"
@dataclass
class GPTConfig:
    """Hyper-parameters of ``GPT``.

    ``attention``: a ``minitx.attention.REGISTRY`` name (built causal). ``position``:
    "learned" (GPT-2's ``wpe``), "sinusoidal", "none", or "rope" | "alibi" | "relative",
    which select the matching attention variant (then ``attention`` must be "mha" or the
    same name). ``num_kv_heads``: MQA/GQA key/value heads (exact variants).
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    attention: str = "mha"
    num_kv_heads: int = None
    position: str = "learned"
    attention_options: dict = field(default_factory=dict)
    tie_weights: bool = True


class GPTBlock(Module):
    """Pre-norm causal block: x + Attn(LN₁(x)), then x + MLP(LN₂(x)), MLP = W₂ GELU(W₁ x)."""

    def __init__(self, config: GPTConfig, attention: str, index: int = 0):
        super().__init__()
        c = config
        cls = REGISTRY[attention]
        # The variant's options: the config's, plus what only the model knows (depth, context
        # length) for variants that ask for it in ``model_options``.
        options = dict(c.attention_options)
        known = {"layer_index": index, "context_length": c.block_size}
        for name in getattr(cls, "model_options", ()):
            options.setdefault(name, known[name])
        if issubclass(cls, ExactSelfAttention):
            options.setdefault("dropout", c.dropout)
        if c.num_kv_heads is not None:
            options["num_kv_heads"] = c.num_kv_heads
        # GPT-2's module names (ln_1, attn, ln_2, c_fc, c_proj); the MLP widens E → 4E → E.
        self.ln_1 = LayerNorm(c.n_embd, bias=c.bias)
        self.attn = cls(c.n_embd, c.n_head, causal=True, bias=c.bias, **options)
        self.ln_2 = LayerNorm(c.n_embd, bias=c.bias)
        self.c_fc = Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.c_proj = Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.drop = Dropout(c.dropout)
        self.gelu = get_activation("gelu")
        # hook points, all (B, T, E) but the MLP's (B, T, 4E); public names in GPT.hook_renames
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_pre = HookPoint()      # blocks.{i}.mlp.hook_pre: W₁ x + b₁
        self.hook_mlp_post = HookPoint()     # blocks.{i}.mlp.hook_post: GELU of it
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x, kv_cache=None):
        """x (B, T, E) → (B, T, E)."""
        x = self.hook_resid_pre(x)
        a = self.ln_1(x)
        a = self.attn(a, kv_cache=kv_cache) if kv_cache is not None else self.attn(a)
        x = self.hook_resid_mid(x + self.hook_attn_out(a))
        h = self.hook_mlp_post(self.gelu(self.hook_mlp_pre(self.c_fc(self.ln_2(x)))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.drop(self.c_proj(h))))


class GPT(Module, AttentionMaps, HookedModel):
    """A decoder-only transformer language model (GPT-2's layout, Radford et al. 2019).

        h₀ = wte[idx] + positions,  h_l = Block_l(h_{l−1}),  logits = LN_f(h_L) wteᵀ

    ``forward(idx (B, T), targets=None, kv_caches=None)`` → ``(logits (B, T, V), loss or
    None)``; loss = mean cross-entropy of ``targets`` (B, T) (−100 ignored). Keys:
    ``wte.weight``, ``wpe.weight`` (learned positions), ``h.{i}.ln_1/attn/ln_2/c_fc/c_proj.*``,
    ``ln_f.*`` (and ``lm_head.weight`` only when ``tie_weights=False``). Initialisation as
    GPT-2: N(0, 0.02²), residual projections N(0, 0.02²/(2·n_layer)), zero biases.

    Hook points under TransformerLens's names (``hook_names()``, ``run_with_cache``,
    ``run_with_hooks``; docs/look_inside.md): ``hook_embed``, ``hook_pos_embed`` (learned
    positions), ``blocks.{i}.hook_resid_pre``, ``blocks.{i}.ln1.hook_scale`` …
    ``ln_final.hook_normalized``.
    """

    hook_renames = ((r"^h\.(\d+)\.", r"blocks.\1."), (r"\.ln_1\.", ".ln1."),
                    (r"\.ln_2\.", ".ln2."), (r"\.hook_mlp_(pre|post)$", r".mlp.hook_\1"),
                    (r"^ln_f\.", "ln_final."))

    def __init__(self, config: GPTConfig):
        super().__init__()
        c = config
        if c.position not in _POSITIONS:
            raise ValueError(f"GPTConfig.position must be one of {_POSITIONS}, got "
                             f"{c.position!r}")
        # rope, alibi and relative are positions *inside* attention: they choose the attention
        # variant, so another variant alongside them is refused.
        name = c.attention
        if c.position in ("rope", "alibi", "relative"):
            if c.attention not in ("mha", c.position):
                raise ValueError(f"GPTConfig: position={c.position!r} selects the "
                                 f"{c.position!r} attention variant; attention must be 'mha' "
                                 f"or {c.position!r}, got {c.attention!r}")
            name = c.position
        validate.choice(name, "attention", sorted(REGISTRY), owner="GPTConfig")
        # Embeddings: tokens always; positions are added here only when learned (GPT-2's wpe) or
        # sinusoidal, the other schemes live in the attention.
        self.config = c
        self.wte = Embedding(c.vocab_size, c.n_embd)
        if c.position == "learned":
            self.wpe = LearnedPositionalEmbedding(c.block_size, c.n_embd)
        elif c.position == "sinusoidal":
            self.wpe = SinusoidalPositionalEncoding(c.n_embd)
        else:
            self.wpe = None
        self.hook_embed = HookPoint()            # (B, T, E) wte[idx]
        if c.position == "learned":              # hook_names() lists only what fires
            self.hook_pos_embed = HookPoint()    # (B, T, E) wpe[positions]
        # n_layer blocks, each told its depth; the final LayerNorm; a separate head only when
        # untied (tied: logits = LN_f(h) wteᵀ reuses the embedding matrix).
        self.drop = Dropout(c.dropout)
        self.h = ModuleList([GPTBlock(c, name, i) for i in range(c.n_layer)])
        self.ln_f = LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = None if c.tie_weights else Linear(c.n_embd, c.vocab_size, bias=False)
        self._init_weights()

    # GPT-2's initialisation: N(0, 0.02²) for weight matrices, zero biases, and the residual
    # output projections scaled by 1/√(2·n_layer) (two residual additions per block), so the
    # residual stream's variance does not grow with depth. Norms, positions and relative-position
    # tables keep their own init.
    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.startswith("ln") or ".ln_" in name or name.startswith("wpe"):
                continue
            if name.endswith("bias"):
                init.zeros_(p)
            elif name.endswith("c_proj.weight") or name.endswith("out_proj.weight"):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.config.n_layer))
            elif name.endswith("weight") and len(p.shape) == 2 and "rel_" not in name:
                init.normal_(p, 0.0, 0.02)

    @property
    def supports_kv_cache(self) -> bool:
        return all(getattr(b.attn, "supports_kv_cache", False) for b in self.h)

    def new_caches(self):
        """One empty cache per block (a ``KVCache``, or the variant's own recurrent state)."""
        return [b.attn.new_cache() if hasattr(b.attn, "new_cache") else KVCache()
                for b in self.h]

    def forward(self, idx, targets=None, kv_caches=None):
        tokens = token_ids(idx)
        b, t = tokens.shape
        # With caches, these T tokens follow the ``offset`` cached ones: their positions start
        # there, and learned positions exist only up to block_size.
        offset = cached_length(kv_caches, len(self.h), owner="GPT")
        if self.config.position == "learned" and offset + t > self.config.block_size:
            raise ValueError(f"GPT: sequence of {offset + t} tokens exceeds block_size="
                             f"{self.config.block_size}")
        # h₀ = wte[idx] + positions (learned added here, sinusoidal by its layer, the others none).
        x = self.hook_embed(self.wte(tokens))                      # (B, T, E)
        if self.config.position == "learned":
            pos = self.wpe.positions(t, offset)                    # (T, E)
            if self.hook_pos_embed.active:
                pos = self.hook_pos_embed(broadcast_to(pos, x.shape))
            x = x + pos
        elif self.wpe is not None:
            x = self.wpe(x, offset=offset)
        x = self.drop(x)
        # The blocks (each with its own cache), then logits = LN_f(h_L) wᵀ, w = wte when tied.
        for i, block in enumerate(self.h):
            x = block(x, None if kv_caches is None else kv_caches[i])
        x = self.ln_f(x)
        w = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = linear(x, w)                                      # (B, T, E) @ (E, V)
        # Loss: mean cross-entropy over all B·T positions (targets of −100 are ignored).
        if targets is None:
            return logits, None
        tgt = token_ids(targets, "targets")
        loss = cross_entropy(reshape(logits, (b * t, -1)), tgt.reshape(-1))
        return logits, loss

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int = None,
                 use_cache: bool = True, paged: bool = False):
        """Extend idx (B, T) by ``max_new_tokens`` tokens, one at a time; returns (B, T + n).

        With ``use_cache`` (and attention variants that support it) each step feeds only the
        new token through the model, reading earlier keys/values from per-block KV caches
        (``paged=True``: a ``PagedKVCache`` pool). As in nanoGPT the context is cropped to
        the last ``block_size`` tokens; once it would be, steps fall back to a full forward, so
        cached and uncached generation give the same tokens. A variant whose cache is bounded
        (its class sets ``bounded_cache = True``, e.g. attention sinks) keeps decoding through
        its cache past ``block_size`` instead (unless positions are "learned"): the context is
        never cropped, so there its tokens differ from uncached generation. ``temperature=0``
        or ``top_k=1`` is greedy. Returns the tokens as an int Tensor on the model's device.
        """
        who = "GPT.generate"
        tokens = token_ids(idx).copy()
        if tokens.shape[1] == 0:
            raise ValueError(f"{who}: idx is empty (shape {tuple(tokens.shape)}): the first new "
                             "token needs a prompt of at least one token")
        max_new_tokens = validate.nonnegative_int(max_new_tokens, "max_new_tokens", owner=who)
        validate.nonnegative_real(temperature, "temperature", owner=who)
        if top_k is not None:
            validate.integer(top_k, "top_k", minimum=1, maximum=self.config.vocab_size, owner=who)
        xp = backend.get_array_module(tokens)
        bs = self.config.block_size
        # a bounded cache (the variant's ``bounded_cache``) is used at every length
        bounded = self.config.position != "learned" and all(
            getattr(b.attn, "bounded_cache", False) for b in self.h)
        # Each step: with a usable cache, the first pass prefills the whole prompt and later passes
        # feed only the newest token; otherwise a full forward over the last block_size tokens.
        caches = None
        with no_grad():
            for step in range(max_new_tokens):
                t = tokens.shape[1]
                if use_cache and self.supports_kv_cache and (t <= bs or bounded):
                    if caches is None:
                        caches = self._paged_caches(tokens.shape[0]) if paged else \
                            self.new_caches()
                        logits, _ = self(tokens, kv_caches=caches)
                    else:
                        logits, _ = self(tokens[:, -1:], kv_caches=caches)
                else:
                    logits, _ = self(tokens[:, -bs:])
                # Sample from the last position's logits and append: (B, T) → (B, T + 1).
                nxt = sample_next(logits.data[:, -1, :], temperature, top_k)
                tokens = xp.concatenate([tokens, nxt.astype(tokens.dtype)], axis=1)
        return Tensor(tokens)

    def _paged_caches(self, batch, page_size: int = 16):
        # A pool with room for every sequence's block_size tokens (plus one page of slack), each
        # batch row viewing its own pages through a KVCache-like adapter.
        c = self.config
        hkv = self.h[0].attn.num_kv_heads
        pages = batch * (-(-c.block_size // page_size) + 1)
        return [PagedKVCache(pages, page_size, hkv, c.n_embd // c.n_head).view(
            range(batch)) for _ in self.h]
