"""minitx.optim: optimizer updates, gradient clipping and lr schedules.

Each optimizer is checked twice: against an update written out here from the paper / the
PyTorch documentation's pseudo-code (fixed gradients, NumPy), and, where torch is installed,
against ``torch.optim`` over several steps of a small float64 problem.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import need

import minitx
import minitx.nn as nn
from minitx import optim


def param(values):
    # np.array copies: a Parameter built from a NumPy array shares its memory, and the
    # in-place updates must not leak into the test's data
    return nn.Parameter(np.array(values, dtype=np.float64))


def grads_sequence(steps, shape, seed=0):
    return np.random.default_rng(seed).standard_normal((steps, *shape))


def run_with_fixed_grads(opt_cls, theta0, grads, **kwargs):
    """Apply ``opt_cls`` to one parameter whose gradient at step t is grads[t]."""
    p = param(theta0)
    opt = opt_cls([p], **kwargs)
    for g in grads:
        p.grad = minitx.tensor(g)
        opt.step()
    return p.numpy()


THETA0 = np.array([0.5, -1.0, 2.0, 0.0])
GRADS = grads_sequence(5, (4,))


# ---- updates written out by hand --------------------------------------------------------------

def test_sgd_plain_is_theta_minus_lr_grad():
    expected = THETA0 - 0.1 * GRADS.sum(axis=0)
    np.testing.assert_allclose(run_with_fixed_grads(optim.SGD, THETA0, GRADS, lr=0.1), expected,
                               rtol=1e-12)


@pytest.mark.parametrize("momentum, dampening, weight_decay, nesterov", [
    (0.9, 0.0, 0.0, False), (0.9, 0.3, 0.01, False), (0.8, 0.0, 0.05, True)])
def test_sgd_momentum_matches_pytorch_docs_pseudocode(momentum, dampening, weight_decay, nesterov):
    lr, theta, buf = 0.05, THETA0.copy(), None
    for t, g in enumerate(GRADS, start=1):
        g = g + weight_decay * theta                              # g_t ← g_t + λ θ_{t−1}
        buf = g.copy() if t == 1 else momentum * buf + (1 - dampening) * g   # b_t
        g = g + momentum * buf if nesterov else buf
        theta = theta - lr * g                                    # θ_t ← θ_{t−1} − γ g_t
    got = run_with_fixed_grads(optim.SGD, THETA0, GRADS, lr=lr, momentum=momentum,
                               dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
    np.testing.assert_allclose(got, theta, rtol=1e-12, atol=1e-15)


def adam_reference(theta, grads, lr, beta1, beta2, eps, weight_decay=0.0, decoupled=False,
                   amsgrad=False):
    """Kingma & Ba (2015), Algorithm 1, with PyTorch's L2 / decoupled decay and AMSGrad."""
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    v_max = np.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            theta = theta - lr * weight_decay * theta             # AdamW: θ ← θ − γλθ
        else:
            g = g + weight_decay * theta                          # Adam: g ← g + λθ
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g ** 2
        m_hat = m / (1 - beta1 ** t)
        if amsgrad:
            # PyTorch keeps the running max of the *uncorrected* v and corrects it with the
            # current step's factor (its docs write max over v̂; the code, tested below, does this).
            v_max = np.maximum(v_max, v)
            v_hat = v_max / (1 - beta2 ** t)
        else:
            v_hat = v / (1 - beta2 ** t)
        theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
    return theta


@pytest.mark.parametrize("opt_cls, kwargs, decoupled", [
    (optim.Adam, dict(lr=0.01), False),
    (optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), False),
    (optim.Adam, dict(lr=0.01, amsgrad=True), False),
    (optim.AdamW, dict(lr=0.01), True),                           # default weight_decay 1e-2
    (optim.AdamW, dict(lr=0.02, weight_decay=0.5, amsgrad=True), True),
])
def test_adam_family_matches_the_paper_with_pytorch_conventions(opt_cls, kwargs, decoupled):
    full = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                weight_decay=1e-2 if opt_cls is optim.AdamW else 0.0, amsgrad=False)
    full.update(kwargs)
    # a gradient that shrinks then grows, so AMSGrad's max actually differs from v
    grads = GRADS * np.array([1.0, 0.2, 0.1, 3.0, 0.5])[:, None]
    expected = adam_reference(THETA0.copy(), grads, full["lr"], *full["betas"], full["eps"],
                              full["weight_decay"], decoupled, full["amsgrad"])
    got = run_with_fixed_grads(opt_cls, THETA0, grads, **kwargs)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_adam_first_step_moves_each_coordinate_by_about_lr():
    # After bias correction m̂₁ = g and v̂₁ = g², so Δθ = −lr · g/(|g| + ε) ≈ −lr · sign(g):
    # the reason for the correction (without it the first step would be 0.1/√0.001 ≈ 3× larger).
    g = np.array([1e-3, -5.0, 40.0])
    got = run_with_fixed_grads(optim.Adam, np.zeros(3), [g], lr=0.1)
    np.testing.assert_allclose(got, -0.1 * g / (np.abs(g) + 1e-8), rtol=1e-12)   # exact, ε = 1e-8
    # ≈ −lr · sign(g) up to the relative ε/(|g| + ε) ≤ 1e-5 (at |g| = 1e-3)
    np.testing.assert_allclose(got, -0.1 * np.sign(g), rtol=2e-5)


def test_params_without_grad_are_skipped_and_get_no_state():
    a, b = param([1.0, 2.0]), param([3.0])
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = minitx.tensor(np.array([1.0, 1.0]))
    opt.step()
    assert b.numpy().tolist() == [3.0] and b not in opt.state and a in opt.state
    assert opt.state[a]["step"] == 1


def test_param_groups_use_their_own_hyperparameters():
    a, b = param([1.0]), param([1.0])
    opt = optim.SGD([{"params": [a], "lr": 0.5}, {"params": b}], lr=0.1, momentum=0.0)
    assert opt.param_groups[1]["lr"] == 0.1 and opt.param_groups[0]["momentum"] == 0.0
    a.grad = minitx.tensor(np.array([1.0]))
    b.grad = minitx.tensor(np.array([1.0]))
    opt.step()
    assert a.numpy()[0] == pytest.approx(0.5) and b.numpy()[0] == pytest.approx(0.9)
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_update_is_in_place_and_records_no_graph():
    p = param([1.0, 2.0])
    data = p.data
    p.grad = minitx.tensor(np.array([1.0, 1.0]))
    optim.SGD([p], lr=0.1, momentum=0.9).step()
    assert p.data is data and p.is_leaf and p.requires_grad


def test_step_with_closure_returns_loss():
    p = param([2.0])
    opt = optim.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 4.0 and p.numpy()[0] == pytest.approx(2.0 - 0.25 * 4.0)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: optim.SGD(p, lr=-0.1), "SGD: lr must be a number >= 0, got -0.1"),
    (lambda p: optim.SGD(p, lr=0.1, momentum=-1), "SGD: momentum must be a number >= 0, got -1"),
    (lambda p: optim.SGD(p, lr=0.1, nesterov=True), "momentum > 0 and dampening == 0"),
    (lambda p: optim.SGD(p, lr=0.1, weight_decay=-1e-3), "weight_decay must be a number >= 0"),
    (lambda p: optim.Adam(p, lr=float("nan")), "Adam: lr must be a number >= 0, got nan"),
    (lambda p: optim.Adam(p, betas=(0.9, 1.0)), "Adam: betas[1] must be in [0, 1), got 1.0"),
    (lambda p: optim.Adam(p, betas=(-0.1, 0.9)), "Adam: betas[0] must be in [0, 1), got -0.1"),
    (lambda p: optim.AdamW(p, betas=0.9), "AdamW: betas must be a pair (beta1, beta2), got 0.9"),
    (lambda p: optim.AdamW(p, eps=-1.0), "AdamW: eps must be a number >= 0, got -1.0"),
    (lambda p: optim.SGD([{"params": p, "lr": -1.0}], lr=0.1), "SGD: lr must be a number >= 0"),
])
def test_bad_hyperparameters_raise_value_error_naming_argument_expected_and_given(make, fragment):
    with pytest.raises(ValueError) as info:
        make([param([1.0])])
    assert fragment in str(info.value)


def test_bad_parameter_lists():
    p = param([1.0])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="single Tensor"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="more than one param group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(TypeError, match="floating-point"):
        optim.SGD([minitx.tensor(np.arange(3))], lr=0.1)
    with pytest.raises(TypeError, match="only optimize Tensors"):
        optim.SGD([np.zeros(3)], lr=0.1)


@pytest.mark.parametrize("opt_cls, kwargs", [
    (optim.Adam, dict(lr=0.01, amsgrad=True)), (optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_optimizer_state_dict_resumes_identically(opt_cls, kwargs):
    a = param(THETA0)
    opt = opt_cls([a], **kwargs)
    for g in GRADS[:3]:
        a.grad = minitx.tensor(g)
        opt.step()
    saved = opt.state_dict()
    assert all(type(v) is np.ndarray for v in saved["state"][0].values() if hasattr(v, "shape"))
    b = param(a.numpy().copy())
    resumed = opt_cls([b], lr=123.0)                              # hyperparameters restored too
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == kwargs["lr"]
    for g in GRADS[3:]:
        a.grad = minitx.tensor(g)
        b.grad = minitx.tensor(g)
        opt.step()
        resumed.step()
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_training_a_small_model_reduces_the_loss():
    minitx.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    x = minitx.tensor(np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32))
    y = (x * x).sum(axis=-1, keepdims=True)
    opt = optim.AdamW(model.parameters(), lr=0.03)

    def loss_fn():
        r = model(x) - y
        return (r * r).mean()

    first = loss_fn().item()
    for _ in range(60):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    assert loss_fn().item() < 0.3 * first


# ---- against torch.optim ----------------------------------------------------------------------

def _problem():
    rng = np.random.default_rng(1)
    return {k: rng.standard_normal(s) for k, s in
            dict(W=(3, 4), b=(3,), unused=(2,), x=(5, 4), y=(5, 3)).items()}


def _loss(W, b, x, y):
    r = (x @ W.T + b).tanh() - y
    return (r * r).mean() + 0.01 * (W * W * W * W).sum()


TORCH_CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.2, weight_decay=1e-3)),
    ("Adam", dict(lr=0.05)),
    ("Adam", dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ("Adam", dict(lr=0.05, amsgrad=True)),
    ("AdamW", dict(lr=0.05)),
    ("AdamW", dict(lr=0.05, weight_decay=0.3, amsgrad=True)),
]


@pytest.mark.parametrize("name, kwargs", TORCH_CASES)
def test_matches_torch_optim_over_several_steps(name, kwargs):
    torch = need("torch")
    data = _problem()

    def run(lib, make_param, wrap, opt_cls):
        W, b, unused = (make_param(data[k]) for k in ("W", "b", "unused"))
        x, y = wrap(data["x"]), wrap(data["y"])
        # two groups: W with its own lr, b (and an unused parameter that never gets a grad)
        opt = opt_cls([{"params": [W], "lr": kwargs["lr"] / 2}, {"params": [b, unused]}],
                      **kwargs)
        for _ in range(6):
            opt.zero_grad()
            _loss(W, b, x, y).backward()
            opt.step()
        return [t.detach().numpy() if lib == "torch" else t.numpy() for t in (W, b, unused)]

    ours = run("minitx", param, minitx.tensor, getattr(optim, name))
    theirs = run("torch", lambda a: torch.tensor(a, requires_grad=True), torch.tensor,
                 getattr(torch.optim, name))
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(ours[2], data["unused"])


# ---- gradient clipping ------------------------------------------------------------------------

def _with_grads(*grads):
    params = []
    for g in grads:
        p = param(np.zeros_like(g))
        p.grad = minitx.tensor(np.array(g, dtype=np.float64))  # a copy: clipping is in place
        params.append(p)
    return params


def test_clip_grad_norm_scales_by_max_norm_over_total():
    a, b = _with_grads(np.array([3.0, 4.0]), np.array([12.0]))   # joint 2-norm √(9+16+144) = 13
    total = optim.clip_grad_norm_([a, b], max_norm=6.5)
    assert total == pytest.approx(13.0)
    coef = 6.5 / (13.0 + 1e-6)
    np.testing.assert_allclose(a.grad.numpy(), [3 * coef, 4 * coef])
    np.testing.assert_allclose(b.grad.numpy(), [12 * coef])
    # already under the limit: untouched (the coefficient is clamped to 1)
    c, = _with_grads(np.array([0.3, 0.4]))
    assert optim.clip_grad_norm_(c, 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(c.grad.numpy(), [0.3, 0.4])
    # ∞-norm: the largest |element| over all grads
    d, e = _with_grads(np.array([1.0, -7.0]), np.array([2.0]))
    assert optim.clip_grad_norm_([d, e], 3.5, norm_type=float("inf")) == 7.0
    coef = 3.5 / (7.0 + 1e-6)                                     # max_norm / (total + 1e-6)
    np.testing.assert_allclose(d.grad.numpy(), [1.0 * coef, -7.0 * coef], rtol=1e-12)


def test_clip_grad_norm_edge_cases():
    p = param([1.0])
    assert optim.clip_grad_norm_([p], 1.0) == 0.0                 # no gradients at all
    bad, = _with_grads(np.array([float("nan"), 1.0]))
    with pytest.raises(RuntimeError, match="error_if_nonfinite"):
        optim.clip_grad_norm_([bad], 1.0, error_if_nonfinite=True)
    assert np.isnan(optim.clip_grad_norm_([bad], 1.0))
    assert np.all(np.isnan(bad.grad.numpy()))                     # NaN spreads, as in torch
    with pytest.raises(ValueError, match="max_norm must be a number >= 0"):
        optim.clip_grad_norm_([p], -1.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8), st.floats(1e-3, 1e3),
       st.sampled_from([1.0, 2.0, float("inf")]))
def test_clip_grad_norm_property_never_exceeds_max_and_keeps_direction(values, max_norm, order):
    g = np.array(values)
    p, = _with_grads(g)
    total = optim.clip_grad_norm_([p], max_norm, norm_type=order)
    clipped = p.grad.numpy()
    assert total == pytest.approx(np.linalg.norm(g, ord=order), rel=1e-12, abs=1e-300)
    assert np.linalg.norm(clipped, ord=order) <= max_norm * (1 + 1e-12) or total <= max_norm
    scale = min(1.0, max_norm / (total + 1e-6))
    np.testing.assert_allclose(clipped, g * scale, rtol=1e-12, atol=0)   # same direction


def test_clip_grad_value_clamps_elementwise():
    a, = _with_grads(np.array([-3.0, 0.5, 2.0]))
    optim.clip_grad_value_([a], 1.0)
    np.testing.assert_array_equal(a.grad.numpy(), [-1.0, 0.5, 1.0])


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_clip_grad_norm_matches_torch(norm_type):
    torch = need("torch")
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(s) * 3 for s in [(4, 3), (5,), (2, 2, 2)]]
    ours = _with_grads(*grads)
    theirs = []
    for g in grads:
        t = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
        t.grad = torch.tensor(g)
        theirs.append(t)
    total = optim.clip_grad_norm_(ours, 2.0, norm_type=norm_type)
    total_torch = torch.nn.utils.clip_grad_norm_(theirs, 2.0, norm_type=norm_type)
    assert total == pytest.approx(total_torch.item(), rel=1e-12)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12)


# ---- schedules --------------------------------------------------------------------------------

def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.step()
    return out


def _sgd(lr=0.1, groups=1):
    return optim.SGD([{"params": [param([0.0])]} for _ in range(groups)], lr=lr)


def test_warmup_cosine_follows_its_formula():
    base, w, T, floor = 0.1, 5, 20, 0.01
    got = _lrs(optim.warmup_cosine(_sgd(base), warmup_steps=w, total_steps=T, min_lr=floor), 25)
    for s, lr in enumerate(got):
        if s < w:
            expected = base * s / w                                    # linear warm-up from 0
        elif s <= T:
            expected = floor + (base - floor) * (1 + math.cos(math.pi * (s - w) / (T - w))) / 2
        else:
            expected = floor
        assert lr == pytest.approx(expected, rel=1e-12, abs=1e-15), s
    assert max(got) == pytest.approx(base) and got[w] == pytest.approx(base)
    assert got[T] == pytest.approx(floor)


def test_inverse_sqrt_warmup_is_the_transformer_schedule():
    d, w, factor = 512, 40, 2.0
    sched = optim.inverse_sqrt_warmup(_sgd(), d_model=d, warmup_steps=w, factor=factor)
    got = _lrs(sched, 200)
    for s, lr in enumerate(got):
        n = s + 1                                                     # the paper's step_num ≥ 1
        assert lr == pytest.approx(factor * d ** -0.5 * min(n ** -0.5, n * w ** -1.5), rel=1e-12)
    peak = int(np.argmax(got))
    assert peak == w - 1 and got[peak] == pytest.approx(factor / math.sqrt(d * w))
    assert all(x < y for x, y in zip(got[:peak], got[1:peak + 1]))   # rises linearly ...
    assert all(x > y for x, y in zip(got[peak:-1], got[peak + 1:]))  # ... then decays as 1/√n


def test_scheduler_sets_the_lr_the_optimizer_uses():
    p = param([0.0])
    opt = optim.SGD([p], lr=1.0)
    sched = optim.LambdaLR(opt, lambda s: 0.5 ** s)
    for _ in range(3):                       # lrs 1, 0.5, 0.25 with grad 1: θ = −1.75
        p.grad = minitx.tensor(np.array([1.0]))
        opt.step()
        sched.step()
    assert p.numpy()[0] == pytest.approx(-1.75)
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0] == 0.125


def test_scheduler_state_dict_resumes():
    a = optim.warmup_cosine(_sgd(), 3, 10)
    _lrs(a, 4)
    b = optim.warmup_cosine(_sgd(), 3, 10)
    b.load_state_dict(a.state_dict())
    assert b.get_last_lr() == a.get_last_lr() and b.last_epoch == 4
    assert _lrs(a, 5) == _lrs(b, 5)


@pytest.mark.parametrize("make, fragment", [
    (lambda o: optim.warmup_cosine(o, 10, 10), "total_steps must be an int >= 11, got 10"),
    (lambda o: optim.warmup_cosine(o, -1, 10), "warmup_steps must be an int >= 0, got -1"),
    (lambda o: optim.warmup_cosine(o, 1, 10, min_lr=-1.0), "min_lr must be a number >= 0"),
    (lambda o: optim.inverse_sqrt_warmup(o, 512, 0), "warmup_steps must be an int >= 1, got 0"),
    (lambda o: optim.inverse_sqrt_warmup(o, 0, 10), "d_model must be an int >= 1, got 0"),
    (lambda o: optim.LambdaLR(o, [lambda s: 1.0] * 2), "one per param group"),
])
def test_schedule_argument_errors(make, fragment):
    with pytest.raises(ValueError) as info:
        make(_sgd())
    assert fragment in str(info.value)
    with pytest.raises(TypeError, match="Optimizer"):
        optim.LambdaLR(object(), lambda s: 1.0)


def test_schedules_match_torch_lambda_lr():
    torch = need("torch")

    def torch_lrs(lr_lambdas, base_lrs, steps):
        opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr}
                               for lr in base_lrs])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambdas)
        out = []
        for _ in range(steps):
            out.append(sched.get_last_lr())
            opt.step()
            sched.step()
        return out

    def our_lrs(sched, steps):
        out = []
        for _ in range(steps):
            out.append(sched.get_last_lr())
            sched.step()
        return out

    # LambdaLR itself, two groups with their own lambdas
    fns = [lambda s: 0.9 ** s, lambda s: 1 / (1 + s)]
    ours = our_lrs(optim.LambdaLR(optim.SGD([{"params": [param([0.0])], "lr": 0.1},
                                             {"params": [param([0.0])], "lr": 0.3}], lr=1.0),
                                  fns), 12)
    np.testing.assert_allclose(ours, torch_lrs(fns, [0.1, 0.3], 12), rtol=1e-12)
    # warm-up + cosine (min_lr = 0) as the familiar multiplicative lambda
    w, T = 4, 15
    cosine = lambda s: s / w if s < w else 0.5 * (1 + math.cos(math.pi * min(s - w, T - w) / (T - w)))  # noqa: E731
    np.testing.assert_allclose(our_lrs(optim.warmup_cosine(_sgd(0.2, groups=2), w, T), 20),
                               torch_lrs(cosine, [0.2, 0.2], 20), rtol=1e-12, atol=1e-15)
    # the Transformer schedule: LambdaLR with base lr 1 (it ignores the optimizer's lr)
    noam = lambda s: 64 ** -0.5 * min((s + 1) ** -0.5, (s + 1) * 10 ** -1.5)  # noqa: E731
    np.testing.assert_allclose(our_lrs(optim.inverse_sqrt_warmup(_sgd(0.5), 64, 10), 30),
                               torch_lrs(noam, [1.0], 30), rtol=1e-12)


@pytest.mark.skipif(not minitx.gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_adam_step_on_cuda_equals_cpu():
    grads = GRADS * 0.5
    cpu = run_with_fixed_grads(optim.Adam, THETA0, grads, lr=0.01, weight_decay=0.1)
    p = param(THETA0)
    p.data = minitx.backend.to_device(p.data, "cuda")
    opt = optim.Adam([p], lr=0.01, weight_decay=0.1)
    for g in grads:
        p.grad = minitx.tensor(g).to("cuda")
        opt.step()
    assert p.device == "cuda"
    np.testing.assert_allclose(p.numpy(), cpu, rtol=1e-12)
