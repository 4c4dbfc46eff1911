r"""The gated short convolution: LFM2's token mixer, a query times a short filter of key ⊙ value.

Liquid AI (2025), "LFM2 Technical Report". Most of LFM2's layers mix tokens with no attention at
all: each channel c of a token is a product of three projections of it, b, c and x (E each),
with a causal depthwise convolution of kernel K (3 in LFM2) in the middle:

$$
y_t = c_t \odot \Bigl( \beta + \sum_{j=0}^{K-1} w_j \odot u_{t-K+1+j} \Bigr),
\qquad u_s = b_s \odot x_s
$$

with u_s = 0 before the first token, one weight vector w_j per tap (E numbers: each channel its
own K weights) and an optional bias β. H3 (Fu et al. 2023, "Hungry Hungry Hippos") has the
same shape, a query times a filter of key ⊙ value, with state-space filters where LFM2 has one
short convolution.

**As attention.** On the attention contract's heads the roles are C ↔ q, B ↔ k, X ↔ v, and the
convolution is a fixed matrix per channel in place of the softmax's pattern: a banded Toeplitz
matrix T (N × N) whose entry in row t, column s is the tap w[s − t + K − 1] for t − K < s ≤ t,
zero elsewhere, so

$$
Y = Q \odot \bigl( T\,(K \odot V) + \beta \bigr)
$$

per channel (``ShortConvolution.reference`` builds T and computes exactly this). No score
depends on the data: what the layer reads is fixed by position, and the data enters through the
gates b and c. Each output reads K tokens: time O(N·K) per channel.

**Decoding.** The next output needs only the last K − 1 products u: the cache keeps (K − 1)·E
numbers per layer and batch row, whatever the length.

**Non-causal** (``causal=False``) is minitx's extension, not LFM2's: the same K taps centred on
the token, output t reading t − K + 1 + s … t + s with s = ⌊(K − 1)/2⌋ (zeros past either end).
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, rng, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.module import Parameter
from .base import register, repeat_kv, repeat_kv_array
from .retention import RecurrentAttention

__all__ = ["causal_conv", "short_conv_matrix", "ShortConvolution"]


def causal_conv(u, weight, past=None, lookahead: int = 0, bias=None):
    r"""The depthwise convolution over time of the module docstring: output t is β plus the
    sum over taps j of w[j] ⊙ u[t − K + 1 + s + j] (s = ``lookahead``, 0: causal), each
    channel its own K weights.

    ``u`` (B, N, *C) a Tensor, time on axis 1 and any channel shape after it; ``weight``
    (*C, K); ``bias`` β (*C) or None; ``past`` the K − 1 inputs before u (B, K − 1, *C), a raw
    array (None: zeros; causal only). Returns (y (B, N, *C), the last K − 1 inputs of the
    causal stream [past, u] as a raw array: what a causal cache keeps). Time O(B·N·C·K).
    """
    k = weight.shape[-1]
    b, n = u.shape[0], u.shape[1]
    channels = tuple(u.shape[2:])
    xp = get_array_module(u.data)
    if lookahead and past is not None:
        raise ValueError("causal_conv: past inputs continue a causal stream; lookahead must "
                         f"be 0 with past, got lookahead={lookahead}")
    before = xp.zeros((b, k - 1 - lookahead, *channels), dtype=u.dtype) if past is None \
        else past.astype(u.dtype, copy=False)
    parts = [Tensor._wrap(before), u]
    if lookahead:
        parts.append(Tensor._wrap(xp.zeros((b, lookahead, *channels), dtype=u.dtype)))
    padded = F.concatenate(parts, axis=1)                 # (B, K − 1 + N, *C)
    # K shifted views of the padded stream, each weighted by its tap
    y = sum(padded[:, j:j + n] * weight[..., j] for j in range(k))
    if bias is not None:
        y = y + bias
    stream = padded.data[:, :k - 1 - lookahead + n]          # [past or zeros, u]
    last = stream[:, n:] if not lookahead else \
        xp.concatenate([xp.zeros((b, k - 1, *channels), dtype=u.dtype), u.data], axis=1)[:, n:]
    return y, last


def short_conv_matrix(weight, n: int, lookahead: int = 0):
    """The convolution as the matrix the module docstring calls T, one per channel: raw
    ``weight`` (*C, K) → (*C, n, n) with T[..., t, s] = w[..., s − t + K − 1 − lookahead]
    where that index lies in [0, K), else 0 (a picture, and the dense reference)."""
    xp = get_array_module(weight)
    k = weight.shape[-1]
    ar = host_xp.arange(n)
    tap = ar[None, :] - ar[:, None] + k - 1 - lookahead             # (n, n): which w_j
    inside = xp.asarray((tap >= 0) & (tap < k))
    picked = weight[..., xp.asarray(host_xp.clip(tap, 0, k - 1))]   # (*C, n, n)
    return xp.where(inside, picked, 0.0).astype(weight.dtype, copy=False)


@register("short_conv")
class ShortConvolution(RecurrentAttention):
    r"""The gated short convolution (LFM2's mixer) on the attention contract: q ⊙ (the
    convolution of k ⊙ v over time), no softmax and no score.

    Formula: the module docstring's y_t, a gate c times β plus K taps of u = b ⊙ x, with
    c = q, b = k, x = v per head channel (k and v repeated to the H query heads) and the
    kernel ``conv_weight`` w (H, D, K).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D). Hook points (besides hook_q/k/v/z, all
    (B, N, H, D)): ``hook_product`` u = k ⊙ v and ``hook_conv`` the filtered β + T u before the
    gate q, both replaceable; ``hook_state`` the last K − 1 products (B, K − 1, H, D), what
    a causal cache keeps.

    Options: ``causal`` (False; non-causal centres the taps, module docstring),
    ``kernel_size`` K (3, LFM2's), ``conv_bias`` (False: no β), ``num_kv_heads``, ``bias``
    (of the projections). Parameters: ``conv_weight`` (H, D, K), uniform in ±1/√K as
    PyTorch's ``Conv1d``; ``conv_bias`` (H, D) when asked. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState`` of K − 1 products).

    Complexity: {complexity}; decoding O(H·D·K) per token, (K − 1)·H·D numbers cached.

    Exactness: a different score function (a fixed banded filter in place of the softmax;
    tested against its own dense form ``reference``, Q ⊙ (T (K ⊙ V) + β) with T the banded
    Toeplitz matrix, and against HF's ``Lfm2ShortConv`` in PyTorch).

    Reference: Liquid AI (2025), "LFM2 Technical Report"; the product form as in Fu, Dao, Saab,
    Thomas, Rudra & Ré (2023), "Hungry Hungry Hippos", ICLR.
    """

    complexity = "time O(B·H·N·D·K), memory O(B·H·N·D)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, kernel_size: int = 3,
                 conv_bias: bool = False, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.kernel_size = validate.positive_int(kernel_size, "kernel_size", owner=self.name)
        h, d, k = self.num_heads, self.head_dim, self.kernel_size
        bound = 1.0 / math.sqrt(k)                       # PyTorch's Conv1d default range
        self.conv_weight = Parameter(active_xp().asarray(
            rng().uniform(-bound, bound, (h, d, k))).astype("float32"))
        self.conv_bias = Parameter(active_xp().zeros((h, d), dtype="float32")) \
            if validate.boolean(conv_bias, "conv_bias", owner=self.name) else None
        self.hook_product = HookPoint()      # (B, N, H, D) u = k ⊙ v
        self.hook_conv = HookPoint()         # (B, N, H, D) β + T u, before the gate q

    @property
    def lookahead(self) -> int:
        """s of the module docstring: 0 when causal, ⌊(K − 1)/2⌋ when not."""
        return 0 if self.causal else (self.kernel_size - 1) // 2

    def attend(self, q, k, v):
        out, state = self.extend(q, k, v, None)
        self.show_state(state)
        return out

    def extend(self, q, k, v, state):
        """The new tokens' outputs and the last K − 1 products, continuing ``state``."""
        h = self.num_heads
        u = F.transpose(repeat_kv(k, h) * repeat_kv(v, h), (0, 2, 1, 3))   # (B, n, H, D)
        u = self.hook_product(u)
        past = None if state is None else state.data
        filtered, last = causal_conv(u, self.conv_weight, past, self.lookahead, self.conv_bias)
        filtered = self.hook_conv(filtered)                               # (B, n, H, D)
        out = q * F.transpose(filtered, (0, 2, 1, 3))                     # (B, H, n, D)
        return out, Tensor._wrap(last)

    def reference(self, q, k, v):
        """The dense form on raw arrays: Q ⊙ (T (K ⊙ V) + β), T built by
        ``short_conv_matrix`` (module docstring). q (B, H, N, D), k/v (B, Hkv, N, D)."""
        xp = get_array_module(q)
        h, n = q.shape[1], q.shape[2]
        u = repeat_kv_array(k, h) * repeat_kv_array(v, h)                  # (B, H, N, D)
        t = short_conv_matrix(self.conv_weight.data.astype(q.dtype), n, self.lookahead)
        filtered = xp.einsum("hdts,bhsd->bhtd", t, u)                      # (B, H, N, D)
        if self.conv_bias is not None:
            filtered = filtered + self.conv_bias.data.astype(q.dtype)[None, :, None, :]
        return q * filtered

    @classmethod
    def identities(cls, seed=0):
        """Decoding agrees with the full forward, and the centred taps with the causal ones
        a token later (float64, B = 2, E = 12, H = 3, K = 4, N = 11)."""
        g = host_xp.random.default_rng(seed)
        x = g.standard_normal((2, 11, 12))
        layer = cls(12, 3, causal=True, kernel_size=4, conv_bias=True).to(dtype="float64")
        layer.conv_bias.data[...] = active_xp().asarray(g.standard_normal((3, 4)))
        with no_grad():
            full = to_host(layer(Tensor(x)).data)
            cache = layer.new_cache()
            steps = host_xp.concatenate(
                [to_host(layer(Tensor(x[:, t:t + s]), kv_cache=cache).data)
                 for t, s in ((0, 5), (5, 1), (6, 1), (7, 4))], axis=1)
            # centred taps (s = 1) read t − 2 … t + 1: the causal filter one token later
            # (q = 1, so the output is the filter itself)
            q = Tensor(active_xp().ones((1, 3, 11, 4)))
            k, v = (Tensor(active_xp().asarray(g.standard_normal((1, 3, 11, 4))))
                    for _ in range(2))
            causal = to_host(layer.attend(q, k, v).data)
            layer.causal = False
            centred = to_host(layer.attend(q, k, v).data)
        return [("decoding through a RecurrentState (a prompt of 5, then 1, 1, 4) − full "
                 "causal forward, max |Δ|", float(host_xp.abs(steps - full).max()), 1e-12),
                ("centred taps at t − causal taps at t + 1, max |Δ|",
                 float(host_xp.abs(centred[:, :, :-1] - causal[:, :, 1:]).max()), 1e-12)]

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", kernel_size={self.kernel_size}, "
                f"conv_bias={self.conv_bias is not None}")
