"""Dropout with a cheaper random draw on the CPU; `Dropout` is a drop-in `nn.Dropout`.

Follows `torch.nn.Dropout` (inverted dropout: kept units scaled by 1/(1−p), identity in evaluation). Differs in
how the mask is drawn on the CPU only: torch's CPU dropout draws a float Bernoulli per unit, which took more time
than any matmul but two in a Transformer-XL training step at the small shape (`torch.profiler`, issue 15). Here the
mask is one int32 of random bits per unit compared with round(p·2³¹) (`random_` on int32 is uniform on
[0, 2³¹)), so a unit is dropped with probability p to within 2⁻³¹. Same distribution, different draws: a
run with dropout > 0 is not bit-identical to one with `nn.Dropout`. On other devices (fused CUDA kernels) and at
p = 0 (no draw at all, as torch) it is `F.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 2**31


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    if p >= 1.0:
        return x * 0.0
    bits = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    keep = (bits >= round(p * _BITS)).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * keep


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, state and repr) drawing its CPU mask with `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return dropout(x, self.p, self.training)
