"""The newer model code on a GPU, in one short run: the 2025 attention variants against their
NumPy results, one ``minitx.pretrained.load`` family of each kind on CuPy against NumPy, and
today's decoders beside HuggingFace ``transformers`` on PyTorch CUDA.

    python3 benchmarks/gpu_models.py                # minitx on CuPy (a GPU)
    python3 benchmarks/gpu_models.py --quick        # tiny sizes (gpu_run.py's dry run)
    python3 benchmarks/gpu_models.py --budget 17    # start no part after 17 s (named)

1. **variants**: each of ``VARIANTS`` that is registered, a causal layer in eval mode.
   float64, B = 1, N = 33, E = 16, H = 2: forward and backward of sum(y * w) on CuPy against
   the same layer (the same weights) on NumPy, the output and every gradient (the input's and
   each parameter's) within ``TOL_F64`` of the largest NumPy value; then float32 forward +
   backward at B = 2, N = 512, E = 256, H = 4 timed on CuPy (median of 3).
2. **pretrained**: for each kind (dense, MoE, hybrid: a layer type that is a token mixer) the
   first family of ``minitx.pretrained.DECODER_FAMILIES`` of that kind, read from its
   representative config.json (``minitx.pretrained.families.REPRESENTATIVE``) shrunk to two
   small layers (``shrink``), written as a random checkpoint by minitx itself
   (``decoder_state_to_hf`` + ``save_file``: no network, no transformers) and loaded by
   ``minitx.pretrained.load`` on NumPy and on CuPy: float32 logits within ``TOL_F32`` of the
   largest. A kind no family has is said so; a family added later joins by itself.
3. **decoders**: ``benchmarks/decoder_step.py``'s Llama and Mixtral-style MoE (E = 256, two
   layers, V = 1024), and a hybrid one when ``minitx.models.mixers.MIXERS`` has a mixer, in
   float32 on CuPy: forward + backward of the next-token loss (B = 4, T = 256) and one cached
   decoding step after a 256-token prompt, median times; beside the same weights in
   ``transformers`` (``interop.to_torch``, then HF's default modules) on PyTorch CUDA: logits of
   both passes within ``TOL_PEER`` of the largest, times and the ratio minitx / PyTorch.
   Without transformers, or a PyTorch with CUDA, minitx's times are printed alone.

Each part prints its rows, a row that disagrees ends in FAIL, and each ends with one
``SUMMARY`` line (what ``benchmarks/gpu_run.py`` shows). Exit status 1 when anything disagrees,
2 when CuPy cannot be used. On the CPU (the strict CuPy stand-in) the times only show that the
script runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = ("gated", "fox", "lightning", "gated_deltanet", "kda", "dsa", "moba", "nsa")
# float64 on two devices: the same algorithm, sums in another order (cuBLAS, CuPy's
# reductions), so the results differ by rounding only, about 1e-15 of their size; 1e-10 leaves
# room for the recurrences' longer chains and still catches any wrong formula or index.
TOL_F64 = 1e-10
# float32 on two devices, minitx both times: rounding in float32, as the oracle tests' 1e-4.
TOL_F32 = 1e-4
# float32 minitx on CuPy against transformers on PyTorch CUDA: two libraries' kernels (cuBLAS
# algorithms, PyTorch's fused SDPA, its MoE's grouped products) round differently; gpu_engine.py
# holds the attention block to 2e-3 for the same reason.
TOL_PEER = 2e-3
KINDS = ("dense", "MoE", "hybrid")
# a representative config.json's size keys → the small value each takes (those it has)
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
             moe_intermediate_size=32, num_local_experts=4, n_routed_experts=4, num_experts=4,
             num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
             q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
             v_head_dim=16, sliding_window=4, first_k_dense_replace=1)


class Budget:
    """``--budget``: each part asks before it starts; what is left out is named at the end."""

    def __init__(self, seconds):
        self.end = None if seconds is None else time.perf_counter() + seconds
        self.left_out = []

    def allows(self, what):
        if self.end is not None and time.perf_counter() > self.end:
            self.left_out.append(what)
            return False
        return True


def median_time(fn, sync, repeats, warmup=1):
    for _ in range(warmup):
        fn()
        sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def relative(got, want):
    """max |got - want| over max |want| (NaN where a shape differs or one is missing)."""
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("nan")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("nan")
    return float(np.abs(got - want).max(initial=0.0) / max(np.abs(want).max(initial=0.0), 1e-30))


def verdict(err, tol):
    return "ok" if err <= tol else "FAIL"          # NaN fails too


# ---- 1. the 2025 attention variants ------------------------------------------------------------
def variant_arrays(minitx, cls, device, x0, w0):
    """Output, input gradient and parameter gradients (host arrays) of one float64 pass."""
    minitx.set_backend("numpy")
    minitx.manual_seed(0)
    layer = cls(x0.shape[-1], 2, causal=True).to("float64").eval()     # weights drawn on host
    if device == "cupy":
        layer.to("cuda")
    minitx.set_backend(device)
    x = minitx.tensor(x0, requires_grad=True)
    y = layer(x)
    (y * minitx.tensor(w0)).sum().backward()
    grads = {n: None if p.grad is None else p.grad.numpy() for n, p in layer.named_parameters()}
    return y.numpy(), x.grad.numpy(), grads


def variants(minitx, args, sync, budget):
    from minitx.attention import REGISTRY
    names = [n for n in VARIANTS if n in REGISTRY]
    missing = [n for n in VARIANTS if n not in REGISTRY]
    rng = np.random.default_rng(0)
    x0, w0 = rng.standard_normal((2, 1, 33, 16))
    B, N, E, H = (2, 32, 32, 4) if args.quick else (2, 512, 256, 4)
    print(f"variants: float64 B=1 N=33 E=16 H=2 causal, CuPy against NumPy (within {TOL_F64:g} "
          f"of the largest); float32 forward + backward B={B} N={N} E={E} H={H} on CuPy")
    ok, worst, times = [], 0.0, {}
    for name in names:
        if not budget.allows(f"variant {name}"):
            continue
        cls = REGISTRY[name]
        try:
            host = variant_arrays(minitx, cls, "numpy", x0, w0)
            dev = variant_arrays(minitx, cls, "cupy", x0, w0)
            errs = [relative(dev[0], host[0]), relative(dev[1], host[1])]
            errs += [relative(dev[2].get(k), g) for k, g in host[2].items()]
            err = max(errs, key=lambda e: (e != e, e))          # NaN first
            minitx.manual_seed(0)
            layer = cls(E, H, causal=True)
            x = minitx.tensor(np.random.default_rng(1).standard_normal((B, N, E))
                              .astype(np.float32), requires_grad=True)

            def step():
                layer.zero_grad()
                x.grad = None
                layer(x).sum().backward()
            t = median_time(step, sync, repeats=1 if args.quick else 3)
        except Exception as exc:  # noqa: BLE001 - one variant's error fails its row, not the run
            print(f"  {name:16s} FAIL: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        worst = max(worst, err) if err == err else float("nan")
        times[name] = t
        if verdict(err, TOL_F64) == "ok":
            ok.append(name)
        print(f"  {name:16s} float64 max error {err:.1e} ({len(errs)} arrays)  float32 fwd+bwd "
              f"{t * 1e3:8.2f} ms  {verdict(err, TOL_F64)}")
    if missing:
        print(f"  not registered here: {', '.join(missing)}")
    print(f"SUMMARY variants: {len(ok)} of {len(names)} agree with NumPy in float64 (worst "
          f"{worst:.1e}); float32 fwd+bwd N={N}: "
          + ", ".join(f"{n} {t * 1e3:.1f} ms" for n, t in times.items()))
    return len(ok) == len(names)


# ---- 2. one pretrained family of each kind ----------------------------------------------------
def shrink(cfg):
    """A representative config.json at a test's size: the size keys it sets take ``SMALL``'s
    values, and two layers, or one of each layer type it has, in order (types a family
    derives, such as Gemma's every-sixth global layer, written out as HF names them); rope and
    the rest as published."""
    from minitx.models.decoder import check_config
    from minitx.pretrained.decoders import decoder_config
    small = dict(cfg)
    for key, value in SMALL.items():
        if small.get(key) is not None:                 # a window switched off stays off
            small[key] = value
    if cfg.get("num_key_value_heads") == cfg.get("num_attention_heads"):
        small["num_key_value_heads"] = small["num_attention_heads"]        # MHA stays MHA
    types = list(dict.fromkeys(cfg.get("layer_types") or []))
    if not types:
        derived = check_config(decoder_config(cfg, "representative config.json")).layer_types
        if len(set(derived)) > 1:
            # one of each, as the family's own file writes them back (HF's names)
            import dataclasses
            from minitx.models.families import family
            one_each = tuple(dict.fromkeys(derived))
            written = family(cfg["model_type"]).write_layers(dataclasses.replace(
                check_config(decoder_config(cfg, "representative config.json")),
                layer_types=one_each, num_layers=len(one_each)))
            hf = {"full": "full_attention", "sliding": "sliding_attention"}
            own = {k: v for k, v in written.items() if k != "layer_types"}
            if own and "layer_types" not in written:   # a family's own key (Nemotron-H's)
                small.update(own, num_hidden_layers=len(one_each))
                return small
            types = written.get("layer_types") or [hf[t] for t in one_each]
    n = max(2, len(types))
    small["num_hidden_layers"] = n
    if types:
        small["layer_types"] = (types * n)[:n]
    if "mlp_only_layers" in cfg:
        small["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < n]
    return small


def kind_of(config, mixers):
    if any(t in mixers for t in config.layer_types):
        return "hybrid"
    return "MoE" if config.mlp == "moe" else "dense"


def write_checkpoint(minitx, cfg, folder, seed):
    """A random minitx Decoder of ``cfg`` saved as a HuggingFace folder (config.json,
    model.safetensors); every weight redrawn (gains 1 + noise) so none keeps 0 or 1."""
    from minitx.models import Decoder
    from minitx.pretrained.decoders import decoder_config, decoder_state_to_hf
    from minitx.pretrained.safetensors import save_file
    minitx.set_backend("numpy")
    minitx.manual_seed(seed)
    model = Decoder(decoder_config(cfg, "shrunk config.json"))
    model.config_source = cfg["model_type"]
    rng = np.random.default_rng(seed)
    state = {}
    for name, value in model.state_dict().items():
        value = np.asarray(value)
        if value.dtype.kind == "f":
            noise = 0.2 * rng.standard_normal(value.shape)
            value = (1.0 + noise if np.all(value == 1) else noise).astype(np.float32)
        state[name] = value
    os.makedirs(folder, exist_ok=True)
    save_file(decoder_state_to_hf(state, model, files=True),
              os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)


def pretrained(minitx, args, budget, work):
    import minitx.pretrained as pt
    from minitx.models.mixers import MIXERS
    from minitx.models.decoder import check_config
    from minitx.pretrained.decoders import decoder_config
    from minitx.pretrained.families import REPRESENTATIVE
    chosen, unreadable = {}, []
    for family in pt.DECODER_FAMILIES:
        if family not in REPRESENTATIVE:
            unreadable.append(f"{family} (no representative config)")
            continue
        cfg = shrink(dict(REPRESENTATIVE[family][1], model_type=family))
        try:
            kind = kind_of(check_config(decoder_config(cfg, f"{family} shrunk")), MIXERS)
        except ValueError as exc:                      # OptionError is a ValueError
            unreadable.append(f"{family} ({str(exc)[:120]})")
            continue
        chosen.setdefault(kind, (family, cfg))
    ids = np.random.default_rng(2).integers(3, SMALL["vocab_size"], (2, 11))
    print(f"pretrained: one family per kind, shrunk, a random checkpoint written by minitx, "
          f"loaded on NumPy and on CuPy; float32 logits within {TOL_F32:g} of the largest")
    ok, said = True, []
    for kind in KINDS:
        if kind not in chosen:
            print(f"  {kind:7s} no family of this kind in minitx.pretrained")
            said.append(f"{kind}: none")
            continue
        family, cfg = chosen[kind]
        if not budget.allows(f"pretrained {kind} ({family})"):
            continue
        try:
            folder = os.path.join(work, f"tiny-{family}")
            write_checkpoint(minitx, cfg, folder, seed=KINDS.index(kind))
            logits = {}
            for device in ("numpy", "cupy"):
                minitx.set_backend(device)
                model, _ = pt.load(folder, dtype="float32", tokenizer=False)
                logits[device] = model(ids).numpy()
            err = relative(logits["cupy"], logits["numpy"])
        except Exception as exc:  # noqa: BLE001 - reported as this family's failure
            print(f"  {kind:7s} {family}: FAIL: {type(exc).__name__}: {str(exc)[:300]}")
            ok = False
            said.append(f"{kind} {family} FAILED")
            continue
        ok &= verdict(err, TOL_F32) == "ok"
        print(f"  {kind:7s} {family:12s} logits {logits['cupy'].shape} max error {err:.1e}  "
              f"{verdict(err, TOL_F32)}")
        said.append(f"{kind} {family} {err:.1e}")
    if unreadable:
        print(f"  not tried: {', '.join(unreadable)}")
    print("SUMMARY pretrained (float32 logits, CuPy vs NumPy): " + "; ".join(said))
    return ok


# ---- 3. today's decoders beside transformers -------------------------------------------------
def torch_peer(quick):
    """(torch, transformers, device, sync) or None, saying why."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        print(f"decoders: no transformers comparison ({exc.name} is not installed)")
        return None
    if torch.cuda.is_available():
        return torch, transformers, "cuda", torch.cuda.synchronize
    if not quick:
        print("decoders: PyTorch has no CUDA device here: no transformers comparison")
        return None
    print("decoders: PyTorch on the CPU (a dry run: its times are not the GPU's)")
    return torch, transformers, "cpu", lambda: None


def decoder_configs():
    import dataclasses
    sys.path.insert(0, HERE)
    from decoder_step import configs
    from minitx.models.mixers import MIXERS
    out = {name.split(" ")[0]: c for name, c in configs().items()}
    if MIXERS:                               # a hybrid: the first mixer, then full attention
        mixer = sorted(MIXERS)[0]
        out[f"hybrid-{mixer}"] = dataclasses.replace(out["llama"], layer_types=(mixer, "full"))
    return out


def hf_twins(peer, model):
    """``model``'s weights in transformers on the peer's device: its default modules first,
    then (for a mixture of experts) the eager loop over experts ``interop.to_torch`` builds,
    in case the default's grouped products refuse float32 there; or ([], why) when
    transformers has no such model."""
    import minitx.interop as interop
    torch, transformers, dev, _ = peer
    try:
        eager = interop.to_torch(model)
    except ValueError as exc:
        return [], str(exc)[:160]
    cfg = transformers.AutoConfig.for_model(**eager.config.to_diff_dict())
    default = transformers.AutoModelForCausalLM.from_config(cfg)
    default.load_state_dict(eager.state_dict())
    twins = [("default", default)]
    if model.config.mlp == "moe":
        twins.append(("eager experts", eager))
    return [(how, m.to(dev)) for how, m in twins], None


def time_minitx(minitx, model, ids, T, sync, repeats, steps):
    """(fwd+bwd s, cached step s, training logits, step logits) of ``model`` on CuPy."""
    from minitx import no_grad
    from minitx.ops.loss import cross_entropy
    from minitx.ops.shape import reshape
    model.train()
    out = {}

    def fwd_bwd():
        model.zero_grad()
        logits = model(ids[:, :-1])
        loss = cross_entropy(reshape(logits, (-1, logits.shape[-1])), ids[:, 1:].reshape(-1))
        loss.backward()
        out["logits"] = logits
    t_train = median_time(fwd_bwd, sync, repeats)
    model.eval()
    with no_grad():
        caches = model.new_caches()
        model(ids[:, :T], kv_caches=caches)
        tok = ids[:, T:]
        step_logits = model(tok, kv_caches=caches).numpy()
        t_step = median_time(lambda: model(tok, kv_caches=caches), sync, steps, warmup=0)
    return t_train, t_step, out["logits"].numpy(), step_logits


def time_transformers(peer, theirs, ids, T, repeats, steps):
    """The same for a transformers model on the peer's device."""
    torch, _, dev, tsync = peer
    t_ids = torch.tensor(ids, device=dev)
    theirs.train()
    out = {}

    def fwd_bwd():
        theirs.zero_grad()
        lg = theirs(t_ids[:, :-1]).logits
        torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                          t_ids[:, 1:].reshape(-1)).backward()
        out["logits"] = lg
    t_train = median_time(fwd_bwd, tsync, repeats)
    theirs.eval()
    with torch.no_grad():
        past = theirs(t_ids[:, :T], use_cache=True).past_key_values
        step_logits = theirs(t_ids[:, T:], past_key_values=past, use_cache=True).logits
        t_step = median_time(lambda: theirs(t_ids[:, T:], past_key_values=past, use_cache=True),
                             tsync, steps, warmup=0)
    return (t_train, t_step, out["logits"].detach().float().cpu().numpy(),
            step_logits.float().cpu().numpy())


def decoders(minitx, args, sync, budget):
    from minitx.models import Decoder
    B, T, steps, repeats = (2, 16, 2, 1) if args.quick else (4, 256, 8, 5)
    peer = torch_peer(args.quick)
    print(f"decoders: float32 on CuPy, fwd+bwd of the next-token loss B={B} T={T}; one cached "
          f"step after a {T}-token prompt (median of {steps}); transformers within "
          f"{TOL_PEER:g} of the largest logit")
    ok, said = True, []
    for name, config in decoder_configs().items():
        if not budget.allows(f"decoder {name}"):
            continue
        ids = np.random.default_rng(3).integers(0, config.vocab_size, (B, T + 1))
        try:
            minitx.set_backend("numpy")
            minitx.manual_seed(0)
            model = Decoder(config)
            twins, why = hf_twins(peer, model) if peer is not None else ([], "no peer")
            model.to("cuda")
            minitx.set_backend("cupy")
            mine = time_minitx(minitx, model, ids, T, sync, repeats, steps)
        except Exception as exc:  # noqa: BLE001 - this decoder's row fails, the run goes on
            print(f"  {name:22s} FAIL: {type(exc).__name__}: {str(exc)[:300]}")
            ok = False
            said.append(f"{name} FAILED")
            continue
        line = f"  {name:22s} minitx fwd+bwd {mine[0] * 1e3:8.2f} ms, step {mine[1] * 1e3:7.2f} ms"
        brief = f"{name} fwd+bwd {mine[0] * 1e3:.1f} ms, step {mine[1] * 1e3:.2f} ms"
        theirs, errors = None, []
        for how, twin in twins:
            try:
                theirs = time_transformers(peer, twin, ids, T, repeats, steps)
                break
            except Exception as exc:  # noqa: BLE001 - transformers' own refusal, said below
                errors.append(f"{how}: {type(exc).__name__}: {str(exc)[:160]}")
        if theirs is not None:
            err = max(relative(mine[2], theirs[2]), relative(mine[3], theirs[3]))
            ok &= verdict(err, TOL_PEER) == "ok"
            line += (f"; transformers ({how}) {theirs[0] * 1e3:8.2f} ms, step "
                     f"{theirs[1] * 1e3:7.2f} ms; minitx/PyTorch {mine[0] / theirs[0]:.2f}x and "
                     f"{mine[1] / theirs[1]:.2f}x; logits agree to {err:.1e}  "
                     f"{verdict(err, TOL_PEER)}")
            brief += (f" = {mine[0] / theirs[0]:.2f}x and {mine[1] / theirs[1]:.2f}x transformers "
                      f"({peer[2]}), logits {err:.0e}")
        elif peer is not None:
            line += f"; no transformers comparison ({why or '; '.join(errors)})"
        print(line)
        said.append(brief)
    print("SUMMARY decoders on CuPy: " + "; ".join(said))
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (dry runs)")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="start no part after SECONDS (the parts left out are named)")
    args = ap.parse_args(argv)
    budget = Budget(args.budget)
    import minitx
    from minitx.backend import cupy_or_none, describe_device
    try:
        minitx.set_backend("cupy")
    except (RuntimeError, ValueError) as exc:
        print(f"gpu_models: no usable GPU ({exc})", file=sys.stderr)
        return 2
    cp = cupy_or_none()
    sync = cp.cuda.Device().synchronize
    print(f"gpu_models: minitx on CuPy ({describe_device()})")
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu_models-") as work:
        for part in (lambda: variants(minitx, args, sync, budget),
                     lambda: pretrained(minitx, args, budget, work),
                     lambda: decoders(minitx, args, sync, budget)):
            ok &= part()
    if budget.left_out:
        print(f"budget: {len(budget.left_out)} parts not run: {', '.join(budget.left_out)}")
    print(f"check: {'everything agrees' if ok else 'SOMETHING DISAGREES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
