"""Transformer blocks (Vaswani et al. 2017) with PyTorch's arguments and state-dict keys.

Encoder layer, post-norm (``norm_first=False``, the paper) and pre-norm (Xiong et al. 2020):

    post-norm:  x = LN₁(x + SA(x));          x = LN₂(x + FF(x))
    pre-norm:   x = x + SA(LN₁(x));          x = x + FF(LN₂(x))
    FF(x) = W₂ dropout(act(W₁ x + b₁)) + b₂

The decoder layer adds cross-attention to the encoder's output ("memory") between the two:
x = LN₂(x + CA(x, memory)) (or x + CA(LN₂(x), memory)) and normalises the FF with LN₃.

Keys match ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``: ``self_attn.*``
(``in_proj_weight``, ``in_proj_bias``, ``out_proj.*``), ``multihead_attn.*``,
``linear1.*``, ``linear2.*``, ``norm1.*``, ``norm2.*``, ``norm3.*``; stacks prefix
``layers.{i}.`` and ``norm.``. So a torch layer's ``state_dict()`` loads and gives the same
outputs (in eval mode).

``attention="local"`` (any ``minitx.attention.REGISTRY`` name) swaps the *self*-attention
for that variant, built as ``REGISTRY[name](d_model, nhead, **attention_options)``; its keys
are then the variant's own (``self_attn.q_proj.weight``, ``self_attn.k_proj.weight``, …).
Masks reach such a variant only if it accepts them (the exact and position variants do,
``supports_attn_mask``); otherwise passing a mask raises ValueError. In a decoder layer the
variant is built causal unless ``attention_options`` says ``causal=False``.
"""
from __future__ import annotations

import copy

from .. import validate
from ..attention import REGISTRY, ExactSelfAttention, cached_length
from ..nn.hooks import HookPoint
from ..nn.layers import Dropout, LayerNorm, Linear
from ..nn.module import Module, ModuleList
from ..ops.elementwise import gelu, relu
from ..ops.shape import transpose
from .multihead import MultiheadAttention, torch_masks_to_sdpa

__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder", "build_self_attention", "get_activation"]


def get_activation(activation):
    """"relu" | "gelu" | a callable (Tensor → Tensor)."""
    if callable(activation):
        return activation
    if activation == "relu":
        return relu
    if activation == "gelu":
        return gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


def build_self_attention(attention, d_model, nhead, dropout, bias, batch_first, causal_default,
                         options):
    """The self-attention module of a block: PyTorch's MHA, or ``REGISTRY[attention]``."""
    # No variant named: PyTorch's MultiheadAttention, with its packed in_proj keys.
    if attention is None:
        if options:
            raise ValueError(f"attention_options {sorted(options)} need attention=<a REGISTRY "
                             "name>")
        return MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                  batch_first=batch_first)
    # A registered variant: the block's defaults fill what the caller left out (causal in a
    # decoder; the exact variants also take the block's dropout and bias).
    if attention not in REGISTRY:
        raise ValueError(f"attention must be None or one of {sorted(REGISTRY)}, got "
                         f"{attention!r}")
    cls = REGISTRY[attention]
    options = dict(options or {})
    options.setdefault("causal", causal_default)
    if "layer_index" in getattr(cls, "model_options", ()):
        options.setdefault("layer_index", 0)      # a lone layer is the first; the stacks renumber
    if issubclass(cls, ExactSelfAttention):
        options.setdefault("dropout", dropout)
        options.setdefault("bias", bias)
    return cls(d_model, nhead, **options)


#: Module paths → TransformerLens's hook names, for layers, stacks and the models built on
#: them: ``layers.{i}`` → ``blocks.{i}``, ``self_attn`` → ``attn``, ``multihead_attn`` →
#: ``cross_attn``, ``norm{k}`` → ``ln{k}``, a stack's final ``norm`` → ``ln_final``.
BLOCK_HOOK_RENAMES = (
    (r"(^|\.)layers\.(\d+)\.", r"\1blocks.\2."), (r"(^|\.)self_attn\.", r"\1attn."),
    (r"(^|\.)multihead_attn\.", r"\1cross_attn."), (r"(^|\.)norm(\d)\.", r"\1ln\2."),
    (r"(^|\.)norm\.", r"\1ln_final."), (r"(^|\.)hook_mlp_(pre|post)$", r"\1mlp.hook_\2"))


class _Block(Module):
    """Shared plumbing: layout conversion, self-attention dispatch, feed-forward.

    Hook points (TransformerLens's names, in the layer's own layout): ``hook_resid_pre``,
    ``hook_attn_out``, ``hook_resid_mid`` (x + attn_out, before ``norm1`` when post-norm),
    ``mlp.hook_pre`` / ``mlp.hook_post`` (before / after the activation), ``hook_mlp_out``,
    ``hook_resid_post`` (before ``norm2``/``norm3`` when post-norm); the decoder adds
    ``hook_cross_attn_out`` and ``hook_resid_mid2``.
    """

    hook_renames = BLOCK_HOOK_RENAMES

    def _init_common(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                     batch_first, norm_first, bias, attention, attention_options, causal_default):
        for name, val in (("d_model", d_model), ("nhead", nhead),
                          ("dim_feedforward", dim_feedforward)):
            validate.positive_int(val, name, owner=type(self).__name__)
        self.batch_first, self.norm_first = bool(batch_first), bool(norm_first)
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        # The sublayers, named as PyTorch names them so its state dicts load: attention, the FF's
        # two linears E → F → E, one LayerNorm per residual branch, one dropout per branch.
        self.self_attn = build_self_attention(attention, d_model, nhead, dropout, bias,
                                              batch_first, causal_default, attention_options)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = get_activation(activation)
        # Hook points on the residual stream and around the MLP's activation (identities until a
        # hook is attached).
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_pre = HookPoint()
        self.hook_mlp_post = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def _check(self, x, name):
        if len(x.shape) != 3 or x.shape[-1] != self.linear1.in_features:
            layout = "(N, S, E)" if self.batch_first else "(S, N, E)"
            raise ValueError(f"{type(self).__name__}: {name} must be {layout} with E="
                             f"{self.linear1.in_features}, got shape {tuple(x.shape)}")

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal, kv_cache=None):
        """Self-attention of x (layout as the layer's), then dropout."""
        sa = self.self_attn
        if isinstance(sa, MultiheadAttention):
            y = sa(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                   need_weights=False, is_causal=is_causal, kv_cache=kv_cache)[0]
            return self.hook_attn_out(self.dropout1(y))
        # A registered variant takes (N, S, E) and one sdpa mask (bool True = may attend, or float
        # added): PyTorch's masks (True = masked out) are converted, for S new queries against
        # nk = cached + S keys; is_causal adds a causal mask only if the variant is not causal yet.
        xb = x if self.batch_first else transpose(x, (1, 0, 2))      # (N, S, E)
        n, s = xb.shape[0], xb.shape[1]
        nk = s + (len(kv_cache) if kv_cache is not None else 0)
        causal = is_causal and not sa.causal
        mask = None
        if attn_mask is not None or key_padding_mask is not None or causal:
            mask = torch_masks_to_sdpa(attn_mask, key_padding_mask, causal, n, sa.num_heads,
                                       s, nk, xb.dtype, owner=type(self).__name__)
        # A mask or a cache goes only to a variant that accepts it: refusing beats ignoring a mask.
        if mask is not None or kv_cache is not None:
            if not getattr(sa, "supports_attn_mask", False):
                raise ValueError(f"{type(self).__name__}: attention={self.attention!r} does not "
                                 "accept masks or a KV cache; build it causal via "
                                 "attention_options={'causal': True} or use the default "
                                 "MultiheadAttention")
            y = sa(xb, attn_mask=mask, kv_cache=kv_cache)
        else:
            y = sa(xb)
        y = y if self.batch_first else transpose(y, (1, 0, 2))
        return self.hook_attn_out(self.dropout1(y))

    def _mlp(self, x):
        """linear2(dropout(act(linear1(x)))), through the MLP's two hook points."""
        h = self.hook_mlp_post(self.activation(self.hook_mlp_pre(self.linear1(x))))
        return self.linear2(self.dropout(h))

    def _ff_block(self, x):
        return self.hook_mlp_out(self.dropout2(self._mlp(x)))


class TransformerEncoderLayer(_Block):
    """PyTorch's ``nn.TransformerEncoderLayer``: self-attention + feed-forward, each with a
    residual connection and LayerNorm (post-norm by default, pre-norm with ``norm_first``).

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``: src (S, N, E)
    or (N, S, E) with ``batch_first``; masks in PyTorch's polarity (bool True = masked out).
    Time O(S²·E + S·E·F) per sequence.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 attention: str = None, attention_options: dict = None, device=None,
                 dtype=None):
        super().__init__()
        self._init_common(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                          batch_first, norm_first, bias, attention, attention_options, False)
        self._factory(device, dtype)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        self._check(src, "src")
        x = self.hook_resid_pre(src)
        # Pre-norm: x + SA(LN₁(x)), then x + FF(LN₂(x)): only each branch's input is normalised.
        # Post-norm (the paper): LN₁(x + SA(x)), then LN₂(x + FF(x)).
        if self.norm_first:
            x = self.hook_resid_mid(x + self._sa_block(self.norm1(x), src_mask,
                                                       src_key_padding_mask, is_causal))
            x = self.hook_resid_post(x + self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(self.hook_resid_mid(
                x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal)))
            x = self.norm2(self.hook_resid_post(x + self._ff_block(x)))
        return x


class TransformerDecoderLayer(_Block):
    """PyTorch's ``nn.TransformerDecoderLayer``: masked self-attention, cross-attention to
    ``memory`` (``multihead_attn``), feed-forward; norms ``norm1``…``norm3``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False, *,
    kv_cache=None)``. With ``kv_cache`` (a ``KVCache``) tgt holds only the new positions and
    the self-attention sees every cached one (incremental decoding). Set
    ``multihead_attn.record_weights = True`` to keep the cross-attention map.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 attention: str = None, attention_options: dict = None, device=None,
                 dtype=None):
        super().__init__()
        self._init_common(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                          batch_first, norm_first, bias, attention, attention_options, True)
        # What the decoder adds: cross-attention (queries from x, keys and values from the
        # encoder's output ``memory``), with its own norm and dropout.
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout3 = Dropout(dropout)
        self.hook_cross_attn_out = HookPoint()
        self.hook_resid_mid2 = HookPoint()
        self._factory(device, dtype)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        y = self.multihead_attn(x, memory, memory, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.hook_cross_attn_out(self.dropout2(y))

    # The decoder's FF branch takes the third dropout (the second is cross-attention's), as in
    # PyTorch.
    def _ff_block(self, x):
        return self.hook_mlp_out(self.dropout3(self._mlp(x)))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False, *, kv_cache=None):
        self._check(tgt, "tgt")
        self._check(memory, "memory")
        x = self.hook_resid_pre(tgt)
        # Pre-norm: each of the three branches (self-attention, over the cached positions too;
        # cross-attention to memory; feed-forward) reads LN(x) and is added to x.
        if self.norm_first:
            x = self.hook_resid_mid(x + self._sa_block(self.norm1(x), tgt_mask,
                                                       tgt_key_padding_mask, tgt_is_causal,
                                                       kv_cache))
            x = self.hook_resid_mid2(x + self._mha_block(self.norm2(x), memory, memory_mask,
                                                         memory_key_padding_mask,
                                                         memory_is_causal))
            x = self.hook_resid_post(x + self._ff_block(self.norm3(x)))
        # Post-norm (the paper): each sum x + branch(x) is normalised, by LN₁, LN₂, LN₃ in turn.
        else:
            x = self.norm1(self.hook_resid_mid(
                x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal, kv_cache)))
            x = self.norm2(self.hook_resid_mid2(
                x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)))
            x = self.norm3(self.hook_resid_post(x + self._ff_block(x)))
        return x


def _clones(layer, num_layers, owner):
    """``num_layers`` deep copies of ``layer``. A self-attention variant that declares
    "layer_index" in its ``model_options`` gets each copy's 0-based depth (``attn.layer_index
    = i``; what depends on it, e.g. ``diff``'s λ_init, is derived from that attribute), unless
    the layer's ``attention_options`` gave ``layer_index``."""
    num_layers = validate.positive_int(num_layers, "num_layers", owner=owner)
    clones = ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
    for i, clone in enumerate(clones):
        attn, given = getattr(clone, "self_attn", None), getattr(clone, "attention_options", {})
        if "layer_index" in getattr(attn, "model_options", ()) and "layer_index" not in given:
            attn.layer_index = i
    return clones


class TransformerEncoder(Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` (deep copies, as in PyTorch), then
    ``norm`` if given. ``forward(src, mask=None, src_key_padding_mask=None, is_causal=False)``.
    ``enable_nested_tensor`` and ``mask_check`` are accepted for PyTorch code and ignored."""

    hook_renames = BLOCK_HOOK_RENAMES

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm=None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        # enable_nested_tensor / mask_check: PyTorch's switches for its nested-tensor fast
        # path. minitx has no nested tensors, so they are accepted (code ported from PyTorch
        # runs unchanged) and change nothing.
        self.layers = _clones(encoder_layer, num_layers, "TransformerEncoder")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """A stack of ``num_layers`` copies of ``decoder_layer``, then ``norm`` if given.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False, *,
    kv_caches=None)`` — ``kv_caches``: one ``KVCache`` per layer for incremental decoding.
    """

    hook_renames = BLOCK_HOOK_RENAMES

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers, "TransformerDecoder")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False, *, kv_caches=None):
        # One cache per layer (a shorter list is refused here, not as an IndexError in layer i);
        # every layer reads the same memory.
        cached_length(kv_caches, len(self.layers), owner="TransformerDecoder")
        x = tgt
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal,
                      kv_cache=None if kv_caches is None else kv_caches[i])
        return self.norm(x) if self.norm is not None else x
