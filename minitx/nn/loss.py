"""Loss modules with PyTorch's names and layouts, each calling its functional op
(``minitx.ops.loss``, where the formula is stated).

``CrossEntropyLoss`` takes PyTorch's layout: logits (C,), (N, C) or (N, C, d₁, …) with the
classes on axis 1, and targets (), (N) or (N, d₁, …). ``F.cross_entropy`` takes the classes on
the *last* axis, the layout of a language model's (B, T, V) logits; the module moves axis 1
last and calls it.
"""
from __future__ import annotations

from .. import validate
from ..ops.loss import cross_entropy
from ..ops.shape import transpose
from .module import Module

__all__ = ["CrossEntropyLoss"]


class CrossEntropyLoss(Module):
    """PyTorch's ``nn.CrossEntropyLoss(ignore_index=-100, reduction="mean",
    label_smoothing=0.0)``: ``loss(input, target)`` with input (C,), (N, C) or (N, C, d₁, …)
    logits and target (), (N) or (N, d₁, …) integer classes; ``reduction`` "mean" (over the
    targets not equal to ``ignore_index``), "sum" or "none" (the target's shape).

    ``weight`` (per-class weights) is not supported: pass ``reduction="none"`` and weight the
    per-target losses, ``(loss * w[target]).sum() / w[target].sum()``, PyTorch's weighted mean.
    Class-probability targets are not supported either: write
    ``-(p * F.log_softmax(input, axis=1)).sum(axis=1).mean()``. Cost: one softmax, O(N·C).
    """

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        if weight is not None:
            raise validate.OptionError(
                "CrossEntropyLoss: weight (per-class weights) is not supported; use "
                "reduction='none' and weight the losses: (loss * w[target]).sum() / "
                "w[target].sum() is PyTorch's weighted mean")
        self.ignore_index = validate.integer(ignore_index, "ignore_index",
                                             owner="CrossEntropyLoss")
        self.reduction = validate.choice(reduction, "reduction", ("mean", "sum", "none"),
                                         owner="CrossEntropyLoss")
        self.label_smoothing = validate.real(label_smoothing, "label_smoothing", minimum=0.0,
                                             maximum=1.0, owner="CrossEntropyLoss")

    def forward(self, input, target):  # noqa: A002 - PyTorch's name
        shape, t_shape = tuple(input.shape), tuple(target.shape)
        expected = shape[:1] + shape[2:] if len(shape) >= 2 else ()
        if t_shape != expected:
            hint = ""
            if len(shape) >= 3 and t_shape == shape[:-1]:
                hint = ("; the classes are on axis 1 here (PyTorch's layout): for logits with "
                        "the classes last, (B, T, C), use F.cross_entropy(input, target), or "
                        "pass input.transpose((0, 2, 1))")
            raise validate.OptionError(
                f"CrossEntropyLoss: target must have shape {expected} for input {shape} "
                f"(input's shape without its class axis 1), got {t_shape}{hint}")
        if len(shape) >= 3:          # (N, C, d₁, …) -> (N, d₁, …, C): the classes last
            input = transpose(input, (0, *range(2, len(shape)), 1))  # noqa: A001
        return cross_entropy(input, target, ignore_index=self.ignore_index,
                             label_smoothing=self.label_smoothing, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")
