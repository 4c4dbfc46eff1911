"""Mixtral (Mistral AI, 2024): Mistral's attention with a mixture of experts in every layer,
k of n SwiGLU experts of full width under a softmax router (``nn/moe.py``, docs/moe.md).

HF's ``MixtralConfig``: the expert count is ``num_local_experts``, their width
``intermediate_size``; the files hold each expert's ``w1``, ``w3``, ``w2`` under
``block_sparse_moe``. One window for every layer, whatever ``layer_types`` says.
"""
from .mistral import Mistral

# the experts' keys, by HF's names (each family spells the expert count its way)
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
               "moe_intermediate_size", "router_aux_loss_coef", "router_jitter_noise")


class Mixtral(Mistral):
    model_type = "mixtral"
    switches = dict(mlp="moe")
    reads = set(EXPERT_KEYS)
    defaults = dict(max_position_embeddings=131072, rms_norm_eps=1e-5, sliding_window=None,
                    router_aux_loss_coef=0.001, num_local_experts=8, num_experts_per_tok=2)
    theta = 1_000_000.0
    experts_key, expert_width_key = "num_local_experts", "intermediate_size"
    expert_files = ("w1", "w3", "w2")
    moe_files_module = "block_sparse_moe"
    presets = {
        # Mixtral: Mistral's attention, 2 of 8 experts of full width
        "Mixtral-8x7B": ("mistralai/Mixtral-8x7B-v0.1", dict(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=32768, tie_word_embeddings=False,
            rope_theta=1000000.0, sliding_window=None, num_local_experts=8,
            num_experts_per_tok=2, router_aux_loss_coef=0.02)),
    }

    def read_layers(self, cfg, n, source):
        return cfg.get("sliding_window"), None
