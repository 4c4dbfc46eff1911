"""The decoder families, one file each, a lineage of diffs from GPT-2 (HF's modular files are
the model): each file's class holds only what its family changes from its parent's
(``base.py`` says what the tables mean).

    gpt2 → llama → mistral → mixtral → gpt_oss, minimax_m2, minimax
                 → qwen2 → qwen3 → qwen3_moe → qwen3_next → qwen3_5_text → qwen3_5_moe_text
                 → gemma3_text → gemma4_text
                 → olmo2 → olmo3 → olmo_hybrid
                 → smollm3
                 → lfm2
                 → nanochat
                 → llama4_text
                 → nemotron_h
                 → deepseek_v3 → deepseek_v32, glm4_moe, kimi_linear

``FAMILIES[model_type]`` is the family object; ``family(model_type)`` the one lookup by
name. Adding a family is one more file here, and its line below.
"""
from ... import validate
from .base import IGNORED, SIZE_KEYS, Family, changes_nothing
from .deepseek_v3 import DeepseekV3
from .deepseek_v32 import DeepseekV32
from .gemma3 import Gemma3           # model_type "gemma3_text" (HF's "gemma3" has vision)
from .gemma4 import Gemma4           # model_type "gemma4_text"
from .glm4_moe import Glm4Moe
from .gpt2 import GPT2
from .gpt_oss import GptOss
from .kimi_linear import KimiLinear
from .lfm2 import Lfm2
from .llama import Llama
from .llama4 import Llama4
from .minimax import MiniMax
from .minimax_m2 import MiniMaxM2   # model_type "minimax_m2": not MiniMax-01's hybrid
from .mistral import Mistral
from .mixtral import Mixtral
from .nemotron_h import NemotronH
from .nanochat import NanoChat
from .olmo2 import Olmo2
from .olmo3 import Olmo3
from .olmo_hybrid import OlmoHybrid
from .qwen2 import Qwen2
from .qwen3 import Qwen3
from .qwen3_5 import Qwen3_5, Qwen3_5Moe
from .qwen3_moe import Qwen3Moe
from .qwen3_next import Qwen3Next
from .smollm3 import SmolLM3

# the lookups, and base.py's names that pretrained.decoders imports from here
__all__ = ["FAMILIES", "LINEAGE", "family", "parent", "Family", "IGNORED", "SIZE_KEYS",
           "changes_nothing"]

# In the lineage's order, each after its parent; the hybrids last.
LINEAGE = (GPT2, Llama, Mistral, Qwen2, Qwen3, Qwen3Moe, Mixtral, Gemma3, Olmo2, Olmo3,
           SmolLM3, GptOss, MiniMaxM2, DeepseekV3, DeepseekV32, Glm4Moe, Qwen3Next,
           KimiLinear, MiniMax, Lfm2, Qwen3_5, Qwen3_5Moe, OlmoHybrid, NanoChat, Llama4, Gemma4,
           NemotronH)
FAMILIES = {cls.model_type: cls() for cls in LINEAGE}


_NONE = object()


def family(model_type, source: str = "config.json", default=_NONE) -> Family:
    """The family of ``model_type``; ``default`` if given, else ``OptionError`` naming the
    known ones, when there is none. The one comparison of a family's name."""
    if model_type not in FAMILIES:
        if default is not _NONE:
            return default
        raise validate.OptionError(f"{source}: model_type {model_type!r} is not a decoder "
                                   f"family minitx loads ({', '.join(sorted(FAMILIES))})")
    return FAMILIES[model_type]


def parent(fam: Family):
    """The family a family's file changes (None for the root)."""
    for cls in type(fam).__mro__[1:]:
        if cls in LINEAGE:
            return FAMILIES[cls.model_type]
    return None
