r"""DeepSeek-V3.2's lightning indexer: the keys each query of a latent-attention layer reads.

DeepSeek Sparse Attention (the ``dsa`` variant of ``attention/selection.py``) on DeepSeek's
own multi-head latent attention (``LatentDecoderAttention``, ``DecoderConfig.index_topk``).
For the query token t, with MLA's normalised q latent c^Q_t and the layer's input x_t, and a
key token s, the indexer has h_I heads of d_I dims and one key shared by all of them:

$$
q^I_{t,j} = R_t\, W^{IQ}_j c^Q_t, \qquad
k^I_s = R_s \operatorname{LN}(W^{IK} x_s), \qquad
w_{t,j} = \frac{(W^{w} x_t)_j}{\sqrt{h_I}\,\sqrt{d_I}}
$$

$$
I_{t,s} = \sum_{j=1}^{h_I} w_{t,j}\, \operatorname{ReLU}\!\left(q^I_{t,j} \cdot k^I_s\right),
\qquad
S_t = \operatorname{top-}k_{\; s \in A_t}\; I_{t,s},
\qquad
o_{h,t} = \sum_{s \in S_t} \operatorname{softmax}_{s \in S_t}(s_{h,ts})\, W^V_h c_s
$$

R_t rotates the first D_r (``qk_rope_head_dim``) dims at position t as two halves (the
rotation of ``nn/rotary.py``; MLA's own rotary dims are interleaved pairs), LN is a
LayerNorm with gain and bias (eps 1e-6), A_t the keys t may see (s ≤ t, not padding), k =
``index_topk``, and s_{h,ts} MLA's score (``models/latent_attention.py``). Since
ReLU(a)/√d_I = ReLU(a/√d_I), the 1/√d_I inside the ReLU of DeepSeek's code is the same
factor in w, which is how ``selection.lightning_scores`` (the sum above, shared with ``dsa``)
receives it. When k ≥ |A_t| every visible key is chosen and the layer is plain MLA.

Differences from the paper (DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context
Efficiency with DeepSeek Sparse Attention"), following HuggingFace's model, the oracle:

- the two scales 1/√h_I and 1/√d_I are DeepSeek's code's, not the paper's formula;
- the Hadamard rotation of q^I and k^I and their FP8 quantisation (DeepSeek's inference
  kernel) are left out: the rotation is orthogonal, so the dot products are unchanged in
  exact arithmetic, and the scores are computed in the model's precision (HF's in float32
  even in a float64 model; a near tie may then choose differently);
- ties are broken towards the earlier key (``top_k_indices``, a stable sort; torch's order
  is unspecified);
- the indexer gets no gradient: the top-k is piecewise constant, so the output does not
  train it, and DeepSeek's indexer training (the dense warm-up and the KL loss of the sparse
  stage) is left out; HF's indexer, too, runs without gradient.

Differences from minitx's ``dsa`` variant: ``dsa``'s indexer reads the attention's own
query and key heads, with no LayerNorm and no rotation, and is trained by its
``indexer_loss``; ``dsa`` gathers the chosen keys (``gathered_attention``), here the chosen
keys mask MLA's dense scores (the same softmax, and MLA forms the N × Nk scores anyway).
"""
from __future__ import annotations

import math

from .. import validate
# the cache it extends; the indexer's sum and the top-k, shared with the dsa variant
from ..attention import KVCache
from ..attention.selection import lightning_scores, top_k_indices
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Tensor
from ..backend import get_array_module
from ..nn.hooks import HookPoint
from ..nn.layers import LayerNorm, Linear
from ..nn.module import Module
from ..nn.rotary import Rotary
from ..ops.indexing import masked_fill
from ..ops.shape import concatenate, reshape, transpose

__all__ = ["LightningIndexer", "IndexedLatentCache", "check_indexer"]


class IndexedLatentCache(KVCache):
    """The cache of an indexed latent-attention layer: MLA's (c, R k^R) as a ``KVCache``
    (``keys`` (B, 1, L, r), ``values`` (B, 1, L, D_r)) and the indexer's keys k^I
    (``index_keys``, (B, L, d_I)): r + D_r + d_I numbers per token. Appending the index keys
    copies them (O(L·d_I) a step; they are small)."""

    def reset(self) -> None:
        super().reset()
        self.index_keys = None

    def append_index_keys(self, k):
        """Add k^I (B, n, d_I) after the cached ones, once the latents of the same n tokens
        are in; return all of them (B, L, d_I) as a Tensor."""
        raw = k.data if isinstance(k, Tensor) else k
        if self.index_keys is not None:
            raw = get_array_module(raw).concatenate([self.index_keys, raw], axis=1)
        if raw.shape[1] != len(self):
            raise ValueError(f"IndexedLatentCache.append_index_keys: {raw.shape[1]} index keys "
                             f"for {len(self)} cached tokens (append the latents first)")
        self.index_keys = raw
        return Tensor._wrap(raw)


class LightningIndexer(Module):
    """DeepSeek-V3.2's lightning indexer (module docstring's formula): chooses the
    ``index_topk`` keys each query of a latent-attention layer reads.

    ``forward(x (B, N, E), q_latent (B, N, r_q), allowed, positions, cache=None)`` → bool
    (B, N, Nk), True at the chosen keys; ``allowed`` (N, Nk) or (B, N, Nk) bool, the keys
    each query may see (causal, not padding); ``positions`` (N,) or (B, N) the rotary
    positions; ``cache`` an ``IndexedLatentCache`` holding the earlier tokens' k^I.

    Sizes from ``DecoderConfig``: h_I = ``index_n_heads``, d_I = ``index_head_dim`` (≥ D_r,
    its first D_r dims rotated), k = ``index_topk``. Layers as HF names them: ``wq_b``
    (r_q → h_I·d_I, from MLA's q latent), ``wk`` (E → d_I), ``k_norm`` (LayerNorm over d_I),
    ``weights_proj`` (E → h_I); no biases. Runs without gradient. Hook points:
    ``hook_index_scores`` I (B, N, Nk), −inf at keys not allowed (may be replaced: the
    choice follows), ``hook_topk_indices`` (B, N, min(k, Nk)) int, the chosen key positions
    in cache order, best first, −1 where fewer than k keys were visible (read-only). Time
    O(B·N·Nk·h_I·d_I), memory O(B·h_I·N·Nk).
    """

    def __init__(self, c):
        super().__init__()
        e, hi, di, dr = c.hidden_size, c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim
        self.heads, self.head_dim, self.rope_dim, self.top_k = hi, di, dr, c.index_topk
        self.wq_b = Linear(c.q_lora_rank, hi * di, bias=False)
        self.wk = Linear(e, di, bias=False)
        self.k_norm = LayerNorm(di, eps=1e-6)
        self.weights_proj = Linear(e, hi, bias=False)
        self.rotary = Rotary(dr, c.rope)
        self.hook_index_scores = HookPoint()      # (B, N, Nk) I, −inf where not allowed
        self.hook_topk_indices = HookPoint()      # (B, N, c) chosen key positions, −1: none

    def _rotate(self, x, positions):
        """R: the first D_r dims rotated (two halves), the rest passed through."""
        dr = self.rope_dim
        return concatenate([self.rotary.rotate(x[..., :dr], positions), x[..., dr:]], axis=-1)

    def forward(self, x, q_latent, allowed, positions, cache=None):
        b, n, _ = x.shape
        hi, di = self.heads, self.head_dim
        if cache is not None and not isinstance(cache, IndexedLatentCache):
            raise TypeError("LightningIndexer: the layer's cache must be an IndexedLatentCache "
                            f"(the layer's new_cache()), got a {type(cache).__name__}")
        with no_grad():
            # q^I (B, h_I, N, d_I) from the q latent; k^I (B, N, d_I) from x, one head
            q = transpose(reshape(self.wq_b(q_latent), (b, n, hi, di)), (0, 2, 1, 3))
            q = self._rotate(q, positions)
            k = self._rotate(reshape(self.k_norm(self.wk(x)), (b, 1, n, di)), positions)
            k = reshape(k, (b, n, di))
            if cache is not None:
                k = cache.append_index_keys(k)                        # (B, Nk, d_I)
            w = self.weights_proj(x) * (1.0 / math.sqrt(hi * di))     # (B, N, h_I)
            scores = masked_fill(lightning_scores(q, k, w), ~allowed, -math.inf)
            scores = self.hook_index_scores(scores).data              # (B, N, Nk)
        # the top-k of each row, written back as a mask of the chosen keys
        index, valid = top_k_indices(scores, self.top_k)              # (B, N, c)
        xp = get_array_module(scores)
        if self.hook_topk_indices.active:
            self.hook_topk_indices(Tensor._wrap(xp.where(valid, index, -1)))
        chosen = xp.zeros(scores.shape, dtype=bool)
        chosen[xp.arange(b)[:, None, None], xp.arange(n)[None, :, None], index] = valid
        return chosen

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, top_k={self.top_k}"


def check_indexer(c, who: str = "DecoderConfig") -> None:
    """The indexer's switches: ``index_topk`` needs MLA with a q latent, and its sizes."""
    validate.positive_int(c.index_topk, "index_topk", owner=who)
    if c.attention != "mla" or c.q_lora_rank is None:
        raise validate.OptionError(f"{who}: index_topk (DeepSeek-V3.2's indexer) needs "
                                   "attention='mla' with a q_lora_rank, got attention="
                                   f"{c.attention!r}, q_lora_rank={c.q_lora_rank!r}")
    for name in ("index_n_heads", "index_head_dim"):
        validate.positive_int(getattr(c, name), name, owner=f"{who} (index_topk)")
    if c.index_head_dim < c.qk_rope_head_dim:
        raise validate.OptionError(f"{who}: index_head_dim ({c.index_head_dim}) must be at "
                                   f"least qk_rope_head_dim ({c.qk_rope_head_dim}): its "
                                   "first qk_rope_head_dim dims are rotated")
