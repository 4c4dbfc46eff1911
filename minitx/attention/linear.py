r"""Linear attention: replace exp(q·k) by a feature-map dot product φ(q)·φ(k).

Katharopoulos, Vyas, Pappas & Fleuret (2020), "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention".

With a similarity sim(q, k) = φ(q)·φ(k), associativity turns attention linear in N: the
sums over keys come out of the per-query work, S (D, Dv) and z (D,) once for all queries,

$$
O_i = \frac{\sum_j \varphi(q_i) \cdot \varphi(k_j)\, v_j}{\sum_j \varphi(q_i) \cdot \varphi(k_j)}
= \frac{\varphi(q_i)^\top S}{\varphi(q_i)^\top z + \varepsilon},
\qquad S = \sum_j \varphi(k_j)\, v_j^\top, \qquad z = \sum_j \varphi(k_j)
$$

(ε only where the denominator may vanish, below). Causal: the sums run over j ≤ i. They are
prefix sums, $S_i = S_{i-1} + \varphi(k_i) v_i^\top$, $z_i = z_{i-1} + \varphi(k_i)$ — so
a causal linear transformer *is* an RNN with state (S, z):
``step`` decodes one token in O(D·Dv) time and memory, independent of the position.
Training uses the parallel form (cumsum over positions), equal to the recurrence.

Feature maps: "elu" φ(x) = elu(x) + 1 (the paper's; positive), "relu", "identity". The
denominator can vanish for relu and be negative for identity, so a small ε is added, and
"identity" is unnormalised by default (only the numerator φ(q_i)ᵀ S). Time O(N·D·Dv); memory O(D·Dv)
bidirectional, O(N·D·Dv) for the causal prefix sums. A different similarity, not an
approximation of softmax: kind "score".
"""
from __future__ import annotations

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..backend import get_array_module
from ..nn.hooks import HookPoint
from .base import (AttentionBase, check_heads, kernel_feature_hooks, register, repeat_kv,
                   repeat_kv_array)

__all__ = ["FEATURE_MAPS", "linear_attention", "linear_attention_step", "LinearAttention",
           "KernelAttentionFunction", "ElementwiseFeatures", "FeatureMapFunction",
           "apply_feature_map"]

# The maps φ: elu + 1 (positive, the paper's), relu (non-negative), identity (signed).
FEATURE_MAPS = ("elu", "relu", "identity")


def _check_feature_map(name):
    if name not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)}, got {name!r}")
    return name


class ElementwiseFeatures:
    """φ applied entry by entry (linear attention's maps), on raw arrays, with its VJP: the one
    place these maps are written (the fused ``KernelAttentionFunction`` and the composed form,
    through ``FeatureMapFunction``, both call it).

    ``phi(x)``: a fresh array — elu + 1: x + 1 where x > 0, eˣ where x ≤ 0; relu; identity.
    ``vjp(x, phi, g)``: g ⊙ φ'(x), computed in g's memory (φ = φ(x) is read, not changed):
    elu + 1 has φ' = min(φ, 1) (1 where x > 0, eˣ = φ where x ≤ 0); relu φ' = [φ > 0];
    identity φ' = 1.
    """

    def __init__(self, name):
        self.name = _check_feature_map(name)

    def phi(self, x, is_query):
        xp = get_array_module(x)
        if self.name == "elu":                         # elu(x) + 1 = x + 1 (x > 0), eˣ (x ≤ 0)
            phi = xp.where(x > 0, x, xp.exp(xp.minimum(x, 0)) - 1)
            phi += 1
            return phi
        return xp.maximum(x, 0) if self.name == "relu" else x.copy()

    # g ⊙ φ'(x), written into g (callers pass a copy): φ' = min(φ, 1) for elu + 1, [φ > 0]
    # for relu, 1 for identity.
    def vjp(self, x, phi, grad, is_query):
        xp = get_array_module(grad)
        if self.name == "elu":
            grad *= xp.minimum(phi, 1)
        elif self.name == "relu":
            xp.copyto(grad, 0, where=phi <= 0)
        return grad


class FeatureMapFunction(Function):
    """φ(x) as one differentiable node, for the composed form of kernel attention (the form
    hooks can look into): ``features.phi`` forward, ``features.vjp`` backward — the same raw
    code the fused ``KernelAttentionFunction`` runs. Input (x,), output φ(x)."""

    @staticmethod
    def forward(ctx, x, *, features, is_query):
        phi = features.phi(x, is_query)
        ctx.save_for_backward(x, phi)
        ctx.features, ctx.is_query = features, is_query
        return phi

    @staticmethod
    def backward(ctx, grad):
        x, phi = ctx.saved_tensors
        return ctx.features.vjp(x, phi, grad.copy(), ctx.is_query)     # vjp writes into its g


def apply_feature_map(x, features, is_query: bool = True):
    """φ(x) of a Tensor, differentiable: ``features`` is an ``ElementwiseFeatures`` or the
    Performer's ``FavorFeatures``; ``is_query`` picks its stabiliser where it has one."""
    return FeatureMapFunction.apply(x, features=features, is_query=is_query)


class KernelAttentionFunction(Function):
    """Bidirectional kernel attention as one node, O(N·(D + m)) memory: inputs (q, k, v).

    With a feature map φ (``features``: linear attention's ``ElementwiseFeatures``, the
    Performer's ``FavorFeatures``): S = φ(K)ᵀ V (m, Dv), z = Σ_j φ(k_j) (m,),
    O = φ(Q) S / (φ(Q) z + ε) (or φ(Q) S unnormalised). Saved: S, z, the denominators
    (B, H, N, 1) and O; φ(Q), φ(K) are recomputed in backward instead of kept (each is as
    large as an input). Backward, with G = dO, den = φ(Q) z + ε:

        dNum = G / den,   dDen = −rowsum(G ⊙ O) / den,
        dφ(Q) = dNum Sᵀ + dDen zᵀ,   dS = φ(Q)ᵀ dNum,   dz = φ(Q)ᵀ dDen,
        dφ(K) = V dSᵀ + 1 dzᵀ,   dV = φ(K) dS,   dQ, dK = the feature map's VJPs.
    """

    @staticmethod
    def forward(ctx, q, k, v, *, features, normalize, eps):
        xp = get_array_module(q, k, v)
        # Keys first: S = φ(K)ᵀ V (m, Dv) and z = Σ_j φ(k_j), then φ(K) is freed; the N × N map
        # is never formed.
        fk = features.phi(k, False)                                 # (B, H, N, m)
        s = xp.swapaxes(fk, -1, -2) @ v                             # (B, H, m, Dv)
        z = fk.sum(axis=2, keepdims=True)                           # (B, H, 1, m)
        del fk
        # O = φ(Q) S / (φ(Q)·z + ε), one row per query.
        fq = features.phi(q, True)
        out = fq @ s                                                # (B, H, N, Dv)
        den = None
        if normalize:
            den = (fq * z).sum(axis=-1, keepdims=True)              # (B, H, N, 1) = φ(q)·z
            den += eps                                 # (as the composed ops: the same bits)
            out /= den
        ctx.save_for_backward(q, k, v, s, z, den, out)
        ctx.features = features
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, s, z, den, out = ctx.saved_tensors
        xp = get_array_module(grad)
        features = ctx.features
        # φ(Q) is rebuilt (cheaper than keeping it); dNum = G / den, dφ(Q) = dNum Sᵀ,
        # dS = φ(Q)ᵀ dNum.
        fq = features.phi(q, True)
        dnum = grad if den is None else grad / den                  # (B, H, N, Dv)
        dfq = dnum @ xp.swapaxes(s, -1, -2)                         # dφ(Q), (B, H, N, m)
        ds = xp.swapaxes(fq, -1, -2) @ dnum                         # (B, H, m, Dv)
        # Through the denominator: dDen = −rowsum(G ⊙ O) / den adds dDen zᵀ to dφ(Q), and
        # dz = φ(Q)ᵀ dDen.
        dz = None
        if den is not None:
            dden = -xp.einsum("...nc,...nc->...n", grad, out)[..., None] / den   # (B, H, N, 1)
            dfq += dden * z
            dz = xp.swapaxes(dden, -1, -2) @ fq                    # (B, H, 1, m)
        del dnum
        dq = features.vjp(q, fq, dfq, True)
        del fq, dfq
        # Keys: dφ(K) = V dSᵀ + 1 dzᵀ, then φ's VJP; dV = φ(K) dS.
        fk = features.phi(k, False)
        dfk = v @ xp.swapaxes(ds, -1, -2)                           # dφ(K), (B, H, N, m)
        if dz is not None:
            dfk += dz
        dk = features.vjp(k, fk, dfk, False)
        del dfk                                     # (dV after dK: one N × m array fewer)
        return dq, dk, fk @ ds                                      # dV (B, H, N, Dv)


def linear_attention(q, k, v, feature_map: str = "elu", causal: bool = False,
                     normalize: bool = True, eps: float = 1e-6, hooks=None):
    """φ(q)(φ(k)ᵀ v) / φ(q)·Σφ(k): q, k (B, H, N, D), v (B, H, N, Dv) Tensors → (B, H, N, Dv).
    ``hooks``: the layer whose φ hooks to run (``kernel_feature_hooks``), or None.

    Bidirectional, with no φ hook set, it is one node (``KernelAttentionFunction``, O(N·D)
    memory); otherwise it is composed of differentiable ops, so hooks can see and replace φ."""
    features = ElementwiseFeatures(feature_map)
    hooked = hooks is not None and (hooks.hook_phi_q.active or hooks.hook_phi_k.active or
                                    hooks.hook_pattern.active)
    # Bidirectional without hooks: the fused node. Otherwise composed of differentiable ops, so
    # hooks can see and replace φ(Q), φ(K).
    if not causal and not hooked:
        return KernelAttentionFunction.apply(q, k, v, features=features, normalize=normalize,
                                             eps=eps)
    fq, fk = apply_feature_map(q, features), apply_feature_map(k, features)      # (B, H, N, D)
    if hooks is not None:
        fq, fk = kernel_feature_hooks(hooks, fq, fk, causal, eps, normalize)
    # Bidirectional: S = φ(K)ᵀ V once for all queries. Causal: prefix sums
    # S_i = Σ_{j≤i} φ(k_j) v_jᵀ, one (D, Dv) state per position — the RNN, unrolled.
    if not causal:
        s = F.matmul(F.swapaxes(fk, -1, -2), v)                     # (B, H, D, N) @ (B, H, N, Dv)
        num = F.matmul(fq, s)                                       # (B, H, N, D) @ (B, H, D, Dv)
        z = fk.sum(axis=2, keepdims=True)                           # (B, H, 1, D)
    else:
        outer = F.expand_dims(fk, -1) * F.expand_dims(v, -2)        # (B, H, N, D, Dv)
        s = F.cumsum(outer, axis=2)                                 # S_i, (B, H, N, D, Dv)
        num = F.squeeze(F.matmul(F.expand_dims(fq, -2), s), -2)     # (B, H, N, Dv)
        z = F.cumsum(fk, axis=2)                                    # z_i, (B, H, N, D)
    # den_i = φ(q_i)·z_i; ε keeps it off zero (relu can give 0).
    if not normalize:
        return num
    den = (fq * z).sum(axis=-1, keepdims=True)                      # (B, H, N, 1)
    return num / (den + eps)


def linear_attention_step(state, q, k, v, feature_map: str = "elu", normalize: bool = True,
                          eps: float = 1e-6):
    """One recurrent step: q, k (B, H, D), v (B, H, Dv), state (S (B, H, D, Dv), z (B, H, D))
    or None (empty) → (out (B, H, Dv), new state). O(D·Dv) per token."""
    features = ElementwiseFeatures(feature_map)
    fq, fk = apply_feature_map(q, features), apply_feature_map(k, features)
    update = F.expand_dims(fk, -1) * F.expand_dims(v, -2)           # (B, H, D, Dv)
    if state is None:
        s, z = update, fk
    else:
        s, z = state[0] + update, state[1] + fk
    num = F.squeeze(F.matmul(F.expand_dims(fq, -2), s), -2)         # (B, H, 1, D) @ (B, H, D, Dv)
    if not normalize:
        return num, (s, z)
    den = (fq * z).sum(axis=-1, keepdims=True)                      # (B, H, 1)
    return num / (den + eps), (s, z)


@register("linear")
class LinearAttention(AttentionBase):
    r"""Linear attention: a feature-map similarity φ(q)·φ(k) instead of exp, linear in N; an RNN
    when causal.

    Formula: the module docstring's, bidirectional or causal (an RNN with state (S, z)).
    φ(x) = elu(x) + 1 by default; with ``normalize=False``, only the numerator φ(q_i)ᵀ S.
    No 1/√D.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); S (B, H, D, D) bidirectional, (B, H, N, D, D) causal;
    ``step(state, q, k, v)``: q (B, H, D), k/v (B, Hkv, D) → (out (B, H, D), state (S, z)).

    Options: ``feature_map`` ("elu" default, "relu", "identity"), ``normalize`` (None → True
    except for "identity"), ``eps`` ε (1e-6), ``causal`` (False).

    Complexity: {complexity}; the causal prefix sums; ``step`` is O(D²) per token, independent
    of the position.

    Exactness: a different score function (tested against its own dense formula, ``reference``).

    Reference: Katharopoulos, Vyas, Pappas & Fleuret (2020), "Transformers are RNNs: Fast
    Autoregressive Transformers with Linear Attention".
    """

    complexity = "time O(B·H·N·D²), memory O(B·H·(N·D + D²)); causal memory O(B·H·N·D²)"

    kind = "score"

    def __init__(self, embed_dim, num_heads, causal=False, feature_map: str = "elu",
                 normalize: bool = None, eps: float = 1e-6, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        self.hook_phi_q = HookPoint()     # (B, H, N, D) φ(Q)
        self.hook_phi_k = HookPoint()     # (B, H, N, D) φ(K)
        self.hook_pattern = HookPoint()   # (B, H, N, N) implied pattern, read-only, on request
        self.feature_map = validate.choice(feature_map, "feature_map", sorted(FEATURE_MAPS),
                                           owner="linear")
        self.normalize = (feature_map != "identity") if normalize is None else \
            validate.boolean(normalize, "normalize", owner="linear")
        self.eps = validate.positive_real(eps, "eps", owner="linear")

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, Dv)."""
        _, h, *_ = check_heads(q, k, v, self.name)
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        return linear_attention(q, k, v, self.feature_map, self.causal, self.normalize, self.eps,
                                hooks=self)

    def step(self, state, q, k, v):
        """Recurrent decoding: q (B, H, D), k/v (B, Hkv, D) → (out (B, H, Dv), state)."""
        h = q.shape[1]
        if k.shape[1] != h:
            k = F.reshape(repeat_kv(F.expand_dims(k, 2), h), (k.shape[0], h, k.shape[-1]))
            v = F.reshape(repeat_kv(F.expand_dims(v, 2), h), (v.shape[0], h, v.shape[-1]))
        return linear_attention_step(state, q, k, v, self.feature_map, self.normalize, self.eps)

    def reference(self, q, k, v):
        """Raw-array dense formula with the same similarity, (B, H, N, N) — for tests."""
        xp = get_array_module(q)
        features = ElementwiseFeatures(self.feature_map)
        fq = features.phi(q, True)
        fk = features.phi(repeat_kv_array(k, q.shape[1]), False)
        vv = repeat_kv_array(v, q.shape[1])
        a = fq @ xp.swapaxes(fk, -1, -2)                            # (B, H, N, N)
        if self.causal:
            a = a * xp.tri(a.shape[-2], a.shape[-1], dtype=a.dtype)
        if self.normalize:
            a = a / (a.sum(-1, keepdims=True) + self.eps)
        return a @ vv
