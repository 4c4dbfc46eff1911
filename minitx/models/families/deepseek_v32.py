"""DeepSeek-V3.2 (DeepSeek-AI, 2025): DeepSeek-V3 whose every layer reads only the
``index_topk`` keys a lightning indexer picks for each query (``models/indexer.py``).

HF's ``DeepseekV32Config``: the rotary dims are always interleaved pairs (it does not read
``rope_interleave``); its only layer type is ``indexed_attention``; ``mlp_layer_types``
may say which layers are dense. Its class has an ``mlp_bias`` key that its model does not
read (no MLP has biases): read and ignored here too.
"""
from .base import fail
from .deepseek_v3 import MLA_KEYS, DeepseekV3

# the indexer: HF's names (DecoderConfig's too) and HF's defaults
INDEX_DEFAULTS = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}


class DeepseekV32(DeepseekV3):
    model_type = "deepseek_v32"
    switches = dict(rope_interleave=True)
    reads = {*INDEX_DEFAULTS, "mlp_layer_types", "mlp_bias"}
    defaults = dict(max_position_embeddings=163840, **INDEX_DEFAULTS)
    presets = {
        # DeepSeek-V3.2: V3's model, plus a lightning indexer choosing 2048 keys per query
        "DeepSeek-V3.2": ("deepseek-ai/DeepSeek-V3.2", dict(
            DeepseekV3.presets["DeepSeek-V3"][1], index_topk=2048, index_n_heads=64,
            index_head_dim=128)),
    }

    def read_layers(self, cfg, n, source):
        """Every layer indexed (HF's one layer type), none sliding."""
        types = cfg.get("layer_types") or ["indexed_attention"] * n
        if len(types) != n or set(types) != {"indexed_attention"}:
            fail(source, f"layer_types must be 'indexed_attention' for each of the {n} "
                         f"layers (HF's DeepSeek-V3.2), got {types!r}")
        return None, None

    def write_layers(self, c):
        return {"layer_types": ["indexed_attention"] * c.num_layers}

    def read_extra(self, cfg, n, fields, source):
        """The latent attention's sizes and the indexer's; not V3's ``rope_interleave``, which
        the switch fixes (HF's V3.2 does not read it)."""
        return {**{k: cfg[k] for k in MLA_KEYS if k in cfg},
                **{k: cfg[k] for k in INDEX_DEFAULTS}}

    def write_extra(self, c):
        return {**{k: getattr(c, k) for k in MLA_KEYS},
                **{k: getattr(c, k) for k in INDEX_DEFAULTS}}

    def read_dense_layers(self, get, n, source):
        """``mlp_layer_types`` when the file has it, else V3's ``first_k_dense_replace``."""
        dense = dense_by_type(get("mlp_layer_types"), n, source)
        return super().read_dense_layers(get, n, source) if dense is None else dense

    def write_dense_layers(self, c):
        return {"first_k_dense_replace": len(c.dense_layers),
                "mlp_layer_types": ["dense" if i in c.dense_layers else "sparse"
                                    for i in range(c.num_layers)]}


def dense_by_type(types, n, source):
    """The dense layers of ``mlp_layer_types`` ("dense" or "sparse" per layer); None when
    the file has none."""
    if types is None:
        return None
    if len(types) != n or not set(types) <= {"dense", "sparse"}:
        fail(source, f"mlp_layer_types must give 'dense' or 'sparse' for each of the {n} "
                     f"layers, got {types!r}")
    return tuple(i for i, t in enumerate(types) if t == "dense")
