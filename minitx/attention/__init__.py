"""Every attention variant, one file per family, and the registry that names them.

    from minitx.attention import REGISTRY
    layer = REGISTRY["local"](embed_dim=64, num_heads=4, causal=True, window=16)
    y = layer(x)                      # (B, N, E) -> (B, N, E)

See ``base.py`` for the contract every variant follows; ``classic.py`` for the forms readers
meet first (start with ``simple_attention``). The fused functional ops the variants call live
one layer down, in ``minitx.ops`` (``ops/sdpa.py``, ``ops/flash.py``); they are re-exported
here and in ``minitx.functional``.
"""
from ..nn.positional import (LearnedPositionalEmbedding,  # noqa: F401 - where users look
                             SinusoidalPositionalEncoding, sinusoidal_positions)
from ..ops.sdpa import (attention_weights, merge_masks,  # noqa: F401
                             scaled_dot_product_attention, why_not_flash)
from ..ops.flash import flash_attention, flash_attention_arrays  # noqa: F401
from .base import (PROJECTIONS, REGISTRY, AttentionBase, causal_pattern,  # noqa: F401
                   check_heads, dense_attention_array, merge_heads, register, repeat_kv,
                   repeat_kv_array, softmax_rows_array, split_heads)

# The forms readers meet first, exact attention, positions, caches.
from .classic import *  # noqa: F401,F403
from .exact import *  # noqa: F401,F403
from .positions import *  # noqa: F401,F403
from .kv_cache import *  # noqa: F401,F403

# Efficient, sparse and approximate variants.
from .masks import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .linformer import *  # noqa: F401,F403
from .performer import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .reformer import *  # noqa: F401,F403
from .synthesizer import *  # noqa: F401,F403
from .routing import *  # noqa: F401,F403
from .flash import *  # noqa: F401,F403
from .mixers import *  # noqa: F401,F403

# The attention of current models, and attention as recurrence.
from .latent import *  # noqa: F401,F403
from .differential import *  # noqa: F401,F403
from .sigmoid import *  # noqa: F401,F403
from .sinks import *  # noqa: F401,F403
from .selection import *  # noqa: F401,F403
from .nystrom import *  # noqa: F401,F403
from .retention import *  # noqa: F401,F403
from .delta_rule import *  # noqa: F401,F403
from .ssd import *  # noqa: F401,F403
from .gated_delta import *  # noqa: F401,F403
from .gated import *  # noqa: F401,F403
from .lightning import *  # noqa: F401,F403

# The attention of 2026's models.
from .short_conv import *  # noqa: F401,F403
from .chunked import *  # noqa: F401,F403
from .shared_kv import *  # noqa: F401,F403
from .block_indexer import *  # noqa: F401,F403
from .compressed import *  # noqa: F401,F403
from .mamba2 import *  # noqa: F401,F403
