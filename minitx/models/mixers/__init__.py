"""Token mixers beyond softmax attention, as layer types of ``models.decoder.Decoder``.

A hybrid model (Qwen3-Next, Kimi Linear, MiniMax, LFM2) interleaves softmax-attention layers
with layers whose mixer is a recurrence or a short convolution:
``DecoderConfig(layer_types=(..., "gated_deltanet", ...))``.
Each such layer type is registered here by name; ``block_features.layer_mixer`` builds
``MIXERS[name](config, index)`` in place of its attention. A mixer is a ``Module`` with
``forward(x, kv_cache=None, keep=None, positions=None)`` (x (B, N, E) → (B, N, E), the
arguments as ``DecoderAttention.forward``'s) and ``new_cache()``, whose cache has ``len()`` =
the tokens it has seen; ``parameter_count(config)`` and ``state_numbers(config, tokens)``
(class methods) count its parameters and its cache from the configuration alone, for
``count_parameters`` and ``kv_cache_bytes``. Its options come from
``DecoderConfig.mixer_options[name]``, a dict the mixer checks.
"""
from __future__ import annotations

from ... import validate

__all__ = ["MIXERS", "register_mixer", "given_options"]

MIXERS: dict = {}


def register_mixer(name: str):
    """Class decorator: the mixer class becomes layer type ``name``."""
    def add(cls):
        if name in MIXERS or name in ("full", "sliding"):
            raise ValueError(f"register_mixer: layer type {name!r} is taken")
        MIXERS[name] = cls
        return cls
    return add


def given_options(c, name: str, defaults: dict) -> tuple:
    """(``c.mixer_options[name]`` over ``defaults``, the owner's name for errors); an option
    not in ``defaults`` is refused by name. The one check every mixer's options share."""
    who = f"DecoderConfig.mixer_options[{name!r}]"
    given = dict(c.mixer_options.get(name) or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise validate.unknown_options(unknown, list(defaults), owner=who)
    return {**defaults, **given}, who


# The registered mixers, one module each (imported last: they use register_mixer).
from . import gated_deltanet  # noqa: E402,F401
from . import kda  # noqa: E402,F401
from . import lightning  # noqa: E402,F401
from . import mamba2  # noqa: E402,F401
from . import short_conv  # noqa: E402,F401
