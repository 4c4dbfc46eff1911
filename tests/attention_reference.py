"""Dense attention written out by hand in NumPy, and the block-boundary sizes: the reference the
blocked and tiled attention paths are tested against (``tests/ops/test_tiles.py``,
``tests/fast/test_fast_sdpa.py``), independent of ``minitx.ops.sdpa``."""
import numpy as np
from hypothesis import strategies as st

__all__ = ["dense_reference", "block_case"]


def dense_reference(q, k, v, do, allowed=None, bias=None, causal=False):
    """Output and (dq, dk, dv, dbias-before-unbroadcast) of dense attention, by hand.

    S = Q Kᵀ/√D + bias, masked to −inf; P = softmax(S) (0 on a row with no key); O = P V.
    Backward through the dense graph: dV = Pᵀ dO, dP = dO Vᵀ,
    dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K/√D, dK = dSᵀ Q/√D, with K, V repeated over
    the G query heads that share them and their gradients summed back.
    """
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = h // hkv
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(kk, -1, -2) / np.sqrt(d)
    if bias is not None:
        s = s + bias
    mask = np.ones((b, h, nq, nk), dtype=bool)
    if allowed is not None:
        mask &= allowed
    if causal:
        mask &= np.tri(nq, nk, nk - nq, dtype=bool)
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total > 0, total, 1)
    o = p @ vv
    dvv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kk / np.sqrt(d)
    dkk = np.swapaxes(ds, -1, -2) @ q / np.sqrt(d)
    fold = lambda x: x.reshape(b, hkv, g, nk, x.shape[-1]).sum(axis=2)      # noqa: E731
    return o, (dq, fold(dkk), fold(dvv), ds)


@st.composite
def block_case(draw):
    """A block size r and sizes N ∈ {m·r − 1, m·r, m·r + 1} for queries and keys."""
    r = draw(st.sampled_from([2, 3, 4, 8]))
    near = lambda: st.builds(lambda m, e: max(1, m * r + e),                 # noqa: E731
                             st.integers(1, 3), st.sampled_from([-1, 0, 1]))
    nq = draw(near())
    nk = draw(st.one_of(st.just(nq), near()))
    b = draw(st.integers(1, 2))
    hkv = draw(st.sampled_from([1, 2]))
    h = hkv * draw(st.sampled_from([1, 2]))
    return r, b, h, hkv, nq, nk, draw(st.integers(0, 2 ** 16))
