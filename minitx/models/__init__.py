"""``minitx.models``: the modules built *from* attention — PyTorch's ``MultiheadAttention`` and
transformer blocks, and complete models.

    from minitx.models import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64))

Layout: ``multihead.py`` (MultiheadAttention, PyTorch's arguments and state-dict keys),
``transformer.py`` (encoder/decoder layers and stacks), ``gpt.py`` (GPT, generation through a
KV cache), ``seq2seq.py`` (the encoder–decoder Transformer), ``classifier.py``
(EncoderClassifier), ``decoder.py`` (one decoder whose families — Llama, Mistral, Qwen,
Gemma, OLMo, Mixtral, gpt-oss, DeepSeek — are configurations), ``presets.py`` (real
models' published configurations), ``common.py`` (token ids, attention maps). Every name is
also importable from ``minitx.nn``, as in PyTorch (``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``).
"""
from .multihead import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .gpt import *  # noqa: F401,F403
from .seq2seq import *  # noqa: F401,F403
from .classifier import *  # noqa: F401,F403
from .decoder import *  # noqa: F401,F403
from .presets import *  # noqa: F401,F403
from .multihead import __all__ as _multihead_all
from .transformer import __all__ as _transformer_all
from .gpt import __all__ as _gpt_all
from .seq2seq import __all__ as _seq2seq_all
from .classifier import __all__ as _classifier_all
from .decoder import __all__ as _decoder_all
from .presets import __all__ as _presets_all

__all__ = [*_multihead_all, *_transformer_all, *_gpt_all, *_seq2seq_all, *_classifier_all,
           *_decoder_all, *_presets_all]
