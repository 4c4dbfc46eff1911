"""GPT-2 (Radford et al. 2019), the root of the lineage: LayerNorm with biases before each
sublayer, a GELU MLP of width 4E, learned positions, biases on every projection, the head tied
to the embedding.

HF's ``GPT2Config`` and ``GPT2LMHeadModel``. Its checkpoint differs from every later family's
in two ways, undone on the way in and redone on the way out: linear layers are ``Conv1D``,
y = x W + b with W (in, out), the transpose of ``Linear``'s; and q, k, v are one fused
``c_attn`` (E, 3E), q's columns first. Files from the Hub name the tensors without the
``transformer.`` prefix that HF's model has; both are read. The old causal-mask buffers
``attn.bias`` and ``attn.masked_bias`` are dropped. ``pretrained.GPT2Model`` is the same
model as its own class, with a GPT-2 tokenizer; this family builds it as a ``Decoder``.
"""
import numpy as np

from .base import Family, fail

# options that change HF's GPT-2 attention, and the one value minitx runs
_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
          "add_cross_attention": False}
_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
           ".mlp.c_proj.weight")


class GPT2(Family):
    model_type = "gpt2"
    switches = dict(norm="layernorm", norm_bias=True, mlp="gelu", positions="learned",
                    qkv_bias=True, o_bias=True, mlp_bias=True)
    keys = {"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers",
            "n_head": "num_heads", "n_inner": "ffn_hidden", "layer_norm_epsilon": "norm_eps",
            "n_positions": "max_position"}
    size_keys = ("vocab_size", "n_embd", "n_layer", "n_head")
    # the dropout rates are training's; the summary head is not the language model's
    reads = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "n_ctx", "summary_type",
             "summary_use_proj", "summary_activation", "summary_proj_to_labels",
             "summary_first_dropout", "reorder_and_upcast_attn", *_FIXED}
    defaults = dict(n_positions=1024, layer_norm_epsilon=1e-5)
    activation_key, activation = "activation_function", "gelu_new"
    gelu_names = {True: "gelu_new", False: "gelu"}
    tied = True
    tensors = {
        "transformer.wte.weight": "embed.weight",
        "transformer.wpe.weight": "pos_embed.weight",
        "transformer.ln_f.*": "ln_final.*",
        "lm_head.weight": "unembed.weight",
        "transformer.h.{i}.ln_1.*": "blocks.{i}.ln1.*",
        "transformer.h.{i}.ln_2.*": "blocks.{i}.ln2.*",
        # q, k, v: c_attn's three blocks (``tensors_from_hf``)
        "transformer.h.{i}.attn.q_proj.*": "blocks.{i}.attn.q_proj.*",
        "transformer.h.{i}.attn.k_proj.*": "blocks.{i}.attn.k_proj.*",
        "transformer.h.{i}.attn.v_proj.*": "blocks.{i}.attn.v_proj.*",
        "transformer.h.{i}.attn.c_proj.*": "blocks.{i}.attn.o_proj.*",      # the output projection
        "transformer.h.{i}.mlp.c_fc.*": "blocks.{i}.mlp.up_proj.*",          # the MLP: E → 4E
        "transformer.h.{i}.mlp.c_proj.*": "blocks.{i}.mlp.down_proj.*"}
    presets = {
        # GPT-2 (124M): learned positions, a GELU MLP of width 4E, the tied head
        "GPT-2": ("openai-community/gpt2", dict(
            vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
            activation_function="gelu_new", layer_norm_epsilon=1e-5)),
    }

    def read_extra(self, cfg, n, fields, source):
        """No field to read: ``_FIXED``'s options are only checked, each refused unless it
        holds the value minitx runs."""
        for key, allowed in _FIXED.items():
            if key in cfg and bool(cfg[key]) != allowed:
                fail(source, f"{key}={cfg[key]!r} changes the attention and minitx's "
                             f"{self.model_type} runs {key}={allowed}; refused")
        return {}

    def write_extra(self, c):
        return {"n_inner": c.ffn_hidden}

    def tensors_from_hf(self, tensors, model, source):
        out = {}
        for key, value in tensors.items():
            if key.endswith((".attn.bias", ".attn.masked_bias")):
                continue                          # the old mask buffers
            if not key.startswith(("transformer.", "lm_head.")):
                key = "transformer." + key        # a Hub file's name, without the prefix
            if key.endswith(_CONV1D):
                value = np.asarray(value).T       # Conv1D (in, out) → Linear (out, in)
            if ".attn.c_attn." in key:            # (3E, E) rows, or (3E,): q, k, v
                for name, part in zip("qkv", np.split(np.asarray(value), 3, axis=0)):
                    out[key.replace(".c_attn.", f".{name}_proj.")] = part
                continue
            out[key] = value
        return out

    def tensors_to_hf(self, tensors, model, files):
        """``tensors_from_hf`` backwards: q, k, v fused again into ``c_attn`` (q's rows
        first), the Conv1D weights transposed back to (in, out)."""
        out = {}
        for key, value in tensors.items():
            if ".attn.k_proj." in key or ".attn.v_proj." in key:
                continue
            if ".attn.q_proj." in key:
                key = key.replace(".q_proj.", ".c_attn.")
                value = np.concatenate([np.asarray(tensors[key.replace(".c_attn.", f".{p}_proj.")])
                                        for p in "qkv"], axis=0)
            if key.endswith(_CONV1D):
                value = np.asarray(value).T
            out[key] = value
        return out
