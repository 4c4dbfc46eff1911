"""Nyströmformer: segment-mean landmarks, the iterative pseudo-inverse, the m = N limit, the
error against the number of landmarks, the linear score count, hooks, options, parity with
HuggingFace's NystromformerSelfAttention."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
from minitx.attention import REGISTRY, dense_attention_array
from minitx.attention.nystrom import (NystromAttention, depthwise_sequence_conv,
                                      iterative_pinv, segment_means_matrix)
from support import assert_close, params_to_float64, qkv, tensor, to_host, need

E, H = 16, 2
D = E // H


def layer_of(**options):
    minitx.manual_seed(0)
    return params_to_float64(REGISTRY["nystrom"](E, H, **options)).eval()


# ---- a host NumPy version of the paper's formulas, written independently ------------------

def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def segment_means(x, m):
    """Landmarks by an explicit loop over segments: segment r holds positions
    ceil(r·n/m) … ceil((r+1)·n/m) − 1 (position j in segment floor(j·m/n))."""
    n = x.shape[-2]
    bounds = [-(-r * n // m) for r in range(m + 1)]
    return np.stack([x[..., bounds[r]:bounds[r + 1], :].mean(-2) for r in range(m)], axis=-2)


def razavi_pinv(a, iterations):
    eye = np.eye(a.shape[-1])
    n1 = np.abs(a).sum(-2).max(-1)[..., None, None]          # max column sum, per matrix
    ninf = np.abs(a).sum(-1).max(-1)[..., None, None]        # max row sum
    z = np.swapaxes(a, -1, -2) / (n1 * ninf)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_host(q, k, v, m, iterations=6, conv=None, exact_at_full=True):
    """The paper's formulas; with as many landmarks as tokens (and ``exact_at_full``) softmax
    attention itself, as the official code switches to."""
    h = q.shape[1]
    k, v = np.repeat(k, h // k.shape[1], 1), np.repeat(v, h // v.shape[1], 1)
    m = min(m, q.shape[2], k.shape[2])
    d = q.shape[-1]
    if exact_at_full and m == q.shape[2] == k.shape[2]:
        out = softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(d)) @ v
    else:
        ql, kl = segment_means(q, m), segment_means(k, m)
        f = softmax(q @ np.swapaxes(kl, -1, -2) / math.sqrt(d))
        a = softmax(ql @ np.swapaxes(kl, -1, -2) / math.sqrt(d))
        b = softmax(ql @ np.swapaxes(k, -1, -2) / math.sqrt(d))
        out = f @ razavi_pinv(a, iterations) @ (b @ v)
    if conv is not None:                                      # y_i = Σ_t w_t v_{i+t−c}
        c, n = conv.shape[1] // 2, v.shape[2]
        for i in range(n):
            for t in range(conv.shape[1]):
                if 0 <= i + t - c < n:
                    out[:, :, i] += conv[None, :, t, None] * v[:, :, i + t - c]
    return out


@settings(max_examples=25, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), m=st.integers(1, 20),
       iterations=st.integers(0, 8), hkv=st.sampled_from([1, 2]), exact=st.booleans(),
       seed=st.integers(0, 999))
def test_attend_equals_the_papers_formulas(nq, nk, m, iterations, hkv, exact, seed):
    layer = layer_of(num_landmarks=m, pinv_iterations=iterations, exact_at_full=exact)
    q, k, v = qkv(nq, nk, b=2, h=H, hkv=hkv, d=D, seed=seed)
    got = layer.attend(tensor(q), tensor(k), tensor(v))
    assert_close(got, nystrom_host(q, k, v, m, iterations, exact_at_full=exact), rtol=1e-9,
                 atol=1e-11)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 45), m=st.integers(1, 12), kernel=st.sampled_from([1, 3, 5, 33]),
       seed=st.integers(0, 999))
def test_the_conv_skip_adds_a_depthwise_convolution_of_v(n, m, kernel, seed):
    layer = layer_of(num_landmarks=m, conv_kernel=kernel)
    q, k, v = qkv(n, b=1, h=H, d=D, seed=seed)
    got = layer.attend(tensor(q), tensor(k), tensor(v))
    want = nystrom_host(q, k, v, m, conv=to_host(layer.conv_weight))
    assert_close(got, want, rtol=1e-9, atol=1e-11)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 60), m=st.integers(1, 60))
def test_segment_means_cover_every_position_once_in_segments_of_near_equal_size(n, m):
    m = min(m, n)
    s = to_host(segment_means_matrix(n, m))
    assert s.shape == (m, n)
    owner = s.argmax(0)                                       # the segment of each position
    assert np.all((s > 0).sum(0) == 1) and np.all(np.diff(owner) >= 0)   # consecutive
    sizes = (s > 0).sum(1)
    assert set(sizes) <= {n // m, -(-n // m)} and sizes.sum() == n
    assert_close(s.sum(1), np.ones(m), rtol=1e-15)            # each row is a mean
    x = np.random.default_rng(n).standard_normal((n, 3))
    assert_close(s @ x, segment_means(x, m), rtol=1e-12, atol=1e-15)
    if n % m == 0:                                            # the paper's reshape-and-mean
        assert_close(s @ x, x.reshape(m, n // m, 3).mean(1), rtol=1e-12, atol=1e-15)


def test_segment_means_refuse_more_segments_than_positions():
    with pytest.raises(ValueError, match="m must be an int >= 1 and <= 4, got 5"):
        segment_means_matrix(4, 5)


# ---- the pseudo-inverse iteration -------------------------------------------------------

def recursion_bound(a, iterations):
    """‖I − A Z_T‖₂ predicted by the scalar recursion e ← (3e³ + e⁴)/4 from e₀ = 1 − λ,
    λ = σ²/(‖A‖₁‖A‖∞), for each singular value σ of A (the module docstring's argument)."""
    sv = np.linalg.svd(a, compute_uv=False)
    e = 1 - sv ** 2 / (np.abs(a).sum(-2).max(-1) * np.abs(a).sum(-1).max(-1))[..., None]
    for _ in range(iterations):
        e = (3 * e ** 3 + e ** 4) / 4
    return e.max(-1)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 12), iterations=st.integers(0, 12), seed=st.integers(0, 999))
def test_the_iteration_follows_its_scalar_recursion(m, iterations, seed):
    """A Z_T is symmetric with eigenvalues 1 − f^T(1 − λ_i): ‖I − A Z_T‖₂ equals the largest
    f^T(1 − λ_i). Rounding: an error of a few ulps (× m, the sums in a product) made in a
    direction with e near 1 grows by at most f'(1) = 13/4 per iteration, so we allow
    10 · m · eps · 3.25^T (1.2e-12 seen at m = 12, T = 9, where this allows 1.1e-9)."""
    rng = np.random.default_rng(seed)
    a = softmax(rng.standard_normal((2, m, m)) * 2)
    z = to_host(iterative_pinv(tensor(a), iterations))
    measured = np.linalg.norm(np.eye(m) - a @ z, ord=2, axis=(-2, -1))
    tol = 10 * m * np.finfo(float).eps * 3.25 ** iterations
    assert_close(measured, recursion_bound(a, iterations), rtol=0, atol=tol)
    assert_close(z, razavi_pinv(a, iterations), rtol=1e-10, atol=1e-12)


def test_the_iteration_converges_to_the_moore_penrose_inverse():
    """Well-conditioned A: 20 iterations reach NumPy's SVD pseudo-inverse (to eps·κ(A))."""
    rng = np.random.default_rng(0)
    a = softmax(rng.standard_normal((6, 6)) * 3)
    z = to_host(iterative_pinv(tensor(a), 20))
    assert_close(z, np.linalg.pinv(a), rtol=0, atol=1e-10 * np.linalg.cond(a))


def test_rank_deficient_a_converges_then_rounding_grows_by_3_25_per_iteration():
    """Two equal rows (rank 5): after 10 iterations Z satisfies the four Penrose conditions.
    A null direction sits at e = 1, a fixed point of e ← (3e³ + e⁴)/4 with slope 13/4, so
    rounding seeded there grows ×3.25 per iteration: ×3.25⁵ ≈ 363 per five (measured 363,
    within a factor 2 here) — more iterations are not always better; 6 are safe."""
    rng = np.random.default_rng(0)
    a = softmax(rng.standard_normal((6, 6)) * 3)
    a[1] = a[0]
    z = {t: to_host(iterative_pinv(tensor(a), t)) for t in (10, 15, 20)}
    z10 = z[10]
    for lhs, rhs in ((a @ z10 @ a, a), (z10 @ a @ z10, z10), ((a @ z10).T, a @ z10),
                     ((z10 @ a).T, z10 @ a)):
        assert_close(lhs, rhs, rtol=0, atol=1e-11)
    drift = {t: np.abs(z[t] - np.linalg.pinv(a)).max() for t in z}
    assert drift[10] < 1e-11
    assert 3.25 ** 5 / 2 < drift[20] / drift[15] < 3.25 ** 5 * 2, drift


# ---- m = N: softmax attention, within the pseudo-inverse's tolerance ---------------------

@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 24), iterations=st.sampled_from([6, 12, 60]),
       seed=st.integers(0, 999))
def test_as_many_landmarks_as_tokens_is_softmax_attention_within_the_pinv_tolerance(
        n, iterations, seed):
    """With m = N every segment is one token: Q̃ = Q, K̃ = K and F = A = B = S (the softmax
    matrix), so O − O* = (S Z − I) S V and ‖O − O*‖_F ≤ ‖I − S Z‖₂ ‖O*‖_F per head, with
    ‖I − S Z‖₂ = max_i f^T(1 − λ_i) (the recursion bound). Rounding adds about
    eps · κ(S) relative (Z ≈ S⁻¹ has norm 1/σ_min); we allow 1000 eps κ(S). The iteration
    runs here because ``exact_at_full`` is off."""
    layer = layer_of(num_landmarks=n, pinv_iterations=iterations, exact_at_full=False)
    q, k, v = qkv(n, b=1, h=H, d=D, seed=seed)
    got = to_host(layer.attend(tensor(q), tensor(k), tensor(v)))
    exact = dense_attention_array(q, k, v)
    s = softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(D))[0]     # (H, N, N)
    kappa = np.linalg.cond(s)
    for h in range(H):
        err = np.linalg.norm(got[0, h] - exact[0, h])
        tol = (recursion_bound(s[h], iterations) + 1e3 * np.finfo(float).eps * kappa[h]) \
            * np.linalg.norm(exact[0, h])
        assert err <= tol, (h, err, tol)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 24), extra=st.integers(0, 3), conv=st.sampled_from([None, 3]),
       hkv=st.sampled_from([1, 2]), seed=st.integers(0, 999))
def test_as_many_landmarks_as_tokens_is_softmax_attention_as_in_the_official_code(
        n, extra, conv, hkv, seed):
    """m ≥ N (so m' = N, one landmark per token), ``exact_at_full`` on (the default): the
    official code's switch to softmax attention, so the output is softmax attention (plus the
    skip) to float64 rounding, whatever ``pinv_iterations``; the hooks see S."""
    layer = layer_of(num_landmarks=n + extra, pinv_iterations=1, conv_kernel=conv,
                     num_kv_heads=hkv)
    q, k, v = qkv(n, b=2, h=H, hkv=hkv, d=D, seed=seed)
    seen = {}
    with layer.hooks([(lambda name: True,
                       lambda t, hook: seen.__setitem__(hook.name, to_host(t)))]):
        got = to_host(layer.attend(tensor(q), tensor(k), tensor(v)))
    skip = 0
    if conv:
        skip = to_host(depthwise_sequence_conv(tensor(np.repeat(v, H // hkv, 1)),
                                               tensor(to_host(layer.conv_weight))))
    want = dense_attention_array(q, k, v) + skip
    assert np.abs(got - want).max() <= 1e-14 * max(1.0, np.abs(want).max())
    assert "hook_pinv" not in seen and "hook_kernel_a" not in seen     # nothing approximated
    kk = np.repeat(k, H // hkv, 1)
    s = softmax(q @ np.swapaxes(kk, -1, -2) / math.sqrt(D))
    if not conv:
        assert_close(seen["hook_pattern"], s, rtol=1e-13, atol=1e-15)


def test_m_equals_n_figures():
    """N = 16, q, k, v ~ N(0, 1), D = 8, max |O − O*| against softmax attention: the official
    code's exact switch (the default) reaches rounding; without it (``exact_at_full=False``)
    6 iterations leave max |Δ| = 0.020, 40 reach rounding (the figures quoted in the
    docstring and identities())."""
    q, k, v = qkv(16, b=1, h=H, d=D, seed=0)
    exact = dense_attention_array(q, k, v)
    errors = {}
    for iterations, at_full in ((6, True), (6, False), (40, False)):
        layer = layer_of(num_landmarks=16, pinv_iterations=iterations, exact_at_full=at_full)
        errors[iterations, at_full] = np.abs(
            to_host(layer.attend(tensor(q), tensor(k), tensor(v))) - exact).max()
    assert errors[6, True] < 1e-15
    assert errors[40, False] < 1e-12
    assert 0.01 < errors[6, False] < 0.04         # six iterations have not converged: 0.020


# ---- the error against the number of landmarks ------------------------------------------

def smooth_qkv(n, seed):
    """q, k random walks / √(j+1) (neighbours alike), v ~ N(0, 1); (1, H, n, D)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, H, n, D)) for _ in range(3))
    walk = np.sqrt(np.arange(1, n + 1))[:, None]
    return np.cumsum(q, 2) / walk, np.cumsum(k, 2) / walk, v


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_error_is_tiny_at_m_equals_n_and_larger_at_small_m(seed):
    n = 32
    q, k, v = smooth_qkv(n, seed)
    exact = dense_attention_array(q, k, v)

    def error(m, iterations=6, exact_at_full=True):
        layer = layer_of(num_landmarks=m, pinv_iterations=iterations,
                         exact_at_full=exact_at_full)
        out = to_host(layer.attend(tensor(q), tensor(k), tensor(v)))
        return np.linalg.norm(out - exact) / np.linalg.norm(exact)

    at_n = error(n, iterations=60, exact_at_full=False)          # the iteration, converged
    assert error(n) < 1e-14                                       # the official switch
    small = [error(m) for m in (1, 2, 4)]
    assert at_n < 1e-10
    assert min(small) > 1e-2                              # an approximation, visibly
    assert error(16) < error(2)                           # more landmarks, less error


def test_landmark_errors_table_falls_with_m():
    rows = NystromAttention.landmark_errors(64, (1, 4, 16, 64))
    ms, errs = zip(*rows)
    assert ms == (1, 4, 16, 64) and all(np.diff(errs) < 0), rows
    assert errs[0] > 0.1 and errs[-1] < 0.1


def test_identities_hold_and_stay_quick():
    rows = NystromAttention.identities()
    assert len(rows) >= 3
    for claim, value, limit in rows:
        assert isinstance(claim, str) and value <= limit, (claim, value, limit)


# ---- linear growth: the scores the layer forms ------------------------------------------

@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 80), m=st.integers(1, 24))
def test_scores_computed_are_2nm_plus_m_squared(n, m):
    """Count the entries of the kernels the layer forms (from the hooks' shapes): 2·N·m' + m'²
    with m' = min(m, N) — linear in N for a fixed m, against N² for softmax attention."""
    layer = layer_of(num_landmarks=m, exact_at_full=False)     # the kernels at m' = N too
    shapes = {}
    names = ("hook_kernel_f", "hook_kernel_a", "hook_kernel_b")
    with layer.hooks([(name, lambda t, hook: shapes.__setitem__(hook.name, t.shape))
                      for name in names]):
        layer.attend(*(tensor(a) for a in qkv(n, b=1, h=H, d=D, seed=n)))
    mm = min(m, n)
    per_head = sum(math.prod(shapes[name][2:]) for name in names)
    assert all(shapes[name][:2] == (1, H) for name in names)
    assert per_head == 2 * n * mm + mm * mm == layer.scores_computed(n, n)
    if n >= m:                                # fixed m: each extra token costs 2m scores
        assert layer.scores_computed(n + 1, n + 1) - per_head == 2 * m
    # with the official switch (the default), m ≥ N is softmax attention: N² scores
    assert layer_of(num_landmarks=m).scores_computed(n, n) == (n * n if m >= n else per_head)


# ---- hooks and the identities tying them to the output ----------------------------------

def run_hooked(layer, x):
    cache = {}
    with layer.hooks([(lambda n: True, lambda t, hook: cache.__setitem__(hook.name, t))]):
        y = layer(x)
    return y, {k: to_host(t) for k, t in cache.items()}


@pytest.mark.parametrize("n,m,conv", [(12, 4, None), (13, 5, None), (9, 4, 3)])
def test_hooks_fire_with_their_shapes_and_tie_to_hook_z(n, m, conv):
    layer = layer_of(num_landmarks=m, conv_kernel=conv)
    x = tensor(np.random.default_rng(1).standard_normal((2, n, E)))
    plain = to_host(layer(x))
    y, c = run_hooked(layer, x)
    assert_close(y, plain, rtol=0, atol=0)          # looking changes nothing
    want = {"hook_q": (2, n, H, D), "hook_k": (2, n, H, D), "hook_v": (2, n, H, D),
            "hook_z": (2, n, H, D), "hook_landmarks_q": (2, H, m, D),
            "hook_landmarks_k": (2, H, m, D), "hook_kernel_f": (2, H, n, m),
            "hook_kernel_a": (2, H, m, m), "hook_kernel_b": (2, H, m, n),
            "hook_pinv": (2, H, m, m), "hook_pattern": (2, H, n, n)}
    if conv:
        want["hook_conv"] = (2, H, n, D)
    assert {k: v.shape for k, v in c.items()} == want
    q, k, v, z = (np.swapaxes(c[name], 1, 2) for name in ("hook_q", "hook_k", "hook_v",
                                                           "hook_z"))   # (B, H, N, D)
    # landmarks are the segment means of q and k
    assert_close(c["hook_landmarks_q"], segment_means(q, m), rtol=1e-12)
    assert_close(c["hook_landmarks_k"], segment_means(k, m), rtol=1e-12)
    # the kernels are the softmaxes of the landmark products
    ql, kl, sc = c["hook_landmarks_q"], c["hook_landmarks_k"], 1 / math.sqrt(D)
    assert_close(c["hook_kernel_f"], softmax(q @ np.swapaxes(kl, -1, -2) * sc), rtol=1e-12)
    assert_close(c["hook_kernel_a"], softmax(ql @ np.swapaxes(kl, -1, -2) * sc), rtol=1e-12)
    assert_close(c["hook_kernel_b"], softmax(ql @ np.swapaxes(k, -1, -2) * sc), rtol=1e-12)
    assert_close(c["hook_pinv"], razavi_pinv(c["hook_kernel_a"], 6), rtol=1e-10, atol=1e-12)
    # z = F Z (B V) (+ conv(V)); and z = pattern · V with the implied pattern
    skip = c["hook_conv"] if conv else 0
    assert_close(z, c["hook_kernel_f"] @ c["hook_pinv"] @ (c["hook_kernel_b"] @ v) + skip,
                 rtol=1e-10, atol=1e-13)
    assert_close(z, c["hook_pattern"] @ v, rtol=1e-10, atol=1e-13)


def test_replacing_the_pseudo_inverse_changes_the_output_as_predicted():
    """A hook that swaps Z for the exact A⁺ (NumPy's SVD pinv) gives F A⁺ (B V)."""
    layer = layer_of(num_landmarks=4)
    x = tensor(np.random.default_rng(2).standard_normal((2, 12, E)))
    _, c = run_hooked(layer, x)
    exact_pinv = np.linalg.pinv(c["hook_kernel_a"])
    z_seen = {}

    def swap(t, hook):
        return tensor(exact_pinv)

    with layer.hooks([("hook_pinv", swap),
                      ("hook_z", lambda t, hook: z_seen.__setitem__("z", to_host(t)))]):
        layer(x)
    v = np.swapaxes(c["hook_v"], 1, 2)
    want = c["hook_kernel_f"] @ exact_pinv @ (c["hook_kernel_b"] @ v)
    assert_close(np.swapaxes(z_seen["z"], 1, 2), want, rtol=1e-10, atol=1e-13)
    assert not np.allclose(z_seen["z"], c["hook_z"])     # the swap did something


def test_hook_pattern_has_a_size_guard(monkeypatch):
    from minitx.attention import nystrom
    monkeypatch.setattr(nystrom, "IMPLIED_PATTERN_MAX_N", 8)
    layer = layer_of(num_landmarks=2)
    x = tensor(np.zeros((1, 9, E)))
    with pytest.raises(ValueError, match="IMPLIED_PATTERN_MAX_N = 8"), \
            layer.hooks([("hook_pattern", lambda t, h: None)]):
        layer(x)
    layer(x)


def test_hook_names_list_only_what_runs():
    assert "hook_conv" not in layer_of().hook_names()
    assert "hook_conv" in layer_of(conv_kernel=5).hook_names()


# ---- gradients, options, models ---------------------------------------------------------

@pytest.mark.parametrize("nq,nk,m,conv,hkv", [(7, 7, 3, None, 2), (5, 9, 4, None, 1),
                                               (6, 6, 6, 3, 2), (8, 8, 3, 5, 1)])
def test_gradcheck_float64(nq, nk, m, conv, hkv):
    layer = layer_of(num_landmarks=m, conv_kernel=conv, num_kv_heads=hkv)
    q, k, v = qkv(nq, nk, b=1, h=H, hkv=hkv, d=D, scale=0.7, seed=3)
    minitx.gradcheck(layer.attend, tuple(tensor(a, requires_grad=True) for a in (q, k, v)))
    if conv:                                  # the skip's kernel learns
        layer.attend(tensor(q), tensor(k), tensor(v)).sum().backward()
        assert layer.conv_weight.grad is not None


@pytest.mark.parametrize("options,match", [
    ({"num_landmarks": 0}, "num_landmarks must be a positive int, got 0"),
    ({"num_landmarks": 2.5}, "num_landmarks must be a positive int, got 2.5"),
    ({"pinv_iterations": -1}, "pinv_iterations must be an int >= 0, got -1"),
    ({"conv_kernel": 4}, "conv_kernel must be None or a positive odd int, got 4"),
    ({"conv_kernel": 0}, "conv_kernel must be a positive int, got 0"),
    ({"exact_at_full": 1}, "exact_at_full must be"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        REGISTRY["nystrom"](E, H, **options)


def test_refuses_causal_and_a_conv_skip_across_lengths():
    with pytest.raises(ValueError, match="does not support causal=True"):
        REGISTRY["nystrom"](E, H, causal=True)
    layer = layer_of(conv_kernel=3)
    q, k, v = qkv(4, 6, b=1, h=H, d=D)
    with pytest.raises(ValueError, match="needs Nq == Nk, got 4 and 6"):
        layer.attend(tensor(q), tensor(k), tensor(v))


def test_runs_in_an_encoder_classifier_and_gpt_refuses_it():
    from minitx.models import EncoderClassifier, GPT, GPTConfig
    minitx.manual_seed(0)
    model = EncoderClassifier(vocab_size=11, num_classes=3, d_model=E, nhead=H, num_layers=1,
                              attention="nystrom", attention_options={"num_landmarks": 4,
                                                                      "conv_kernel": 3})
    logits = model(minitx.tensor(np.random.default_rng(0).integers(0, 11, (2, 10))))
    assert logits.shape == (2, 3) and np.all(np.isfinite(to_host(logits)))
    with pytest.raises(ValueError, match="causal"):
        GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=H, n_embd=E,
                      attention="nystrom"))


# ---- parity with HuggingFace transformers (a PyTorch oracle on the CPU) -----------------

@pytest.mark.parametrize("n,m,conv", [(12, 4, None), (16, 8, None), (12, 3, 5),
                                      (12, 12, None), (10, 10, 3)])
def test_matches_huggingface_nystromformer_self_attention(n, m, conv):
    """m = N included: there HuggingFace, as the authors' code, computes softmax attention."""
    torch = need("torch")
    hf = need("transformers.models.nystromformer.modeling_nystromformer")
    from transformers import NystromformerConfig
    config = NystromformerConfig(hidden_size=E, num_attention_heads=H, num_landmarks=m,
                                 segment_means_seq_len=n, conv_kernel_size=conv or 3,
                                 attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    theirs = hf.NystromformerSelfAttention(config).double().eval()
    theirs.conv_kernel_size = conv        # this config refuses None: the skip is off by hand
    # the per-matrix Z₀ = Aᵀ/‖A‖₁ (their "original" option takes one max over the batch)
    theirs.init_option = "exact"
    ours = layer_of(num_landmarks=m, conv_kernel=conv)
    for mine, their in ((ours.q_proj, theirs.query), (ours.k_proj, theirs.key),
                        (ours.v_proj, theirs.value)):
        mine.weight.copy_(their.weight.detach().numpy())
        mine.bias.copy_(their.bias.detach().numpy())
    if conv:
        ours.conv_weight.copy_(theirs.conv.weight.detach().numpy()[:, 0, :, 0])
    x = np.random.default_rng(4).standard_normal((2, n, E))
    with torch.no_grad():
        want = theirs(torch.from_numpy(x))[0].numpy()
    q, k, v = ours.project(tensor(x))
    from minitx.attention import merge_heads
    got = merge_heads(ours.attend(q, k, v))
    assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_depthwise_conv_matches_torch_conv2d():
    torch = need("torch")
    rng = np.random.default_rng(5)
    v, w = rng.standard_normal((2, 3, 10, 4)), rng.standard_normal((3, 7))
    want = torch.nn.functional.conv2d(torch.from_numpy(v), torch.from_numpy(w)[:, None, :, None],
                                      padding=(3, 0), groups=3).numpy()
    assert_close(depthwise_sequence_conv(tensor(v), tensor(w)), want, rtol=1e-12, atol=1e-14)


def test_the_metrics_budget_grid_lowers_the_error_left_to_right():
    """minitx.metrics.APPROX_BUDGETS["nystrom"] (the tour, the site and
    benchmarks/approx_quality.py read it): at N = 128 the attention and output distances
    fall at every step of the grid."""
    from minitx.metrics import APPROX_BUDGETS, quality_table
    rows = quality_table(n=128, d=8, seeds=1, scale=0.5,
                         budgets={"nystrom": APPROX_BUDGETS["nystrom"]})
    assert [r[2] for r in rows] == [4, 16, 64, 128]
    for col in (3, 4):
        assert all(np.diff([r[col] for r in rows]) < 0), rows
