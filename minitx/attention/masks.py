"""Sparsity patterns: which (query i, key j) pairs may attend, as rules and as (n, n) masks.

Every pattern is written once, as a *rule* evaluated elementwise on broadcast index arrays
``i`` (query positions) and ``j`` (key positions) → bool (True = may attend). The same rule
serves two purposes:

- ``*_mask(n, ...)`` evaluates it on the full grid, i = arange(n)[:, None], j = arange(n)[None]
  → an (n, n) bool NumPy array on the host, for tests and pictures (O(n²) memory — never
  used by the kernels);
- the sparse kernels in ``sparse.py`` evaluate it only on the (query, key) pairs they
  gathered, so the efficient path and the reference cannot disagree.

Patterns (w = window half-width, d = dilation, l = stride/block length):

=================  ==========================================================================
local              |i − j| ≤ w           (causal: 0 ≤ i − j ≤ w)
dilated            |i − j| ≤ w·d and (i − j) ≡ 0 mod d
longformer         dilated window, or i ∈ G, or j ∈ G       (G = global token indices;
                   Beltagy, Peters & Cohan 2020)
bigbird            block(i), block(j) neighbours (|Δ| ≤ 1), or block(j) ∈ R[block(i)]
                   (seeded random blocks), or block(i)/block(j) < g global blocks
                   (Zaheer et al. 2020)
strided            |i − j| < l, or (i − j) ≡ 0 mod l        (Child et al. 2019, "strided")
fixed              ⌊i/l⌋ = ⌊j/l⌋, or j mod l ≥ l − c        (Child et al. 2019, "fixed")
chunked            ⌊i/C⌋ = ⌊j/C⌋                            (Llama 4's chunked attention)
=================  ==========================================================================

Every pattern also takes ``causal``: then additionally j ≤ i. ``render_pattern`` draws a
mask with ■ (may attend) and · (masked).
"""
from __future__ import annotations

from .. import validate
from ..backend import host_xp, to_device_of

__all__ = ["local_rule", "dilated_rule", "longformer_rule", "bigbird_rule", "strided_rule",
           "fixed_rule", "bigbird_random_blocks", "grid_mask", "local_mask", "dilated_mask",
           "longformer_mask", "bigbird_mask", "strided_mask", "fixed_mask", "chunked_rule",
           "chunked_mask", "render_pattern", "PATTERNS"]


# ---- rules: (i, j) broadcast integer arrays -> bool -------------------------------------

def local_rule(i, j, window: int, causal: bool = False):
    """Sliding window: |i − j| ≤ window (causal: 0 ≤ i − j ≤ window)."""
    diff = i - j
    if causal:
        return (diff >= 0) & (diff <= window)
    return (diff <= window) & (diff >= -window)


def dilated_rule(i, j, window: int, dilation: int, causal: bool = False):
    """Dilated window: keys every ``dilation`` steps, ``window`` of them on each side."""
    diff = i - j
    near = local_rule(i, j, window * dilation, causal)
    return near & (diff % dilation == 0)


def longformer_rule(i, j, window: int, global_mask, dilation: int = 1, causal: bool = False):
    """Longformer: a (dilated) window, plus global tokens that see and are seen by all.

    ``global_mask`` is a bool array over positions (True = global), indexed by i and j.
    """
    allowed = dilated_rule(i, j, window, dilation, causal)
    global_mask = to_device_of(global_mask, i)                # a host table meets device indices
    allowed = allowed | global_mask[i] | global_mask[j]
    if causal:
        allowed = allowed & (j <= i)
    return allowed


def bigbird_random_blocks(num_blocks: int, num_random: int, num_global: int, seed: int = 0,
                          causal: bool = False):
    """(num_blocks, num_random) int table R: R[b] = the random key blocks of query block b.

    Candidates exclude the block's own window (b − 1, b, b + 1) and the global blocks (they
    are seen anyway), and for causal, every block after b − 1. When there are fewer
    candidates than ``num_random`` the row is padded with −1 (no block). Drawn from a
    private generator seeded by ``seed``, so the pattern is a pure function of its options.
    A host (NumPy) table: the rule moves it to the indices' device when it meets them.
    """
    import random  # noqa: PLC0415 - a private, seeded stdlib generator: same table everywhere
    gen = random.Random(seed)
    table = []
    for b in range(num_blocks):
        hi = b - 1 if causal else num_blocks
        candidates = [c for c in range(num_global, hi) if abs(c - b) > 1]
        take = min(num_random, len(candidates))
        row = sorted(gen.sample(candidates, take))
        table.append(row + [-1] * (max(num_random, 0) - take))
    return host_xp.asarray(table, dtype=host_xp.int64).reshape(num_blocks, max(num_random, 0))


def bigbird_rule(i, j, block: int, random_table, num_global: int, causal: bool = False):
    """BigBird on blocks: neighbouring blocks, the random blocks, and global blocks.

    ``random_table`` is the (num_blocks, r) table from ``bigbird_random_blocks``.
    """
    bi, bj = i // block, j // block
    allowed = (bi - bj <= 1) & (bj - bi <= 1)
    allowed = allowed | (bi < num_global) | (bj < num_global)
    if random_table.shape[1]:
        rand = to_device_of(random_table, i)[bi]                    # (..., r)
        allowed = allowed | (rand == bj[..., None]).any(axis=-1)
    if causal:
        allowed = allowed & (j <= i)
    return allowed


def strided_rule(i, j, stride: int, causal: bool = True):
    """Sparse Transformer, strided: the previous ``stride`` positions and every stride-th one."""
    diff = i - j
    allowed = ((diff < stride) & (diff > -stride)) | (diff % stride == 0)
    if causal:
        allowed = allowed & (diff >= 0)
    return allowed


def fixed_rule(i, j, stride: int, summary: int = 1, causal: bool = True):
    """Sparse Transformer, fixed: own block of ``stride``, plus the last ``summary`` positions
    of every block (the "summary" cells that carry information between blocks)."""
    allowed = (i // stride == j // stride) | (j % stride >= stride - summary)
    if causal:
        allowed = allowed & (j <= i)
    return allowed


def chunked_rule(i, j, chunk: int, causal: bool = True):
    """Chunked: i and j in the same chunk of ``chunk`` positions (a key is visible iff it is
    in the query's chunk)."""
    allowed = i // chunk == j // chunk
    if causal:
        allowed = allowed & (j <= i)
    return allowed


# ---- (n, n) masks ------------------------------------------------------------------------

def grid_mask(n: int, rule, **options):
    """Evaluate ``rule(i, j, **options)`` on the full (n, n) grid: a host NumPy bool array
    (for tests and pictures; the kernels evaluate the rule on their own index pairs)."""
    i = host_xp.arange(n)[:, None]
    j = host_xp.arange(n)[None, :]
    return host_xp.broadcast_to(rule(i, j, **options), (n, n)).copy()


def local_mask(n: int, window: int, causal: bool = False):
    """(n, n) sliding-window mask (see ``local_rule``)."""
    validate.nonnegative_int(window, "window")
    return grid_mask(n, local_rule, window=window, causal=causal)


def dilated_mask(n: int, window: int, dilation: int = 1, causal: bool = False):
    """(n, n) dilated-window mask (see ``dilated_rule``)."""
    validate.nonnegative_int(window, "window")
    validate.positive_int(dilation, "dilation")
    return grid_mask(n, dilated_rule, window=window, dilation=dilation, causal=causal)


def _global_mask(n, global_tokens):
    g = host_xp.zeros(n, dtype=bool)
    for t in global_tokens:
        if not -n <= int(t) < n:
            raise ValueError(f"global token index {t} out of range for sequence length {n}")
        g[int(t)] = True
    return g


def longformer_mask(n: int, window: int, global_tokens=(0,), dilation: int = 1,
                    causal: bool = False):
    """(n, n) Longformer mask (see ``longformer_rule``)."""
    return grid_mask(n, longformer_rule, window=window, global_mask=_global_mask(n, global_tokens),
                     dilation=dilation, causal=causal)


def bigbird_mask(n: int, block: int = 4, num_random: int = 1, num_global: int = 1,
                 seed: int = 0, causal: bool = False):
    """(n, n) BigBird mask (see ``bigbird_rule``); random blocks seeded by ``seed``."""
    validate.positive_int(block, "block")
    nb = -(-n // block)
    table = bigbird_random_blocks(nb, num_random, num_global, seed, causal)
    return grid_mask(n, bigbird_rule, block=block, random_table=table, num_global=num_global,
                     causal=causal)


def strided_mask(n: int, stride: int, causal: bool = True):
    """(n, n) strided Sparse Transformer mask (see ``strided_rule``)."""
    validate.positive_int(stride, "stride")
    return grid_mask(n, strided_rule, stride=stride, causal=causal)


def fixed_mask(n: int, stride: int, summary: int = 1, causal: bool = True):
    """(n, n) fixed Sparse Transformer mask (see ``fixed_rule``)."""
    validate.positive_int(stride, "stride")
    validate.positive_int(summary, "summary")
    if summary > stride:
        raise ValueError(f"summary ({summary}) must be ≤ stride ({stride})")
    return grid_mask(n, fixed_rule, stride=stride, summary=summary, causal=causal)


def chunked_mask(n: int, chunk: int, causal: bool = True):
    """(n, n) chunked mask (see ``chunked_rule``)."""
    validate.positive_int(chunk, "chunk")
    return grid_mask(n, chunked_rule, chunk=chunk, causal=causal)


PATTERNS = {
    "local": lambda n, causal=False: local_mask(n, 2, causal),
    "dilated": lambda n, causal=False: dilated_mask(n, 2, 2, causal),
    "longformer": lambda n, causal=False: longformer_mask(n, 2, (0,), 1, causal),
    "bigbird": lambda n, causal=False: bigbird_mask(n, 2, 1, 1, 0, causal),
    "strided": lambda n, causal=True: strided_mask(n, 4, causal),
    "fixed": lambda n, causal=True: fixed_mask(n, 4, 1, causal),
    "chunked": lambda n, causal=True: chunked_mask(n, 4, causal),
}
"""Small default examples of each pattern, for ``python -m minitx patterns``."""


def render_pattern(mask, on: str = "■", off: str = "·") -> str:
    """Draw an (n, m) bool mask as text: one line per query, ■ = may attend, · = masked."""
    if len(getattr(mask, "shape", ())) != 2:
        raise ValueError(f"render_pattern: mask must be 2-d (n, m), got shape "
                         f"{getattr(mask, 'shape', None)}")
    rows = [[bool(x) for x in row] for row in mask.tolist()]
    return "\n".join(" ".join(on if x else off for x in row) for row in rows)
