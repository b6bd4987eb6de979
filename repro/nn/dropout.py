"""Dropout with a cheaper random draw and a one-byte saved mask on the CPU; `Dropout` is a drop-in `nn.Dropout`.

Follows `torch.nn.Dropout` (inverted dropout: kept units scaled by 1/(1−p), identity in evaluation). Differs on the
CPU only, in two ways:
- How the mask is drawn: torch's CPU dropout draws a float Bernoulli per unit, which took more time than any
  matmul but two in a Transformer-XL training step at the small shape (`torch.profiler`). Here the mask
  is one int32 of random bits per unit compared with round(p·2³¹) (`random_` on int32 is uniform on [0, 2³¹)), so
  a unit is dropped with probability p to within 2⁻³¹. Same distribution, different draws: a run with dropout > 0
  is not bit-identical to one with `nn.Dropout`.
- What the backward pass keeps: the mask as bool (1 byte a unit), the scaled float mask rebuilt from it when the
  gradient comes, where `x * keep` kept a float mask of x's size (4 bytes a unit in float32). Same numbers, bit
  for bit (tests/test_dropout.py). `dropout_matmul(prob, v, p)`, dropout(prob) @ v, keeps nothing but that mask
  beside what the softmax before it keeps already: the attention's dropped probabilities, a (B, H, T, K) float32
  tensor per layer, are rebuilt in the backward pass instead of being kept (with the float mask and the
  dropped copy, Transformer-XL's 24-layer enwik8 model kept three such tensors per layer). Measured at that
  model's rehearsal shape (batch 2 × 768, memory 768, dropout 0.15): the backward pass kept 385 MiB of
  activations per layer, now 231 MiB (9.0 → 5.4 GB for the 24 layers).
On other devices (fused CUDA kernels) and at p = 0 (no draw at all, as torch) it is `F.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 2**31


def _draw_mask(shape: torch.Size, p: float, device) -> torch.Tensor:
    """Bool, True where a unit is kept (see the module's docstring)."""
    return torch.empty(shape, dtype=torch.int32, device=device).random_() >= round(p * _BITS)


def _keep(mask: torch.Tensor, p: float, dtype: torch.dtype) -> torch.Tensor:
    """The scaled float mask, 0 or 1/(1−p) in `dtype`: what the forward and the backward multiply by."""
    return mask.to(dtype).mul_(1.0 / (1.0 - p))


class _MaskedScale(torch.autograd.Function):
    """x · keep, keeping the bool mask for the backward pass (not `keep`, x's size in x's dtype)."""

    @staticmethod
    def forward(ctx, x, mask, p):
        ctx.save_for_backward(mask)
        ctx.p = p
        return x * _keep(mask, p, x.dtype)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * _keep(mask, ctx.p, g.dtype), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    if p >= 1.0:
        return x * 0.0
    mask = _draw_mask(x.shape, p, x.device)
    if not (x.requires_grad and torch.is_grad_enabled()):
        return x * _keep(mask, p, x.dtype)
    return _MaskedScale.apply(x, mask, p)


class _DropoutMatmul(torch.autograd.Function):
    """dropout(prob) @ v keeping prob (the softmax keeps it already: one storage), the bool mask and v (kept by the
    attention's own products anyway); the backward pass rebuilds the dropped probabilities. The product runs in
    the dtype it ran in forward (v's, or autocast's), its gradients return in their inputs' dtypes, as the
    unfused `(prob * keep).to(v.dtype) @ v` gives them."""

    @staticmethod
    def forward(ctx, prob, v, mask, p):
        dropped = prob * _keep(mask, p, prob.dtype)
        out = dropped.to(v.dtype) @ v
        ctx.save_for_backward(prob, v, mask)
        ctx.p, ctx.mm_dtype = p, out.dtype
        return out

    @staticmethod
    def backward(ctx, g):
        prob, v, mask = ctx.saved_tensors
        keep = _keep(mask, ctx.p, prob.dtype)
        dt = ctx.mm_dtype
        g = g.to(dt)
        grad_v = (prob * keep).to(dt).transpose(-1, -2) @ g
        grad_prob = (g @ v.to(dt).transpose(-1, -2)).to(prob.dtype).mul_(keep)
        return grad_prob, grad_v.to(v.dtype), None, None


def dropout_matmul(prob: torch.Tensor, v: torch.Tensor, module: nn.Dropout) -> torch.Tensor:
    """`module(prob).to(v.dtype) @ v` (an attention's dropout on its probabilities, then the value product): the
    same numbers and gradients, keeping a bool mask instead of the dropped probabilities and a float mask on the
    CPU (see the module's docstring)."""
    p = module.p
    # torch's own dropout (its draws), in place, inactive, or nothing to differentiate: the unfused form
    if not isinstance(module, Dropout) or module.inplace or not module.training or not 0.0 < p < 1.0 \
            or prob.device.type != "cpu" or not torch.is_grad_enabled():
        return module(prob).to(v.dtype) @ v
    return _DropoutMatmul.apply(prob, v, _draw_mask(prob.shape, p, prob.device), p)


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, state and repr) drawing its CPU mask with `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return dropout(x, self.p, self.training)
