"""Qwen3.5 (Alibaba, 2026), dense and mixture of experts: Qwen3-Next's hybrid (three gated
DeltaNet layers to one gated attention layer, a quarter of each head rotated, zero-centred
norms) with the DeltaNet's q, k, v, its output gate z and its β and decay inputs b, a as
four separate projections (``models/mixers/gated_deltanet.py``, ``projections="split"``);
the text model a dense SwiGLU in every layer, the MoE model Qwen3-Next's experts (k of n,
always renormalised over the chosen, plus a sigmoid-gated shared expert) in every layer.

The attention's rope is multimodal (M-RoPE, ``mrope_section``, ``mrope_interleaved``): each
rotated frequency reads the time, height or width position id, interleaved. Text tokens have
the three ids equal to the token's position, so every frequency reads the same id and the
rope is the plain one-dimensional rope on the first quarter of each head; minitx runs text
only (no 3-D ``position_ids``), so the two keys are read, checked and change nothing.

HF's ``Qwen3_5TextConfig`` and ``Qwen3_5MoeTextConfig`` (the text models of the released
multimodal checkpoints, whose files hold them under ``model.language_model.``, beside the
vision tower ``model.visual.`` and the multi-token prediction ``mtp.`` that HF's causal LM
skips, as minitx does). Keys the released files carry that HF's classes never read must hold
what HF's model runs anyway (``FIXED``).
"""
from .base import fail, fresh
from .qwen3_next import LINEAR_DEFAULTS, LINEAR_KEYS, Qwen3Next

# keys HF's Qwen3.5 model does not read, and the value it runs whatever they say: every
# attention output gated, no dense layer, the delta rule in float32 (its torch path)
FIXED = {"attn_output_gate": True, "mlp_only_layers": [], "mamba_ssm_dtype": "float32"}
# the MoE model's, too: the top k always renormalised, every layer sparse
MOE_FIXED = {**FIXED, "norm_topk_prob": True, "decoder_sparse_step": 1}
_MROPE = ("mrope_section", "mrope_interleaved")


class Qwen3_5(Qwen3Next):
    model_type = "qwen3_5_text"
    switches = dict(mlp="swiglu")
    reads = fresh.of("layer_types", "full_attention_interval", "partial_rotary_factor",
                     *LINEAR_KEYS, *FIXED)
    # None: Qwen3-Next's expert keys, which HF's dense Qwen3.5 does not have
    defaults = dict(num_key_value_heads=4, num_experts=None, num_experts_per_tok=None,
                    moe_intermediate_size=None, shared_expert_intermediate_size=None,
                    norm_topk_prob=None, decoder_sparse_step=None, router_aux_loss_coef=None)
    fixed = FIXED
    presets = {
        # Qwen3.5-27B: 48 gated DeltaNet layers (16 key heads, 48 value heads) and 16 gated
        # attention layers, a dense MLP of 17408 in each
        "Qwen3.5-27B": ("Qwen/Qwen3.5-27B (config.json, text_config)", dict(
            vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
            num_attention_heads=24, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
            hidden_act="silu", max_position_embeddings=262144, tie_word_embeddings=False,
            attention_bias=False, attn_output_gate=True, full_attention_interval=4,
            linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=16, linear_num_value_heads=48, mamba_ssm_dtype="float32",
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                             "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                             "mrope_section": [11, 11, 10]})),
    }

    def prepare(self, cfg, source):
        """The keys HF's model does not read (``fixed``) hold what it runs anyway."""
        for key, value in self.fixed.items():
            if cfg.get(key, value) != value:
                fail(source, f"{key}={cfg[key]!r}: HuggingFace's {self.model_type} runs "
                             f"{key}={value!r} whatever the config says; refused")
        return cfg

    def read_ropes(self, cfg, source):
        """Qwen3-Next's rope, the M-RoPE keys checked and set aside (module docstring): for
        text the three position ids are one, and the rope is one-dimensional."""
        cfg = dict(cfg)
        for where in ("rope_parameters", "rope_scaling"):
            if cfg.get(where):
                rope = dict(cfg[where])
                section = rope.pop("mrope_section", [11, 11, 10])
                if not isinstance(section, (list, tuple)) or len(section) != 3 or \
                        any(not isinstance(s, int) or s < 0 for s in section):
                    fail(source, f"{where}: mrope_section must be three counts of rotated "
                                 f"frequencies (time, height, width), got {section!r}")
                if not isinstance(rope.pop("mrope_interleaved", True), bool):
                    fail(source, f"{where}: mrope_interleaved must be true or false")
                cfg[where] = rope
        return super().read_ropes(cfg, source)

    def read_extra(self, cfg, n, fields, source):
        """The DeltaNet's sizes (HF's defaults for those a file leaves out), split
        projections."""
        sizes = {**LINEAR_DEFAULTS, **{k: cfg[k] for k in LINEAR_KEYS if k in cfg}}
        return {"mixer_options": {"gated_deltanet": {
            **{LINEAR_KEYS[k]: v for k, v in sizes.items()}, "projections": "split"}}}

    def tensors_from_hf(self, tensors, model, source):
        """The multimodal files' text model (``model.language_model.``) as the causal LM's
        ``model.``; the vision tower and the multi-token prediction layers skipped, as HF's
        causal LM skips them."""
        out = {}
        for key, value in tensors.items():
            if key.startswith(("mtp.", "model.visual.")):
                continue
            if key.startswith("model.language_model."):
                key = "model." + key[len("model.language_model."):]
            out[key] = value
        return out


class Qwen3_5Moe(Qwen3_5):
    model_type = "qwen3_5_moe_text"
    switches = dict(mlp="moe")
    keys = {"intermediate_size": None}         # no dense MLP: HF's class has no such key
    reads = {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "router_aux_loss_coef", "intermediate_size",
             *MOE_FIXED}
    defaults = dict(num_key_value_heads=2, num_experts=256, num_experts_per_tok=8,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512,
                    router_aux_loss_coef=0.001)
    fixed = MOE_FIXED
    presets = {
        # Qwen3.5-35B-A3B: 30 gated DeltaNet layers and 10 gated attention layers, 8 of 256
        # narrow experts plus a gated shared one in every layer
        "Qwen3.5-35B-A3B": ("Qwen/Qwen3.5-35B-A3B (config.json, text_config)", dict(
            vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
            num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6, hidden_act="silu",
            max_position_embeddings=262144, tie_word_embeddings=False, attention_bias=False,
            attn_output_gate=True, full_attention_interval=4, linear_conv_kernel_dim=4,
            linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
            linear_num_value_heads=32, num_experts=256, num_experts_per_tok=8,
            moe_intermediate_size=512, shared_expert_intermediate_size=512,
            router_aux_loss_coef=0.001, mlp_only_layers=[], mamba_ssm_dtype="float32",
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                             "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                             "mrope_section": [11, 11, 10]})),
    }

    def read_dense_layers(self, get, n, source):
        """None: HF's Qwen3.5-MoE has no dense layer (``FIXED``)."""
        return ()

    def write_dense_layers(self, c):
        return {}

    def read_moe_options(self, get, cfg, source):
        """Qwen3-Next's shared expert; the top k always renormalised."""
        return dict(norm_topk_prob=True,
                    shared_intermediate_size=get("shared_expert_intermediate_size"),
                    shared_expert_gate=True)

    def write_moe_options(self, c):
        return {"shared_expert_intermediate_size": c.moe_options.get("shared_intermediate_size")}
