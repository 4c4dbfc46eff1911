r"""One decoder for today's families — Llama, Mistral, Qwen, Gemma, OLMo, Mixtral, gpt-oss,
DeepSeek — each a handful of switches on GPT-2.

GPT-2's decoder, for tokens t at positions m, with the blocks' residual stream h:

$$
h_0 = W_E[t] + P[m], \qquad
h \leftarrow h + \operatorname{Attn}(\operatorname{LN}_1 h), \qquad
h \leftarrow h + \operatorname{MLP}(\operatorname{LN}_2 h), \qquad
\text{logits} = \operatorname{LN}_f(h_L)\, W_E^\top
$$

What changed since, each one switch of ``DecoderConfig`` (its reason in brackets):

- ``norm="rmsnorm"``: RMSNorm instead of LayerNorm (cheaper; centring did not help), Gemma's
  (1 + w) and the float16 rounding order by ``norm_unit_offset`` / ``norm_scale_in_float32``,
  no gain at all by ``norm_weightless`` (nanochat), and one more norm on the embeddings by
  ``embed_norm`` (nanochat: h_0 = Norm(W_E[t])) (``nn/decoder_layers.py``).
- ``mlp="swiglu" | "geglu"``: a gated MLP (better loss per parameter); ``"relu2"`` GPT-2's two
  matrices around a squared ReLU (nanochat); ``"moe"`` a mixture of experts (``nn/moe.py``).
- ``qkv_bias``, ``o_bias``, ``mlp_bias``: biases per projection (most families drop them;
  Qwen2 keeps q, k, v's).
- ``positions="rope"``: rotary positions inside attention instead of a learned table P (scores
  depend on offsets; longer contexts by scaling the frequencies, ``nn/rotary.py``).
- ``num_kv_heads``: grouped-query attention (a smaller KV cache; below); ``attention="mla"``
  DeepSeek's multi-head latent attention (a cache of one latent per token,
  ``LatentDecoderAttention``); ``index_topk`` DeepSeek-V3.2's sparse attention, each query
  reading only the k keys a lightning indexer chooses (``models/indexer.py``).
- ``qk_norm="head" | "proj"``: RMSNorm on each head's q and k (Qwen3, Gemma 3) or on the
  whole projected q and k (OLMo 2), before the rotation (keeps the logits from growing);
  ``"after_rope"``: a weightless RMSNorm on each rotated head's q and k, on the layers that
  rotate (Llama 4, whose HF class calls it L2Norm; nanochat).
- ``rope_reversed``: every pair turns by −mω (nanochat's rotation); ``rope_interleave``: the
  rotated pairs are coordinates (2i, 2i + 1) (Llama 4, DeepSeek's MLA), read as two halves.
- ``norm_placement="post" | "sandwich"``: OLMo 2 normalises each sublayer's output inside the
  residual, h + Norm(F(h)); Gemma 3 normalises its input and output, h + Norm(F(Norm h))
  (steadier training). ``residual_scales``: MiniMax keeps the normalised input as the
  residual and weights both terms per layer, α·Norm(h) + β·F(Norm h).
- ``sliding_window``, ``layer_types``: local layers see only the last W tokens (Mistral all
  layers, Gemma 3 five of every six), so their KV cache is bounded; ``"chunked"`` layers see
  only the keys of their own chunk of ``attention_chunk_size`` C positions (Llama 4,
  ``attention/chunked.py``), so theirs holds at most C − 1 between steps. A layer type may
  also name a registered token mixer (``models/mixers/``), a recurrence in place of softmax
  attention: the hybrid models interleave them with attention layers (Kimi Linear: ``"kda"``
  layers among MLA layers with ``positions="none"``).
- ``attn_temperature`` (F, α): Llama 4 multiplies the queries of its NoPE layers by
  1 + α·ln(1 + ⌊(m + 1)/F⌋) at position m, so that far tokens do not flatten the softmax.
- ``single_sublayer``: each layer is one norm and one sublayer (Nemotron-H): its mixer, or
  for the layer types ``"mlp"`` and ``"moe"`` its MLP, h ← h + F(Norm h).
- ``kv_shared_layers`` n: the last n layers keep their queries but read the keys and values
  of the last earlier layer of their own type (Gemma 4; ``attention/shared_kv.py``), so only
  the first L − n layers cache anything; ``double_wide_mlp`` doubles those layers' MLP.
- Gemma 4's global layers: ``full_head_dim`` and ``full_kv_heads`` (their own head size and
  key/value heads), ``attention_k_eq_v`` (their values are the keys' projection, before the
  keys' norm and rotation); ``v_norm`` a weightless RMSNorm on every layer's values;
  ``layer_scalars`` a learned number (a buffer) multiplying each layer's output.
- ``embed_scale``: Gemma multiplies the embeddings by √E; ``query_pre_attn_scalar`` replaces
  D in the scale 1/√D; ``final_logit_softcap`` c·tanh(z/c) on the logits;
  ``attn_logit_softcap`` the same on the scores (Gemma 2; HF's Gemma 3 does not apply it).
- ``attn_sinks``: gpt-oss's learned sink logit σ_h per head, one more term in each row's
  softmax with no value behind it, so a head may attend to nothing;
  ``attn_output_gate``: Qwen3-Next's gate on each head's output. These two, QK-norm and the
  scores' soft-cap are subclasses of the plain attention (``attention_features.py``, the
  formulas there), composed by ``attention_features.attention_class``.
- ``tie_embeddings``: the head reuses W_E (GPT-2, Gemma) or has its own (Llama 3 8B, Qwen 7B).

Attention of one layer, with G = H/Hkv query heads sharing each key/value head (GQA), the
rotation R_m of ``nn/rotary.py``, scale s = 1/√D (or 1/√query_pre_attn_scalar), and the
window W (∞ for a full layer):

$$
o_i^{(h)} = \sum_{j:\; i - W < j \le i}
\operatorname{softmax}_j\!\bigl(s\, (R_i q_i^{(h)}) \cdot (R_j k_j^{(\lfloor h/G \rfloor)})\bigr)
\, v_j^{(\lfloor h/G \rfloor)}
$$

The cache keeps rotated keys (as HuggingFace's does), so a key is rotated once, at its own
position; a sliding layer's cache (``WindowKVCache``) keeps only the last W − 1 tokens.

Multi-head latent attention (``attention="mla"``) has its formula in
``latent_attention.py``; the layer around the attention and the MLP is ``decoder_block.py``'s,
the families' other placements of its norms ``block_features.py``'s.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .. import backend, validate
from ..backend import host_xp
from ..attention import cached_length
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..nn import init
from ..nn.decoder_layers import softcap
from ..nn.hooks import HookedModel, HookPoint
from ..nn.layers import Embedding, Linear
from ..nn.module import Module, ModuleList
from ..nn.positional import LearnedPositionalEmbedding
# RoPE's tables and scalings.
from ..nn.rotary import check_rope
from ..ops.linalg import linear
# The layer, its mixers and the families' additions to both, each in its own module.
from .block_features import block_class, layer_mixer
from .common import AttentionMaps, token_ids
from .decoder_attention import DecoderAttention, kv_source, layer_heads, norm_layer
from .decoder_block import DecoderBlock, layer_mlp_width
from .gpt import sample_next
from .indexer import check_indexer
from .latent_attention import LatentDecoderAttention
from .mixers import MIXERS

# The mixture-of-experts layer lives in its own module; a tree without it still builds every
# dense family, and ``mlp="moe"`` then says what is missing.
try:
    from ..nn.moe import MoE, load_balancing_loss
except ImportError:  # pragma: no cover - depends on the tree
    MoE = load_balancing_loss = None

__all__ = ["DecoderConfig", "check_config", "count_parameters", "kv_cache_bytes",
           "kv_cache_bytes_per_token", "Decoder",
           "DecoderBlock", "DecoderAttention", "LatentDecoderAttention", "NORMS", "MLPS",
           "PLACEMENTS", "POSITIONS", "QK_NORMS", "LAYER_TYPES", "ATTENTIONS"]

# Each switch's values (DecoderConfig's docstring and the module docstring say what each does).
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "relu2", "swiglu", "geglu", "moe")
PLACEMENTS = ("pre", "post", "sandwich")
POSITIONS = ("rope", "learned", "none")
QK_NORMS = (None, "head", "proj", "after_rope")
ATTENTIONS = ("gqa", "mla")
LAYER_TYPES = ("full", "sliding", "chunked")
# the layer types of a decoder whose layers are one sublayer each (``single_sublayer``)
FFN_LAYERS = ("mlp", "moe")


@validate.catch_unknown_options     # DecoderConfig(n_heads=4): "... did you mean 'num_heads'?"
@dataclass
class DecoderConfig:
    """The switches of ``Decoder`` (module docstring). Defaults: a small Llama.

    Sizes: ``vocab_size`` V, ``hidden_size`` E, ``num_layers`` L, ``num_heads`` H,
    ``num_kv_heads`` Hkv (default H), ``head_dim`` D (default E/H), ``ffn_hidden`` F (the
    MLP's width; default 4E for "gelu", else ⌈8E/3⌉ rounded up to a multiple of 8).
    ``rope``/``local_rope``: HuggingFace ``rope_parameters`` dicts for full and sliding
    layers (``local_rope`` None: the same). ``layer_types``: "full", "sliding" or a
    registered mixer's name (``models.mixers.MIXERS``) per layer (None: all "sliding" when
    ``sliding_window`` is set, else all "full"); ``mixer_options``: {mixer name: its
    options}.
    ``residual_scales``: per layer (α₁, β₁, α₂, β₂), the residual becomes
    α·Norm(h) + β·F(Norm h) for the attention (1) and the MLP (2) (MiniMax; pre-norm only).
    ``nope_layers``: indices of layers that rotate nothing among rotary ones (NoPE, SmolLM3);
    ``attn_temperature`` (floor F, strength α): their queries' temperature (Llama 4).
    ``attention_chunk_size``: the chunk C of "chunked" layers. ``norm_weightless``: every
    RMSNorm without its gain; ``embed_norm``: a norm on the embeddings before the first layer.
    ``single_sublayer``: each layer is one norm and one sublayer (Nemotron-H), its mixer or,
    for the layer types "mlp" and "moe", its MLP or mixture of experts.
    ``kv_shared_layers``: how many last layers borrow an earlier layer's keys and values
    (``double_wide_mlp``: theirs of width 2F). Gemma 4: ``full_head_dim``, ``full_kv_heads``
    (None: D, Hkv) for the "full" layers, ``attention_k_eq_v``, ``v_norm``,
    ``layer_scalars``.
    ``gelu_approximate``: the tanh form of GELU for "gelu" and "geglu". ``padding_idx``: the
    embedding row that gets no gradient (PyTorch's, as HF's checkpoints set it). MoE:
    ``num_experts``, ``top_k``, ``expert_hidden`` (each expert's width; default F) and
    ``moe_options``, passed as ``nn.moe.MoE(E, expert_hidden, num_experts, top_k,
    **moe_options)``; ``dense_layers``: layer indices that keep a dense SwiGLU of width F
    (DeepSeek-V3's first layers, Qwen3-MoE's ``mlp_only_layers``); ``router_aux_loss_coef``:
    the load-balancing loss's weight in a training loss (``Decoder.aux_loss``).
    DeepSeek-V3.2's indexer (``attention="mla"`` with ``q_lora_rank``): ``index_topk`` keys
    per query (None: plain MLA), ``index_n_heads`` h_I, ``index_head_dim`` d_I.
    """

    # sizes
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = None
    head_dim: int = None
    ffn_hidden: int = None
    # the norms: kind, details, where they sit
    norm: str = "rmsnorm"
    norm_eps: float = 1e-6
    norm_unit_offset: bool = False
    norm_scale_in_float32: bool = False
    norm_placement: str = "pre"
    norm_bias: bool = False
    norm_weightless: bool = False
    embed_norm: bool = False
    single_sublayer: bool = False
    residual_scales: tuple = None
    # the MLP and the biases
    mlp: str = "swiglu"
    gelu_approximate: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    # positions
    positions: str = "rope"
    max_position: int = 2048
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    local_rope: dict = None
    nope_layers: tuple = ()
    rope_reversed: bool = False
    attn_temperature: tuple = None
    # attention: its kind, QK-norm, windows, the scale, soft-cap, learned sinks
    attention: str = "gqa"
    qk_norm: str = None
    sliding_window: int = None
    attention_chunk_size: int = None
    # Gemma 4: keys shared across the last layers, its global layers' own heads
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False
    full_head_dim: int = None
    full_kv_heads: int = None
    attention_k_eq_v: bool = False
    v_norm: bool = False
    layer_scalars: bool = False
    layer_types: tuple = None
    mixer_options: dict = field(default_factory=dict)
    query_pre_attn_scalar: float = None
    attn_logit_softcap: float = None
    attn_sinks: bool = False
    attn_output_gate: bool = False
    # embeddings and head
    embed_scale: bool = False
    final_logit_softcap: float = None
    tie_embeddings: bool = True
    padding_idx: int = None
    # multi-head latent attention (attention="mla")
    q_lora_rank: int = None
    kv_lora_rank: int = None
    qk_nope_head_dim: int = None
    qk_rope_head_dim: int = None
    v_head_dim: int = None
    rope_interleave: bool = False
    # DeepSeek-V3.2's lightning indexer (index_topk set): each query reads its top-k keys
    index_topk: int = None
    index_n_heads: int = None
    index_head_dim: int = None
    # mixture of experts (mlp="moe")
    num_experts: int = None
    top_k: int = None
    expert_hidden: int = None
    dense_layers: tuple = ()
    moe_options: dict = field(default_factory=dict)
    router_aux_loss_coef: float = 0.0


def check_config(c: DecoderConfig) -> DecoderConfig:
    """Every switch checked, the defaults (Hkv, D, F, layer types) filled in."""
    who = "DecoderConfig"
    for name, options in (("norm", NORMS), ("mlp", MLPS), ("norm_placement", PLACEMENTS),
                          ("positions", POSITIONS), ("qk_norm", QK_NORMS),
                          ("attention", ATTENTIONS)):
        validate.choice(getattr(c, name), name, options, owner=who)
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position"):
        validate.positive_int(getattr(c, name), name, owner=who)
    # heads: Hkv divides H; D defaults to E/H; F to GPT-2's 4E or a gated MLP's ≈ 8E/3
    c.num_kv_heads = c.num_heads if c.num_kv_heads is None else \
        validate.positive_int(c.num_kv_heads, "num_kv_heads", owner=who)
    if c.num_heads % c.num_kv_heads:
        raise validate.OptionError(f"{who}: num_heads ({c.num_heads}) must be divisible by "
                                   f"num_kv_heads ({c.num_kv_heads})")
    if c.head_dim is None and c.hidden_size % c.num_heads:
        raise validate.OptionError(f"{who}: hidden_size ({c.hidden_size}) must be divisible by "
                                   f"num_heads ({c.num_heads}), or head_dim given")
    c.head_dim = c.hidden_size // c.num_heads if c.head_dim is None else \
        validate.positive_int(c.head_dim, "head_dim", owner=who)
    if c.ffn_hidden is None:
        c.ffn_hidden = 4 * c.hidden_size if c.mlp in ("gelu", "relu2") else \
            8 * -(-(8 * c.hidden_size) // 24)
    validate.positive_int(c.ffn_hidden, "ffn_hidden", owner=who)
    # Which layers slide: given per layer, or all of them when a window is set.
    if c.sliding_window is not None:
        validate.positive_int(c.sliding_window, "sliding_window", owner=who)
    if c.layer_types is None:
        c.layer_types = ("sliding" if c.sliding_window else "full",) * c.num_layers
    c.layer_types = tuple(c.layer_types)
    known = (*LAYER_TYPES, *FFN_LAYERS, *sorted(MIXERS))
    validate.boolean(c.single_sublayer, "single_sublayer", owner=who)
    if set(c.layer_types) & set(FFN_LAYERS) and not c.single_sublayer:
        raise validate.OptionError(f"{who}: the layer types {FFN_LAYERS} are the layers of "
                                   "a decoder of one sublayer per layer: they need "
                                   f"single_sublayer=True, got {c.layer_types!r}")
    if len(c.layer_types) != c.num_layers or not set(c.layer_types) <= set(known):
        raise validate.OptionError(f"{who}: layer_types must give one of {known} for each "
                                   f"of the {c.num_layers} layers, got {c.layer_types!r}")
    # each mixer checks its own options when built; here only that they name known mixers
    c.mixer_options = dict(c.mixer_options or {})
    stray = sorted(set(c.mixer_options) - set(c.layer_types) - set(MIXERS))
    if stray:
        raise validate.OptionError(f"{who}: mixer_options names {stray}, which are not "
                                   f"registered mixers (known: {sorted(MIXERS)})")
    if "sliding" in c.layer_types and c.sliding_window is None:
        raise validate.OptionError(f"{who}: layer_types has 'sliding' layers but "
                                   "sliding_window is None")
    # Llama 4's chunks, Gemma 4's shared keys and global heads: each stated, and consistent
    if c.attention_chunk_size is not None:
        validate.positive_int(c.attention_chunk_size, "attention_chunk_size", owner=who)
    elif "chunked" in c.layer_types:
        raise validate.OptionError(f"{who}: layer_types has 'chunked' layers but "
                                   "attention_chunk_size is None")
    _check_kv_sharing(c, who)
    for name in ("full_head_dim", "full_kv_heads"):
        if getattr(c, name) is not None:
            validate.positive_int(getattr(c, name), name, owner=who)
    if c.full_kv_heads is not None and c.num_heads % c.full_kv_heads:
        raise validate.OptionError(f"{who}: num_heads ({c.num_heads}) must be divisible by "
                                   f"full_kv_heads ({c.full_kv_heads})")
    # the on/off switches of nanochat, Llama 4 and Gemma 4, and the two that need a partner
    for name in ("norm_weightless", "embed_norm", "rope_reversed", "rope_interleave",
                 "double_wide_mlp", "attention_k_eq_v", "v_norm", "layer_scalars"):
        validate.boolean(getattr(c, name), name, owner=who)
    if c.norm_weightless and (c.norm != "rmsnorm" or c.norm_unit_offset):
        raise validate.OptionError(f"{who}: norm_weightless drops RMSNorm's gain: it needs "
                                   f"norm='rmsnorm' without norm_unit_offset, got "
                                   f"norm={c.norm!r}, norm_unit_offset={c.norm_unit_offset}")
    if c.attn_temperature is not None:
        pair = c.attn_temperature
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise validate.OptionError(f"{who}: attn_temperature must be (floor_scale, "
                                       f"attn_scale), got {pair!r}")
        c.attn_temperature = (validate.positive_real(pair[0], "attn_temperature[0]", owner=who),
                              validate.real(pair[1], "attn_temperature[1]", owner=who))
    # MiniMax's residual weights: four numbers per layer, around pre-norms only
    if c.residual_scales is not None:
        rows = c.residual_scales if isinstance(c.residual_scales, (tuple, list)) else ()
        if len(rows) != c.num_layers or c.norm_placement != "pre" or \
                any(not isinstance(r, (tuple, list)) or len(r) != 4 for r in rows):
            raise validate.OptionError(f"{who}: residual_scales must give (α₁, β₁, α₂, β₂) "
                                       f"for each of the {c.num_layers} layers, with "
                                       f"norm_placement='pre', got {c.residual_scales!r} "
                                       f"({c.norm_placement!r})")
        c.residual_scales = tuple(tuple(validate.real(a, "residual_scales", owner=who)
                                        for a in row) for row in rows)
    # rope dicts by HF's rules; the Gemma and MoE numbers positive or present
    c.rope = check_rope(c.rope, owner=f"{who}.rope")
    if c.local_rope is not None:
        c.local_rope = check_rope(c.local_rope, owner=f"{who}.local_rope")
    for name in ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
        if getattr(c, name) is not None:
            validate.positive_real(getattr(c, name), name, owner=who)
    validate.boolean(c.attn_output_gate, "attn_output_gate", owner=who)
    if c.mlp == "moe" and (c.num_experts is None or c.top_k is None):
        raise validate.OptionError(f"{who}: mlp='moe' needs num_experts and top_k")
    if "moe" in c.layer_types and (c.num_experts is None or c.top_k is None):
        raise validate.OptionError(f"{who}: 'moe' layers need num_experts and top_k")
    # MLA's sizes; DeepSeek's attention has none of the other attention switches
    if c.attention == "mla":
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            validate.positive_int(getattr(c, name), name, owner=f"{who} (attention='mla')")
        if c.q_lora_rank is not None:
            validate.positive_int(c.q_lora_rank, "q_lora_rank", owner=who)
        if c.positions == "learned" or "sliding" in c.layer_types or c.qk_norm \
                or c.attn_sinks or c.attn_logit_softcap or c.attn_output_gate:
            raise validate.OptionError(f"{who}: attention='mla' is DeepSeek's: rope positions "
                                       "(or none, Kimi Linear's), full layers, no QK-norm, "
                                       "sinks, soft-cap or output gate")
    if c.index_topk is not None:
        check_indexer(c, who)
    # the experts' width (default F, and only where there are experts), and the dense layers
    if c.expert_hidden is not None:
        validate.positive_int(c.expert_hidden, "expert_hidden", owner=who)
    elif c.mlp == "moe" or "moe" in c.layer_types:
        c.expert_hidden = c.ffn_hidden
    for name in ("dense_layers", "nope_layers"):
        setattr(c, name, tuple(validate.integer(i, name, minimum=0, maximum=c.num_layers - 1,
                                                owner=who) for i in getattr(c, name)))
    return c


def _check_kv_sharing(c: DecoderConfig, who: str) -> None:
    """The last ``kv_shared_layers`` layers are attention layers, each with an earlier layer
    of its own type to read (HF's rule for Gemma 4)."""
    n = c.kv_shared_layers = validate.integer(c.kv_shared_layers, "kv_shared_layers",
                                              minimum=0, maximum=c.num_layers - 1, owner=who)
    if not n:
        return
    if c.attention == "mla":
        raise validate.OptionError(f"{who}: kv_shared_layers shares grouped-query keys, not "
                                   "latent attention's; got attention='mla'")
    for i in range(c.num_layers - n, c.num_layers):
        t = c.layer_types[i]
        if t not in LAYER_TYPES or kv_source(c, i) is None:
            raise validate.OptionError(
                f"{who}: kv_shared_layers={n}: layer {i} ({t!r}) must be an attention layer "
                f"with an earlier {t!r} layer among the first {c.num_layers - n} to read")


def count_parameters(config: DecoderConfig) -> dict:
    """{"total", "embedding", "non_embedding", "active"}: the parameters of
    ``Decoder(config)``, counted from the configuration alone (no model is built, so real
    sizes cost nothing). "embedding" is the token table (and the untied head). "active" is
    what one token uses: everything but the n − k routed experts it skips in each MoE layer
    (router, k experts, shared expert, attention, norms, dense layers, the table and the
    head); equal to "total" for a dense model. Buffers (DeepSeek-V3's correction bias) are
    not parameters."""
    c = check_config(dataclasses.replace(config))
    e, h = c.hidden_size, c.num_heads
    per_dim = 0 if c.norm_weightless else \
        2 if c.norm == "layernorm" and c.norm_bias else 1               # gain (and bias)
    norm = e * per_dim

    def attention(i):
        """Layer i's attention: four projections (+ biases), QK-norm gains, sinks; none of
        the keys' and values' where it borrows them, no v_proj where the values are k's."""
        hkv, d = layer_heads(c, i)
        borrows = kv_source(c, i) is not None
        kv_sets = 0 if borrows else 1 if c.attention_k_eq_v and c.layer_types[i] == "full" \
            else 2
        n = e * h * d * 2 + kv_sets * e * hkv * d
        n += (h + kv_sets * hkv) * d * c.qkv_bias + e * c.o_bias + h * c.attn_sinks
        n += (e + c.qkv_bias) * h * d * c.attn_output_gate         # the gate's q_proj rows
        if c.qk_norm in ("head", "proj"):    # "after_rope" has no gain
            n += per_dim * (d if c.qk_norm == "head" else h * d)
            n += 0 if borrows else per_dim * (d if c.qk_norm == "head" else hkv * d)
        return n
    attn = attention(0) if c.attention != "mla" else None
    if c.attention == "mla":                  # latents: q (optional) and kv, then expanded
        dn, dr, dv, r, ql = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
                             c.kv_lora_rank, c.q_lora_rank)
        q = e * h * (dn + dr) if ql is None else (e + 1 + h * (dn + dr)) * ql + ql * c.qkv_bias
        attn = (q + e * (r + dr) + (r + dr) * c.qkv_bias + r * per_dim + r * h * (dn + dv)
                + h * dv * e + e * c.o_bias)
        if c.index_topk is not None:          # the indexer: wq_b, wk, k_norm (gain, bias), w
            hi, di = c.index_n_heads, c.index_head_dim
            attn += ql * hi * di + e * di + 2 * di + e * hi
    # the MLP: three matrices when gated, two for GPT-2's, biases on each output
    mats = 2 if c.mlp in ("gelu", "relu2") else 3

    def dense_mlp(i):
        w = layer_mlp_width(c, i)
        return mats * e * w + ((mats - 1) * w + e) * c.mlp_bias
    norms_per_layer = 1 if c.single_sublayer else 4 if c.norm_placement == "sandwich" else 2
    norm_layers = 1 + c.embed_norm                # the final norm, the embeddings' norm
    mixing = sum(MIXERS[t].parameter_count(c) if t in MIXERS else 0 if t in FFN_LAYERS else
                 attn if c.attention == "mla" else attention(i)
                 for i, t in enumerate(c.layer_types))
    if c.single_sublayer:                        # Nemotron-H: an MLP only where a layer is one
        moe_layers = c.layer_types.count("moe")
        dense = [i for i, t in enumerate(c.layer_types) if t == "mlp"]
    else:
        moe_layers = 0 if c.mlp != "moe" else c.num_layers - len(set(c.dense_layers))
        dense = [i for i in range(c.num_layers) if c.mlp != "moe" or i in c.dense_layers]
    moe, skipped = _count_moe(c) if moe_layers else (0, 0)
    embedding = c.vocab_size * e * (1 if c.tie_embeddings else 2)
    positions = c.max_position * e if c.positions == "learned" else 0
    non_embedding = (mixing + c.num_layers * norms_per_layer * norm
                     + sum(dense_mlp(i) for i in dense)
                     + moe_layers * moe + norm_layers * norm + positions)
    total = embedding + non_embedding
    return {"total": total, "embedding": embedding, "non_embedding": non_embedding,
            "active": total - moe_layers * skipped}


def _count_moe(c: DecoderConfig):
    """(parameters of one MoE layer, those a token skips: its n − k unchosen experts)."""
    o, e, i = c.moe_options, c.hidden_size, c.expert_hidden
    mats = 2 if o.get("expert") == "relu2" else 3          # Nemotron-H's have no gate
    inner = o.get("latent_size") or e                      # the experts' width in and out
    latent = 0 if not o.get("latent_size") else \
        2 * e * inner + (inner + e) * bool(o.get("latent_bias"))
    expert = mats * inner * i + (2 * i + inner) * bool(o.get("expert_bias"))
    router = c.num_experts * (e + bool(o.get("router_bias")))
    shared = o.get("shared_intermediate_size") or o.get("n_shared_experts", 0) * i
    shared = mats * e * shared + e * bool(o.get("shared_expert_gate"))
    return (router + latent + c.num_experts * expert + shared,
            (c.num_experts - c.top_k) * expert)


def kv_cache_bytes(config: DecoderConfig, tokens: int = 1, bytes_per_number: int = 2) -> int:
    """Bytes of the caches of every layer after ``tokens`` tokens (bfloat16 by default),
    from the configuration alone: a full layer keeps 2·Hkv·D numbers per token (MHA when
    Hkv = H, GQA below), a sliding layer at most its last W − 1 tokens (``WindowKVCache``), a
    chunked one at most C − 1 (``ChunkKVCache``: the current chunk's, T mod C),
    an MLA layer its latent and rotary key, r + D_r (+ d_I, the indexer's key, with
    ``index_topk``), a mixer layer what its ``state_numbers`` says (a recurrent state does
    not grow with the tokens), a layer that borrows its keys (``kv_shared_layers``) none."""
    c = check_config(dataclasses.replace(config))
    tokens = validate.nonnegative_int(tokens, "tokens", owner="kv_cache_bytes")
    mla, index = c.attention == "mla", 0 if c.index_topk is None else c.index_head_dim
    per_layer = [MIXERS[t].state_numbers(c, tokens) if t in MIXERS else
                 0 if t in FFN_LAYERS else                  # an MLP keeps nothing
                 tokens * (c.kv_lora_rank + c.qk_rope_head_dim + index) if mla else
                 0 if kv_source(c, i) is not None else      # it reads an earlier layer's
                 2 * _product(layer_heads(c, i)) * _kept(c, t, tokens)
                 for i, t in enumerate(c.layer_types)]
    return sum(per_layer) * bytes_per_number


def _product(pair) -> int:
    return pair[0] * pair[1]


def _kept(c: DecoderConfig, layer_type: str, tokens: int) -> int:
    """The most tokens an attention layer's cache holds after ``tokens``."""
    if layer_type == "sliding":
        return min(tokens, c.sliding_window - 1)
    if layer_type == "chunked":
        return min(tokens, c.attention_chunk_size - 1)
    return tokens


def kv_cache_bytes_per_token(config: DecoderConfig, bytes_per_number: int = 2) -> int:
    """The caches' growth per token once every window is full, ``kv_cache_bytes(T + 1) −
    kv_cache_bytes(T)`` for T past them: full layers' keys and values (or MLA's latent), not a
    sliding layer's W − 1 tokens, a chunked one's C − 1 or a recurrent state. Below the
    windows every layer grows."""
    c = check_config(dataclasses.replace(config))
    past = max(c.sliding_window or 0, c.attention_chunk_size or 0) + 1   # every window full
    return (kv_cache_bytes(c, past + 1, bytes_per_number)
            - kv_cache_bytes(c, past, bytes_per_number))


def _stop_ids(eos_token_id, vocab: int, who: str) -> list:
    """``eos_token_id`` (None, an id or a list of ids) as a list of ids in [0, vocab)."""
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, (int, host_xp.integer)) else \
        list(eos_token_id)
    return [validate.integer(i, "eos_token_id", minimum=0, maximum=vocab - 1, owner=who)
            for i in ids]


def _keep_mask(attention_mask, shape, xp):
    """HuggingFace's ``attention_mask`` (B, cached + N), 1 = token, 0 = padding (ints, bools or
    0/1 floats) as a bool array on ``xp``; None when absent or when it keeps every key."""
    if attention_mask is None:
        return None
    m = xp.asarray(attention_mask.data if isinstance(attention_mask, Tensor) else
                   attention_mask)
    if tuple(m.shape) != tuple(shape):
        raise ValueError(f"Decoder: attention_mask must have shape {tuple(shape)} (batch, "
                         f"cached + new tokens), got {tuple(m.shape)}")
    if m.dtype != bool and (m.dtype.kind not in "iuf" or not bool(((m == 0) | (m == 1)).all())):
        raise ValueError("Decoder: attention_mask must hold only 0 (padding) and 1 (token), "
                         "HuggingFace's convention; it is not an additive bias")
    m = m != 0
    return None if bool(m.all()) else m


class Decoder(Module, AttentionMaps, HookedModel):
    """A decoder-only language model whose family is its ``DecoderConfig`` (module docstring).

    ``forward(idx (B, N) ints, kv_caches=None, attention_mask=None)`` → logits (B, N, V).
    ``new_caches()`` gives one cache per layer (bounded for sliding layers); with caches, the
    tokens follow the cached ones. ``attention_mask`` (B, cached + N) is HuggingFace's, 1 =
    token, 0 = padding: padding keys are never attended to; positions stay 0 … N − 1 (HF's
    forward does the same), and rows of padding queries are meaningless.
    ``generate(idx, max_new_tokens, temperature=0)`` decodes through the caches (greedy at
    temperature 0).

    Parameters: ``embed.weight`` (V, E), ``pos_embed.weight`` (learned positions),
    ``blocks.{i}.ln1/ln1_post/ln2/ln2_post.weight``,
    ``blocks.{i}.attn.q_proj/k_proj/v_proj/o_proj.*``, ``blocks.{i}.attn.q_norm/k_norm.weight``,
    ``blocks.{i}.mlp.gate_proj/up_proj/down_proj.*``, ``ln_final.weight``, and
    ``unembed.weight`` (V, E) when untied. Initialisation as GPT-2: N(0, 0.02²), residual
    outputs N(0, 0.02²/(2L)), zero biases, unit gains. Hook points under TransformerLens's
    names: ``hook_embed`` (after Gemma's √E), ``blocks.{i}.…``, ``ln_final.hook_normalized``.
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        c = self.config = check_config(config)
        # Embeddings (positions only when learned), the blocks, the final norm, the head.
        self.embed = Embedding(c.vocab_size, c.hidden_size, padding_idx=c.padding_idx)
        self.hook_embed = HookPoint()
        self.pos_embed = LearnedPositionalEmbedding(c.max_position, c.hidden_size) \
            if c.positions == "learned" else None
        self.ln_embed = norm_layer(c, c.hidden_size) if c.embed_norm else None
        self.blocks = ModuleList([block_class(c)(c, layer_mixer(c, i), i)
                                  for i in range(c.num_layers)])
        for i in range(c.num_layers):          # Gemma 4's last layers read earlier ones' keys
            j = kv_source(c, i)
            if j is not None:
                self.blocks[i].attn.borrow_from(self.blocks[j].attn)
            if c.layer_scalars:                # Gemma 4's number on each layer's output
                self.blocks[i].register_buffer("layer_scalar", backend.xp().ones(
                    (1,), dtype=backend.default_float()))
        self.ln_final = norm_layer(c, c.hidden_size)
        self.unembed = None if c.tie_embeddings else \
            Linear(c.hidden_size, c.vocab_size, bias=False)
        self._init_weights()

    # GPT-2's initialisation; norms and sinks keep theirs (gains 1, Gemma's w 0, sinks 0).
    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith("dt_bias"):      # a recurrent mixer's decay keeps its own start
                continue
            if name.endswith("bias"):
                init.zeros_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.config.num_layers))
            elif len(p.shape) == 2:
                init.normal_(p, 0.0, 0.02)

    def new_caches(self):
        """One empty cache per layer: ``WindowKVCache`` for sliding ones, else ``KVCache``."""
        return [b.new_cache() for b in self.blocks]

    def forward(self, idx, kv_caches=None, attention_mask=None, position_ids=None,
                logits_to_keep: int = 0):
        """Logits (B, N, V) of ``idx`` (B, N), or with ``logits_to_keep`` = k > 0 (HF's name)
        the last k positions' (B, k, V): generation needs one, not a whole prompt's N · V."""
        tokens = token_ids(idx)
        n = tokens.shape[1]
        keep_last = validate.nonnegative_int(logits_to_keep, "logits_to_keep", owner="Decoder")
        offset = cached_length(kv_caches, len(self.blocks), owner="Decoder")
        xp = backend.get_array_module(self.embed.weight.data)
        keep = _keep_mask(attention_mask, (tokens.shape[0], offset + n), xp)
        if position_ids is not None:
            position_ids = token_ids(position_ids, "position_ids")
            if tuple(position_ids.shape) != tuple(tokens.shape) or self.pos_embed is not None:
                raise ValueError(f"Decoder: position_ids must be (B, N) = {tuple(tokens.shape)}"
                                 f" with rotary or no positions, got "
                                 f"{tuple(position_ids.shape)} (positions="
                                 f"{self.config.positions!r})")
        # Embed; Gemma scales by √E (in the model's dtype) so embeddings match the residual's size.
        x = self.embed(tokens)                                          # (B, N, E)
        if self.config.embed_scale:
            x = x * math.sqrt(self.config.hidden_size)
        x = self.hook_embed(x)
        if self.pos_embed is not None:
            if offset + n > self.config.max_position:
                raise ValueError(f"Decoder: {offset + n} positions exceed max_position="
                                 f"{self.config.max_position}")
            x = x + self.pos_embed.positions(n, offset)
        if self.ln_embed is not None:                                   # nanochat's
            x = self.ln_embed(x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if kv_caches is None else kv_caches[i], keep, position_ids)
            if self.config.layer_scalars:      # after hook_resid_post: the next layer's input
                x = x * block.layer_scalar
        # Final norm, then the head (W_E when tied), then Gemma's soft-cap on the logits.
        x = self.ln_final(x[:, -keep_last:] if keep_last else x)
        w = self.embed.weight if self.unembed is None else self.unembed.weight
        logits = linear(x, w)                                           # (B, N, V)
        if self.config.final_logit_softcap is not None:
            logits = softcap(logits, self.config.final_logit_softcap)
        return logits

    def router_logits(self) -> list:
        """Each mixture-of-experts layer's router logits (B·N, n) from the last forward, in
        layer order (HuggingFace's ``output_router_logits``); [] for a dense model."""
        return [b.mlp.router_logits for b in self.blocks
                if MoE is not None and isinstance(b.mlp, MoE) and b.mlp.router_logits is not None]

    def aux_loss(self, attention_mask=None):
        """The load-balancing loss of the last forward, every MoE layer's tokens pooled
        (``nn.moe.load_balancing_loss``, HuggingFace's ``aux_loss``); padding (0 in
        ``attention_mask``) does not count. A training loss adds ``router_aux_loss_coef``
        times it, as HF's does when given labels."""
        logits = self.router_logits()
        if not logits:
            raise ValueError("Decoder.aux_loss: no mixture-of-experts layer has run (the "
                             f"config has mlp={self.config.mlp!r}, or no forward yet)")
        return load_balancing_loss(logits, self.config.num_experts, self.config.top_k,
                                   attention_mask)

    def generate(self, idx, max_new_tokens: int, temperature: float = 0.0, top_k: int = None,
                 use_cache: bool = True, attention_mask=None, top_p: float = None,
                 seed: int = None, eos_token_id=None, on_token=None):
        """Extend idx (B, T) by at most ``max_new_tokens`` tokens; returns an int Tensor
        (B, T + n), n ≤ ``max_new_tokens``.

        ``temperature=0`` (default) is greedy (HuggingFace's ``do_sample=False``); otherwise
        softmax(logits/temperature) sampling among the ``top_k`` most likely and the ``top_p``
        nucleus (``models.gpt.sample_next``), drawn from ``numpy.random.default_rng(seed)``
        when ``seed`` is given (the same tokens on every run), else from
        ``minitx.manual_seed``'s generator. With ``use_cache`` the prompt runs once and each
        step feeds only the newest token through the per-layer caches (the same logits as a
        full forward over all tokens). ``attention_mask`` (B, T), 1 = token, 0 = padding, for
        prompts of different lengths padded on the left: the padding is never attended to and
        each row's positions count its real tokens only (HuggingFace's ``generate`` does the
        same).

        ``eos_token_id`` (an id or a list of ids: end of text, end of turn): a row stops when it
        produces one (the id is kept), and is padded with its first id while the others go on;
        generation ends when every row has stopped. ``on_token(step, ids)`` is called with each
        step's (B,) host ids as they come (streaming); raising ``StopIteration`` in it ends the
        generation there (a stop string found by the caller)."""
        who = "Decoder.generate"
        tokens = token_ids(idx).copy()
        if tokens.shape[1] == 0:
            raise ValueError(f"{who}: idx is empty: the first new token needs a prompt")
        max_new_tokens = validate.nonnegative_int(max_new_tokens, "max_new_tokens", owner=who)
        stops = _stop_ids(eos_token_id, self.config.vocab_size, who)
        generator = None if seed is None else \
            host_xp.random.default_rng(validate.nonnegative_int(seed, "seed", owner=who))
        xp = backend.get_array_module(tokens)
        keep = _keep_mask(attention_mask, tokens.shape, xp)             # None: no padding
        done = host_xp.zeros(tokens.shape[0], dtype=bool)               # rows that have stopped
        # Step 0 runs the prompt; each later step one token, through the caches if any.
        caches = self.new_caches() if use_cache else None
        with no_grad():
            for step in range(max_new_tokens):
                new = slice(None) if caches is None or step == 0 else slice(-1, None)
                if keep is None:
                    logits = self(tokens[:, new], kv_caches=caches, logits_to_keep=1)
                else:
                    # a row's positions count its real tokens; padding sits at 1, as in HF
                    pos = xp.where(keep, xp.cumsum(keep, axis=1) - 1, 1)
                    logits = self(tokens[:, new], kv_caches=caches, attention_mask=keep,
                                  position_ids=pos[:, new], logits_to_keep=1)
                    keep = xp.concatenate([keep, xp.ones((len(keep), 1), dtype=bool)], axis=1)
                nxt = sample_next(logits.data[:, -1, :], temperature, top_k, top_p,
                                  generator)                            # (B, 1)
                host = backend.to_host(nxt).reshape(-1)
                if stops:
                    host = host_xp.where(done, stops[0], host)          # stopped rows: padded
                    done |= host_xp.isin(host, stops)
                tokens = xp.concatenate([tokens, xp.asarray(host[:, None]).astype(tokens.dtype)],
                                        axis=1)
                if on_token is not None:
                    try:
                        on_token(step, host)
                    except StopIteration:
                        break
                if stops and done.all():
                    break
        return Tensor(tokens)
