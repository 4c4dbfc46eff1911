"""Lightning attention's backward over its blocks (``LightningBlocks``): float64 gradients of
the output and the final state against central differences, from a start state; outputs,
final state and every gradient equal to ``lightning_block`` run block after block (the
composed path, the clearest statement of the block equations) over a grid of sizes and
block lengths; and the graph keeps no c × c score: the peak of forward + backward stays
below the composed path's."""
import numpy as np
from hypothesis import given, settings, strategies as st

import minitx
from minitx import functional as F
from minitx.attention.lightning import lightning_block, lightning_blocks, lightning_slopes
from support import assert_close, peak_bytes, qkv, tensor, to_host


def composed(q, k, v, slopes, block, state=None):
    """The reference: ``lightning_block`` on each block of ``block`` tokens in turn."""
    outs = []
    for start in range(0, q.shape[2], block):
        part = slice(start, min(q.shape[2], start + block))
        out, state = lightning_block(q[:, :, part], k[:, :, part], v[:, :, part], slopes,
                                     state)
        outs.append(out)
    return F.concatenate(outs, axis=2), state


def start_state(rng, b, h, d, dv):
    return rng.standard_normal((b, h, d, dv))


def test_gradcheck_output_and_state_from_a_start_state():
    # 3 blocks of 3 and a last block of 1; every input, the start state included, needs grad
    q, k, v = qkv(10, b=1, h=2, d=3, dv=2, seed=1)
    s0 = start_state(np.random.default_rng(2), 1, 2, 3, 2)
    slopes = lightning_slopes(2)
    minitx.gradcheck(lambda *t: lightning_blocks(*t[:3], slopes, 3, t[3]),
                     tuple(tensor(a, requires_grad=True) for a in (q, k, v, s0)))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 17), block=st.integers(1, 8), h=st.integers(1, 3),
       d=st.integers(1, 5), dv=st.integers(1, 4), with_state=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_equals_the_composed_blocks_with_gradients(n, block, h, d, dv, with_state, seed):
    rng = np.random.default_rng(seed)
    arrays = qkv(n, b=2, h=h, d=d, dv=dv, rng=rng)
    s0 = start_state(rng, 2, h, d, dv) if with_state else None
    slopes = lightning_slopes(h, 1, 3)
    w_out, w_state = rng.standard_normal((2, h, n, dv)), rng.standard_normal((2, h, d, dv))
    results = []
    for fn in (lightning_blocks, composed):
        inputs = [tensor(a, requires_grad=True) for a in arrays]
        state = None if s0 is None else tensor(s0, requires_grad=True)
        out, final = fn(*inputs, slopes, block, state)
        ((out * tensor(w_out)).sum() + (final * tensor(w_state)).sum()).backward()
        grads = [t.grad for t in inputs] + ([] if state is None else [state.grad])
        results.append([to_host(out.data), to_host(final.data)] + [to_host(g) for g in grads])
    for mine, theirs in zip(*results):
        assert_close(mine, theirs, rtol=1e-12, atol=1e-12)


def test_keeps_no_block_scores():
    # N = 2,048 in blocks of 64, D = 4: the composed path keeps the scores, Λ and the pattern,
    # 64 × 64 each, for every one of the 32 blocks; the blocks' node keeps one D × D state per
    # block beside q, k, v, and builds one block's 64 × 64 arrays at a time
    arrays = qkv(2048, b=1, h=1, d=4)
    slopes = lightning_slopes(1)

    def run(fn):
        t = [tensor(a, requires_grad=True) for a in arrays]
        out, state = fn(*t, slopes, 64)
        (out.sum() + state.sum()).backward()

    mine, theirs = peak_bytes(lambda: run(lightning_blocks)), peak_bytes(lambda: run(composed))
    # q, k, v, the output and their gradients, common to both, bound the ratio (about 6 on
    # NumPy, 4.5 on the strict CuPy stand-in, which keeps some copies of its own)
    assert mine < theirs / 4, (mine, theirs)
