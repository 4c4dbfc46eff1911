r"""Lightning attention: causal linear attention with a per-head decay, computed block by block.

Qin, Sun, Li, Shen, Sun & Zhong (2024), "Lightning Attention-2: A Free Lunch for Handling
Unlimited Sequence Lengths in Large Language Models"; MiniMax (2025), "MiniMax-01: Scaling
Foundation Models with Lightning Attention".

One head maps queries, keys and values (rows q_t, k_t (1, D), v_t (1, Dv)) to

$$
o_t = \sum_{s \le t} \lambda^{\,t-s}\, (q_t \cdot k_s)\, v_s,
\qquad S_t = \lambda S_{t-1} + k_t^\top v_t, \quad o_t = q_t S_t
$$

— linear attention (no softmax, no normalisation) with a constant decay λ ∈ (0, 1] per head:
retention's map (``retention.py``) without its 1/√D, with MiniMax's decays. Causal linear
attention needs a cumulative sum over the tokens, which is slow on a GPU when written as a
scan; lightning attention splits the tokens into blocks of c and computes each block
**intra** (masked, decayed Q Kᵀ V inside the block: O(c²) work, no scan) and **inter** (what
the blocks before left, carried in the state S). For a block whose tokens are 1 … c (local
positions) and the state S₀ after the blocks before it:

$$
O = \left( Q K^\top \odot \Lambda \right) V + \left( \lambda^{i} q_i \right)_i S_0,
\quad \Lambda_{ij} = \begin{cases} \lambda^{\,i-j} & i \ge j \\ 0 & i < j \end{cases},
\quad S = \lambda^{c} S_0 + \left( \lambda^{\,c-j} k_j \right)_j^\top V
$$

λ^i is how far query i sits from the state (built up to the block's start), λ^{c−j} how far
key j sits from the block's end. The equations are MiniMax's "query decay", "key decay",
"diagonal decay" and "block decay". One token per block is the recurrence (decoding); one
block of N tokens is the parallel form; both equal the block form (``identities``).

**The backward, over the blocks.** With P = Q Kᵀ ⊙ Λ, a_i = λ^i (query to state),
e_j = λ^{c−j} (key to block end), dO the output's gradient and dS the state's (what the blocks
after this one send back), the chain rule through the block equations reads

$$
\begin{aligned}
dQ &= \left( dO\, V^\top \odot \Lambda \right) K + a \odot dO\, S_0^\top, &
dK &= \left( dO\, V^\top \odot \Lambda \right)^{\!\top} Q + e \odot V\, dS^\top, \\
dV &= P^\top dO + \left( e \odot K \right) dS, &
dS_0 &= \lambda^{c}\, dS + \left( a \odot Q \right)^{\top} dO
\end{aligned}
$$

run from the last block to the first (dS₀ is the dS of the block before). It needs Q, K, V
and the state S₀ each block started from, nothing of size c² — P is recomputed per block —
so ``lightning_blocks`` keeps (N/c)·D² numbers per head beside its inputs.

**The decays.** MiniMax uses ALiBi's slopes (Press et al. 2022) as rates: head h of H
decays by

$$
\lambda_h = e^{-s_h}, \qquad
s_h = 2^{-8(h+1)/H} \left( 1 - \frac{l}{L - 1 + 10^{-5}} + 10^{-5} \right)
$$

for layer l of L, the factor in brackets making deep layers remember longer (without a
layer count, the slopes alone). Head 0 forgets fastest.
"""
from __future__ import annotations

from .. import functional as F
from .. import validate
from ..autograd.function import Function
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module, host_xp, to_host, xp as active_xp
from ..nn.hooks import HookPoint
from .base import check_heads, register, repeat_kv, repeat_kv_array
from .retention import RecurrentAttention, Retention, decayed_recurrence

__all__ = ["lightning_slopes", "lightning_block", "lightning_blocks", "LightningBlocks",
           "LightningAttention"]


def lightning_slopes(num_heads: int, layer_index: int = 0, num_layers: int = None):
    """MiniMax's decay rates s_h (host float64 (H,)), λ_h = exp(−s_h): ALiBi's slopes
    2^{−8(h+1)/H}, times 1 − l/(L − 1 + 10⁻⁵) + 10⁻⁵ for layer l = ``layer_index`` of
    L = ``num_layers`` (None: no layer factor, the slopes alone)."""
    h = validate.positive_int(num_heads, "num_heads", owner="lightning_slopes")
    slopes = 2.0 ** (-8.0 * (host_xp.arange(h) + 1) / h)
    if num_layers is None:
        return slopes
    layers = validate.positive_int(num_layers, "num_layers", owner="lightning_slopes")
    index = validate.integer(layer_index, "layer_index", minimum=0, maximum=layers - 1,
                             owner="lightning_slopes")
    return slopes * (1 - index / (layers - 1 + 1e-5) + 1e-5)


def _powers(slopes, exponents, like):
    """λ_h^e = exp(−s_h·e) for host exponents e (…): (1, H, …) raw array in ``like``'s
    array module and dtype (the decays are constants, not parameters)."""
    xp = get_array_module(like)
    e = host_xp.asarray(exponents, dtype="float64")
    return xp.asarray(host_xp.exp(-slopes.reshape((1, -1) + (1,) * e.ndim) * e),
                      dtype=like.dtype)


def lightning_block(q, k, v, slopes, state=None, causal: bool = True, hook_decay=None,
                    hook_pattern=None):
    r"""One block of lightning attention (the module docstring's block equations), started
    from the state S₀ (None: zero): q, k (B, H, c, D), v (B, H, c, Dv) Tensors, ``slopes``
    the host rates s_h (H,) → (O (B, H, c, Dv), S (B, H, D, Dv)).

    Intra: (Q Kᵀ ⊙ Λ) V; inter: (λ^i q_i) S₀; state: λ^c S₀ + (λ^{c−j} k_j)ᵀ V.
    ``causal=False`` (no state) uses Λ_ij = λ^{|i−j|} (minitx's extension). ``hook_decay``
    / ``hook_pattern``: HookPoints (or None) that see, and may replace, Λ (1, H, c, c) and
    Q Kᵀ ⊙ Λ. Time O(B·H·c·(c + D)·Dv), memory O(B·H·c²)."""
    # Intra: the decay Λ of local distances i − j (0 above the diagonal when causal), then
    # the masked, decayed products inside the block.
    c = q.shape[2]
    local = host_xp.arange(c)
    dist = local[:, None] - local[None, :]                                # i − j
    lam = _powers(slopes, host_xp.abs(dist), q.data)                     # (1, H, c, c)
    if causal:
        lam = lam * get_array_module(lam).asarray(dist >= 0, dtype=lam.dtype)
    decay = Tensor._wrap(lam)
    if hook_decay is not None:
        decay = hook_decay(decay)
    pattern = F.matmul(q, F.swapaxes(k, -1, -2)) * decay                 # (B, H, c, c)
    if hook_pattern is not None:
        pattern = hook_pattern(pattern)
    out = F.matmul(pattern, v)                                           # intra
    # The state this block leaves: each key decayed by its distance to the block's end; then
    # inter: the state S₀ the blocks before left, read by each query at its distance i + 1.
    to_end = Tensor._wrap(_powers(slopes, c - 1 - local, q.data)[..., None])   # λ^{c−j}
    new_state = F.matmul(F.swapaxes(k * to_end, -1, -2), v)              # (B, H, D, Dv)
    if state is not None:
        if not causal:
            raise ValueError("lightning_block: a state (the tokens before) needs causal=True")
        from_state = Tensor._wrap(_powers(slopes, local + 1, q.data)[..., None])  # λ^i
        out = out + F.matmul(q * from_state, state)                      # inter
        block_decay = _powers(slopes, host_xp.asarray([c]), q.data)[..., None]       # λ^c
        new_state = new_state + state * Tensor._wrap(block_decay)
    return out, new_state


def _block_decays(slopes, c, like):
    """The constants of one block of c tokens, in ``like``'s module and dtype: Λ (1, H, c, c)
    (0 above the diagonal), a = λ^i and e = λ^{c−j} (1, H, c, 1), λ^c (1, H, 1, 1)."""
    local = host_xp.arange(c)
    dist = local[:, None] - local[None, :]                                # i − j
    lam = _powers(slopes, host_xp.where(dist >= 0, dist, 0), like)
    lam = lam * get_array_module(lam).asarray(dist >= 0, dtype=lam.dtype)
    return (lam, _powers(slopes, local + 1, like)[..., None],
            _powers(slopes, c - 1 - local, like)[..., None],
            _powers(slopes, host_xp.asarray([c]), like)[..., None])


class LightningBlocks(Function):
    r"""Causal lightning attention over all its blocks as one graph node: q, k (B, H, n, D),
    v (B, H, n, Dv), the start state S₀ (B, H, D, Dv) → O (B, H, n, Dv) and the final state S
    packed along the token axis, (B, H, n + D, Dv) (a Function has one output;
    ``lightning_blocks`` unpacks them). Forward: the block equations, block after block;
    backward: the module docstring's, from the last block to the first, recomputing each
    block's P from Q and K. Saved: the state at each block's start, (n/c)·D·Dv per head."""

    @staticmethod
    def forward(ctx, q, k, v, state, slopes=None, block=None):
        xp, n = get_array_module(q), q.shape[2]
        slopes = to_host(slopes)        # host constants (apply moved them to q's device)
        starts, out = [], xp.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            lam, a, e, lam_c = _block_decays(slopes, hi - lo, q)
            qb, kb, vb = q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi]
            starts.append(state)          # S₀ of this block: all its backward needs besides q, k, v
            # intra (Q Kᵀ ⊙ Λ) V plus inter (a ⊙ Q) S₀, then the state the block leaves
            out[:, :, lo:hi] = (qb @ xp.swapaxes(kb, -1, -2) * lam) @ vb + (a * qb) @ state
            state = lam_c * state + xp.swapaxes(e * kb, -1, -2) @ vb
        # the output and the final state as one array, split again by ``lightning_blocks``
        ctx.save_for_backward(q, k, v, *starts)
        ctx.slopes, ctx.block = slopes, block
        return xp.concatenate([out, state], axis=2)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *starts = ctx.saved_tensors
        xp, n = get_array_module(q), q.shape[2]
        d_out, d_state = grad[:, :, :n], grad[:, :, n:]
        dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
        for index in range(len(starts) - 1, -1, -1):          # the last block first
            lo = index * ctx.block
            hi = min(n, lo + ctx.block)
            lam, a, e, lam_c = _block_decays(ctx.slopes, hi - lo, q)
            qb, kb, vb, gb, s0 = q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], \
                d_out[:, :, lo:hi], starts[index]
            # the module docstring's four equations; d_state arrives from the blocks after
            dp = gb @ xp.swapaxes(vb, -1, -2) * lam                      # dO Vᵀ ⊙ Λ
            p = qb @ xp.swapaxes(kb, -1, -2) * lam                       # P, recomputed
            dq[:, :, lo:hi] = dp @ kb + a * (gb @ xp.swapaxes(s0, -1, -2))
            dk[:, :, lo:hi] = xp.swapaxes(dp, -1, -2) @ qb + \
                e * (vb @ xp.swapaxes(d_state, -1, -2))
            dv[:, :, lo:hi] = xp.swapaxes(p, -1, -2) @ gb + (e * kb) @ d_state
            d_state = lam_c * d_state + xp.swapaxes(a * qb, -1, -2) @ gb    # to the block before
        return dq, dk, dv, d_state


def lightning_blocks(q, k, v, slopes, block: int, state=None):
    r"""Causal lightning attention in blocks of ``block`` tokens from the state S₀ (None:
    zero): q, k (B, H, n, D), v (B, H, n, Dv) Tensors → (O (B, H, n, Dv), S (B, H, D, Dv)).
    Equal to ``lightning_block`` run block after block (that loop is the test reference),
    with the backward over the blocks (``LightningBlocks``): memory O(B·H·(n·D + (n/c)·D²)),
    no c × c score kept."""
    b, h, n, d = q.shape
    if state is None:
        state = Tensor._wrap(get_array_module(q.data).zeros((b, h, d, v.shape[-1]),
                                                            dtype=q.data.dtype))
    packed = LightningBlocks.apply(q, k, v, state, slopes=slopes, block=block)
    return packed[:, :, :n], packed[:, :, n:]


@register("lightning")
class LightningAttention(RecurrentAttention):
    r"""Lightning attention (MiniMax-01): causal linear attention with a decay λ_h per head,
    intra-block masked products plus an inter-block state (formulas: the module docstring).

    Formula: the module docstring's, per head h with its own decay λ_h (the recurrence and
    the block equations, blocks of c = ``block`` tokens); λ_h = exp(−s_h) with MiniMax's
    rates s_h (module docstring, "The decays"; ``lightning_slopes``), times MiniMax's layer
    factor when ``num_layers`` is given.

    Shapes: ``layer(x)``: x (B, N, E) → (B, N, E); ``attend(q, k, v)``: q (B, H, N, D),
    k/v (B, Hkv, N, D) → (B, H, N, D); the state S (B, H, D, D). Hook points (besides
    hook_q/k/v/z): ``hook_decay`` Λ (1, H, c, c) and ``hook_pattern`` Q Kᵀ ⊙ Λ (B, H, c, c),
    replaceable (a call with either hook set runs as one block, c = N); ``hook_state`` the
    state after the last token.

    Options: ``block`` (64; MiniMax's models use 256; any positive int), ``layer_index`` (0;
    GPT fills it in) and ``num_layers`` (None: no layer factor; L: MiniMax's factor for layer
    ``layer_index`` of L), ``causal`` (False: the symmetric decay λ^{|i−j|}, minitx's
    extension, as the blocks run forward plus the blocks run backward less the diagonal),
    ``num_kv_heads``, ``bias``. Decoding:
    ``forward(x, kv_cache=layer.new_cache())`` (a ``RecurrentState``, constant size).

    Complexity: {complexity} with blocks of c = ``block`` tokens (one block, c = N, when a
    decay or pattern hook is set); decoding O(D²) per token and head.

    Exactness: a different score function (no softmax; tested against its own dense formula,
    ``reference``; its block, recurrent and parallel forms against each other).

    Left out or different: MiniMax's layer around the core (SiLU on q, k and v from one
    fused projection, RMSNorm of the output, the sigmoid output gate — ``gated`` shows that
    gate; ``models/mixers/lightning.py`` adds them, as MiniMax's decoder layer); its Triton
    kernels; MiniMax's decoder caches the state and steps token by token,
    as here. The decays are constants (buffers in MiniMax), not learned.

    Reference: Qin, Sun, Li, Shen, Sun & Zhong (2024), "Lightning Attention-2"; MiniMax
    (2025), "MiniMax-01: Scaling Foundation Models with Lightning Attention".
    """

    complexity = "time O(B·H·N·(c + D)·D), memory O(B·H·N·(c + D))"

    # no softmax: its own score function; GPT fills in the depth for MiniMax's layer factor
    kind = "score"
    model_options = ("layer_index",)

    def __init__(self, embed_dim, num_heads, causal=False, block: int = 64,
                 layer_index: int = 0, num_layers: int = None, **base):
        super().__init__(embed_dim, num_heads, causal=causal, **base)
        # the block length c, and where the layer sits (MiniMax's decays depend on depth)
        self.block = validate.positive_int(block, "block", owner="lightning")
        self.num_layers = None if num_layers is None else \
            validate.positive_int(num_layers, "num_layers", owner="lightning")
        self.layer_index = validate.nonnegative_int(layer_index, "layer_index",
                                                    owner="lightning")
        self.slopes       # checks layer_index < num_layers now, at construction
        self.hook_decay = HookPoint()        # (1, H, c, c) Λ of a block
        self.hook_pattern = HookPoint()      # (B, H, c, c) Q Kᵀ ⊙ Λ

    @property
    def slopes(self):
        """The rates s_h (host (H,)); read each call, so a stack that renumbers
        ``layer_index`` after construction gets its own decays."""
        return lightning_slopes(self.num_heads, self.layer_index, self.num_layers)

    @property
    def decays(self):
        """λ_h = exp(−s_h), host (H,)."""
        return host_xp.exp(-self.slopes)

    def extend(self, q, k, v, state):
        """The n new tokens after ``state``, block by block: q (B, H, n, D), k/v (B, Hkv, n, D)
        → (out, state)."""
        k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        if self.hook_decay.active or self.hook_pattern.active:   # one block: Λ seen whole
            return lightning_block(q, k, v, self.slopes, state, hook_decay=self.hook_decay,
                                   hook_pattern=self.hook_pattern)
        # blocks of c, as one graph node that keeps no c × c score (``LightningBlocks``)
        return lightning_blocks(q, k, v, self.slopes, self.block, state)

    def attend(self, q, k, v):
        """q (B, H, N, D), k/v (B, Hkv, N, D) → (B, H, N, D)."""
        check_heads(q, k, v, self.name)
        h = q.shape[1]
        k, v = repeat_kv(k, h), repeat_kv(v, h)
        hooked = self.hook_decay.active or self.hook_pattern.active
        if self.causal:
            out, state = self.extend(q, k, v, None)
        elif hooked:                        # one block, so the hooks see the whole Λ
            out, state = lightning_block(q, k, v, self.slopes, causal=False,
                                         hook_decay=self.hook_decay,
                                         hook_pattern=self.hook_pattern)
        else:
            # λ^{|i−j|} = (λ^{i−j} for j ≤ i) + (λ^{j−i} for j ≥ i) − (1 for j = i): the
            # blocks run forward, then over the reversed tokens, and the diagonal counted
            # twice is taken off once — O(N·B) memory, as in the causal form
            back = get_array_module(q.data).arange(q.shape[2] - 1, -1, -1)
            out, state = self.extend(q, k, v, None)
            rev, _ = self.extend(q[:, :, back], k[:, :, back], v[:, :, back], None)
            diagonal = (q * k).sum(axis=-1, keepdims=True) * v                 # (q_i·k_i) v_i
            out = out + rev[:, :, back] - diagonal
        self.show_state(state)
        return out

    def reference(self, q, k, v):
        """Raw arrays: the dense form (Q Kᵀ ⊙ Λ) V with Λ_ij = λ^{i−j} as powers of λ (0 above
        the diagonal; λ^{|i−j|} non-causal), for tests."""
        xp = get_array_module(q)
        n, h = q.shape[2], q.shape[1]
        k, v = repeat_kv_array(k, h), repeat_kv_array(v, h)
        dist = xp.arange(n)[:, None] - xp.arange(n)[None, :]
        lam = xp.asarray(self.decays, dtype=q.dtype)[:, None, None]               # (H, 1, 1)
        decay = lam ** xp.abs(dist) * (1.0 if not self.causal else (dist >= 0))
        return ((q @ xp.swapaxes(k, -1, -2)) * decay) @ v

    @classmethod
    def identities(cls, seed=0):
        """The forms agree, and agree with retention and linear attention (float64, B = 1,
        H = 3, D = 4, N = 13)."""
        rng = host_xp.random.default_rng(seed)
        q, k, v = (Tensor(active_xp().asarray(rng.standard_normal((1, 3, 13, 4))))
                   for _ in range(3))
        layer = cls(12, 3, causal=True, block=4)
        log_decay = Tensor(active_xp().asarray(
            host_xp.broadcast_to(-layer.slopes[None, :, None], (1, 3, 13)).copy()))
        with no_grad():
            blocks = layer.attend(q, k, v).numpy()
            layer.block = 13
            parallel = layer.attend(q, k, v).numpy()
            recurrent = decayed_recurrence(q, k, v, log_decay)[0].numpy()
            # retention's code with the same decays: its 1/√D = 1/2 undone by keys × 2 (exact)
            ret = Retention(12, 3, causal=True)
            ret.gammas = layer.decays
            retention = ret.attend(q, k * 2.0, v).numpy()
            # no decay (every s_h = 0): causal linear attention (Q Kᵀ ⊙ tril) V, dense
            undecayed = lightning_block(q, k, v, host_xp.zeros(3))[0].numpy()
        qh, kh, vh = (to_host(t.data) for t in (q, k, v))
        linear = (qh @ kh.swapaxes(-1, -2) * host_xp.tri(13)) @ vh
        # decoding token by token through the state vs the full forward in blocks of 4
        x = rng.standard_normal((1, 9, 12))
        layer.block = 4
        with no_grad():
            full = layer(Tensor(x)).numpy()
            cache = layer.new_cache()
            steps = host_xp.concatenate([layer(Tensor(x[:, t:t + 1]), kv_cache=cache).numpy()
                                         for t in range(9)], axis=1)
        # each an exact equality: only float64 rounding separates the two sides
        return [("blocks of 4 (intra + inter) − recurrent S_t = λS_{t−1} + k_tᵀv_t, max |Δ|",
                 float(host_xp.abs(blocks - recurrent).max()), 1e-12),
                ("blocks of 4 − one block of 13 (the parallel form), max |Δ|",
                 float(host_xp.abs(blocks - parallel).max()), 1e-12),
                ("lightning − retention with γ_h = λ_h (keys × √D), max |Δ|",
                 float(host_xp.abs(blocks - retention).max()), 1e-12),
                ("no decay (λ = 1) − causal linear attention (Q Kᵀ ⊙ tril) V, max |Δ|",
                 float(host_xp.abs(undecayed - linear).max()), 1e-12),
                ("decoding through a RecurrentState − full causal forward, max |Δ|",
                 float(host_xp.abs(steps - full).max()), 1e-12)]
