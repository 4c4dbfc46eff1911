r"""LFM2's convolution layer: the gated short convolution between two projections — layer type
``"short_conv"``.

Liquid AI (2025), "LFM2 Technical Report"; HuggingFace's ``Lfm2ShortConv`` is the oracle. For
x_t (E), one projection gives the three streams b, c and x̃ (E each); the gated short
convolution of ``attention/short_conv.py`` (its formula, there) mixes them, and a second
projection maps back:

$$
[b_t, c_t, \tilde x_t] = W_{in}\, x_t, \qquad y_t = W_{out} \left( c_t \odot z_t \right)
$$

$$
z_t = \beta + \sum_{j=0}^{K-1} w_j \odot (b \odot \tilde x)_{t-K+1+j}
$$

one convolution over all E channels (the registry variant ``short_conv`` computes the same on
heads of the attention contract, c ↔ q, b ↔ k, x̃ ↔ v). HF's layout is kept: ``in_proj``'s rows
are [b; c; x̃] in that order, ``conv.weight`` is (E, 1, K), and one ``conv_bias`` switch gives
all three of ``in_proj``, ``conv`` and ``out_proj`` a bias.

**Padding.** As HF does, the inputs of padding tokens (0 in ``attention_mask``) are zeroed
before ``in_proj``, so a left-padded prompt leaves (without biases) nothing in the
convolution's window.

**Decoding.** The cache keeps the last K − 1 products b ⊙ x̃: (K − 1)·E numbers per batch
row, whatever the length.
"""
from __future__ import annotations

from ... import validate
from ...attention.retention import RecurrentState
from ...autograd.tensor import Tensor
from ...nn.hooks import HookPoint
from ...nn.layers import Linear
from ...nn.module import Module
from . import given_options, register_mixer
from .gated_deltanet import CausalConv1d

__all__ = ["ShortConvMixer", "OPTIONS"]

# the options of DecoderConfig.mixer_options["short_conv"] and their defaults (HF's
# conv_L_cache and conv_bias)
OPTIONS = {"kernel": 3, "bias": False}


def mixer_options(c) -> dict:
    """``c.mixer_options["short_conv"]`` checked, the defaults filled in."""
    o, who = given_options(c, "short_conv", OPTIONS)
    o["kernel"] = validate.positive_int(o["kernel"], "kernel", owner=who)
    o["bias"] = validate.boolean(o["bias"], "bias", owner=who)
    return o


@register_mixer("short_conv")
class ShortConvMixer(Module):
    """LFM2's convolution layer (module docstring). x (B, N, E) → (B, N, E).

    Options (``DecoderConfig.mixer_options["short_conv"]``, ``OPTIONS``): ``kernel`` K (3),
    ``bias`` (False: no biases in ``in_proj``, ``conv``, ``out_proj``). Parameters under
    HF's names: ``in_proj`` (E → 3·E), ``conv.weight`` (E, 1, K) (and ``conv.bias``),
    ``out_proj`` (E → E).

    Hook points, each (B, N, E): ``hook_b``, ``hook_c``, ``hook_x`` the three streams;
    ``hook_product`` b ⊙ x̃ and ``hook_conv`` the filtered product before the gate c, both
    replaceable; ``hook_state`` the last K − 1 products (B, K − 1, E), what a cache keeps.

    Cost: time O(B·N·E·(4·E + K)); decoding O(E²) a token; the cache (K − 1)·E numbers per
    batch row.
    """

    def __init__(self, c, index: int = 0):
        super().__init__()
        o = self.options = mixer_options(c)
        e = c.hidden_size
        self.in_proj = Linear(e, 3 * e, bias=o["bias"])
        self.conv = CausalConv1d(e, o["kernel"], bias=o["bias"])
        self.out_proj = Linear(e, e, bias=o["bias"])
        for name in ("b", "c", "x", "product", "conv", "state"):
            setattr(self, f"hook_{name}", HookPoint())

    @classmethod
    def parameter_count(cls, c) -> int:
        """4·E² + K·E, and 5·E more with biases."""
        o, e = mixer_options(c), c.hidden_size
        return 4 * e * e + o["kernel"] * e + (5 * e if o["bias"] else 0)

    @classmethod
    def state_numbers(cls, c, tokens: int) -> int:
        """(K − 1)·E per sequence once a token is seen: the window does not grow."""
        return (mixer_options(c)["kernel"] - 1) * c.hidden_size if tokens else 0

    def new_cache(self):
        """An empty ``RecurrentState``: the last K − 1 products and the tokens seen."""
        return RecurrentState()

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` (B, cached + N) bool, False = padding (its
        input zeroed); ``positions`` unused (the convolution orders the tokens)."""
        n, e = x.shape[1], x.shape[2]
        if kv_cache is not None and not isinstance(kv_cache, RecurrentState):
            raise TypeError("ShortConvMixer: kv_cache must be a RecurrentState (from "
                            f"new_cache()), got {type(kv_cache).__name__}")
        if keep is not None:
            x = x * keep[:, -n:, None].astype(x.dtype)
        bcx = self.in_proj(x)                                           # (B, N, 3·E)
        b = self.hook_b(bcx[..., :e])
        gate = self.hook_c(bcx[..., e:2 * e])
        xv = self.hook_x(bcx[..., 2 * e:])
        u = self.hook_product(b * xv)
        filtered, last = self.conv(u, None if kv_cache is None else kv_cache.state)
        if self.hook_state.active:
            last = self.hook_state(Tensor._wrap(last)).data
        if kv_cache is not None:
            kv_cache.update(last, n)                  # values only: no graph is kept
        return self.out_proj(gate * self.hook_conv(filtered))

    def extra_repr(self) -> str:
        return f"kernel={self.options['kernel']}, bias={self.options['bias']}"
