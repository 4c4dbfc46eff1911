r"""Losses: cross-entropy (fused, with ignore_index and label smoothing) and mean squared error.

Cross-entropy of logits z (C classes) against the class t, with label smoothing ε, and its
gradient (softmax minus the smoothed one-hot target, so no softmax Jacobian is ever formed):

$$
\ell = -(1 - \varepsilon) \log p_t - \frac{\varepsilon}{C} \sum_c \log p_c,
\quad p = \operatorname{softmax}(z),
\quad \frac{\partial \ell}{\partial z_c}
= p_c - (1 - \varepsilon)\, [c = t] - \frac{\varepsilon}{C}
$$
"""
from __future__ import annotations

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..backend import get_array_module
from . import elementwise as E
from . import reduce as R

__all__ = ["cross_entropy", "mse_loss"]


# Cross-entropy as one node on (R, C) rows: log-softmax, the smoothed negative
# log-likelihood, then the reduction.
class CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, reduction):
        xp = get_array_module(logits)
        c = logits.shape[-1]
        z = logits.reshape(-1, c)                                   # (R, C)
        t = target.reshape(-1)                                      # (R,)
        # Rows whose target is ignore_index count nowhere; their target becomes 0 only so the
        # gather below stays in range.
        valid = t != ignore_index
        safe_t = xp.where(valid, t, 0)
        # log p shifted by the row max m (no overflow), then ℓ of each row (module docstring)
        m = z.max(axis=-1, keepdims=True)
        logp = z - m - xp.log(xp.exp(z - m).sum(axis=-1, keepdims=True))   # log softmax
        nll = -xp.take_along_axis(logp, safe_t[:, None], axis=-1)[:, 0]
        smooth = -logp.mean(axis=-1)                                # uniform-target term
        eps = label_smoothing
        per_row = ((1 - eps) * nll + eps * smooth) * valid          # (R,)
        count = int(valid.sum())
        ctx.save_for_backward(logp, safe_t, valid)
        ctx.meta = (eps, reduction, count, logits.shape, target.shape)
        # "mean" divides by the rows kept (NaN when none are, as PyTorch).
        if reduction == "none":
            return per_row.reshape(target.shape).astype(logits.dtype, copy=False)
        total = per_row.sum()
        if reduction == "sum":
            return xp.asarray(total, dtype=logits.dtype)
        return xp.asarray(total / count if count else xp.nan, dtype=logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        logp, safe_t, valid = ctx.saved_tensors
        eps, reduction, count, shape, tshape = ctx.meta
        xp = get_array_module(logp)
        r, c = logp.shape
        # the module docstring's gradient, zero for ignored rows
        d = xp.exp(logp)
        d[xp.arange(r), safe_t] -= 1 - eps
        d -= eps / c
        d *= valid[:, None]
        if reduction == "none":
            d *= grad.reshape(-1)[:, None]
        elif reduction == "sum":
            d *= grad
        else:
            d *= grad / max(count, 1)
        return d.reshape(shape).astype(logp.dtype, copy=False), None, None, None, None


def cross_entropy(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean"):
    """Cross-entropy between ``logits`` (..., C) and integer class ``target`` (...).

    ℓ of the module docstring for each row, ε = ``label_smoothing``; rows whose target is
    ``ignore_index`` are left out, and ``reduction="mean"`` divides by the number of rows kept
    (PyTorch's semantics), its gradient too. The class axis is the *last* one (for (N, C, d…)
    PyTorch-layout logits, move it last).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    # target: integer classes, logits' shape without the class axis.
    t = target.data if isinstance(target, Tensor) else target
    xp = get_array_module(t)
    t = xp.asarray(t)
    if t.dtype.kind not in "iu":
        raise TypeError(f"target must hold integer class indices, got dtype {t.dtype}")
    if tuple(t.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"target shape {tuple(t.shape)} must equal logits shape without its "
                         f"class axis, {tuple(logits.shape[:-1])}")
    # Every kept class must lie in [0, C): a negative index would otherwise wrap around silently.
    c = logits.shape[-1]
    kept = t[t != ignore_index]
    if kept.size and (int(kept.min()) < 0 or int(kept.max()) >= c):
        raise IndexError(f"target classes must lie in [0, {c}) (or equal ignore_index="
                         f"{ignore_index}), got values in [{int(kept.min())}, {int(kept.max())}]")
    return CrossEntropy.apply(logits, t, ignore_index, label_smoothing, reduction)


def mse_loss(input, target, reduction: str = "mean"):  # noqa: A002 - PyTorch's name
    """Mean squared error: mean((input − target)²) (or its sum, or elementwise)."""
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"mse_loss: input shape {tuple(input.shape)} and target shape "
                         f"{tuple(target.shape)} differ")
    diff = E.sub(input, target)
    sq = E.mul(diff, diff)
    if reduction == "none":
        return sq
    if reduction == "sum":
        return R.sum(sq)
    if reduction == "mean":
        return R.mean(sq)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
