"""PyTorch parity: forward values and input gradients of every op, in float32 and float64.

Each case builds NumPy inputs, runs the op in minitx and the equivalent in PyTorch, feeds
the same random upstream gradient to both, and compares outputs, output dtypes and every
float input's gradient. Integer/bool inputs (indices, targets, masks) are constants.
Inputs are kept off kinks and ties (see tests/ops/test_ops.py) so that both libraries'
subgradient conventions cannot differ.
"""
import zlib

import numpy as np
import pytest

import minitx
import minitx.functional as F
from support import tensor, need

torch = need("torch")
TF = torch.nn.functional

TOL = {np.float32: dict(rtol=1e-4, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def away(r, shape, lo=0.2, hi=2.0):
    return r.uniform(lo, hi, shape) * r.choice([-1.0, 1.0], shape)


def distinct(r, shape):
    n = int(np.prod(shape))
    return (r.permutation(n) * 0.1 - n * 0.05).reshape(shape)


def pos(r, shape):
    return r.uniform(0.3, 2.0, shape)


def normal(r, shape):
    return r.standard_normal(shape)


def ints(values):
    return np.asarray(values, dtype=np.int64)


# (id, inputs(r) -> list of arrays, minitx fn, torch fn)
CASES = [
    ("add", lambda r: [normal(r, (2, 1, 3)), normal(r, (4, 3))], F.add, torch.add),
    ("sub", lambda r: [normal(r, (3,)), normal(r, (2, 3))], F.sub, torch.sub),
    ("mul", lambda r: [normal(r, (2, 3)), normal(r, (2, 1))], F.mul, torch.mul),
    ("div", lambda r: [normal(r, (2, 3)), away(r, (3,), 0.5)], F.div, torch.div),
    ("neg", lambda r: [normal(r, (2, 3))], F.neg, torch.neg),
    ("pow_tensor", lambda r: [pos(r, (2, 3)), normal(r, (3,))], F.pow, torch.pow),
    ("pow_scalar", lambda r: [pos(r, (2, 3))], lambda x: F.pow(x, 2.5), lambda x: x ** 2.5),
    ("exp", lambda r: [normal(r, (2, 3))], F.exp, torch.exp),
    ("log", lambda r: [pos(r, (2, 3))], F.log, torch.log),
    ("sqrt", lambda r: [pos(r, (2, 3))], F.sqrt, torch.sqrt),
    ("abs", lambda r: [away(r, (2, 3))], F.abs, torch.abs),
    ("tanh", lambda r: [normal(r, (2, 3))], F.tanh, torch.tanh),
    ("sigmoid", lambda r: [normal(r, (2, 3)) * 4], F.sigmoid, torch.sigmoid),
    ("relu", lambda r: [away(r, (2, 3))], F.relu, torch.relu),
    ("gelu_none", lambda r: [normal(r, (3, 4)) * 3], lambda x: F.gelu(x, approximate="none"),
     lambda x: TF.gelu(x, approximate="none")),
    ("gelu_tanh", lambda r: [normal(r, (3, 4)) * 3], lambda x: F.gelu(x, approximate="tanh"),
     lambda x: TF.gelu(x, approximate="tanh")),
    ("elu", lambda r: [away(r, (2, 3))], lambda x: F.elu(x, 0.7), lambda x: TF.elu(x, 0.7)),
    ("silu", lambda r: [normal(r, (2, 3)) * 3], F.silu, TF.silu),
    ("erf", lambda r: [np.linspace(-4, 4, 33)], F.erf, torch.erf),
    ("softplus", lambda r: [normal(r, (2, 3)) * 3], F.softplus, TF.softplus),
    ("maximum", lambda r: [distinct(r, (2, 3)), distinct(r, (2, 3))[::-1] + 0.05],
     F.maximum, torch.maximum),
    ("minimum", lambda r: [distinct(r, (2, 3)), distinct(r, (2, 3))[::-1] + 0.05],
     F.minimum, torch.minimum),
    ("clip", lambda r: [away(r, (3, 4), 0.1, 2.0) * np.where(r.random((3, 4)) < .5, 1, 0.4)],
     lambda x: F.clip(x, -0.7, 0.9), lambda x: torch.clamp(x, -0.7, 0.9)),
    ("sum_all", lambda r: [normal(r, (2, 3))], lambda x: F.sum(x), torch.sum),
    ("sum_axis", lambda r: [normal(r, (2, 3, 4))], lambda x: F.sum(x, axis=(0, 2)),
     lambda x: torch.sum(x, dim=(0, 2))),
    ("mean_keepdims", lambda r: [normal(r, (2, 3, 4))], lambda x: F.mean(x, 1, keepdims=True),
     lambda x: torch.mean(x, 1, keepdim=True)),
    ("var", lambda r: [normal(r, (3, 5))], lambda x: F.var(x, axis=-1),
     lambda x: torch.var(x, dim=-1, correction=0)),
    ("var_ddof1", lambda r: [normal(r, (3, 5))], lambda x: F.var(x, axis=0, ddof=1),
     lambda x: torch.var(x, dim=0, correction=1)),
    ("max", lambda r: [distinct(r, (3, 4))], lambda x: F.max(x, axis=1),
     lambda x: torch.amax(x, dim=1)),
    ("min_all", lambda r: [distinct(r, (3, 4))], lambda x: F.min(x), torch.amin),
    ("logsumexp", lambda r: [normal(r, (3, 4)) * 3], lambda x: F.logsumexp(x, axis=-1),
     lambda x: torch.logsumexp(x, dim=-1)),
    ("cumsum", lambda r: [normal(r, (3, 4))], lambda x: F.cumsum(x, 0),
     lambda x: torch.cumsum(x, 0)),
    ("reshape", lambda r: [normal(r, (2, 6))], lambda x: x.reshape(3, -1),
     lambda x: x.reshape(3, -1)),
    ("transpose", lambda r: [normal(r, (2, 3, 4))], lambda x: x.transpose(2, 0, 1),
     lambda x: x.permute(2, 0, 1)),
    ("swapaxes", lambda r: [normal(r, (2, 3, 4))], lambda x: F.swapaxes(x, 0, -1),
     lambda x: torch.swapaxes(x, 0, -1)),
    ("broadcast_to", lambda r: [normal(r, (3, 1))], lambda x: F.broadcast_to(x, (2, 3, 4)),
     lambda x: torch.broadcast_to(x, (2, 3, 4))),
    ("squeeze", lambda r: [normal(r, (3, 1, 2))], lambda x: F.squeeze(x, 1),
     lambda x: torch.squeeze(x, 1)),
    ("expand_dims", lambda r: [normal(r, (3, 2))], lambda x: F.expand_dims(x, -1),
     lambda x: torch.unsqueeze(x, -1)),
    ("concatenate", lambda r: [normal(r, (2, 3)), normal(r, (2, 1))],
     lambda a, b: F.concatenate([a, b], axis=1), lambda a, b: torch.cat([a, b], dim=1)),
    ("stack", lambda r: [normal(r, (2, 3)), normal(r, (2, 3))],
     lambda a, b: F.stack([a, b], axis=1), lambda a, b: torch.stack([a, b], dim=1)),
    ("split", lambda r: [normal(r, (5, 2))],
     lambda x: F.concatenate([p * (i + 1.0) for i, p in enumerate(F.split(x, [1, 3]))], 0),
     lambda x: torch.cat([p * (i + 1.0) for i, p in enumerate(torch.split(x, [1, 2, 2]))], 0)),
    ("pad", lambda r: [normal(r, (2, 3))], lambda x: F.pad(x, ((1, 0), (2, 1)), 0.5),
     lambda x: TF.pad(x, (2, 1, 1, 0), value=0.5)),
    ("tril", lambda r: [normal(r, (2, 3, 4))], lambda x: F.tril(x, 1), lambda x: torch.tril(x, 1)),
    ("triu", lambda r: [normal(r, (3, 4))], lambda x: F.triu(x, -1), lambda x: torch.triu(x, -1)),
    ("getitem_basic", lambda r: [normal(r, (3, 4, 5))], lambda x: x[1:, None, ..., ::2],
     lambda x: x[1:, None, ..., ::2]),
    ("getitem_repeats", lambda r: [normal(r, (4, 3)), ints([0, 2, 0, 0])],
     lambda x, i: x[i], lambda x, i: x[i]),
    ("getitem_2d_adv", lambda r: [normal(r, (4, 3)), ints([[0, 1], [3, 0]]), ints([2, 2])],
     lambda x, i, j: x[i, j], lambda x, i, j: x[i, j]),
    ("getitem_mask", lambda r: [normal(r, (4, 3)), r.random((4, 3)) > 0.5],
     lambda x, m: x[m], lambda x, m: x[m]),
    ("take_along_axis", lambda r: [normal(r, (3, 4)), ints(r.integers(0, 4, (3, 6)))],
     lambda x, i: F.take_along_axis(x, i, 1), lambda x, i: torch.take_along_dim(x, i, 1)),
    ("embedding", lambda r: [ints([[1, 3, 1], [0, 1, 2]]), normal(r, (4, 5))],
     lambda i, w: F.embedding(i, w, padding_idx=2), lambda i, w: TF.embedding(i, w, padding_idx=2)),
    ("where", lambda r: [r.random((2, 3)) > 0.5, normal(r, (2, 3)), normal(r, (3,))],
     F.where, torch.where),
    ("masked_fill", lambda r: [normal(r, (2, 3, 4)), r.random((3, 1)) > 0.5],
     lambda x, m: F.masked_fill(x, m, -2.0), lambda x, m: x.masked_fill(m, -2.0)),
    ("matmul_batched", lambda r: [normal(r, (2, 1, 3, 4)), normal(r, (3, 4, 2))],
     F.matmul, torch.matmul),
    ("matmul_shared", lambda r: [normal(r, (2, 3, 4)), normal(r, (4, 2))], F.matmul, torch.matmul),
    ("matmul_vec_left", lambda r: [normal(r, (4,)), normal(r, (2, 4, 3))], F.matmul, torch.matmul),
    ("matmul_vec_right", lambda r: [normal(r, (2, 3, 4)), normal(r, (4,))], F.matmul, torch.matmul),
    ("matmul_dot", lambda r: [normal(r, (4,)), normal(r, (4,))], F.matmul, torch.matmul),
    ("linear", lambda r: [normal(r, (2, 3, 4)), normal(r, (5, 4)), normal(r, (5,))],
     F.linear, TF.linear),
    ("linear_nobias", lambda r: [normal(r, (3, 4)), normal(r, (5, 4))], F.linear, TF.linear),
    ("einsum_attn", lambda r: [normal(r, (2, 2, 3, 4)), normal(r, (2, 2, 5, 4))],
     lambda a, b: F.einsum("bhqd,bhkd->bhqk", a, b),
     lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b)),
    ("einsum_three", lambda r: [normal(r, (2, 3)), normal(r, (3, 4)), normal(r, (4,))],
     lambda a, b, c: F.einsum("ij,jk,k->i", a, b, c),
     lambda a, b, c: torch.einsum("ij,jk,k->i", a, b, c)),
    ("einsum_ellipsis", lambda r: [normal(r, (2, 3, 4)), normal(r, (4, 2))],
     lambda a, b: F.einsum("...ij,jk->...ik", a, b),
     lambda a, b: torch.einsum("...ij,jk->...ik", a, b)),
    ("sort", lambda r: [distinct(r, (3, 5))], lambda x: F.sort(x, axis=1)[0],
     lambda x: torch.sort(x, dim=1)[0]),
    ("sort_desc", lambda r: [distinct(r, (4, 3))], lambda x: F.sort(x, 0, descending=True)[0],
     lambda x: torch.sort(x, dim=0, descending=True)[0]),
    ("topk", lambda r: [distinct(r, (3, 6))], lambda x: F.topk(x, 3)[0],
     lambda x: torch.topk(x, 3)[0]),
    ("topk_smallest", lambda r: [distinct(r, (3, 6))], lambda x: F.topk(x, 2, largest=False)[0],
     lambda x: torch.topk(x, 2, largest=False)[0]),
    ("softmax", lambda r: [normal(r, (3, 5)) * 3], lambda x: F.softmax(x, -1),
     lambda x: torch.softmax(x, -1)),
    ("softmax_axis0", lambda r: [normal(r, (3, 5)) * 3], lambda x: F.softmax(x, 0),
     lambda x: torch.softmax(x, 0)),
    ("log_softmax", lambda r: [normal(r, (3, 5)) * 3], lambda x: F.log_softmax(x, -1),
     lambda x: torch.log_softmax(x, -1)),
    ("layer_norm", lambda r: [normal(r, (2, 3, 8)) * 2 + 1, normal(r, (8,)), normal(r, (8,))],
     lambda x, w, b: F.layer_norm(x, 8, w, b), lambda x, w, b: TF.layer_norm(x, (8,), w, b)),
    ("layer_norm_2d", lambda r: [normal(r, (2, 3, 4))],
     lambda x: F.layer_norm(x, (3, 4)), lambda x: TF.layer_norm(x, (3, 4))),
    ("rms_norm", lambda r: [normal(r, (2, 3, 8)) * 2, normal(r, (8,))],
     lambda x, w: F.rms_norm(x, 8, w, eps=1e-6), lambda x, w: TF.rms_norm(x, (8,), w, eps=1e-6)),
    ("mse_loss", lambda r: [normal(r, (3, 4)), normal(r, (3, 4))], F.mse_loss, TF.mse_loss),
    ("mse_loss_sum", lambda r: [normal(r, (3, 4)), normal(r, (3, 4))],
     lambda a, b: F.mse_loss(a, b, "sum"), lambda a, b: TF.mse_loss(a, b, reduction="sum")),
]


def ce_case(reduction, smoothing, ignore_index=-100):
    def inputs(r):
        target = r.integers(0, 5, (6,))
        target[[1, 4]] = ignore_index
        return [normal(r, (6, 5)) * 2, ints(target)]
    return (f"cross_entropy_{reduction}_{smoothing}_{ignore_index}", inputs,
            lambda z, t: F.cross_entropy(z, t, ignore_index=ignore_index,
                                         label_smoothing=smoothing, reduction=reduction),
            lambda z, t: TF.cross_entropy(z, t, ignore_index=ignore_index,
                                          label_smoothing=smoothing, reduction=reduction))


CASES += [ce_case(red, s) for red in ("mean", "sum", "none") for s in (0.0, 0.2)]
CASES += [ce_case("mean", 0.1, ignore_index=3)]
CASES += [("cross_entropy_3d", lambda r: [normal(r, (2, 3, 4)), ints(r.integers(0, 4, (2, 3)))],
           lambda z, t: F.cross_entropy(z, t, label_smoothing=0.1),
           lambda z, t: TF.cross_entropy(z.permute(0, 2, 1), t, label_smoothing=0.1))]


def to_minitx(a, dtype):
    if a.dtype.kind == "f":
        return tensor(a, dtype=dtype, requires_grad=True)
    return tensor(a, dtype=None)                                  # indices keep their dtype


def to_torch(a, dtype):
    if a.dtype.kind == "f":
        return torch.tensor(a.astype(dtype), requires_grad=True)
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name,make,mt_fn,th_fn", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_torch(name, make, mt_fn, th_fn, dtype):
    r = np.random.default_rng(zlib.crc32(name.encode()))   # stable across runs
    arrays = [np.asarray(a) for a in make(r)]
    ours_in = [to_minitx(a, dtype) for a in arrays]
    theirs_in = [to_torch(a, dtype) for a in arrays]
    ours = mt_fn(*ours_in)
    theirs = th_fn(*theirs_in)
    assert ours.shape == tuple(theirs.shape)
    assert ours.dtype == dtype
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), **TOL[dtype])

    g = r.standard_normal(ours.shape).astype(dtype)
    ours.backward(minitx.tensor(g))
    theirs.backward(torch.from_numpy(g))
    for i, (a, o, t) in enumerate(zip(arrays, ours_in, theirs_in)):
        if a.dtype.kind != "f":
            continue
        assert o.grad is not None, f"input {i} got no gradient"
        assert o.grad.dtype == dtype
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), **TOL[dtype],
                                   err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_dropout_matches_torch_given_the_mask(dtype):
    """The masks come from different generators, so compare given minitx's mask: the kept
    entries are scaled by 1/(1 − p) exactly as torch does, the gradient is the mask, and
    evaluation mode is the identity in both."""
    r = np.random.default_rng(0)
    x = r.uniform(0.5, 1.5, (50, 40)).astype(dtype)
    p = 0.3
    minitx.manual_seed(0)
    xt = minitx.tensor(x, requires_grad=True)
    y = F.dropout(xt, p)
    mask = y.numpy() / x
    kept = mask != 0
    np.testing.assert_allclose(mask[kept], 1 / (1 - p), rtol=1e-6)
    # 2000 Bernoulli(0.7) draws: standard error √(p(1 − p)/n) ≈ 0.010; 3 of them
    assert abs(kept.mean() - (1 - p)) < 0.03
    g = r.standard_normal(x.shape).astype(dtype)
    y.backward(minitx.tensor(g))
    xth = torch.tensor(x, requires_grad=True)
    yth = xth * torch.from_numpy(mask.astype(dtype))
    yth.backward(torch.from_numpy(g))
    np.testing.assert_allclose(xt.grad.numpy(), xth.grad.numpy(), **TOL[dtype])
    np.testing.assert_array_equal(F.dropout(minitx.tensor(x), p, training=False).numpy(),
                                  TF.dropout(torch.from_numpy(x), p, training=False).numpy())
