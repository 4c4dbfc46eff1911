"""LFM2 (Liquid AI, 2025), a hybrid: Llama whose layers are mostly gated short convolutions
(``models/mixers/short_conv.py``), with a few attention layers that normalise each head's q
and k (Qwen3's QK-norm); every module under its own name.

HF's ``Lfm2Config``: ``layer_types`` ("conv" or "full_attention"), else ``full_attn_idxs``
(the attention layers; absent, every layer attends). The MLP's width is derived from
``intermediate_size`` unless ``block_auto_adjust_ff_dim`` is false: two thirds of it, times
``block_ffn_dim_multiplier``, rounded up to a multiple of ``block_multiple_of``. The older
spellings ``block_ff_dim`` and ``tie_embedding`` win over the new ones, as in HF. The final
norm is ``embedding_norm``, after the last layer.
"""
from ..mixers.short_conv import OPTIONS as CONV_OPTIONS
from .base import fail, fresh
from .llama import Llama

# HF's layer-type names → minitx's
_NAMES = {"full_attention": "full", "conv": "short_conv"}
# the MLP width's derivation (module docstring) and the convolution: HF's defaults
FF_DEFAULTS = dict(block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
                   block_multiple_of=256)
CONV_KEYS = {"conv_L_cache": "kernel", "conv_bias": "bias"}
# Liquid's own training configuration, which the released files carry beside HF's keys and
# which HF's LFM2 classes never read (their values duplicate HF's keys or set the initialiser)
LIQUID_KEYS = {"block_dim", "block_norm_eps", "block_use_swiglu", "block_mlp_init_scale",
               "block_out_init_scale", "block_use_xavier_init", "conv_dim", "conv_dim_out",
               "conv_use_xavier_init", "num_heads", "theta", "use_pos_enc"}


def ffn_width(cfg: dict) -> int:
    """The MLP's width as HF's ``Lfm2MLP`` derives it from ``cfg`` (module docstring)."""
    width = cfg["intermediate_size"]
    if cfg["block_auto_adjust_ff_dim"]:
        width = int(2 * width / 3)
        if cfg["block_ffn_dim_multiplier"] is not None:
            width = int(cfg["block_ffn_dim_multiplier"] * width)
            step = cfg["block_multiple_of"]
            width = step * ((width + step - 1) // step)
    return width


class Lfm2(Llama):
    model_type = "lfm2"
    switches = dict(qk_norm="head")
    keys = {"rms_norm_eps": None, "norm_eps": "norm_eps", "mlp_bias": None,
            "intermediate_size": None}
    bias_key = None                              # no biases in q, k, v, o or the MLP
    reads = {"intermediate_size", *FF_DEFAULTS, *CONV_KEYS, "full_attn_idxs", *LIQUID_KEYS}
    defaults = dict(rms_norm_eps=None, norm_eps=1e-5, num_key_value_heads=8,
                    max_position_embeddings=128000, intermediate_size=12288, conv_L_cache=3,
                    conv_bias=False, **FF_DEFAULTS)
    tensors = fresh({
        "model.embed_tokens.weight": "embed.weight",
        "model.embedding_norm.weight": "ln_final.weight",
        "lm_head.weight": "unembed.weight",
        "model.layers.{i}.operator_norm.weight": "blocks.{i}.ln1.weight",
        "model.layers.{i}.ffn_norm.weight": "blocks.{i}.ln2.weight",
        **{f"model.layers.{{i}}.self_attn.{p}_proj.weight":
           f"blocks.{{i}}.attn.{p}_proj.weight" for p in "qkv"},
        "model.layers.{i}.self_attn.out_proj.weight": "blocks.{i}.attn.o_proj.weight",
        "model.layers.{i}.self_attn.q_layernorm.weight": "blocks.{i}.attn.q_norm.weight",
        "model.layers.{i}.self_attn.k_layernorm.weight": "blocks.{i}.attn.k_norm.weight",
        # the convolution layers' module, named for those layers only (a typed entry)
        "model.layers.{i}.conv.*": ("blocks.{i}.attn.*", "short_conv"),
        "model.layers.{i}.feed_forward.w1.weight": "blocks.{i}.mlp.gate_proj.weight",
        "model.layers.{i}.feed_forward.w3.weight": "blocks.{i}.mlp.up_proj.weight",
        "model.layers.{i}.feed_forward.w2.weight": "blocks.{i}.mlp.down_proj.weight"})
    theta = 1_000_000.0
    tied = True
    presets = {
        # LFM2-1.2B: ten convolution layers, six GQA layers among them (32 heads, 8 KV)
        "LFM2-1.2B": ("LiquidAI/LFM2-1.2B", dict(
            vocab_size=65536, hidden_size=2048, block_ff_dim=12288, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, norm_eps=1e-5,
            max_position_embeddings=128000, tie_embedding=True, rope_theta=1000000.0,
            conv_L_cache=3, conv_bias=False, block_auto_adjust_ff_dim=True,
            block_ffn_dim_multiplier=1.0, block_multiple_of=256,
            full_attn_idxs=[2, 5, 8, 10, 12, 14])),
    }

    def prepare(self, cfg, source):
        """The older spellings, as HF's ``Lfm2Config`` takes them: they win."""
        for old, new in (("block_ff_dim", "intermediate_size"),
                         ("tie_embedding", "tie_word_embeddings")):
            if old in cfg:
                cfg[new] = cfg.pop(old)
        return cfg

    def read_layers(self, cfg, n, source):
        """``layer_types``, else the ``full_attn_idxs`` attend and the rest convolve."""
        types = cfg.get("layer_types")
        if types is None:
            full = cfg.get("full_attn_idxs")
            full = range(n) if full is None else full
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        if len(types) != n or not set(types) <= set(_NAMES):
            fail(source, f"layer_types must give one of {sorted(_NAMES)} for each of the {n} "
                         f"layers, got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        back = {v: k for k, v in _NAMES.items()}
        return {"layer_types": [back.get(t, t) for t in c.layer_types or
                                ("full",) * c.num_layers]}

    def read_extra(self, cfg, n, fields, source):
        """The MLP's derived width and the convolution's kernel and biases."""
        return {"ffn_hidden": ffn_width(cfg),
                "mixer_options": {"short_conv": {v: cfg[k] for k, v in CONV_KEYS.items()}}}

    def write_extra(self, c):
        conv = {**CONV_OPTIONS, **c.mixer_options.get("short_conv", {})}
        return {"intermediate_size": c.ffn_hidden, "block_auto_adjust_ff_dim": False,
                **{k: conv[v] for k, v in CONV_KEYS.items()}}
