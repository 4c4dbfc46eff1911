"""OLMo-Hybrid (AI2, 2026), a hybrid: three gated DeltaNet layers (``models/mixers/
gated_deltanet.py``) to one OLMo 3 attention layer. The attention layers are OLMo 3's,
h + Norm(F(h)) with RMSNorm over the whole projected q and k, every one of them full; the
DeltaNet layers are Llama's pre-norm layers, whose DeltaNet has q, k, v, the output gate, b
and a as separate projections (stacked here as Qwen3.5's split layout), β = 2σ(b) ∈ [0, 2]
(``linear_allow_neg_eigval``: the state's transition may have a negative eigenvalue) and a
gated norm of eps 10⁻⁵ whatever ``rms_norm_eps`` says (FLA's default, as in HF). Only the
attention layers rotate, and only when the rope has a θ: the released checkpoints set it to
null, and then no layer has positions (NoPE).

HF's ``OlmoHybridConfig``: ``layer_types`` ("linear_attention", "full_attention"), else every
4th layer attends (the last one when there are fewer than 4); the DeltaNet's sizes default to
the attention's heads, D_k = ⌊0.75·E/H_k⌋ and D_v = 2·D_k. Its ``linear_a_log_…`` and
``linear_dt_…`` keys set the initialisation only. The files name a DeltaNet layer's norms
``attention_layer_norm`` and ``feedforward_layer_norm`` (transformers 5's module:
``input_layernorm``, ``post_attention_layernorm``), an attention layer's first post-norm
``feedforward_layer_norm`` too (the module: ``post_attention_layernorm``), and hold the
convolution as three, ``q_conv1d``, ``k_conv1d``, ``v_conv1d`` (the module: one ``conv1d``,
their channels stacked); both spellings load, and either is written back.
"""
import numpy as np

from .base import Family, fail
from .olmo3 import Olmo3

# the DeltaNet's keys → the mixer's options (their defaults: the module docstring's)
LINEAR_KEYS = {"linear_num_key_heads": "num_k_heads", "linear_num_value_heads": "num_v_heads",
               "linear_key_head_dim": "head_k_dim", "linear_value_head_dim": "head_v_dim",
               "linear_conv_kernel_dim": "conv_kernel",
               "linear_allow_neg_eigval": "allow_neg_eigval"}
# keys that set the initialisation of A_log and dt_bias, which a checkpoint replaces
INIT_KEYS = ("linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max",
             "linear_dt_init_floor")
GATED_NORM_EPS = 1e-5
_NAMES = {"full_attention": "full", "linear_attention": "gated_deltanet"}  # HF's → minitx's
_QKV = ("q", "k", "v")
# a DeltaNet layer's HF names → the mixer's (q, k, v's projections: stacked, in_proj_qkv)
_DELTANET = {"g_proj": "in_proj_z", "b_proj": "in_proj_b", "a_proj": "in_proj_a",
             "o_proj": "out_proj", "o_norm": "norm"}
# a DeltaNet layer's norms: transformers 5's module names → the files' (the table's)
_LINEAR_NORMS = {"input_layernorm.weight": "attention_layer_norm.weight",
                 "post_attention_layernorm.weight": "feedforward_layer_norm.weight"}
# an attention layer's first post-norm: the files' name → the module's (the table's)
_ATTENTION_NORMS = {"feedforward_layer_norm.weight": "post_attention_layernorm.weight"}


class OlmoHybrid(Olmo3):
    model_type = "olmo_hybrid"
    reads = {*LINEAR_KEYS, *INIT_KEYS}
    defaults = dict(rms_norm_eps=1e-6, max_position_embeddings=65536, sliding_window=None,
                    linear_conv_kernel_dim=4, linear_allow_neg_eigval=True)
    theta = 10000.0
    tensors = {
        # a DeltaNet layer's pre-norms (the files' names; ``tensors_from_hf``), its DeltaNet
        "model.layers.{i}.attention_layer_norm.weight": ("blocks.{i}.ln1.weight",
                                                         "gated_deltanet"),
        "model.layers.{i}.feedforward_layer_norm.weight": ("blocks.{i}.ln2.weight",
                                                           "gated_deltanet"),
        **{f"model.layers.{{i}}.linear_attn.{hf}.weight":
           (f"blocks.{{i}}.attn.{mine}.weight", "gated_deltanet")
           for hf, mine in _DELTANET.items()},
        "model.layers.{i}.linear_attn.*": ("blocks.{i}.attn.*", "gated_deltanet")}
    presets = {
        # OLMo-Hybrid 7B as HF's OlmoHybridConfig defaults describe it: 24 gated DeltaNet
        # layers (30 heads, D_k = 96, D_v = 192) and 8 full attention layers
        "OLMo-Hybrid-7B": ("transformers 5.24 OlmoHybridConfig defaults", dict(
            vocab_size=100352, hidden_size=3840, intermediate_size=11008, num_hidden_layers=32,
            num_attention_heads=30, num_key_value_heads=30, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=65536, tie_word_embeddings=False,
            attention_bias=False, linear_num_key_heads=30, linear_num_value_heads=30,
            linear_key_head_dim=96, linear_value_head_dim=192, linear_conv_kernel_dim=4,
            linear_allow_neg_eigval=True, pad_token_id=100277,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    }

    @staticmethod
    def _rope(cfg) -> dict:
        """The rope dict HF's config holds (one, for the attention layers)."""
        if cfg.get("rope_parameters"):
            return dict(cfg["rope_parameters"])
        return {"rope_theta": cfg.get("rope_theta", OlmoHybrid.theta),
                **(cfg.get("rope_scaling") or {})}

    def read_ropes(self, cfg, source):
        """Llama's one rope; with a null θ no layer rotates (``read_extra``), and the rope
        kept is the class's, unused."""
        if self._rope(cfg).get("rope_theta") is None:
            return self.rope_dict({"rope_type": "default", "rope_theta": self.theta}, cfg,
                                  source), None
        return Family.read_ropes(self, cfg, source)

    def write_ropes(self, c):
        if c.positions == "none":
            return {"rope_parameters": {"rope_type": "default", "rope_theta": None}}
        return Family.write_ropes(self, c)

    def read_layers(self, cfg, n, source):
        """``layer_types``, else HF's default (module docstring); HF refuses a model without
        a DeltaNet layer or without an attention layer, and so does minitx."""
        types = cfg.get("layer_types")
        # HF's default: three DeltaNet layers to one attention layer, the last attending if
        # none does
        if types is None:
            types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
            if "full_attention" not in types:
                types[-1] = "full_attention"
        if len(types) != n or not set(types) <= set(_NAMES):
            fail(source, f"layer_types must give one of {sorted(_NAMES)} for each of the {n} "
                         f"layers, got {types!r}")
        if len(set(types)) != 2:
            fail(source, f"layer_types must hold both linear_attention and full_attention "
                         f"layers (HF's OlmoHybridConfig refuses others), got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        back = {v: k for k, v in _NAMES.items()}            # minitx's layer names → HF's
        return {"layer_types": [back.get(t, t) for t in c.layer_types]}

    def read_extra(self, cfg, n, fields, source):
        """The DeltaNet's options (HF's defaults from the attention's sizes), and no
        positions when the rope has no θ."""
        # HF's defaults: H_k = H_v = H, D_k = ⌊0.75·E/H_k⌋, D_v = 2·D_k
        hk = cfg.get("linear_num_key_heads") or fields["num_heads"]
        dk = cfg.get("linear_key_head_dim") or int(0.75 * fields["hidden_size"] / hk)
        sizes = {"linear_num_key_heads": hk, "linear_key_head_dim": dk,
                 "linear_num_value_heads": cfg.get("linear_num_value_heads")
                 or fields["num_heads"],
                 "linear_value_head_dim": cfg.get("linear_value_head_dim") or 2 * dk,
                 "linear_conv_kernel_dim": cfg["linear_conv_kernel_dim"],
                 "linear_allow_neg_eigval": bool(cfg["linear_allow_neg_eigval"])}
        # Qwen3.5's split layout (four matrices, q, k, v stacked); the gated norm's eps FLA's
        out = {"mixer_options": {"gated_deltanet": {
            **{LINEAR_KEYS[k]: v for k, v in sizes.items()}, "projections": "split",
            "norm_eps": GATED_NORM_EPS}}}
        if self._rope(cfg).get("rope_theta") is None:
            out["positions"] = "none"
        return out

    def write_extra(self, c):
        linear = c.mixer_options.get("gated_deltanet", {})
        return {k: linear.get(v) for k, v in LINEAR_KEYS.items()}

    # ---- the tensors: the files' names or transformers 5's module's, both read -----------

    def tensors_from_hf(self, tensors, model, source):
        """Either spelling (module docstring) → the table's: a DeltaNet layer's norms under
        the files' names, an attention layer's under the module's; the convolution as one;
        q, k, v's projections stacked as ``in_proj_qkv``."""
        types = model.config.layer_types
        # each layer's tensor renamed to the table's spelling; q, k and v's pieces set aside
        out, pieces = {}, {}
        for key, value in tensors.items():
            stem, i, rest = _split_key(key)
            if stem is None:
                out[key] = value
                continue
            # a norm's name means another module in each kind of layer (module docstring)
            linear = i < len(types) and types[i] == "gated_deltanet"
            rest = (_LINEAR_NORMS if linear else _ATTENTION_NORMS).get(rest, rest)
            piece = next(((kind, p) for p in _QKV for kind in ("proj", "conv1d")
                          if rest == f"linear_attn.{p}_{kind}.weight"), None)
            if piece is None:
                out[stem + rest] = value
            else:
                pieces.setdefault((stem, piece[0]), {})[piece[1]] = value
        # then each layer's q, k, v stacked along the rows, once all three are there
        for (stem, kind), got in pieces.items():
            if set(got) != set(_QKV):
                fail(source, f"{stem}linear_attn: the {kind} of "
                             f"{', '.join(sorted(set(_QKV) - set(got)))} is missing (q, k "
                             "and v come together)")
            name = "in_proj_qkv" if kind == "proj" else "conv1d"
            out[f"{stem}linear_attn.{name}.weight"] = np.concatenate(
                [np.asarray(got[p]) for p in _QKV], axis=0)
        return out

    def tensors_to_hf(self, tensors, model, files):
        """The inverse: the files' names and three convolutions (``files``), or transformers
        5's module's; q, k, v's projections apart either way."""
        types = model.config.layer_types
        to_module = {v: k for k, v in _LINEAR_NORMS.items()}
        to_files = {v: k for k, v in _ATTENTION_NORMS.items()}
        out = {}
        for key, value in tensors.items():
            stem, i, rest = _split_key(key)
            if stem is None:
                out[key] = value
                continue
            kind = {"linear_attn.in_proj_qkv.weight": "proj",
                    "linear_attn.conv1d.weight": "conv1d" if files else None}.get(rest)
            if kind is not None:                  # rows [q (H_k·D_k); k (H_k·D_k); v]
                hk, _, dk, _ = model.blocks[i].attn.sizes
                parts = np.split(np.asarray(value), [hk * dk, 2 * hk * dk], axis=0)
                out.update({f"{stem}linear_attn.{p}_{kind}.weight": w
                            for p, w in zip(_QKV, parts)})
                continue
            if types[i] == "gated_deltanet":
                rest = rest if files else to_module.get(rest, rest)
            elif files:
                rest = to_files.get(rest, rest)
            out[stem + rest] = value
        return out


def _split_key(key):
    """("model.layers.{i}.", i, the rest) of a layer's HF key; (None, None, None) for the
    others."""
    parts = key.split(".", 3)
    if len(parts) < 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None, None, None
    return f"model.layers.{parts[2]}.", int(parts[2]), parts[3]
