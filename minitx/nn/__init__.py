"""``minitx.nn``: Modules, Parameters, layers, containers and initialisers (PyTorch's API).

    import minitx.nn as nn

    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 2))
    model.state_dict().keys()   # odict_keys(['0.weight', '0.bias', '2.weight', '2.bias'])

Layout: ``module.py`` (Module, Parameter, Sequential, ModuleList, ModuleDict), ``layers.py``
(Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations), ``init.py`` (initialisers).
"""
from . import init  # noqa: F401
from .module import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .module import __all__ as _module_all
from .layers import __all__ as _layers_all

__all__ = ["init", *_module_all, *_layers_all]

# ---- further building blocks: each file appends its names to __all__ here ----------------------

# ---- attention modules, transformer blocks, models (exact-attention issue) ---------------------
from .attention import *  # noqa: F401,F403,E402
from .transformer import *  # noqa: F401,F403,E402
from .models import *  # noqa: F401,F403,E402
from .attention import __all__ as _attention_all  # noqa: E402
from .transformer import __all__ as _transformer_all  # noqa: E402
from .models import __all__ as _models_all  # noqa: E402

__all__ += [*_attention_all, *_transformer_all, *_models_all]

# ---- reversible residual layers and chunked feed-forward (efficient-attention issue) -----------
from .reversible import *  # noqa: F401,F403,E402
from .reversible import __all__ as _reversible_all  # noqa: E402

__all__ += [*_reversible_all]
