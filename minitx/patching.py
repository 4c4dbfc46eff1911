"""Activation patching, attribution patching and head ablation, on any model with hook points.

The question they answer: *which activations carry the information that makes a model's
output differ between two inputs?* Take a **clean** input and a **corrupted** one (the same
prompt with one token changed, say), and a **metric** of the logits (a logit difference).

- **Activation patching** (Vig et al. 2020; Meng et al. 2022): run the corrupted input, but
  with one activation — one layer, one head, one position — copied from the clean run; the
  metric moves back toward its clean value by as much as that activation matters. One
  forward per cell of the table.
- **Attribution patching** (Nanda 2023; Syed, Rager & Conmy 2023): the first-order Taylor
  estimate of the same table from one clean forward and one corrupted forward + backward:

      metric(patched) ≈ metric(corrupted) + Σ_cell (a_clean − a_corrupted) · ∂metric/∂a |corrupted

  exact when the metric is linear in the activation, cheap for every cell at once.
- **Head ablation**: replace one head's output (``hook_z``) by zero or by its mean.

Tables are host NumPy arrays of *metric values*, so the two kinds compare directly:
``by="layer"`` → (L,), ``by="head"`` → (L, H), ``by="position"`` → (L, N). ``hook`` is a
TransformerLens shorthand: "z", "q", "k", "v", "pattern" (per head or position), "resid_pre",
"resid_mid", "resid_post", "attn_out", "mlp_out" (per layer or position).
"""
from __future__ import annotations

import itertools

import numpy as np

from . import backend
from .autograd.grad_mode import no_grad
from .autograd.tensor import Tensor
from .nn.hooks import act_name
from .ops.indexing import where

__all__ = ["activation_patching", "attribution_patching", "ablate_heads", "patch_hook",
           "layer_count"]

# axis of the head and of the (query) position in each hook's activation
_HEAD_AXIS = {"q": 2, "k": 2, "v": 2, "z": 2, "pattern": 1, "attn_scores": 1}
_POS_AXIS = {"q": 1, "k": 1, "v": 1, "z": 1, "pattern": 2, "attn_scores": 2, "resid_pre": 1,
             "resid_mid": 1, "resid_post": 1, "attn_out": 1, "mlp_out": 1}
_BY = ("layer", "head", "position")


def layer_count(model, hook: str = "resid_pre") -> int:
    """How many blocks carry ``blocks.{i}.<hook>``."""
    names = set(model.hook_names())
    return sum(1 for _ in itertools.takewhile(lambda i: act_name(hook, i) in names,
                                              itertools.count()))


def patch_hook(source: Tensor, index=None):
    """A forward hook that writes ``source`` (same shape) over the activation at ``index``
    (a NumPy-style index; None = everywhere) and keeps the rest."""
    def hook(x, point):
        if index is None:
            return source
        xp = backend.get_array_module(x.data)
        chosen = xp.zeros(x.shape, dtype=bool)
        chosen[index] = True
        return where(chosen, source, x)
    return hook


def _cells(hook: str, by: str, shape) -> list:
    """[(table position, index into the activation)] for ``by``."""
    if by not in _BY:
        raise ValueError(f"by must be one of {_BY}, got {by!r}")
    if by == "layer":
        return [((), None)]
    axes = _HEAD_AXIS if by == "head" else _POS_AXIS
    if hook not in axes:
        raise ValueError(f"hook {hook!r} has no {by} axis; by={by!r} takes one of "
                         f"{sorted(axes)}")
    # One cell per index along the hook's head or position axis: that slice alone is patched.
    axis = axes[hook]
    cells = []
    for i in range(shape[axis]):
        index = [slice(None)] * len(shape)
        index[axis] = i
        cells.append(((i,), tuple(index)))
    return cells


# The metric must reduce the logits to one number (a logit difference, say).
def _metric_value(metric, logits) -> float:
    value = metric(logits)
    if not isinstance(value, Tensor) or value.size != 1:
        raise ValueError(f"metric must map the logits to a scalar Tensor, got "
                         f"{type(value).__name__} {getattr(value, 'shape', '')}")
    return float(value.item())


def _logits(out):
    return out[0] if isinstance(out, tuple) else out


def activation_patching(model, clean, corrupted, metric, hook: str = "z", by: str = "head",
                        **kwargs) -> np.ndarray:
    """The metric of the corrupted run with ``hook`` patched from the clean run, one cell at a
    time: (L,), (L, H) or (L, N) for ``by`` = "layer", "head", "position" (module docstring).
    ``clean`` and ``corrupted`` are the model's first argument (token ids of equal shape);
    ``kwargs`` go to every forward."""
    n_layers = layer_count(model)
    names = [act_name(hook, i) for i in range(n_layers)]
    with no_grad():
        _, cache = model.run_with_cache(clean, names_filter=names, **kwargs)
        rows = []
        for name in names:
            source = cache[name]
            row = [_metric_value(metric, _logits(model.run_with_hooks(
                       corrupted, fwd_hooks=[(name, patch_hook(source, index))], **kwargs)))
                   for _, index in _cells(hook, by, source.shape)]
            rows.append(row)
    table = np.array(rows)
    return table[:, 0] if by == "layer" else table


def attribution_patching(model, clean, corrupted, metric, hook: str = "z", by: str = "head",
                         **kwargs) -> np.ndarray:
    """The first-order estimate of ``activation_patching``'s table from one clean forward
    and one corrupted forward + backward (same arguments, same shape)."""
    n_layers = layer_count(model)
    names = [act_name(hook, i) for i in range(n_layers)]
    with no_grad():
        _, clean_cache = model.run_with_cache(clean, names_filter=names, **kwargs)
    logits, cache = model.run_with_cache(corrupted, names_filter=names, incl_bwd=True,
                                         metric=metric, **kwargs)
    base = _metric_value(metric, logits)
    # First order: metric(a_clean) ≈ metric(a_corr) + (a_clean − a_corr)·∂metric/∂a, the
    # products summed over each cell's slice; one backward pass serves every cell.
    rows = []
    for name in names:
        delta = backend.to_host(clean_cache[name].data - cache[name].data)   # a_clean − a_corr
        grad = backend.to_host(cache[name + "_grad"].data)
        contribution = delta * grad
        row = []
        for _, index in _cells(hook, by, delta.shape):
            part = contribution if index is None else contribution[index]
            row.append(base + float(part.sum()))
        rows.append(row)
    table = np.array(rows)
    return table[:, 0] if by == "layer" else table


def ablate_heads(model, *args, heads, how: str = "zero", **kwargs):
    """The model's output with the heads ``heads`` = [(layer, head), …] ablated at
    ``blocks.{layer}.attn.hook_z``: replaced by zeros (``how="zero"``) or by the head's mean
    over batch and positions (``how="mean"``)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"ablate_heads: how must be 'zero' or 'mean', got {how!r}")
    hooks = []
    for layer, head in heads:
        def ablate(z, point, head=head):                         # z (B, N, H, D)
            xp = backend.get_array_module(z.data)
            chosen = xp.zeros(z.shape, dtype=bool)
            chosen[:, :, head] = True
            fill = z.data[:, :, head].mean(axis=(0, 1)) if how == "mean" else 0.0
            replacement = Tensor(xp.broadcast_to(xp.asarray(fill, dtype=z.dtype), z.shape))
            return where(chosen, replacement, z)
        hooks.append((act_name("z", layer), ablate))
    return model.run_with_hooks(*args, fwd_hooks=hooks, **kwargs)
