"""Every op in ``minitx.functional`` passes ``minitx.gradcheck`` in float64.

Shapes come from hypothesis: ragged shapes with size-1 axes, and mutually broadcastable
pairs. Values come from a NumPy generator seeded by a hypothesis-drawn integer (cheaper than
drawing every float through hypothesis, and still shrinkable/reproducible).

Central differences with eps = 1e-6 are only valid where the function is smooth on
[x − eps, x + eps]. Ops with kinks (abs, relu at 0; max/min/maximum/minimum/sort at ties;
clip at its bounds; elu's second derivative at 0) therefore get inputs drawn at least 0.1
away from every kink: that is a property of the *test inputs*, not a relaxation of the check.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitx
import minitx.functional as F
from support import tensor, to_host

# ---- strategies and helpers ------------------------------------------------------------------

seeds = st.integers(0, 2**32 - 1)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
shapes_nd = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)
pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


def gen(seed):
    return np.random.default_rng(seed)


# the ops that have a fast twin (minitx/fast/) are tested in both of their forms
both_forms = pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])


def away_from_zero(r, shape, lo=0.1, hi=2.0):
    """Values with |v| in [lo, hi] and a random sign: no kink at 0 within eps."""
    return r.uniform(lo, hi, shape) * r.choice([-1.0, 1.0], shape)


def distinct(r, shape, gap=0.1):
    """Values pairwise at least ``gap`` apart (no ties for max/min/sort)."""
    n = int(np.prod(shape, dtype=int))
    return (r.permutation(n) * gap + r.uniform(-0.02, 0.02, n)).reshape(shape) - n * gap / 2


def check(fn, *arrays):
    """gradcheck ``fn`` on float64 leaves made from ``arrays``."""
    assert minitx.gradcheck(fn, tuple(tensor(a, requires_grad=True) for a in arrays))


@st.composite
def shape_and_axis(draw, min_dims=1, keep_none=True):
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=1, max_side=4))
    options = [st.integers(-len(shape), len(shape) - 1)]
    if keep_none:
        options.append(st.none())
        if len(shape) > 1:
            options.append(st.lists(st.integers(0, len(shape) - 1), min_size=1,
                                    max_size=len(shape), unique=True).map(tuple))
    return shape, draw(st.one_of(*options))


# ---- binary arithmetic with broadcasting ---------------------------------------------------

@given(pairs, seeds)
def test_add_sub_mul(shapes_, seed):
    (sa, sb), _ = shapes_
    r = gen(seed)
    a, b = r.standard_normal(sa), r.standard_normal(sb)
    check(F.add, a, b)
    check(F.sub, a, b)
    check(F.mul, a, b)
    out = F.mul(tensor(a, requires_grad=True), tensor(b, requires_grad=True))
    np.testing.assert_allclose(out.numpy(), a * b)


@given(pairs, seeds)
def test_div(shapes_, seed):
    (sa, sb), _ = shapes_
    r = gen(seed)
    check(F.div, r.standard_normal(sa), away_from_zero(r, sb, 0.5, 2.0))


@given(pairs, seeds)
def test_pow_tensor_exponent(shapes_, seed):
    (sa, sb), _ = shapes_
    r = gen(seed)
    check(F.pow, r.uniform(0.5, 2.0, sa), r.uniform(-2.0, 2.0, sb))   # base > 0: log defined


@given(shapes, seeds, st.sampled_from([2, 3, -1, 0.5, 1.5]))
def test_pow_scalar_exponent(shape, seed, p):
    check(lambda x: F.pow(x, p), gen(seed).uniform(0.5, 2.0, shape))


@given(pairs, seeds)
def test_maximum_minimum(shapes_, seed):
    (sa, sb), _ = shapes_
    r = gen(seed)
    a = r.standard_normal(sa)
    b = r.standard_normal(sb)
    # keep |a − b| ≥ 0.1 everywhere (no ties): move b away where it is too close
    diff = np.broadcast_to(a, np.broadcast_shapes(sa, sb)) - b
    if np.any(np.abs(diff) < 0.1):
        a = a + 0.0
        b = np.broadcast_to(b, diff.shape) + np.where(np.abs(diff) < 0.1, 0.3, 0.0)
    check(F.maximum, a, b)
    check(F.minimum, a, b)


# ---- unary math ------------------------------------------------------------------------------

SMOOTH_UNARY = {
    "neg": F.neg, "exp": F.exp, "tanh": F.tanh, "sigmoid": F.sigmoid, "silu": F.silu,
    "gelu_none": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "erf": F.erf, "softplus": F.softplus,
}


@pytest.mark.parametrize("name", sorted(SMOOTH_UNARY))
@given(shape=shapes, seed=seeds)
def test_smooth_unary(name, shape, seed):
    check(SMOOTH_UNARY[name], gen(seed).standard_normal(shape) * 2)


@given(shapes, seeds)
def test_log_sqrt_positive_inputs(shape, seed):
    x = gen(seed).uniform(0.2, 3.0, shape)
    check(F.log, x)
    check(F.sqrt, x)


KINKED = {"abs": F.abs, "relu": F.relu, "elu": F.elu,
          "elu_alpha": lambda x: F.elu(x, alpha=0.7),
          "leaky_relu": lambda x: F.leaky_relu(x, 0.1)}


@pytest.mark.parametrize("name", sorted(KINKED))
@given(shape=shapes, seed=seeds)
def test_kinked_unary_away_from_zero(name, shape, seed):
    check(KINKED[name], away_from_zero(gen(seed), shape))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
def test_relu_special_values_match_numpy_maximum(dtype):
    """ReLU runs max(x, 0) against an array of zeros (NumPy's fast loop): the values must be
    exactly ``np.maximum(x, 0)``'s, NaN and ±inf included, and the gradient 1 exactly
    where x > 0."""
    values = [-np.inf, -3.5, -0.0, 0.0, 1e-30, 2.0, np.inf, np.nan]
    x = np.array(values if dtype.startswith("float") else [-3, 0, 5], dtype=dtype)
    t = tensor(x, dtype=None, requires_grad=dtype.startswith("float"))
    y = F.relu(t)
    got = to_host(y)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    if t.requires_grad:
        y.backward(np.ones_like(x))
        np.testing.assert_array_equal(to_host(t.grad), (x > 0).astype(dtype))


@given(shapes, seeds)
def test_clip(shape, seed):
    r = gen(seed)
    x = r.uniform(-2, 2, shape)
    x = np.where(np.abs(np.abs(x) - 1.0) < 0.1, x * 0.5, x)      # away from the bounds ±1
    check(lambda v: F.clip(v, -1.0, 1.0), x)
    check(lambda v: F.clip(v, min=-1.0), x)
    check(lambda v: F.clip(v, max=1.0), x)


# ---- reductions ------------------------------------------------------------------------------

@given(shape_and_axis(), st.booleans(), seeds)
def test_sum_mean_var_logsumexp(sa, keepdims, seed):
    shape, axis = sa
    x = gen(seed).standard_normal(shape)
    check(lambda v: F.sum(v, axis=axis, keepdims=keepdims), x)
    check(lambda v: F.mean(v, axis=axis, keepdims=keepdims), x)
    check(lambda v: F.var(v, axis=axis, keepdims=keepdims), x)
    check(lambda v: F.logsumexp(v, axis=axis, keepdims=keepdims), x)
    np.testing.assert_allclose(F.var(tensor(x, requires_grad=True), axis=axis,
                                     keepdims=keepdims).numpy(),
                               np.var(x, axis=axis, keepdims=keepdims), atol=1e-12)


@given(shape_and_axis(), st.booleans(), seeds)
def test_max_min_without_ties(sa, keepdims, seed):
    shape, axis = sa
    x = distinct(gen(seed), shape)
    check(lambda v: F.max(v, axis=axis, keepdims=keepdims), x)
    check(lambda v: F.min(v, axis=axis, keepdims=keepdims), x)


def test_max_ties_share_the_gradient():
    x = tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
    F.max(x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0.5, 0.5, 0])


@given(shape_and_axis(keep_none=False), seeds)
def test_cumsum(sa, seed):
    shape, axis = sa
    x = gen(seed).standard_normal(shape)
    check(lambda v: F.cumsum(v, axis=axis), x)
    np.testing.assert_allclose(F.cumsum(tensor(x, requires_grad=True), axis).numpy(),
                               np.cumsum(x, axis=axis))


# ---- shape ops -------------------------------------------------------------------------------

@given(shapes_nd, seeds, st.data())
def test_reshape_transpose_swapaxes(shape, seed, data):
    x = gen(seed).standard_normal(shape)
    check(lambda v: F.reshape(v, (-1,)), x)
    check(lambda v: F.reshape(v, tuple(reversed(shape))), x)
    perm = data.draw(st.permutations(range(len(shape))))
    check(lambda v: F.transpose(v, tuple(perm)), x)
    check(lambda v: F.transpose(v), x)
    a1 = data.draw(st.integers(-len(shape), len(shape) - 1))
    a2 = data.draw(st.integers(-len(shape), len(shape) - 1))
    check(lambda v: F.swapaxes(v, a1, a2), x)


@given(pairs, seeds)
def test_broadcast_to(shapes_, seed):
    (sa, _), target = shapes_
    check(lambda v: F.broadcast_to(v, target), gen(seed).standard_normal(sa))


@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), seeds, st.data())
def test_squeeze_expand_dims(shape, seed, data):
    x = gen(seed).standard_normal(shape)
    check(F.squeeze, x)
    ones = [i for i, n in enumerate(shape) if n == 1]
    if ones:
        ax = data.draw(st.sampled_from(ones))
        check(lambda v: F.squeeze(v, ax), x)
    ax = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check(lambda v: F.expand_dims(v, ax), x)
    np.testing.assert_array_equal(F.expand_dims(tensor(x, requires_grad=True), ax).numpy(),
                                  np.expand_dims(x, ax))


@given(shape_and_axis(keep_none=False), st.integers(1, 3), seeds)
def test_concatenate_stack(sa, n, seed):
    shape, axis = sa
    r = gen(seed)
    parts = []
    for _ in range(n):                  # ragged along the concatenation axis
        s = list(shape)
        s[axis] = int(r.integers(1, 4))
        parts.append(r.standard_normal(s))
    check(lambda *vs: F.concatenate(vs, axis=axis), *parts)
    same = [r.standard_normal(shape) for _ in range(n)]
    check(lambda *vs: F.stack(vs, axis=axis), *same)
    check(lambda *vs: F.stack(vs, axis=-1), *same)


@given(shape_and_axis(keep_none=False), seeds, st.data())
def test_split(sa, seed, data):
    shape, axis = sa
    x = gen(seed).standard_normal(shape)
    n = shape[axis]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    if cuts and cuts[0]:
        check(lambda v: F.split(v, cuts, axis=axis)[0], x)
    check(lambda v: F.concatenate([p * (i + 1.0) for i, p in
                                   enumerate(F.split(v, cuts, axis=axis))], axis=axis), x)
    sections = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    pieces = F.split(tensor(x, requires_grad=True), sections, axis=axis)
    for got, want in zip(pieces, np.split(x, sections, axis=axis)):
        np.testing.assert_array_equal(got.numpy(), want)


@given(shapes_nd, seeds, st.data())
def test_pad(shape, seed, data):
    widths = [tuple(data.draw(st.integers(0, 2)) for _ in range(2)) for _ in shape]
    x = gen(seed).standard_normal(shape)
    check(lambda v: F.pad(v, widths, value=0.5), x)
    check(lambda v: F.pad(v, 1), x)
    np.testing.assert_array_equal(F.pad(tensor(x, requires_grad=True), widths, 0.5).numpy(),
                                  np.pad(x, widths, constant_values=0.5))


@given(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=4), seeds,
       st.integers(-2, 2))
def test_tril_triu(shape, seed, k):
    x = gen(seed).standard_normal(shape)
    check(lambda v: F.tril(v, k), x)
    check(lambda v: F.triu(v, k), x)
    np.testing.assert_array_equal(F.tril(tensor(x, requires_grad=True), k).numpy(), np.tril(x, k))
    np.testing.assert_array_equal(F.triu(tensor(x, requires_grad=True), k).numpy(), np.triu(x, k))


# ---- indexing --------------------------------------------------------------------------------

@given(shapes_nd, seeds, st.data())
def test_getitem_basic(shape, seed, data):
    x = gen(seed).standard_normal(shape)
    index = tuple(data.draw(st.one_of(st.integers(0, n - 1), st.slices(n))) for n in shape)
    check(lambda v: F.getitem(v, index), x)
    check(lambda v: v[..., None, :1], x)


@given(shapes_nd, seeds, st.data())
def test_getitem_advanced_with_repeats_scatter_adds(shape, seed, data):
    x = gen(seed).standard_normal(shape)
    idx = np.array(data.draw(st.lists(st.integers(0, shape[0] - 1), min_size=1, max_size=6)))
    check(lambda v: v[idx], x)                       # repeated rows accumulate
    mask = gen(seed + 1).random(shape) > 0.5
    check(lambda v: v[mask], x)
    v = tensor(x, requires_grad=True)
    v[idx].sum().backward()
    expected = np.zeros(shape)
    np.add.at(expected, idx, 1.0)
    np.testing.assert_array_equal(v.grad.numpy(), expected)


@given(shape_and_axis(keep_none=False), seeds)
def test_take_along_axis(sa, seed):
    shape, axis = sa
    r = gen(seed)
    ishape = list(shape)
    ishape[axis] = int(r.integers(1, 5))
    idx = r.integers(0, shape[axis], ishape)          # repeats likely
    x = r.standard_normal(shape)
    check(lambda v: F.take_along_axis(v, idx, axis), x)
    np.testing.assert_array_equal(F.take_along_axis(tensor(x, requires_grad=True), idx,
                                                    axis).numpy(),
                                  np.take_along_axis(x, idx, axis))


@given(st.integers(1, 5), st.integers(1, 4), shapes, seeds)
def test_embedding(vocab, dim, ishape, seed):
    r = gen(seed)
    idx = r.integers(0, vocab, ishape)
    w = r.standard_normal((vocab, dim))
    check(lambda v: F.embedding(idx, v), w)
    pad = int(r.integers(0, vocab))
    weight = tensor(w, requires_grad=True)
    out = F.embedding(minitx.tensor(idx), weight, padding_idx=pad)
    out.sum().backward()
    grad = np.zeros((vocab, dim))
    np.add.at(grad, idx.reshape(-1), 1.0)          # a row used n times gets n
    grad[pad] = 0                                  # the padding row gets nothing
    np.testing.assert_array_equal(out.numpy(), w[idx])
    np.testing.assert_array_equal(weight.grad.numpy(), grad)


@given(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3), seeds)
def test_where(shapes_, seed):
    (sc, sa, sb), _ = shapes_
    r = gen(seed)
    cond = r.random(sc) > 0.5
    check(lambda a, b: F.where(cond, a, b), r.standard_normal(sa), r.standard_normal(sb))
    check(lambda a: F.where(cond, a, 0.0), r.standard_normal(sa))


@given(pairs, seeds)
def test_masked_fill(shapes_, seed):
    (sx, sm), out_shape = shapes_
    r = gen(seed)
    x = r.standard_normal(out_shape)                # x has the full shape; the mask broadcasts
    mask = r.random(sm) > 0.5
    check(lambda v: F.masked_fill(v, mask, -3.0), x)
    np.testing.assert_array_equal(F.masked_fill(tensor(x, requires_grad=True), mask, -3.0).numpy(),
                                  np.where(mask, -3.0, x))


# ---- linear algebra --------------------------------------------------------------------------

@st.composite
def matmul_shapes(draw):
    n, k, m = (draw(st.integers(1, 4)) for _ in range(3))
    (ba, bb), _ = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0,
                                                        max_dims=2, max_side=3))
    kind = draw(st.sampled_from(["mm", "vec_left", "vec_right", "vec_vec"]))
    a = (k,) if kind in ("vec_left", "vec_vec") else ba + (n, k)
    b = (k,) if kind in ("vec_right", "vec_vec") else bb + (k, m)
    return a, b


@given(matmul_shapes(), seeds)
def test_matmul_batched_broadcasting_and_1d(ab, seed):
    sa, sb = ab
    r = gen(seed)
    a, b = r.standard_normal(sa), r.standard_normal(sb)
    check(F.matmul, a, b)
    out = F.matmul(tensor(a, requires_grad=True), tensor(b, requires_grad=True))
    np.testing.assert_allclose(out.numpy(), a @ b, atol=1e-12)


def test_matmul_shared_weight_folds_batch():
    r = gen(0)
    check(F.matmul, r.standard_normal((2, 3, 4)), r.standard_normal((4, 5)))
    check(F.matmul, r.standard_normal((2, 3, 4)), r.standard_normal(4))


@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), st.integers(1, 4),
       st.booleans(), seeds)
def test_linear(xshape, out_features, with_bias, seed):
    r = gen(seed)
    x = r.standard_normal(xshape)
    w = r.standard_normal((out_features, xshape[-1]))
    if with_bias:
        check(F.linear, x, w, r.standard_normal(out_features))
    else:
        check(lambda a, b: F.linear(a, b), x, w)


EINSUMS = [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 2), (1, 2, 4, 2)]),
    ("i,i->", [(4,), (4,)]), ("i,j->ij", [(3,), (2,)]), ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]), ("ij,jk", [(2, 3), (3, 2)]), ("...ij,...jk->...ik", [(2, 2, 3), (3, 1)]),
    ("ij,jk,kl->il", [(2, 3), (3, 2), (2, 2)]), ("abc,c->ab", [(2, 1, 3), (3,)]),
    ("ij,kj->i", [(2, 3), (4, 3)]),
]


@pytest.mark.parametrize("spec,shapes_", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum(spec, shapes_):
    r = gen(len(spec))
    arrays = [r.standard_normal(s) for s in shapes_]
    check(lambda *vs: F.einsum(spec, *vs), *arrays)
    out = F.einsum(spec, *[tensor(a, requires_grad=True) for a in arrays])
    np.testing.assert_allclose(out.numpy(), np.einsum(spec, *arrays), atol=1e-12)


# ---- sorting ---------------------------------------------------------------------------------

@given(shape_and_axis(keep_none=False), st.booleans(), seeds, st.data())
def test_sort_and_topk_values(sa, descending, seed, data):
    shape, axis = sa
    x = distinct(gen(seed), shape)                  # no ties: the permutation is locally fixed
    check(lambda v: F.sort(v, axis, descending)[0], x)
    k = data.draw(st.integers(0, shape[axis]))
    if k:
        check(lambda v: F.topk(v, k, axis, largest=descending)[0], x)
    values, idx = F.sort(tensor(x, requires_grad=True), axis, descending)
    expected = -np.sort(-x, axis) if descending else np.sort(x, axis)
    np.testing.assert_array_equal(values.numpy(), expected)
    assert idx.dtype.kind == "i" and not idx.requires_grad


# ---- softmax family, norms, dropout, losses ------------------------------------------------

@given(shape_and_axis(keep_none=False), seeds)
def test_softmax_log_softmax(sa, seed):
    shape, axis = sa
    x = gen(seed).standard_normal(shape) * 3
    check(lambda v: F.softmax(v, axis), x)
    check(lambda v: F.log_softmax(v, axis), x)


@both_forms
@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), st.integers(1, 2),
       st.booleans(), seeds)
def test_layer_norm_rms_norm(fast, shape, n_norm, affine, seed):
    n_norm = min(n_norm, len(shape))
    norm_shape = shape[len(shape) - n_norm:]
    if int(np.prod(norm_shape)) == 1:              # a single element normalises to 0: skip
        norm_shape = shape[-1:]
    if int(np.prod(norm_shape)) == 1:
        return
    r = gen(seed)
    x = r.standard_normal(shape)
    with minitx.using_config(fast=fast):
        if affine:
            w, b = r.standard_normal(norm_shape), r.standard_normal(norm_shape)
            check(lambda v, g, h: F.layer_norm(v, norm_shape, g, h), x, w, b)
            check(lambda v, g: F.rms_norm(v, norm_shape, g), x, w)
        else:
            check(lambda v: F.layer_norm(v, norm_shape), x)
            check(lambda v: F.rms_norm(v, norm_shape), x)


@both_forms
@given(hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=5),
       st.sampled_from(["weight", "bias"]), st.booleans(), seeds)
def test_layer_norm_with_weight_or_bias_alone(fast, shape, which, strided, seed):
    """Only γ or only β, on a large offset and on a strided (non-contiguous) input."""
    r = gen(seed)
    x = r.standard_normal(shape) * 5 + 100
    if strided:
        x = x.swapaxes(0, -1)
    d = x.shape[-1]

    def fn(v, p):
        return F.layer_norm(v, d, p if which == "weight" else None,
                            p if which == "bias" else None)
    with minitx.using_config(fast=fast):
        check(fn, x, r.standard_normal(d))


@both_forms
@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=6), seeds)
def test_layer_norm_in_half_precision_matches_float64(fast, shape, seed):
    """float16 in, float16 out (computed in float32): within float16's rounding of the
    float64 formula, and its gradients too."""
    r = gen(seed)
    x, w, b, g = (r.standard_normal(s).astype(np.float16).astype(np.float64)   # as given
                  for s in (shape, shape[-1:], shape[-1:], shape))
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * rstd
    want = xhat * w + b
    dxhat = g * w                                   # dx = rstd·(dx̂ − mean dx̂ − x̂·mean(dx̂ x̂))
    want_dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                      - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    xt, wt, bt = (minitx.tensor(a.astype(np.float16), requires_grad=True) for a in (x, w, b))
    with minitx.using_config(fast=fast):
        y = F.layer_norm(xt, shape[-1], wt, bt)
        y.backward(g.astype(np.float16))
    assert y.dtype == np.float16 and xt.grad.dtype == np.float16
    # computed in float32 (a few roundings of 2⁻²⁴ of the terms summed: 2⁻¹⁸ of their
    # magnitudes, an entry may be a small difference of large terms), then rounded once to
    # float16 (2⁻¹¹ of the result; 2⁻¹⁰ for a margin)
    terms_y = np.abs(xhat * w) + np.abs(b)
    terms_dx = rstd * (np.abs(dxhat) + np.abs(dxhat.mean(-1, keepdims=True))
                       + np.abs(xhat) * np.abs((dxhat * xhat).mean(-1, keepdims=True)))
    for got, ref, terms in ((y, want, terms_y), (xt.grad, want_dx, terms_dx)):
        err = np.abs(got.numpy().astype(np.float64) - ref)
        assert np.all(err <= 2 ** -10 * np.abs(ref) + 2 ** -18 * terms)


@given(shapes_nd, st.sampled_from([0.1, 0.5, 0.9]), seeds)
def test_dropout_with_fixed_mask(shape, p, seed):
    def fn(v):
        minitx.manual_seed(seed)                    # same mask at every evaluation
        return F.dropout(v, p)
    check(fn, gen(seed).standard_normal(shape))


@st.composite
def ce_cases(draw):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    classes = draw(st.integers(1, 4))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    smoothing = draw(st.sampled_from([0.0, 0.1, 0.5]))
    return lead, classes, reduction, smoothing


@given(ce_cases(), seeds)
def test_cross_entropy(case, seed):
    lead, c, reduction, eps = case
    r = gen(seed)
    logits = r.standard_normal(lead + (c,)) * 2
    target = r.integers(0, c, lead)
    ignore = r.random(lead) < 0.3
    target = np.where(ignore, -100, target)
    if reduction == "mean" and not (target != -100).any():
        target = np.zeros(lead, dtype=np.int64)    # mean over zero rows is NaN (as PyTorch)
    check(lambda z: F.cross_entropy(z, target, label_smoothing=eps, reduction=reduction),
          logits)
    check(lambda z: F.cross_entropy(z, np.where(target == -100, 7, target), ignore_index=7,
                                    label_smoothing=eps, reduction=reduction), logits)


@given(shapes, seeds, st.sampled_from(["mean", "sum", "none"]))
def test_mse_loss(shape, seed, reduction):
    r = gen(seed)
    a, b = r.standard_normal(shape), r.standard_normal(shape)
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), a, b)


def test_softmax_jacobian_gradcheck():
    r = gen(5)
    check(lambda v: F.softmax_jacobian(v), r.standard_normal((2, 3)))
    check(lambda v: F.softmax_jacobian(v, axis=0), r.standard_normal((3, 2)))


# ---- erf accuracy ----------------------------------------------------------------------------

def _erf_grid():
    return np.concatenate([np.linspace(-30, 30, 120_001), np.linspace(-6, 6, 60_001),
                           np.linspace(2.9, 3.1, 2_001),           # the series/fraction seam
                           [0.0, 1e-300, -1e-20, 5e-9, 1e3, -1e5]])


@both_forms
def test_erf_float64_accuracy(fast):
    """float64 always takes the reference (the fast twin is for float32 alone)."""
    import math
    from minitx.ops.elementwise import erf_array
    x = _erf_grid()
    ref = np.array([math.erf(v) for v in x])
    with minitx.using_config(fast=fast):
        got = erf_array(x)
        small = np.abs(x) < 1e-8                                # erf(x) ≈ 2x/√π: relative check
        got_small = erf_array(x[small])
    err = np.abs(got - ref)
    # Measured: max 1.44e-15 (≈ 6.5 ulp of 1.0), at |x| ≈ 2.2–2.9 where the Taylor series
    # multiplies e^(−x²) by a sum of ~40 recurrence-built terms (each product adds an
    # ulp); elsewhere it is at the ulp level. 2e-15 bounds that with a small margin; an
    # error of one float32 ulp (1e-7) or a wrong branch would exceed it by 10⁸.
    assert err.max() <= 2e-15, (err.max(), x[err.argmax()])
    np.testing.assert_allclose(got_small, ref[small], rtol=1e-15, atol=0)
    assert np.all(np.abs(got) <= 1.0)


@both_forms
def test_erf_float32_accuracy(fast):
    """float32: the reference (float64, rounded once) is within half an ulp plus 2e-15; the
    fast twin's fitted polynomials within 1.4e-7 (tests/fast/test_erf.py). 1.5e-7 absolute
    and 2e-7 relative down to 1e-37 hold for both."""
    import math
    from minitx.ops.elementwise import erf_array
    x = np.concatenate([_erf_grid(), np.linspace(0.99, 1.01, 20_001),   # the fast branch seam
                        np.geomspace(1e-37, 1.0, 20_001)]).astype(np.float32)
    with minitx.using_config(fast=fast):
        y = erf_array(x)
        half = erf_array(np.linspace(-3, 3, 7).astype(np.float16))
    assert y.dtype == np.float32 and half.dtype == np.float16
    ref = np.array([math.erf(float(v)) for v in x])
    err = np.abs(y.astype(np.float64) - ref)
    assert err.max() <= 1.5e-7, (err.max(), x[err.argmax()])
    nonzero = ref != 0                       # and relative, all the way down to 1e-37
    assert (err[nonzero] / np.abs(ref[nonzero])).max() <= 2e-7
    if not fast:                             # the reference: correctly rounded but for ties
        ulp = np.spacing(np.abs(y)).astype(np.float64)
        assert np.all(err <= 0.5 * ulp + 2e-15)


@both_forms
@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64),
                  elements=st.floats(-8, 8, width=32, allow_subnormal=False)))
def test_erf_float32_on_any_values(fast, x):
    import math
    from minitx.ops.elementwise import erf_array
    ref = np.array([math.erf(float(v)) for v in x])
    with minitx.using_config(fast=fast):
        y = erf_array(x).astype(np.float64)
    assert np.all(np.abs(y - ref) <= np.maximum(1.5e-7, 2e-7 * np.abs(ref)))


@both_forms
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_erf_special_values(fast, dtype):
    from minitx.ops.elementwise import erf_array
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6.0, -1e4], dtype)   # erf(6) = 1 − 2e-17
    with minitx.using_config(fast=fast):
        y = erf_array(x)
        zero_d = erf_array(np.array(0.5, dtype))                 # 0-d in, 0-d out
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0])
    assert np.signbit(y[1]) and not np.signbit(y[0])            # odd: erf(−0) = −0
    assert zero_d.shape == () and zero_d.dtype == dtype
    assert abs(float(zero_d) - 0.5204998778130465) <= 4 * np.finfo(dtype).eps


@both_forms
def test_gelu_float32_zero_d_forward_and_backward(fast):
    with minitx.using_config(fast=fast):
        x = tensor(0.5, dtype="float32", requires_grad=True)
        y = F.gelu(x)
        y.backward()
    # 0.5·Φ(0.5) and Φ(0.5) + 0.5·φ(0.5), from math.erf and math.exp
    import math
    cdf = 0.5 * (1 + math.erf(0.5 / math.sqrt(2)))
    pdf = math.exp(-0.125) / math.sqrt(2 * math.pi)
    assert y.shape == () and abs(float(to_host(y.data)) - 0.5 * cdf) <= 1e-7
    assert abs(float(to_host(x.grad)) - (cdf + 0.5 * pdf)) <= 2e-7


# ---- the row reductions of softmax and attention --------------------------------------------

@both_forms
@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(0, 4), min_size=0, max_size=3), k=st.integers(1, 40),
       dtype=st.sampled_from(["float32", "float64", "float16"]),
       special=st.sampled_from(["none", "nan", "neg_inf_row", "pos_inf"]),
       strided=st.booleans(), seed=seeds)
def test_row_max_matches_numpy(fast, lead, k, dtype, special, strided, seed):
    """``row_max`` is exactly ``max(axis=-1, keepdims=True)``: NaN rows give NaN, rows of −inf
    give −inf; on the active backend, contiguous and strided, reference and fast twin
    (tests/fast/test_reductions.py compares the two directly)."""
    from minitx.ops._util import row_max
    r = gen(seed)
    x = r.standard_normal(tuple(lead) + (k,)).astype(dtype)
    if x.size and special != "none":
        flat = x.reshape(-1, k)                           # a view: x is contiguous
        if special == "nan":
            flat[0, r.integers(k)] = np.nan
        elif special == "neg_inf_row":
            flat[-1, :] = -np.inf
        else:
            flat[0, r.integers(k)] = np.inf
    dev = tensor(x, dtype=None).data
    if strided:                                           # every other column of a wider array
        wide = tensor(np.zeros(x.shape[:-1] + (2 * k,), dtype=dtype), dtype=None).data
        wide[..., ::2] = dev
        dev = wide[..., ::2]
    with minitx.using_config(fast=fast):
        got = to_host(row_max(dev))
    assert got.shape == x.shape[:-1] + (1,) and got.dtype == x.dtype
    np.testing.assert_array_equal(got, x.max(axis=-1, keepdims=True))
