"""Autograd integration of the CUDA flash kernels, proven without a GPU.

The GPU path is entered exactly as on a machine with CuPy, except for three stand-ins:

* the active backend is the strict CuPy stand-in (``tests/strict_cupy.py``): tensors hold
  "device" arrays that refuse any host mix, and the one dispatcher (``minitx/ops/dispatch.py``)
  decides on its own — dtype, head dims, masks, weights, dropout — whether the kernel runs;
* ``flash_cuda.unavailable_reason`` returns None (a GPU with NVRTC is "there");
* ``flash_cuda.flash_attention_forward`` / ``flash_attention_backward`` are replaced by
  ``EmulatedFlashCuda`` methods that run the *real* public functions in a forked child (the
  harness' timeout machinery, ``run_isolated``) where only the innermost CuPy pieces are swapped
  for the CPU emulation: ``_require_gpu`` -> numpy, ``_cupy_launch`` -> the ctypes launch of the
  emulated ``flash_attn.cu`` (checking that every launched kernel is one of the instantiations
  the real launcher would have compiled into that module), ``_device_smem_limit`` -> A100's.

So validation, padding (D and Dv), masks, launch plans, the four kernels, the GQA group sums
and the casts all run for real; the autograd node (``dispatch.FlashKernelFunction``) calls them
with the arguments it would pass on a GPU. The device arrays cross to the host explicitly at
the emulation's boundary (``.get()``, as data would cross a PCIe bus) and come back as device
arrays. Results and gradients are compared with the same calls on the plain NumPy path. The same
path runs under ``MINITX_FLASH_KERNEL=naive`` (the naive kernels, named in the launcher's log) and
with the choices the dispatcher must refuse (float16 under naive, a mistyped value).
"""
import logging
import re
from contextlib import contextmanager

import numpy as np
import pytest

import cuda_emu_harness as H
import minitx
import minitx.functional as F
import strict_cupy
from minitx import backend
from minitx.backend import flash_cuda as fc, to_host

TIMEOUT = 120.0
_REAL = {name: getattr(fc, name) for name in ("flash_attention_forward", "flash_attention_backward")}


class EmulatedFlashCuda:
    """Drop-in for ``flash_cuda.flash_attention_forward/_backward`` running the emulation."""

    def __init__(self, lib_path):
        self.lib_path = lib_path
        self.calls = []
        self.logged = []

    def _run(self, which, args, kwargs):
        real = _REAL[which]

        def work(launch, lib):          # in the forked child: patching flash_cuda is local
            launched, logged = [], []

            def cupy_launch(dtype_name, D, causal, fam=None):
                module = set(fc.module_names(fam or fc.family(dtype_name), D, causal))

                def checked(plan, a):
                    assert plan.name in module, (plan.name, sorted(module))
                    launched.append(plan.name)
                    launch(plan, a)
                return checked

            class Keep(logging.Handler):          # the launcher's DEBUG line names the kernel
                def emit(self, record):
                    logged.append(record.getMessage())

            fc.log.addHandler(Keep())
            fc.log.setLevel(logging.DEBUG)
            fc._require_gpu = lambda q: np
            fc._cupy_launch = cupy_launch
            fc._device_smem_limit = lambda: H.SMEM_LIMIT
            return real(*args, **kwargs), launched, logged

        out, launched, logged = H.run_isolated(self.lib_path, work, timeout=TIMEOUT)
        self.logged.extend(logged)
        return out, launched

    def _record(self, which, q, k, v, kwargs, launched):
        km = kwargs.get("key_mask")
        self.calls.append(dict(fn=which, q=q.shape, k=k.shape, v=v.shape, dtype=str(q.dtype),
                               causal=kwargs.get("causal"), scale=kwargs.get("scale"),
                               key_mask=None if km is None else (km.shape, str(km.dtype)),
                               launched=launched))

    @staticmethod
    def _to_host(args, kwargs):
        """Device arrays cross to the host for the emulation (and report that they did)."""
        cp = strict_cupy.make_modules()[0]
        on_device = any(isinstance(a, cp.ndarray) for a in args)
        move = lambda a: to_host(a) if isinstance(a, cp.ndarray) else a  # noqa: E731
        return ([move(a) for a in args], {k: move(v) for k, v in kwargs.items()},
                (lambda a: cp.asarray(a)) if on_device else (lambda a: a))

    def flash_attention_forward(self, q, k, v, **kwargs):
        args, kw, back = self._to_host((q, k, v), kwargs)
        (o, lse), launched = self._run("flash_attention_forward", tuple(args), kw)
        self._record("forward", *args, kw, launched)
        return back(o), back(lse)

    def flash_attention_backward(self, q, k, v, o, lse, do, **kwargs):
        args, kw, back = self._to_host((q, k, v, o, lse, do), kwargs)
        grads, launched = self._run("flash_attention_backward", tuple(args), kw)
        self._record("backward", *args[:3], kw, launched)
        return tuple(back(g) for g in grads)

    def count(self, fn):
        return sum(c["fn"] == fn for c in self.calls)


@pytest.fixture
def emu(emu_lib):
    return EmulatedFlashCuda(emu_lib)


@contextmanager
def gpu_path(emu, kernel=None):
    """Inside: the cupy backend is the strict stand-in and the kernels are "available" (the
    emulation); new tensors are device arrays, as on a GPU. ``kernel``: MINITX_FLASH_KERNEL
    (None: unset, the tiled default, whatever the shell running the tests has set)."""
    cp = strict_cupy.make_modules()[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(backend._cupy, "module", cp)
        mp.setitem(backend._cupy, "tried", True)
        mp.setattr(backend, "_state", {"name": "cupy", "xp": cp})
        mp.setenv("MINITX_FLASH", "auto")
        if kernel is None:
            mp.delenv("MINITX_FLASH_KERNEL", raising=False)
        else:
            mp.setenv("MINITX_FLASH_KERNEL", kernel)
        mp.setattr(fc, "unavailable_reason", lambda: None)
        mp.setattr(fc, "flash_attention_forward", emu.flash_attention_forward)
        mp.setattr(fc, "flash_attention_backward", emu.flash_attention_backward)
        yield


@contextmanager
def host_path():
    """Inside: the NumPy backend and the array code (the references)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "_state", {"name": "numpy", "xp": np})
        mp.setenv("MINITX_FLASH", "off")
        yield


def _close(name, got, ref, rel=2e-5):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64)).max(initial=0.0)
    tol = rel * max(np.abs(ref).max(initial=0.0), 1.0)
    assert err <= tol, f"{name}: max error {err:.3e} > {tol:.3e}"


def _run_graph(fn, arrays, upstream):
    """out = fn(*tensors); out.backward(upstream); returns (out, grads) as host arrays."""
    ts = [minitx.tensor(x, requires_grad=True) for x in arrays]
    out = fn(*ts)
    out.backward(minitx.tensor(upstream))
    return out.numpy(), [t.grad.numpy() for t in ts]


def _reference(fn, arrays, upstream):
    with host_path():
        return _run_graph(fn, arrays, upstream)


def _compare(fn, arrays, upstream, emu, rel=2e-5, kernel=None):
    ref_out, ref_grads = _reference(fn, arrays, upstream)
    n0 = len(emu.calls)
    with gpu_path(emu, kernel):
        out, grads = _run_graph(fn, arrays, upstream)
    assert [c["fn"] for c in emu.calls[n0:]] == ["forward", "backward"], emu.calls[n0:]
    assert out.dtype == ref_out.dtype
    _close("out", out, ref_out, rel)
    for name, g, r, x in zip("qkv", grads, ref_grads, arrays):
        assert g.dtype == x.dtype and g.shape == x.shape, (name, g.dtype, g.shape)
        _close(f"d{name}", g, r, rel)
    return out, grads


def _qkv(B, Hh, Hkv, Nq, Nk, D, Dv=None, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    Dv = D if Dv is None else Dv
    q = rng.standard_normal((B, Hh, Nq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, Dv)).astype(dtype)
    do = rng.standard_normal((B, Hh, Nq, Dv)).astype(dtype)
    return q, k, v, do


# ------------------------------------------------------------------ flash_attention (ops/flash.py)
# (B, H, Hkv, Nq, Nk, D, Dv, causal, masking)
FLASH_CASES = [
    (1, 2, 2, 1, 1, 32, 32, False, None),
    (2, 2, 2, 33, 33, 32, 32, True, "mask"),          # batch 1 of the mask keeps no key
    (2, 4, 2, 70, 70, 32, 32, False, "mask"),         # GQA: the kernel reads shared heads
    (1, 4, 1, 70, 70, 48, 48, True, None),            # MQA, D padded 48 -> 64
    (1, 2, 2, 33, 70, 32, 16, True, None),            # Nq < Nk, bottom-right causal, Dv < D
]


def _flash_ids(c):
    B, Hh, Hkv, Nq, Nk, D, Dv, causal, masking = c
    return f"B{B}H{Hh}kv{Hkv}-q{Nq}k{Nk}-D{D}v{Dv}-{'causal' if causal else 'full'}-{masking}"


@pytest.mark.parametrize("case", FLASH_CASES, ids=_flash_ids)
def test_flash_attention_through_the_kernel_path(emu, case):
    B, Hh, Hkv, Nq, Nk, D, Dv, causal, masking = case
    q, k, v, do = _qkv(B, Hh, Hkv, Nq, Nk, D, Dv)
    key_mask = None
    if masking == "mask":
        key_mask = np.random.default_rng(1).random((B, Nk)) < 0.7
        key_mask[0, -1] = True
        key_mask[1] = False                        # every row of batch 1 fully masked

    def fn(qt, kt, vt):
        return F.flash_attention(qt, kt, vt, causal=causal, key_mask=key_mask,
                                     block_q=16, block_k=16)

    out, grads = _compare(fn, (q, k, v), do, emu)
    fwd, bwd = emu.calls
    assert fwd["causal"] == bwd["causal"] == causal
    assert fwd["scale"] == bwd["scale"] == pytest.approx(1 / np.sqrt(D))
    assert fwd["key_mask"] == bwd["key_mask"] == (None if key_mask is None else ((B, Nk), "bool"))
    assert fwd["v"] == (B, Hkv, Nk, Dv)            # GQA/MQA heads reach the kernel unexpanded
    Dp = fc.compiled_head_dim(q, v)
    assert fwd["launched"] == [fc.kernel_name("fwd", np.float32, Dp, causal)]
    assert bwd["launched"] == [fc.kernel_name(kind, np.float32, Dp, causal)
                               for kind in ("bwd_dot", "bwd_dkdv", "bwd_dq")]
    if masking == "mask":                          # fully masked rows: zeros, never NaN
        assert np.all(out[1] == 0)
        assert all(np.all(g[1] == 0) for g in grads)


def test_flash_attention_float16_through_the_kernel_path(emu):
    """fp16 dispatches too; compared with the NumPy path run in float32 on the same fp16 values."""
    q, k, v, do = _qkv(1, 2, 2, 33, 33, 32, dtype=np.float16, seed=3)

    def fn(qt, kt, vt):
        return F.flash_attention(qt, kt, vt, causal=True)

    ref_out, ref_grads = _reference(fn, [x.astype(np.float32) for x in (q, k, v)],
                                    do.astype(np.float32))
    with gpu_path(emu):
        out, grads = _run_graph(fn, (q, k, v), do)
    assert [c["fn"] for c in emu.calls] == ["forward", "backward"]
    assert out.dtype == np.float16 and all(g.dtype == np.float16 for g in grads)
    _close("out", out, ref_out, rel=2e-3)          # a few fp16 ulps of the output scale
    for name, g, r in zip("qkv", grads, ref_grads):
        _close(f"d{name}", g, r, rel=4e-3)


def test_flash_attention_keeps_the_numpy_path_where_the_kernels_do_not_apply(emu):
    q, k, v, do = _qkv(1, 2, 2, 5, 5, 16)
    with gpu_path(emu):
        # float64 (gradchecks): the tiled code, written against xp, runs instead
        t = [minitx.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v)]
        F.flash_attention(*t).sum().backward()
        # D > 128
        q2, k2, v2, _ = _qkv(1, 1, 1, 3, 3, 136)
        F.flash_attention(*[minitx.tensor(x) for x in (q2, k2, v2)])
    assert emu.calls == []


def test_flash_attention_large_dv_keeps_the_numpy_path(emu):
    q, k, v, _ = _qkv(1, 1, 1, 3, 3, 16, Dv=136)
    with host_path():
        ref = F.flash_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    with gpu_path(emu):
        out = F.flash_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    assert emu.calls == [] and out.shape == (1, 1, 3, 136)
    _close("out", out, ref)                        # and the NumPy path's values, not just shape


# ------------------------------------------------------------------ SDPA (ops/sdpa.py)
# (shape of q as (lead..., H, N, D) pieces: lead, H, Hkv, Nq, Nk, D, Dv, is_causal)
SDPA_CASES = [
    ((2,), 2, 2, 1, 1, 32, 32, False),
    ((2,), 4, 2, 33, 33, 32, 32, True),               # GQA: the kernel sums the group grads
    ((1,), 2, 2, 70, 70, 64, 64, False),
    ((), 2, 1, 33, 70, 40, 40, True),                 # 3-d inputs, MQA, Nq < Nk, D 40 -> 64
    ((2, 1), 2, 2, 70, 33, 32, 32, True),             # 5-d inputs, Nq > Nk: leading rows empty
]


def _sdpa_ids(c):
    lead, Hh, Hkv, Nq, Nk, D, Dv, causal = c
    return (f"lead{'x'.join(map(str, lead)) or '-'}H{Hh}kv{Hkv}-q{Nq}k{Nk}-D{D}v{Dv}-"
            f"{'causal' if causal else 'full'}")


def _sdpa_arrays(lead, Hh, Hkv, Nq, Nk, D, Dv, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    shape = lambda h, n, d: tuple(lead) + (h, n, d)  # noqa: E731
    return (rng.standard_normal(shape(Hh, Nq, D)).astype(dtype),
            rng.standard_normal(shape(Hkv, Nk, D)).astype(dtype),
            rng.standard_normal(shape(Hkv, Nk, Dv)).astype(dtype),
            rng.standard_normal(shape(Hh, Nq, Dv)).astype(dtype))


@pytest.mark.parametrize("case", SDPA_CASES, ids=_sdpa_ids)
def test_sdpa_dispatches_to_the_kernel(emu, case):
    lead, Hh, Hkv, Nq, Nk, D, Dv, causal = case
    q, k, v, do = _sdpa_arrays(*case[:-1])

    def fn(qt, kt, vt):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                              enable_gqa=Hh != Hkv)

    out, grads = _compare(fn, (q, k, v), do, emu)
    fwd, bwd = emu.calls
    B = int(np.prod(lead)) if lead else 1
    assert fwd["q"] == (B, Hh, Nq, D) and fwd["k"] == (B, Hkv, Nk, D)   # GQA heads not repeated
    assert fwd["v"] == (B, Hkv, Nk, Dv)
    assert fwd["causal"] is bwd["causal"] is causal and fwd["key_mask"] is None
    if Nq > Nk and causal:                         # rows that see no key: zeros, never NaN
        assert np.all(out[..., : Nq - Nk, :] == 0)
        assert np.all(grads[0][..., : Nq - Nk, :] == 0)


def _no_dispatch_cases():
    rng = np.random.default_rng(7)
    bool_mask = rng.random((2, 2, 7, 9)) < 0.8              # per query: not a key-padding mask
    bias = rng.standard_normal((2, 2, 7, 9)).astype(np.float32)
    return {
        "return_weights": dict(return_weights=True),
        "bool_general_mask": dict(attn_mask=bool_mask),
        "float_bias": dict(attn_mask=bias),
        "dropout": dict(dropout_p=0.25),
        "float64": dict(dtype=np.float64),
    }


@pytest.mark.parametrize("name", list(_no_dispatch_cases()))
def test_sdpa_does_not_dispatch(emu, name):
    kw = dict(_no_dispatch_cases()[name])
    dtype = kw.pop("dtype", np.float32)
    q, k, v, do = _sdpa_arrays((2,), 2, 2, 7, 9, 16, 16, dtype=dtype)

    def fn(qt, kt, vt):
        minitx.manual_seed(0)
        res = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kw)
        return res[0] if kw.get("return_weights") else res

    ref_out, ref_grads = _reference(fn, (q, k, v), do)
    with gpu_path(emu):
        out, grads = _run_graph(fn, (q, k, v), do)
    assert emu.calls == []
    np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)


def test_sdpa_with_a_key_padding_mask_dispatches_with_the_mask(emu):
    """A bool (B, 1, 1, Nk) attn_mask is key padding: it reaches the kernel as key_mask."""
    q, k, v, do = _sdpa_arrays((2,), 2, 2, 7, 9, 16, 16)
    allowed = np.random.default_rng(5).random((2, 1, 1, 9)) < 0.7
    allowed[1] = False                                      # batch 1: every row fully masked

    def fn(qt, kt, vt):
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allowed, is_causal=True)

    out, grads = _compare(fn, (q, k, v), do, emu)
    assert emu.calls[0]["key_mask"] == ((2, 9), "bool") and emu.calls[0]["causal"] is True
    assert np.all(out[1] == 0) and all(np.all(g[1] == 0) for g in grads)


def test_sdpa_without_grad_runs_only_the_forward(emu):
    q, k, v, _ = _sdpa_arrays((1,), 2, 2, 33, 33, 32, 32)
    with host_path():
        ref = F.scaled_dot_product_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    with gpu_path(emu):
        out = F.scaled_dot_product_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    assert [c["fn"] for c in emu.calls] == ["forward"]
    _close("out", out, ref)


def test_sdpa_large_head_dim_keeps_the_numpy_path(emu):
    q, k, v, _ = _sdpa_arrays((1,), 1, 1, 3, 3, 136, 136)
    with host_path():
        ref = F.scaled_dot_product_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    with gpu_path(emu):
        out = F.scaled_dot_product_attention(*[minitx.tensor(x) for x in (q, k, v)]).numpy()
    assert emu.calls == [] and out.shape == (1, 1, 3, 136)
    _close("out", out, ref)                        # and the NumPy path's values, not just shape


def test_sdpa_value_dim_other_than_query_dim(emu):
    """Dv != D: flash_cuda takes it (pads to the compiled dim >= max(D, Dv)), and the results
    equal the NumPy path."""
    q, k, v, do = _sdpa_arrays((2,), 4, 2, 33, 40, 40, 24)

    def fn(qt, kt, vt):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)

    ref_out, ref_grads = _reference(fn, (q, k, v), do)
    with gpu_path(emu):
        out, grads = _run_graph(fn, (q, k, v), do)
    assert [c["fn"] for c in emu.calls] == ["forward", "backward"]
    _close("out", out, ref_out)
    for name, g, r in zip("qkv", grads, ref_grads):
        _close(f"d{name}", g, r)


# ------------------------------------------------------------------ the public contract
def test_supports_matches_what_the_kernels_take():
    z = lambda *s, dt=np.float32: np.zeros(s, dt)  # noqa: E731
    assert fc.supports(z(2, 4, 5, 32), z(2, 2, 7, 32), z(2, 2, 7, 32))
    assert fc.supports(z(2, 4, 5, 32), z(2, 2, 7, 32), z(2, 2, 7, 128))       # Dv != D
    assert fc.supports(z(1, 1, 5, 8, dt=np.float16), z(1, 1, 7, 8, dt=np.float16),
                       z(1, 1, 7, 8, dt=np.float16), key_mask=np.ones((1, 7), bool))
    assert not fc.supports(z(1, 1, 5, 8, dt=np.float64), z(1, 1, 7, 8, dt=np.float64),
                           z(1, 1, 7, 8, dt=np.float64))
    assert not fc.supports(z(1, 1, 5, 136), z(1, 1, 7, 136), z(1, 1, 7, 136))  # D > 128
    assert not fc.supports(z(1, 1, 5, 32), z(1, 1, 7, 32), z(1, 1, 7, 136))    # Dv > 128
    assert not fc.supports(z(1, 3, 5, 32), z(1, 2, 7, 32), z(1, 2, 7, 32))     # 2 does not divide 3
    assert not fc.supports(z(1, 1, 5, 32), z(1, 1, 7, 32), z(1, 1, 7, 32),
                           key_mask=np.ones((1, 6), bool))
    assert fc.compiled_head_dim(z(1, 1, 1, 40), z(1, 1, 1, 24)) == 64
    assert fc.compiled_head_dim(z(1, 1, 1, 16), z(1, 1, 1, 96)) == 128


def test_public_functions_take_views_numpy_masks_and_cast_the_gradient(emu):
    """Non-contiguous q/k/v views, an int 0/1 key mask, and an fp32 upstream gradient for an
    fp16 graph are accepted by the public functions (what the dispatchers may hand them)."""
    rng = np.random.default_rng(11)
    base = rng.standard_normal((1, 33, 2, 32)).astype(np.float32)   # (B, N, H, D) layout
    q = k = v = np.swapaxes(base, 1, 2)                             # (B, H, N, D) views
    assert not q.flags.c_contiguous
    km = (rng.random((1, 33)) < 0.8).astype(np.int64)
    o, lse = emu.flash_attention_forward(q, k, v, causal=False, scale=None, key_mask=km)
    ref_o, ref_lse, _ = H.ref_forward(q, k, v, key_mask=km.astype(bool))
    _close("o", o, ref_o, 1e-5)
    _close("lse", lse, ref_lse, 1e-5)
    assert o.shape == (1, 2, 33, 32) and o.dtype == np.float32 and lse.dtype == np.float32
    h = [x.astype(np.float16) for x in (q, k, v, o)]
    do32 = rng.standard_normal(o.shape).astype(np.float32)
    dq, dk, dv = emu.flash_attention_backward(*h, lse, do32, causal=False, scale=None, key_mask=km)
    assert dq.dtype == dk.dtype == dv.dtype == np.float16


def test_public_functions_with_value_dim_larger_than_query_dim(emu):
    """D = 16, Dv = 40 (both padded to 64), GQA, causal with Nq < Nk, vs the float64 reference."""
    q, k, v, do = _qkv(2, 4, 2, 20, 45, 16, Dv=40, seed=5)
    o, lse = emu.flash_attention_forward(q, k, v, causal=True, scale=0.3)
    ref_o, ref_lse, _ = H.ref_forward(q, k, v, causal=True, scale=0.3)
    assert o.shape == (2, 4, 20, 40)
    _close("o", o, ref_o, 1e-5)
    _close("lse", lse, ref_lse, 1e-5)
    dq, dk, dv = emu.flash_attention_backward(q, k, v, o, lse, do, causal=True, scale=0.3)
    for name, g, r in zip("qkv", (dq, dk, dv),
                          H.ref_backward(q, k, v, o, do, causal=True, scale=0.3)):
        assert g.shape == r.shape and g.dtype == np.float32
        _close(f"d{name}", g, r, 1e-5)
    assert [c["launched"][0] for c in emu.calls] == ["flash_fwd_simt<64, true>",
                                                     "flash_bwd_dot<float>"]


# ------------------------------------------------------------------ MINITX_FLASH_KERNEL=naive / tf32
# (B, H, Hkv, Nq, Nk, D, Dv, causal, masking, entry)
NAIVE_CASES = [
    (2, 4, 2, 70, 70, 32, 32, True, "mask", "flash"),       # GQA; batch 1 fully masked
    (1, 4, 1, 33, 140, 48, 24, True, None, "sdpa"),         # MQA, Nq < Nk, Dv < D, padded D
    (2, 2, 2, 140, 33, 64, 64, True, None, "sdpa"),         # Nq > Nk: leading rows see no key
]


# every case for the naive kernels; one for the 3xTF32 ones (Nq > Nk through sdpa: the autograd
# node is the same, and test_cuda_tf32 checks their values over a grid)
@pytest.mark.parametrize("case,kernel", [(c, "naive") for c in NAIVE_CASES]
                         + [(NAIVE_CASES[2], "tf32")],
                         ids=lambda c: "-".join(map(str, c)) if isinstance(c, tuple) else c)
def test_fp32_kernel_choice_through_the_autograd_path(emu, case, kernel):
    """MINITX_FLASH_KERNEL=naive or tf32: the autograd node runs that family's forward, then its
    backward on that forward's own o and lse; values and gradients equal the NumPy path, and
    the launcher's log names the family's kernels."""
    B, Hh, Hkv, Nq, Nk, D, Dv, causal, masking, entry = case
    q, k, v, do = _qkv(B, Hh, Hkv, Nq, Nk, D, Dv, seed=4)
    key_mask = None
    if masking == "mask":
        key_mask = np.random.default_rng(2).random((B, Nk)) < 0.7
        key_mask[0, -1] = True
        key_mask[1] = False

    def fn(qt, kt, vt):
        if entry == "flash":
            return F.flash_attention(qt, kt, vt, causal=causal, key_mask=key_mask)
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)

    out, grads = _compare(fn, (q, k, v), do, emu, kernel=kernel)
    Dp = fc.compiled_head_dim(q, v)
    c = "true" if causal else "false"
    fwd, bwd = emu.calls
    assert fwd["launched"] == [f"flash_fwd_{kernel}<{Dp}, {c}>"]
    assert bwd["launched"] == ["flash_bwd_dot<float>", f"flash_bwd_dkdv_{kernel}<{Dp}, {c}>",
                               f"flash_bwd_dq_{kernel}<{Dp}, {c}>"]
    assert emu.logged == [
        f"forward: {kernel} (MINITX_FLASH_KERNEL={kernel}): flash_fwd_{kernel}<{Dp}, {c}>",
        f"backward: {kernel} (MINITX_FLASH_KERNEL={kernel}): flash_bwd_dot<float>, "
        f"flash_bwd_dkdv_{kernel}<{Dp}, {c}>, flash_bwd_dq_{kernel}<{Dp}, {c}>"]
    if masking == "mask":                          # fully masked rows: zeros, never NaN
        assert np.all(out[1] == 0) and all(np.all(g[1] == 0) for g in grads)
    if Nq > Nk:
        assert np.all(out[..., : Nq - Nk, :] == 0) and np.all(grads[0][..., : Nq - Nk, :] == 0)


def test_the_default_kernel_is_tiled_and_logged(emu):
    q, k, v, do = _qkv(1, 2, 2, 33, 33, 32)
    _compare(lambda qt, kt, vt: F.flash_attention(qt, kt, vt, causal=True), (q, k, v), do, emu)
    assert emu.calls[0]["launched"] == ["flash_fwd_simt<32, true>"]
    assert emu.logged[0] == "forward: simt (MINITX_FLASH_KERNEL=tiled): flash_fwd_simt<32, true>"


def test_naive_declines_float16_with_the_reason(emu, monkeypatch):
    """float16 under MINITX_FLASH_KERNEL=naive: why_not_flash says so, the array code runs
    (auto), and MINITX_FLASH=require raises with the same reason."""
    q, k, v, _ = _qkv(1, 2, 2, 9, 9, 32, dtype=np.float16)
    reason = "MINITX_FLASH_KERNEL=naive takes float32 only (got float16)"
    with gpu_path(emu, kernel="naive"):
        ts = [minitx.tensor(x) for x in (q, k, v)]
        assert F.why_not_flash(*ts) == reason
        out = F.scaled_dot_product_attention(*ts, is_causal=True)
        assert out.dtype == np.float16
        monkeypatch.setenv("MINITX_FLASH", "require")
        with pytest.raises(RuntimeError, match=re.escape(reason)):
            F.scaled_dot_product_attention(*ts)
    assert emu.calls == []
    with gpu_path(emu, kernel="naive"):                   # float32: taken
        assert F.why_not_flash(*[minitx.tensor(x.astype(np.float32)) for x in (q, k, v)]) is None


def test_an_unknown_kernel_choice_is_an_error_on_every_path(emu, monkeypatch):
    """A mistyped MINITX_FLASH_KERNEL raises (naming the variable, the values and the given
    one) on the GPU path and on the CPU path alike, and under MINITX_FLASH=off: never silent."""
    q, k, v, _ = _qkv(1, 2, 2, 9, 9, 32)
    msg = (r"MINITX_FLASH_KERNEL must be one of \('tiled', 'naive', 'tf32', 'tc_bm128', "
           r"'tc_kvreg', 'tc_onepass'\), got 'Naiev'")
    with gpu_path(emu, kernel="Naiev"):
        ts = [minitx.tensor(x) for x in (q, k, v)]
        with pytest.raises(ValueError, match=msg):
            F.why_not_flash(*ts)
        with pytest.raises(ValueError, match=msg):
            F.scaled_dot_product_attention(*ts)
    with host_path():
        monkeypatch.setenv("MINITX_FLASH_KERNEL", "Naiev")
        ts = [minitx.tensor(x) for x in (q, k, v)]
        with pytest.raises(ValueError, match=msg):
            F.flash_attention(*ts)
        with pytest.raises(ValueError, match=msg):
            F.why_not_flash(*ts)                          # under MINITX_FLASH=off too
    assert emu.calls == []
