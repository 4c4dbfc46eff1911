"""minitx.nn: Module bookkeeping, state dicts, the basic layers, containers and initialisers.

Layer outputs are checked against formulas written here in NumPy, gradients with float64
``gradcheck`` through the modules, and (where torch is installed) state-dict keys and
outputs against ``torch.nn``.
"""
import math
from collections import OrderedDict

import numpy as np
import pytest

from support import need

import minitx
import minitx.nn as nn
from minitx.nn import init


def arr(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class Block(nn.Module):
    """A small transformer-ish block: two linears around an activation and a norm."""

    def __init__(self, d=4, hidden=8):
        super().__init__()
        self.linear1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.linear2 = nn.Linear(hidden, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.linear2(self.act(self.linear1(x))))


class Net(nn.Module):
    def __init__(self, vocab=10, d=4, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(n_layers)])
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("pos", arr(6, d, seed=5).astype(np.float32))
        self.register_buffer("cache", np.zeros(3, dtype=np.float32), persistent=False)

    def forward(self, idx):
        x = self.embed(idx) + self.pos[: idx.shape[-1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


NET_KEYS = ["embed.weight",
            *[f"layers.{i}.{m}.{p}" for i in range(2)
              for m, p in [("linear1", "weight"), ("linear1", "bias"), ("linear2", "weight"),
                           ("linear2", "bias"), ("norm", "weight"), ("norm", "bias")]],
            "head.weight"]


# ---- Parameter and registration ---------------------------------------------------------------

def test_parameter_is_a_float_tensor_that_requires_grad_and_shares_data():
    t = minitx.tensor(np.ones(3, dtype=np.float32))
    p = nn.Parameter(t)
    assert isinstance(p, minitx.Tensor) and p.requires_grad and p.data is t.data
    assert not nn.Parameter([1.0], requires_grad=False).requires_grad
    with pytest.raises(TypeError, match="floating point"):
        nn.Parameter(np.arange(3))
    assert repr(p).startswith("Parameter containing:")


def test_named_parameters_use_dotted_pytorch_names_in_registration_order():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == NET_KEYS
    assert len(list(net.parameters())) == len(NET_KEYS)
    assert [n for n, _ in net.named_buffers()] == ["pos", "cache"]
    assert [n for n, _ in net.named_children()] == ["embed", "layers", "head"]
    assert [n for n, _ in net.named_modules()][:5] == ["", "embed", "layers", "layers.0",
                                                      "layers.0.linear1"]
    assert net.num_parameters() == sum(p.size for p in net.parameters())
    # Own parameters come before the children's, whatever the assignment order (as in torch).
    m = nn.Module()
    m.child = nn.Linear(2, 2)
    m.scale = nn.Parameter(np.ones(1))
    assert [n for n, _ in m.named_parameters()] == ["scale", "child.weight", "child.bias"]
    assert [n for n, _ in m.named_parameters(recurse=False)] == ["scale"]


def test_attribute_routing_and_errors():
    m = nn.Linear(3, 2)
    assert m._parameters.keys() == {"weight", "bias"} and "weight" not in m.__dict__
    with pytest.raises(TypeError, match="cannot assign Tensor as parameter 'weight'"):
        m.weight = minitx.tensor(np.zeros((2, 3), dtype=np.float32))
    m.bias = None                                    # allowed: an absent parameter
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert "bias" not in m.state_dict()
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'nope'"):
        m.nope  # noqa: B018
    del m.weight
    assert list(m.parameters()) == []

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(2))        # before super().__init__()

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        Early()
    with pytest.raises(KeyError, match="contain no '.'"):
        nn.Module().register_buffer("a.b", np.zeros(1))
    with pytest.raises(TypeError, match="not a Module"):
        nn.Module().add_module("x", 3)


def test_buffers_persistent_and_not_and_no_grad():
    net = Net()
    assert isinstance(net.pos, minitx.Tensor) and not net.pos.requires_grad
    sd = net.state_dict()
    assert "pos" in sd and "cache" not in sd
    assert all(p is not net.pos for p in net.parameters())
    net.pos = np.ones((6, 4), dtype=np.float32)      # assigning to a buffer name updates it
    assert isinstance(net.pos, minitx.Tensor) and float(net.pos.sum().item()) == 24.0


def test_tied_weights_listed_once_in_parameters_but_under_both_names_in_state_dict():
    net = Net()
    tied = nn.Linear(4, 10, bias=False)
    tied.weight = net.embed.weight
    net.head = tied
    assert sum(p is net.embed.weight for p in net.parameters()) == 1
    assert "head.weight" not in dict(net.named_parameters())
    assert "head.weight" in net.state_dict() and "embed.weight" in net.state_dict()


def test_train_eval_propagate_to_every_descendant():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.layers[1].train()
    assert net.layers[1].linear1.training and not net.layers[0].linear1.training
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError, match="bool"):
        net.train("yes")


def test_zero_grad_sets_grads_to_none():
    net = Net()
    net(np.array([[1, 2, 3]])).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_apply_visits_children_first_and_to_casts_dtype():
    net = Net()
    order = []
    net.apply(lambda m: order.append(type(m).__name__))
    assert order[0] == "Embedding" and order[-1] == "Net"
    net.apply(lambda m: init.zeros_(m.bias) if isinstance(m, nn.Linear) and m.bias is not None
              else None)
    assert all(float(abs(b).sum().item()) == 0 for n, b in net.named_parameters()
               if n.endswith("linear1.bias"))
    before = net.layers[0].linear1.weight
    assert net.to(dtype="float64") is net
    assert net.layers[0].linear1.weight is before              # same object: optimizers keep working
    assert all(p.dtype == np.float64 for p in net.parameters())
    assert net.pos.dtype == np.float64


def test_repr_is_a_pytorch_like_tree():
    text = repr(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Dropout(0.1)))
    assert text == ("Sequential(\n"
                    "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
                    "  (1): ReLU()\n"
                    "  (2): Dropout(p=0.1)\n"
                    ")")
    assert "(layers): ModuleList(\n    (0): Block(" in repr(Net())
    assert repr(nn.LayerNorm(4)) == "LayerNorm((4,), eps=1e-05, elementwise_affine=True)"
    assert repr(nn.Embedding(5, 2, padding_idx=0)) == "Embedding(5, 2, padding_idx=0)"


def test_deepcopy_gives_independent_parameters():
    import copy
    net = Net()
    twin = copy.deepcopy(net)                                  # how "N identical layers" are made
    assert list(twin.state_dict()) == list(net.state_dict())
    assert all(a is not b for a, b in zip(twin.parameters(), net.parameters()))
    assert all(isinstance(p, nn.Parameter) for p in twin.parameters())
    twin.head.weight.copy_(0.0)
    assert np.abs(net.head.weight.numpy()).sum() > 0


# ---- state dict, load, save -------------------------------------------------------------------

def test_state_dict_is_an_ordered_snapshot_of_numpy_arrays():
    net = Net()
    sd = net.state_dict()
    assert isinstance(sd, OrderedDict)
    assert set(sd) == set(NET_KEYS) | {"pos"}                # not the non-persistent 'cache'
    assert all(type(v) is np.ndarray for v in sd.values())
    assert sd["layers.0.linear1.weight"].shape == (8, 4)
    net.head.weight.copy_(7.0)
    assert not np.any(sd["head.weight"] == 7.0)                # a copy, not a view


def test_state_dict_order_params_then_buffers_per_module_in_preorder():
    # for each module in pre-order: its own parameters, then its persistent buffers (Net has
    # no parameters of its own, so its buffer 'pos' comes first, then the children's entries)
    assert list(Net().state_dict()) == ["pos", *NET_KEYS]


def test_state_dict_round_trip_reproduces_outputs():
    minitx.manual_seed(0)
    a = Net()
    minitx.manual_seed(1)
    b = Net()
    idx = np.array([[1, 2, 3, 4]])
    assert not np.allclose(a(idx).numpy(), b(idx).numpy())
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(a(idx).numpy(), b(idx).numpy())


def test_load_state_dict_keeps_dtype_and_objects_and_accepts_tensors():
    lin = nn.Linear(3, 2)
    w = lin.weight
    state = {"weight": minitx.tensor(arr(2, 3)), "bias": np.arange(2, dtype=np.float64)}
    lin.load_state_dict(state)
    assert lin.weight is w and w.dtype == np.float32
    np.testing.assert_allclose(w.numpy(), arr(2, 3).astype(np.float32))
    np.testing.assert_array_equal(lin.bias.numpy(), [0.0, 1.0])


@pytest.mark.parametrize("edit, fragments", [
    (lambda sd: sd.pop("head.weight"), ["missing key(s): head.weight"]),
    (lambda sd: sd.__setitem__("extra.bias", np.zeros(2)), ["unexpected key(s): extra.bias"]),
    (lambda sd: sd.__setitem__("layers.1.linear1.weight", np.zeros((4, 8))),
     ["layers.1.linear1.weight: shape (4, 8) in the state does not match shape (8, 4)"]),
    (lambda sd: (sd.pop("pos"), sd.__setitem__("junk", np.zeros(1)),
                 sd.__setitem__("embed.weight", np.zeros((3, 3)))),
     ["missing key(s): pos", "unexpected key(s): junk", "embed.weight: shape (3, 3)"]),
])
def test_strict_load_refuses_with_one_error_naming_everything_and_changes_nothing(edit, fragments):
    minitx.manual_seed(0)
    net = Net()
    before = net.state_dict()
    minitx.manual_seed(1)
    state = Net().state_dict()                      # all values differ from net's
    edit(state)
    with pytest.raises(RuntimeError) as info:
        net.load_state_dict(state)
    message = str(info.value)
    assert "nothing was changed" in message
    for fragment in fragments:
        assert fragment in message
    after = net.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_non_strict_load_skips_missing_and_unexpected_but_not_shape_mismatches():
    minitx.manual_seed(0)
    net = Net()
    minitx.manual_seed(1)
    other = Net().state_dict()
    old_head = net.head.weight.numpy().copy()
    del other["head.weight"]
    other["extra"] = np.zeros(1)
    result = net.load_state_dict(other, strict=False)
    assert result.missing_keys == ["head.weight"] and result.unexpected_keys == ["extra"]
    np.testing.assert_array_equal(net.embed.weight.numpy(), other["embed.weight"])
    np.testing.assert_array_equal(net.head.weight.numpy(), old_head)
    other["embed.weight"] = np.zeros((2, 2))
    with pytest.raises(RuntimeError, match="embed.weight: shape"):
        net.load_state_dict(other, strict=False)
    with pytest.raises(RuntimeError, match="numeric"):
        net.load_state_dict({**net.state_dict(), "pos": np.array(["a"] * 24).reshape(6, 4)})
    with pytest.raises(TypeError, match="mapping"):
        net.load_state_dict([1, 2])


def test_save_load_npz_round_trip(tmp_path):
    minitx.manual_seed(0)
    a = Net()
    path = a.save(tmp_path / "model")                      # ".npz" is appended
    assert path.endswith("model.npz")
    with np.load(path, allow_pickle=False) as archive:     # plain arrays: no pickle needed
        assert sorted(archive.files) == sorted(a.state_dict())
    minitx.manual_seed(3)
    b = Net()
    b.load(tmp_path / "model.npz")
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(va, vb, err_msg=k)
    with pytest.raises(RuntimeError, match="unexpected key"):
        nn.Linear(4, 10).load(path)


# ---- layers against formulas and gradcheck ----------------------------------------------------

def test_linear_forward_matches_formula_and_default_init_bounds():
    minitx.manual_seed(0)
    lin = nn.Linear(64, 32)
    assert lin.weight.shape == (32, 64) and lin.bias.shape == (32,)
    assert lin.weight.dtype == np.float32
    bound = 1 / math.sqrt(64)                              # kaiming_uniform(a=√5) = U(±1/√in)
    assert np.abs(lin.weight.numpy()).max() <= bound and np.abs(lin.bias.numpy()).max() <= bound
    # 2048 draws from U(−b, b): std b/√3, sample-std standard error ≈ b/√3·√(0.2/n) ≈ 0.6%.
    assert np.std(lin.weight.numpy()) == pytest.approx(bound / math.sqrt(3), rel=0.05)
    x = arr(2, 5, 64, dtype=np.float32)
    expected = x @ lin.weight.numpy().T + lin.bias.numpy()
    np.testing.assert_allclose(lin(minitx.tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
    nobias = nn.Linear(64, 3, bias=False)
    assert nobias.bias is None and "bias=False" in repr(nobias)
    with pytest.raises(ValueError, match="in_features must be a positive int, got 0"):
        nn.Linear(0, 3)


def test_linear_gradcheck_float64():
    lin = nn.Linear(3, 2, dtype="float64")
    x = minitx.tensor(arr(4, 3), requires_grad=True)
    assert minitx.gradcheck(lambda x, w, b: lin(x), (x, lin.weight, lin.bias))


def test_layernorm_forward_matches_formula_and_gradcheck():
    ln = nn.LayerNorm((3, 4), eps=1e-5, dtype="float64")
    init.normal_(ln.weight)
    init.normal_(ln.bias)
    x = arr(2, 3, 4, seed=1)
    mu = x.mean(axis=(1, 2), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(1, 2), keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy() + ln.bias.numpy()
    np.testing.assert_allclose(ln(minitx.tensor(x)).numpy(), expected, rtol=1e-10, atol=1e-12)
    xt = minitx.tensor(x, requires_grad=True)
    assert minitx.gradcheck(lambda x, w, b: ln(x), (xt, ln.weight, ln.bias))
    plain = nn.LayerNorm(4, elementwise_affine=False)
    assert list(plain.parameters()) == [] and plain.weight is None
    nobias = nn.LayerNorm(4, bias=False)
    assert [n for n, _ in nobias.named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(0)


def test_rmsnorm_forward_matches_formula_and_gradcheck():
    rms = nn.RMSNorm(5, dtype="float64")
    assert rms.eps == 1e-6                                 # eps=None means 1e-6
    init.normal_(rms.weight)
    x = arr(3, 5, seed=2)
    expected = x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + 1e-6) * rms.weight.numpy()
    np.testing.assert_allclose(rms(minitx.tensor(x)).numpy(), expected, rtol=1e-10)
    xt = minitx.tensor(x, requires_grad=True)
    assert minitx.gradcheck(lambda x, w: rms(x), (xt, rms.weight))
    assert list(nn.RMSNorm(5, elementwise_affine=False).parameters()) == []


def test_embedding_lookup_padding_row_and_gradcheck():
    minitx.manual_seed(0)
    emb = nn.Embedding(10, 3, padding_idx=-1, dtype="float64")
    assert emb.padding_idx == 9
    np.testing.assert_array_equal(emb.weight.numpy()[9], 0.0)
    idx = np.array([[1, 9, 1], [0, 2, 9]])
    np.testing.assert_array_equal(emb(idx).numpy(), emb.weight.numpy()[idx])
    (emb(idx) * minitx.tensor(arr(2, 3, 3))).sum().backward()
    grad = emb.weight.grad.numpy()
    np.testing.assert_array_equal(grad[9], 0.0)            # the padding row gets no gradient
    np.testing.assert_array_equal(grad[5], 0.0)            # an unused row neither
    expected_row1 = arr(2, 3, 3)[0, 0] + arr(2, 3, 3)[0, 2]  # index 1 used twice: summed
    np.testing.assert_allclose(grad[1], expected_row1)
    emb.weight.grad = None
    # The padding row's zero gradient is by design, not the derivative (finite differences
    # would see it used), so the gradcheck uses indices without it.
    assert minitx.gradcheck(lambda w: emb(np.array([[1, 0, 1], [2, 3, 1]])), (emb.weight,))
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(4, 2, padding_idx=4)
    frozen = nn.Embedding.from_pretrained(np.eye(3))
    assert not frozen.weight.requires_grad and frozen.weight.dtype == np.float64
    np.testing.assert_array_equal(frozen(np.array([2])).numpy(), [[0, 0, 1]])


def test_embedding_init_is_standard_normal():
    minitx.manual_seed(0)
    w = nn.Embedding(200, 50).weight.numpy()               # n = 10⁴ draws of N(0, 1)
    # standard errors: mean 1/√n = 0.01, std 1/√(2n) ≈ 0.007; 5 of them as the tolerance
    assert abs(w.mean()) < 0.05 and abs(w.std() - 1) < 0.035


def test_dropout_train_eval_and_edge_probabilities():
    minitx.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = minitx.tensor(np.ones((100, 100), dtype=np.float32))
    y = drop(x).numpy()
    # each of n = 10⁴ elements is dropped with p = 0.25: the dropped fraction has standard
    # deviation √(p(1−p)/n) ≈ 0.0043; allow 5 of them.
    assert abs((y == 0).mean() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 1e4)
    np.testing.assert_allclose(y[y != 0], 1 / 0.75, rtol=1e-6)  # survivors scaled by 1/(1−p)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())
    drop.train()
    np.testing.assert_array_equal(nn.Dropout(1.0)(x).numpy(), 0.0)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x).numpy(), 1.0)
    for bad in (-0.1, 1.5, "0.5"):
        with pytest.raises(ValueError, match="p must be a probability in \\[0, 1\\]"):
            nn.Dropout(bad)


def test_activation_modules_match_formulas():
    x = arr(4, 5, seed=3)
    t = minitx.tensor(x)
    erf = np.vectorize(math.erf)
    cases = {
        nn.ReLU(): np.maximum(x, 0),
        nn.GELU(): 0.5 * x * (1 + erf(x / math.sqrt(2))),
        nn.GELU("tanh"): 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
        nn.SiLU(): x / (1 + np.exp(-x)),
        nn.Tanh(): np.tanh(x),
        nn.Sigmoid(): 1 / (1 + np.exp(-x)),
        nn.Identity(7, foo=1): x,
    }
    for module, expected in cases.items():
        np.testing.assert_allclose(module(t).numpy(), expected, rtol=1e-7, atol=1e-7,
                                   err_msg=repr(module))
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")


def test_block_gradcheck_through_nested_modules():
    minitx.manual_seed(0)
    block = Block(d=3, hidden=4).to(dtype="float64")
    x = minitx.tensor(arr(2, 3, seed=4), requires_grad=True)
    params = list(block.parameters())
    assert minitx.gradcheck(lambda x, *ps: block(x), (x, *params))


# ---- containers -------------------------------------------------------------------------------

def test_sequential_indexing_len_iter_and_state_dict_keys():
    minitx.manual_seed(0)
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and seq[1] is list(seq)[1]
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = minitx.tensor(arr(5, 3, dtype=np.float32))
    np.testing.assert_allclose(seq(x).numpy(), seq[2](seq[1](seq[0](x))).numpy())
    tail = seq[1:]
    assert isinstance(tail, nn.Sequential) and list(tail.state_dict()) == ["2.weight", "2.bias"]
    named = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.Tanh())]))
    assert list(named.state_dict()) == ["fc.weight", "fc.bias"] and named[0] is named.fc
    seq.append(nn.Tanh())
    assert len(seq) == 4
    with pytest.raises(IndexError, match="out of range"):
        seq[4]  # noqa: B018


def test_modulelist_registers_members_and_behaves_like_a_list():
    class PlainList(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2)]                # a Python list: NOT registered

    assert list(PlainList().parameters()) == []
    a, b, c = nn.Linear(2, 2), nn.Linear(2, 3), nn.Linear(3, 3)
    ml = nn.ModuleList([a])
    ml.append(c)
    ml.insert(1, b)
    assert list(ml) == [a, b, c] and len(ml) == 3 and ml[-1] is c
    assert [n for n, _ in ml.named_parameters()][:4] == ["0.weight", "0.bias", "1.weight",
                                                        "1.bias"]
    assert isinstance(ml[1:], nn.ModuleList) and list(ml[1:]) == [b, c]
    del ml[0]
    assert list(ml) == [b, c] and list(ml.state_dict())[0] == "0.weight"   # renumbered
    ml[0] = a
    assert ml[0] is a
    ml.extend([nn.ReLU()])
    assert len(ml) == 3
    with pytest.raises(NotImplementedError, match="forward"):
        ml(1)


def test_moduledict_behaves_like_a_dict():
    md = nn.ModuleDict({"enc": nn.Linear(2, 2)})
    md["dec"] = nn.Linear(2, 3)
    assert "dec" in md and len(md) == 2 and list(md) == ["enc", "dec"]
    assert list(md.state_dict())[:2] == ["enc.weight", "enc.bias"]
    assert [k for k, _ in md.items()] == md.keys()
    popped = md.pop("enc")
    assert isinstance(popped, nn.Linear) and list(md) == ["dec"]
    with pytest.raises(KeyError, match="no key 'enc'"):
        md["enc"]  # noqa: B018


# ---- initialisers -----------------------------------------------------------------------------

def test_fans():
    assert init._calculate_fan_in_and_fan_out(minitx.tensor(np.zeros((8, 3)))) == (3, 8)
    assert init._calculate_fan_in_and_fan_out(minitx.tensor(np.zeros((8, 3, 5, 5)))) == (75, 200)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        init._calculate_fan_in_and_fan_out(minitx.tensor(np.zeros(3)))


def test_calculate_gain_table():
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("leaky_relu") == pytest.approx(math.sqrt(2 / (1 + 0.01 ** 2)))
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(1 / 3))
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        init.calculate_gain("swish")


# n = 200·300 = 6·10⁴ draws. For n iid draws with standard deviation σ and kurtosis κ the
# sample standard deviation has standard error σ·√((κ − 1)/(4n)): κ = 1.8 for a uniform
# (≈ 0.0018σ here), κ = 3 for a normal (≈ 0.0029σ). The tolerance 2% is > 6 standard errors,
# so a correct initialiser essentially never fails (and the seed is fixed anyway); a wrong
# constant (e.g. √2 or the other fan) is off by ≥ 10%.
SHAPE = (200, 300)                       # (out, in): fan_in = 300, fan_out = 200


@pytest.mark.parametrize("fn, kwargs, std, bound", [
    (init.xavier_uniform_, {}, math.sqrt(2 / 500), math.sqrt(6 / 500)),
    (init.xavier_uniform_, {"gain": 2.0}, 2 * math.sqrt(2 / 500), 2 * math.sqrt(6 / 500)),
    (init.xavier_normal_, {}, math.sqrt(2 / 500), None),
    (init.kaiming_uniform_, {}, math.sqrt(2 / 300), math.sqrt(6 / 300)),
    (init.kaiming_uniform_, {"a": math.sqrt(5)}, 1 / math.sqrt(300) / math.sqrt(3),
     1 / math.sqrt(300)),
    (init.kaiming_normal_, {"mode": "fan_out", "nonlinearity": "relu"}, math.sqrt(2 / 200), None),
    (init.normal_, {"mean": 0.0, "std": 0.02}, 0.02, None),
    (init.uniform_, {"a": -3.0, "b": 3.0}, 3 / math.sqrt(3), 3.0),
])
def test_initialiser_statistics(fn, kwargs, std, bound):
    minitx.manual_seed(0)
    t = fn(minitx.tensor(np.zeros(SHAPE, dtype=np.float32)), **kwargs)
    v = t.numpy().astype(np.float64)
    assert t.dtype == np.float32
    assert v.std() == pytest.approx(std, rel=0.02)
    assert abs(v.mean()) < 5 * std / math.sqrt(v.size)     # 5 standard errors of the mean
    if bound is not None:
        assert np.abs(v).max() <= bound


def test_trunc_normal_stays_in_bounds_with_the_truncated_std():
    minitx.manual_seed(0)
    t = init.trunc_normal_(minitx.tensor(np.zeros(SHAPE)), mean=0.0, std=1.0, a=-2.0, b=2.0)
    v = t.numpy()
    assert v.min() >= -2 and v.max() <= 2
    # Var of N(0,1) truncated to [−c, c]: 1 − 2cφ(c)/(2Φ(c) − 1)
    c = 2.0
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    std = math.sqrt(1 - 2 * c * phi / math.erf(c / math.sqrt(2)))
    assert v.std() == pytest.approx(std, rel=0.02)
    small = init.trunc_normal_(minitx.tensor(np.zeros(1000)), std=0.02)   # bounds ±2 absolute
    assert np.abs(small.numpy()).max() < 0.2
    with pytest.raises(ValueError, match="would not finish"):
        init.trunc_normal_(minitx.tensor(np.zeros(3)), mean=0.0, std=1.0, a=10.0, b=11.0)


def test_initialisers_are_reproducible_under_manual_seed():
    def draw(seed):
        minitx.manual_seed(seed)
        return [init.xavier_uniform_(minitx.tensor(np.zeros((4, 5)))).numpy(),
                nn.Linear(3, 2).weight.numpy(), nn.Embedding(4, 2).weight.numpy()]

    for x, y in zip(draw(7), draw(7)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(draw(7)[0], draw(8)[0])


def test_constant_initialisers_and_type_errors():
    t = minitx.tensor(np.zeros((2, 2)))
    assert init.ones_(t) is t and np.all(t.numpy() == 1)
    assert np.all(init.constant_(t, 0.5).numpy() == 0.5)
    assert np.all(init.zeros_(t).numpy() == 0)
    with pytest.raises(TypeError, match="minitx Tensor"):
        init.normal_(np.zeros(3))
    with pytest.raises(TypeError, match="floating-point"):
        init.normal_(minitx.tensor(np.zeros(3, dtype=np.int64)))


def test_nn_compute_files_do_not_import_numpy():
    import pathlib
    import re
    root = pathlib.Path(nn.__file__).parent
    for name in ("module.py", "layers.py", "init.py", "__init__.py"):
        text = (root / name).read_text()
        assert not re.search(r"^\s*(import numpy|from numpy)|\bnp\.", text, re.M), name


# ---- against torch.nn -------------------------------------------------------------------------

def test_state_dict_keys_and_outputs_match_torch():
    torch = need("torch")
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.LayerNorm(6),
                               torch.nn.Linear(6, 3, bias=False)).double()
    mnet = nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.LayerNorm(6),
                         nn.Linear(6, 3, bias=False)).to(dtype="float64")
    tstate = {k: v.detach().numpy() for k, v in tnet.state_dict().items()}
    assert list(mnet.state_dict()) == list(tstate)
    mnet.load_state_dict(tstate)
    x = arr(5, 4, seed=9)
    np.testing.assert_allclose(mnet(minitx.tensor(x)).numpy(),
                               tnet(torch.from_numpy(x)).detach().numpy(), rtol=1e-10, atol=1e-12)
    # and back: a minitx state dict loads into torch
    tnet.load_state_dict({k: torch.from_numpy(v) for k, v in mnet.state_dict().items()})


@pytest.mark.skipif(not minitx.gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_to_cuda_moves_parameters_and_buffers_and_state_dict_stays_numpy():
    minitx.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.LayerNorm(6))
    model.register_buffer("scale", np.full(6, 2.0, dtype=np.float32))
    x = arr(3, 4, dtype=np.float32)
    expected = model(minitx.tensor(x)).numpy()
    state = model.state_dict()
    assert model.to("cuda") is model
    assert all(t.device == "cuda" for t in [*model.parameters(), *model.buffers()])
    np.testing.assert_allclose(model(minitx.tensor(x).to("cuda")).numpy(), expected,
                               rtol=1e-5, atol=1e-6)
    assert all(type(v) is np.ndarray for v in model.state_dict().values())
    model.load_state_dict(state)                               # NumPy arrays into cuda params
    assert model[0].weight.device == "cuda"
    model.to("cpu")                 # the input goes to cpu too (the active backend may be cupy)
    # `expected` came from the active backend: across devices, float32 sums and exp round
    # differently (the tolerance of the move to cuda above)
    np.testing.assert_allclose(model(minitx.tensor(x).to("cpu")).numpy(), expected,
                               rtol=1e-5, atol=1e-6)
