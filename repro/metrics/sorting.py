"""Token accuracy on the sorted output of the ∞-former's sorting task (the official `evaluate`: argmax prediction
against the target at every scored position, summed over the split, divided by the number of scored positions).

Counts are summed over batches and DDP ranks before the division, never averaged per batch or per rank.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


class SortedTokenAccuracy(Metric):
    """`update(pred, target)` with predicted ids and targets of the same shape; positions whose target equals
    `ignore_index` (the pad) are not scored. `compute()` = correct / scored over everything seen."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, ignore_index: int, **kwargs):
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        self.add_state("correct", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        if pred.shape != target.shape:
            raise ValueError(f"predictions {tuple(pred.shape)} and targets {tuple(target.shape)} differ in shape")
        scored = target != self.ignore_index
        self.correct += (pred.eq(target) & scored).sum()
        self.total += scored.sum()

    def compute(self) -> torch.Tensor:
        if self.total == 0:
            raise RuntimeError("no sorted-output token was scored")
        return self.correct.double() / self.total
