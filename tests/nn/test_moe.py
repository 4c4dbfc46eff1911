"""minitx.nn.MoE against a dense reference written here in NumPy, with no oracle.

The reference computes **every** expert on **every** token and multiplies by a (T, n) weight
matrix that is zero outside each token's top k; its routers are written token by token from the
formulas (minitx.nn.moe's module docstring). Equal outputs show that the sparse dispatch (sort
the pairs, run each expert on its block, undo the sort, sum the slots) loses and misplaces
nothing. Gradients are checked in float64 with ``minitx.gradcheck``; top-k selection is
piecewise constant, so those inputs are checked to have no near-ties (a finite-difference step
of 1e-6 must not change a choice or cross a clamp).
"""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import minitx
import minitx.nn as nn
from minitx.validate import OptionError
from support import assert_close, assert_equal, tensor, to_host


# ---- the NumPy reference -----------------------------------------------------------------------

def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def softmax(a):
    z = np.exp(a - a.max())
    return z / z.sum()


def reference_route(logits, kind, k, norm=True, bias=None, n_group=1, topk_group=1, rho=1.0):
    """(T, n) weights, zero outside each token's top k, and the margin of each choice (the
    smallest gap between a chosen and an unchosen score, or between kept and dropped groups)."""
    t_count, n = logits.shape
    weights, margin = np.zeros((t_count, n)), np.inf
    for t in range(t_count):
        row = logits[t]
        if kind == "softmax":
            p = softmax(row)
            score = p
            chosen = np.argsort(-p, kind="stable")[:k]
            w = p[chosen] / p[chosen].sum() if norm else p[chosen]
        elif kind == "topk_softmax":
            score = row
            chosen = np.argsort(-row, kind="stable")[:k]
            w = softmax(row[chosen])
        elif kind == "topk_sigmoid":               # Llama 4: σ of each chosen logit
            score = row
            chosen = np.argsort(-row, kind="stable")[:k]
            w = sigmoid(row[chosen])
        else:
            s = sigmoid(row)
            score = s + bias                       # corrected: used to choose only
            size = n // n_group
            eligible = np.arange(n)
            if n_group > 1:
                group_score = np.array([np.sort(score[g * size:(g + 1) * size])[-2:].sum()
                                        for g in range(n_group)])
                order = np.argsort(-group_score, kind="stable")
                if topk_group < n_group:
                    margin = min(margin, group_score[order[topk_group - 1]]
                                 - group_score[order[topk_group]])
                eligible = np.concatenate([np.arange(g * size, (g + 1) * size)
                                           for g in sorted(order[:topk_group])])
            chosen = eligible[np.argsort(-score[eligible], kind="stable")[:k]]
            w = s[chosen]
            if norm:
                w = w / (w.sum() + 1e-20)
            rest = np.setdiff1d(eligible, chosen)
            if rest.size:
                margin = min(margin, score[chosen].min() - score[rest].max())
            score = None
        if score is not None and k < n:
            rest = np.setdiff1d(np.arange(n), chosen)
            margin = min(margin, score[chosen].min() - score[rest].max())
        weights[t, chosen] = rho * w
    return weights, margin


def reference_expert(x, p, e, kind="swiglu", limit=7.0, alpha=1.702):
    """Expert e on every token: x (T, E) → (T, E), from the host parameter arrays ``p``."""
    def bias(name):
        return p[name][e] if name in p else 0.0
    u = x @ p["experts.up_proj"][e].T + bias("experts.up_proj_bias")
    if kind == "relu2":                         # Nemotron-H: no gate
        return np.maximum(u, 0) ** 2 @ p["experts.down_proj"][e].T
    g = x @ p["experts.gate_proj"][e].T + bias("experts.gate_proj_bias")
    if kind == "swiglu":
        h = g * sigmoid(g) * u
    else:
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        h = g * sigmoid(alpha * g) * (u + 1)
    return h @ p["experts.down_proj"][e].T + bias("experts.down_proj_bias")


def reference_moe(x, p, kind, k, expert="swiglu", limit=7.0, on_input=False, **route):
    """x (B, N, E) → (B, N, E), the (T, n) weights and the choices' margin: all experts on all
    tokens (``on_input``: expert e on w_te·x_t, summed unweighted; a bias-free SwiGLU gives 0
    on the zero input of an unchosen expert)."""
    b, n_tok, e = x.shape
    h = x.reshape(-1, e)
    logits = h @ p["router.weight"].T + p.get("router.bias", 0.0)
    w, margin = reference_route(logits, kind, k, bias=p.get("router.e_score_correction_bias"),
                                **route)
    n = p["router.weight"].shape[0]
    routed_in = h if "fc1_latent_proj.weight" not in p else h @ p["fc1_latent_proj.weight"].T
    h, h_in = routed_in, h                      # the experts' input; the router's and shared
    if on_input:
        y = sum(reference_expert(w[:, j:j + 1] * h, p, j, expert, limit) for j in range(n))
    else:
        every = np.stack([reference_expert(h, p, j, expert, limit) for j in range(n)], axis=1)
        y = np.einsum("tn,tne->te", w, every)
    if "fc2_latent_proj.weight" in p:           # back from the latent space
        y = y @ p["fc2_latent_proj.weight"].T
    h = h_in
    if "shared_expert.up_proj.weight" in p and "shared_expert.gate_proj.weight" not in p:
        y = y + np.maximum(h @ p["shared_expert.up_proj.weight"].T, 0) ** 2 \
            @ p["shared_expert.down_proj.weight"].T
    if "shared_expert.gate_proj.weight" in p:
        g = h @ p["shared_expert.gate_proj.weight"].T
        s = (g * sigmoid(g) * (h @ p["shared_expert.up_proj.weight"].T)) \
            @ p["shared_expert.down_proj.weight"].T
        if "shared_expert_gate.weight" in p:
            s = sigmoid(h @ p["shared_expert_gate.weight"].T) * s
        y = y + s
    return y.reshape(b, n_tok, e), w, margin


def redraw(module, rng, scale=1.0):
    """Every parameter and buffer of ``module`` drawn from N(0, scale²) (so none keeps an
    initial value); returns the host arrays by name."""
    drawn = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        drawn[name] = rng.standard_normal(t.shape) * scale
        t.copy_(drawn[name])
    return drawn


FAMILIES = {   # (router options, expert options), one tiny block of each family's shape
    "mixtral": dict(router="softmax"),
    "qwen_unnormalised": dict(router="softmax", norm_topk_prob=False),
    "gpt_oss": dict(router="topk_softmax", router_bias=True, expert="clamped_swiglu",
                    expert_bias=True),
    "deepseek_v3": dict(router="sigmoid_grouped", n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, n_shared_experts=2),
    "qwen2_shared_gate": dict(router="softmax", norm_topk_prob=False,
                              shared_intermediate_size=5, shared_expert_gate=True),
    "llama4": dict(router="topk_sigmoid", norm_topk_prob=False, weights_on_input=True,
                   shared_intermediate_size=4),
    "nemotron_h": dict(router="sigmoid_grouped", n_group=2, topk_group=1, expert="relu2",
                       shared_intermediate_size=5, latent_size=3, routed_scaling_factor=1.5),
}


def route_options(opts):
    out = {"norm": opts.get("norm_topk_prob", True),
           "rho": opts.get("routed_scaling_factor", 1.0),
           "on_input": opts.get("weights_on_input", False)}
    if opts.get("router") == "sigmoid_grouped":
        out.update(n_group=opts["n_group"], topk_group=opts["topk_group"])
    return out


# ---- the block against the dense reference ----------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_equals_the_dense_reference(family):
    opts = FAMILIES[family]
    rng = np.random.default_rng(1)
    moe = nn.MoE(6, 4, 8, 2, dtype="float64", **opts)
    p = redraw(moe, rng)
    x = rng.standard_normal((2, 5, 6))
    y = moe(tensor(x))
    want, w, margin = reference_moe(x, p, opts["router"], 2, opts.get("expert", "swiglu"),
                                    **route_options(opts))
    assert margin > 1e-6
    assert_close(y, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    # the statistic: each expert's count of (token, slot) choices
    assert_equal(moe.tokens_per_expert, (w != 0).sum(axis=0))
    assert int(to_host(moe.tokens_per_expert).sum()) == 10 * 2
    assert moe.router_logits.shape == (10, 8)


@st.composite
def moe_case(draw):
    n = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["softmax", "topk_softmax", "sigmoid_grouped"]))
    opts = {"router": kind}
    if kind == "sigmoid_grouped":
        groups = draw(st.sampled_from([g for g in range(1, n + 1)
                                       if n % g == 0 and (g == 1 or n // g >= 2)]))
        opts.update(n_group=groups, topk_group=draw(st.integers(1, groups)))
        k_max = opts["topk_group"] * (n // groups)
    else:
        k_max = n
    if kind == "softmax":
        opts["norm_topk_prob"] = draw(st.booleans())
    opts["expert"] = draw(st.sampled_from(["swiglu", "clamped_swiglu"]))
    return (draw(st.integers(1, 3)), draw(st.integers(1, 9)), n, draw(st.integers(1, k_max)),
            draw(st.integers(1, 6)), opts, draw(st.integers(0, 2 ** 16)))


@given(moe_case())
def test_sparse_dispatch_equals_dense_reference_over_sizes(case):
    """Batches, token counts, expert counts, top-k and widths: every expert that gets no token
    (T·k < n), k = n, a single token, a single expert."""
    b, n_tok, n, k, e, opts, seed = case
    rng = np.random.default_rng(seed)
    clamped = opts["expert"] == "clamped_swiglu"
    moe = nn.MoE(e, 3, n, k, expert_bias=clamped, swiglu_limit=1.5 if clamped else None,
                 dtype="float64", **opts)
    p = redraw(moe, rng)
    x = rng.standard_normal((b, n_tok, e))
    want, _, margin = reference_moe(x, p, opts["router"], k, opts["expert"], limit=1.5,
                                    **route_options(opts))
    assume(margin > 1e-9)            # a near-tie may be broken either way by rounding
    assert_close(moe(tensor(x)), want, rtol=1e-11, atol=1e-11 * max(np.abs(want).max(), 1))


@pytest.mark.parametrize("router", ["softmax", "topk_softmax", "sigmoid_grouped"])
def test_no_tokens_gives_an_empty_output_and_gradient(router):
    moe = nn.MoE(4, 3, 4, 2, router=router, n_shared_experts=1, dtype="float64")
    x = tensor(np.zeros((2, 0, 4)), requires_grad=True)
    y = moe(x)
    minitx.functional.sum(y).backward()
    assert y.shape == (2, 0, 4) and x.grad.shape == (2, 0, 4)
    assert_equal(moe.tokens_per_expert, np.zeros(4))


# ---- the grouped product ----------------------------------------------------------------------

@st.composite
def grouped_case(draw):
    """n experts, each with 0–4 rows (so some get none), widths, with or without biases."""
    n = draw(st.integers(1, 5))
    counts = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    return (counts, draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.booleans()),
            draw(st.integers(0, 2 ** 16)))


@given(grouped_case())
def test_grouped_linear_equals_each_row_through_its_experts_matrix(case):
    """Row r of block e is x_r W_eᵀ + b_e, written here row by row; the gradient of an expert
    that got no row is exactly zero; float64 central differences for x, W and b."""
    counts, d_in, d_out, with_bias, seed = case
    rng = np.random.default_rng(seed)
    n, m = len(counts), sum(counts)
    x = rng.standard_normal((m, d_in))
    w = rng.standard_normal((n, d_out, d_in))
    b = rng.standard_normal((n, d_out)) if with_bias else None
    owner = np.repeat(np.arange(n), counts)                # each row's expert
    want = np.zeros((m, d_out))
    for r, e in enumerate(owner):
        want[r] = w[e] @ x[r] + (b[e] if with_bias else 0.0)
    xt, wt = tensor(x, requires_grad=True), tensor(w, requires_grad=True)
    bt = tensor(b, requires_grad=True) if with_bias else None
    y = nn.grouped_linear(xt, wt, counts, bt)
    assert_close(y, want, rtol=1e-13, atol=1e-13)
    g = rng.standard_normal((m, d_out))
    minitx.functional.sum(y * tensor(g)).backward()
    idle = [e for e in range(n) if counts[e] == 0]
    assert_equal(to_host(wt.grad)[idle], np.zeros((len(idle), d_out, d_in)))
    if with_bias:
        assert_equal(to_host(bt.grad)[idle], np.zeros((len(idle), d_out)))
    inputs = (xt, wt) + ((bt,) if with_bias else ())
    assert minitx.gradcheck(lambda *a: nn.grouped_linear(a[0], a[1], counts, *a[2:]), inputs)


def test_grouped_linear_refuses_counts_that_do_not_cover_the_rows():
    x, w = tensor(np.zeros((5, 3))), tensor(np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match="grouped_linear.*2 counts summing to 4"):
        nn.grouped_linear(x, w, [1, 3])
    with pytest.raises(ValueError, match="grouped_linear.*3 counts"):
        nn.grouped_linear(x, w, [1, 3, 1])


# ---- the routers ----------------------------------------------------------------------------

def test_topk_then_softmax_equals_renormalised_softmax():
    """gpt-oss's order (top k logits, softmax over k) and Mixtral's (softmax, top k,
    renormalise) give the same weights and choices."""
    logits = tensor(np.random.default_rng(2).standard_normal((7, 6)))
    w1, i1 = nn.topk_softmax(logits, 3)
    w2, i2 = nn.softmax_topk(logits, 3, normalize=True)
    assert_equal(i1, i2)
    assert_close(w1, w2, rtol=1e-14)


def test_correction_bias_chooses_but_does_not_weigh():
    """DeepSeek-V3: a large correction bias on expert 3 makes every token choose it, and its
    weight is still its uncorrected sigmoid score."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 4))
    bias = np.array([0.0, 0.0, 0.0, 10.0])
    w, idx = nn.sigmoid_grouped_topk(tensor(logits), 2, tensor(bias), normalize=False)
    idx = to_host(idx)
    assert (idx[:, 0] == 3).all()
    s = sigmoid(logits)
    assert_close(w, np.take_along_axis(s, idx, axis=1), rtol=1e-14)
    # the second choice is the best uncorrected score among the others
    assert_equal(idx[:, 1], np.argmax(s[:, :3], axis=1))


def test_group_limited_routing_skips_the_best_expert_of_a_weak_group():
    """Groups score the sum of their two best: group 0 holds the single best expert (0.99) but
    a weak second (0.01); group 1's two experts (0.6, 0.6) win with topk_group = 1."""
    s = np.array([[0.99, 0.01, 0.6, 0.6]])
    logits = np.log(s / (1 - s))                        # sigmoid(logits) = s
    w, idx = nn.sigmoid_grouped_topk(tensor(logits), 2, np.zeros(4), n_group=2, topk_group=1)
    assert sorted(to_host(idx)[0]) == [2, 3]
    assert_close(w, [[0.5, 0.5]], rtol=1e-12)
    _, idx = nn.sigmoid_grouped_topk(tensor(logits), 2, np.zeros(4), n_group=2, topk_group=2)
    assert sorted(to_host(idx)[0]) == [0, 2] or sorted(to_host(idx)[0]) == [0, 3]


def test_routed_scaling_factor_scales_every_weight():
    rng = np.random.default_rng(4)
    a = nn.Router(5, 8, 3, "sigmoid_grouped", n_group=2, topk_group=1, dtype="float64")
    b = nn.Router(5, 8, 3, "sigmoid_grouped", n_group=2, topk_group=1,
                  routed_scaling_factor=2.5, dtype="float64")
    drawn = redraw(a, rng)
    for name, t in [*b.named_parameters(), *b.named_buffers()]:
        t.copy_(drawn[name])
    x = tensor(rng.standard_normal((6, 5)))
    wa, ia = a.route(a(x))
    wb, ib = b.route(b(x))
    assert_equal(ia, ib)
    assert_close(wb, 2.5 * to_host(wa), rtol=1e-15)
    assert_close(to_host(wa).sum(axis=1), np.ones(6), rtol=1e-12)    # norm_topk_prob


# ---- gradients --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_gradcheck_through_router_and_experts(family):
    """float64 central differences for the input and every parameter. The inputs were checked
    to have no near-tie (choice margin > 1e-3, clamp distance > 1e-3 where a clamp exists), so
    that the step of 1e-6 moves no choice; the clamp limit is 1.0 so that it bites."""
    opts = dict(FAMILIES[family])
    limit = 7.0
    if opts.get("expert") == "clamped_swiglu":
        opts["swiglu_limit"] = limit = 1.0
    if opts["router"] == "sigmoid_grouped":
        opts.update(n_group=2, topk_group=1)           # 4 experts: 2 groups of 2
    rng = np.random.default_rng(5)
    moe = nn.MoE(4, 3, 4, 2, dtype="float64", **opts)
    p = redraw(moe, rng, scale=0.8)
    x = rng.standard_normal((1, 3, 4))
    _, _, margin = reference_moe(x, p, opts["router"], 2, opts.get("expert", "swiglu"), limit,
                                 **route_options(opts))
    assert margin > 1e-3
    if opts.get("expert") == "clamped_swiglu":
        h = x.reshape(-1, 4)
        pre = np.concatenate([h @ p["experts.gate_proj"][j].T + p["experts.gate_proj_bias"][j]
                              for j in range(4)] +
                             [h @ p["experts.up_proj"][j].T + p["experts.up_proj_bias"][j]
                              for j in range(4)])
        assert np.abs(np.abs(pre) - 1.0).min() > 1e-3
        assert (np.abs(pre) > 1.0).any() and (np.abs(pre) < 1.0).any()     # both sides occur
    params = list(moe.parameters())
    xt = tensor(x, requires_grad=True)
    assert minitx.gradcheck(lambda x_, *ps: moe(x_), (xt, *params))


def test_load_balancing_loss_gradcheck():
    logits = tensor(np.random.default_rng(6).standard_normal((9, 5)), requires_grad=True)
    assert minitx.gradcheck(lambda lg: nn.load_balancing_loss(lg, 5, 2), (logits,))


# ---- the load-balancing loss ----------------------------------------------------------------

def reference_aux_loss(layers, n, k, mask=None):
    """n Σ_e f_e P_e with every layer's tokens pooled and padding (mask 0) left out."""
    f, prob, tokens = np.zeros(n), np.zeros(n), 0.0
    for logits in layers:
        m = np.ones(len(logits)) if mask is None else mask.reshape(-1).astype(float)
        for t, row in enumerate(logits):
            p = softmax(row)
            for e in np.argsort(-p, kind="stable")[:k]:
                f[e] += m[t]
            prob += m[t] * p
            tokens += m[t]
    return n * np.sum((f / tokens) * (prob / tokens))


@pytest.mark.parametrize("layers,masked", [(1, False), (3, False), (2, True)])
def test_load_balancing_loss_equals_reference(layers, masked):
    rng = np.random.default_rng(7)
    logits = [rng.standard_normal((2 * 5, 6)) for _ in range(layers)]
    mask = (rng.random((2, 5)) > 0.3).astype(np.int64) if masked else None
    got = nn.load_balancing_loss([tensor(lg) for lg in logits] if layers > 1 else
                                 tensor(logits[0]), 6, 2, attention_mask=mask)
    assert_close(got, reference_aux_loss(logits, 6, 2, mask), rtol=1e-13)


def test_a_balanced_router_scores_top_k():
    """f_e = k/n and P_e = 1/n give n · n · (k/n)(1/n) = k: the minimum the loss aims at.
    Token t bumps experts t … t+k−1 (mod n) by a little: cyclic, so every expert gets the same
    mean probability and the same count."""
    n, k = 6, 2
    logits = np.zeros((n, n))
    for t in range(n):
        logits[t, [(t + j) % n for j in range(k)]] = 1e-3
    assert_close(nn.load_balancing_loss(tensor(logits), n, k), k, rtol=1e-12)


# ---- hooks ------------------------------------------------------------------------------------

def small_moe(**opts):
    moe = nn.MoE(4, 3, 4, 2, dtype="float64", **opts)
    redraw(moe, np.random.default_rng(8))
    return moe


def test_hook_points_are_named_in_forward_order():
    assert small_moe().hook_names() == ["hook_router_logits", "hook_expert_indices",
                                        "hook_expert_weights", "hook_tokens_per_expert"]


def test_hooks_read_the_routing():
    moe = small_moe()
    seen = {}

    def keep(name):
        def fn(act, hook):
            seen[name] = to_host(act)
        return fn

    x = tensor(np.random.default_rng(9).standard_normal((2, 3, 4)))
    with moe.hooks(fwd_hooks=[(n, keep(n)) for n in moe.hook_names()]):
        moe(x)
    assert seen["hook_router_logits"].shape == (6, 4)
    assert seen["hook_expert_indices"].shape == (6, 2)
    assert seen["hook_expert_weights"].shape == (6, 2)
    assert_equal(seen["hook_tokens_per_expert"],
                 np.bincount(seen["hook_expert_indices"].reshape(-1), minlength=4))
    assert_close(seen["hook_router_logits"], moe.router_logits)


def test_a_hook_on_the_logits_steers_the_choice():
    moe = small_moe()
    x = tensor(np.random.default_rng(10).standard_normal((1, 5, 4)))

    def favour_expert_2(logits, hook):
        bump = np.zeros(logits.shape)
        bump[:, 2] = 100.0
        return logits + tensor(bump)

    with moe.hooks(fwd_hooks=[("hook_router_logits", favour_expert_2)]):
        moe(x)
    assert_equal(moe.tokens_per_expert[2], 5)


def test_a_hook_on_the_indices_reroutes_with_the_original_weights():
    moe = small_moe()
    x = np.random.default_rng(11).standard_normal((1, 3, 4))
    p = {n: to_host(t) for n, t in [*moe.named_parameters()]}
    seen = {}

    def to_experts_0_and_1(indices, hook):
        return minitx.tensor(np.tile(np.array([0, 1]), (3, 1)))

    def keep_weights(w, hook):
        seen["w"] = to_host(w)

    with moe.hooks(fwd_hooks=[("hook_expert_indices", to_experts_0_and_1),
                              ("hook_expert_weights", keep_weights)]):
        y = moe(tensor(x))
    h = x.reshape(3, 4)
    want = (seen["w"][:, :1] * reference_expert(h, p, 0)
            + seen["w"][:, 1:] * reference_expert(h, p, 1))
    assert_close(y, want.reshape(1, 3, 4), rtol=1e-12)


def test_tokens_per_expert_hook_is_read_only():
    moe = small_moe()
    with moe.hooks(fwd_hooks=[("hook_tokens_per_expert", lambda c, h: c * 0)]):
        with pytest.raises(ValueError, match="read-only"):
            moe(tensor(np.ones((1, 2, 4))))


# ---- layout, dtypes and bad input -------------------------------------------------------------

def test_state_dict_names_and_shapes():
    moe = nn.MoE(6, 4, 8, 2, router="sigmoid_grouped", n_group=4, topk_group=2,
                 n_shared_experts=2)
    shapes = {k: tuple(v.shape) for k, v in moe.state_dict().items()}
    assert shapes == {"router.weight": (8, 6), "router.e_score_correction_bias": (8,),
                      "experts.gate_proj": (8, 4, 6), "experts.up_proj": (8, 4, 6),
                      "experts.down_proj": (8, 6, 4),
                      "shared_expert.gate_proj.weight": (8, 6),
                      "shared_expert.up_proj.weight": (8, 6),
                      "shared_expert.down_proj.weight": (6, 8)}


def test_float32_in_float32_out():
    moe = nn.MoE(4, 3, 4, 2, router="topk_softmax", expert="clamped_swiglu", expert_bias=True)
    assert moe.experts.gate_proj.dtype == np.float32
    y = moe(tensor(np.ones((1, 2, 4)), dtype="float32"))
    assert y.dtype == np.float32 and y.shape == (1, 2, 4)


@pytest.mark.parametrize("options,named", [
    (dict(top_k=5), "top_k"),
    (dict(router="softmax_topk"), "router"),
    (dict(expert="geglu"), "expert"),
    (dict(n_group=2, topk_group=1), "n_group"),
    (dict(router="sigmoid_grouped", n_group=3), "n_group"),
    (dict(router="sigmoid_grouped", n_group=4), "n_group"),
    (dict(router="sigmoid_grouped", n_group=2, topk_group=3), "topk_group"),
    (dict(router="sigmoid_grouped", n_group=2, topk_group=1, top_k=3), "top_k"),
    (dict(router="topk_softmax", norm_topk_prob=False), "norm_topk_prob"),
    (dict(router="topk_sigmoid"), "norm_topk_prob"),
    (dict(weights_on_input="yes"), "weights_on_input"),
    (dict(latent_size=0), "latent_size"),
    (dict(expert="relu2", expert_bias=True), "bias.*relu2"),
    (dict(swiglu_limit=7.0), "swiglu_limit"),
    (dict(n_shared_experts=1, shared_intermediate_size=4), "shared_intermediate_size"),
    (dict(shared_expert_gate=True), "shared_expert_gate"),
    (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
    (dict(num_experts=0), "num_experts"),
])
def test_bad_options_are_refused_by_name(options, named):
    args = dict(hidden_size=4, intermediate_size=3, num_experts=4, top_k=2)
    args.update(options)
    with pytest.raises(OptionError, match=named):
        nn.MoE(**args)


def test_wrong_input_shape_is_refused():
    with pytest.raises(ValueError, match=r"\(B, N, 4\)"):
        small_moe()(tensor(np.ones((2, 4))))
    with pytest.raises(ValueError, match="router_logits"):
        nn.load_balancing_loss(tensor(np.ones((3, 5))), 4, 2)
