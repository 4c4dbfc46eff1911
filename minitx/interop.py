"""Hand models to PyTorch and back: the same modules, the same weights, the same numbers.

    import minitx.interop as interop

    torch_model = interop.to_torch(minitx_model)     # a torch.nn.Module, weights copied
    minitx_model = interop.from_torch(torch_model)   # and back

What maps to what (weights copied, train/eval mode kept, float32 or float64 as the source):

=======================================  =================================================
minitx                                   PyTorch
=======================================  =================================================
nn.MultiheadAttention                    torch.nn.MultiheadAttention
nn.TransformerEncoderLayer / Encoder     torch.nn.TransformerEncoderLayer / Encoder
nn.TransformerDecoderLayer / Decoder     torch.nn.TransformerDecoderLayer / Decoder
nn.GPT                                   ``TorchGPT`` (built here: the same blocks and
                                         parameter names, ``forward(idx, targets)`` →
                                         ``(logits, loss)``)
pretrained.BertModel                     transformers.BertModel
pretrained.GPT2Model                     transformers.GPT2LMHeadModel (GPT2Model too,
                                         for ``from_torch``)
models.Decoder                           the ``transformers`` ``…ForCausalLM`` of the family
                                         whose switches it has (Llama, Mistral, Qwen2,
                                         Qwen3, Gemma 3, OLMo 2; ``pretrained.decoders``)
=======================================  =================================================

The PyTorch side is an ordinary module, so training can go on there — on GPUs, with
``DistributedDataParallel`` or FSDP — and come back with ``from_torch``. PyTorch (and
``transformers`` for the two pretrained families) is imported only inside these functions;
without it they raise ImportError saying what to install. Blocks built with a non-default
``attention=`` variant have no PyTorch counterpart and are refused by name.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from . import functional as F
from . import nn                      # minitx.nn, with the models under their torch.nn names
from .models.decoder import Decoder
from .pretrained import BertModel, GPT2Model, bert_state_to_hf, gpt2_state_to_hf
from .pretrained.decoders import (FAMILIES as DECODER_FAMILIES, decoder_from_hf,
                                  decoder_state_to_hf, hf_config_dict)
from .pretrained.common import gelu_tanh

__all__ = ["to_torch", "from_torch"]


def _torch():
    try:
        import torch  # noqa: PLC0415 - optional, imported on use
    except ImportError as exc:
        raise ImportError("minitx.interop needs PyTorch: `pip install torch` (CPU builds "
                          "suffice)") from exc
    return torch


def _transformers():
    try:
        import transformers  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError("exporting BERT/GPT-2 models needs HuggingFace transformers: "
                          "`pip install transformers`") from exc
    return transformers


def _dtype_of(module):
    for p in module.parameters():
        return np.dtype(p.dtype)
    return np.dtype("float32")


def _load_into_torch(torch_module, state: dict, source):
    """Copy {name: NumPy array} into a torch module (strict), matching the source's dtype
    and training mode."""
    torch = _torch()
    dt = _dtype_of(source)
    torch_module.to(torch.float64 if dt == np.float64 else torch.float32)
    torch_module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                  for k, v in state.items()}, strict=True)
    torch_module.train(source.training)
    return torch_module


def _torch_state(torch_module) -> dict:
    return {k: v.detach().cpu().numpy() for k, v in torch_module.state_dict().items()}


def _finish(minitx_module, state, torch_module):
    dtypes = {v.dtype for v in state.values() if v.dtype.kind == "f"}
    if np.dtype("float64") in dtypes:
        minitx_module.to(dtype=np.float64)
    minitx_module.load_state_dict(state)
    minitx_module.train(bool(torch_module.training))
    return minitx_module


# ---- activations -------------------------------------------------------------------------

def _activation_name(fn, where):
    """minitx's activation function → PyTorch's name for it."""
    if fn is F.relu:
        return "relu"
    if fn is F.gelu:
        return "gelu"
    if fn is gelu_tanh:
        return "gelu_tanh"
    raise ValueError(f"{where}: activation {fn!r} has no PyTorch name (relu, gelu, "
                     "gelu_tanh are supported)")


def _torch_activation(name):
    torch = _torch()
    if name == "gelu_tanh":
        return functools.partial(torch.nn.functional.gelu, approximate="tanh")
    return name


def _block_kwargs(layer, where):
    """PyTorch keyword arguments describing a minitx encoder/decoder layer."""
    if not isinstance(layer.self_attn, nn.MultiheadAttention):
        raise ValueError(f"{where}: attention={layer.attention!r} has no PyTorch counterpart "
                         "(only the default MultiheadAttention exports)")
    return dict(d_model=layer.linear1.in_features, nhead=layer.self_attn.num_heads,
                dim_feedforward=layer.linear1.out_features, dropout=layer.dropout.p,
                activation=_torch_activation(_activation_name(layer.activation, where)),
                layer_norm_eps=layer.norm1.eps, batch_first=layer.batch_first,
                norm_first=layer.norm_first, bias=layer.linear1.bias is not None)


def _minitx_block_kwargs(layer):
    """minitx keyword arguments describing a torch encoder/decoder layer."""
    torch = _torch()
    act = layer.activation
    if act is torch.nn.functional.relu or isinstance(act, torch.nn.ReLU):
        activation = "relu"
    elif act is torch.nn.functional.gelu or isinstance(act, torch.nn.GELU) and \
            act.approximate == "none":
        activation = "gelu"
    elif getattr(act, "keywords", {}).get("approximate") == "tanh" or \
            isinstance(act, torch.nn.GELU) and act.approximate == "tanh":
        activation = gelu_tanh
    else:
        raise ValueError(f"from_torch: activation {act!r} is not supported (relu, gelu)")
    return dict(d_model=layer.linear1.in_features, nhead=layer.self_attn.num_heads,
                dim_feedforward=layer.linear1.out_features, dropout=layer.dropout.p,
                activation=activation, layer_norm_eps=layer.norm1.eps,
                batch_first=layer.self_attn.batch_first, norm_first=layer.norm_first,
                bias=layer.linear1.bias is not None)


# ---- GPT in PyTorch ------------------------------------------------------------------------

def _torch_gpt_class():
    """``TorchGPT``: minitx's ``nn.GPT`` written in PyTorch (defined on first use)."""
    if "cls" in _TORCH_GPT:
        return _TORCH_GPT["cls"]
    torch = _torch()
    nn, tf = torch.nn, torch.nn.functional

    class TorchGPTBlock(nn.Module):
        """x + Attn(LN₁(x)), then x + dropout(W₂ GELU(W₁ LN₂(x))) — minitx's GPTBlock."""

        def __init__(self, c):
            super().__init__()
            d, hkv = c.n_embd // c.n_head, c.num_kv_heads or c.n_head
            self.n_head, self.n_kv, self.p = c.n_head, hkv, c.dropout
            self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
            self.attn = nn.Module()
            self.attn.q_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
            self.attn.k_proj = nn.Linear(c.n_embd, hkv * d, bias=c.bias)
            self.attn.v_proj = nn.Linear(c.n_embd, hkv * d, bias=c.bias)
            self.attn.out_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
            self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
            self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
            self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
            self.drop = nn.Dropout(c.dropout)

        def forward(self, x):
            b, t, e = x.shape
            a, at = self.ln_1(x), self.attn

            def heads(y, h):                                   # (B, T, h·D) → (B, h, T, D)
                return y.view(b, t, h, -1).transpose(1, 2)
            q = heads(at.q_proj(a), self.n_head)
            k, v = heads(at.k_proj(a), self.n_kv), heads(at.v_proj(a), self.n_kv)
            o = tf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                dropout_p=self.p if self.training else 0.0)
            x = x + at.out_proj(o.transpose(1, 2).reshape(b, t, e))
            return x + self.drop(self.c_proj(tf.gelu(self.c_fc(self.ln_2(x)))))

    class TorchGPT(nn.Module):
        """minitx's ``nn.GPT`` in PyTorch: same layout, parameter names and outputs.

        ``forward(idx (B, T), targets=None)`` → ``(logits (B, T, V), mean cross-entropy of
        targets (−100 ignored) or None)``.
        """

        def __init__(self, config):
            super().__init__()
            c = self.minitx_config = config
            self.wte = nn.Embedding(c.vocab_size, c.n_embd)
            self.wpe = nn.Embedding(c.block_size, c.n_embd) if c.position == "learned" else None
            self.drop = nn.Dropout(c.dropout)
            self.h = nn.ModuleList([TorchGPTBlock(c) for _ in range(c.n_layer)])
            self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
            self.lm_head = None if c.tie_weights else nn.Linear(c.n_embd, c.vocab_size,
                                                                bias=False)

        def forward(self, idx, targets=None):
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe.weight[: idx.shape[1]]
            x = self.drop(x)
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            w = self.wte.weight if self.lm_head is None else self.lm_head.weight
            logits = x @ w.T
            if targets is None:
                return logits, None
            loss = tf.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                    ignore_index=-100)
            return logits, loss

    _TORCH_GPT["cls"] = TorchGPT
    return TorchGPT


_TORCH_GPT = {}


def _check_gpt_config(c):
    if c.attention not in ("mha", "mqa", "gqa") or c.position not in ("learned", "none"):
        raise ValueError(f"to_torch: GPT with attention={c.attention!r}, position="
                         f"{c.position!r} has no PyTorch counterpart here (attention 'mha', "
                         "'mqa' or 'gqa' with position 'learned' or 'none')")
    if c.attention_options:
        raise ValueError(f"to_torch: GPT attention_options {c.attention_options} are not "
                         "exported")


# ---- the two directions ------------------------------------------------------------------

def to_torch(module):
    """The PyTorch module equivalent to a minitx ``module`` (table in the module docstring),
    holding a copy of its weights; ValueError for modules with no counterpart."""
    torch = _torch()
    state = module.state_dict()
    name = type(module).__name__
    if isinstance(module, nn.MultiheadAttention):
        if module.num_kv_heads != module.num_heads:
            raise ValueError("to_torch: MultiheadAttention with num_kv_heads ≠ num_heads has "
                             "no torch.nn.MultiheadAttention counterpart")
        out = torch.nn.MultiheadAttention(
            module.embed_dim, module.num_heads, dropout=module.dropout,
            bias=module.in_proj_bias is not None, kdim=module.kdim, vdim=module.vdim,
            batch_first=module.batch_first)
    elif isinstance(module, nn.TransformerEncoderLayer):
        out = torch.nn.TransformerEncoderLayer(**_block_kwargs(module, name))
    elif isinstance(module, nn.TransformerDecoderLayer):
        out = torch.nn.TransformerDecoderLayer(**_block_kwargs(module, name))
    elif isinstance(module, nn.TransformerEncoder):
        layer = torch.nn.TransformerEncoderLayer(**_block_kwargs(module.layers[0], name))
        norm = None if module.norm is None else torch.nn.LayerNorm(
            module.norm.normalized_shape, eps=module.norm.eps, bias=module.norm.bias is not None)
        out = torch.nn.TransformerEncoder(layer, module.num_layers, norm=norm,
                                          enable_nested_tensor=False)
    elif isinstance(module, nn.TransformerDecoder):
        layer = torch.nn.TransformerDecoderLayer(**_block_kwargs(module.layers[0], name))
        norm = None if module.norm is None else torch.nn.LayerNorm(
            module.norm.normalized_shape, eps=module.norm.eps, bias=module.norm.bias is not None)
        out = torch.nn.TransformerDecoder(layer, module.num_layers, norm=norm)
    elif isinstance(module, nn.GPT):
        _check_gpt_config(module.config)
        # record the real key/value head count (MQA/GQA)
        config = dataclasses.replace(module.config, num_kv_heads=module.h[0].attn.num_kv_heads)
        out = _torch_gpt_class()(config)
    elif isinstance(module, BertModel):
        cfg = dataclasses.asdict(module.config)
        pool = cfg.pop("add_pooling_layer")
        out = _transformers().BertModel(_transformers().BertConfig(**cfg),
                                        add_pooling_layer=pool)
        state = bert_state_to_hf(state)
    elif isinstance(module, GPT2Model):
        config = _transformers().GPT2Config(**dataclasses.asdict(module.config))
        out = _transformers().GPT2LMHeadModel(config)
        state = gpt2_state_to_hf(state, module.config)
    elif isinstance(module, Decoder):
        # the family whose config.json, read back, gives these very switches
        t = _transformers()
        cfg = hf_config_dict(module.config, getattr(module, "hf_config", None))
        # HF's experts as a loop over experts: its grouped matmuls take no float64
        moe = {"experts_implementation": "eager"} if module.config.mlp == "moe" else {}
        out = t.AutoModelForCausalLM.from_config(t.AutoConfig.for_model(**cfg), **moe)
        state = decoder_state_to_hf(state, module)
    else:
        raise ValueError(f"to_torch: no PyTorch counterpart for {name}; supported: "
                         "MultiheadAttention, TransformerEncoder(Layer), "
                         "TransformerDecoder(Layer), GPT, pretrained BertModel, GPT2Model, Decoder")
    return _load_into_torch(out, state, module)


def from_torch(module):
    """The minitx module equivalent to a PyTorch ``module`` (the inverse of ``to_torch``;
    also HuggingFace ``BertModel``, ``GPT2LMHeadModel`` and ``GPT2Model``)."""
    torch = _torch()
    state = _torch_state(module)
    tnn = torch.nn
    if isinstance(module, tnn.MultiheadAttention):
        out = nn.MultiheadAttention(module.embed_dim, module.num_heads, dropout=module.dropout,
                                    bias=module.in_proj_bias is not None, kdim=module.kdim,
                                    vdim=module.vdim, batch_first=module.batch_first)
    elif isinstance(module, tnn.TransformerEncoderLayer):
        out = nn.TransformerEncoderLayer(**_minitx_block_kwargs(module))
    elif isinstance(module, tnn.TransformerDecoderLayer):
        out = nn.TransformerDecoderLayer(**_minitx_block_kwargs(module))
    elif isinstance(module, (tnn.TransformerEncoder, tnn.TransformerDecoder)):
        enc = isinstance(module, tnn.TransformerEncoder)
        kw = _minitx_block_kwargs(module.layers[0])
        layer = nn.TransformerEncoderLayer(**kw) if enc else nn.TransformerDecoderLayer(**kw)
        norm = None if module.norm is None else nn.LayerNorm(
            tuple(module.norm.normalized_shape), eps=module.norm.eps,
            bias=module.norm.bias is not None)
        stack = nn.TransformerEncoder if enc else nn.TransformerDecoder
        out = stack(layer, len(module.layers), norm=norm)
    elif hasattr(module, "minitx_config"):                   # a TorchGPT from to_torch
        out = nn.GPT(module.minitx_config)
    elif type(module).__name__ in ("BertModel", "GPT2LMHeadModel", "GPT2Model") and \
            hasattr(module, "config"):
        cfg = module.config.to_dict()
        cls = BertModel if type(module).__name__ == "BertModel" else GPT2Model
        dtype = next(v.dtype for v in state.values() if v.dtype.kind == "f")
        out = cls.from_hf(cfg, state, source=type(module).__name__, dtype=dtype)
        out.train(bool(module.training))
        return out
    elif getattr(getattr(module, "config", None), "model_type", None) in DECODER_FAMILIES:
        # a …ForCausalLM of a decoder family: its config.json as save_pretrained writes it
        dtype = next(v.dtype for v in state.values() if v.dtype.kind == "f")
        out = decoder_from_hf(module.config.to_diff_dict(), state,
                              source=type(module).__name__, dtype=dtype)
        out.train(bool(module.training))
        return out
    else:
        raise ValueError(f"from_torch: no minitx counterpart for {type(module).__name__}")
    return _finish(out, state, module)
