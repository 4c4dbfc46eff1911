"""The backward engine: deep chains, shared inputs, accumulation, retain_graph, no_grad,
freeing the graph, the shape/dtype check, checkpointing and seeded randomness."""
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitx
import minitx.functional as F
from minitx import Function
from minitx.autograd import Context, topological_order
from support import REPO, tensor, to_host


def test_100k_op_chain_backprops_without_recursion_error():
    assert sys.getrecursionlimit() < 100_000      # a recursive engine could not do this
    x = tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(50_000):                        # 100,000 ops: mul and add alternate
        y = y * 1.0
        y = y + 0.0
    y.sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), [1.0])


def test_diamond_graph_sums_gradients(rng):
    a = rng.standard_normal(5)
    x = tensor(a, requires_grad=True)
    u = x * 3.0                        # x feeds two branches that meet again
    v = F.exp(x)
    (u * v).sum().backward()           # d/dx (3x eˣ) = 3eˣ + 3x eˣ
    np.testing.assert_allclose(to_host(x.grad), 3 * np.exp(a) + 3 * a * np.exp(a))

    y = tensor(a, requires_grad=True)
    (y * y + y).sum().backward()       # x used three times
    np.testing.assert_allclose(to_host(y.grad), 2 * a + 1)


def test_gradients_accumulate_across_backward_calls(rng):
    a = rng.standard_normal(4)
    x = tensor(a, requires_grad=True)
    (x * x).sum().backward()
    (x * 5.0).sum().backward()
    np.testing.assert_allclose(to_host(x.grad), 2 * a + 5)
    x.zero_grad()
    assert x.grad is None


def test_retain_graph_allows_second_backward(rng):
    a = rng.standard_normal(3)
    x = tensor(a, requires_grad=True)
    y = (F.exp(x) * x).sum()
    y.backward(retain_graph=True)
    first = to_host(x.grad).copy()
    y.backward()
    np.testing.assert_allclose(to_host(x.grad), 2 * first)


def test_second_backward_without_retain_graph_raises(rng):
    x = tensor(rng.standard_normal(3), requires_grad=True)
    y = (F.tanh(x) * 2.0).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph"):
        y.backward()


def test_no_grad_records_nothing(rng):
    x = tensor(rng.standard_normal(3), requires_grad=True)
    with minitx.no_grad():
        assert not minitx.is_grad_enabled()
        y = F.softmax(x * 2.0 + 1.0)
        with minitx.enable_grad():
            z = x * 2.0
    assert minitx.is_grad_enabled()
    assert not y.requires_grad and y._ctx is None
    assert z.requires_grad and z._ctx is not None
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_no_inputs_requiring_grad_records_nothing(rng):
    y = minitx.tensor(rng.standard_normal(3)) * 2.0
    assert not y.requires_grad and y._ctx is None


def test_graph_is_freed_after_backward(rng):
    x = tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = tensor(rng.standard_normal((4, 2)), requires_grad=True)
    out = F.softmax(F.tanh(x @ w), -1).sum()
    nodes = topological_order(out._ctx)
    assert len(nodes) == 4
    assert any(n.saved_tensors for n in nodes)     # something was saved for backward
    out.backward()
    for n in nodes:
        assert n.freed and n.saved_tensors is None
        assert not n.__dict__                      # attributes set by forward dropped too


def test_backward_lets_go_of_each_node_through_its_free_method(rng, monkeypatch):
    """``Context.free`` is the one place a node drops what it saved: the engine calls it once
    per node after the node's backward, and not at all under ``retain_graph=True``."""
    freed = []
    real_free = Context.free

    def spy(ctx):
        freed.append(ctx)
        real_free(ctx)

    monkeypatch.setattr(Context, "free", spy)
    x = tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = tensor(rng.standard_normal((4, 2)), requires_grad=True)
    out = F.softmax(F.tanh(x @ w), -1).sum()
    nodes = topological_order(out._ctx)
    out.backward(retain_graph=True)
    assert freed == [] and not any(n.freed for n in nodes)
    out.backward()
    assert sorted(map(id, freed)) == sorted(map(id, nodes))        # each node, once
    assert all(n.freed and n.saved_tensors is None for n in nodes)


def test_every_op_makes_its_context_with_Context(rng, monkeypatch):
    """``Function.apply`` builds each node with ``Context()``, so what ``__init__`` sets holds
    for every node (a node that saved nothing has ``saved_tensors == ()``), recorded or not."""
    made = []
    real_init = Context.__init__

    def spy(ctx):
        made.append(ctx)
        real_init(ctx)

    monkeypatch.setattr(Context, "__init__", spy)
    x = tensor(rng.standard_normal(3), requires_grad=True)
    y = F.exp(x + 1.0)                       # Add saves nothing; Exp saves its output
    assert [type(c) for c in made] == [Context, Context]
    assert y._ctx is made[1] and y._ctx.parents[0]._ctx is made[0]
    assert made[0].saved_tensors == () and len(made[1].saved_tensors) == 1
    with minitx.no_grad():
        z = F.exp(x)                         # forward still gets a context; none is recorded
    assert len(made) == 3 and z._ctx is None


def test_retain_graph_keeps_saved_arrays(rng):
    x = tensor(rng.standard_normal(3), requires_grad=True)
    out = F.exp(x).sum()
    out.backward(retain_graph=True)
    assert all(not n.freed for n in topological_order(out._ctx))


def test_topological_order_puts_consumers_first(rng):
    x = tensor(rng.standard_normal(2), requires_grad=True)
    a = x * 2.0
    b = a + x
    c = b * a
    order = topological_order(c._ctx)
    position = {n: i for i, n in enumerate(order)}
    assert order[0] is c._ctx
    assert position[b._ctx] < position[a._ctx]


class WrongShape(Function):
    """Deliberately broken: backward returns a gradient of the wrong shape."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad.sum(axis=0)


class WrongDtype(Function):
    """Deliberately broken: backward returns float32 for a float64 input."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return (grad * 2).astype("float32")


def test_engine_shape_check_names_the_function(rng):
    x = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"WrongShape\.backward.*shape.*\(2,\).*\(3, 2\)"):
        WrongShape.apply(x).sum().backward()


class SecondWrong(Function):
    """Deliberately broken: the gradient for its second input has the first one's shape."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a)
        return a.sum() + b.sum()

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad + 0 * a, grad + 0 * a


def test_engine_shape_check_names_the_input_by_its_position(rng):
    """The engine finds the input's position only for the message: the second of two
    inputs is called input 1."""
    a = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    b = tensor(rng.standard_normal(4), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"SecondWrong\.backward .* for input 1, "
                                           r"expected \(4,\)"):
        SecondWrong.apply(a, b).backward()


class IntGrad(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return (grad * 2).astype("int64")


def test_engine_casts_a_float_gradient_to_its_inputs_dtype(rng):
    """The dtype rule: a float32 gradient for a float64 input arrives as float64, exactly the
    float32 values (here 2.0), cast in the engine."""
    x = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    WrongDtype.apply(x).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(to_host(x.grad), np.full((3, 2), 2.0))


def test_engine_still_refuses_a_non_float_gradient_and_names_the_function(rng):
    x = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"IntGrad\.backward.*dtype int64.*float64"):
        IntGrad.apply(x).sum().backward()


def test_backward_grad_argument_is_checked(rng):
    x = tensor(rng.standard_normal((3, 2)), requires_grad=True)
    with pytest.raises(ValueError, match="shape"):
        (x * 2).backward(minitx.tensor(np.ones((2, 3))))


def test_backward_on_a_leaf():
    x = tensor(np.array([2.0]), requires_grad=True)
    x.backward()
    np.testing.assert_array_equal(to_host(x.grad), [1.0])


# ---- checkpoint ---------------------------------------------------------------------------

def saved_footprint(out):
    """(number of arrays, bytes) held in ``saved_tensors`` by the graph behind ``out``."""
    count = nbytes = 0
    for ctx in topological_order(out._ctx):
        for a in ctx.saved_tensors or ():
            if hasattr(a, "nbytes"):
                count += 1
                nbytes += a.nbytes
    return count, nbytes


def make_block(rng, p_drop=0.0):
    w1 = tensor(rng.standard_normal((16, 32)) * 0.3, requires_grad=True)
    w2 = tensor(rng.standard_normal((32, 16)) * 0.3, requires_grad=True)

    def block(h):                      # closes over the parameters w1, w2
        z = F.gelu(h @ w1)
        if p_drop:
            z = F.dropout(z, p_drop)
        z = F.tanh(z @ w2)
        return F.layer_norm(z + h, 16)
    return block, (w1, w2)


@pytest.mark.parametrize("p_drop", [0.0, 0.3])
def test_checkpoint_gives_identical_gradients(p_drop, rng):
    block, params = make_block(rng, p_drop)
    a = rng.standard_normal((8, 16))

    def run(use_checkpoint):
        minitx.manual_seed(7)
        x = tensor(a, requires_grad=True)
        for p in params:
            p.grad = None
        h = x
        for _ in range(3):
            h = minitx.checkpoint(block, h) if use_checkpoint else block(h)
        loss = (h * h).sum()
        loss.backward()
        return to_host(loss), to_host(x.grad), [to_host(p.grad) for p in params]

    loss_d, gx_d, gp_d = run(False)
    loss_c, gx_c, gp_c = run(True)
    np.testing.assert_array_equal(loss_c, loss_d)
    np.testing.assert_allclose(gx_c, gx_d, rtol=1e-12, atol=1e-14)
    for a_, b_ in zip(gp_c, gp_d):
        np.testing.assert_allclose(a_, b_, rtol=1e-12, atol=1e-14)


def test_checkpoint_restores_rng_for_dropout_and_leaves_stream_untouched(rng):
    a = rng.standard_normal((4, 50))
    minitx.manual_seed(3)
    x = tensor(a, requires_grad=True)
    y = minitx.checkpoint(lambda t: F.dropout(t, 0.5) * 1.0, x)
    after_forward = minitx.backend.rng().bit_generator.state
    y.sum().backward()
    assert minitx.backend.rng().bit_generator.state == after_forward
    kept = to_host(y) != 0                        # the recomputed mask equals the forward mask
    np.testing.assert_allclose(to_host(x.grad), np.where(kept, 2.0, 0.0))


def test_checkpoint_grads_reach_parameters_when_input_needs_none(rng):
    block, (w1, w2) = make_block(rng)
    x = minitx.tensor(rng.standard_normal((4, 16)))   # no requires_grad
    block(x).sum().backward()                          # reference: the same graph, no checkpoint
    direct = [to_host(w1.grad).copy(), to_host(w2.grad).copy()]
    w1.grad = w2.grad = None
    minitx.checkpoint(block, x).sum().backward()
    assert w1.grad is not None and w2.grad is not None
    for got, ref in zip((to_host(w1.grad), to_host(w2.grad)), direct):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


def test_checkpoint_saves_less_memory(rng):
    block, _ = make_block(rng)
    a = rng.standard_normal((64, 16))
    direct = block(tensor(a, requires_grad=True))
    ckpt = minitx.checkpoint(block, tensor(a, requires_grad=True))
    n_direct, bytes_direct = saved_footprint(direct)
    n_ckpt, bytes_ckpt = saved_footprint(ckpt)
    assert n_ckpt == 1 and bytes_ckpt == a.nbytes             # only the block's input
    assert n_direct > 5 and bytes_direct > 4 * bytes_ckpt


# ---- seeding -----------------------------------------------------------------------------

def test_manual_seed_reproducibility(rng):
    x = minitx.tensor(np.ones((6, 7)))
    minitx.manual_seed(11)
    first = to_host(F.dropout(x, 0.5))
    draw1 = minitx.backend.rng().random(3)
    minitx.manual_seed(11)
    np.testing.assert_array_equal(to_host(F.dropout(x, 0.5)), first)
    np.testing.assert_array_equal(minitx.backend.rng().random(3), draw1)
    minitx.manual_seed(12)
    assert not np.array_equal(to_host(F.dropout(x, 0.5)), first)
    with pytest.raises(ValueError):
        minitx.manual_seed(-1)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="graph_memory.py reads RSS from /proc/self/statm (Linux only)")
def test_graph_memory_benchmark_runs_and_reports_the_graph_let_go(capsys):
    """``benchmarks/graph_memory.py`` on a short chain (2,000 tanh ops on float64 (1000,):
    16 MB saved): it runs, prints its rows, and its minitx tracemalloc row reads the graph as
    built and as gone after backward. Keeps the script from rotting; the engine's memory claim
    itself is pinned by ``test_bad_input``'s long-chain test."""
    import importlib.util
    path = REPO / "benchmarks" / "graph_memory.py"
    spec = importlib.util.spec_from_file_location("graph_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--nodes", "2000", "--size", "1000"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("minitx (tracemalloc)"))
    built, after_backward, deleted = (float(x) for x in row.split()[-3:])
    assert built > 16.0, out                    # 2,000 saved outputs of 8 KB, plus the nodes
    assert after_backward < 1.0 and deleted < 1.0, out
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert "torch (saved tensors)" in out and "max |grad minitx - grad torch|" in out, out
    diff = float(out.split("max |grad minitx - grad torch| = ")[1].split()[0])
    assert diff < 1e-12, out


# ---- leaf gradients: kept without a copy when nobody else holds them, copied otherwise ----

class _PassThrough(Function):
    """y = x₁ + x₂ whose backward returns the incoming gradient itself for both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class _SameNewArray(Function):
    """y = x₁ + x₂ whose backward returns one new array for both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, grad):
        both = grad * 1.0
        return both, both


_GRAPHS = {
    "add": lambda x, y: x + y,
    "one new array for both": lambda x, y: _SameNewArray.apply(x, y),
    "sub": lambda x, y: x - y,
    "pass-through": lambda x, y: _PassThrough.apply(x, y),
    "reshape": lambda x, y: (x + y).reshape(4, 3).reshape(3, 4),
    "views of one gradient": lambda x, y: x.reshape(4, 3) + y.transpose().reshape(4, 3),
    "transpose": lambda x, y: (x - y).transpose().transpose(),
    "scale": lambda x, y: x * 1.0 + y,
    "used twice": lambda x, y: x + x + y,
    "broadcast": lambda x, y: x + y.sum(axis=0),
}


@settings(max_examples=40, deadline=None)
@given(graph=st.sampled_from(sorted(_GRAPHS)), seed=st.integers(0, 2**16))
def test_no_leaf_gradient_shares_memory_with_another_or_with_the_callers_gradient(graph, seed):
    """Writing into one leaf's ``.grad`` in place (as ``clip_grad_norm_`` does) changes no other
    gradient and not the caller's ``grad``; writing into the caller's ``grad`` changes no leaf's.
    The graphs are those where a backward passes its incoming gradient on, or a view of it."""
    rng = np.random.default_rng(seed)
    x = tensor(rng.standard_normal((3, 4)), requires_grad=True)
    y = tensor(rng.standard_normal((3, 4)), requires_grad=True)
    out = _GRAPHS[graph](x, y)
    g = tensor(rng.standard_normal(out.shape))
    out.backward(g)
    g0, gx, gy = (np.array(to_host(t), copy=True) for t in (g, x.grad, y.grad))  # snapshots
    x.grad.data[...] = 0.0
    np.testing.assert_array_equal(to_host(y.grad), gy)
    np.testing.assert_array_equal(to_host(g), g0)
    g.data[...] = 5.0
    np.testing.assert_array_equal(to_host(y.grad), gy)
    assert not np.any(to_host(x.grad)) and np.any(gx)


def test_a_leafs_gradient_of_its_own_backward_is_kept_without_a_copy_and_the_callers_is_copied():
    made = []

    class Double(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2.0

        @staticmethod
        def backward(ctx, grad):
            made.append(grad * 2.0)           # a new array nobody else holds
            return made[-1]

    x = tensor(np.ones(3), requires_grad=True)
    Double.apply(x).sum().backward()
    assert x.grad.data is made[0]
    leaf = tensor(np.ones(3), requires_grad=True)
    g = tensor(np.full(3, 2.0))
    leaf.backward(g)                          # backward on a leaf: the caller's array, copied
    assert leaf.grad.data is not g.data
    g.data[...] = 0.0
    np.testing.assert_array_equal(to_host(leaf.grad), [2.0, 2.0, 2.0])


def test_a_saved_array_returned_as_a_gradient_is_copied_so_a_retained_graph_stays_right():
    class TimesThree(Function):
        @staticmethod
        def forward(ctx, a):
            w = a * 0.0 + 3.0
            ctx.save_for_backward(w)
            return a * w

        @staticmethod
        def backward(ctx, grad):
            (w,) = ctx.saved_tensors
            return w if bool((grad == 1.0).all()) else grad * w   # w itself when grad is 1

    x = tensor(np.ones(4), requires_grad=True)
    y = TimesThree.apply(x).sum()
    y.backward(retain_graph=True)
    x.grad.data[...] = 0.0                    # in place, as an optimizer's clipping would
    y.backward()
    np.testing.assert_array_equal(to_host(x.grad), [3.0] * 4)
