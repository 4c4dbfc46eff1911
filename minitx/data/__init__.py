"""Synthetic tasks and small loaders for the examples.

- ``sentiment``: a generated review corpus whose labels depend on word order, an IMDB loader;
- ``tokenizer``: a tiny word/character vocabulary;
- ``seq2seq``: reverse / sort / copy tasks;
- ``listops``: mini Long-Range-Arena ListOps, generator and evaluator;
- ``chars``: a character corpus from Python's standard-library sources;
- ``batching``: padding and batch iteration.
"""
from .batching import *  # noqa: F401,F403
from .chars import *  # noqa: F401,F403
from .listops import *  # noqa: F401,F403
from .sentiment import *  # noqa: F401,F403
from .seq2seq import *  # noqa: F401,F403
from .tokenizer import *  # noqa: F401,F403
