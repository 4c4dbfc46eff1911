"""HuggingFace's decoder checkpoints read into minitx's one ``Decoder``, and written back:
each family is one file of ``models/families/`` (its diff from its parent: the switches it
fixes, its config.json keys, its tensor names, HF's defaults, its presets), and this module is
what every family shares — the lookup by ``model_type``, the tensors renamed by the family's
table in both directions, the experts stacked and unstacked, and the search of a
``DecoderConfig``'s family for the way back.

    model, _ = minitx.pretrained.load("path/to/Qwen3-0.6B", dtype="float64", tokenizer=False)
    logits = model(ids)                                   # (B, N, V)
    out = model.generate(ids, max_new_tokens=20)          # greedy, through the KV caches

Every key of ``config.json`` is read by the family, listed as not changing the forward
(``changes_nothing``: metadata, token ids and ``IGNORED``, with the reasons in
docs/decoders.md), or refused by name: a rope_type minitx does not compute, an activation it
does not have, bidirectional attention, quantisation (MXFP4 by name). A key the file leaves
out takes HF's configuration class's default (the family's ``defaults``, ``HF_DEFAULTS``).

Both libraries store ``Linear`` weights as (out, in), so no tensor of these families is
transposed (GPT-2's ``Conv1D`` ones are, in its file). A missing, extra or misshapen tensor is
refused, naming it. The experts are the exception to one name each: minitx stacks them, (n,
out, in) each; the files hold one matrix per expert (stacked on load), transformers 5's
modules a fused ``gate_up_proj``, gpt-oss's interleaved and transposed, Llama 4's transposed
(docs/moe.md);
``decoder_state_to_hf`` writes either spelling back.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import validate
from ..backend import to_host
from ..models.decoder import Decoder, DecoderConfig, check_config
from ..models.families import FAMILIES, IGNORED, SIZE_KEYS, changes_nothing, family
from ..nn import init
from ..nn.moe import MoE

__all__ = ["FAMILIES", "IGNORED", "HF_DEFAULTS", "SIZE_KEYS", "changes_nothing",
           "decoder_config", "decoder_state_from_hf", "decoder_state_to_hf", "decoder_from_hf",
           "hf_config_dict", "family_of"]

# HF's configuration classes' defaults (transformers 5.24) for the keys a config.json leaves
# out, per family: each family file's ``defaults``, seen from here.
HF_DEFAULTS = {kind: dict(fam.defaults) for kind, fam in FAMILIES.items()}


def _fail(source, msg):
    raise validate.OptionError(f"{source}: {msg}")


def decoder_config(cfg: dict, source: str = "config.json") -> DecoderConfig:
    """A parsed ``config.json`` of a family in ``FAMILIES`` → ``DecoderConfig`` (the family
    file's ``read``); a key that is neither read nor ``changes_nothing`` is refused by name."""
    return family(cfg.get("model_type"), source).read(cfg, source)


def family_of(model: Decoder):
    """The family a decoder was loaded as, else the first whose config.json runs its
    config, else (a decoder of minitx's own switches, named only for its tensors) the first
    whose tensor table names every one of its tensors."""
    fam = family(getattr(model, "config_source", None), default=None)
    if fam is not None:
        return fam
    try:
        return FAMILIES[hf_config_dict(model.config)["model_type"]]
    except ValueError:
        pass
    types = model.config.layer_types
    names = [k for k in model._state_entries() if not k.startswith("blocks.") or
             ".mlp." not in k or not isinstance(model.blocks[int(k.split(".")[1])].mlp, MoE)]
    for fam in FAMILIES.values():
        try:
            for name in names:
                fam.tensor_to_hf(name, types)
        except ValueError:
            continue
        return fam
    raise ValueError("no HuggingFace family names every tensor of this decoder")


def _moe_layers(model) -> dict:
    """{layer index: MoE block} of a decoder's mixture-of-experts layers."""
    return {i: b.mlp for i, b in enumerate(model.blocks) if isinstance(b.mlp, MoE)}


_PER_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "gate_proj": "gate_proj",
               "up_proj": "up_proj", "down_proj": "down_proj"}


def _experts_from_hf(tensors: dict, model, fam, source) -> tuple:
    """HF's expert tensors (docs/moe.md: the files' per-expert matrices, or transformers 5's
    fused ``gate_up_proj``; gpt-oss's interleaved, transposed ones; Llama 4's transposed ones)
    → minitx's stacked
    tensors, under ``model.layers.{i}.mlp.<minitx name>``. Returns (tensors, {new key: the
    HF key it came from}); every other key passes through."""
    moe = _moe_layers(model)
    interleaved = fam.expert_layout == "interleaved"
    transposed = fam.expert_layout == "transposed"
    out, origin, per_expert = {}, {}, {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5 or not parts[2].isdigit() \
                or int(parts[2]) not in moe or parts[3] not in ("mlp", "block_sparse_moe"):
            out[key] = value
            continue
        i, rest = int(parts[2]), ".".join(parts[4:])
        if rest.endswith(("_blocks", "_scales")):
            _fail(source, f"tensor {key!r} is MXFP4-quantised (4-bit blocks and scales); "
                          "minitx reads float experts: dequantise them first (docs/moe.md)")
        renamed = {}
        if rest in ("gate.weight", "router.weight"):
            renamed["router.weight"] = value
        elif rest == "router.bias":
            renamed["router.bias"] = value
        elif rest == fam.correction_bias:
            renamed["router.e_score_correction_bias"] = value
        elif rest.startswith("shared_experts."):
            renamed["shared_expert." + rest.split(".", 1)[1]] = value
        elif rest == "experts.gate_up_proj" and interleaved:      # (n, E, 2I), interleaved
            v = np.asarray(value)
            renamed["experts.gate_proj"] = v[:, :, 0::2].transpose(0, 2, 1)
            renamed["experts.up_proj"] = v[:, :, 1::2].transpose(0, 2, 1)
        elif rest == "experts.gate_up_proj_bias" and interleaved:
            v = np.asarray(value)
            renamed["experts.gate_proj_bias"] = v[:, 0::2]
            renamed["experts.up_proj_bias"] = v[:, 1::2]
        elif rest == "experts.gate_up_proj":                  # (n, 2I, E): gate rows, then up
            v, half = np.asarray(value), moe[i].experts.intermediate_size
            if transposed:                                    # (n, E, 2I): gate columns first
                v = v.transpose(0, 2, 1)
            renamed["experts.gate_proj"], renamed["experts.up_proj"] = v[:, :half], v[:, half:]
        elif rest == "experts.down_proj" and (interleaved or transposed):   # (n, I, E)
            renamed["experts.down_proj"] = np.asarray(value).transpose(0, 2, 1)
        elif len(parts) == 8 and parts[4] == "experts" and parts[5].isdigit() \
                and parts[6] in _PER_EXPERT and parts[7] == "weight":
            per_expert[(i, _PER_EXPERT[parts[6]], int(parts[5]))] = (key, value)
            continue
        elif parts[3] == "mlp":
            renamed[rest] = value        # down_proj(_bias), shared_expert(_gate).*, extras
        else:
            out[key] = value             # an unknown block_sparse_moe key: refused by name
            continue
        for name, v in renamed.items():
            out[f"model.layers.{i}.mlp.{name}"] = v
            origin[f"model.layers.{i}.mlp.{name}"] = key
    # per-expert matrices: all n of each kind, stacked on a leading expert axis
    for i, block in moe.items():
        for kind in ("gate_proj", "up_proj", "down_proj"):
            got = {j: kv for (li, k, j), kv in per_expert.items() if (li, k) == (i, kind)}
            if not got:
                continue
            missing = sorted(set(range(block.num_experts)) - set(got))
            extra = sorted(set(got) - set(range(block.num_experts)))
            if missing or extra:
                _fail(source, f"layer {i}: {kind} of expert(s) {missing} missing, or of "
                              f"expert(s) {extra} beyond the {block.num_experts} experts")
            shapes = {tuple(np.shape(v)) for _, v in got.values()}
            if len(shapes) != 1:
                _fail(source, f"layer {i}: the experts' {kind} tensors differ in shape: "
                              f"{sorted(shapes)}")
            name = f"model.layers.{i}.mlp.experts.{kind}"
            out[name] = np.stack([np.asarray(got[j][1]) for j in range(block.num_experts)])
            first = got[0][0].split(".")
            origin[name] = ".".join(first[:5] + ["{j}"] + first[6:])
    return out, origin


def _experts_to_hf(state: dict, model, fam, files: bool) -> dict:
    """The inverse of ``_experts_from_hf`` on {minitx key: array}: transformers 5's module
    tensors (``files=False``, what ``load_state_dict`` of HF's model takes) or the
    checkpoint files' per-expert matrices (``files=True``; Mixtral's ``block_sparse_moe``
    w1, w3, w2). Keys of dense layers pass through."""
    moe = _moe_layers(model)
    interleaved = fam.expert_layout == "interleaved"
    shared = fam.shared_expert + "."          # DeepSeek's "shared_experts", Qwen's one
    out = {}
    for name, value in state.items():
        parts = name.split(".")
        if parts[0] != "blocks" or int(parts[1]) not in moe or parts[2] != "mlp":
            out[name] = value
    for i in moe:
        mine = {k[len(f"blocks.{i}.mlp."):]: v for k, v in state.items()
                if k.startswith(f"blocks.{i}.mlp.")}
        hf = {}
        for key, v in mine.items():
            if key == "router.weight":
                hf[f"{fam.router_module}.weight"] = v
            elif key == "router.bias":
                hf["router.bias"] = v
            elif key == "router.e_score_correction_bias":
                hf[fam.correction_bias] = v
            elif key.startswith("shared_expert."):
                hf[shared + key.split(".", 1)[1]] = v
            elif not key.startswith("experts."):
                hf[key] = v
        gate, up, down = (mine.get(f"experts.{k}") for k in ("gate_proj", "up_proj",
                                                              "down_proj"))
        if up is None:
            pass
        elif gate is None:             # experts without a gate (Nemotron-H): up and down only
            if files:
                for ours, theirs in zip((up, down), fam.expert_files[1:]):
                    for j, w in enumerate(np.asarray(ours)):
                        hf[f"experts.{j}.{theirs}.weight"] = w
            else:
                hf["experts.up_proj"], hf["experts.down_proj"] = up, down
        elif interleaved:              # (n, E, 2I): gate in the even columns, up in the odd
            g, u = np.asarray(gate).transpose(0, 2, 1), np.asarray(up).transpose(0, 2, 1)
            both = np.empty(g.shape[:2] + (2 * g.shape[2],), dtype=g.dtype)
            both[:, :, 0::2], both[:, :, 1::2] = g, u
            gb, ub = (np.asarray(mine[f"experts.{k}_proj_bias"]) for k in ("gate", "up"))
            bias = np.empty((gb.shape[0], 2 * gb.shape[1]), dtype=gb.dtype)
            bias[:, 0::2], bias[:, 1::2] = gb, ub
            hf.update({"experts.gate_up_proj": both, "experts.gate_up_proj_bias": bias,
                       "experts.down_proj": np.asarray(down).transpose(0, 2, 1),
                       "experts.down_proj_bias": mine["experts.down_proj_bias"]})
        elif fam.expert_layout == "transposed":        # (n, E, 2I) and (n, I, E), Llama 4's
            hf["experts.gate_up_proj"] = np.concatenate([np.asarray(gate), np.asarray(up)],
                                                        axis=1).transpose(0, 2, 1)
            hf["experts.down_proj"] = np.asarray(down).transpose(0, 2, 1)
        elif files:                    # one matrix per expert
            for ours, theirs in zip((gate, up, down), fam.expert_files):
                for j, w in enumerate(np.asarray(ours)):
                    hf[f"experts.{j}.{theirs}.weight"] = w
        else:                          # transformers 5: (n, 2I, E), gate rows then up rows
            hf["experts.gate_up_proj"] = np.concatenate([np.asarray(gate), np.asarray(up)],
                                                        axis=1)
            hf["experts.down_proj"] = down
        block = fam.moe_files_module if files else "mlp"
        out.update({f"model.layers.{i}.{block}.{k}": v for k, v in hf.items()})
    return out



def decoder_state_from_hf(tensors: dict, model: Decoder, source: str = "checkpoint") -> dict:
    """{HF key: array} → {minitx key: array} for ``model``; a tensor the model does not
    have, one it needs that is missing, or one of the wrong shape raises, naming it."""
    fam = family_of(model)
    types = model.config.layer_types
    # the shapes alone (state_dict() would copy every parameter to read them)
    expected = {k: tuple(v.shape) for k, v in model._state_entries().items()}
    # the family's own layouts undone, then the experts stacked (docs/moe.md); errors name
    # the HF key a tensor came from
    tensors, origin = _experts_from_hf(fam.tensors_from_hf(tensors, model, source), model,
                                       fam, source)
    embed = fam.tensor_to_hf("embed.weight")
    # each HF tensor: renamed, then it must be one the model has, of the model's shape
    state, extra = {}, []
    for key, value in tensors.items():
        name = fam.tensor_to_minitx(key, types)
        if name == "unembed.weight" and model.config.tie_embeddings:
            # a tied checkpoint may still store the head: it must equal the embedding
            emb = tensors.get(embed)
            if emb is not None and not np.array_equal(np.asarray(value), np.asarray(emb)):
                _fail(source, f"{key} differs from {embed} but config.json says "
                              "tie_word_embeddings=true")
            continue
        if name not in expected:
            extra.append(origin.get(key, key))
            continue
        if tuple(np.shape(value)) != expected[name]:
            _fail(source, f"tensor {origin.get(key, key)!r} has shape "
                          f"{tuple(np.shape(value))}, the model needs {expected[name]} "
                          f"(as {name})")
        state[name] = value
    # nothing left over, nothing missing
    if extra:
        _fail(source, f"unexpected tensor(s) for {fam.model_type}: {', '.join(extra)}")
    missing = sorted(set(expected) - set(state))
    if missing:
        _fail(source, f"missing tensor(s): "
                      f"{', '.join(fam.tensor_to_hf(k, types) for k in missing)}")
    return state


def decoder_state_to_hf(state: dict, model: Decoder, files: bool = False) -> dict:
    """The inverse of ``decoder_state_from_hf``: {minitx key: value} → {HF key: value}
    (the head = the embedding when tied and the embedding is given). The experts as
    transformers 5's modules hold them (``load_state_dict`` of HF's model), or with ``files``
    as its checkpoint files do, one matrix per expert (docs/moe.md)."""
    fam = family_of(model)
    types = model.config.layer_types
    # the experts are re-laid out with NumPy: a model on a GPU hands its arrays over once, here
    state = _experts_to_hf({k: to_host(v) for k, v in state.items()}, model, fam, files)
    out = {name if name.startswith("model.layers.") else fam.tensor_to_hf(name, types): value
           for name, value in state.items()}
    embed, head = fam.tensor_to_hf("embed.weight"), fam.tensor_to_hf("unembed.weight")
    if model.config.tie_embeddings and embed in out:
        out[head] = out[embed]
    return fam.tensors_to_hf(out, model, files)


def decoder_from_hf(cfg: dict, tensors: dict, source: str = "checkpoint",
                    dtype=None, assign: bool = False) -> Decoder:
    """A ``Decoder`` in eval mode from a parsed ``config.json`` and {HF key: array};
    parameters in ``dtype`` (default float32). ``model.hf_config`` keeps the config.

    The model is built without its random initialisation (``init.skipped()``: every weight
    is the checkpoint's). ``assign=True`` gives ``tensors``' arrays to the model as its
    parameters where their dtype allows (``load_state_dict(assign=True)``), so that the
    weights are not held twice; ``load`` does, for the arrays it read itself."""
    with init.skipped():
        model = Decoder(decoder_config(cfg, f"{source}/config.json"))
    if dtype is not None:
        model.to(dtype=dtype)                  # before loading: no float32 round trip
    model.config_source = cfg["model_type"]
    model.hf_config = dict(cfg)
    model.load_state_dict(decoder_state_from_hf(tensors, model, source), assign=assign)
    return model.eval()


def hf_config_dict(c: DecoderConfig, prefer: dict = None) -> dict:
    """The config.json of the first family in ``FAMILIES`` that runs exactly ``c``: each
    family's ``write`` is read back by its ``read`` and must give ``c`` again. ``prefer``
    (the config.json a model was loaded from) is tried first, so token ids and other ignored
    keys survive a round trip. ValueError when no family has these switches (a decoder of
    minitx's own)."""
    c = check_config(dataclasses.replace(c))           # the defaults filled in, as read back
    mine = dataclasses.asdict(c)
    if mine["query_pre_attn_scalar"] == c.head_dim:
        mine["query_pre_attn_scalar"] = None           # 1/√D either way
    first = [] if prefer is None else [dict(prefer)]
    for d in first + [fam.write(c) for fam in FAMILIES.values()]:
        try:
            back = dataclasses.asdict(check_config(decoder_config(d, "hf_config_dict")))
        except validate.OptionError:
            continue
        if back["query_pre_attn_scalar"] == c.head_dim:
            back["query_pre_attn_scalar"] = None
        if back == mine:
            return d
    raise ValueError("hf_config_dict: no HuggingFace family runs this DecoderConfig (its "
                     f"switches match none of {', '.join(FAMILIES)})")
