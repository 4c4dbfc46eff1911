"""How close an attention variant is to exact softmax attention — shared measurement.

Used by ``benchmarks/approx_quality.py`` and ``examples/efficient_report.py`` so that both
print the same numbers for the same settings.

- ``approx_distances``: for one *approximate* variant at one budget, the relative Frobenius
  distances ‖A − A*‖_F / ‖A*‖_F (attention matrices) and ‖O − O*‖_F / ‖O*‖_F (outputs),
  float64. Every variant measured here is linear in v, so its effective N × N matrix A is read
  off by attending to v = I_N (A · I = A). The reference A* is exact softmax attention
  softmax(q kᵀ/√D), except for Reformer, which is shared-QK: its reference is shared-QK
  attention under its own no-self rule (its one-bucket limit). Linformer gets smooth
  (cumulative-mean) keys and values and ``init="pool"`` projections — the regime pooling
  projections assume; untrained *random* projections approximate nothing in particular.
- ``quality_table``: the same, averaged over seeds, for every variant and budget in
  ``APPROX_BUDGETS`` (errors should fall left to right in each variant's budgets).
- ``masked_distances``: for a *masked* (sparse) variant, its distance from exact attention
  under its own ``pattern(N)`` (≈ 1e-16: masked variants are exact there) and from full
  attention (the information its mask drops — a modelling choice, not an approximation error).
"""
from __future__ import annotations

import numpy as np

import minitx
from minitx.attention import REGISTRY, dense_attention_array

__all__ = ["APPROX_BUDGETS", "approx_distances", "quality_table", "masked_distances"]

# variant -> (budget option, budgets from small to large, fixed options). Routing: fewer
# clusters = more keys per query = more budget. Linformer's max_len is set to N.
APPROX_BUDGETS = {
    "performer": ("num_features", [8, 32, 128, 512], {}),
    "linformer": ("proj_dim", [4, 16, 64, 128], {"init": "pool"}),
    "reformer": ("n_hashes", [1, 2, 4, 8], {"n_buckets": 8, "chunk_size": 16}),
    "routing": ("num_clusters", [16, 4, 2, 1], {"window": 128}),
    "nystrom": ("num_landmarks", [4, 16, 64, 128], {}),
}


def _identity_values(q):
    b, h, n, _ = q.shape
    return np.broadcast_to(np.eye(n), (b, h, n, n)).copy()


def _rel(x, y):
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def _inputs(n, d, heads, seed, scale, smooth=False):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((1, heads, n, d)) * scale for _ in range(2))
    v = rng.standard_normal((1, heads, n, d))
    if smooth:                         # smooth keys/values: what pooling projections assume
        k, v = (np.cumsum(x, axis=2) / np.sqrt(np.arange(1, n + 1))[:, None] for x in (k, v))
    return q, k, v


def _layer(name, heads, d, options):
    layer = REGISTRY[name](d * heads, heads, **options).eval()
    for p in layer.parameters():
        p.data = p.data.astype(np.float64)
    return layer


def _attend(layer, q, k, v):
    t = [minitx.tensor(x, dtype="float64") for x in (q, k, v, _identity_values(q))]
    with minitx.no_grad():
        a = layer.attend(t[0], t[1], t[3]).data
        o = layer.attend(t[0], t[1], t[2]).data
    to_host = minitx.backend.to_device
    return np.asarray(to_host(a, "cpu")), np.asarray(to_host(o, "cpu"))


def approx_distances(name, budget_option, budget, n=128, d=16, heads=2, seed=0, fixed=None,
                     scale=0.5, smooth=None):
    """(attention distance, output distance) of one approximate variant at one budget.

    q, k entries are N(0, scale²) (scale 0.5: attention rows of moderate peakedness), float64.
    ``smooth``: keys and values made cumulative means (None: for Linformer only, see the
    module docstring).
    """
    options = {budget_option: budget, **(fixed or {})}
    if name == "linformer":
        options.setdefault("max_len", n)
    minitx.manual_seed(seed)
    layer = _layer(name, heads, d, options)
    smooth = name == "linformer" if smooth is None else smooth
    q, k, v = _inputs(n, d, heads, seed, scale, smooth=smooth)
    if name == "reformer":
        allowed, keys = layer.pattern_reference(q, v)
        exact_a = dense_attention_array(q, keys, _identity_values(q), allowed)
        exact_o = dense_attention_array(q, keys, v, allowed)
    else:
        exact_a = dense_attention_array(q, k, _identity_values(q))
        exact_o = dense_attention_array(q, k, v)
    a, o = _attend(layer, q, k, v)
    return _rel(a, exact_a), _rel(o, exact_o)


def quality_table(n=128, d=16, seeds=3, budgets=None, scale=0.5):
    """Rows (variant, option, budget, attention distance, output distance), seed-averaged.

    Budgets a variant cannot take at this N (Linformer's proj_dim > N) are skipped.
    """
    rows = []
    for name, (option, values, fixed) in (budgets or APPROX_BUDGETS).items():
        if name not in REGISTRY:
            continue
        for budget in values:
            if name == "linformer" and budget > n:
                continue
            ds = np.array([approx_distances(name, option, budget, n, d, seed=s, fixed=fixed,
                                            scale=scale) for s in range(seeds)])
            rows.append((name, option, budget, *ds.mean(axis=0)))
    return rows


def masked_distances(name, options, n=128, d=16, heads=2, seed=0, scale=0.5):
    """(distance from exact attention under the layer's own pattern, distance from full
    attention) of a masked variant's attention matrix, float64."""
    minitx.manual_seed(seed)
    layer = _layer(name, heads, d, options)
    q, k, v = _inputs(n, d, heads, seed, scale)
    a, _ = _attend(layer, q, k, v)
    allowed = np.asarray(minitx.backend.to_device(layer.pattern(n), "cpu"))
    own = dense_attention_array(q, k, _identity_values(q), allowed)
    full = dense_attention_array(q, k, _identity_values(q))
    return _rel(a, own), _rel(a, full)
