r"""Kimi Linear's KDA layer: Kimi Delta Attention (``attention/gated_delta.py``) inside the
projections, short convolutions and gated output of Moonshot's model, as a decoder layer type
(``layer_types=(..., "kda", ...)``).

Kimi Team (2025), "Kimi Linear: An Expressive, Efficient Attention Architecture", Moonshot AI.

For the token x_t (E numbers, after the layer's input norm), H heads of D numbers, the
depthwise causal convolution of kernel K (``conv_kernel``, 4) along the tokens, with weights
w (one row of K taps per channel), and σ the logistic sigmoid:

$$
\tilde q_t = \operatorname{SiLU}\Bigl(\sum_{j=0}^{K-1} w^{q}_{j} \odot W_q x_{t-K+1+j}\Bigr)
\quad (\text{likewise } \tilde k_t, v_t), \qquad
q_t = \frac{\tilde q_t / \sqrt{D}}{\sqrt{\lVert \tilde q_t \rVert^2 + 10^{-6}}}, \quad
k_t = \frac{\tilde k_t}{\sqrt{\lVert \tilde k_t \rVert^2 + 10^{-6}}}
$$

per head (tokens before the first count as zeros). The decay of each key channel, the write
strength and the output gate come from x_t through low-rank maps (rank D):

$$
\log \alpha_t = -e^{A_h} \operatorname{softplus}\bigl(W_f^{\uparrow} W_f^{\downarrow} x_t
+ \delta\bigr) \in (-\infty, 0]^{D}, \qquad
\beta_t = \sigma(W_\beta x_t), \qquad
g_t = \sigma\bigl(W_g^{\uparrow} W_g^{\downarrow} x_t\bigr)
$$

The memory S (D × D per head) follows KDA's recurrence (``gated_delta.py``'s module
docstring), read by q_t, and each head's read is RMS-normalised, gated and projected out:

$$
S_t = \left(I - \beta_t k_t k_t^\top\right) \operatorname{Diag}(\alpha_t) S_{t-1}
+ \beta_t k_t v_t^\top, \qquad o_t = S_t^\top q_t, \qquad
y_t = W_o \bigl[\operatorname{RMSNorm}(o_t) \odot g_t\bigr]_{h=1..H}
$$

The prompt runs chunkwise (``gated_delta.kda_chunk``, chunks of ``chunk_size`` tokens), a
decoding step is one chunk of one token started from the cached S — the recurrence itself.

**Differences from the ``kda`` attention variant** (which keeps the paper's core inside
``attend(q, k, v)``): α, β and the gate read x_t (here) rather than the raw key head; the
short convolutions, the output gate and the gated RMSNorm are here, not there; τ = 1/√D and
ε = 10⁻⁶ are fixed, as in HuggingFace's ``KimiLinearDeltaAttention``.

**Differences from HuggingFace's model.** HF computes the layer in float32 even in a float64
model (its comments: the states are sensitive to rounding); minitx computes in the model's
dtype. Padding (``attention_mask`` 0) zeroes the layer's input at those tokens, as HF does,
but on every forward: HF skips it on one-token steps (a generated token is never padding),
which changes nothing for masks that ``generate`` builds. Its softplus switches to the
identity above 20 (a difference below 2·10⁻⁹); its chunks are 64 tokens (rounding only).
"""
from __future__ import annotations

import math

from ... import functional as F
from ... import validate
# the rule itself is the registry variant's (proven there); this layer adds what Kimi puts
# around it
from ...attention.base import hooked_heads
from ...attention.delta_rule import _unit_rows
from ...attention.gated_delta import kda_chunk, run_gated_chunks
from ...attention.retention import RecurrentState
from ...backend import host_xp, rng, xp as active_xp
from ...nn.decoder_layers import DecoderRMSNorm
from ...nn.hooks import HookPoint
from ...nn.layers import Linear
from ...nn.module import Module, Parameter
from ...ops.sdpa import split_heads
from . import register_mixer
from .gated_deltanet import CausalConv1d          # the same convolution as gated DeltaNet's

__all__ = ["KimiDeltaLayer", "KDACache", "CausalConv1d", "kda_options"]

# HuggingFace's (and flash-linear-attention's) fixed numbers: the ε of the unit q and k.
L2_EPS = 1e-6
OPTIONS = ("num_heads", "head_dim", "conv_kernel", "chunk_size")


def kda_options(c) -> dict:
    """``DecoderConfig.mixer_options["kda"]`` checked, the defaults filled in: ``num_heads``
    (default the config's H), ``head_dim`` (its D), ``conv_kernel`` K (4), ``chunk_size``
    (16)."""
    who = "DecoderConfig.mixer_options['kda']"
    given = dict(c.mixer_options.get("kda") or {})
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise validate.unknown_options(unknown, OPTIONS, owner=who)
    o = {"num_heads": c.num_heads, "head_dim": c.head_dim, "conv_kernel": 4, "chunk_size": 16,
         **given}
    return {k: validate.positive_int(o[k], k, owner=who) for k in OPTIONS}


class KDACache(RecurrentState):
    """A KDA layer's decode cache: the memory S (B, H, D, D) (``state``) and the last K − 1
    inputs of each of the q, k, v convolutions (``conv``, three (B, K − 1, H·D) arrays), the
    same size after 1 token or 10 000. ``len()`` is the tokens seen; raw arrays (no
    gradient)."""

    def reset(self) -> None:
        super().reset()
        self.conv = None

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(int(a.nbytes) for a in (self.conv or ()))


@register_mixer("kda")
class KimiDeltaLayer(Module):
    """Kimi Linear's KDA layer (module docstring's formulas), a decoder layer type.
    x (B, N, E) → (B, N, E); H = ``num_heads`` heads of D = ``head_dim`` (``kda_options``).

    Parameters, by HuggingFace's checkpoint names: ``q_proj``, ``k_proj``, ``v_proj``
    (E → H·D), ``q_conv1d``/``k_conv1d``/``v_conv1d.weight`` (H·D, 1, K), ``f_a_proj``
    (E → D), ``f_b_proj`` (D → H·D), ``dt_bias`` δ (H·D,), ``A_log`` (1, 1, H, 1),
    ``b_proj`` (E → H), ``g_a_proj`` (E → D), ``g_b_proj`` (D → H·D), ``o_norm.weight`` (D,)
    (eps the config's ``norm_eps``), ``o_proj`` (H·D → E). Hook points: ``hook_q``,
    ``hook_k``, ``hook_v`` (B, N, H, D) after the convolution (before the unit norm);
    ``hook_log_alpha`` log α (B, H, N, D) and ``hook_beta`` β (B, H, N), replaceable;
    ``hook_state`` S after the last token (B, H, D, D); ``hook_z`` the memory's read o
    (B, N, H, D); ``hook_gate`` g (B, N, H, D). ``new_cache()`` → ``KDACache``.
    ``forward(x, kv_cache, keep, positions)``: ``keep`` (B, cached + N) bool zeroes the
    padding tokens' inputs; ``positions`` is unused (no positions in KDA).

    Cost: O(B·N·H·(C·D + D²)) time (chunks of C), decoding O(H·D²) per token; the cache
    H·D² + 3·(K − 1)·H·D numbers per sequence whatever its length.
    """

    def __init__(self, c, index: int = 0):
        super().__init__()
        o = kda_options(c)
        e, h, d, kernel = c.hidden_size, o["num_heads"], o["head_dim"], o["conv_kernel"]
        self.num_heads, self.head_dim, self.chunk_size = h, d, o["chunk_size"]
        self.q_proj, self.k_proj, self.v_proj = (Linear(e, h * d, bias=False) for _ in "qkv")
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (CausalConv1d(h * d, kernel)
                                                       for _ in "qkv")
        # the decay: low rank (E → D → H·D), a bias per channel, a rate e^A per head; the
        # official initialisation (e^A uniform in [1, 16], softplus(δ) log-uniform in
        # [0.001, 0.1])
        self.f_a_proj, self.f_b_proj = Linear(e, d, bias=False), Linear(d, h * d, bias=False)
        g = rng()
        dt = host_xp.exp(g.uniform(math.log(1e-3), math.log(1e-1), h * d))
        self.dt_bias = Parameter(active_xp().asarray(dt + host_xp.log(-host_xp.expm1(-dt)))
                                 .astype("float32"))
        self.A_log = Parameter(active_xp().asarray(host_xp.log(g.uniform(1, 16, (1, 1, h, 1))))
                               .astype("float32"))
        # the write strength, and the output gate (low rank) with its per-head norm
        self.b_proj = Linear(e, h, bias=False)
        self.g_a_proj, self.g_b_proj = Linear(e, d, bias=False), Linear(d, h * d, bias=False)
        self.o_norm = DecoderRMSNorm(d, eps=c.norm_eps)
        self.o_proj = Linear(h * d, e, bias=False)
        for name in ("q", "k", "v", "log_alpha", "beta", "state", "z", "gate"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self) -> KDACache:
        return KDACache()

    @classmethod
    def parameter_count(cls, c) -> int:
        o = kda_options(c)
        e, h, d, kernel = c.hidden_size, o["num_heads"], o["head_dim"], o["conv_kernel"]
        hd = h * d
        return (3 * e * hd + 3 * hd * kernel            # q, k, v and their convolutions
                + 2 * (e * d + d * hd) + hd + h         # decay and gate (low rank), δ, A
                + e * h + d + hd * e)                   # β, the norm, the output

    @classmethod
    def state_numbers(cls, c, tokens: int) -> int:
        o = kda_options(c)
        h, d = o["num_heads"], o["head_dim"]
        return h * d * d + 3 * (o["conv_kernel"] - 1) * h * d

    def _conv(self, conv, x, past):
        y, last = conv(x, past)
        return F.silu(y), last

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); with a ``KDACache`` the tokens follow the cached ones."""
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        if keep is not None:                          # padding tokens write nothing new
            x = x * keep[:, -n:, None].astype(x.dtype)
        # q, k, v: project, convolve over the last K tokens (the cache's before these), SiLU
        past = (None,) * 3 if kv_cache is None or kv_cache.conv is None else kv_cache.conv
        (q, pq), (k, pk), (v, pv) = (
            self._conv(conv, proj(x), p) for conv, proj, p in
            ((self.q_conv1d, self.q_proj, past[0]), (self.k_conv1d, self.k_proj, past[1]),
             (self.v_conv1d, self.v_proj, past[2])))
        q, k, v = (hooked_heads(hk, split_heads(t, h)) for hk, t in
                   ((self.hook_q, q), (self.hook_k, k), (self.hook_v, v)))  # (B, H, N, D)
        q, k = _unit_rows(q, L2_EPS) * (1.0 / math.sqrt(d)), _unit_rows(k, L2_EPS)
        # the decay per key channel and the write strength, from x
        f = F.reshape(self.f_b_proj(self.f_a_proj(x)) + self.dt_bias, (b, n, h, d))
        log_alpha = -F.exp(self.A_log) * F.softplus(f)                  # (B, N, H, D)
        log_alpha = self.hook_log_alpha(F.swapaxes(log_alpha, 1, 2))    # (B, H, N, D)
        beta = self.hook_beta(F.swapaxes(F.sigmoid(self.b_proj(x)), 1, 2))     # (B, H, N)
        # KDA from the cached memory (or zero), chunk by chunk
        state = None if kv_cache is None else kv_cache.tensor()
        out, state = run_gated_chunks(kda_chunk, q, k, v, beta, log_alpha, state,
                                      self.chunk_size)
        state = self.hook_state(state)
        if kv_cache is not None:
            kv_cache.update(state, n)
            kv_cache.conv = (pq, pk, pv)
        # each head's read: RMS-normalised, gated, then all heads projected back to E
        z = F.swapaxes(hooked_heads(self.hook_z, out), 1, 2)            # (B, N, H, D)
        gate = self.hook_gate(F.sigmoid(
            F.reshape(self.g_b_proj(self.g_a_proj(x)), (b, n, h, d))))
        return self.o_proj(F.reshape(self.o_norm(z) * gate, (b, n, h * d)))

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"conv_kernel={self.q_conv1d.kernel}, chunk_size={self.chunk_size}")
