"""MiniMax-Text-01 (MiniMax, 2025), a hybrid: lightning-attention layers
(``models/mixers/lightning.py``) among softmax ones, Mixtral's experts, and residual weights
per layer kind: α·Norm(h) + β·F(Norm h) after the mixer (softmax or lightning) and after the
MLP.

HF's ``MiniMaxConfig``. Its lightning layers store their decays as buffers
(``L.self_attn.slope_rate``, ``query_decay``, ``key_decay``, ``diagonal_decay``):
constants of the slopes and the block length, checked against those minitx computes on the
way in (to float32's rounding: HF computes them in float32) and written back on the way out.
"""
import numpy as np

from ..mixers.lightning import LightningMixer
from .base import fail
from .mixtral import Mixtral

# the lightning blocks' length and the residual weights, HF's names
MINIMAX_KEYS = ("block_size", "full_attn_alpha_factor", "full_attn_beta_factor",
                "linear_attn_alpha_factor", "linear_attn_beta_factor", "mlp_alpha_factor",
                "mlp_beta_factor")


class MiniMax(Mixtral):
    model_type = "minimax"
    reads = set(MINIMAX_KEYS)
    theta = 1_000_000.0
    presets = {
        # MiniMax-Text-01 (HF's conversion): 7 lightning layers to 1 softmax, 2 of 32
        # experts, residual weights α = (2L)^{1/4} on the normalised input
        "MiniMax-Text-01": ("MiniMaxAI/MiniMax-Text-01-hf", dict(
            vocab_size=200064, hidden_size=6144, intermediate_size=9216, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=10240000, tie_word_embeddings=False,
            rope_theta=10000000.0, sliding_window=None, num_local_experts=32,
            num_experts_per_tok=2, block_size=256,
            layer_types=["full_attention" if (i + 1) % 8 == 0 else "linear_attention"
                         for i in range(80)],
            full_attn_alpha_factor=3.5565588200778455, full_attn_beta_factor=1.0,
            linear_attn_alpha_factor=3.5565588200778455, linear_attn_beta_factor=1.0,
            mlp_alpha_factor=3.5565588200778455, mlp_beta_factor=1.0)),
    }

    def read_layers(self, cfg, n, source):
        """Lightning and softmax layers (HF's default: alternating); a window makes the
        softmax ones slide."""
        window = cfg.get("sliding_window")
        types = cfg.get("layer_types") or ["linear_attention" if i % 2 else "full_attention"
                                           for i in range(n)]
        return self.typed_layers(types, window, source, {
            "full_attention": "sliding" if window else "full",
            "linear_attention": "lightning"})

    def read_extra(self, cfg, n, fields, source):
        """The lightning layers' block length, and each layer's (α₁, β₁) after its mixer and
        (α₂, β₂) after the MLP."""
        get = {"block_size": 256, **{k: 1.0 for k in MINIMAX_KEYS[1:]}, **cfg}.get
        scales = {kind: (float(get(f"{name}_alpha_factor")), float(get(f"{name}_beta_factor")))
                  for kind, name in (("full", "full_attn"), ("sliding", "full_attn"),
                                     ("lightning", "linear_attn"), ("mlp", "mlp"))}
        return {"mixer_options": {"lightning": {"block": get("block_size")}},
                "residual_scales": tuple(scales[t] + scales["mlp"]
                                         for t in fields["layer_types"])}

    def write_extra(self, c):
        """``read_extra`` backwards: the layer kinds, the block length, and the residual
        weights of the first layer of each kind."""
        scales = c.residual_scales or ((1.0,) * 4,) * c.num_layers
        first = dict(zip(reversed(c.layer_types), reversed(scales)))   # first layer of a kind
        d = {"sliding_window": c.sliding_window,
             "layer_types": ["linear_attention" if t == "lightning" else "full_attention"
                             for t in c.layer_types],
             "block_size": (c.mixer_options.get("lightning") or {}).get("block", 256),
             "mlp_alpha_factor": scales[0][2], "mlp_beta_factor": scales[0][3]}
        for kind, name in (("full", "full_attn"), ("sliding", "full_attn"),
                           ("lightning", "linear_attn")):
            if kind in first:
                d[f"{name}_alpha_factor"], d[f"{name}_beta_factor"] = first[kind][:2]
        return d

    def tensors_from_hf(self, tensors, model, source):
        """``tensors`` without the decay buffers, each checked against minitx's."""
        out = dict(tensors)
        for i, block in enumerate(model.blocks):
            if not isinstance(block.attn, LightningMixer):
                continue                                  # a softmax layer: no decays
            for name, mine in lightning_decays(block.attn).items():
                key = f"model.layers.{i}.self_attn.{name}"
                if key not in out:
                    fail(source, f"missing tensor: {key}")
                theirs = np.asarray(out.pop(key), dtype="float64")
                if theirs.shape != mine.shape or not np.allclose(theirs, mine, rtol=1e-5,
                                                                 atol=1e-7):
                    fail(source, f"tensor {key!r} (shape {theirs.shape}) is not MiniMax's "
                                 f"decay for layer {i} of {len(model.blocks)}, "
                                 f"block_size={block.attn.block} (shape {mine.shape})")
        return out

    def tensors_to_hf(self, out, model, files):
        """``out`` with the decay buffers put back, as HF's lightning layers hold them."""
        dtype = next(iter(out.values())).dtype if out else "float32"
        out = dict(out)
        for i, block in enumerate(model.blocks):      # the decays, in the model's dtype
            if isinstance(block.attn, LightningMixer):
                out.update({f"model.layers.{i}.self_attn.{k}": v.astype(dtype) for k, v in
                            lightning_decays(block.attn).items()})
        return out


def lightning_decays(mixer) -> dict:
    """{buffer name: array} as HF's ``MiniMaxLightningAttention`` holds them: the rates s_h
    (H, 1, 1), λ^{i+1} and λ^{c−i−1} (H, c, 1), λ^{i−j} below the diagonal (1, H, c, c)."""
    s, c = mixer.slopes[:, None, None], mixer.block
    i = np.arange(c)
    dist = i[:, None] - i[None, :]
    diagonal = np.where(dist >= 0, np.exp(-s * np.maximum(dist, 0)), 0.0)
    return {"slope_rate": s, "query_decay": np.exp(-s * (i[:, None] + 1)),
            "key_decay": np.exp(-s * (c - 1 - i[:, None])),
            "diagonal_decay": diagonal[None]}
