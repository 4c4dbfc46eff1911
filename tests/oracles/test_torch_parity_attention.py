"""PyTorch parity (float32, max abs diff ≤ 1e-5): scaled_dot_product_attention,
nn.MultiheadAttention loaded from torch's state dict, and the Transformer layers.

Two deliberate differences are kept out of the comparison:
- causal masks with Nq ≠ Nk: minitx aligns bottom-right, torch's ``is_causal`` top-left, so
  torch gets the bottom-right mask explicitly;
- fully masked rows: minitx gives zeros, torch NaN; the masks here leave a key in every row.
"""
import numpy as np
import pytest

import minitx
import minitx.nn as nn
from minitx.attention import causal_pattern, scaled_dot_product_attention as sdpa
from support import tensor, to_host, need

torch = need("torch")
ATOL = 1e-5


def pair(a, grad=True):
    """The same float32 data as a minitx Tensor and a torch tensor."""
    a = np.asarray(a, dtype=np.float32)
    return tensor(a, dtype=None, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def close(mine, theirs, atol=ATOL):
    """Same shape and max |mine − theirs| ≤ atol (minitx Tensors/arrays, torch tensors)."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else theirs
    mine = to_host(mine)
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() <= atol, np.abs(mine - theirs).max()


def load_from_torch(mine, theirs):
    mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return mine


# ---- scaled_dot_product_attention --------------------------------------------------------

CASES = {
    "plain": dict(h=4, hkv=4, nq=6, nk=6),
    "bool_mask": dict(h=2, hkv=2, nq=5, nk=7, mask="bool"),
    "float_mask": dict(h=2, hkv=2, nq=5, nk=7, mask="float"),
    "causal": dict(h=2, hkv=2, nq=6, nk=6, causal=True),
    "causal_nq_ne_nk": dict(h=2, hkv=2, nq=3, nk=7, causal=True),
    "gqa": dict(h=6, hkv=2, nq=5, nk=5, gqa=True),
    "gqa_causal_mask": dict(h=4, hkv=1, nq=5, nk=5, gqa=True, mask="bool_head"),
    "scale": dict(h=2, hkv=2, nq=4, nk=9, scale=0.123),
    "3d": dict(h=None, hkv=None, nq=4, nk=5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_matches_torch(rng, name):
    c = CASES[name]
    b, d, dv = 2, 8, 5
    lead_q = (b,) if c["h"] is None else (b, c["h"])
    lead_k = (b,) if c["hkv"] is None else (b, c["hkv"])
    q, tq = pair(rng.standard_normal(lead_q + (c["nq"], d)))
    k, tk = pair(rng.standard_normal(lead_k + (c["nk"], d)))
    v, tv = pair(rng.standard_normal(lead_k + (c["nk"], dv)))
    mask = torch_mask = None
    if c.get("mask") in ("bool", "bool_head"):
        shape = (b, 1, c["nq"], c["nk"]) if c["mask"] == "bool" else (c["h"], c["nq"], c["nk"])
        mask = rng.random(shape) > 0.4
        mask[..., 0] = True                                     # no fully masked row
        torch_mask = torch.tensor(mask)
    elif c.get("mask") == "float":
        mask = rng.standard_normal((c["nq"], c["nk"])).astype(np.float32)
        torch_mask = torch.tensor(mask)
    causal = c.get("causal", False)
    torch_causal = causal
    if causal and c["nq"] != c["nk"]:                           # torch aligns top-left
        torch_mask, torch_causal = torch.tensor(causal_pattern(c["nq"], c["nk"])), False
    kw = dict(scale=c.get("scale"), enable_gqa=c.get("gqa", False))
    out = sdpa(q, k, v, attn_mask=mask, is_causal=causal, **kw)
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=torch_mask, is_causal=torch_causal, **kw)
    close(out, ref)
    g = rng.standard_normal(ref.shape).astype(np.float32)
    out.backward(minitx.tensor(g))
    ref.backward(torch.tensor(g))
    for mine, theirs in ((q, tq), (k, tk), (v, tv)):
        close(mine.grad, theirs.grad)


def test_sdpa_weights_match_torch_softmax(rng):
    q, tq = pair(rng.standard_normal((2, 3, 4, 8)))
    k, tk = pair(rng.standard_normal((2, 3, 6, 8)))
    _, w = sdpa(q, k, k, return_weights=True)
    ref = torch.softmax(tq @ tk.transpose(-1, -2) / np.sqrt(8), dim=-1)
    close(w, ref)


# ---- MultiheadAttention ------------------------------------------------------------------

MHA_CASES = {
    "self": dict(),
    "batch_first": dict(batch_first=True),
    "kdim_vdim": dict(kdim=6, vdim=3, s=7),
    "kdim_vdim_bf": dict(kdim=6, vdim=3, s=7, batch_first=True),
    "padding": dict(kpm="bool", s=7),
    "padding_float": dict(kpm="float", s=7),
    "attn_mask_bool": dict(am="bool"),
    "attn_mask_float": dict(am="float", batch_first=True),
    "attn_mask_3d_and_padding": dict(am="3d", kpm="bool", s=7),
    "per_head_weights": dict(average=False, am="bool", kpm="bool"),
    "no_bias": dict(bias=False),
    "unbatched": dict(unbatched=True, am="bool"),
}


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_mha_matches_torch(rng, name):
    c = MHA_CASES[name]
    e, h, n, L = 8, 2, 3, 5
    s = c.get("s", L)
    kdim, vdim, bf = c.get("kdim"), c.get("vdim"), c.get("batch_first", False)
    theirs = torch.nn.MultiheadAttention(e, h, bias=c.get("bias", True), kdim=kdim, vdim=vdim,
                                         batch_first=bf)
    mine = load_from_torch(nn.MultiheadAttention(e, h, bias=c.get("bias", True), kdim=kdim,
                                                 vdim=vdim, batch_first=bf), theirs)
    assert set(mine.state_dict()) == set(theirs.state_dict())

    def shape(length, dim):
        if c.get("unbatched"):
            return (length, dim)
        return (n, length, dim) if bf else (length, n, dim)
    same = kdim is None and s == L
    q, tq = pair(rng.standard_normal(shape(L, e)))
    if same:
        k, tk, v, tv = q, tq, q, tq                             # self-attention: query is key
    else:
        k, tk = pair(rng.standard_normal(shape(s, kdim or e)))
        v, tv = pair(rng.standard_normal(shape(s, vdim or e)))
    kw, tkw = {}, {}
    if c.get("kpm"):
        pad = np.zeros((n, s), bool)
        pad[0, -2:] = pad[2, -1] = True
        kpm = pad if c["kpm"] == "bool" else np.where(pad, -np.inf, 0.0).astype(np.float32)
        kw["key_padding_mask"], tkw["key_padding_mask"] = kpm, torch.tensor(kpm)
    if c.get("am"):
        am = rng.random((n * h, L, s) if c["am"] == "3d" else (L, s)) < 0.3
        am[..., 0] = False                                      # every row keeps key 0
        if c["am"] == "float":
            am = np.where(am, -np.inf, rng.standard_normal(am.shape)).astype(np.float32)
        kw["attn_mask"], tkw["attn_mask"] = am, torch.tensor(am)
    avg = c.get("average", True)
    out, w = mine(q, k, v, average_attn_weights=avg, **kw)
    tout, tw = theirs(tq, tk, tv, average_attn_weights=avg, **tkw)
    close(out, tout)
    close(w, tw)
    g = rng.standard_normal(tout.shape).astype(np.float32)
    (out * minitx.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    for mine_t, theirs_t in ((q, tq), (k, tk), (v, tv)):
        close(mine_t.grad, theirs_t.grad)
    mine_params = dict(mine.named_parameters())
    for key, p in theirs.named_parameters():
        close(mine_params[key].grad, p.grad)


def test_mha_need_weights_false_matches(rng):
    theirs = torch.nn.MultiheadAttention(8, 4, batch_first=True)
    mine = load_from_torch(nn.MultiheadAttention(8, 4, batch_first=True), theirs)
    x, tx = pair(rng.standard_normal((2, 6, 8)))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(6)
    out, w = mine(x, x, x, need_weights=False, attn_mask=mask.numpy(), is_causal=True)
    tout, _ = theirs(tx, tx, tx, need_weights=False, attn_mask=mask, is_causal=True)
    assert w is None
    close(out, tout)


# ---- Transformer layers ------------------------------------------------------------------

LAYER_CASES = [(nf, act, bf) for nf in (False, True) for act in ("relu", "gelu")
               for bf in (False, True)]


@pytest.mark.parametrize("norm_first,activation,batch_first", LAYER_CASES)
def test_encoder_layer_matches_torch(rng, norm_first, activation, batch_first):
    e, h, f, n, L = 8, 2, 16, 3, 5
    theirs = torch.nn.TransformerEncoderLayer(e, h, f, dropout=0.0, activation=activation,
                                              norm_first=norm_first, batch_first=batch_first)
    mine = nn.TransformerEncoderLayer(e, h, f, dropout=0.0, activation=activation,
                                      norm_first=norm_first, batch_first=batch_first)
    load_from_torch(mine, theirs)
    assert set(mine.state_dict()) == set(theirs.state_dict())
    theirs.eval(), mine.eval()
    x, tx = pair(rng.standard_normal((n, L, e) if batch_first else (L, n, e)))
    pad = np.zeros((n, L), bool)
    pad[1, -2:] = True
    mask = rng.random((L, L)) < 0.3
    mask[:, 0] = False
    out = mine(x, src_mask=mask, src_key_padding_mask=pad)
    tout = theirs(tx, src_mask=torch.tensor(mask), src_key_padding_mask=torch.tensor(pad))
    close(out, tout)
    g = rng.standard_normal(tout.shape).astype(np.float32)
    (out * minitx.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    close(x.grad, tx.grad)
    params = dict(mine.named_parameters())
    for key, p in theirs.named_parameters():
        close(params[key].grad, p.grad)


@pytest.mark.parametrize("norm_first,activation,batch_first", LAYER_CASES)
def test_decoder_layer_matches_torch(rng, norm_first, activation, batch_first):
    e, h, f, n, T, S = 8, 2, 16, 3, 5, 4
    theirs = torch.nn.TransformerDecoderLayer(e, h, f, dropout=0.0, activation=activation,
                                              norm_first=norm_first, batch_first=batch_first)
    mine = nn.TransformerDecoderLayer(e, h, f, dropout=0.0, activation=activation,
                                      norm_first=norm_first, batch_first=batch_first)
    load_from_torch(mine, theirs)
    assert set(mine.state_dict()) == set(theirs.state_dict())
    theirs.eval(), mine.eval()
    x, tx = pair(rng.standard_normal((n, T, e) if batch_first else (T, n, e)))
    m, tm = pair(rng.standard_normal((n, S, e) if batch_first else (S, n, e)))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    mpad = np.zeros((n, S), bool)
    mpad[2, -1] = True
    out = mine(x, m, tgt_mask=causal.numpy(), memory_key_padding_mask=mpad)
    tout = theirs(tx, tm, tgt_mask=causal, memory_key_padding_mask=torch.tensor(mpad))
    close(out, tout)
    g = rng.standard_normal(tout.shape).astype(np.float32)
    (out * minitx.tensor(g)).sum().backward()
    (tout * torch.tensor(g)).sum().backward()
    close(x.grad, tx.grad)
    close(m.grad, tm.grad)
    params = dict(mine.named_parameters())
    for key, p in theirs.named_parameters():
        close(params[key].grad, p.grad)


def test_stacks_match_torch(rng):
    e, h, f = 8, 2, 16
    tenc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(e, h, f, dropout=0.0, batch_first=True), 2,
        norm=torch.nn.LayerNorm(e), enable_nested_tensor=False).eval()
    tdec = torch.nn.TransformerDecoder(
        torch.nn.TransformerDecoderLayer(e, h, f, dropout=0.0, batch_first=True), 2,
        norm=torch.nn.LayerNorm(e)).eval()
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(e, h, f, dropout=0.0,
                                                           batch_first=True), 2,
                                norm=nn.LayerNorm(e))
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(e, h, f, dropout=0.0,
                                                           batch_first=True), 2,
                                norm=nn.LayerNorm(e))
    load_from_torch(enc, tenc), load_from_torch(dec, tdec)
    x, tx = pair(rng.standard_normal((2, 5, e)), False)
    y, ty = pair(rng.standard_normal((2, 4, e)), False)
    mem, tmem = enc(x), tenc(tx)
    close(mem, tmem)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4)
    close(dec(y, mem, tgt_mask=causal.numpy()), tdec(ty, tmem, tgt_mask=causal))
