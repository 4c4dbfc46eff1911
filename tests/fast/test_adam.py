"""The fast twin of Adam/AdamW's update (``minitx/fast/optim.py``: a whole param group at once,
its moments in flat buffers whose views are the states' arrays) against the reference
(``minitx/optim/optimizers.py``: ``Adam._update`` on each parameter), switching between the two
in the middle of training, and the switch itself."""
import contextlib
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitx
import minitx.nn as nn
from minitx import configuration, optim
from minitx.fast import optim as fast_optim
from support import to_host, need
from twin_spy import spy_on


def param(values):
    return nn.Parameter(np.array(values, dtype=np.float64))


def _states(opt, params):
    return [{k: to_host(v) if hasattr(v, "shape") else v for k, v in opt.state[p].items()}
            for p in params if p in opt.state]


@contextlib.contextmanager
def _twin_with(**options):
    """The registered twin with ``options`` (its threshold) while the block runs."""
    real = configuration.twins()["adam"]
    configuration._TWINS["adam"] = functools.partial(real, **options)
    try:
        yield
    finally:
        configuration._TWINS["adam"] = real


def _train(cls, start, grads, kwargs, modes, skip=False, reload=False, groups=1):
    """Parameters and states after one step per gradient set, step i in form ``modes[i]``
    (True: the fast layer on)."""
    params = [param(a.copy()) for a in start]
    split = params if groups == 1 else [{"params": params[:2]},
                                          {"params": params[2:], "lr": 0.01}]
    opt = cls(split, **kwargs)
    for step, (gs, fast) in enumerate(zip(grads, modes)):
        if reload and step == 3:
            saved = opt.state_dict()
            opt = cls(split, **kwargs)
            opt.load_state_dict(saved)
        for i, (p, g) in enumerate(zip(params, gs)):
            p.grad = None if skip and step == 1 and i == 0 else minitx.tensor(g)
        with minitx.using_config(fast=fast):
            opt.step()
    return [p.numpy() for p in params], _states(opt, params)


def _assert_same(a, b):
    (pa, sa), (pb, sb) = a, b
    for x, y in zip(pa, pb):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert len(sa) == len(sb)
    for x, y in zip(sa, sb):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


# NumPy and CuPy give a view of a view the owner as its .base (the twin finds its buffers that
# way); the strict CuPy stand-in of the tests wraps each .base anew, so there the twin builds
# its buffers at every step (the same numbers) and the checks of identity are for NumPy alone.
OWNER_IS_BASE = minitx.get_backend() == "numpy"

SHAPES = st.lists(st.sampled_from([(), (1,), (3,), (2, 5), (4, 1, 3), (0,), (7, 7)]),
                  min_size=2, max_size=5)


@settings(max_examples=60, deadline=None)
@given(shapes=SHAPES, decoupled=st.booleans(), weight_decay=st.sampled_from([0.0, 0.1]),
       dtype=st.sampled_from(["float32", "float64"]), skip=st.booleans(),
       reload=st.booleans(), modes=st.lists(st.booleans(), min_size=6, max_size=6),
       small=st.sampled_from([0, 1, 3, 10, 49, fast_optim.SMALL]),
       seed=st.integers(0, 2 ** 16))
def test_any_mix_of_the_two_forms_gives_the_reference_bit_for_bit(
        shapes, decoupled, weight_decay, dtype, skip, reload, modes, small, seed):
    """Six steps, each in the form ``modes`` says (all fast, all reference, or switching at
    any step), against the reference alone: the same parameters and states bit for bit. Also
    with a parameter left without a gradient at one step (``skip``: the step counts then
    differ and the twin must decline), with float32 gradients for the float64 parameters (the
    twin declines mixed dtypes), with the state saved and loaded into a new optimizer
    half-way (``reload``), and with the twin's size threshold at, around and between the
    parameters' sizes (0, 1, 3, 10, 49 values: some parameters taken, the others left)."""
    rng = np.random.default_rng(seed)
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(6)]
    cls = optim.AdamW if decoupled else optim.Adam
    kwargs = dict(lr=0.05, betas=(0.8, 0.95), weight_decay=weight_decay)
    want = _train(cls, start, grads, kwargs, [False] * 6, skip, reload)
    with _twin_with(small=small):
        _assert_same(_train(cls, start, grads, kwargs, modes, skip, reload), want)
        _assert_same(_train(cls, start, grads, kwargs, [True] * 6, skip, reload), want)


@pytest.mark.parametrize("modes", [[True] * 4, [False] * 4, [True, False] * 2,
                                   [False, True] * 2])
def test_two_groups_keep_their_own_buffers(modes):
    """Two param groups of two parameters each, in any order of the forms: the states' arrays
    stay the same objects from step to step (the reference writes into them; the twin keeps
    its buffers, whose views they are) and the result is the reference's bit for bit."""
    rng = np.random.default_rng(3)
    shapes = ((3,), (2, 2), (4,), (1,))
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(4)]
    want = _train(optim.AdamW, start, grads, dict(lr=0.1), [False] * 4, groups=2)
    params = [param(a.copy()) for a in start]
    opt = optim.AdamW([{"params": params[:2]}, {"params": params[2:], "lr": 0.01}], lr=0.1)
    for step, (gs, fast) in enumerate(zip(grads, modes)):
        for p, g in zip(params, gs):
            p.grad = minitx.tensor(g)
        with minitx.using_config(fast=fast):
            opt.step()
        if step == 1:
            kept = [(opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]) for p in params]
    if OWNER_IS_BASE:
        assert all(opt.state[p]["exp_avg"] is m and opt.state[p]["exp_avg_sq"] is v
                   for p, (m, v) in zip(params, kept))
    if modes[0] and OWNER_IS_BASE:         # built by the twin: one buffer per group and moment
        bases = {id(opt.state[p]["exp_avg"].base) for p in params}
        assert len(bases) == 2
    _assert_same(([p.numpy() for p in params], _states(opt, params)), want)


def test_state_arrays_are_views_of_the_group_buffers_and_stay_in_step():
    """After a fast step, ``state[p]['exp_avg']`` has the parameter's shape and is the moment
    the next step reads: writing into it (as a user or the reference does) is seen, and
    replacing it makes the twin rebuild its buffers from the new arrays."""
    a, b = param(np.ones((2, 3))), param(np.ones(4))
    opt = optim.Adam([a, b], lr=0.1)
    for p in (a, b):
        p.grad = minitx.tensor(np.full(p.shape, 2.0))
    with minitx.using_config(fast=True):
        opt.step()
        m = opt.state[a]["exp_avg"]
        assert m.shape == (2, 3)
        assert m.base is opt.state[b]["exp_avg"].base or not OWNER_IS_BASE
        np.testing.assert_allclose(to_host(m), 0.2)            # (1 − 0.9)·2
        opt.state[b]["exp_avg"] = opt.state[b]["exp_avg"] * 0   # replaced (by a new array of 0)
        opt.state[a]["exp_avg"][...] = 1.0                     # written into: seen
        opt.step()                                             # (the buffers are rebuilt)
    np.testing.assert_allclose(to_host(opt.state[a]["exp_avg"]), 0.9 * 1.0 + 0.2)
    np.testing.assert_allclose(to_host(opt.state[b]["exp_avg"]), 0.2)
    if OWNER_IS_BASE:
        assert opt.state[a]["exp_avg"].base is opt.state[b]["exp_avg"].base
        assert opt.state[a]["exp_avg"].base is not m.base


def _group(shapes, dtype="float64", step=None):
    rng = np.random.default_rng(0)
    datas = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
    states = [{} if step is None else {"step": step, "exp_avg": np.zeros(s, dtype),
                                       "exp_avg_sq": np.zeros(s, dtype)} for s in shapes]
    return datas, grads, states


HYPER = dict(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False)


@pytest.mark.parametrize("case", ["one parameter", "amsgrad", "mixed dtypes", "mixed steps"])
def test_the_twin_declines_groups_it_does_not_take_and_changes_nothing(case):
    datas, grads, states = _group([(3,), (2, 2)], step=2)
    amsgrad = case == "amsgrad"
    if case == "one parameter":
        datas, grads, states = datas[:1], grads[:1], states[:1]
    elif case == "mixed dtypes":
        grads[1] = grads[1].astype(np.float32)
    elif case == "mixed steps":
        states[1]["step"] = 1
    before = [d.copy() for d in datas], [dict(s) for s in states]
    assert fast_optim.adam(datas, grads, states, amsgrad=amsgrad, **HYPER) == \
        list(range(len(datas)))
    for d, d0 in zip(datas, before[0]):
        np.testing.assert_array_equal(d, d0)
    assert all(s == s0 for s, s0 in zip(states, before[1]))


def test_the_twin_on_raw_arrays_is_the_papers_update():
    """One step from empty states on raw arrays: m = (1 − β₁)g, v = (1 − β₂)g², and
    θ ← θ − η m̂ / (√v̂ + ε) with m̂ = g, v̂ = g² (the bias corrections of step 1)."""
    datas, grads, states = _group([(3,), (2, 2), ()])
    start = [d.copy() for d in datas]
    assert fast_optim.adam(datas, grads, states, amsgrad=False, **HYPER) == []
    for d, d0, g, s in zip(datas, start, grads, states):
        assert s["step"] == 1 and s["exp_avg"].shape == g.shape
        np.testing.assert_allclose(s["exp_avg"], (1 - 0.9) * g, rtol=1e-15)
        np.testing.assert_allclose(s["exp_avg_sq"], (1 - 0.999) * g * g, rtol=1e-15)
        np.testing.assert_allclose(d, d0 - 0.1 * g / (np.abs(g) + 1e-8), rtol=1e-14)


@pytest.mark.parametrize("small,left", [(0, [0, 1, 2, 3]), (3, [1, 3]), (4, [3]),
                                        (1, [0, 1, 2, 3]), (100, [])])
def test_parameters_above_the_threshold_are_left_to_the_reference(small, left):
    """Sizes 3, 4, 1, 5: the twin takes those of at most ``small`` values when they are two or
    more, returns the others' positions, and leaves their arrays and states untouched."""
    datas, grads, states = _group([(3,), (2, 2), (1,), (5,)])
    start = [d.copy() for d in datas]
    assert fast_optim.adam(datas, grads, states, amsgrad=False, small=small, **HYPER) == left
    for i, (d, d0, s) in enumerate(zip(datas, start, states)):
        assert (s == {}) == (i in left)
        assert np.array_equal(d, d0) == (i in left)
    taken = [i for i in range(4) if i not in left]
    if taken:                                      # one buffer holds the taken ones' moments
        assert len({id(states[i]["exp_avg"].base) for i in taken}) == 1
        assert states[taken[0]]["exp_avg"].base.size == sum(datas[i].size for i in taken)


def test_the_switch_picks_the_twin_or_the_reference(monkeypatch):
    assert configuration.twins()["adam"] is fast_optim.adam
    calls = spy_on(monkeypatch, "adam")
    a, b = param([1.0, 2.0]), param([3.0])
    opt = optim.AdamW([a, b], lr=0.1)
    for fast, expected in ((False, []), (True, ["adam"]), (False, ["adam"])):
        a.grad, b.grad = minitx.tensor(np.ones(2)), minitx.tensor(np.ones(1))
        with minitx.using_config(fast=fast):
            assert (configuration.why_not_fast("adam") is None) == fast
            opt.step()
        assert calls == expected


@pytest.mark.parametrize("name, kwargs", [("Adam", dict(lr=0.05, weight_decay=0.1)),
                                          ("AdamW", dict(lr=0.05, betas=(0.8, 0.95),
                                                         weight_decay=0.3))])
def test_the_twin_matches_torch_optim(name, kwargs, monkeypatch):
    """One group holding W and b, both with gradients, the fast layer on: against torch.optim
    over six steps (float64)."""
    torch = need("torch")
    rng = np.random.default_rng(1)
    data = {k: rng.standard_normal(s) for k, s in
            dict(W=(3, 4), b=(3,), x=(5, 4), y=(5, 3)).items()}

    def loss(W, b, x, y):
        r = (x @ W.T + b).tanh() - y
        return (r * r).mean() + 0.01 * (W * W * W * W).sum()

    def run(make_param, wrap, opt_cls, numpy):
        W, b = (make_param(data[k]) for k in ("W", "b"))
        x, y = wrap(data["x"]), wrap(data["y"])
        opt = opt_cls([W, b], **kwargs)
        for _ in range(6):
            opt.zero_grad()
            loss(W, b, x, y).backward()
            opt.step()
        return [numpy(t) for t in (W, b)]

    calls = spy_on(monkeypatch, "adam")
    with minitx.using_config(fast=True):
        ours = run(param, minitx.tensor, getattr(optim, name), lambda t: t.numpy())
    assert len(calls) == 6
    theirs = run(lambda a: torch.tensor(a, requires_grad=True), torch.tensor,
                 getattr(torch.optim, name), lambda t: t.detach().numpy())
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-12)


# ---- the in-place twin of one large parameter's update ------------------------------------------

@contextlib.contextmanager
def _in_place_only(chunk):
    """The group twin takes no parameter; the in-place twin runs with pieces of ``chunk``."""
    real = configuration.twins()["adam_in_place"]
    configuration._TWINS["adam_in_place"] = functools.partial(real, chunk=chunk)
    try:
        with _twin_with(small=0):
            yield
    finally:
        configuration._TWINS["adam_in_place"] = real


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(st.sampled_from([(), (0,), (1,), (5,), (3, 7), (2, 3, 11)]), min_size=1,
                       max_size=3),
       decoupled=st.booleans(), weight_decay=st.sampled_from([0.0, 0.1]),
       dtype=st.sampled_from(["float32", "float64"]), reload=st.booleans(),
       modes=st.lists(st.booleans(), min_size=6, max_size=6),
       chunk=st.sampled_from([1, 4, 16, fast_optim.CHUNK]), seed=st.integers(0, 2 ** 16))
def test_in_place_update_is_the_reference_bit_for_bit(shapes, decoupled, weight_decay, dtype,
                                                       reload, modes, chunk, seed):
    """Each parameter updated on its own by the in-place twin, in pieces of 1, 4, 16 values or
    the library's size (pieces that cut rows, a last piece that is partial), in any mix with
    the reference from step to step, with the state saved and reloaded half-way: the same
    parameters and states as the reference alone, bit for bit. float32 gradients of float64
    parameters are declined (the reference runs), and give its result too."""
    rng = np.random.default_rng(seed)
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(6)]
    cls = optim.AdamW if decoupled else optim.Adam
    kwargs = dict(lr=0.05, betas=(0.8, 0.95), weight_decay=weight_decay)
    want = _train(cls, start, grads, kwargs, [False] * 6, reload=reload)
    with _in_place_only(chunk):
        _assert_same(_train(cls, start, grads, kwargs, modes, reload=reload), want)
        _assert_same(_train(cls, start, grads, kwargs, [True] * 6, reload=reload), want)


@pytest.mark.parametrize("case", ["amsgrad", "mixed dtypes", "strided", "moment of another "
                                  "dtype"])
def test_in_place_twin_declines_and_changes_nothing(case):
    datas, grads, states = _group([(3, 4)], step=2)
    theta, grad, state = datas[0], grads[0], states[0]
    if case == "mixed dtypes":
        grad = grad.astype(np.float32)
    elif case == "strided":
        theta = np.asfortranarray(theta)
    elif case == "moment of another dtype":
        state["exp_avg"] = state["exp_avg"].astype(np.float32)
    before, saved = theta.copy(), dict(state)
    assert fast_optim.adam_in_place(theta, grad, state, amsgrad=case == "amsgrad",
                                    **HYPER) is False
    np.testing.assert_array_equal(theta, before)
    assert state == saved


def test_a_large_parameter_runs_the_in_place_twin(monkeypatch):
    """With the fast layer on, a parameter above the group twin's threshold goes to the in-place
    twin; with it off, to neither."""
    calls = spy_on(monkeypatch, "adam_in_place")
    big, a, b = param(np.ones(fast_optim.SMALL + 1)), param([1.0, 2.0]), param([3.0])
    opt = optim.AdamW([big, a, b], lr=0.1)         # a and b: the group twin's
    for fast, expected in ((False, []), (True, ["adam_in_place"])):
        for p in (big, a, b):
            p.grad = minitx.tensor(np.ones(p.shape))
        with minitx.using_config(fast=fast):
            opt.step()
        assert calls == expected
