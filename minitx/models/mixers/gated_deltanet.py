r"""Qwen3-Next's linear-attention layer: the gated delta rule behind a short causal
convolution, read out through a gated RMSNorm — layer type ``"gated_deltanet"``; Qwen3.5's
and OLMo-Hybrid's are the same layer with other projection layouts and options (below).

Qwen Team (2025), "Qwen3-Next"; Yang, Kautz & Hatamizadeh (2025), "Gated Delta Networks:
Improving Mamba2 with Delta Rule" (ICLR); Grazzi et al. (2025), "Unlocking State-Tracking in
Linear RNNs Through Negative Eigenvalues" (ICLR) for β up to 2. HuggingFace's
``Qwen3NextGatedDeltaNet`` is the oracle for every detail below (``Qwen3_5GatedDeltaNet`` and
``OlmoHybridGatedDeltaNet`` for the options).

For each token x_t (E), with H_k key heads of D_k dims and H_v = r·H_k value heads of D_v:

**Projections.** One matrix gives q, k (per key head), v and the output gate z (per value
head); another the write strength's and the decay's inputs b, a (per value head):

$$
[\tilde q_t, \tilde k_t, \tilde v_t, z_t] = W_{qkvz}\, x_t, \qquad [b_t, a_t] = W_{ba}\, x_t
$$

**A causal depthwise convolution** of kernel K over the channels c = [q̃, k̃, ṽ] (each
channel its own K weights w_c, the K − 1 tokens before t zero at the start), then SiLU:

$$
u_{t,c} = \operatorname{silu}\Bigl(\sum_{j=0}^{K-1} w_{c,j}\, \tilde x_{t-K+1+j,\,c}\Bigr)
$$

**The gated delta rule** (``attention/gated_delta.py``, its maths called, not re-derived),
per value head h reading key head ⌊h/r⌋, on unit q and k (k = u^k/√(‖u^k‖² + ε), ε = 10⁻⁶)
and τ = 1/√D_k, with the state S (D_v × D_k):

$$
\beta_t = s\,\sigma(b_t), \qquad
\log \alpha_t = -e^{A_h} \operatorname{softplus}(a_t + \delta_h), \qquad
S_t = \alpha_t S_{t-1}\left(I - \beta_t k_t k_t^\top\right) + \beta_t v_t k_t^\top, \qquad
o_t = \tau\, S_t q_t
$$

with s = 1 (β ∈ [0, 1]: each write a projection) or, with ``allow_neg_eigval``, s = 2 (β ∈
[0, 2]: I − β k kᵀ may have the eigenvalue 1 − β < 0, which lets the state track parity-like
counts; OLMo-Hybrid's).

**The gated RMSNorm and the output**, per value head, with a plain gain g (D_v):

$$
y_t = W_o \bigl[\operatorname{RMSNorm}_g(o_t) \odot \operatorname{silu}(z_t)\bigr]_{h}
$$

**Where it differs from the paper's layer and from ``gated_delta.GatedDeltaNet``:** β and α
come from x through W_ba (the registry variant reads them from the key head); the value heads
outnumber the key heads (each key head is shared by r value heads, where the variant shares
key/value heads among query heads); the convolution, the output gate z and the gated norm
are added around the rule.

**Projection layouts** (``projections``), each HuggingFace's, so its tensors load unchanged.
``"fused"`` (Qwen3-Next): W_qkvz's rows come in groups of one key head, [q̃ (D_k), k̃ (D_k),
ṽ (r·D_v), z (r·D_v)], and W_ba's as [b (r), a (r)] per key head. ``"split"`` (Qwen3.5; OLMo-
Hybrid's q, k, v projections stacked): four matrices, W_qkv's rows [q̃ (H_k·D_k), k̃ (H_k·D_k),
ṽ (H_v·D_v)] in the convolution's channel order, then W_z, W_b, W_a. The same maths and the
same number of parameters either way.

**Padding.** As HF does, the inputs x_t of padding tokens (0 in ``attention_mask``) are zeroed
before the projections: a left-padded prompt then leaves the convolution and the state as
they start (zero), so its real tokens see no trace of the padding. HF skips this for a
one-token step (a generated token is never padding); here it is applied whenever a mask is
given, so a cached step equals the full forward under the same mask.

**Decoding.** The cache keeps the last K − 1 convolution inputs and S: constant in size,
whatever the number of tokens. The prompt runs chunkwise (chunks of ``chunk_size``), a step
of one token is the recurrence's step (a chunk of one); the two are the same maths
(``gated_delta.py``'s identities). HF computes the rule and the gated norm in float32 even
in a float64 model (about 10⁻⁷ relative); minitx in the model's dtype.
"""
from __future__ import annotations

import math

from ... import backend, validate
from ... import functional as F
from ...attention.base import hooked_heads, repeat_kv
from ...attention.delta_rule import _unit_rows
from ...attention.gated_delta import gated_delta_chunk, run_gated_chunks
from ...attention.short_conv import causal_conv
from ...autograd.tensor import Tensor
from ...nn.decoder_layers import DecoderRMSNorm
from ...nn.hooks import HookPoint
from ...nn.layers import Linear
from ...nn.module import Module, Parameter
from . import given_options, register_mixer

__all__ = ["GatedDeltaNetMixer", "GatedDeltaNetCache", "CausalConv1d", "OPTIONS"]

# The options of DecoderConfig.mixer_options["gated_deltanet"] and their defaults
# (None: from the attention's sizes — H_k = num_kv_heads, H_v = num_heads, D_k = D_v = D;
# norm_eps None: the config's norm_eps).
OPTIONS = {"num_k_heads": None, "num_v_heads": None, "head_k_dim": None, "head_v_dim": None,
           "conv_kernel": 4, "chunk_size": 64, "l2norm_eps": 1e-6, "projections": "fused",
           "allow_neg_eigval": False, "norm_eps": None}
PROJECTIONS = ("fused", "split")


def mixer_options(c) -> dict:
    """``c.mixer_options["gated_deltanet"]`` checked, the defaults filled in."""
    o, who = given_options(c, "gated_deltanet", OPTIONS)
    # head counts and sizes default to the attention layers' (Hkv, H, D)
    for name, default in (("num_k_heads", c.num_kv_heads), ("num_v_heads", c.num_heads),
                          ("head_k_dim", c.head_dim), ("head_v_dim", c.head_dim)):
        o[name] = default if o[name] is None else validate.positive_int(o[name], name,
                                                                        owner=who)
    # each key head is repeated for a group of value heads, as GQA's keys for its queries
    if o["num_v_heads"] % o["num_k_heads"]:
        raise validate.OptionError(f"{who}: num_v_heads ({o['num_v_heads']}) must be a "
                                   f"multiple of num_k_heads ({o['num_k_heads']})")
    o["conv_kernel"] = validate.positive_int(o["conv_kernel"], "conv_kernel", owner=who)
    o["chunk_size"] = validate.positive_int(o["chunk_size"], "chunk_size", owner=who)
    o["l2norm_eps"] = validate.positive_real(o["l2norm_eps"], "l2norm_eps", owner=who)
    validate.choice(o["projections"], "projections", PROJECTIONS, owner=who)
    validate.boolean(o["allow_neg_eigval"], "allow_neg_eigval", owner=who)
    o["norm_eps"] = c.norm_eps if o["norm_eps"] is None else \
        validate.positive_real(o["norm_eps"], "norm_eps", owner=who)
    return o


class GatedDeltaNetCache:
    """A gated DeltaNet layer's decoding cache: ``conv`` the last K − 1 convolution inputs
    (B, K − 1, C) and ``state`` S (B, H_v, D_k, D_v) (stored as Sᵀ), raw arrays (None before
    the first token); ``len()`` the tokens seen. Constant in size. Inference only: no
    gradient flows through it."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget every token seen."""
        self.conv = self.state = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.conv, self.state) if a is not None)

    def __repr__(self) -> str:
        shape = None if self.state is None else tuple(self.state.shape)
        return f"GatedDeltaNetCache(tokens={self.length}, state={shape})"


class CausalConv1d(Module):
    """A causal depthwise convolution over time (module docstring's u before the SiLU):
    each of C channels its own K weights, output t reading inputs t − K + 1 … t
    (``attention.short_conv.causal_conv``, whose docstring states it).

    ``forward(x (B, N, C), past=None)`` → (y (B, N, C), the last K − 1 inputs (B, K − 1, C)
    as a raw array); ``past`` the K − 1 inputs before x (None: zeros). Parameters ``weight``
    (C, 1, K), PyTorch's ``Conv1d(groups=C)`` layout, and ``bias`` (C) when ``bias``.
    Time O(B·N·C·K).
    """

    def __init__(self, channels: int, kernel: int, bias: bool = False):
        super().__init__()
        self.kernel = kernel
        g = backend.rng()
        bound = 1.0 / math.sqrt(kernel)                  # PyTorch's Conv1d default range
        self.weight = Parameter(backend.xp().asarray(
            g.uniform(-bound, bound, (channels, 1, kernel))).astype(backend.default_float()))
        self.bias = Parameter(backend.xp().asarray(g.uniform(-bound, bound, channels))
                              .astype(backend.default_float())) if bias else None

    def forward(self, x, past=None):
        c = x.shape[-1]
        return causal_conv(x, F.reshape(self.weight, (c, self.kernel)), past, bias=self.bias)


@register_mixer("gated_deltanet")
class GatedDeltaNetMixer(Module):
    r"""Qwen3-Next's gated DeltaNet layer (module docstring). x (B, N, E) → (B, N, E).

    Options (``DecoderConfig.mixer_options["gated_deltanet"]``, ``OPTIONS``):
    ``num_k_heads`` H_k and ``num_v_heads`` H_v (a multiple of H_k), ``head_k_dim`` D_k,
    ``head_v_dim`` D_v, ``conv_kernel`` K (4), ``chunk_size`` (64, the prompt's chunks),
    ``l2norm_eps`` (1e-6, in q's and k's unit norm), ``projections`` ("fused" or "split",
    the module docstring's layouts), ``allow_neg_eigval`` (False; True: β = 2σ(b)),
    ``norm_eps`` (the gated norm's eps; None: the config's ``norm_eps``). Parameters under
    HF's names: ``in_proj_qkvz`` (E → 2·H_k·D_k + 2·H_v·D_v) and ``in_proj_ba`` (E → 2·H_v),
    or split, ``in_proj_qkv`` (E → C), ``in_proj_z`` (E → H_v·D_v), ``in_proj_b`` and
    ``in_proj_a`` (E → H_v); ``conv1d.weight`` (C, 1, K) with C = 2·H_k·D_k + H_v·D_v,
    ``A_log`` and ``dt_bias`` δ (H_v,), ``norm.weight`` g (D_v,), ``out_proj`` (H_v·D_v → E).

    Hook points: ``hook_q``/``hook_k`` (B, N, H_v, D_k) (TransformerLens's layout, as the
    attention layers'; unit, after the convolution, τ in q; each key head repeated for its r
    value heads) and ``hook_v`` (B, N, H_v, D_v);
    ``hook_beta`` β and ``hook_log_alpha`` log α (≤ 0) (B, H_v, N), replaceable;
    ``hook_state`` S after the last token (B, H_v, D_k, D_v); ``hook_out_gate`` z (B, N, H_v,
    D_v) before its SiLU; ``hook_z`` the gated, normalised heads before ``out_proj`` (B, N,
    H_v, D_v). ``attention_mask`` zeroes padding tokens' inputs (module docstring).

    Cost: time O(B·N·(E·(H_k·D_k + H_v·D_v) + H_v·(C·D_k + D_k·D_v))) with chunks of C;
    decoding O(H_v·D_k·D_v) a token; the cache (C·(K − 1) + H_v·D_k·D_v) numbers per batch
    row, whatever the length.
    """

    def __init__(self, c, index: int = 0):
        super().__init__()
        o = self.options = mixer_options(c)
        e = c.hidden_size
        hk, hv, dk, dv = o["num_k_heads"], o["num_v_heads"], o["head_k_dim"], o["head_v_dim"]
        self.sizes = (hk, hv, dk, dv)
        self.chunk_size = o["chunk_size"]
        self.scale = 1.0 / math.sqrt(dk)
        self.split_projections = o["projections"] == "split"
        self.beta_scale = 2.0 if o["allow_neg_eigval"] else 1.0
        if self.split_projections:          # Qwen3.5's four matrices
            self.in_proj_qkv = Linear(e, 2 * hk * dk + hv * dv, bias=False)
            self.in_proj_z = Linear(e, hv * dv, bias=False)
            self.in_proj_b = Linear(e, hv, bias=False)
            self.in_proj_a = Linear(e, hv, bias=False)
        else:                               # Qwen3-Next's two, grouped by key head
            self.in_proj_qkvz = Linear(e, 2 * hk * dk + 2 * hv * dv, bias=False)
            self.in_proj_ba = Linear(e, 2 * hv, bias=False)
        self.conv1d = CausalConv1d(2 * hk * dk + hv * dv, o["conv_kernel"])
        # HF's initialisation: δ = 1, e^A uniform in [0.01, 16]
        g, xp, dt = backend.rng(), backend.xp(), backend.default_float()
        self.dt_bias = Parameter(xp.ones((hv,), dtype=dt))
        self.A_log = Parameter(xp.asarray(backend.host_xp.log(g.uniform(0.01, 16, hv)))
                               .astype(dt))
        self.norm = DecoderRMSNorm(dv, eps=o["norm_eps"])
        self.out_proj = Linear(hv * dv, e, bias=False)
        for name in ("q", "k", "v", "beta", "log_alpha", "state", "out_gate", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """An empty ``GatedDeltaNetCache``."""
        return GatedDeltaNetCache()

    @classmethod
    def parameter_count(cls, c) -> int:
        """The parameters of one layer, from the configuration alone."""
        o = mixer_options(c)
        hk, hv, dk, dv = o["num_k_heads"], o["num_v_heads"], o["head_k_dim"], o["head_v_dim"]
        e, conv = c.hidden_size, 2 * hk * dk + hv * dv
        return (e * (2 * hk * dk + 2 * hv * dv) + e * 2 * hv + conv * o["conv_kernel"]
                + 2 * hv + dv + hv * dv * e)

    @classmethod
    def state_numbers(cls, c, tokens: int) -> int:
        """Numbers in one layer's cache per batch row: the K − 1 convolution inputs and S
        (none before the first token)."""
        o = mixer_options(c)
        hk, hv, dk, dv = o["num_k_heads"], o["num_v_heads"], o["head_k_dim"], o["head_v_dim"]
        return 0 if tokens == 0 else \
            (2 * hk * dk + hv * dv) * (o["conv_kernel"] - 1) + hv * dk * dv

    def _split(self, x):
        """x (B, N, E) → the convolution's channels [q̃, k̃, ṽ] (B, N, C), z (B, N, H_v, D_v),
        b and a (B, N, H_v), from either of HF's layouts (module docstring)."""
        bsz, n, _ = x.shape
        hk, hv, dk, dv = self.sizes
        if self.split_projections:
            return (self.in_proj_qkv(x), F.reshape(self.in_proj_z(x), (bsz, n, hv, dv)),
                    self.in_proj_b(x), self.in_proj_a(x))
        r = hv // hk
        p = F.reshape(self.in_proj_qkvz(x), (bsz, n, hk, 2 * dk + 2 * r * dv))
        q, k = p[..., :dk], p[..., dk:2 * dk]
        v, z = p[..., 2 * dk:2 * dk + r * dv], p[..., 2 * dk + r * dv:]
        ba = F.reshape(self.in_proj_ba(x), (bsz, n, hk, 2 * r))
        mixed = F.concatenate([F.reshape(q, (bsz, n, hk * dk)), F.reshape(k, (bsz, n, hk * dk)),
                               F.reshape(v, (bsz, n, hv * dv))], axis=-1)
        return (mixed, F.reshape(z, (bsz, n, hv, dv)), F.reshape(ba[..., :r], (bsz, n, hv)),
                F.reshape(ba[..., r:], (bsz, n, hv)))

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` (B, cached + N) bool, False = padding (its
        input zeroed); ``positions`` unused (no positions in a recurrence)."""
        bsz, n, _ = x.shape
        hk, hv, dk, dv = self.sizes
        if keep is not None:
            x = x * keep[:, -n:, None].astype(x.dtype)
        mixed, z, b, a = self._split(x)
        # the short convolution (continuing the cached inputs), SiLU, then the heads
        past = None if kv_cache is None else kv_cache.conv
        mixed, last_inputs = self.conv1d(mixed, past)
        mixed = F.silu(mixed)
        q, k, v = (F.transpose(F.reshape(mixed[..., lo:hi], (bsz, n, h, d)), (0, 2, 1, 3))
                   for lo, hi, h, d in ((0, hk * dk, hk, dk), (hk * dk, 2 * hk * dk, hk, dk),
                                        (2 * hk * dk, 2 * hk * dk + hv * dv, hv, dv)))
        eps = self.options["l2norm_eps"]
        q = hooked_heads(self.hook_q, repeat_kv(_unit_rows(q, eps) * self.scale, hv))
        k = hooked_heads(self.hook_k, repeat_kv(_unit_rows(k, eps), hv))  # (B, H_v, N, D_k)
        v = hooked_heads(self.hook_v, v)                                  # (B, H_v, N, D_v)
        # the write strength and the decay, per value head (B, H_v, N)
        beta = self.hook_beta(F.transpose(F.sigmoid(b) * self.beta_scale, (0, 2, 1)))
        rate = F.reshape(F.exp(self.A_log), (1, 1, hv))
        log_alpha = -rate * F.softplus(a + F.reshape(self.dt_bias, (1, 1, hv)))
        log_alpha = self.hook_log_alpha(F.transpose(log_alpha, (0, 2, 1)))
        # the gated delta rule from the cached state: chunkwise, or one token's step
        state = None if kv_cache is None or kv_cache.state is None else \
            Tensor._wrap(kv_cache.state)
        out, state = run_gated_chunks(gated_delta_chunk, q, k, v, beta, log_alpha, state,
                                      self.chunk_size)
        state = self.hook_state(state)
        if kv_cache is not None:
            kv_cache.conv, kv_cache.state = last_inputs, state.data
            kv_cache.length += n
        # each head normalised, gated by silu(z), then mixed back to E
        o = self.norm(F.transpose(out, (0, 2, 1, 3)))                     # (B, N, H_v, D_v)
        o = self.hook_z(o * F.silu(self.hook_out_gate(z)))
        return self.out_proj(F.reshape(o, (bsz, n, hv * dv)))

    def extra_repr(self) -> str:
        hk, hv, dk, dv = self.sizes
        return (f"num_k_heads={hk}, num_v_heads={hv}, head_k_dim={dk}, head_v_dim={dv}, "
                f"conv_kernel={self.conv1d.kernel}, chunk_size={self.chunk_size}, "
                f"projections={self.options['projections']!r}, "
                f"allow_neg_eigval={self.options['allow_neg_eigval']}")
