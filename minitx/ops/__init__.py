"""Primitive ops, one Function per op, one file per category (re-exported as minitx.functional)."""
from .elementwise import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .activation import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .sort import *  # noqa: F401,F403
from ._util import unbroadcast  # noqa: F401
from .sdpa import (scaled_dot_product_attention, attention_weights,  # noqa: F401
                   attention_scores, why_not_flash, attention_backward)
from .flash import flash_attention  # noqa: F401
