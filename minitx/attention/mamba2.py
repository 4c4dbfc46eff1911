r"""The Mamba-2 layer: a short convolution, the selective state-space model of ``ssd.py`` with
Mamba-2's own step Δ and skip D, and a gated RMSNorm — the token mixer of Mamba-2 and of the
Mamba layers of Nemotron-H.

Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality"; NVIDIA (2025), "Nemotron-H: A Family of Accurate and Efficient
Hybrid Mamba-Transformer Models". HuggingFace's ``NemotronHMamba2Mixer`` (and ``Mamba2Mixer``)
is the oracle for every detail below.

For each token x_t (E), with H heads of P channels, G groups (H/G heads each) of state size
N_s and a convolution of K taps:

**One projection** gives the gate z, the SSM's input x̃ and its maps B̃, C̃ (one per group),
and the step's input δ (one per head):

$$
\bigl[z_t,\ \tilde x_t,\ \tilde B_t,\ \tilde C_t,\ \delta_t\bigr] = W_{in}\, x_t,
\qquad z_t, \tilde x_t \in \mathbb{R}^{HP},\ \tilde B_t, \tilde C_t \in \mathbb{R}^{G N_s},
\ \delta_t \in \mathbb{R}^{H}
$$

**A causal depthwise convolution** over the channels u = [x̃, B̃, C̃] (each channel c its own K
weights w_c and a bias β_c; the K − 1 inputs before the first token are zero), then SiLU:

$$
\bigl[x_t,\ B_t,\ C_t\bigr] = \operatorname{silu}\Bigl(\beta + \sum_{j=0}^{K-1}
w_j \odot u_{t-K+1+j}\Bigr)
$$

**The selective SSM**, per head h reading group g = ⌊h G / H⌋ (x_{t,h} (P), B_{t,g},
C_{t,g} (N_s), the state h_t (N_s × P)), with a step Δ and a decay per head and token:

$$
\Delta_{t,h} = \operatorname{clip}\bigl(\operatorname{softplus}(\delta_{t,h} + b_h),
\ \Delta_{\min}, \Delta_{\max}\bigr), \qquad A_h = -e^{A^{\log}_h}
$$

$$
h_t = e^{\Delta_{t,h} A_h}\, h_{t-1} + \Delta_{t,h}\, B_{t,g}\, x_{t,h}^\top, \qquad
y_{t,h} = h_t^\top C_{t,g} + D_h\, x_{t,h}
$$

(h_0 = 0). That is ``ssd.py``'s recurrence with a_t = e^{Δ_t A_h} and B̄_t = Δ_t B_t, computed
by its masked-attention (dual) form Y = (L ⊙ C B̄ᵀ) X chunk by chunk (``retention.py``'s
``decayed_chunk``, the state passed between chunks), plus the skip D X.

**The gated RMSNorm and the output.** The heads' outputs y_t (HP), gated by SiLU(z_t), are
normalised in G groups of HP/G channels (each group's own root mean square), scaled by a gain
g (HP) and projected back:

$$
u_t = y_t \odot \operatorname{silu}(z_t), \qquad
o_t = W_{out}\Bigl[\, g \odot \frac{u_{t,[j]}}{\sqrt{\operatorname{mean}(u_{t,[j]}^2)
+ \varepsilon}} \Bigr]_{j=1}^{G}
$$

**Shapes.** x (B, N, E) → (B, N, E); the heads X (B, H, N, P), B and C (B, G, N, N_s), Δ
(B, H, N); the state (B, H, N_s, P) (HF keeps its transpose, (B, H, P, N_s)).

**Complexity.** Projections O(B·N·E·(2HP + 2G·N_s + H)); the convolution O(B·N·(HP + 2G·N_s)·K);
the SSM in chunks of Q tokens O(B·H·N·Q·(N_s + P) + B·H·N·N_s·P) time and O(B·H·N·Q) memory
(Q = N, one chunk: the quadratic form, O(B·H·N²) memory). Decoding O(E·(HP + G·N_s) + H·N_s·P) a
token.

**The cache** keeps the last K − 1 convolution inputs, (K − 1)(HP + 2G·N_s) numbers, and the state
h, H·N_s·P numbers, per batch row: the same size after one token or a million.

**Differences from HF.** HF computes the SSM, the decay and the gated norm in float32 even in
a float64 model (minitx in the model's dtype), and Nemotron-H clamps Δ from below
(``time_step_min``) in a prompt's chunked form but not in its one-token decoding step; minitx
clamps at both. Torch's softplus returns its input above 20 (off by at most e^{−20} there).

**Non-causal** (``causal=False``, the registry variant only) is minitx's extension: the
convolution's taps centred on the token (``short_conv.py``'s) and the SSM's symmetric mask
(``ssd.py``'s).
"""
from __future__ import annotations

import math
from functools import partial

from .. import functional as F
from .. import validate
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, rng, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from ..nn.layers import Linear
from ..nn.module import Module, Parameter
from .base import hooked_heads, merge_heads, register, repeat_kv, repeat_kv_array, split_heads
# the SSM is retention's decayed attention run in chunks, the state passed between them
from .retention import RecurrentAttention, RecurrentState, decayed_chunk, run_in_chunks
from .short_conv import causal_conv

__all__ = ["time_steps", "selective_ssm", "GatedRMSNorm", "Mamba2State", "Mamba2",
           "check_time_step_limit"]


def check_time_step_limit(value, owner: str) -> tuple:
    """(Δ_min, Δ_max) checked: 0 ≤ Δ_min < Δ_max ≤ ∞ (HF's ``time_step_limit``)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise validate.OptionError(f"{owner}: time_step_limit must be a pair (min, max), got "
                                   f"{value!r}")
    lo = validate.real(value[0], "time_step_limit[0]", minimum=0.0, owner=owner)
    hi = validate.real(value[1], "time_step_limit[1]", minimum=lo, min_open=True,
                       finite=False, owner=owner)
    return lo, hi


def time_steps(dt, dt_bias, limit=(0.0, math.inf)):
    """The module docstring's Δ = clip(softplus(δ + b), Δ_min, Δ_max): dt δ (B, H, N), dt_bias
    b (H,) → (B, H, N). The clip runs only where a bound is set (softplus is already ≥ 0)."""
    delta = F.softplus(dt + F.reshape(dt_bias, (1, -1, 1)))
    lo, hi = limit
    if lo > 0.0 or hi < math.inf:
        delta = F.clip(delta, lo if lo > 0.0 else None, hi if hi < math.inf else None)
    return delta


def selective_ssm(c, b, x, delta, a_log, skip, state=None, chunk_size=None, causal=True,
                  hook_decay=None, hook_pattern=None):
    r"""Mamba-2's SSM on heads (module docstring): the recurrence of ``ssd.py`` with the decay
    log a_t = Δ_t A_h, the input map B̄_t = Δ_t B_t, and the skip D x.

    c, b: C and B (B, Gc, N, N_s) and (B, Gb, N, N_s), each head count dividing H (every head
    reads its group's, as ``repeat_kv``); x (B, Gx, N, P), repeated to H the same way; delta Δ
    (B, H, N); a_log A^log and skip D (H,); state the (B, H, N_s, P) state before the tokens
    (None: zero). ``chunk_size`` Q (None: one chunk, the quadratic form); ``causal=False`` the
    symmetric mask (no state before). ``hook_decay`` / ``hook_pattern``: HookPoints that see,
    and may replace, L and L ⊙ C B̄ᵀ (with either, one chunk). Returns (y (B, H, N, P), the
    state after the last token (B, H, N_s, P)). Time O(B·H·N·Q·(N_s + P)), memory O(B·H·N·Q).
    """
    h = delta.shape[1]
    c, b, x = repeat_kv(c, h), repeat_kv(b, h), repeat_kv(x, h)
    log_a = delta * F.reshape(-F.exp(a_log), (1, -1, 1))            # (B, H, N): Δ_t A_h
    b_bar = b * F.expand_dims(delta, -1)                             # Δ_t B_t
    hooked = hook_decay is not None or hook_pattern is not None
    chunk = partial(decayed_chunk, hook_decay=hook_decay, hook_pattern=hook_pattern)
    if causal:
        y, state = run_in_chunks(chunk, c, b_bar, x, log_a, state,
                                 None if hooked else chunk_size)
    else:
        y, state = chunk(c, b_bar, x, log_a, None, causal=False)
    return y + x * F.reshape(skip, (1, -1, 1, 1)), state


class GatedRMSNorm(Module):
    """The module docstring's gated RMSNorm: ``norm(y, z)`` = g ⊙ RMSNorm(y ⊙ silu(z)) over G
    groups of C/G channels (HF's ``MambaRMSNormGated`` with ``group_size`` C/G; the gate
    before the norm). y, z (…, C) → (…, C). Parameter ``weight`` g (C,), ones. O(C) a token.
    """

    def __init__(self, channels: int, groups: int = 1, eps: float = 1e-6):
        super().__init__()
        who = "GatedRMSNorm"
        self.channels = validate.positive_int(channels, "channels", owner=who)
        self.groups = validate.positive_int(groups, "groups", owner=who)
        if channels % groups:
            raise validate.OptionError(f"{who}: channels ({channels}) must be divisible by "
                                       f"groups ({groups})")
        self.eps = validate.positive_real(eps, "eps", owner=who)
        self.weight = Parameter(active_xp().ones((channels,), dtype="float32"))

    def forward(self, y, z):
        u = y * F.silu(z)                                                # (…, C)
        size = self.channels // self.groups
        grouped = F.reshape(u, (*u.shape[:-1], self.groups, size))      # (…, G, C/G)
        normed = F.rms_norm(grouped, (size,), None, self.eps)
        return F.reshape(normed, tuple(u.shape)) * self.weight

    def extra_repr(self) -> str:
        return f"{self.channels}, groups={self.groups}, eps={self.eps}"


class Mamba2State(RecurrentState):
    """A Mamba-2 layer's decode cache: ``state`` the SSM state (B, H, N_s, P) and ``conv`` the
    last K − 1 convolution inputs (B, K − 1, HP + 2G·N_s), raw arrays (None before the first
    token); ``len()`` the tokens seen. Constant in size; inference only (no gradient flows
    through it)."""

    def reset(self) -> None:
        super().reset()
        self.conv = None

    @property
    def nbytes(self) -> int:
        return super().nbytes + (0 if self.conv is None else int(self.conv.nbytes))

    def keep(self, conv, state, num_tokens: int) -> None:
        """Keep the convolution's last inputs and the state after ``num_tokens`` more."""
        self.conv = conv.data if isinstance(conv, Tensor) else conv
        self.update(state, num_tokens)

    def __repr__(self) -> str:
        shape = None if self.state is None else tuple(self.state.shape)
        return f"Mamba2State(tokens={self.length}, state={shape})"


@register("mamba2")
class Mamba2(RecurrentAttention):
    r"""The Mamba-2 layer on the attention contract: C ↔ q, B ↔ k, X ↔ v after a short
    convolution, the selective SSM with Mamba-2's step and skip, and a gated RMSNorm.

    Formula: the module docstring's layer, with P = D = E/H (HP = E), the state size N_s
    (``state_size``) and G groups (``n_groups``); W_in's rows are five maps here:
    ``gate_linear`` (z, E → E), ``v_proj`` (x̃, E → E), ``k_proj`` (B̃) and ``q_proj`` (C̃)
    (E → G·N_s), ``dt_linear`` (δ, E → H); ``attend`` is the SSM and the skip D (no
    convolution, no gate, no norm).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v, dt=None)``: C = q and
    B = k (B, Gq, N, N_s), X = v (B, Gv, N, D), each head count dividing H (Mamba-2's layout:
    q and k with G heads, v with H; the contract's: q with H, k and v with Hkv), δ = dt
    (B, H, N) (None: zero, Δ_h = softplus(b_h)) → (B, H, N, D).
    Hook points: ``hook_conv`` the convolution's output before the SiLU (B, N, E + 2G·N_s);
    ``hook_q``/``hook_k`` C and B (B, N, G, N_s), ``hook_v`` X (B, N, H, D), after the SiLU;
    ``hook_dt`` Δ (B, H, N); ``hook_decay`` L and ``hook_pattern`` L ⊙ C B̄ᵀ (B, H, N, N)
    (with either, one chunk); ``hook_state`` the state after the last token (B, H, N_s, D);
    ``hook_y`` the SSM's output with the skip (B, N, H, D); ``hook_gate`` z before its SiLU and
    ``hook_z`` the normalised, gated heads before ``out_proj`` (B, N, H, D). All replaceable
    but ``hook_state`` without a cache.

    Options: ``causal`` (False; non-causal: module docstring), ``state_size`` N_s (None: D),
    ``n_groups`` G (1; ``num_kv_heads`` is read as G when ``n_groups`` is not given),
    ``conv_kernel`` K (4), ``conv_bias`` (True), ``chunk_size`` Q (None: the quadratic form;
    causal only), ``time_step_limit`` (Δ_min, Δ_max) ((0, ∞)), ``norm_eps`` ε (1e-5), ``bias``
    (of the projections). Parameters: ``conv_weight`` (E + 2G·N_s, K) and ``conv_bias``
    (E + 2G·N_s,), ``dt_bias`` b, ``A_log``, ``D`` (H,) (Mamba-2's initialisation: Δ
    log-uniform in [0.001, 0.1], A uniform in [1, 16], D = 1), ``norm.weight`` g (E,).
    Decoding: ``forward(x, kv_cache=layer.new_cache())`` (a ``Mamba2State``, constant size).

    Complexity: {complexity}; chunked (Q) O(B·H·N·Q·(N_s + D)) time and O(B·H·N·Q) memory;
    decoding O(E·(E + G·N_s) + H·N_s·D) a token.

    Exactness: a different score function (no softmax; ``attend`` is tested against its own
    dense formula, ``reference``, and the layer against the recurrence written token by token
    and against HF's ``NemotronHMamba2Mixer`` in PyTorch).

    Reference: Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient
    Algorithms Through Structured State Space Duality".
    """

    complexity = "time O(B·H·N²·(N_s + D)), memory O(B·H·N²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, state_size: int = None,
                 n_groups: int = None, conv_kernel: int = 4, conv_bias: bool = True,
                 chunk_size: int = None, time_step_limit: tuple = (0.0, math.inf),
                 norm_eps: float = 1e-5, num_kv_heads: int = None, **base):
        who = "Mamba2"
        # num_kv_heads is read as n_groups (G groups of B and C): both given, they must agree
        groups = [validate.positive_int(g, name, owner=who) for g, name in
                  ((n_groups, "n_groups"), (num_kv_heads, "num_kv_heads")) if g is not None]
        if len(set(groups)) > 1:
            raise validate.OptionError(f"{who}: n_groups ({n_groups}) and num_kv_heads "
                                       f"({num_kv_heads}) name the same groups; give one")
        g_count = groups[0] if groups else 1
        if isinstance(num_heads, int) and num_heads > 0 and num_heads % g_count:
            raise validate.OptionError(f"{who}: num_heads ({num_heads}) must be divisible by "
                                       f"n_groups ({g_count})")
        # the base's projections at attention's sizes; q, k and v's replaced below by the SSM's
        super().__init__(embed_dim, num_heads, causal=causal, chunk_size=chunk_size,
                         num_kv_heads=g_count, **base)
        e, h = self.embed_dim, self.num_heads
        self.n_groups = g_count
        self.state_size = self.head_dim if state_size is None else \
            validate.positive_int(state_size, "state_size", owner=who)
        self.conv_kernel = validate.positive_int(conv_kernel, "conv_kernel", owner=who)
        self.time_step_limit = check_time_step_limit(time_step_limit, who)
        bias = self.q_proj.bias is not None             # the projections' ``bias`` option
        gn = g_count * self.state_size
        # W_in's five maps (module docstring): z, x̃ (E each), B̃, C̃ (G·N_s each), δ (H)
        self.q_proj, self.k_proj = Linear(e, gn, bias=bias), Linear(e, gn, bias=bias)
        self.v_proj = Linear(e, e, bias=bias)
        self.gate_linear = Linear(e, e, bias=bias)
        self.dt_linear = Linear(e, h, bias=bias)
        g, xp = rng(), active_xp()
        channels, bound = e + 2 * gn, 1.0 / math.sqrt(self.conv_kernel)   # PyTorch's Conv1d
        self.conv_weight = Parameter(xp.asarray(
            g.uniform(-bound, bound, (channels, self.conv_kernel))).astype("float32"))
        self.conv_bias = Parameter(xp.asarray(g.uniform(-bound, bound, channels))
                                   .astype("float32")) \
            if validate.boolean(conv_bias, "conv_bias", owner=who) else None
        # Mamba-2's initialisation: Δ = softplus(b) log-uniform in [1e-3, 1e-1]
        # (b = Δ + log(1 − e^{−Δ})), A uniform in [1, 16], D = 1
        dt = host_xp.exp(g.uniform(math.log(1e-3), math.log(1e-1), h))
        self.dt_bias = Parameter(xp.asarray(dt + host_xp.log(-host_xp.expm1(-dt)))
                                 .astype("float32"))
        self.A_log = Parameter(xp.asarray(host_xp.log(g.uniform(1, 16, h))).astype("float32"))
        self.D = Parameter(xp.ones((h,), dtype="float32"))
        self.norm = GatedRMSNorm(e, g_count,
                                 eps=validate.positive_real(norm_eps, "norm_eps", owner=who))
        for name in ("conv", "dt", "decay", "pattern", "y", "gate"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """An empty ``Mamba2State``: the decode cache ``forward(x, kv_cache=…)`` takes."""
        return Mamba2State()

    @property
    def lookahead(self) -> int:
        """The convolution's lookahead: 0 when causal, ⌊(K − 1)/2⌋ (centred taps) when not."""
        return 0 if self.causal else (self.conv_kernel - 1) // 2

    def _check(self, q, k, v, dt):
        """The heads ``attend`` takes (its docstring), named in the error when wrong."""
        who, h = f"{self.name}.attend", self.num_heads
        if any(len(t.shape) != 4 for t in (q, k, v)):
            raise ValueError(f"{who}: q, k, v must be 4-d (B, heads, N, ·), got shapes "
                             f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if h % t.shape[1] or t.shape[0] != q.shape[0] or t.shape[2] != q.shape[2]:
                raise ValueError(f"{who}: {name} must be (B, heads dividing H = {h}, N, ·) "
                                 f"with q's B and N, got {tuple(t.shape)} (q {tuple(q.shape)})")
        if k.shape[-1] != q.shape[-1]:
            raise ValueError(f"{who}: C = q and B = k must share the state size N_s, got "
                             f"{q.shape[-1]} and {k.shape[-1]}")
        want = (q.shape[0], h, q.shape[2])
        if dt is not None and tuple(dt.shape) != want:
            raise ValueError(f"{who}: dt must be (B, H, N) = {want}, got {tuple(dt.shape)}")

    def _ssm(self, c, b, x, dt, state):
        """Δ from δ (``hook_dt``), then ``selective_ssm`` from ``state`` → (y, state)."""
        delta = self.hook_dt(time_steps(dt, self.dt_bias, self.time_step_limit))
        hooked = self.hook_decay.active or self.hook_pattern.active
        return selective_ssm(c, b, x, delta, self.A_log, self.D, state, self.chunk_size,
                             self.causal, hook_decay=self.hook_decay if hooked else None,
                             hook_pattern=self.hook_pattern if hooked else None)

    def attend(self, q, k, v, dt=None):
        """C = q, B = k, X = v, δ = dt (class docstring's shapes) → y (B, H, N, D): the
        module docstring's SSM and skip."""
        self._check(q, k, v, dt)
        if dt is None:
            xp = get_array_module(v.data)
            dt = Tensor._wrap(xp.zeros((q.shape[0], self.num_heads, q.shape[2]),
                                       dtype=v.dtype))
        out, state = self._ssm(q, k, v, dt, None)
        self.show_state(state)
        return out

    def forward(self, x, attn_mask=None, kv_cache=None):
        """x (B, N, E) → (B, N, E); with ``kv_cache`` (a ``Mamba2State``, causal only) the
        N tokens continue the ones it has seen."""
        who = type(self).__name__
        if len(x.shape) != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: x must be (B, N, {self.embed_dim}), got shape "
                             f"{tuple(x.shape)}")
        if attn_mask is not None:
            raise ValueError(f"{who} ({self.name}) does not take an attn_mask")
        if kv_cache is not None:
            if not isinstance(kv_cache, Mamba2State):
                raise TypeError(f"{who} ({self.name}): kv_cache must be a Mamba2State (from "
                                f"new_cache()), got {type(kv_cache).__name__}")
            if not self.causal:
                raise ValueError(f"{who} ({self.name}): decoding with a state needs "
                                 "causal=True, got causal=False")
        e, gn, h = self.embed_dim, self.n_groups * self.state_size, self.num_heads
        # the convolution over [x̃, B̃, C̃] (continuing the cached inputs), then SiLU
        u = F.concatenate([self.v_proj(x), self.k_proj(x), self.q_proj(x)], axis=-1)
        past = None if kv_cache is None else kv_cache.conv
        conv, last = causal_conv(u, self.conv_weight, past, self.lookahead, self.conv_bias)
        u = F.silu(self.hook_conv(conv))                                  # (B, N, E + 2G·N_s)
        xs = hooked_heads(self.hook_v, split_heads(u[..., :e], h))                # (B, H, N, D)
        bs = hooked_heads(self.hook_k, split_heads(u[..., e:e + gn], self.n_groups))
        cs = hooked_heads(self.hook_q, split_heads(u[..., e + gn:], self.n_groups))
        dt = F.transpose(self.dt_linear(x), (0, 2, 1))                    # (B, H, N)
        y, state = self._ssm(cs, bs, xs, dt, None if kv_cache is None else kv_cache.tensor())
        if kv_cache is None:
            self.show_state(state)
        else:
            with no_grad():
                kv_cache.keep(last, self.hook_state(state), x.shape[1])
        # each group normalised after the gate, then mixed back to E
        y = hooked_heads(self.hook_y, y)                                  # (B, H, N, D)
        z = self.hook_gate(F.reshape(self.gate_linear(x), (*x.shape[:2], h, self.head_dim)))
        o = self.norm(merge_heads(y), F.reshape(z, tuple(x.shape)))
        o = self.hook_z(F.reshape(o, (*x.shape[:2], h, self.head_dim)))
        return self.out_proj(F.reshape(o, tuple(x.shape)))

    def reference(self, q, k, v, dt=None):
        """Raw-array dense form of ``attend``: Y = (L ⊙ C B̄ᵀ) X + D X per head, L_ts =
        exp(Λ_t − Λ_s) from prefix sums Λ_t = Σ_{r≤t} Δ_r A_h (non-causal exp(−|Λ_t − Λ_s|)),
        the clip as ``time_steps``' — not through ``decay_mask`` or ``decayed_chunk``."""
        xp = get_array_module(q)
        h = self.num_heads
        q, k, v = (repeat_kv_array(a, h) for a in (q, k, v))
        bias, a_log, skip = (p.data.astype(q.dtype) for p in (self.dt_bias, self.A_log, self.D))
        dt = xp.zeros(q.shape[:3], dtype=q.dtype) if dt is None else dt
        delta = xp.logaddexp(0, dt + bias[:, None])                             # softplus
        delta = xp.clip(delta, self.time_step_limit[0], self.time_step_limit[1])
        big = xp.cumsum(-delta * xp.exp(a_log)[:, None], axis=-1)               # Λ (B, H, N)
        diff = big[..., :, None] - big[..., None, :]
        n = q.shape[2]
        if self.causal:
            mask = xp.where(xp.tri(n, dtype=bool), xp.exp(xp.minimum(diff, 0)), 0.0)
        else:
            mask = xp.exp(-xp.abs(diff))
        scores = mask * (q @ xp.swapaxes(k * delta[..., None], -1, -2))
        return scores @ v + skip[:, None, None] * v

    @classmethod
    def identities(cls, seed=0):
        """Decoding through a ``Mamba2State`` equals the full causal forward, and the chunked
        SSM the quadratic one (float64, B = 2, E = 12, H = 3, G = 3, N_s = 5, K = 4, N = 11)."""
        g = host_xp.random.default_rng(seed)
        x = g.standard_normal((2, 11, 12))
        layer = cls(12, 3, causal=True, state_size=5, n_groups=3).to(dtype="float64")
        with no_grad():
            # the whole text at once, then through one state in steps of 5, 1, 1 and 4
            full = to_host(layer(Tensor(x)).data)
            cache = layer.new_cache()
            steps = host_xp.concatenate(
                [to_host(layer(Tensor(x[:, t:t + s]), kv_cache=cache).data)
                 for t, s in ((0, 5), (5, 1), (6, 1), (7, 4))], axis=1)
            layer.chunk_size = 3        # the same text in chunks of 3, the state between them
            chunked = to_host(layer(Tensor(x)).data)
        return [("decoding through a Mamba2State (a prompt of 5, then 1, 1, 4) − full causal "
                 "forward, max |Δ|", float(host_xp.abs(steps - full).max()), 1e-12),
                ("chunked SSM (Q = 3) − quadratic form, max |Δ|",
                 float(host_xp.abs(chunked - full).max()), 1e-12)]

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", state_size={self.state_size}, n_groups="
                f"{self.n_groups}, conv_kernel={self.conv_kernel}, chunk_size={self.chunk_size}")
