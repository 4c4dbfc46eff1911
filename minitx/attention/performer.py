r"""Performer: softmax attention through positive orthogonal random features (FAVOR+).

Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins, Davis, Mohiuddin, Kaiser,
Belanger, Colwell & Weller (2021), "Rethinking Attention with Performers".

The softmax kernel is an expectation over Gaussian w ~ N(0, I_D):

    exp(x·y) = E_w[ exp(w·x − ‖x‖²/2) · exp(w·y − ‖y‖²/2) ],

so with m draws w_1..w_m (rows of W, (m, D)) and the *positive* feature map φ(x) (m,) below,
φ(x)·φ(y) is an unbiased estimate of exp(x·y). Scaling q and k by D^(−1/4) makes it
estimate exp(q·k/√D), and attention becomes linear in N, (B, H, N, Dv), never (N, N):

$$
\varphi(x) = \frac{1}{\sqrt{m}} \exp\!\left( W x - \frac{\lVert x \rVert^2}{2} \right),
\qquad Q' = \frac{Q}{D^{1/4}},\ K' = \frac{K}{D^{1/4}}
$$

$$
O = \frac{\varphi(Q') \left( \varphi(K')^\top V \right)}
{\varphi(Q')\, \varphi(K')^\top \mathbf{1}}
$$

Causal: the sums over keys run over j ≤ i, prefix sums (cumsum) over positions:

$$
O_i = \frac{\varphi(q'_i)^\top S_i}{\varphi(q'_i)^\top z_i}, \qquad
S_i = \sum_{j \le i} \varphi(k'_j)\, v_j^\top, \qquad z_i = \sum_{j \le i} \varphi(k'_j)
$$

The rows of W are drawn in orthogonal blocks (QR of a Gaussian matrix), each row rescaled
to a chi(D)-distributed norm so that every row is still marginally N(0, I): orthogonality
lowers the estimator's variance (the "O" in FAVOR+).

Stabilisation: exp(W x − ‖x‖²/2) overflows for large inputs, so before exp we subtract a
constant c: per query row its own max over features, and for keys one max over all keys
and features (per batch and head). Why it cancels: each output row is a ratio of two sums
over keys of φ(q_i)·φ(k_j) terms; multiplying φ(q_i) by e^(−c_i) scales numerator and
denominator of row i alike, and multiplying *every* φ(k_j) by the same e^(−c) does too
(also under prefix sums). The constants are treated as such in backward (the output does not
depend on them, so their true derivative contribution is zero).

Why the causal key shift stays global (over all keys, future ones included): the prefix sum
S_i is shared by every row i ≥ j, so the factor e^(−c_j) a key carries
must be the same in every prefix it enters — i.e. the same for all keys. A per-key (running,
prefix-max) shift would weight key j by e^(−c_j) differently from key j' and change the ratio;
a shift from the past only (e.g. the first keys' max) lets a larger later key overflow. So
the global max is the only constant that is both exact and overflow-free. Mathematically the
output of row i still does not depend on future keys (c cancels); numerically, a future key
far larger than every key up to i can make row i's φ(k_j) underflow, and then ε (added to
the denominator) keeps the output finite — it is what ε is for: those rows degrade towards
0 instead of 0/0 = NaN. (Rows shifted per query, c_i, depend on that query only.)

Time O(N·m·D); memory O(N·m) bidirectional,
O(N·m·Dv) causal. Approximate (unbiased kernel estimate; the ratio is consistent as m → ∞).
"""
from __future__ import annotations

import math

from .. import functional as F
from .. import validate
from ..autograd.tensor import Tensor
from ..backend import get_array_module, rng, xp as active_xp
from ..nn.hooks import HookPoint
from .base import AttentionBase, check_heads, kernel_feature_hooks, register, repeat_kv
from .linear import KernelAttentionFunction, apply_feature_map

__all__ = ["orthogonal_gaussian", "performer_kernel", "performer_attention", "FavorFeatures",
           "PerformerAttention"]


def orthogonal_gaussian(m: int, d: int, orthogonal: bool = True):
    """(m, d) random feature matrix: orthogonal blocks of d rows with chi(d) norms.

    Each block: G ~ N(0, 1)^(d×d), Q from its QR decomposition (orthonormal rows), rows
    scaled by the norms of fresh d-dim Gaussian vectors. ``orthogonal=False`` gives plain
    i.i.d. Gaussian rows. Drawn from ``minitx.backend.rng()`` (seed with manual_seed).
    """
    xp = active_xp()
    if not orthogonal:
        return xp.asarray(rng().standard_normal((m, d)))
    blocks = []
    for _ in range(-(-m // d)):
        g = xp.asarray(rng().standard_normal((d, d)))
        qmat, r = xp.linalg.qr(g)
        qmat = qmat * xp.sign(xp.diagonal(r))[None, :]      # make the decomposition unique
        blocks.append(qmat.T)                               # rows orthonormal
    w = xp.concatenate(blocks, axis=0)[:m]
    norms = xp.sqrt((xp.asarray(rng().standard_normal((m, d))) ** 2).sum(axis=1))  # chi(d)
    return w * norms[:, None]


def performer_kernel(q, k, w):
    """Raw arrays: the unnormalised estimate φ(q) φ(k)ᵀ ≈ exp(q kᵀ/√D), (B, H, N, N).

    No stabilisation, so the average over redraws of W is an unbiased estimate (for tests).
    """
    xp = get_array_module(q, k)
    features = FavorFeatures(w, q.shape[-1] ** -0.25, stabilize=False)
    return features.phi(q, True) @ xp.swapaxes(features.phi(k, False), -1, -2)


ROWS = 4096     # rows per block of FavorFeatures.vjp's last update (1 MiB at D = 64)


class FavorFeatures:
    """The FAVOR+ feature map on raw arrays, with its VJP: the one place φ is written (the
    fused ``KernelAttentionFunction`` and the composed form, through ``FeatureMapFunction``,
    both call it).

    φ(x) = exp(L − c) / √m, L = W x' − ‖x'‖²/2, x' = x·``scale`` (D^(−1/4)), x (B, H, N, D) →
    (B, H, N, m); c a query row's max, or one max over all keys per batch and head (the module
    docstring says why it cancels), 0 without ``stabilize``; constants in backward too.
    VJP: dL = dφ ⊙ φ, dx' = dL W − rowsum(dL) x', dx = dx'·scale.
    """

    def __init__(self, w, scale, stabilize: bool = True):
        self.w, self.scale, self.stabilize = w, scale, stabilize    # w (m, D)

    def phi(self, x, is_query):
        xp = get_array_module(x)
        xs = x * self.scale
        logits = xs @ self.w.T                                      # (B, H, N, m)
        logits -= (xs * xs).sum(axis=-1, keepdims=True) * 0.5      # L = W x' − ‖x'‖²/2
        if self.stabilize:                                          # − c: cancels in the ratio
            logits -= logits.max(axis=-1 if is_query else (-2, -1), keepdims=True)
        phi = xp.exp(logits, out=logits)
        phi *= 1.0 / math.sqrt(self.w.shape[0])
        return phi

    # dL = dφ ⊙ φ (φ = exp(L − c)/√m), then through L = W x' − ‖x'‖²/2:
    # dx' = dL W − rowsum(dL) x', and dx = dx'·scale.
    def vjp(self, x, phi, grad, is_query):
        grad *= phi                                                 # dL, in dφ's memory
        dx = grad @ self.w                                          # (B, H, N, D)
        dx *= self.scale                        # dx = scale·dL W − scale²·rowsum(dL)·x
        rows = grad.sum(axis=-1, keepdims=True) * self.scale ** 2   # (B, H, N, 1)
        for i in range(0, x.shape[-2], ROWS):   # in blocks of rows: no N × D temporary
            dx[..., i:i + ROWS, :] -= x[..., i:i + ROWS, :] * rows[..., i:i + ROWS, :]
        return dx


def performer_attention(q, k, v, w, causal: bool = False, eps: float = 1e-12, hooks=None):
    """FAVOR+ attention: q (B, H, N, D), k (B, H, N, D), v (B, H, N, Dv) Tensors → (B, H, N, Dv).

    Bidirectional, with no φ hook set, it is one node (``KernelAttentionFunction``: φ(Q),
    φ(K) recomputed in backward, O(N·(D + m)) memory); otherwise composed of differentiable
    ops, so the hooks can see and replace φ."""
    d = q.shape[-1]
    scale = d ** -0.25
    hooked = hooks is not None and (hooks.hook_phi_q.active or hooks.hook_phi_k.active or
                                    hooks.hook_pattern.active)
    if not causal and not hooked:
        return KernelAttentionFunction.apply(q, k, v, features=FavorFeatures(w, scale),
                                             normalize=True, eps=eps)
    # Composed form: φ(Q), φ(K) as differentiable nodes that the hooks may see and replace.
    features = FavorFeatures(w, scale)
    phi_q = apply_feature_map(q, features, True)                    # (B, H, N, m)
    phi_k = apply_feature_map(k, features, False)                   # (B, H, N, m)
    if hooks is not None:                       # the layer's φ hooks (kernel_feature_hooks)
        phi_q, phi_k = kernel_feature_hooks(hooks, phi_q, phi_k, causal, eps)
    if not causal:
        kv = F.matmul(F.swapaxes(phi_k, -1, -2), v)                # (B, H, m, N) @ (B, H, N, Dv)
        num = F.matmul(phi_q, kv)                                   # (B, H, N, m) @ (B, H, m, Dv)
        z = phi_k.sum(axis=2, keepdims=True)                        # (B, H, 1, m)
    else:
        # S_i = Σ_{j≤i} φ(k_j) v_jᵀ: (B, H, N, m, 1) * (B, H, N, 1, Dv) -> cumsum over N
        outer = F.expand_dims(phi_k, -1) * F.expand_dims(v, -2)     # (B, H, N, m, Dv)
        s = F.cumsum(outer, axis=2)
        num = F.squeeze(F.matmul(F.expand_dims(phi_q, -2), s), -2)  # (B, H, N, 1, m) @ (.., m, Dv)
        z = F.cumsum(phi_k, axis=2)                                 # (B, H, N, m)
    den = (phi_q * z).sum(axis=-1, keepdims=True)                   # (B, H, N, 1)
    return num / (den + eps)


@register("performer")
class PerformerAttention(AttentionBase):
    r"""Performer (FAVOR+): softmax attention through positive orthogonal random features.

    Formula: the module docstring's, bidirectional and causal, with W (m, D) orthogonal
    Gaussian rows (m = ``num_features``).

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); buffer ``features`` W (m, D); φ(Q'), φ(K')
    (B, H, N, m); φ(K')ᵀV (B, H, m, D); causal prefix sums (B, H, N, m, D).

    Options: ``num_features`` m (default 64), ``orthogonal`` (True), ``redraw_in_training``
    (False: with True, every forward in training mode draws new features), ``causal`` (False).
    W is drawn once at construction (seeded by ``minitx.manual_seed``); ``redraw()`` draws new
    ones. Eval mode never redraws.

    Complexity: {complexity}.

    Exactness: approximate (φ(q)·φ(k) is an unbiased estimate of exp(q·k/√D); the output
    converges to exact softmax attention as the number of features m grows).

    Reference: Choromanski, Likhosherstov, Dohan et al. (2021), "Rethinking Attention with
    Performers".
    """

    complexity = "time O(B·H·N·m·D), memory O(B·H·N·m); causal memory O(B·H·N·m·D)"

    kind = "approximate"

    def __init__(self, embed_dim, num_heads, causal=False, num_features: int = 64,
                 orthogonal: bool = True, redraw_in_training: bool = False, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.hook_phi_q = HookPoint()     # (B, H, N, m) φ(Q'), Q' = Q/D^¼
        self.hook_phi_k = HookPoint()     # (B, H, N, m) φ(K')
        self.hook_pattern = HookPoint()   # (B, H, N, N) implied pattern, read-only, on request
        self.num_features = validate.positive_int(num_features, "num_features", owner="performer")
        self.orthogonal = validate.boolean(orthogonal, "orthogonal", owner="performer")
        self.redraw_in_training = validate.boolean(redraw_in_training, "redraw_in_training",
                                                   owner="performer")
        self.register_buffer("features", Tensor(orthogonal_gaussian(
            num_features, self.head_dim, self.orthogonal)))

    def redraw(self) -> None:
        """Draw a new random feature matrix (m, D)."""
        self.features.data = orthogonal_gaussian(self.num_features, self.head_dim,
                                                 self.orthogonal)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv)."""
        _, h, *_ = check_heads(q, k, v, self.name)
        if self.training and self.redraw_in_training:
            self.redraw()
        w = self.features.data if isinstance(self.features, Tensor) else self.features
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        return performer_attention(q, k, v, w.astype(q.dtype), causal=self.causal, hooks=self)
