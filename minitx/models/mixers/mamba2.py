r"""The Mamba-2 layer of Nemotron-H (and of Mamba-2): a short convolution, the selective SSM and
a gated RMSNorm between two projections — layer type ``"mamba2"``.

Dao & Gu (2024), "Transformers are SSMs"; NVIDIA (2025), "Nemotron-H". HuggingFace's
``NemotronHMamba2Mixer`` is the oracle. The formulas are ``attention/mamba2.py``'s module
docstring (its functions are called here, not re-derived): with H heads of P channels, G
groups of state size N_s and K taps,

$$
[z_t, \tilde x_t, \tilde B_t, \tilde C_t, \delta_t] = W_{in}\, x_t, \qquad
o_t = W_{out} \bigl[ g \odot \operatorname{RMSNorm}_G(y_t \odot \operatorname{silu}(z_t)) \bigr]
$$

with [x, B, C] the SiLU of the causal convolution of [x̃, B̃, C̃] and y the SSM (state
h (N_s × P) per head, Δ = clip(softplus(δ + b)), A = −e^{A_log}, skip D).

**HF's layout is kept**, so Nemotron-H's tensors (``backbone.layers.{i}.mixer.*``) load
unchanged: ``in_proj.weight`` (2HP + 2G·N_s + H, E), its rows [z (HP); x̃ (HP); B̃ (G·N_s);
C̃ (G·N_s); δ (H)], B̃ and C̃ group-major (group g's N_s rows together), x̃ and z head-major;
``conv1d.weight`` (HP + 2G·N_s, 1, K) and ``conv1d.bias`` (HP + 2G·N_s,), over [x̃, B̃, C̃] in
that order; ``dt_bias``, ``A_log``, ``D`` (H,); ``norm.weight`` (HP,) (its groups of HP/G
channels); ``out_proj.weight`` (E, HP); ``in_proj.bias`` and ``out_proj.bias`` with
Nemotron-H's ``use_bias``. HF's config keys: ``mamba_num_heads`` H, ``mamba_head_dim`` P,
``ssm_state_size`` N_s, ``n_groups`` G, ``conv_kernel`` K, ``use_conv_bias``, ``use_bias``,
``chunk_size``, ``time_step_min`` (Nemotron-H's Δ_min: its limit is (``time_step_min``, ∞),
not ``time_step_limit``) and ``layer_norm_epsilon`` (the gated norm's ε).

**Padding.** As HF does, padding tokens (0 in ``attention_mask``) are zeroed twice: their
inputs before ``in_proj`` and their x, B, C after the convolution, so they write nothing to
the state (their Δ still decays it: with left padding the state is still zero).

**Decoding.** The cache (``attention.mamba2.Mamba2State``) keeps the last K − 1 convolution
inputs and the state: (K − 1)(HP + 2G·N_s) + H·N_s·P numbers per batch row, whatever the length.
A prompt runs chunkwise (chunks of ``chunk_size``), a generated token as a chunk of one.
"""
from __future__ import annotations

import math

from ... import backend, validate
from ... import functional as F
from ...attention.base import hooked_heads, split_heads
from ...attention.mamba2 import (GatedRMSNorm, Mamba2State, check_time_step_limit,
                                 selective_ssm, time_steps)
from ...nn.hooks import HookPoint
from ...nn.layers import Linear
from ...nn.module import Module, Parameter
from . import given_options, register_mixer
from .gated_deltanet import CausalConv1d

__all__ = ["Mamba2Mixer", "OPTIONS"]

# The options of DecoderConfig.mixer_options["mamba2"] and their defaults (None: from the
# attention's sizes, H = num_heads and P = head_dim; from the config's norm_eps). HF's
# defaults otherwise: N_s = 128, K = 4, a bias on the convolution, none on the projections,
# chunks of 128; G = 1 as Mamba-2's (Nemotron-H's checkpoints give 8).
OPTIONS = {"num_heads": None, "head_dim": None, "state_size": 128, "n_groups": 1,
           "conv_kernel": 4, "conv_bias": True, "bias": False, "chunk_size": 128,
           "time_step_limit": (0.0, math.inf), "norm_eps": None}


def mixer_options(c) -> dict:
    """``c.mixer_options["mamba2"]`` checked, the defaults filled in."""
    o, who = given_options(c, "mamba2", OPTIONS)
    # H and P default to the attention layers' (H, D)
    for name, default in (("num_heads", c.num_heads), ("head_dim", c.head_dim)):
        o[name] = default if o[name] is None else validate.positive_int(o[name], name,
                                                                        owner=who)
    for name in ("state_size", "n_groups", "conv_kernel", "chunk_size"):
        o[name] = validate.positive_int(o[name], name, owner=who)
    # each group's B and C are read by H/G heads, as GQA's keys by a group of queries
    if o["num_heads"] % o["n_groups"]:
        raise validate.OptionError(f"{who}: num_heads ({o['num_heads']}) must be a multiple "
                                   f"of n_groups ({o['n_groups']})")
    for name in ("conv_bias", "bias"):
        o[name] = validate.boolean(o[name], name, owner=who)
    o["time_step_limit"] = check_time_step_limit(o["time_step_limit"], who)
    o["norm_eps"] = c.norm_eps if o["norm_eps"] is None else \
        validate.positive_real(o["norm_eps"], "norm_eps", owner=who)
    return o


def _sizes(o) -> tuple:
    """(H, P, N_s, G, the convolution's channels HP + 2G·N_s, in_proj's rows 2HP + 2G·N_s + H)."""
    h, p, n, g = o["num_heads"], o["head_dim"], o["state_size"], o["n_groups"]
    conv = h * p + 2 * g * n
    return h, p, n, g, conv, conv + h * p + h


@register_mixer("mamba2")
class Mamba2Mixer(Module):
    """Nemotron-H's Mamba-2 layer (module docstring). x (B, N, E) → (B, N, E).

    Options (``DecoderConfig.mixer_options["mamba2"]``, ``OPTIONS``): ``num_heads`` H and
    ``head_dim`` P (None: the attention's), ``state_size`` N_s (128), ``n_groups`` G (1; H a
    multiple), ``conv_kernel`` K (4), ``conv_bias`` (True), ``bias`` (False: in_proj's and
    out_proj's), ``chunk_size`` (128, the prompt's chunks), ``time_step_limit`` (Δ_min,
    Δ_max) ((0, ∞); Nemotron-H: (time_step_min, ∞)), ``norm_eps`` (None: the config's
    ``norm_eps``). Parameters under HF's names (module docstring).

    Hook points: ``hook_conv`` the convolution's output before the SiLU (B, N, HP + 2G·N_s);
    ``hook_q`` C and ``hook_k`` B (B, N, G, N_s), ``hook_v`` X (B, N, H, P), after the SiLU;
    ``hook_dt`` Δ (B, H, N); ``hook_state`` h after the last token (B, H, N_s, P);
    ``hook_y`` the SSM's output with the skip (B, N, H, P); ``hook_gate`` z before its SiLU
    and ``hook_z`` the gated, normalised heads before ``out_proj`` (B, N, H, P). All
    replaceable.

    Cost: time O(B·N·(E·(2HP + 2G·N_s + H) + (HP + 2G·N_s)·K + H·Q·(N_s + P) + H·N_s·P))
    with chunks of Q; decoding O(E·(HP + G·N_s) + H·N_s·P) a token; the cache
    (K − 1)(HP + 2G·N_s) + H·N_s·P numbers per batch row.
    """

    def __init__(self, c, index: int = 0):
        super().__init__()
        o = self.options = mixer_options(c)
        h, p, n, g, conv, rows = _sizes(o)
        e = c.hidden_size
        self.in_proj = Linear(e, rows, bias=o["bias"])
        self.conv1d = CausalConv1d(conv, o["conv_kernel"], bias=o["conv_bias"])
        # HF's initialisation (Nemotron-H's): b = 1, A = 1 … H, D = 1
        xp, dt = backend.xp(), backend.default_float()
        self.dt_bias = Parameter(xp.ones((h,), dtype=dt))
        self.A_log = Parameter(xp.log(xp.arange(1, h + 1, dtype=dt)))
        self.D = Parameter(xp.ones((h,), dtype=dt))
        self.norm = GatedRMSNorm(h * p, g, eps=o["norm_eps"])
        self.out_proj = Linear(h * p, e, bias=o["bias"])
        for name in ("conv", "q", "k", "v", "dt", "state", "y", "gate", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def new_cache(self):
        """An empty ``Mamba2State``: the last K − 1 convolution inputs, the state, the tokens
        seen."""
        return Mamba2State()

    @classmethod
    def parameter_count(cls, c) -> int:
        """E·(2HP + 2G·N_s + H) + (HP + 2G·N_s)·K + 3H + HP + HP·E, plus the biases asked for."""
        o = mixer_options(c)
        h, p, _, _, conv, rows = _sizes(o)
        e = c.hidden_size
        return (e * rows + conv * o["conv_kernel"] + conv * o["conv_bias"] + 3 * h + h * p
                + h * p * e + (rows + e) * o["bias"])

    @classmethod
    def state_numbers(cls, c, tokens: int) -> int:
        """Numbers in one layer's cache per batch row: the K − 1 convolution inputs and the
        state (none before the first token)."""
        o = mixer_options(c)
        h, p, n, _, conv, _ = _sizes(o)
        return 0 if tokens == 0 else conv * (o["conv_kernel"] - 1) + h * n * p

    def forward(self, x, kv_cache=None, keep=None, positions=None):
        """x (B, N, E) → (B, N, E); ``keep`` (B, cached + N) bool, False = padding (module
        docstring); ``positions`` unused (no positions in a recurrence)."""
        if kv_cache is not None and not isinstance(kv_cache, Mamba2State):
            raise TypeError("Mamba2Mixer: kv_cache must be a Mamba2State (from new_cache()), "
                            f"got {type(kv_cache).__name__}")
        bsz, t, _ = x.shape
        h, p, n, g, conv, _ = _sizes(self.options)
        mask = None if keep is None else keep[:, -t:, None].astype(x.dtype)   # (B, N, 1)
        if mask is not None:
            x = x * mask
        proj = self.in_proj(x)                                  # (B, N, 2HP + 2G·N_s + H)
        z, xbc, dt = proj[..., :h * p], proj[..., h * p:h * p + conv], proj[..., h * p + conv:]
        # the causal convolution over [x̃, B̃, C̃] (continuing the cached inputs), SiLU
        xbc, last = self.conv1d(xbc, None if kv_cache is None else kv_cache.conv)
        xbc = F.silu(self.hook_conv(xbc))
        if mask is not None:
            xbc = xbc * mask
        xs = hooked_heads(self.hook_v, split_heads(xbc[..., :h * p], h))       # (B, H, N, P)
        bs = hooked_heads(self.hook_k, split_heads(xbc[..., h * p:h * p + g * n], g))
        cs = hooked_heads(self.hook_q, split_heads(xbc[..., h * p + g * n:], g))  # (B, G, N, N_s)
        delta = self.hook_dt(time_steps(F.transpose(dt, (0, 2, 1)), self.dt_bias,
                                        self.options["time_step_limit"]))   # (B, H, N)
        state = None if kv_cache is None else kv_cache.tensor()
        y, state = selective_ssm(cs, bs, xs, delta, self.A_log, self.D, state,
                                 self.options["chunk_size"])
        state = self.hook_state(state)
        if kv_cache is not None:
            kv_cache.keep(last, state.data, t)          # values only: no graph is kept
        # the gate, each group normalised, then back to E
        y = F.reshape(self.hook_y(F.transpose(y, (0, 2, 1, 3))), (bsz, t, h * p))
        z = F.reshape(self.hook_gate(F.reshape(z, (bsz, t, h, p))), (bsz, t, h * p))
        o = self.hook_z(F.reshape(self.norm(y, z), (bsz, t, h, p)))
        return self.out_proj(F.reshape(o, (bsz, t, h * p)))

    def extra_repr(self) -> str:
        o = self.options
        return (f"num_heads={o['num_heads']}, head_dim={o['head_dim']}, state_size="
                f"{o['state_size']}, n_groups={o['n_groups']}, conv_kernel={o['conv_kernel']}, "
                f"chunk_size={o['chunk_size']}")
