r"""Mixture of experts: a router picks $k$ of $n$ expert MLPs for each token, and the token's
output is the weighted sum of theirs (Shazeer et al. 2017; Switch Transformer, Fedus et al.
2021; Mixtral, Jiang et al. 2024; DeepSeek-V3, DeepSeek-AI 2024; gpt-oss, OpenAI 2025).

Each token $x \in \mathbb{R}^E$ (the rows of a (B·N, E) matrix) goes through four steps.

**1. Router logits**, one per expert: $\ell = W_r x + b_r \in \mathbb{R}^n$ (the bias only in
gpt-oss).

**2. The choice $K$ (k experts) and their weights $w_e$**, four ways:

- ``"softmax"`` (Mixtral, Qwen2/3-MoE): probabilities, their top k, renormalised over the k
  when ``norm_topk_prob`` (Mixtral always; Qwen's config says), else kept as they are:

$$p = \mathrm{softmax}(\ell), \qquad K = \mathrm{topk}(p, k), \qquad
w_e = \frac{p_e}{\sum_{j \in K} p_j} \ \text{ or } \ w_e = p_e \qquad (e \in K)$$

- ``"topk_softmax"`` (gpt-oss): the top k logits, then a softmax over those k only,
  $w_e = e^{\ell_e} / \sum_{j \in K} e^{\ell_j}$. The same numbers as the renormalised
  softmax router (softmax keeps the order of the logits, and its normaliser cancels in the
  ratio); gpt-oss just never forms the probabilities of the experts it does not use.
- ``"topk_sigmoid"`` (Llama 4): the top k logits, each through a sigmoid of its own, not
  renormalised: $w_e = \sigma(\ell_e)$ for $e \in K = \mathrm{topk}(\ell, k)$.
- ``"sigmoid_grouped"`` (DeepSeek-V3): independent sigmoid scores $s = \sigma(\ell)$; a
  correction bias $\beta$ (``e_score_correction_bias``, a buffer that training nudges to
  balance the load, not a gradient-trained parameter) is added **only to choose**:
  $c = s + \beta$. The $n$ experts form $G$ groups (``n_group``) of $n/G$; a group's score
  is the sum of its two largest $c_e$, the ``topk_group`` best groups are kept, and
  $K = \mathrm{topk}(c, k)$ over the experts of the kept groups. The weights come from the
  uncorrected scores, renormalised when ``norm_topk_prob``:

$$w_e = \frac{s_e}{\sum_{j \in K} s_j + 10^{-20}} \quad (e \in K)$$

Every router finally multiplies the weights by ``routed_scaling_factor`` $\rho$ (DeepSeek-V3:
2.5; 1 elsewhere).

**3. The experts.** Expert $e$ is a SwiGLU MLP (Shazeer 2020) with its own weights
$W^g_e, W^u_e \in \mathbb{R}^{I \times E}$ and $W^d_e \in \mathbb{R}^{E \times I}$:

$$f_e(x) = W^d_e \big( \mathrm{silu}(W^g_e x) \odot W^u_e x \big)$$

gpt-oss clamps the two halves and gives the up half an offset of one (``"clamped_swiglu"``,
limit $L = 7$, $\alpha = 1.702$, with biases):

$$g = \min(W^g_e x + b^g_e,\ L), \qquad u = \mathrm{clip}(W^u_e x + b^u_e,\ -L,\ L), \qquad
f_e(x) = W^d_e \big( g\, \sigma(\alpha g) \odot (u + 1) \big) + b^d_e$$

Nemotron-H's experts, and its shared expert, have no gate (``"relu2"``):
$f_e(x) = W^d_e \max(W^u_e x, 0)^2$. Its MoE may also run the experts in a narrower latent
space (``latent_size`` L): their input is $W_{1} x$ (E → L) and their weighted sum goes back
through $W_{2}$ (L → E); the router and the shared expert read x itself.

**4. The output**: the chosen experts' outputs, weighted, plus the shared expert $f_s$ that
every token goes through (DeepSeek-V3; Qwen2-MoE gates it with a sigmoid of $w_s \cdot x$):

$$y = \sum_{e \in K} w_e\, f_e(x) \;+\; \big[\sigma(w_s \cdot x)\big]\, f_s(x)$$

Llama 4 weighs the expert's input instead (``weights_on_input``), which is not the same for a
SwiGLU expert (it is not linear): $y = \sum_{e \in K} f_e(w_e\, x) + f_s(x)$.

**The load-balancing loss** (Switch Transformer's; Mixtral's and Qwen's training add it, times
``router_aux_loss_coef``). Over $T$ tokens, $f_e$ counts the tokens that chose $e$ among their
k, and $P_e$ is $e$'s mean softmax probability:

$$\mathcal{L}_{\mathrm{aux}} = n \sum_{e=1}^{n} f_e P_e, \qquad
f_e = \frac{1}{T} \sum_{t=1}^{T} \mathbf{1}[e \in K_t], \qquad
P_e = \frac{1}{T} \sum_{t=1}^{T} p_{t,e}$$

$\sum_e f_e = k$ (every top-k choice counts; HF's ``load_balancing_loss_func`` divides by T,
not by kT), so a perfectly uniform router scores $k$. Only $P$ carries a gradient: the counts
are piecewise constant. With several layers the tokens of all layers are pooled into one $f$
and one $P$ (as HF does), not summed layer by layer.

**Dispatch, never a loop over tokens.** The T·k (token, slot) pairs are sorted by expert, so
that each expert's tokens form one contiguous block of the gathered rows. Each of the three
projections is then one *grouped product* (``grouped_linear``): a Python loop over the experts
multiplies each block by its own expert's matrix, and in the backward writes each expert's
gradient $\bar W_e = \bar Y_e^\top X_e$ into its own slice of one gradient of the stacked
weights (an expert that got no token keeps zeros), so a step writes the stack's size once,
not once per expert. Undoing the sort and summing each token's k weighted outputs adds them
back. The backward of those two gathers is the scatter-add (``F.getitem``'s).

**Cost** per token: the router $O(nE)$, then $k$ experts of $3EI$ multiply-adds each — the
active parameters are $k$ experts' (plus the shared one), while the stored ones are $n$
experts'. DeepSeek-V3 keeps its first ``first_k_dense_replace`` layers dense (an ordinary MLP,
the decoder's choice of block, nothing here), and Qwen2/3-MoE picks its MoE layers with
``decoder_sparse_step`` and ``mlp_only_layers``.

HF's floating-point habits differ from this reference: HF computes the Mixtral and Qwen
routers' softmax and DeepSeek-V3's whole router in float32 even in a float64 model; minitx
computes in the model's dtype throughout. Ties in a top-k go to the lower expert index here
(a stable sort); torch's top-k leaves them unspecified. The HF tensor names of each family's
MoE block, and how they map onto these parameters, are in ``docs/moe.md``.
"""
from __future__ import annotations

import math

from .. import backend, validate
from .. import functional as F
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module, to_device_of
from . import init
from .decoder_layers import DenseMLP, GatedMLP
from .hooks import HookPoint
from .layers import Linear
from .module import Module, Parameter

# the block and its parts, the three routers, the statistic, the loss and the grouped product
__all__ = ["MoE", "Router", "Experts", "SharedExpert", "softmax_topk", "topk_softmax",
           "sigmoid_grouped_topk", "tokens_per_expert", "load_balancing_loss", "GroupedLinear",
           "grouped_linear", "ROUTERS", "EXPERT_KINDS"]

ROUTERS = ("softmax", "topk_softmax", "sigmoid_grouped", "topk_sigmoid")
EXPERT_KINDS = ("swiglu", "clamped_swiglu", "relu2")


# ---- the three routers, as functions of the logits (T, n) → weights (T, k), choices (T, k) --

def softmax_topk(logits: Tensor, k: int, normalize: bool = True):
    """Mixtral / Qwen-MoE routing (formula: module docstring, step 2).

    logits (T, n) → (weights (T, k), indices (T, k)), best first. ``normalize``: divide the
    k probabilities by their sum (``norm_topk_prob``). Gradients reach the logits through the
    k chosen probabilities (and, through the softmax, every logit).
    """
    p = F.softmax(logits, axis=-1)                       # (T, n)
    w, indices = F.topk(p, k, axis=-1)                   # (T, k) each
    if normalize:
        w = w / F.sum(w, axis=-1, keepdims=True)
    return w, indices


def topk_softmax(logits: Tensor, k: int):
    """gpt-oss routing: the top k logits, then a softmax over those k (module docstring, step
    2). logits (T, n) → (weights (T, k), indices (T, k)), best first. The same weights as
    ``softmax_topk(logits, k, normalize=True)``."""
    top, indices = F.topk(logits, k, axis=-1)            # (T, k) each
    return F.softmax(top, axis=-1), indices


def sigmoid_grouped_topk(logits: Tensor, k: int, correction_bias, n_group: int = 1,
                         topk_group: int = 1, normalize: bool = True):
    """DeepSeek-V3 routing: sigmoid scores, the correction bias used only to choose, and
    group-limited top-k (module docstring, step 2).

    logits (T, n), ``correction_bias`` (n,) (a Tensor or array; it gets no gradient) →
    (weights (T, k), indices (T, k)), in order of the corrected score. ``n_group`` groups of
    n / n_group experts; a group scores the sum of its two best corrected scores and the
    ``topk_group`` best groups stay eligible. The weights are the uncorrected scores of the
    chosen experts, divided by their sum (+ 1e-20, so that k scores that all underflow to 0 give
    0, not NaN) when ``normalize``.
    """
    s = F.sigmoid(logits)                                # (T, n): the weights come from these
    bias = correction_bias.data if isinstance(correction_bias, Tensor) else correction_bias
    bias = to_device_of(bias, s.data)                   # a host array meets device data once
    xp = get_array_module(s.data)
    # the choice is piecewise constant in the logits: made on raw arrays, with no gradient
    c = s.data + bias                                    # (T, n) corrected scores
    t, n = c.shape
    if n_group > 1:
        groups = c.reshape(t, n_group, n // n_group)                  # (T, G, n/G)
        group_score = xp.sort(groups, axis=-1)[..., -2:].sum(axis=-1)  # (T, G) top-2 sums
        best = F.argsort(group_score, axis=-1, descending=True).data
        best = best[:, :topk_group]                                    # (T, topk_group)
        kept = (xp.arange(n_group)[None, None, :] == best[:, :, None]).any(axis=1)  # (T, G)
        c = xp.where(xp.repeat(kept, n // n_group, axis=1), c, -xp.inf)
    order = F.argsort(c, axis=-1, descending=True).data
    indices = order[:, :k]                                             # (T, k)
    w = F.take_along_axis(s, indices, axis=-1)                         # (T, k)
    if normalize:
        w = w / (F.sum(w, axis=-1, keepdims=True) + 1e-20)
    return w, Tensor._wrap(indices, False)


def tokens_per_expert(indices, num_experts: int):
    """How many (token, slot) choices went to each expert: indices (T, k) → counts (n,), an
    integer Tensor summing to T·k (the statistic behind the load-balancing loss's $f$)."""
    idx = indices.data if isinstance(indices, Tensor) else indices
    xp = get_array_module(idx)
    return Tensor._wrap(xp.bincount(idx.reshape(-1), minlength=num_experts), False)


def load_balancing_loss(router_logits, num_experts: int, top_k: int, attention_mask=None):
    """Switch / Mixtral load-balancing loss $n \\sum_e f_e P_e$ (module docstring), as HF's
    ``load_balancing_loss_func``.

    ``router_logits``: one layer's (T, n) logits (``MoE.router_logits``) or a sequence of
    them, one per layer, pooled. ``attention_mask`` (B, S) with B·S = T, optional: padding
    tokens (0) count in neither f nor P. Returns a scalar Tensor whose gradient reaches the
    logits through P. Cost O(L T n).
    """
    who = "load_balancing_loss"
    num_experts = validate.positive_int(num_experts, "num_experts", owner=who)
    top_k = validate.integer(top_k, "top_k", minimum=1, maximum=num_experts, owner=who)
    layers = [router_logits] if isinstance(router_logits, Tensor) else list(router_logits)
    if not layers:
        raise validate.OptionError(f"{who}: router_logits must be a Tensor or a non-empty "
                                   "sequence of Tensors, got an empty sequence")
    for i, lg in enumerate(layers):
        if len(lg.shape) != 2 or lg.shape[1] != num_experts:
            raise ValueError(f"{who}: router_logits[{i}] must have shape (tokens, "
                             f"{num_experts}), got {tuple(lg.shape)}")
    logits = F.concatenate(layers, axis=0) if len(layers) > 1 else layers[0]   # (L·T, n)
    p = F.softmax(logits, axis=-1)
    xp = get_array_module(p.data)
    m = xp.ones(p.shape[0], dtype=p.dtype)               # (L·T,) which tokens count
    if attention_mask is not None:
        mask = attention_mask.data if isinstance(attention_mask, Tensor) else attention_mask
        mask = xp.asarray(mask).reshape(-1).astype(p.dtype)
        if mask.size * len(layers) != p.shape[0]:
            raise ValueError(f"{who}: attention_mask has {mask.size} tokens but each layer's "
                             f"router_logits has {layers[0].shape[0]}")
        m = xp.tile(mask, len(layers))
    chosen = F.topk(Tensor._wrap(p.data), top_k, axis=-1)[1].data            # (L·T, k)
    one_hot = (chosen[:, :, None] == xp.arange(num_experts)).sum(axis=1)     # (L·T, n)
    tokens = m.sum()
    f = (m[:, None] * one_hot).sum(axis=0) / tokens                          # (n,) sums to k
    big_p = F.sum(p * Tensor._wrap(m[:, None]), axis=0) / Tensor._wrap(tokens)   # (n,)
    return num_experts * F.sum(Tensor._wrap(f) * big_p)


# ---- the grouped product: each expert's block of rows through its own matrix ----------------

class GroupedLinear(Function):
    """y_e = x_e W_eᵀ (+ b_e) for each block e of consecutive rows (module docstring, dispatch).

    x (M, in) with its rows grouped by expert, weight (n, out, in), bias (n, out) or None,
    ``counts``: the n block lengths (host ints summing to M) → (M, out). Backward, block by
    block: x̄_e = ȳ_e W_e, W̄_e = ȳ_eᵀ x_e, b̄_e = Σ_rows ȳ_e, each written into its own slice of
    one gradient of x's, the stack's and the biases' shapes. Time O(M · out · in); the
    gradient of the stack is allocated once, whatever n.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, counts):
        xp = get_array_module(x, weight)
        ctx.save_for_backward(x, weight)
        ctx.counts, ctx.has_bias = counts, bias is not None
        out = xp.empty((x.shape[0], weight.shape[1]), dtype=xp.result_type(x, weight))
        start = 0
        for e, m in enumerate(counts):                  # a loop over experts, not tokens
            rows = slice(start, start + m)
            out[rows] = x[rows] @ weight[e].T           # (m, in) @ (in, out) -> (m, out)
            if bias is not None:
                out[rows] += bias[e]
            start += m
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        nx, nw, nb = ctx.needs_input_grad
        xp = get_array_module(grad)
        gx = xp.empty(x.shape, dtype=x.dtype) if nx else None
        # zeros: an expert that received no token gets no gradient
        gw = xp.zeros(weight.shape, dtype=weight.dtype) if nw else None
        gb = xp.zeros(weight.shape[:2], dtype=grad.dtype) if nb and ctx.has_bias else None
        start = 0
        for e, m in enumerate(ctx.counts):
            rows = slice(start, start + m)
            g = grad[rows]                                               # (m, out)
            if gx is not None:
                gx[rows] = g @ weight[e]                                 # (m, in)
            if gw is not None:
                gw[e] = g.T @ x[rows]                                    # (out, in)
            if gb is not None:
                gb[e] = g.sum(axis=0)                                    # (out,)
            start += m
        return gx, gw, gb


def grouped_linear(x, weight, counts, bias=None):
    """Each expert's block of rows through its own matrix: x (M, in), rows sorted by expert
    into blocks of ``counts`` (n host ints summing to M), weight (n, out, in) in PyTorch's
    (out, in) layout, bias (n, out) or None → (M, out). See ``GroupedLinear``."""
    counts = [int(m) for m in counts]
    if len(x.shape) != 2 or len(weight.shape) != 3 or x.shape[1] != weight.shape[2] \
            or len(counts) != weight.shape[0] or sum(counts) != x.shape[0]:
        raise ValueError(f"grouped_linear: x must be (M, in) and weight (n, out, in) with n "
                         f"block counts summing to M, got x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}, {len(counts)} counts summing to {sum(counts)}")
    return GroupedLinear.apply(x, weight, bias, counts=counts)


# ---- the modules -----------------------------------------------------------------------------

def _uniform(shape, fan_in, dtype) -> Parameter:
    """U(−1/√fan_in, 1/√fan_in), nn.Linear's default range, for each expert's matrices."""
    p = Parameter(backend.xp().zeros(shape, dtype=dtype))
    bound = 1.0 / math.sqrt(fan_in)
    init.uniform_(p, -bound, bound)
    return p


def _float_dtype(dtype, owner):
    dt = backend.default_float() if dtype is None else backend.as_dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"{owner}: dtype must be floating point, got {dt}")
    return dt


class Router(Module):
    """The router: logits ℓ = W_r x (+ b_r), then the choice of k experts and their weights
    (module docstring, steps 1–2).

    ``forward(x)``: x (T, E) → logits (T, n). ``route(logits)`` → (weights (T, k), indices
    (T, k)); the two are separate so that a hook on the logits changes the choice.

    Parameters: ``weight`` (n, E), ``bias`` (n,) when ``bias`` (gpt-oss), and for
    ``kind="sigmoid_grouped"`` the buffer ``e_score_correction_bias`` (n,), zeros until loaded.
    Options as ``MoE``'s. Cost O(T n E) for the logits, O(T n log n) for the choice.
    """

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, kind: str = "softmax",
                 norm_topk_prob: bool = True, bias: bool = False, n_group: int = 1,
                 topk_group: int = 1, routed_scaling_factor: float = 1.0, device=None,
                 dtype=None):
        super().__init__()
        who = "Router"
        # sizes and the router's kind, each checked where it is given
        self.hidden_size = validate.positive_int(hidden_size, "hidden_size", owner=who)
        n = self.num_experts = validate.positive_int(num_experts, "num_experts", owner=who)
        self.top_k = validate.integer(top_k, "top_k", minimum=1, maximum=n, owner=who)
        self.kind = validate.choice(kind, "router", ROUTERS, owner=who)
        self.norm_topk_prob = validate.boolean(norm_topk_prob, "norm_topk_prob", owner=who)
        if kind == "topk_softmax" and not norm_topk_prob:
            raise validate.OptionError(f"{who}: norm_topk_prob must be True for router "
                                       "'topk_softmax' (its softmax over the k is normalised), "
                                       "got False")
        if kind == "topk_sigmoid" and norm_topk_prob:
            raise validate.OptionError(f"{who}: norm_topk_prob must be False for router "
                                       "'topk_sigmoid' (each weight is its own sigmoid, not "
                                       "renormalised), got True")
        # group-limited routing (DeepSeek-V3) and the factor on every routed weight
        self.n_group = validate.integer(n_group, "n_group", minimum=1, maximum=n, owner=who)
        self.topk_group = validate.integer(topk_group, "topk_group", minimum=1,
                                           maximum=self.n_group, owner=who)
        self._check_groups(who)
        self.routed_scaling_factor = validate.positive_real(
            routed_scaling_factor, "routed_scaling_factor", owner=who)
        # W_r (n, E), gpt-oss's bias b_r, DeepSeek's correction bias β (a buffer: it only
        # chooses, and training moves it by a rule, not by its gradient)
        dt = _float_dtype(dtype, who)
        self.weight = _uniform((n, hidden_size), hidden_size, dt)
        if validate.boolean(bias, "bias", owner=who):
            self.bias = _uniform((n,), hidden_size, dt)
        else:
            self.register_parameter("bias", None)
        if kind == "sigmoid_grouped":
            self.register_buffer("e_score_correction_bias", backend.xp().zeros(n, dtype=dt))
        self._factory(device)

    def _check_groups(self, who):
        n, g, kg, k = self.num_experts, self.n_group, self.topk_group, self.top_k
        # groups belong to the sigmoid router, divide n, hold two experts, and keep ≥ k
        if (g, kg) != (1, 1) and self.kind != "sigmoid_grouped":
            raise validate.OptionError(f"{who}: n_group and topk_group (group-limited routing) "
                                       "need router 'sigmoid_grouped', got router "
                                       f"{self.kind!r} with n_group={g}, topk_group={kg}")
        if n % g:
            raise validate.OptionError(f"{who}: n_group must divide num_experts ({n}), got {g}")
        if g > 1 and n // g < 2:
            raise validate.OptionError(f"{who}: each of the n_group groups needs at least 2 "
                                       f"experts (a group scores its top two), got {n} experts "
                                       f"in {g} groups")
        if k > kg * (n // g):
            raise validate.OptionError(f"{who}: top_k must be at most topk_group · num_experts "
                                       f"/ n_group = {kg * (n // g)} (the experts of the kept "
                                       f"groups), got {k}")

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)                     # (T, n)

    def route(self, logits: Tensor):
        if self.kind == "softmax":
            w, indices = softmax_topk(logits, self.top_k, self.norm_topk_prob)
        elif self.kind == "topk_softmax":
            w, indices = topk_softmax(logits, self.top_k)
        elif self.kind == "topk_sigmoid":                              # Llama 4's
            top, indices = F.topk(logits, self.top_k, axis=-1)
            w = F.sigmoid(top)
        else:
            w, indices = sigmoid_grouped_topk(logits, self.top_k, self.e_score_correction_bias,
                                              self.n_group, self.topk_group, self.norm_topk_prob)
        if self.routed_scaling_factor != 1.0:
            w = w * self.routed_scaling_factor
        return w, indices

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, kind={self.kind!r}")


class Experts(Module):
    """n expert MLPs with their weights stacked on a leading expert axis, and the dispatch
    (module docstring, steps 3–4).

    Parameters (PyTorch's (out, in) layout for each expert): ``gate_proj`` and ``up_proj``
    (n, I, E), ``down_proj`` (n, E, I); with ``bias``, ``gate_proj_bias`` and ``up_proj_bias``
    (n, I) and ``down_proj_bias`` (n, E). ``kind``: "swiglu" or "clamped_swiglu" (gpt-oss;
    ``swiglu_limit``, ``swiglu_alpha``).

    ``forward(x, indices, weights, on_input=False)``: tokens x (T, E), the choices (T, k) and
    their weights (T, k) → (T, E), Σ w f(x), or Σ f(w x) ``on_input`` (Llama 4). Cost
    O(T k · 3EI) and memory O(T k E) for the gathered tokens; the three projections are
    grouped products (``grouped_linear``), whose backward writes the stacked
    weights' gradient once. ``expert(e, x)`` runs one expert alone (for reading and checking).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 kind: str = "swiglu", bias: bool = False, swiglu_limit: float = 7.0,
                 swiglu_alpha: float = 1.702, device=None, dtype=None):
        super().__init__()
        who = "Experts"
        # n, E, I and the clamped SwiGLU's two constants
        n = self.num_experts = validate.positive_int(num_experts, "num_experts", owner=who)
        e = self.hidden_size = validate.positive_int(hidden_size, "hidden_size", owner=who)
        i = self.intermediate_size = validate.positive_int(intermediate_size,
                                                           "intermediate_size", owner=who)
        self.kind = validate.choice(kind, "expert", EXPERT_KINDS, owner=who)
        self.limit = validate.positive_real(swiglu_limit, "swiglu_limit", owner=who)
        self.alpha = validate.positive_real(swiglu_alpha, "swiglu_alpha", owner=who)
        # the weights of all n experts stacked on a leading axis: (n, out, in) each
        dt = _float_dtype(dtype, who)
        gated = self.kind != "relu2"           # Nemotron-H's experts have no gate
        if gated:
            self.gate_proj = _uniform((n, i, e), e, dt)
        else:
            self.register_parameter("gate_proj", None)
        self.up_proj = _uniform((n, i, e), e, dt)
        self.down_proj = _uniform((n, e, i), i, dt)
        if validate.boolean(bias, "bias", owner=who):          # gpt-oss's experts have biases
            if not gated:
                raise validate.OptionError(f"{who}: bias is gpt-oss's, on gated experts; got "
                                           "bias=True with kind 'relu2'")
            self.gate_proj_bias = _uniform((n, i), e, dt)
            self.up_proj_bias = _uniform((n, i), e, dt)
            self.down_proj_bias = _uniform((n, e), i, dt)
        else:
            for name in ("gate_proj_bias", "up_proj_bias", "down_proj_bias"):
                self.register_parameter(name, None)
        self._factory(device)

    def _bias(self, name, e):
        b = getattr(self, name)
        return None if b is None else b[e]

    def _hidden(self, g: Tensor, u: Tensor) -> Tensor:
        """The activation between the two halves and the down projection: silu(g) ⊙ u, or
        gpt-oss's clamped form (module docstring, step 3), or max(u, 0)² without a gate."""
        if self.kind == "relu2":
            return F.relu(u) ** 2
        if self.kind == "swiglu":
            return F.silu(g) * u
        g = F.clip(g, max=self.limit)
        u = F.clip(u, min=-self.limit, max=self.limit)
        return g * F.sigmoid(self.alpha * g) * (u + 1.0)

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e on its tokens: x (m, E) → (m, E)."""
        g = None if self.gate_proj is None else \
            F.linear(x, self.gate_proj[e], self._bias("gate_proj_bias", e))    # (m, I)
        u = F.linear(x, self.up_proj[e], self._bias("up_proj_bias", e))        # (m, I)
        return F.linear(self._hidden(g, u), self.down_proj[e],
                        self._bias("down_proj_bias", e))                        # (m, E)

    def forward(self, x: Tensor, indices, weights: Tensor, on_input: bool = False) -> Tensor:
        idx = indices.data if isinstance(indices, Tensor) else indices
        t, k = idx.shape
        xp = get_array_module(idx)
        pairs = idx.reshape(-1)                            # (T·k,) the expert of each pair
        order = F.argsort(pairs).data        # the pairs, grouped by expert
        # the block sizes, on the host: one wait for the device per forward
        counts = xp.bincount(pairs, minlength=self.num_experts).tolist()
        routed = x[order // k]                             # gather: (T·k, E), by expert
        if not pairs.size:                                 # no tokens: nothing to run
            return F.reshape(routed, (t, self.hidden_size))
        if on_input:                                       # each pair's weight on its input
            routed = routed * F.reshape(weights, (t * k, 1))[order]
        # the experts, each on its block of rows: three grouped products
        g = None if self.gate_proj is None else \
            grouped_linear(routed, self.gate_proj, counts, self.gate_proj_bias)    # (T·k, I)
        u = grouped_linear(routed, self.up_proj, counts, self.up_proj_bias)        # (T·k, I)
        y = grouped_linear(self._hidden(g, u), self.down_proj, counts,
                           self.down_proj_bias)                                    # (T·k, E)
        back = xp.empty_like(order)
        back[order] = xp.arange(order.size)                # the inverse permutation
        y = F.reshape(y[back], (t, k, self.hidden_size))   # (T, k, E) in (token, slot) order
        if on_input:
            return F.sum(y, axis=1)                                  # (T, E): Σ_slots f(w x)
        return F.sum(y * F.reshape(weights, (t, k, 1)), axis=1)      # (T, E): Σ_slots w f

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, kind={self.kind!r}, "
                f"bias={self.down_proj_bias is not None}")


class SharedExpert(GatedMLP):
    """The shared expert every token goes through (DeepSeek-V3, Qwen2-MoE): one dense SwiGLU
    MLP (``decoder_layers.GatedMLP``), ``down_proj(silu(gate_proj(x)) * up_proj(x))``,
    without biases; PyTorch's ``device=`` / ``dtype=`` keywords. Cost O(3EI) per token.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, device=None, dtype=None):
        super().__init__(hidden_size, intermediate_size, "silu", bias=False)
        self._factory(device, dtype)


class MoE(Module):
    """A mixture-of-experts MLP block (formulas, dispatch and cost: module docstring).

    x (B, N, E) → (B, N, E). After each forward, ``router_logits`` (B·N, n) holds the router's
    logits (for ``load_balancing_loss``) and ``tokens_per_expert`` (n,) the integer counts of
    the choices.

    Options:

    - ``hidden_size`` E, ``intermediate_size`` I (each expert's width), ``num_experts`` n,
      ``top_k`` k (experts per token).
    - ``router``: "softmax" (Mixtral, Qwen-MoE), "topk_softmax" (gpt-oss), "sigmoid_grouped"
      (DeepSeek-V3), "topk_sigmoid" (Llama 4). ``weights_on_input``: the weights scale each
      chosen expert's input, not its output (Llama 4). ``norm_topk_prob``: renormalise the k
      weights (default True: Mixtral's; Qwen's config states it; False for "topk_sigmoid").
      ``router_bias``: a bias on the router's logits (gpt-oss).
      ``n_group``, ``topk_group``: group-limited routing ("sigmoid_grouped" only).
      ``routed_scaling_factor`` ρ: a factor on every routed weight.
    - ``expert``: "swiglu", "clamped_swiglu" (gpt-oss; ``swiglu_limit`` 7.0, ``swiglu_alpha``
      1.702 by default, options of that kind only) or "relu2" (Nemotron-H: no gate, and a
      shared expert without one too). ``expert_bias``: biases in the experts (gpt-oss).
      ``latent_size`` L (Nemotron-H): the experts run on ``fc1_latent_proj`` x (E → L) and
      ``fc2_latent_proj`` maps their sum back, biases with ``latent_bias``.
    - A shared expert, one SwiGLU MLP every token goes through: ``n_shared_experts`` s
      (DeepSeek-V3: width s·I) or ``shared_intermediate_size`` (Qwen2-MoE: that width), not
      both; ``shared_expert_gate``: scale its output by σ(w_s · x) (Qwen2-MoE).

    DeepSeek-V3's first ``first_k_dense_replace`` layers and Qwen-MoE's ``mlp_only_layers``
    are ordinary dense MLPs: the decoder builds those blocks, not this one.

    Hook points, read in forward order: ``hook_router_logits`` (B·N, n) — replacing them
    changes the choice; ``hook_expert_indices`` (B·N, k), the chosen experts (TransformerLens's
    name) — a replacement re-routes the tokens but keeps the weights computed for the original
    choice, as TransformerLens's does; ``hook_expert_weights`` (B·N, k), the weights the chosen
    outputs are multiplied by (TransformerLens 4.x holds the same weights scattered into
    (B·N, n), zeros at the unchosen experts);
    ``hook_tokens_per_expert`` (n,), integer counts, read-only (a hook that returns a
    replacement is refused: the counts follow from the indices).

    Parameters: ``router.weight`` (n, E), ``router.bias`` (n,), buffer
    ``router.e_score_correction_bias`` (n,); ``experts.gate_proj`` / ``up_proj`` (n, I, E),
    ``experts.down_proj`` (n, E, I), ``experts.*_bias``; ``shared_expert.gate_proj.weight``
    … (``SharedExpert``) and ``shared_expert_gate.weight`` (1, E). HF's names for each family:
    ``docs/moe.md``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 router: str = "softmax", norm_topk_prob: bool = True, router_bias: bool = False,
                 n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0,
                 expert: str = "swiglu", expert_bias: bool = False, swiglu_limit=None,
                 swiglu_alpha=None, n_shared_experts: int = 0, shared_intermediate_size=None,
                 shared_expert_gate: bool = False, weights_on_input: bool = False,
                 latent_size=None, latent_bias: bool = False, device=None, dtype=None):
        super().__init__()
        who = "MoE"
        # the clamped SwiGLU's constants go with that expert kind only
        validate.choice(expert, "expert", EXPERT_KINDS, owner=who)
        for name, value in (("swiglu_limit", swiglu_limit), ("swiglu_alpha", swiglu_alpha)):
            if value is not None and expert != "clamped_swiglu":
                raise validate.OptionError(f"{who}: {name} belongs to expert 'clamped_swiglu', "
                                           f"got {name}={value!r} with expert {expert!r}")
        self.router = Router(hidden_size, num_experts, top_k, router, norm_topk_prob,
                             router_bias, n_group, topk_group, routed_scaling_factor,
                             dtype=dtype)
        self.hook_router_logits = HookPoint()          # (B·N, n)
        self.hook_expert_indices = HookPoint()         # (B·N, k) integers
        self.hook_expert_weights = HookPoint()         # (B·N, k)
        self.hook_tokens_per_expert = HookPoint()      # (n,) integers, read-only
        # Nemotron-H's latent space: the experts between two projections, E → L → E
        if latent_size is None:
            self.fc1_latent_proj = self.fc2_latent_proj = None
            inner = hidden_size
        else:
            inner = validate.positive_int(latent_size, "latent_size", owner=who)
            bias = validate.boolean(latent_bias, "latent_bias", owner=who)
            self.fc1_latent_proj = Linear(hidden_size, inner, bias=bias, dtype=dtype)
            self.fc2_latent_proj = Linear(inner, hidden_size, bias=bias, dtype=dtype)
        self.experts = Experts(num_experts, inner, intermediate_size, expert, expert_bias,
                               7.0 if swiglu_limit is None else swiglu_limit,
                               1.702 if swiglu_alpha is None else swiglu_alpha, dtype=dtype)
        # the shared expert (DeepSeek-V3, Qwen2-MoE) and its optional sigmoid gate
        width = self._shared_width(who, intermediate_size, n_shared_experts,
                                   shared_intermediate_size)
        if width is None:
            self.shared_expert = None
        elif expert == "relu2":                # Nemotron-H's shared expert has no gate either
            self.shared_expert = DenseMLP(hidden_size, width, "relu2", bias=False)
            self.shared_expert._factory(None, dtype)
        else:
            self.shared_expert = SharedExpert(hidden_size, width, dtype=dtype)
        if validate.boolean(shared_expert_gate, "shared_expert_gate", owner=who):
            if width is None:
                raise validate.OptionError(f"{who}: shared_expert_gate needs a shared expert "
                                           "(n_shared_experts or shared_intermediate_size), "
                                           "got neither")
            self.shared_expert_gate = Linear(hidden_size, 1, bias=False, dtype=dtype)
        else:
            self.shared_expert_gate = None
        self.weights_on_input = validate.boolean(weights_on_input, "weights_on_input",
                                                 owner=who)
        # what the last forward routed, kept for the loss and for reading
        self.router_logits = None
        self.tokens_per_expert = None
        self._factory(device)

    # DeepSeek-V3 states the shared width as a count of experts, Qwen2-MoE as a width
    @staticmethod
    def _shared_width(who, intermediate_size, n_shared, shared_size):
        n_shared = validate.nonnegative_int(n_shared, "n_shared_experts", owner=who)
        if shared_size is None:
            return n_shared * intermediate_size if n_shared else None
        shared_size = validate.positive_int(shared_size, "shared_intermediate_size", owner=who)
        if n_shared:
            raise validate.OptionError(
                f"{who}: give n_shared_experts (DeepSeek-V3: width n_shared_experts · "
                "intermediate_size) or shared_intermediate_size (Qwen2-MoE), not both; got "
                f"n_shared_experts={n_shared}, shared_intermediate_size={shared_size}")
        return shared_size

    # the router owns n and k; the block reads them from it
    @property
    def num_experts(self) -> int:
        return self.router.num_experts

    @property
    def top_k(self) -> int:
        return self.router.top_k

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) != 3 or x.shape[-1] != self.router.hidden_size:
            raise ValueError(f"MoE: x must have shape (B, N, {self.router.hidden_size}), got "
                             f"{tuple(x.shape)}")
        b, n, e = x.shape
        h = F.reshape(x, (b * n, e))                                   # tokens (T, E)
        logits = self.hook_router_logits(self.router(h))               # (T, n)
        weights, indices = self.router.route(logits)                   # (T, k) each
        indices = self.hook_expert_indices(indices)
        weights = self.hook_expert_weights(weights)
        counts = tokens_per_expert(indices, self.num_experts)         # (n,)
        if self.hook_tokens_per_expert(counts) is not counts:
            raise ValueError("MoE: hook_tokens_per_expert is read-only (the counts follow from "
                             "the choices): change hook_expert_indices instead")
        self.router_logits, self.tokens_per_expert = logits, counts
        inner = h if self.fc1_latent_proj is None else self.fc1_latent_proj(h)    # (T, L)
        y = self.experts(inner, indices, weights, self.weights_on_input)   # (T, L)
        if self.fc2_latent_proj is not None:
            y = self.fc2_latent_proj(y)                                # (T, E)
        if self.shared_expert is not None:
            shared = self.shared_expert(h)
            if self.shared_expert_gate is not None:
                shared = F.sigmoid(self.shared_expert_gate(h)) * shared    # (T, 1) * (T, E)
            y = y + shared
        return F.reshape(y, (b, n, e))

    def extra_repr(self) -> str:
        shared = "" if self.shared_expert is None else \
            f", shared_intermediate_size={self.shared_expert.down_proj.in_features}"
        return (f"num_experts={self.num_experts}, top_k={self.top_k}, "
                f"router={self.router.kind!r}, expert={self.experts.kind!r}{shared}")
