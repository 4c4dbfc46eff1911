"""Llama 4 (Meta, 2025), the text model: Llama whose rotary layers attend within chunks and
normalise q and k after the rotation (no gain), whose every fourth layer is a NoPE layer of
full attention with queries warmed by the position, and whose MLPs are mixtures of experts: a
shared expert beside the top-k routed ones, each routed expert's input scaled by its sigmoid
score.

HF's ``Llama4TextConfig``: ``no_rope_layers`` as SmolLM3's (1 rotary, 0 NoPE); the rotary
layers are ``chunked_attention`` (chunks of ``attention_chunk_size``) unless ``layer_types``
says; ``use_qk_norm`` switches the norm after the rotation (HF's ``L2Norm`` is a weightless
RMSNorm); ``attn_temperature_tuning`` with ``floor_scale`` F and ``attn_scale`` α multiplies
the NoPE layers' queries by 1 + α·ln(1 + ⌊(m + 1)/F⌋). The MoE layers are ``moe_layers``, by
default every ``interleave_moe_layer_step``-th; the others are dense SwiGLUs of width
``intermediate_size_mlp``, and each expert (routed or shared) has width
``intermediate_size``. The rotation pairs coordinates (2i, 2i + 1) (HF rotates complex
numbers), the experts are stored (n, E, 2I) and (n, I, E) (``"transposed"``), and the MLP is
``feed_forward`` with its router under ``router``.
"""
from .base import fail, rotary_flags
from .llama import Llama
from .mixtral import EXPERT_KEYS

# HF's layer-type names → minitx's
_NAMES = {"full_attention": "full", "chunked_attention": "chunked"}
# the keys of the temperature and the QK-norm, with HF's defaults
EXTRA_DEFAULTS = dict(use_qk_norm=True, attn_temperature_tuning=True, floor_scale=8192,
                      attn_scale=0.1, interleave_moe_layer_step=1, no_rope_layer_interval=4)


class Llama4(Llama):
    model_type = "llama4_text"
    switches = dict(mlp="moe", rope_interleave=True)
    # the dense layers' width is intermediate_size_mlp; intermediate_size, each expert's, is
    # read with the experts
    keys = {"intermediate_size": None, "intermediate_size_mlp": "ffn_hidden", "mlp_bias": None,
            "attention_chunk_size": "attention_chunk_size"}
    reads = {"no_rope_layers", "moe_layers", "intermediate_size", *EXPERT_KEYS,
             *EXTRA_DEFAULTS}
    # HF's Llama4TextConfig defaults (transformers 5.24)
    defaults = dict(intermediate_size=8192, intermediate_size_mlp=16384, head_dim=128,
                    num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                    num_local_experts=16, num_experts_per_tok=1, router_aux_loss_coef=0.001,
                    attention_chunk_size=8192, **EXTRA_DEFAULTS)
    theta = 500_000.0
    # HF's expert keys; the files hold the experts as (n, E, 2I) and (n, I, E), the router
    # under ``router``
    experts_key, expert_width_key = "num_local_experts", "intermediate_size"
    expert_layout = "transposed"
    router_module = "router"
    presets = {
        # Llama 4 Scout (17B active of 109B; 16 experts, one chosen, beside a shared one), as
        # HF's Llama4TextConfig defaults describe it, with the Hub file's rope and context
        "Llama-4-Scout-17B-16E": ("transformers 5.24 Llama4TextConfig defaults; rope, "
                                  "context: meta-llama/Llama-4-Scout-17B-16E", dict(
            vocab_size=202048, hidden_size=5120, intermediate_size=8192,
            intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40,
            num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, hidden_act="silu",
            max_position_embeddings=10485760, tie_word_embeddings=False,
            num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
            attention_chunk_size=8192, use_qk_norm=True, attn_temperature_tuning=True,
            floor_scale=8192, attn_scale=0.1,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192})),
    }

    def read_layers(self, cfg, n, source):
        """``layer_types``, else chunked where the layer rotates (and a chunk is given)."""
        types = cfg.get("layer_types")
        if types is None:
            chunk = cfg.get("attention_chunk_size") is not None
            types = ["chunked_attention" if r and chunk else "full_attention"
                     for r in rotary_flags(cfg, n, source)]
        if len(types) != n or not set(types) <= set(_NAMES):
            fail(source, f"layer_types must give one of {sorted(_NAMES)} for each of the {n} "
                         f"layers, got {types!r}")
        return None, tuple(_NAMES[t] for t in types)

    def write_layers(self, c):
        back = {v: k for k, v in _NAMES.items()}
        return {"layer_types": [back.get(t, t) for t in c.layer_types]}

    def read_dense_layers(self, get, n, source):
        """The layers that are not in ``moe_layers`` (default: every step-th is MoE)."""
        step = get("interleave_moe_layer_step")
        moe = get("moe_layers")
        moe = range(step - 1, n, step) if moe is None else moe
        return tuple(i for i in range(n) if i not in set(moe))

    def write_dense_layers(self, c):
        return {"moe_layers": [i for i in range(c.num_layers) if i not in c.dense_layers]}

    def read_moe_options(self, get, cfg, source):
        """σ of each of the top k logits, on the expert's input; a shared expert as wide."""
        return dict(router="topk_sigmoid", norm_topk_prob=False, weights_on_input=True,
                    shared_intermediate_size=get("intermediate_size"))

    def read_extra(self, cfg, n, fields, source):
        """NoPE layers, their temperature, and the norm of q and k after the rotation."""
        get = {**EXTRA_DEFAULTS, **cfg}.get
        flags = rotary_flags(cfg, n, source)
        temperature = (get("floor_scale"), get("attn_scale")) \
            if get("attn_temperature_tuning") else None
        return {"nope_layers": tuple(i for i, r in enumerate(flags) if not r),
                "attn_temperature": temperature,
                "qk_norm": "after_rope" if get("use_qk_norm") else None}

    def write_extra(self, c):
        t = c.attn_temperature
        return {"no_rope_layers": [int(i not in c.nope_layers) for i in range(c.num_layers)],
                "use_qk_norm": c.qk_norm == "after_rope", "attn_temperature_tuning": t is not None,
                **({} if t is None else {"floor_scale": t[0], "attn_scale": t[1]})}

    def tensors_from_hf(self, tensors, model, source):
        """The MLP is ``feed_forward`` in HF's files; read as Llama's ``mlp``."""
        return {k.replace(".feed_forward.", ".mlp."): v for k, v in tensors.items()}

    def tensors_to_hf(self, tensors, model, files):
        return {k.replace(".mlp.", ".feed_forward."): v for k, v in tensors.items()}
