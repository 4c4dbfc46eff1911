"""The names a PyTorch user reaches for first: ``minitx.nn.functional``, ``minitx.randint``,
``stack``, ``tril``/``triu``, the dtype names, ``save``/``load`` of a state dict,
``nn.CrossEntropyLoss``, ``nn.utils.clip_grad_norm_``, ``optim.lr_scheduler``; ``F.pad`` with
every form of NumPy's ``pad_width``; the "did you mean" of an unknown attention name; and the
PyTorch names minitx does without, each naming what to use instead.

Each name is checked against PyTorch where it is installed (those tests skip without it) and
against NumPy or its own definition everywhere, so the README's set-up runs them too."""
import math
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitx
import minitx.functional as MF
import minitx.nn as nn
from minitx import optim
from support import assert_close, tensor, to_host, need

DTYPE_NAMES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
               "bool", "half", "float", "double", "short", "int", "long")


# ---- module paths ------------------------------------------------------------------------------

def test_nn_functional_is_functional_under_pytorchs_path():
    import minitx.nn.functional as F
    names = [n for n in dir(MF) if not n.startswith("_")]
    assert len(names) > 50
    assert all(getattr(F, n) is getattr(MF, n) for n in names)
    assert nn.functional is F


def test_nn_utils_clip_grad_norm_is_optims():
    assert nn.utils.clip_grad_norm_ is optim.clip_grad_norm_
    assert nn.utils.clip_grad_value_ is optim.clip_grad_value_
    p = tensor(np.zeros(4), requires_grad=True)
    (p * tensor(np.array([3.0, 4.0, 0.0, 0.0]))).sum().backward()
    assert nn.utils.clip_grad_norm_([p], max_norm=1.0) == pytest.approx(5.0)
    assert_close(p.grad, np.array([0.6, 0.8, 0.0, 0.0]) * 5 / (5 + 1e-6), rtol=1e-12)


def test_clip_grad_norm_equals_pytorchs():
    torch = need("torch")
    g = np.random.default_rng(0).standard_normal((3, 5))
    p = tensor(np.zeros((3, 5)), requires_grad=True)
    (p * tensor(g)).sum().backward()
    tp = torch.zeros(3, 5, dtype=torch.float64, requires_grad=True)
    (tp * torch.from_numpy(g)).sum().backward()
    total = nn.utils.clip_grad_norm_([p], max_norm=0.5)
    t_total = torch.nn.utils.clip_grad_norm_([tp], max_norm=0.5)
    assert total == pytest.approx(float(t_total), rel=1e-12)
    assert_close(p.grad, tp.grad.numpy(), rtol=1e-12)


# ---- factories and shape ops at the top level --------------------------------------------------

def test_randint_draws_uniform_integers_in_range_and_repeats_with_the_seed():
    minitx.manual_seed(7)
    a = minitx.randint(3, 9, (4000,))
    minitx.manual_seed(7)
    b = minitx.randint(3, 9, size=(4000,))
    assert a.dtype == np.int64 and a.shape == (4000,) and not a.requires_grad
    values = to_host(a)
    np.testing.assert_array_equal(values, to_host(b))
    assert set(values.tolist()) == set(range(3, 9))                 # every value, none outside
    counts = np.bincount(values - 3) / values.size
    assert np.all(np.abs(counts - 1 / 6) < 0.03)                     # ~7 sigma for n = 4000
    assert minitx.randint(5, (2, 3)).shape == (2, 3)                 # randint(high, size)
    assert minitx.randint(5, size=(2,)).shape == (2,)
    assert minitx.randint(0, 2, (3,), dtype="int32").dtype == np.int32


def test_randint_refuses_what_pytorch_refuses():
    with pytest.raises(ValueError, match="high must be an int > low"):
        minitx.randint(4, 4, (2,))
    with pytest.raises(ValueError, match="needs high and size"):
        minitx.randint(4)
    with pytest.raises(ValueError, match="only floating-point tensors can require"):
        minitx.randint(4, (2,), requires_grad=True)


def test_randint_takes_pytorchs_call_forms():
    torch = need("torch")
    for args, kwargs in [((5, (2, 3)), {}), ((2, 5, (4,)), {}), ((5,), {"size": (3, 1)}),
                         ((), {"low": 1, "high": 3, "size": (2,)})]:
        mine, theirs = minitx.randint(*args, **kwargs), torch.randint(*args, **kwargs)
        assert mine.shape == tuple(theirs.shape) and str(mine.dtype) == "int64"
        assert str(theirs.dtype) == "torch.int64"


def test_stack_tril_triu_at_the_top_level():
    x = np.arange(12.0).reshape(3, 4)
    assert minitx.stack is MF.stack and minitx.tril is MF.tril and minitx.triu is MF.triu
    assert_close(minitx.stack([tensor(x), tensor(2 * x)], dim=1), np.stack([x, 2 * x], axis=1))
    for k in (-1, 0, 2):
        assert_close(minitx.tril(tensor(x), diagonal=k), np.tril(x, k))
        assert_close(minitx.triu(tensor(x), k), np.triu(x, k))
    with pytest.raises(ValueError, match="not both"):
        minitx.tril(tensor(x), 1, diagonal=1)


def test_stack_tril_triu_equal_pytorchs():
    torch = need("torch")
    x = np.random.default_rng(1).standard_normal((2, 4, 5))
    t = torch.from_numpy(x)
    assert_close(minitx.stack([tensor(x), tensor(x)], dim=2), torch.stack([t, t], dim=2).numpy())
    assert_close(minitx.tril(tensor(x), diagonal=1), torch.tril(t, diagonal=1).numpy())
    assert_close(minitx.triu(tensor(x), diagonal=-2), torch.triu(t, diagonal=-2).numpy())


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_dtype_names_are_numpys_dtypes(name):
    dtype = np.dtype(getattr(minitx, name))
    made = minitx.zeros(2, dtype=getattr(minitx, name))
    assert made.dtype == dtype
    assert name not in minitx.__all__        # from minitx import * leaves the builtins alone


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_dtype_names_mean_what_they_mean_in_pytorch(name):
    torch = need("torch")
    assert str(np.dtype(getattr(minitx, name))) == str(getattr(torch, name)).split(".")[1]


# ---- save / load of a state dict ---------------------------------------------------------------

def test_save_and_load_a_state_dict_round_trip(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    path = tmp_path / "model.pt"
    assert minitx.save(model.state_dict(), path) == str(path)        # no suffix added
    with zipfile.ZipFile(path) as archive:                            # plain .npy entries
        assert all(n.endswith(".npy") for n in archive.namelist())
    state = minitx.load(path, map_location="cpu")
    assert list(state) == list(model.state_dict())                    # PyTorch's order
    other = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    other.load_state_dict(state)
    x = tensor(np.random.default_rng(2).standard_normal((5, 3)), dtype="float32")
    assert_close(other(x), model(x))
    # Tensors as values too (a hand-made state dict), and np.load reads the file without pickle
    minitx.save({"w": tensor(np.eye(2))}, tmp_path / "w.npz")
    with np.load(tmp_path / "w.npz", allow_pickle=False) as raw:
        np.testing.assert_array_equal(raw["w"], np.eye(2))


def test_save_and_load_refuse_what_they_do_not_do(tmp_path):
    with pytest.raises(TypeError, match=r"model.state_dict\(\).*save_checkpoint"):
        minitx.save(nn.Linear(2, 2), tmp_path / "m.npz")
    with pytest.raises(TypeError, match="keys must be strings"):
        minitx.save({1: np.zeros(2)}, tmp_path / "m.npz")
    minitx.save({"a": np.zeros(2)}, tmp_path / "m.npz")
    with pytest.raises(ValueError, match="map_location must be None or 'cpu'"):
        minitx.load(tmp_path / "m.npz", map_location="cuda:0")
    with pytest.raises(ValueError, match="never unpickles"):
        minitx.load(tmp_path / "m.npz", weights_only=False)


# ---- nn.CrossEntropyLoss -----------------------------------------------------------------------

def _ce_numpy(logits, target, ignore_index=-100, smoothing=0.0, reduction="mean"):
    """PyTorch's definition, written out on (N, C) rows: classes on the last axis here."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = target != ignore_index
    picked = -np.take_along_axis(logp, np.where(keep, target, 0)[..., None], -1)[..., 0]
    loss = ((1 - smoothing) * picked - smoothing * logp.mean(-1)) * keep
    if reduction == "none":
        return loss
    return loss.sum() / (keep.sum() if reduction == "mean" else 1)


@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 5, 3), (2, 5, 3, 2)])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.1), ("none", 0.3)])
def test_cross_entropy_loss_takes_pytorchs_layout(shape, reduction, smoothing):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(shape)
    target = rng.integers(0, 5, shape[:1] + shape[2:] if len(shape) > 1 else ())
    target = np.where(rng.random(target.shape) < 0.2, -1, target) if target.ndim else target
    loss = nn.CrossEntropyLoss(ignore_index=-1, reduction=reduction, label_smoothing=smoothing)
    got = loss(tensor(logits), target)
    last = np.moveaxis(logits, 1, -1) if len(shape) > 1 else logits
    assert_close(got, _ce_numpy(last, target, -1, smoothing, reduction), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 5, 3), (2, 5, 3, 2)])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.1), ("none", 0.3)])
def test_cross_entropy_loss_equals_pytorchs_with_its_gradient(shape, reduction, smoothing):
    torch = need("torch")
    rng = np.random.default_rng(4)
    logits = rng.standard_normal(shape)
    target = rng.integers(0, 5, shape[:1] + shape[2:] if len(shape) > 1 else ())
    if target.ndim:
        target[(0,) * target.ndim] = 2                      # an ignored target, kept in range
    kw = dict(ignore_index=2, reduction=reduction, label_smoothing=smoothing)
    x = tensor(logits, requires_grad=True)
    tx = torch.tensor(logits, requires_grad=True)
    mine, theirs = nn.CrossEntropyLoss(**kw)(x, target), \
        torch.nn.CrossEntropyLoss(**kw)(tx, torch.from_numpy(target))
    assert_close(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-15)
    mine.sum().backward()
    theirs.sum().backward()
    assert_close(x.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_cross_entropy_loss_names_the_layout_and_what_to_use_for_weights():
    loss = nn.CrossEntropyLoss()
    with pytest.raises(ValueError, match=r"classes are on axis 1.*F.cross_entropy"):
        loss(tensor(np.zeros((2, 3, 7))), np.zeros((2, 3), dtype=np.int64))   # (B, T, V) habit
    with pytest.raises(ValueError, match=r"reduction='none' and weight the losses"):
        nn.CrossEntropyLoss(weight=np.ones(3))
    with pytest.raises(ValueError, match="did you mean 'mean'"):
        nn.CrossEntropyLoss(reduction="meen")


# ---- optim.lr_scheduler ------------------------------------------------------------------------

def _lrs(make_sched, steps, base=0.1):
    p = tensor(np.zeros(2), requires_grad=True)
    opt = optim.SGD([p], lr=base)
    sched = make_sched(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        assert opt.param_groups[0]["lr"] == lrs[-1]
        opt.step()
        sched.step()
    return lrs, sched


def test_lr_scheduler_offers_pytorchs_classes():
    ls = optim.lr_scheduler
    assert ls.LambdaLR is optim.LambdaLR and ls.CosineAnnealingLR is optim.CosineAnnealingLR
    lrs, sched = _lrs(lambda o: ls.CosineAnnealingLR(o, T_max=4, eta_min=0.02), 9)
    # the ends and the middle of the half cosine, then back up (the cosine is periodic)
    assert lrs[0] == pytest.approx(0.1) and lrs[4] == pytest.approx(0.02)
    assert lrs[2] == pytest.approx(0.06) and lrs[8] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(lrs[:4], lrs[1:5])) and sched.last_epoch == 9
    lrs, _ = _lrs(lambda o: ls.StepLR(o, step_size=3, gamma=0.5), 7)
    assert lrs == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])
    lrs, _ = _lrs(lambda o: ls.LambdaLR(o, lambda s: 1 / (s + 1)), 4)
    assert lrs == pytest.approx([0.1, 0.05, 0.1 / 3, 0.025])


def test_a_scheduler_minitx_does_without_names_lambda_lr():
    with pytest.raises(AttributeError, match=r"'OneCycleLR'.*CosineAnnealingLR.*LambdaLR\("):
        optim.lr_scheduler.OneCycleLR  # noqa: B018


@pytest.mark.parametrize("name,kwargs", [
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 0.01}),
    ("CosineAnnealingLR", {"T_max": 1}),
    ("StepLR", {"step_size": 4, "gamma": 0.3}),
    ("LambdaLR", {"lr_lambda": lambda s: 0.9 ** s + math.sin(s) ** 2}),
])
def test_lr_schedulers_set_pytorchs_lrs(name, kwargs):
    torch = need("torch")
    mine, sched = _lrs(lambda o: getattr(optim.lr_scheduler, name)(o, **kwargs), 30, base=0.2)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.2)
    theirs_sched = getattr(torch.optim.lr_scheduler, name)(opt, **kwargs)
    theirs = []
    for _ in range(30):
        theirs.append(theirs_sched.get_last_lr()[0])
        opt.step()
        theirs_sched.step()
    assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-15)
    assert sched.last_epoch == theirs_sched.last_epoch


# ---- F.pad: NumPy's pad_width, every form ------------------------------------------------------

def _pad_widths(ndim):
    n = st.integers(0, 3)
    return st.one_of(
        n, st.tuples(n), st.tuples(n, n), st.tuples(st.tuples(n, n)),
        st.tuples(*[st.tuples(n) for _ in range(ndim)]),
        st.tuples(*[st.tuples(n, n) for _ in range(ndim)]))


@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_pad_takes_every_form_of_numpys_pad_width(data, shape):
    x = np.arange(float(np.prod(shape))).reshape(shape) + 1
    width = data.draw(_pad_widths(len(shape)))
    out = MF.pad(tensor(x, requires_grad=True), width, value=-2.0)
    assert_close(out, np.pad(x, width, constant_values=-2.0))
    out.sum().backward()                      # each input element is in the output once


def test_pad_refuses_what_numpy_refuses_and_says_how_pytorchs_tuple_reads():
    x = tensor(np.ones((2, 3)))
    for width in [(1, 2, 3), ((1, 2, 3),), ((1, 1), (1, 1), (1, 1)), -1, ((0, -1),), (1.5, 2),
                  "ab", None]:
        with pytest.raises(ValueError, match=r"pad: pad_width must be NumPy's.*PyTorch's"):
            MF.pad(x, width)
        if width is not None and width != "ab":
            with pytest.raises((ValueError, TypeError)):
                np.pad(np.ones((2, 3)), width)


def test_pad_of_the_last_axis_is_pytorchs_f_pad():
    torch = need("torch")
    x = np.random.default_rng(5).standard_normal((2, 3, 4))
    theirs = torch.nn.functional.pad(torch.from_numpy(x), (0, 1, 2, 0)).numpy()
    assert_close(MF.pad(tensor(x), ((0, 0), (2, 0), (0, 1))), theirs)


# ---- names minitx does without; an unknown attention name ---------------------------------------

@pytest.mark.parametrize("name,instead", [("bfloat16", "float16"), ("cuda", "set_backend"),
                                          ("device", "'cuda'"), ("compile", "fast layer"),
                                          ("from_numpy", "minitx.tensor")])
def test_a_pytorch_name_minitx_does_without_names_what_to_use(name, instead):
    with pytest.raises(AttributeError, match=f"torch.{name}.*{instead}"):
        getattr(minitx, name)
    assert not hasattr(minitx, name)


def test_an_unknown_attention_name_gets_the_registrys_suggestion():
    config = nn.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8,
                          attention="retnet")
    with pytest.raises(ValueError, match=r"attention must be one of .*got 'retnet'; did you "
                                         r"mean .*'retention'"):
        nn.GPT(config)
    with pytest.raises(KeyError, match="did you mean .*'retention'"):
        minitx.attention.REGISTRY["retnet"]
