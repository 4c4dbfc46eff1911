"""The attention dispatcher (``minitx/ops/dispatch.py``): the CUDA flash kernel runs whenever it
applies, the reason is visible when it does not, and ``MINITX_FLASH`` governs the policy.

"On a GPU" here is the strict CuPy stand-in (``tests/strict_cupy.py``) made the active backend,
with the CUDA kernels declared available and replaced by counting stand-ins that compute with
the tiled array code (``ops/flash.py``) — so these tests run in both CI passes. The real kernels
are run through the same dispatcher by ``tests/gpu/cuda/test_cuda_integration.py`` (emulated) and
by the GPU tests when a GPU is present.
"""
import logging

import numpy as np
import pytest

import minitx
import minitx.functional as F
import minitx.nn as nn
import strict_cupy
import support
from minitx import backend
from minitx.backend import flash_cuda
from minitx.ops import dispatch
from minitx.ops.flash import flash_attention_arrays, flash_backward_arrays


class CountingKernels:
    """``flash_cuda``'s two entry points, counting calls, computed by the tiled array code."""

    def __init__(self):
        self.calls = []

    def forward(self, q, k, v, *, causal=False, scale=None, key_mask=None, lengths=None):
        self.calls.append(("forward", q.dtype.name, tuple(q.shape), tuple(k.shape), causal,
                           None if key_mask is None else tuple(key_mask.shape)))
        return flash_attention_arrays(q, k, v, causal=causal, scale=scale, key_mask=key_mask)

    def backward(self, q, k, v, o, lse, do, *, causal=False, scale=None, key_mask=None,
                 lengths=None):
        self.calls.append(("backward",))
        return flash_backward_arrays(q, k, v, o, lse, do, causal=causal, scale=scale,
                                     key_mask=key_mask)

    def count(self, what="forward"):
        return sum(c[0] == what for c in self.calls)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The cupy backend on the strict stand-in; the kernels 'available' and counted."""
    cp, _ = strict_cupy.make_modules()
    monkeypatch.setitem(backend._cupy, "module", cp)
    monkeypatch.setitem(backend._cupy, "tried", True)
    monkeypatch.setattr(backend, "_state", {"name": "cupy", "xp": cp})
    kernels = CountingKernels()
    monkeypatch.setattr(flash_cuda, "unavailable_reason", lambda: None)
    monkeypatch.setattr(flash_cuda, "flash_attention_forward", kernels.forward)
    monkeypatch.setattr(flash_cuda, "flash_attention_backward", kernels.backward)
    monkeypatch.delenv("MINITX_FLASH", raising=False)
    return kernels


@pytest.fixture
def host(monkeypatch):
    """The NumPy backend (for references), whatever backend the suite runs on."""
    monkeypatch.setattr(backend, "_state", {"name": "numpy", "xp": np})
    monkeypatch.delenv("MINITX_FLASH", raising=False)


def qkv(nq=9, nk=None, *, hkv=2, d=8, dtype=np.float32):
    """``support.qkv`` with this file's defaults: 4 query heads over ``hkv`` KV heads, float32
    (the kernel's dtype), host arrays."""
    return support.qkv(nq, nk, h=4, hkv=hkv, d=d, dtype=dtype)


def run(fn, arrays, grad=True):
    """fn(*tensors) and, with ``grad``, the gradients of sum(out · g) — all read back to NumPy."""
    ts = [minitx.tensor(a, requires_grad=grad) for a in arrays]
    out = fn(*ts)
    if not grad:
        return [out.numpy()]
    g = np.random.default_rng(99).standard_normal(out.shape).astype(out.dtype)
    (out * minitx.tensor(g)).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in ts]


def assert_same(got, want, tol=1e-5):
    for a, b in zip(got, want):
        support.assert_close(a, b, rtol=tol, atol=tol)


# ---- the reasons ---------------------------------------------------------------------------

def test_numpy_inputs_decline_with_the_reason(host):
    q, k, v = (minitx.tensor(a) for a in qkv())
    assert "NumPy arrays" in F.why_not_flash(q, k, v, enable_gqa=True)


def test_every_call_level_reason_is_named(fake_gpu):
    q, k, v = (minitx.tensor(a) for a in qkv(hkv=4))
    assert F.why_not_flash(q, k, v) is None
    assert F.why_not_flash(q, k, v, is_causal=True) is None
    pad = np.ones((2, 1, 1, 9), bool)
    pad[1, ..., 6:] = False
    assert F.why_not_flash(q, k, v, attn_mask=pad) is None            # a key-padding mask
    assert "weights" in F.why_not_flash(q, k, v, return_weights=True)
    assert "dropout_p=0.1" in F.why_not_flash(q, k, v, dropout_p=0.1)
    assert "general attn_mask" in F.why_not_flash(q, k, v, attn_mask=np.tri(9, dtype=bool))
    assert "general attn_mask" in F.why_not_flash(q, k, v, attn_mask=np.zeros((9, 9), np.float32))
    q64, k64, v64 = (minitx.tensor(a) for a in qkv(hkv=4, dtype=np.float64))
    assert "float64" in F.why_not_flash(q64, k64, v64)
    big = [minitx.tensor(a) for a in qkv(d=160)]
    assert "160" in F.why_not_flash(*big, enable_gqa=True)


def test_a_missing_gpu_compiler_is_the_reason(fake_gpu, monkeypatch):
    monkeypatch.setattr(flash_cuda, "unavailable_reason", lambda: "NVRTC cannot be used: x")
    q, k, v = (minitx.tensor(a) for a in qkv(hkv=4))
    assert F.why_not_flash(q, k, v) == "NVRTC cannot be used: x"
    F.scaled_dot_product_attention(q, k, v)
    assert fake_gpu.count() == 0


def test_the_real_stand_in_reports_no_nvrtc(monkeypatch):
    """Without the fixture's override, the stand-in has no NVRTC: unavailable, and why."""
    cp, _ = strict_cupy.make_modules()
    monkeypatch.setitem(backend._cupy, "module", cp)
    monkeypatch.setitem(backend._cupy, "tried", True)
    reason = flash_cuda.unavailable_reason()
    assert reason is not None and "NVRTC" in reason and not flash_cuda.is_available()


# ---- MINITX_FLASH --------------------------------------------------------------------------

def test_require_raises_with_the_reason(host, monkeypatch):
    monkeypatch.setenv("MINITX_FLASH", "require")
    q, k, v = (minitx.tensor(a) for a in qkv())
    with pytest.raises(RuntimeError, match="MINITX_FLASH=require.*NumPy arrays"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises(RuntimeError, match="flash_attention: MINITX_FLASH=require"):
        F.flash_attention(q, k, v)


def test_require_raises_on_the_gpu_for_a_call_the_kernel_cannot_take(fake_gpu, monkeypatch):
    monkeypatch.setenv("MINITX_FLASH", "require")
    q, k, v = (minitx.tensor(a) for a in qkv(hkv=4))
    F.scaled_dot_product_attention(q, k, v)                            # taken: no error
    with pytest.raises(RuntimeError, match="dropout_p=0.5"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert fake_gpu.count() == 1


def test_off_never_takes_the_kernel(fake_gpu, monkeypatch):
    monkeypatch.setenv("MINITX_FLASH", "off")
    q, k, v = (minitx.tensor(a) for a in qkv(hkv=4))
    assert F.why_not_flash(q, k, v) == "MINITX_FLASH=off"
    F.scaled_dot_product_attention(q, k, v)
    F.flash_attention(q, k, v)
    assert fake_gpu.count() == 0


def test_an_unknown_policy_is_an_error(host, monkeypatch):
    monkeypatch.setenv("MINITX_FLASH", "always")
    with pytest.raises(ValueError, match="MINITX_FLASH must be one of"):
        dispatch.mode()


def test_each_decision_is_logged(fake_gpu, caplog):
    q, k, v = (minitx.tensor(a) for a in qkv(hkv=4))
    with caplog.at_level(logging.DEBUG, logger="minitx.dispatch"):
        F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(q, k, v, return_weights=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "minitx.dispatch"]
    assert lines == ["scaled_dot_product_attention: CUDA flash kernel",
                     "scaled_dot_product_attention: array code (the attention weights were "
                     "requested (the kernel never forms them))"]


# ---- the public functions and modules reach the kernel, with the same numbers -------------

@pytest.mark.parametrize("causal,nq,nk,hkv", [(False, 9, 9, 4), (True, 9, 9, 2), (True, 5, 30, 1),
                                              (False, 7, 3, 2)])
def test_sdpa_reaches_the_kernel_with_the_same_values_and_gradients(fake_gpu, monkeypatch,
                                                                    causal, nq, nk, hkv):
    arrays = qkv(nq=nq, nk=nk, hkv=hkv)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,  # noqa: E731
                                                          enable_gqa=True)
    got = run(sdpa, arrays)
    assert fake_gpu.calls[0][0] == "forward" and fake_gpu.count("backward") == 1
    assert fake_gpu.calls[0][2:5] == ((2, 4, nq, 8), (2, hkv, nk, 8), causal)
    monkeypatch.setenv("MINITX_FLASH", "off")                        # the fused array code
    assert_same(got, run(sdpa, arrays))


def test_sdpa_passes_a_key_padding_mask_to_the_kernel(fake_gpu, monkeypatch):
    arrays = qkv(hkv=4)
    allowed = np.ones((2, 1, 1, 9), bool)
    allowed[0, ..., 5:] = False
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # noqa
    got = run(sdpa, arrays)
    assert fake_gpu.calls[0][5] == (2, 9)
    monkeypatch.setenv("MINITX_FLASH", "off")
    assert_same(got, run(sdpa, arrays))


def test_flash_attention_reaches_the_kernel(fake_gpu, monkeypatch):
    arrays = qkv(nq=11, nk=11)
    fn = lambda q, k, v: F.flash_attention(q, k, v, causal=True, block_q=4, block_k=4)  # noqa
    got = run(fn, arrays)
    assert fake_gpu.count() == 1 and fake_gpu.count("backward") == 1
    monkeypatch.setenv("MINITX_FLASH", "off")
    assert_same(got, run(fn, arrays))


def test_multihead_attention_reaches_the_kernel_with_causal_and_padding(fake_gpu, monkeypatch):
    minitx.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    x = np.random.default_rng(1).standard_normal((2, 7, 16)).astype(np.float32)
    pad = np.zeros((2, 7), bool)
    pad[1, 5:] = True                                          # PyTorch polarity: True = padding

    def fn(t):
        return mha(t, t, t, key_padding_mask=pad, is_causal=True, need_weights=False)[0]
    got = run(fn, [x])
    assert fake_gpu.count() == 1 and fake_gpu.calls[0][4] is True and fake_gpu.calls[0][5]
    monkeypatch.setenv("MINITX_FLASH", "off")
    assert_same(got, run(fn, [x]))
    monkeypatch.delenv("MINITX_FLASH")
    mha(minitx.tensor(x), minitx.tensor(x), minitx.tensor(x))  # need_weights=True: array code
    assert fake_gpu.count() == 1


def test_encoder_decoder_layers_and_gpt_reach_the_kernel(fake_gpu):
    minitx.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    dec = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    x = minitx.tensor(np.random.default_rng(2).standard_normal((2, 6, 16)).astype(np.float32))
    pad = np.zeros((2, 6), bool)
    pad[0, 4:] = True
    memory = enc(x, src_key_padding_mask=pad)
    assert fake_gpu.count() == 1
    dec(x, memory, tgt_is_causal=True, memory_key_padding_mask=pad)
    assert fake_gpu.count() == 3                               # self- and cross-attention
    gpt = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16))
    gpt.eval()
    before = fake_gpu.count()
    gpt(np.array([[1, 2, 3, 4]]))
    assert fake_gpu.count() == before + 2                      # one call per block
    out = gpt.generate(np.array([[1, 2]]), max_new_tokens=3, temperature=0)
    assert out.shape == (1, 5)
    assert fake_gpu.count() == before + 2 + 2 * 3              # prompt, then one token per step
    assert {c[4] for c in fake_gpu.calls} == {True, False}


def test_gpt_logits_are_the_same_on_the_kernel_and_the_array_code(fake_gpu, monkeypatch):
    minitx.manual_seed(3)
    gpt = nn.GPT(nn.GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_embd=32))
    gpt.eval()
    idx = np.array([[1, 5, 7, 2, 3, 11]])
    logits = gpt(idx)[0].numpy()
    assert fake_gpu.count() == 2
    monkeypatch.setenv("MINITX_FLASH", "off")
    support.assert_close(gpt(idx)[0], logits, rtol=1e-5, atol=1e-5)
