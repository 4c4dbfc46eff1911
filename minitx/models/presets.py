"""Real decoders' published configurations, as ``DecoderConfig`` presets: their sizes cost
nothing to count (``count_parameters``, ``kv_cache_bytes``), and none is built at full size.

    from minitx.models import preset, count_parameters
    count_parameters(preset("gpt-oss-20b"))      # {"total": 20.9e9, ..., "active": 4.2e9}

Each preset is the translation of a model's ``config.json`` (on the HuggingFace Hub, the
repository named in ``SOURCES``, or HF's configuration class's defaults where ``SOURCES``
says so) into minitx's switches: the file is held once, in its family's file
(``models/families/``, ``presets``), and read by that family as a checkpoint's would be.
Only keys that change the forward pass are kept. ``max_position`` is the file's
``max_position_embeddings``.
"""
from __future__ import annotations

import dataclasses

from .. import validate
from .decoder import DecoderConfig
from .families import FAMILIES

__all__ = ["PRESETS", "SOURCES", "preset"]

# name → where its config.json comes from: the Hub repository, or HF's class defaults
SOURCES = {name: src for fam in FAMILIES.values() for name, (src, _) in fam.presets.items()}

# name → its DecoderConfig: each family file's published config.json, read by that file
PRESETS = {name: fam.read(dict(cfg, model_type=kind), f"{name}/config.json")
           for kind, fam in FAMILIES.items() for name, (_, cfg) in fam.presets.items()}


def preset(name: str) -> DecoderConfig:
    """A fresh copy of ``PRESETS[name]`` (edit it freely)."""
    validate.choice(name, "name", tuple(PRESETS), owner="preset")
    return dataclasses.replace(PRESETS[name], rope=dict(PRESETS[name].rope),
                               moe_options=dict(PRESETS[name].moe_options))
