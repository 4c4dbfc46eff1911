r"""What every decoder family file builds on: a ``Family`` says how HuggingFace's
``config.json`` and tensors of one ``model_type`` become a ``DecoderConfig`` and minitx's
parameter names, and back.

A family is a class, and a family file holds only what its family changes from its parent's
(HF's modular files are the model: ``class Qwen3Config(Qwen2Config)``). Five tables, each
merged over the parent's (a value of ``None`` removes the parent's entry):

- ``switches``: the ``DecoderConfig`` fields the family fixes (its MLP, its norms …);
- ``keys``: config.json key → ``DecoderConfig`` field, for the keys that are one field each.
  ``read`` and ``write`` both walk this one table, so neither direction is written by hand;
- ``defaults``: HF's configuration class defaults (transformers 5.24) for keys a file leaves
  out (HF's ``save_pretrained`` writes every key; other writers do not);
- ``tensors``: HF tensor name → minitx name, ``{i}`` a layer and ``*`` the rest of a name,
  read both ways by ``tensor_to_minitx`` and ``tensor_to_hf``; a value ``(name, type)`` maps
  only the layers of that ``layer_types`` entry (Qwen3-Next's ``linear_attn``);
- ``reads``: the other keys the family's own methods read.

What is more than one field each (the rope dicts, which layers slide, the experts) is a
method pair, ``read_…`` beside ``write_…``, overridden where a family differs. ``presets``:
published ``config.json`` files, {name: (Hub repository, keys)}, not inherited.

Every key of a config.json is read, or known not to change the forward (``changes_nothing``),
or refused by name.
"""
from __future__ import annotations

import re

from ... import validate
from ...nn.rotary import check_rope
from ..decoder import DecoderConfig

__all__ = ["Family", "fresh", "IGNORED", "SIZE_KEYS", "changes_nothing", "fail",
           "rotary_flags"]

# the sizes a checkpoint's config.json must state (its tensors are made to them)
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")

# config.json keys that do not change the forward pass (docs/decoders.md gives each reason).
# The rule, stated once (``changes_nothing``): a key is accepted unread when it is writer's
# metadata (a leading "_": _name_or_path, _attn_implementation …), a token id (…_token_id or
# …_token_ids: which token starts or ends a text is the tokenizer's and generation's business,
# not the forward's), or one of the names below (the library's bookkeeping, training-only
# settings, and the switches a family reads from other keys).
IGNORED = frozenset({
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version",
    "use_cache", "initializer_range", "attention_dropout", "pretraining_tp", "tokenizer_class",
    "output_attentions", "output_hidden_states", "return_dict", "max_window_layers",
    "use_sliding_window", "sliding_window_pattern",
    "attn_logit_softcapping", "qk_head_dim", "num_nextn_predict_layers", "output_router_logits",
    "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "id2label", "label2id",
    "task_specific_params", "finetuning_task", "problem_type", "chunk_size_feed_forward",
})

# the tables merged over the parent's when a family subclasses another
_MERGED = ("switches", "keys", "defaults", "tensors")
_ACTIVATIONS = {"silu": None, "gelu_pytorch_tanh": True, "gelu_new": True, "gelu": False}
# What a key that changes the maths must hold for minitx to run the family as HF does.
_REFUSED = {"use_bidirectional_attention": (False, None), "quantization_config": (None,)}
_ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")


class fresh(dict):
    """A table that replaces its parent's instead of changing it (Llama's names are not
    GPT-2's); ``fresh.of(*keys)`` for a set of keys."""

    @classmethod
    def of(cls, *keys):
        return cls.fromkeys(keys, True)


def changes_nothing(key: str) -> bool:
    """True when config.json's ``key`` cannot change the forward pass (the rule above)."""
    return key.startswith("_") or key.endswith(("_token_id", "_token_ids")) or key in IGNORED


def fail(source, msg):
    raise validate.OptionError(f"{source}: {msg}")


def rotary_flags(cfg: dict, n: int, source) -> list:
    """HF's ``no_rope_layers`` (SmolLM3's, Llama 4's): 1 for a rotary layer and 0 for a NoPE
    one, by default 0 at every ``no_rope_layer_interval``-th layer."""
    every = cfg.get("no_rope_layer_interval", 4)
    flags = cfg.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n)]
    if len(flags) < n or not set(flags[:n]) <= {0, 1}:
        fail(source, f"no_rope_layers must give 1 (rotary) or 0 (NoPE) for each of the "
                     f"{n} layers, got {flags!r}")
    return flags[:n]


def _bool_fields():
    return {f.name for f in DecoderConfig.__dataclass_fields__.values()
            if isinstance(f.default, bool)}


class Family:
    """The machinery of every family (module docstring); ``Llama`` is the plain family the
    others change. ``read(cfg)`` → ``DecoderConfig``, ``write(c)`` → config.json."""

    model_type = None
    switches = {}
    keys = {}
    defaults = {}
    tensors = {}
    reads = frozenset()
    presets = {}
    # the activation's key and HF's default, the tied head's default, the plain rope's θ, and
    # the share of each head rotated by default (None: every dim, and a partial one refused)
    activation_key, activation = "hidden_act", "silu"
    gelu_names = {True: "gelu_pytorch_tanh", False: "gelu"}
    size_keys = SIZE_KEYS
    tied = False
    # the one key that switches on the biases of q, k, v and o (None: HF's class has no such
    # key, and one a file carries is refused by name)
    bias_key = "attention_bias"
    theta = 10000.0
    partial_rotary = None

    def __init_subclass__(cls, **kwargs):
        """A subclass's tables merged over its parent's (``None`` drops an entry, a ``fresh``
        table starts anew), its ``reads`` added to the parent's; ``presets`` never inherited."""
        super().__init_subclass__(**kwargs)
        parent = cls.__mro__[1]
        for name in _MERGED:
            own = cls.__dict__.get(name)
            merged = {} if isinstance(own, fresh) else dict(getattr(parent, name))
            merged.update(own or {})
            setattr(cls, name, {k: v for k, v in merged.items() if v is not None})
        own = cls.__dict__.get("reads", ())
        cls.reads = frozenset(own) | (frozenset() if isinstance(own, fresh) else parent.reads)
        if "presets" not in cls.__dict__:
            cls.presets = {}

    def __repr__(self):
        return f"<family {self.model_type!r} ({type(self).__name__})>"

    # ---- config.json → DecoderConfig ------------------------------------------------------

    def prepare(self, cfg: dict, source: str) -> dict:
        """The file as the other methods read it (Kimi Linear's own spellings renamed)."""
        return cfg

    def read(self, cfg: dict, source: str = "config.json") -> DecoderConfig:
        """A parsed ``config.json`` → ``DecoderConfig``; a key that is neither read nor
        ``changes_nothing`` is refused by name."""
        cfg = self.prepare(dict(cfg), source)
        for key in self.size_keys:                  # the sizes: stated, and positive integers
            if key not in cfg:
                fail(source, f"{key} is missing; a {self.model_type} config.json states "
                             f"{', '.join(self.size_keys)}")
            validate.positive_int(cfg[key], key, owner=source)
        # HF's class defaults under what the file says; a default rope only without any
        defaults = dict(self.defaults)
        if any(k in cfg for k in _ROPE_KEYS):
            defaults.pop("rope_parameters", None)
        cfg = {**defaults, **cfg}
        quant = cfg.get("quantization_config") or {}
        if quant.get("quant_method") == "mxfp4":
            fail(source, "quantization_config says MXFP4: the experts are stored as 4-bit "
                         "blocks and scales (…_blocks, …_scales), which minitx does not "
                         "dequantise; dequantise them to float tensors first (docs/moe.md)")
        for key, allowed in _REFUSED.items():
            if cfg.get(key) not in allowed:
                fail(source, f"{key}={cfg[key]!r} changes the model and minitx does not "
                             f"implement it for {self.model_type}")
        # one field per key (the table), then what the family's methods read
        bools = _bool_fields()
        fields = {f: (bool(cfg[k]) if f in bools else cfg[k])
                  for k, f in self.keys.items() if k in cfg}
        fields["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", self.tied))
        n = fields["num_layers"]
        fields.update(self.read_activation(cfg, source))
        fields["rope"], fields["local_rope"] = self.read_ropes(cfg, source)
        fields["sliding_window"], fields["layer_types"] = self.read_layers(cfg, n, source)
        bias = bool(cfg.get(self.bias_key, False)) if self.bias_key else False
        fields.update(qkv_bias=bias, o_bias=bias)
        fields.update(self.switches)
        if fields.get("mlp") == "moe":
            fields.update(self.read_experts(cfg, n, source))
        fields.update(self.read_extra(cfg, n, fields, source))
        # Every key must have been read above or be known not to matter.
        read = set(self.keys) | self.reads | set(_ROPE_KEYS) | set(_REFUSED) | {
            "tie_word_embeddings", self.bias_key, self.activation_key}
        unknown = sorted(k for k in set(cfg) - read if not changes_nothing(k))
        if unknown:
            fail(source, f"config.json key(s) {', '.join(map(repr, unknown))} are not known "
                         f"to minitx's {self.model_type} translation (neither read nor known "
                         "not to change the forward); refused rather than ignored")
        return DecoderConfig(**fields)

    def read_activation(self, cfg, source) -> dict:
        """SiLU gates SwiGLU; GeGLU takes GELU, tanh or exact; a squared-ReLU MLP "relu2"."""
        act = cfg.get(self.activation_key, self.activation)
        if self.switches.get("mlp") == "relu2":
            if act != "relu2":
                fail(source, f"{self.activation_key}={act!r} is not supported for "
                             f"{self.model_type} (minitx runs relu2)")
            return {}
        gated_by = "silu" if self.switches.get("mlp") in ("swiglu", "moe") else "gelu"
        if act not in _ACTIVATIONS or not act.startswith(gated_by):
            fail(source, f"{self.activation_key}={act!r} is not supported for "
                         f"{self.model_type} (minitx runs "
                         f"{'silu' if gated_by == 'silu' else 'gelu, gelu_pytorch_tanh'})")
        return {"gelu_approximate": _ACTIVATIONS[act] is not False}

    def rope_dict(self, rope, cfg, source, where="rope_parameters"):
        """One HF rope dict → minitx's (``type`` read as ``rope_type``, the original context
        filled in as HF does), refused when partial where HF's model rotates every dim."""
        rope = dict(rope)
        if "type" in rope:                          # older files' spelling
            rope.setdefault("rope_type", rope.pop("type"))
        if rope.get("rope_type") in ("llama3", "yarn"):
            rope.setdefault("original_max_position_embeddings",
                            cfg.get("max_position_embeddings"))
        if rope.get("rope_type") == "proportional":   # its share is the type's own (Gemma 4)
            pass
        elif self.partial_rotary is not None:       # the family's share, unless the file says
            rope.setdefault("partial_rotary_factor", self.partial_rotary)
        elif float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            fail(source, f"{where}: partial_rotary_factor={rope['partial_rotary_factor']} is "
                         f"not applied by HuggingFace's {self.model_type} (it rotates every "
                         "head dim); refused")
        try:
            return check_rope(rope, owner=where)
        except validate.OptionError as exc:
            fail(source, str(exc))

    def read_ropes(self, cfg, source):
        """(rope of full layers, rope of sliding layers or None) from transformers 5's
        ``rope_parameters``, or the older ``rope_theta`` / ``rope_scaling``."""
        if cfg.get("rope_parameters"):
            return self.rope_dict(cfg["rope_parameters"], cfg, source), None
        rope = {"rope_theta": cfg.get("rope_theta", self.theta),
                **(cfg.get("rope_scaling") or {})}
        if "partial_rotary_factor" in cfg:
            rope["partial_rotary_factor"] = cfg["partial_rotary_factor"]
        return self.rope_dict(rope, cfg, source, "rope_scaling"), None

    def write_ropes(self, c) -> dict:
        return {"rope_parameters": dict(c.rope)}

    def per_type_ropes(self, params, cfg, source):
        """(full, sliding) from ``rope_parameters`` given per layer type. HF reads YaRN's
        ``truncate`` from the outer dict, which has none, so it truncates whatever a layer
        type's entry says (``modeling_rope_utils``); so does minitx."""
        per_type = [{**params[t], "truncate": True} if params[t].get("rope_type") == "yarn"
                    else params[t] for t in ("full_attention", "sliding_attention")]
        return tuple(self.rope_dict(p, cfg, source) for p in per_type)

    def read_layers(self, cfg, n, source):
        """(sliding_window, layer_types) as the family's HF model reads them; Llama's every
        layer is full, whatever ``sliding_window`` says."""
        return None, None

    def write_layers(self, c) -> dict:
        return {}

    @staticmethod
    def typed_layers(types, window, source, names=None):
        """HF's ``layer_types`` names → minitx's; a sliding layer needs a window."""
        names = names or {"full_attention": "full", "sliding_attention": "sliding"}
        if not set(types) <= set(names):
            fail(source, f"layer_types may hold only {sorted(names)}, got {sorted(set(types))}")
        types = tuple(names[t] for t in types)
        if "sliding" in types and window is None:
            fail(source, "layer_types has sliding_attention layers but sliding_window is null")
        return window, types

    def read_extra(self, cfg, n, fields, source) -> dict:
        """The family's switches read from more than one key each (latents, experts …)."""
        return {}

    def write_extra(self, c) -> dict:
        return {}

    # ---- DecoderConfig → config.json --------------------------------------------------------

    def write(self, c) -> dict:
        """``c`` as this family's config.json would hold it (``decoders.hf_config_dict``
        checks it by reading it back)."""
        d = {"model_type": self.model_type}
        d.update({k: getattr(c, f) for k, f in self.keys.items()})
        d["tie_word_embeddings"] = c.tie_embeddings
        if self.bias_key:
            d[self.bias_key] = c.qkv_bias
        mlp = self.switches.get("mlp")
        d[self.activation_key] = "silu" if mlp in ("swiglu", "moe") else "relu2" \
            if mlp == "relu2" else self.gelu_names[c.gelu_approximate]
        d.update(self.write_ropes(c))
        d.update(self.write_layers(c))
        if self.switches.get("mlp") == "moe":
            d.update(self.write_experts(c))
        d.update(self.write_extra(c))
        return d

    # ---- the mixture of experts (mlp="moe"; docs/moe.md) -----------------------------------

    # HF's names for the expert count and each expert's width, and how the checkpoint
    # lays out the experts: "split" (one matrix per expert in the files, gate and up fused in
    # transformers 5's modules), gpt-oss's "interleaved" or Llama 4's "transposed"; the
    # files' names of an expert's three matrices and of the MLP module; the router's module
    # name; the shared expert's module name; the sigmoid router's correction bias, under the
    # MLP module
    experts_key, expert_width_key = "num_experts", "moe_intermediate_size"
    aux_key = "router_aux_loss_coef"
    expert_layout = "split"                    # or "interleaved", "transposed"
    router_module = "gate"
    expert_files = ("gate_proj", "up_proj", "down_proj")
    moe_files_module = "mlp"
    shared_expert = "shared_expert"
    correction_bias = "gate.e_score_correction_bias"

    def read_experts(self, cfg, n, source) -> dict:
        """The experts' switches: their count, k, width, the dense layers, the router's and
        the experts' options (``moe_options``), the load-balancing loss's weight."""
        get = {**self.defaults, **{k: v for k, v in cfg.items() if v is not None}}.get
        if float(cfg.get("router_jitter_noise") or 0.0) != 0.0:
            fail(source, f"router_jitter_noise={cfg['router_jitter_noise']} (noise on the "
                         "router's input while training) is not implemented; refused")
        # the count under any family's spelling (HF's attribute maps accept them all)
        experts = get("n_routed_experts", get("num_local_experts", get("num_experts")))
        return {"num_experts": experts, "top_k": get("num_experts_per_tok"),
                "expert_hidden": get(self.expert_width_key, cfg.get("intermediate_size")),
                "dense_layers": self.read_dense_layers(get, n, source),
                "moe_options": self.read_moe_options(get, cfg, source),
                "router_aux_loss_coef": float(get(self.aux_key, 0.0) if self.aux_key else 0)}

    def write_experts(self, c) -> dict:
        d = {self.experts_key: c.num_experts, "num_experts_per_tok": c.top_k,
             self.expert_width_key: c.expert_hidden}
        if self.aux_key:
            d[self.aux_key] = c.router_aux_loss_coef
        d.update(self.write_dense_layers(c))
        d.update(self.write_moe_options(c))
        return d

    def read_dense_layers(self, get, n, source) -> tuple:
        """The layers that keep a dense MLP of width ``intermediate_size``: none."""
        return ()

    def write_dense_layers(self, c) -> dict:
        return {}

    def read_moe_options(self, get, cfg, source) -> dict:
        """``nn.moe.MoE``'s options for the family's router and experts: softmax top-k."""
        return {}

    def write_moe_options(self, c) -> dict:
        return {}

    # ---- tensor names, both ways --------------------------------------------------------------

    def _patterns(self):
        """[(regex of the HF name, minitx template, HF template, layer type or None)]."""
        out = []
        for hf, mine in self.tensors.items():
            kind = None
            if isinstance(mine, tuple):
                mine, kind = mine
            rx = "^" + re.escape(hf).replace(r"\{i\}", r"(?P<i>\d+)").replace(
                r"\*", r"(?P<rest>.+)") + "$"
            out.append((re.compile(rx), mine, hf, kind))
        return out

    def tensor_to_minitx(self, key: str, layer_types=()):
        """One HF tensor name → minitx's, or None when the table has no entry for it."""
        for rx, mine, _, kind in self._patterns():
            filled = _filled(rx.match(key), mine, kind, layer_types)
            if filled is not None:
                return filled
        return None

    def tensor_to_hf(self, name: str, layer_types=()):
        """The inverse of ``tensor_to_minitx``; an entry of the layer's own type wins."""
        found = None
        for _, mine, hf, kind in self._patterns():  # the table read backwards: minitx → HF
            rx = "^" + re.escape(mine).replace(r"\{i\}", r"(?P<i>\d+)").replace(
                r"\*", r"(?P<rest>.+)") + "$"
            out = _filled(re.match(rx, name), hf, kind, layer_types)
            if out is None:
                continue
            if kind is not None:
                return out
            found = found or out                    # a plain entry, unless a typed one follows
        if found is None:
            raise ValueError(f"decoder_state_to_hf: unexpected minitx key {name!r}")
        return found

    # the checkpoint's own tensor layouts, undone on the way in and redone on the way out
    def tensors_from_hf(self, tensors: dict, model, source) -> dict:
        return tensors

    def tensors_to_hf(self, tensors: dict, model, files: bool) -> dict:
        return tensors


def _filled(m, pattern, kind, layer_types):
    """``pattern`` with the matched layer ``{i}`` and rest ``*`` filled in; None when ``m``
    did not match, or the entry is for a layer type (``kind``) that layer i does not have."""
    if m is None:
        return None
    i = m.groupdict().get("i")
    if kind is not None and (i is None or int(i) >= len(layer_types)
                             or layer_types[int(i)] != kind):
        return None
    return pattern.replace("{i}", i or "").replace("*", m.groupdict().get("rest") or "")
