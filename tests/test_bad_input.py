"""Bad input, table-driven: every case asserts the exception type, that the message names the
argument (and, for options, the value given), and — for objects that hold state — that nothing
changed. Then the classes that are not errors: the dtype rule, empty inputs, the numerics PyTorch
gets right, and the graph letting go of memory.

The classes of bad input: (1) one dtype rule, (2) empty inputs, (3) every option
validated by ``minitx.validate``, (4) NumPy's error text never reaching a user (re-raised in
``Function.apply``; checkpoints read by ``backend.read_npz``), (5) numerics, (6) optimizers,
(7) graph memory.
"""
import math
import os
import tracemalloc
import zipfile

import numpy as np
import pytest

import minitx
import minitx.functional as F
import minitx.nn as nn
from minitx import optim
from minitx.attention import REGISTRY
from support import held_bytes, qkv, tensor, to_host

BAD_POSITIVE = [0, -1, 2.5, True, "4", None]           # for an option that must be an int >= 1
BAD_COUNT = [-1, 1.5, True, "2"]                        # for an option that must be an int >= 0


def _case_id(value):
    return repr(value).replace(" ", "")


# ---- (3) options, at construction ------------------------------------------------------------

# (variant, option, bad values): each must raise, naming the option and the value
VARIANT_OPTIONS = [
    ("local", "window", BAD_COUNT), ("local", "block_size", BAD_POSITIVE),
    ("dilated", "window", BAD_COUNT), ("dilated", "dilation", BAD_POSITIVE),
    ("longformer", "window", BAD_COUNT), ("longformer", "global_tokens", [("a",), "0", 3]),
    ("bigbird", "block", BAD_POSITIVE), ("bigbird", "num_random", BAD_COUNT),
    ("bigbird", "num_global", BAD_COUNT), ("bigbird", "seed", [-1, 0.5]),
    ("strided", "stride", BAD_POSITIVE), ("fixed", "stride", BAD_POSITIVE),
    ("fixed", "summary", [0, 1.5, "1"]),
    ("performer", "num_features", BAD_POSITIVE), ("performer", "orthogonal", ["yes", 1]),
    ("linformer", "proj_dim", BAD_POSITIVE), ("linformer", "max_len", [0, 2.5]),
    ("linformer", "init", ["uniform", 3]),
    ("reformer", "n_buckets", [0, 3, 2.0, "4"]), ("reformer", "n_hashes", [0, 1.5]),
    ("reformer", "chunk_size", [0, -4]),
    ("routing", "num_clusters", [0, 1.5]), ("routing", "window", [0, "16"]),
    ("routing", "decay", ["0.9", 1.0, -0.1, math.nan, True]),
    ("synthesizer", "synthesis", ["dense2", 1]), ("synthesizer", "max_len", [0, 1.5]),
    ("synthesizer", "rank", [0]),
    ("aft", "variant", ["half"]), ("aft", "max_len", [0, "8"]),
    ("relative", "max_relative_position", [-1, 1.5]),
    ("rope", "base", [0, -10.0, math.nan, math.inf, True, "1e4"]),
    ("flash", "block_q", [0, 2.5]), ("flash", "block_k", [-8]),
    ("additive", "hidden_dim", [0, 1.5]),
    ("mha", "dropout", [1.0, -0.1, math.nan, "0.1"]),
    ("linear", "feature_map", ["softmax"]), ("linear", "eps", [0, -1e-6, math.nan]),
    ("mha", "num_kv_heads", [0, 3, 1.5]), ("mha", "causal", ["yes"]),
    ("mla", "kv_rank", BAD_POSITIVE[:-1]), ("mla", "q_rank", [0, 1.5]),
    ("mla", "rope_dim", [0, 3, "4"]), ("mla", "base", [0, -1.0, math.nan]),
    ("diff", "lambda_init", [math.nan, "0.5"]), ("diff", "layer_index", [-1, 1.5]),
    ("sigmoid", "context_length", BAD_POSITIVE),
    ("sink", "num_sinks", BAD_COUNT), ("sink", "window", BAD_POSITIVE),
    ("nystrom", "num_landmarks", BAD_POSITIVE), ("nystrom", "pinv_iterations", BAD_COUNT),
    ("nystrom", "conv_kernel", [0, 4, -3, 2.5]),
    # None is a valid chunk_size (the quadratic form), so BAD_POSITIVE's None is left out
    ("retention", "chunk_size", BAD_POSITIVE[:-1]), ("ssd", "chunk_size", BAD_POSITIVE[:-1]),
    ("deltanet", "chunk_size", BAD_POSITIVE[:-1]), ("deltanet", "eps", [0, -1e-6, math.nan]),
    ("short_conv", "kernel_size", BAD_POSITIVE), ("short_conv", "conv_bias", ["yes", 1]),
    ("chunked", "chunk_size", BAD_POSITIVE),
    ("compressed_sparse", "top_k", BAD_POSITIVE), ("heavily_compressed", "compress", BAD_POSITIVE),
    ("block_indexer", "block", BAD_POSITIVE), ("block_indexer", "top_k", BAD_POSITIVE),
    ("mamba2", "n_groups", [0, 3, 1.5]), ("mamba2", "time_step_limit", [(0.5, 0.1), 0.1]),
]


def _variant_cases():
    for name, option, values in VARIANT_OPTIONS:
        for value in values:
            yield pytest.param(name, option, value, id=f"{name}-{option}={_case_id(value)}")


@pytest.mark.parametrize("name,option,value", list(_variant_cases()))
def test_a_variant_refuses_a_bad_option_naming_it(name, option, value):
    with pytest.raises((ValueError, TypeError)) as info:
        REGISTRY[name](16, 2, **{option: value})
    message = str(info.value)
    assert option in message, message
    shown = value[0] if isinstance(value, tuple) else value    # a tuple: its bad element
    if option != "num_kv_heads":                       # divisibility names both counts instead
        assert repr(shown) in message or str(shown) in message, message


LAYER_OPTIONS = [
    (lambda v: nn.Linear(v, 2), "in_features", [0, 1.5, True]),
    (lambda v: nn.Linear(2, v), "out_features", [-3]),
    (lambda v: nn.Embedding(v, 4), "num_embeddings", [0, "10"]),
    (lambda v: nn.Embedding(5, 4, padding_idx=v), "padding_idx", [5, -6, 1.0]),
    (lambda v: nn.LayerNorm(4, eps=v), "eps", [0, -1e-5, math.nan, "1e-5"]),
    (lambda v: nn.LayerNorm(v), "normalized_shape", [0, (4, 0), ("a",)]),
    (lambda v: nn.RMSNorm(4, eps=v), "eps", [-1.0, math.inf]),
    (lambda v: nn.Dropout(v), "p", [1.5, -0.5, "0.1"]),
    (lambda v: nn.MultiheadAttention(v, 2), "embed_dim", [0, 2.0]),
    (lambda v: nn.MultiheadAttention(8, 2, dropout=v), "dropout", [1.0, math.nan]),
    (lambda v: nn.TransformerEncoderLayer(8, 2, v), "dim_feedforward", [0, 1.5]),
    (lambda v: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), v), "num_layers",
     [0, True]),
    (lambda v: nn.SinusoidalPositionalEncoding(8, base=v), "base", [0, -1.0]),
    (lambda v: nn.SinusoidalPositionalEncoding(8, dropout=v), "dropout", [1.0]),
    (lambda v: nn.LearnedPositionalEmbedding(v, 8), "max_len", [0]),
    (lambda v: minitx.attention.KVCache(max_len=v), "max_len", [0, 2.5]),
    (lambda v: minitx.attention.PagedKVCache(v, 4, 1, 8), "num_pages", [0]),
    (lambda v: minitx.attention.alibi_slopes(v), "num_heads", [0, 2.0]),
]


def _layer_cases():
    for i, (make, option, values) in enumerate(LAYER_OPTIONS):
        for value in values:
            yield pytest.param(make, option, value, id=f"{option}{i}={_case_id(value)}")


@pytest.mark.parametrize("make,option,value", list(_layer_cases()))
def test_a_layer_refuses_a_bad_option_naming_it(make, option, value):
    with pytest.raises((ValueError, TypeError)) as info:
        make(value)
    assert option in str(info.value), str(info.value)


# ---- (3) options, at call: one scale rule for SDPA and flash ----------------------------------

@pytest.mark.parametrize("fn", ["sdpa", "flash"])
@pytest.mark.parametrize("scale", [math.nan, math.inf, 0.0, -1.0, True, "0.5"],
                         ids=_case_id)
def test_sdpa_and_flash_refuse_the_same_bad_scales(fn, scale):
    q, k, v = (tensor(a) for a in qkv(5))
    call = F.scaled_dot_product_attention if fn == "sdpa" else F.flash_attention
    with pytest.raises((ValueError, TypeError), match=r"scale must be a positive finite number"):
        call(q, k, v, scale=scale)


@pytest.mark.parametrize("kwargs,argument", [
    (dict(dropout_p=1.0), "dropout_p"), (dict(dropout_p=-0.1), "dropout_p"),
    (dict(dropout_p="0.1"), "dropout_p"), (dict(is_causal="yes"), "is_causal"),
    (dict(attn_mask=np.ones((5, 5), np.int64)), "attn_mask"),
    (dict(attn_mask=np.ones((4, 5), bool)), "attn_mask"),
    (dict(attn_mask=[[True] * 5] * 5), "attn_mask"),
])
def test_sdpa_names_the_bad_argument(kwargs, argument):
    q, k, v = (tensor(a) for a in qkv(5))
    with pytest.raises((ValueError, TypeError), match=argument):
        F.scaled_dot_product_attention(q, k, v, **kwargs)


def _gpt():
    minitx.manual_seed(0)
    return nn.GPT(nn.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))


@pytest.mark.parametrize("kwargs,argument", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(max_new_tokens="3"), "max_new_tokens"), (dict(max_new_tokens=2, top_k=0), "top_k"),
    (dict(max_new_tokens=2, top_k=12), "top_k"), (dict(max_new_tokens=2, top_k=1.5), "top_k"),
    (dict(max_new_tokens=2, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=2, temperature=math.nan), "temperature"),
    (dict(max_new_tokens=2, temperature=math.inf), "temperature"),
    (dict(max_new_tokens=2, temperature="hot"), "temperature"),
])
def test_generate_refuses_bad_options_and_changes_nothing(kwargs, argument):
    gpt = _gpt()
    before = {k: to_host(v) for k, v in gpt.state_dict().items()}
    with pytest.raises((ValueError, TypeError), match=argument):
        gpt.generate(np.array([[1, 2]]), **kwargs)
    for k, v in gpt.state_dict().items():
        np.testing.assert_array_equal(to_host(v), before[k])


def test_a_tiny_temperature_tends_to_greedy_instead_of_nan():
    gpt = _gpt()
    greedy = to_host(gpt.generate(np.array([[1, 2]]), 4, temperature=0))
    tiny = to_host(gpt.generate(np.array([[1, 2]]), 4, temperature=1e-300))
    np.testing.assert_array_equal(tiny, greedy)


def test_generate_on_an_empty_prompt_says_what_is_empty():
    with pytest.raises(ValueError, match=r"idx is empty \(shape \(1, 0\)\)"):
        _gpt().generate(np.zeros((1, 0), dtype=np.int64), 3)


@pytest.mark.parametrize("factor", [math.nan, -1.0, "x"], ids=_case_id)
def test_a_schedule_refuses_a_bad_factor_before_any_lr_changes(factor):
    p = minitx.tensor(np.ones(2), requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    sched = optim.LambdaLR(opt, lambda step: 1.0 if step == 0 else factor)
    with pytest.raises((ValueError, TypeError), match=r"lr_lambda\(1\)"):
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("make,argument", [
    (lambda o: optim.warmup_cosine(o, 1, 10, min_lr=math.nan), "min_lr"),
    (lambda o: optim.inverse_sqrt_warmup(o, 16, 4, factor=0.0), "factor"),
    (lambda o: optim.inverse_sqrt_warmup(o, 16, 4, factor=math.nan), "factor"),
    (lambda o: optim.warmup_cosine(o, 1.5, 10), "warmup_steps"),
])
def test_schedules_refuse_bad_construction_options(make, argument):
    opt = optim.SGD([minitx.tensor(np.ones(2), requires_grad=True)], lr=0.1)
    with pytest.raises((ValueError, TypeError), match=argument):
        make(opt)


@pytest.mark.parametrize("max_norm", [math.nan, -1.0, "1"], ids=_case_id)
def test_clip_grad_norm_refuses_a_bad_max_norm_and_leaves_the_gradients(max_norm):
    p = minitx.tensor(np.ones(3), requires_grad=True)
    (p * 3.0).sum().backward()
    with pytest.raises((ValueError, TypeError), match="max_norm"):
        optim.clip_grad_norm_([p], max_norm)
    np.testing.assert_array_equal(to_host(p.grad), [3.0, 3.0, 3.0])


@pytest.mark.parametrize("ddof", [3, 4])
def test_var_refuses_ddof_not_below_n(ddof):
    with pytest.raises(ValueError, match=f"ddof={ddof}"):
        tensor(np.arange(3.0)).var(ddof=ddof)


# ---- (1) the dtype rule, and the data a tensor refuses ------------------------------------------

@pytest.mark.parametrize("data", [np.ones(3) + 1j, np.array(["a", "b"]),
                                  np.array([object(), 1], dtype=object), [[1, 2], [3]]],
                         ids=["complex", "str", "object", "ragged"])
def test_tensor_refuses_what_it_cannot_hold(data):
    with pytest.raises((TypeError, ValueError), match="tensor: data must be"):
        minitx.tensor(data)


def test_tensor_refuses_a_complex_dtype():
    with pytest.raises(TypeError, match="dtype must be bool, integer or floating point"):
        minitx.tensor([1.0, 2.0], dtype="complex64")


def _mixed(make_input_dtype):
    return make_input_dtype


MIXED = [
    ("Linear", lambda: nn.Linear(4, 3), lambda x: x),
    ("LayerNorm", lambda: nn.LayerNorm(4), lambda x: x),
    ("RMSNorm", lambda: nn.RMSNorm(4), lambda x: x),
    ("MultiheadAttention", lambda: nn.MultiheadAttention(4, 2, batch_first=True),
     lambda x: (x, x, x)),
    ("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0,
                                                                   batch_first=True),
     lambda x: x),
    ("local", lambda: REGISTRY["local"](4, 2, window=1), lambda x: x),
]


@pytest.mark.parametrize("name,make,args", MIXED, ids=[m[0] for m in MIXED])
@pytest.mark.parametrize("x_dtype", ["float64", "float16"])
def test_a_float32_module_on_another_float_dtype_gets_float32_gradients(name, make, args,
                                                                        x_dtype):
    minitx.manual_seed(0)
    layer = make()
    x = tensor(np.random.default_rng(0).standard_normal((2, 3, 4)), dtype=x_dtype,
               requires_grad=True)
    inputs = args(x)
    out = layer(*inputs) if isinstance(inputs, tuple) else layer(inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    assert x.grad.dtype == x_dtype
    for pname, p in layer.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype == np.float32, pname


@pytest.mark.parametrize("op", ["sdpa_key64", "attention_weights", "layer_norm", "rms_norm",
                                "linear", "concatenate", "stack"])
def test_functional_ops_take_mixed_float_dtypes_through_backward(op):
    r = np.random.default_rng(1)
    a = tensor(r.standard_normal((2, 3, 4)), dtype="float32", requires_grad=True)
    b = tensor(r.standard_normal((2, 3, 4)), dtype="float64", requires_grad=True)
    w = tensor(r.standard_normal((4,)), dtype="float64", requires_grad=True)
    out = {
        "sdpa_key64": lambda: F.scaled_dot_product_attention(a, b, a),
        "attention_weights": lambda: F.attention_weights(a, b),
        "layer_norm": lambda: F.layer_norm(a, (4,), w, w),
        "rms_norm": lambda: F.rms_norm(a, (4,), w),
        "linear": lambda: F.linear(a, tensor(r.standard_normal((2, 4)), requires_grad=True)),
        "concatenate": lambda: F.concatenate([a, b], axis=0),
        "stack": lambda: F.stack([a, b]),
    }[op]()
    out.sum().backward()
    assert a.grad.dtype == np.float32
    for t in (b, w):
        assert t.grad is None or t.grad.dtype == np.float64


# ---- (2) empty inputs ------------------------------------------------------------------------

def test_sdpa_with_no_keys_gives_zeros_and_zero_gradients():
    q = tensor(np.ones((1, 2, 3, 4)), requires_grad=True)
    k = tensor(np.ones((1, 2, 0, 4)), requires_grad=True)
    for causal in (False, True):
        out = F.scaled_dot_product_attention(q, k, k, is_causal=causal)
        assert out.shape == (1, 2, 3, 4) and not np.any(to_host(out))
        out.sum().backward()
        assert not np.any(to_host(q.grad))
        q.grad = None


def test_softmax_and_logsumexp_over_an_empty_axis():
    z = tensor(np.zeros((2, 0)), requires_grad=True)
    assert F.softmax(z, -1).shape == (2, 0) and F.log_softmax(z, -1).shape == (2, 0)
    lse = F.logsumexp(z, axis=-1)
    np.testing.assert_array_equal(to_host(lse), [-np.inf, -np.inf])
    lse.sum().backward()
    assert z.grad.shape == (2, 0)
    with pytest.raises(ValueError, match=r"max over an empty axis is undefined \(shape \(2, 0\)"):
        z.max(axis=-1)


def test_gpt_forward_on_an_empty_batch_of_positions():
    logits, loss = _gpt()(np.zeros((1, 0), dtype=np.int64))
    assert logits.shape == (1, 0, 11) and loss is None


# ---- (4) NumPy's words never reach a user bare ---------------------------------------------------

@pytest.mark.parametrize("call,op,shapes", [
    (lambda: tensor(np.ones((2, 3))) + tensor(np.ones(4)), "Add", "float64(2, 3), float64(4,)"),
    (lambda: tensor(np.ones((2, 3))).reshape(4, 2), "Reshape", "float64(2, 3)"),
    (lambda: tensor(np.ones((2, 3)))[5], "GetItem", "float64(2, 3)"),
    (lambda: F.concatenate([tensor(np.ones((2, 3))), tensor(np.ones((2, 4)))], axis=0),
     "Concatenate", "float64(2, 3)"),
    (lambda: F.einsum("ij,jk->ik", tensor(np.ones((2, 3))), tensor(np.ones((4, 2)))), "Einsum",
     "float64(2, 3)"),
    (lambda: F.take_along_axis(tensor(np.ones((2, 3))), np.array([[5]]), axis=1),
     "TakeAlongAxis", "float64(2, 3)"),
    (lambda: F.pad(tensor(np.ones((2, 3))), 1, value="a"), "Pad", "float64(2, 3)"),
])
def test_an_error_inside_an_op_names_the_op_and_its_inputs(call, op, shapes):
    """NumPy's own error (a ``__cause__``) is re-raised as "Op: <NumPy's words> (inputs: …)";
    a check minitx makes before NumPy runs starts with the function's or argument's name."""
    with pytest.raises((ValueError, IndexError)) as info:
        call()
    message = str(info.value)
    assert message.lower().startswith(op.lower()), message
    if info.value.__cause__ is not None:
        assert message.startswith(f"{op}: ") and f"(inputs: {shapes}" in message, message


@pytest.fixture
def checkpoints(tmp_path):
    """A model, its good checkpoint, and a bad file of every kind the reader refuses."""
    minitx.manual_seed(0)
    model = nn.Linear(3, 2)
    good = model.save(tmp_path / "good")
    files = {}
    np.save(tmp_path / "array.npy", np.ones(3))
    os.rename(tmp_path / "array.npy", tmp_path / "renamed_npy.npz")
    files["renamed_npy"] = ("renamed_npy.npz", r"not an \.npz archive \(a \.npy array\)")
    (tmp_path / "text.npz").write_text("weight = 1, 2, 3\n")
    files["text"] = ("text.npz", r"not an \.npz archive \(not a zip archive\)")
    data = open(good, "rb").read()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    files["truncated"] = ("truncated.npz", "truncated or corrupt")
    corrupt = bytearray(data)
    start = data.index(b"\x93NUMPY")
    corrupt[start:start + 6] = b"GARBAG"
    (tmp_path / "corrupt.npz").write_bytes(bytes(corrupt))
    files["corrupt"] = ("corrupt.npz", "(no valid .npy header|corrupt)")
    np.savez(tmp_path / "pickled.npz", weight=np.array([object(), 1], dtype=object))
    files["pickled"] = ("pickled.npz", r"entry 'weight' holds Python objects")
    with zipfile.ZipFile(tmp_path / "liar.npz", "w") as z:      # a header claiming 10^12 floats
        header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }"
        header += b" " * (118 - len(header)) + b"\n"
        z.writestr("weight.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") +
                   header + b"\x00" * 16)
    files["liar"] = ("liar.npz", r"entry 'weight' claims \(1000000, 1000000\) float64 "
                                 r"\(8000000000000 bytes\) but holds 16 bytes")
    return model, tmp_path, files


@pytest.mark.parametrize("kind", ["renamed_npy", "text", "truncated", "corrupt", "pickled",
                                  "liar"])
def test_a_bad_checkpoint_is_refused_naming_the_file_and_nothing_changes(checkpoints, kind):
    model, folder, files = checkpoints
    name, pattern = files[kind]
    before = to_host(model.weight).copy()
    with pytest.raises(ValueError, match=pattern) as info:
        model.load(folder / name)
    assert name in str(info.value)
    np.testing.assert_array_equal(to_host(model.weight), before)


def test_a_missing_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.npz"):
        nn.Linear(2, 2).load(tmp_path / "nowhere")


# ---- (6) optimizers refuse what would corrupt them ----------------------------------------------

def _opt(kind="Adam"):
    minitx.manual_seed(0)
    p = minitx.tensor(np.ones((2, 3)), requires_grad=True)
    q = minitx.tensor(np.ones(3), requires_grad=True)
    return p, q, getattr(optim, kind)([p, q], lr=0.1)


@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
def test_a_gradient_of_the_wrong_shape_is_refused_before_any_update(kind):
    p, q, opt = _opt(kind)
    p.grad = minitx.tensor(np.ones((2, 3)))
    q.grad = minitx.tensor(np.ones((1, 3)))           # would broadcast into the update
    with pytest.raises(ValueError, match=r"parameter 1 has shape \(3,\) but its grad has shape "
                                         r"\(1, 3\); nothing was updated"):
        opt.step()
    np.testing.assert_array_equal(to_host(p), np.ones((2, 3)))
    assert opt.state == {}


def test_a_non_leaf_tensor_is_not_a_parameter():
    p = minitx.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(ValueError, match="leaf tensors.*computed by Mul"):
        optim.SGD([p * 2.0], lr=0.1)


@pytest.mark.parametrize("corrupt,pattern", [
    (lambda sd: sd["state"][0].update(exp_avg=np.zeros((5,))), r"state 'exp_avg' of parameter 0"),
    (lambda sd: sd["state"].update({7: sd["state"][0]}), "parameter index 7"),
    (lambda sd: sd.pop("param_groups"), "keys 'state' and 'param_groups'"),
    (lambda sd: sd["param_groups"][0].update(lr=-1.0), "lr must be a number >= 0"),
    (lambda sd: sd["param_groups"][0]["params"].append(2), "groups of sizes"),
])
def test_load_state_dict_refuses_and_leaves_the_optimizer_unchanged(corrupt, pattern):
    p, q, opt = _opt("Adam")
    (p.sum() + q.sum()).backward()
    opt.step()
    sd = opt.state_dict()
    corrupt(sd)
    before = {i: {k: to_host(v).copy() if hasattr(v, "shape") else v for k, v in s.items()}
              for i, s in opt.state_dict()["state"].items()}
    lr = opt.param_groups[0]["lr"]
    with pytest.raises(ValueError, match=pattern):
        opt.load_state_dict(sd)
    after = opt.state_dict()["state"]
    assert opt.param_groups[0]["lr"] == lr and set(after) == set(before)
    for i in before:
        for k, v in before[i].items():
            np.testing.assert_array_equal(to_host(after[i][k]) if hasattr(v, "shape")
                                          else after[i][k], v)


# ---- (5) numerics that PyTorch gets right ---------------------------------------------------------

def test_layer_norm_of_a_constant_float32_row_with_a_large_offset_is_zero():
    x = tensor(np.full((3, 8), 1e4 + 0.1), dtype="float32")
    np.testing.assert_array_equal(to_host(F.layer_norm(x, (8,))), np.zeros((3, 8)))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_the_gradient_of_max_and_min_goes_to_the_nan(reduce):
    x = tensor(np.array([1.0, np.nan, 3.0]), requires_grad=True)
    getattr(x, reduce)().backward()
    np.testing.assert_array_equal(to_host(x.grad), [0.0, 1.0, 0.0])


def test_float16_sdpa_with_large_inputs_stays_finite():
    q, k, v = qkv(6, d=16, scale=300.0, dtype="float16")
    ts = [tensor(a, dtype=None, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts)
    assert out.dtype == np.float16 and np.all(np.isfinite(to_host(out)))
    out.sum().backward()
    assert all(t.grad.dtype == np.float16 and np.all(np.isfinite(to_host(t.grad))) for t in ts)


def test_float16_dropout_with_p_near_one_gives_no_nan():
    x = tensor(np.zeros((8, 1000)), dtype="float16", requires_grad=True)
    y = F.dropout(x, 0.99999)
    assert not np.any(np.isnan(to_host(y)))
    y.sum().backward()
    assert not np.any(np.isnan(to_host(x.grad)))


def test_a_nan_input_does_not_poison_the_routing_centroids():
    minitx.manual_seed(0)
    layer = REGISTRY["routing"](8, 2, num_clusters=2, window=4).to(dtype="float64")
    x = np.random.default_rng(0).standard_normal((1, 6, 8))
    x[0, 2] = np.nan
    layer(tensor(x))
    assert np.all(np.isfinite(to_host(layer.state_dict()["centroids"])))


# ---- (7) the graph lets go of memory after backward ------------------------------------------------

def test_after_backward_a_long_chain_holds_no_arrays():
    x = minitx.tensor(np.ones(1000), requires_grad=True)       # 8 KB per intermediate
    tracemalloc.start()
    before = held_bytes()                                       # device arrays other tests left
    y = x
    for _ in range(5000):                                       # 40 MB if every node kept its
        y = y * 1.0                                             # input alive
    y = y.sum()
    built = held_bytes() - before                               # host and device
    y.backward()
    held = held_bytes() - before                                # y is still referenced
    tracemalloc.stop()
    assert built > 20e6, built                                  # the chain really was there
    assert held < 1e6, held                                     # and is gone after backward
