"""nanochat (Karpathy, 2025): Llama with no gain in any norm, one more norm on the embeddings,
q and k normalised after the rotation, GPT-2's two-matrix MLP around a squared ReLU, and the
logits soft-capped; its rotation turns every pair by −mω.

HF's ``NanoChatConfig`` and ``NanoChatForCausalLM``: every norm is the weightless RMSNorm
(HF's ``NanoChatRMSNorm``, Llama 4's ``L2Norm``), and the model applies its final norm's
module to the embeddings too, which without a gain is a second copy of the same formula. Its
``rotate_half`` returns [x₂, −x₁] where Llama's returns [−x₂, x₁]: a rotation by −mω
(``rope_reversed``). The MLP is ``fc1``/``fc2`` without biases; the head is untied.
"""
from .base import fresh
from .llama import Llama


class NanoChat(Llama):
    model_type = "nanochat"
    switches = dict(mlp="relu2", norm_weightless=True, embed_norm=True, qk_norm="after_rope",
                    rope_reversed=True)
    keys = {"mlp_bias": None, "final_logit_softcapping": "final_logit_softcap"}
    activation = "relu2"
    defaults = dict(intermediate_size=8192, max_position_embeddings=2048, rms_norm_eps=1e-6,
                    final_logit_softcapping=15.0)
    # no norm has a weight; the MLP is GPT-2's two matrices under CLIP's names
    tensors = fresh({
        "model.embed_tokens.weight": "embed.weight",
        "lm_head.weight": "unembed.weight",
        "model.layers.{i}.self_attn.*": "blocks.{i}.attn.*",
        "model.layers.{i}.mlp.fc1.weight": "blocks.{i}.mlp.up_proj.weight",
        "model.layers.{i}.mlp.fc2.weight": "blocks.{i}.mlp.down_proj.weight"})
    presets = {
        # nanochat as HF's class defaults describe it: 12 layers of 768, 6 heads of 128
        "nanochat": ("transformers 5.24 NanoChatConfig defaults", dict(
            vocab_size=50304, hidden_size=768, intermediate_size=8192, num_hidden_layers=12,
            num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=2048,
            hidden_act="relu2", rms_norm_eps=1e-6, final_logit_softcapping=15.0,
            attention_bias=False, tie_word_embeddings=False)),
    }
