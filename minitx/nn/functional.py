"""``minitx.nn.functional``: PyTorch's path to the functional ops
(``import torch.nn.functional as F``). Every name is ``minitx.functional``'s own object:
``minitx.nn.functional.softmax is minitx.functional.softmax``; the ops and their docstrings
live in ``minitx.ops`` (see ``minitx.functional``).
"""
from ..functional import *  # noqa: F401,F403
