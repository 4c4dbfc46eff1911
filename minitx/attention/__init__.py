"""Every attention variant, one file per family, and the registry that names them.

    from minitx.attention import REGISTRY
    layer = REGISTRY["local"](embed_dim=64, num_heads=4, causal=True, window=16)
    y = layer(x)                      # (B, N, E) -> (B, N, E)

See ``base.py`` for the contract every variant follows.
"""
from .base import (REGISTRY, AttentionBase, causal_pattern, check_heads,  # noqa: F401
                   dense_attention_array, merge_heads, register, repeat_kv, split_heads)

# Exact attention, the forms readers meet first, positions, caches (exact-attention issue).
from .exact import *  # noqa: F401,F403
from .positions import *  # noqa: F401,F403
from .kv_cache import *  # noqa: F401,F403

# Efficient, sparse and approximate variants (efficient-attention issue).
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
