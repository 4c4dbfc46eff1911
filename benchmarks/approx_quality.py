"""How close is each approximate attention to the exact one, as its budget grows?

For every approximate variant and several budgets (random features, projection rank,
hash rounds, clusters/window) prints

    attention distance  ‖A − A*‖_F / ‖A*‖_F     (A = the variant's effective N × N matrix)
    output distance     ‖O − O*‖_F / ‖O*‖_F

against exact softmax attention A* = softmax(q kᵀ/√D). Every variant here is linear in v,
so its effective attention matrix is read off by attending to v = I_N (out = A I = A).
Reformer is shared-QK, so its exact reference is shared-QK attention under its own
no-self rule (its one-bucket limit). Errors should fall as the budget grows; the trend is
asserted (at small sizes) in tests/attention/test_approx.py, not here. The measurement lives in\n``minitx.metrics`` and is shared with examples/efficient_report.py.

    python benchmarks/approx_quality.py [--n 128] [--d 16] [--seeds 3] [--scale 0.5]

q and k entries are N(0, scale²): scale 0.5 gives attention rows of moderate peakedness;
Performer's estimator variance grows like exp(‖q‖² + ‖k‖²)/√D, so larger scales need
many more features.
"""
from __future__ import annotations

import argparse

from minitx.metrics import APPROX_BUDGETS as BUDGETS  # noqa: F401 - re-exported
from minitx.metrics import approx_distances as distances  # noqa: F401 - re-exported
from minitx.metrics import quality_table


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
