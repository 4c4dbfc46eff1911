"""How close is each approximate attention to the exact one, as its budget grows?

For every approximate variant and several budgets (random features, projection rank,
hash rounds, clusters/window) prints

    attention distance  ‖A − A*‖_F / ‖A*‖_F     (A = the variant's effective N × N matrix)
    output distance     ‖O − O*‖_F / ‖O*‖_F

against exact softmax attention A* = softmax(q kᵀ/√D). Every variant here is linear in v,
so its effective attention matrix is read off by attending to v = I_N (out = A I = A).
Reformer is shared-QK, so its exact reference is shared-QK attention under its own
no-self rule (its one-bucket limit). Errors should fall as the budget grows; the trend is
asserted (at small sizes) in tests/test_approx.py, not here.

    python benchmarks/approx_quality.py [--n 128] [--d 16] [--seeds 3] [--scale 0.5]

q and k entries are N(0, scale²): scale 0.5 gives attention rows of moderate peakedness;
Performer's estimator variance grows like exp(‖q‖² + ‖k‖²)/√D, so larger scales need
many more features.
"""
from __future__ import annotations

import argparse

import numpy as np

import minitx
from minitx.attention import REGISTRY, dense_attention_array

# variant -> (budget option, budgets, fixed options)
BUDGETS = {
    "performer": ("num_features", [8, 32, 128, 512], {}),
    "linformer": ("proj_dim", [4, 16, 64, 128], {"init": "pool", "max_len": 128}),
    "reformer": ("n_hashes", [1, 2, 4, 8], {"n_buckets": 8, "chunk_size": 16}),
    "routing": ("num_clusters", [16, 4, 2, 1], {"window": 128}),   # fewer clusters = more budget
}


def _identity_values(q):
    b, h, n, _ = q.shape
    return np.broadcast_to(np.eye(n), (b, h, n, n)).copy()


def distances(name, budget_option, budget, n=128, d=16, heads=2, seed=0, fixed=None, scale=0.5):
    """(attention distance, output distance) of one variant at one budget, float64."""
    minitx.manual_seed(seed)
    layer = REGISTRY[name](d * heads, heads, **{budget_option: budget, **(fixed or {})}).eval()
    for p in layer.parameters():
        p.data = p.data.astype(np.float64)
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((1, heads, n, d)) * scale for _ in range(2))
    v = rng.standard_normal((1, heads, n, d))
    if name == "linformer":            # smooth keys/values: what pooling projections assume
        k, v = (np.cumsum(x, axis=2) / np.sqrt(np.arange(1, n + 1))[:, None] for x in (k, v))
    if name == "reformer":
        allowed, keys = layer.pattern_reference(q, v)
        exact_a = dense_attention_array(q, keys, _identity_values(q), allowed)
        exact_o = dense_attention_array(q, keys, v, allowed)
    else:
        exact_a = dense_attention_array(q, k, _identity_values(q))
        exact_o = dense_attention_array(q, k, v)
    t = [minitx.tensor(x, dtype="float64") for x in (q, k, v, _identity_values(q))]
    with minitx.no_grad():
        a = layer.attend(t[0], t[1], t[3]).data
        o = layer.attend(t[0], t[1], t[2]).data
    rel = lambda x, y: float(np.linalg.norm(x - y) / np.linalg.norm(y))  # noqa: E731
    return rel(a, exact_a), rel(o, exact_o)


def quality_table(n=128, d=16, seeds=3, budgets=BUDGETS, scale=0.5):
    """rows of (variant, option, budget, attention distance, output distance), seed-averaged."""
    rows = []
    for name, (option, values, fixed) in budgets.items():
        for budget in values:
            ds = np.array([distances(name, option, budget, n, d, seed=s, fixed=fixed, scale=scale)
                           for s in range(seeds)])
            rows.append((name, option, budget, *ds.mean(axis=0)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=128, help="sequence length")
    parser.add_argument("--d", type=int, default=16, help="head dimension")
    parser.add_argument("--seeds", type=int, default=3, help="seeds averaged per cell")
    parser.add_argument("--scale", type=float, default=0.5,
                        help="std of q and k entries (larger = peakier attention)")
    args = parser.parse_args(argv)
    print(f"N = {args.n}, D = {args.d}, 2 heads, q, k ~ N(0, {args.scale}²), mean over "
          f"{args.seeds} seeds (float64)\n")
    print(f"| {'variant':<10} | {'budget':<18} | {'‖A−A*‖F/‖A*‖F':>14} | {'‖O−O*‖F/‖O*‖F':>14} |")
    print(f"|{'-' * 12}|{'-' * 20}|{'-' * 16}|{'-' * 16}|")
    for name, option, budget, att, out in quality_table(args.n, args.d, args.seeds, scale=args.scale):
        print(f"| {name:<10} | {option + ' = ' + str(budget):<18} | {att:>14.4f} | {out:>14.4f} |")


if __name__ == "__main__":
    main()
