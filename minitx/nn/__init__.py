"""``minitx.nn``: Modules, Parameters, layers, containers and initialisers (PyTorch's API).

    import minitx.nn as nn

    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 2))
    model.state_dict().keys()   # odict_keys(['0.weight', '0.bias', '2.weight', '2.bias'])

Layout: ``module.py`` (Module, Parameter, Sequential, ModuleList, ModuleDict), ``layers.py``
(Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations), ``positional.py`` (sinusoidal
and learned absolute position encodings), ``reversible.py`` (reversible residual layers),
``init.py`` (initialisers), ``hooks.py`` (``HookPoint``, the activation cache), ``moe.py``
(mixture of experts: routers, stacked experts, the load-balancing loss), ``loss.py``
(``CrossEntropyLoss``), ``hyper_connections.py`` (the residual stream widened to n streams:
DeepSeek-V4's mHC, Qwen4-Exp's gated form). PyTorch's module paths: ``minitx.nn.functional`` is
``minitx.functional`` (``import minitx.nn.functional as F``) and ``nn.utils.clip_grad_norm_``
is ``minitx.optim``'s.

The attention modules, transformer blocks and models live one layer up, in ``minitx.models``
(they are built from ``minitx.attention``, which is built from this package). For PyTorch's
habits their names are importable from here too — ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``, ``nn.GPT`` … — resolved on first use (``__getattr__`` below):
the one place where a name is reached upward, and only on request, so importing ``minitx.nn``
never imports attention or models.
"""
from . import init  # noqa: F401
from .module import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .positional import *  # noqa: F401,F403
from .reversible import *  # noqa: F401,F403
from .hooks import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .hyper_connections import *  # noqa: F401,F403
from . import functional, utils  # noqa: F401 - PyTorch's torch.nn.functional, torch.nn.utils
from .module import __all__ as _module_all
from .layers import __all__ as _layers_all
from .positional import __all__ as _positional_all
from .reversible import __all__ as _reversible_all
from .hooks import __all__ as _hooks_all
from .moe import __all__ as _moe_all
from .loss import __all__ as _loss_all
from .hyper_connections import __all__ as _hyper_all

__all__ = ["init", "functional", "utils", *_module_all, *_layers_all, *_positional_all,
           *_reversible_all, *_hooks_all, *_moe_all, *_loss_all, *_hyper_all]

# Names of minitx.models offered here (PyTorch keeps them in torch.nn).
_FROM_MODELS = ("MultiheadAttention", "torch_masks_to_sdpa", "TransformerEncoderLayer",
                "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
                "build_self_attention", "get_activation", "GPTConfig", "GPT", "GPTBlock",
                "sample_next", "Transformer", "EncoderClassifier")


def __getattr__(name):
    if name in _FROM_MODELS:
        import importlib
        return getattr(importlib.import_module("minitx.models"), name)
    raise AttributeError(f"module 'minitx.nn' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FROM_MODELS))
