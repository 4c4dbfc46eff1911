r"""Hyper-connections: the residual stream widened to n parallel streams, each layer reading a
mix of them and writing its output back spread over them (Zhu et al. 2025; DeepSeek-V4's
manifold-constrained form, Xie et al. 2026; Qwen4-Exp's gated form).

A plain pre-norm block keeps one residual vector $h \in \mathbb{R}^E$ per token and adds the
layer's output to it, $h' = h + F(h)$. A hyper-connection keeps $n$ of them,
$H = [h_1; \dots; h_n] \in \mathbb{R}^{n \times E}$, and around each layer $F$ (attention or
MLP) does three things, with weights computed from $H$ itself:

$$
x = \mathrm{read}(H), \qquad
h'_k = \sum_{j=1}^{n} M_{jk}\, h_j + b_k\, F(x) \qquad (k = 1 \dots n)
$$

*read* collapses the streams into the layer's input, $b \in \mathbb{R}^n$ (*write*) spreads
the layer's output over the streams, and $M \in \mathbb{R}^{n \times n}$ (*mix*) carries the
streams on. The first layer's streams are $n$ copies of the embedding
(``expand_streams``), and after the last layer a final *read* collapses them
(``ManifoldHyperHead``; Qwen4-Exp's ``GatedHyperConnection(inject=False)``).

**mHC, DeepSeek-V4** (``ManifoldHyperConnection``). The weights are one linear map
$W \in \mathbb{R}^{(2n + n^2) \times nE}$ of the flattened, RMS-normalised streams (no norm
weight), each of its three parts with its own scale $\alpha$ and bias $\beta$:

$$
\tilde h = \frac{\mathrm{vec}(H)}{\mathrm{rms}(\mathrm{vec}(H))} \in \mathbb{R}^{nE},
\qquad
[\ell^{\mathrm{pre}}; \ell^{\mathrm{post}}; \ell^{\mathrm{res}}] = W \tilde h
\in \mathbb{R}^{n + n + n^2}
$$

$$
a = \sigma(\alpha_{\mathrm{pre}} \ell^{\mathrm{pre}} + \beta_{\mathrm{pre}}) + \epsilon,
\qquad
b = 2\,\sigma(\alpha_{\mathrm{post}} \ell^{\mathrm{post}} + \beta_{\mathrm{post}}),
\qquad
M = \mathrm{Sinkhorn}_T\!\big(\mathrm{softmax}_{\mathrm{row}}(\alpha_{\mathrm{res}}
\ell^{\mathrm{res}} + \beta_{\mathrm{res}}) + \epsilon\big),
\qquad x = \sum_i a_i\, h_i
$$

($\ell^{\mathrm{res}}$ read as an $n \times n$ matrix, row-major). Sinkhorn–Knopp makes $M$
doubly stochastic — rows and columns summing to one, so the mix neither grows nor shrinks the
streams' total and a deep stack stays stable. It alternates column and row normalisation,
$T$ rounds in all, the softmax counting as the first round's row step:

$$
M \leftarrow M \oslash (\mathbf{1}\mathbf{1}^\top M + \epsilon) \quad\text{(columns)},
\qquad \text{then } T - 1 \text{ times: }
M \leftarrow M \oslash (M \mathbf{1}\mathbf{1}^\top + \epsilon),\;
M \leftarrow M \oslash (\mathbf{1}\mathbf{1}^\top M + \epsilon)
$$

so after any round the columns sum to one (to $\epsilon$) and the rows' error shrinks
geometrically with $T$ (``sinkhorn``; DeepSeek-V4: $T = 20$, $\epsilon = 10^{-6}$). The
layer sees $x$ through its own input norm. The final collapse (``ManifoldHyperHead``) is the
read alone, $a = \sigma(\alpha\, W_{\mathrm{head}} \tilde h + \beta) + \epsilon$,
$W_{\mathrm{head}} \in \mathbb{R}^{n \times nE}$, output $\sum_i a_i h_i$.

**Gated, Qwen4-Exp** (``GatedHyperConnection``). No mix ($M = I$: $h'_k = h_k + b_k F(x)$),
and the read is a gate per stream *and feature*, through a rank-$r$ bottleneck. Each stream
is RMS-normalised on its own, with a norm weight $1 + \gamma$ (Qwen's zero-centred weight),
$\hat h_i = h_i / \mathrm{rms}(h_i) \odot (1 + \gamma_i)$, $\hat h = \mathrm{vec}(\hat H)$:

$$
G = \sigma\!\Big(U\, \mathrm{silu}\big(\tfrac{1}{n} D \hat h\big)\Big) \in \mathbb{R}^{nE}
\ (\text{read as } n \times E),
\qquad x = \frac{1}{n} \sum_i g_i \odot \hat h_i,
\qquad b = 2\,\sigma\!\big(\tfrac{1}{n} C \hat h\big)
$$

with $D \in \mathbb{R}^{r \times nE}$, $U \in \mathbb{R}^{nE \times r}$,
$C \in \mathbb{R}^{n \times nE}$, no biases. $x$ is already normalised: the layer takes it as
it is. The final collapse is the same read without $b$ (``inject=False``).

**Shapes.** The streams are (B, N, n, E) throughout (the plain residual is n = 1); the layer's
input and output (B, N, E); a (B, N, n) for a, b and (B, N, n, n) for M.

**Cost** per token, over a plain residual: memory n·E for the residual instead of E (the
layers themselves are unchanged, they see one E-vector). Time: mHC
O(nE·(2n + n²)) for the weights, O(T·n²) for Sinkhorn, O(n²E) for the mix; gated
O(nE·r) for the bottleneck and O(n²E) for b. No cache: the weights depend on the token's own
streams only, so decoding needs nothing from earlier tokens.

What minitx leaves out or does differently: it computes in the model's dtype (HF computes
the mHC weights, and Qwen's norms, in float32); the parameters are named for what they do
(HF's names beside each in the class docstrings).
"""
from __future__ import annotations

from .. import backend, validate
from .. import functional as F
from . import init
from .hooks import HookPoint
from .layers import Linear
from .module import Module, Parameter

__all__ = ["sinkhorn", "expand_streams", "HyperConnection", "ManifoldHyperConnection",
           "ManifoldHyperHead", "GatedHyperConnection"]


def sinkhorn(logits, iterations: int = 20, eps: float = 1e-6):
    r"""Sinkhorn–Knopp from logits (module docstring): the row softmax plus eps, a column
    normalisation, then ``iterations`` − 1 rounds of row and column normalisation, each
    denominator plus eps. logits (..., n, n) Tensor → (..., n, n), differentiable (the rounds
    are unrolled). Columns sum to 1 to within eps after every round; the rows' error shrinks
    as ``iterations`` grows."""
    iterations = validate.positive_int(iterations, "iterations", owner="sinkhorn")
    eps = validate.nonnegative_real(eps, "eps", owner="sinkhorn")
    m = F.softmax(logits, axis=-1) + eps                   # rows: the first round's row step
    m = m / (F.sum(m, axis=-2, keepdims=True) + eps)       # columns
    for _ in range(iterations - 1):
        m = m / (F.sum(m, axis=-1, keepdims=True) + eps)   # rows
        m = m / (F.sum(m, axis=-2, keepdims=True) + eps)   # columns
    return m


def expand_streams(x, num_streams: int):
    """The first layer's streams: n copies of the embedding, (B, N, E) → (B, N, n, E)."""
    num_streams = validate.positive_int(num_streams, "num_streams", owner="expand_streams")
    b, n, e = x.shape
    return F.broadcast_to(F.reshape(x, (b, n, 1, e)), (b, n, num_streams, e))


def _zeros(shape, dtype) -> Parameter:
    return Parameter(backend.xp().zeros(shape, dtype=dtype))


def _float_dtype(dtype, owner):
    dt = backend.default_float() if dtype is None else backend.as_dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{owner}: dtype must be floating point, got {dt}")
    return dt


class HyperConnection(Module):
    """The read/write/mix around one layer (module docstring), shared by the two flavours.

    ``forward(h, layer)``: streams h (B, N, n, E) and a callable ``layer`` (B, N, E) →
    (B, N, E) → new streams (B, N, n, E). A subclass implements ``read(h)`` → (x (B, N, E),
    b (B, N, n), M (B, N, n, n) or None for the identity), and the write is
    h'_k = Σ_j M_jk h_j + b_k F(x).

    Hook points: ``hook_read`` the layer's input x (B, N, E), ``hook_write`` b (B, N, n)
    (and the mHC's ``hook_mix`` M (B, N, n, n)); each may replace what it sees.
    """

    def __init__(self, hidden_size: int, num_streams: int = 4):
        super().__init__()
        who = type(self).__name__
        self.hidden_size = validate.positive_int(hidden_size, "hidden_size", owner=who)
        self.num_streams = validate.positive_int(num_streams, "num_streams", owner=who)
        self.hook_read = HookPoint()      # (B, N, E) x, the layer's input
        self.hook_write = HookPoint()     # (B, N, n) b

    def _check(self, h):
        n, e = self.num_streams, self.hidden_size
        if len(h.shape) != 4 or tuple(h.shape[2:]) != (n, e):
            raise ValueError(f"{type(self).__name__}: h (the streams) must be (B, N, {n}, {e}), "
                             f"got shape {tuple(h.shape)}")

    def read(self, h):  # pragma: no cover - abstract
        raise NotImplementedError

    def write(self, h, y, b, m=None):
        """h'_k = Σ_j M_jk h_j + b_k y: h (B, N, n, E), y = F(x) (B, N, E), b (B, N, n),
        M (B, N, n, n) or None (h'_k = h_k + b_k y)."""
        bsz, n_tok, n, e = h.shape
        # (B, N, n, 1) * (B, N, 1, E) -> (B, N, n, E): the output spread over the streams
        out = F.reshape(b, (bsz, n_tok, n, 1)) * F.reshape(y, (bsz, n_tok, 1, e))
        if m is None:
            return h + out
        # Σ_j M_jk h_j = (Mᵀ H)_k: (B, N, n, n)ᵀ @ (B, N, n, E) -> (B, N, n, E)
        return F.matmul(F.swapaxes(m, -1, -2), h) + out

    def forward(self, h, layer):
        """h (B, N, n, E) → (B, N, n, E) around ``layer`` (B, N, E) → (B, N, E)."""
        self._check(h)
        x, b, m = self.read(h)
        return self.write(h, layer(x), b, m)


class ManifoldHyperConnection(HyperConnection):
    r"""DeepSeek-V4's manifold-constrained hyper-connection (mHC): read a = σ(·) + ε, write
    b = 2σ(·), mix M doubly stochastic by Sinkhorn (module docstring, "mHC").

    Parameters (HF's ``DeepseekV4HyperConnection`` names in brackets): ``weight``
    (2n + n², n·E) [``fn``], rows in the order pre, post, res; ``bias`` (2n + n²) [``base``];
    ``scale`` (3) [``scale``], α_pre, α_post, α_res. Initialised as HF's: weight
    N(0, ``init_std``²), bias 0, scale 1.

    Options: ``hidden_size`` E, ``num_streams`` n (4), ``sinkhorn_iterations`` T (20),
    ``eps`` ε (1e-6; in a and in Sinkhorn), ``norm_eps`` (1e-6; the RMS norm of the streams),
    ``init_std`` (0.02), ``dtype``.

    ``read(h)`` → (x (B, N, E), b (B, N, n), M (B, N, n, n)); the caller's layer norms x.
    Cost: O(nE·(2n + n²) + T·n² + n²E) per token.
    """

    def __init__(self, hidden_size: int, num_streams: int = 4, sinkhorn_iterations: int = 20,
                 eps: float = 1e-6, norm_eps: float = 1e-6, init_std: float = 0.02,
                 dtype=None):
        super().__init__(hidden_size, num_streams)
        who = type(self).__name__
        self.sinkhorn_iterations = validate.positive_int(sinkhorn_iterations,
                                                         "sinkhorn_iterations", owner=who)
        self.eps = validate.nonnegative_real(eps, "eps", owner=who)
        self.norm_eps = validate.positive_real(norm_eps, "norm_eps", owner=who)
        init_std = validate.nonnegative_real(init_std, "init_std", owner=who)
        n, dt = self.num_streams, _float_dtype(dtype, who)
        width = (2 + n) * n                                     # pre n, post n, res n²
        self.weight = _zeros((width, n * self.hidden_size), dt)
        init.normal_(self.weight, 0.0, init_std)
        self.bias = _zeros((width,), dt)
        self.scale = Parameter(backend.xp().ones((3,), dtype=dt))
        self.hook_mix = HookPoint()       # (B, N, n, n) M

    def coefficients(self, h):
        """a (B, N, n), b (B, N, n), M (B, N, n, n) from the streams h (B, N, n, E)."""
        bsz, n_tok, n, e = h.shape
        flat = F.rms_norm(F.reshape(h, (bsz, n_tok, n * e)), (n * e,), None, self.norm_eps)
        ell = F.linear(flat, self.weight)                       # (B, N, 2n + n²)
        # the three parts: pre (n), post (n), res (n², row-major), each its scale and bias
        parts = (slice(0, n), slice(n, 2 * n), slice(2 * n, (2 + n) * n))
        lp, lq, lr = (F.getitem(ell, (Ellipsis, part)) for part in parts)
        bp, bq, br = (F.getitem(self.bias, part) for part in parts)
        sp, sq, sr = (F.getitem(self.scale, slice(i, i + 1)) for i in range(3))
        a = F.sigmoid(lp * sp + bp) + self.eps
        b = 2.0 * F.sigmoid(lq * sq + bq)
        m = sinkhorn(F.reshape(lr * sr + br, (bsz, n_tok, n, n)), self.sinkhorn_iterations,
                     self.eps)
        return a, b, m

    def read(self, h):
        """x = Σ_i a_i h_i (B, N, E), with b and M (see the class docstring)."""
        a, b, m = self.coefficients(h)
        bsz, n_tok, n, _ = h.shape
        x = F.sum(F.reshape(a, (bsz, n_tok, n, 1)) * h, axis=2)          # (B, N, E)
        return self.hook_read(x), self.hook_write(b), self.hook_mix(m)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_streams={self.num_streams}, "
                f"sinkhorn_iterations={self.sinkhorn_iterations}, eps={self.eps}")


class ManifoldHyperHead(Module):
    r"""DeepSeek-V4's final collapse of the streams: x = Σ_i a_i h_i with
    a = σ(α W_head h̃ + β) + ε (module docstring, "mHC"). h (B, N, n, E) → (B, N, E).

    Parameters [HF's ``DeepseekV4HyperHead``]: ``weight`` (n, n·E) [``hc_fn``], ``bias`` (n)
    [``hc_base``], ``scale`` (1) [``hc_scale``]. Options as ``ManifoldHyperConnection``'s
    (``eps``, ``norm_eps``, ``init_std``, ``dtype``). Hook point ``hook_read`` a (B, N, n).
    """

    def __init__(self, hidden_size: int, num_streams: int = 4, eps: float = 1e-6,
                 norm_eps: float = 1e-6, init_std: float = 0.02, dtype=None):
        super().__init__()
        who = type(self).__name__
        self.hidden_size = validate.positive_int(hidden_size, "hidden_size", owner=who)
        self.num_streams = n = validate.positive_int(num_streams, "num_streams", owner=who)
        self.eps = validate.nonnegative_real(eps, "eps", owner=who)
        self.norm_eps = validate.positive_real(norm_eps, "norm_eps", owner=who)
        init_std = validate.nonnegative_real(init_std, "init_std", owner=who)
        dt = _float_dtype(dtype, who)
        self.weight = _zeros((n, n * self.hidden_size), dt)
        init.normal_(self.weight, 0.0, init_std)
        self.bias = _zeros((n,), dt)
        self.scale = Parameter(backend.xp().ones((1,), dtype=dt))
        self.hook_read = HookPoint()      # (B, N, n) a

    def forward(self, h):
        n, e = self.num_streams, self.hidden_size
        if len(h.shape) != 4 or tuple(h.shape[2:]) != (n, e):
            raise ValueError(f"{type(self).__name__}: h (the streams) must be (B, N, {n}, {e}), "
                             f"got shape {tuple(h.shape)}")
        bsz, n_tok = h.shape[:2]
        flat = F.rms_norm(F.reshape(h, (bsz, n_tok, n * e)), (n * e,), None, self.norm_eps)
        a = self.hook_read(F.sigmoid(F.linear(flat, self.weight) * self.scale + self.bias)
                           + self.eps)                                   # (B, N, n)
        return F.sum(F.reshape(a, (bsz, n_tok, n, 1)) * h, axis=2)


class GatedHyperConnection(HyperConnection):
    r"""Qwen4-Exp's hyper-connection: a low-rank gate per stream and feature reads the
    normalised streams, b = 2σ(C ĥ / n) writes, no mix (module docstring, "Gated").

    Parameters [HF's ``Qwen4ExpTextGatedResidual``]: ``norm_weight`` γ (n·E)
    [``hc_norm.weight``], zero-centred (the norm multiplies by 1 + γ); ``mix_down`` D, a
    Linear n·E → r [``input_mix_weight_down``]; ``mix_up`` U, r → n·E
    [``input_mix_weight_up``]; ``inject`` C, n·E → n [``block_inject_weight``]; no biases.
    γ starts at 0, the Linears at nn.Linear's default.

    Options: ``hidden_size`` E, ``num_streams`` n (4), ``rank`` r (Qwen4-Exp: 320; default
    E), ``norm_eps`` (1e-6), ``inject`` (True; False: the final collapse, ``forward(h)`` →
    x (B, N, E), no b and no ``inject`` weight), ``dtype``.

    ``read(h)`` → (x (B, N, E), b (B, N, n) or None, None); x is normalised already.
    Hook points as ``HyperConnection``'s, and ``hook_gate`` G (B, N, n, E).
    Cost: O(nE·r + n²E) per token.
    """

    def __init__(self, hidden_size: int, num_streams: int = 4, rank: int = None,
                 norm_eps: float = 1e-6, inject: bool = True, dtype=None):
        super().__init__(hidden_size, num_streams)
        who = type(self).__name__
        e, n = self.hidden_size, self.num_streams
        self.rank = e if rank is None else validate.positive_int(rank, "rank", owner=who)
        self.norm_eps = validate.positive_real(norm_eps, "norm_eps", owner=who)
        self.injects = validate.boolean(inject, "inject", owner=who)
        dt = _float_dtype(dtype, who)
        self.norm_weight = _zeros((n * e,), dt)
        self.mix_down = Linear(n * e, self.rank, bias=False, dtype=dt)
        self.mix_up = Linear(self.rank, n * e, bias=False, dtype=dt)
        if self.injects:
            self.inject = Linear(n * e, n, bias=False, dtype=dt)
        self.hook_gate = HookPoint()      # (B, N, n, E) G

    def read(self, h):
        """x = (1/n) Σ_i g_i ⊙ ĥ_i (B, N, E) and b (B, N, n) (None without ``inject``)."""
        bsz, n_tok, n, e = h.shape
        # each stream normalised on its own, weight 1 + γ: (B, N, n, E) → ĥ (B, N, n·E)
        gamma = F.reshape(self.norm_weight, (n, e)) + 1.0                 # (n, E)
        hat = F.reshape(F.rms_norm(h, (e,), None, self.norm_eps) * gamma, (bsz, n_tok, n * e))
        gate = F.sigmoid(self.mix_up(F.silu(self.mix_down(hat) / n)))   # (B, N, n·E)
        gate = self.hook_gate(F.reshape(gate, (bsz, n_tok, n, e)))
        x = self.hook_read(F.mean(gate * F.reshape(hat, (bsz, n_tok, n, e)), axis=2))
        if not self.injects:
            return x, None, None
        b = self.hook_write(2.0 * F.sigmoid(self.inject(hat) / n))       # (B, N, n)
        return x, b, None

    def forward(self, h, layer=None):
        """h (B, N, n, E) → (B, N, n, E) around ``layer``; without ``inject`` (the final
        collapse) ``forward(h)`` → x (B, N, E)."""
        self._check(h)
        if not self.injects:
            if layer is not None:
                raise validate.OptionError(f"{type(self).__name__}: inject=False is the final "
                                           "collapse, forward(h) takes no layer")
            return self.read(h)[0]
        if layer is None:
            raise validate.OptionError(f"{type(self).__name__}: forward(h, layer) needs the "
                                       "layer it connects (inject=True)")
        return super().forward(h, layer)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_streams={self.num_streams}, "
                f"rank={self.rank}, inject={self.injects}")

