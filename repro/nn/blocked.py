"""Row-blocked attention softmax and float32 cross-entropy on a CPU: the numbers of the whole-tensor forms, bit for
bit, at a fraction of their memory traffic.

The attention's scores are a (B, H, T, K) tensor; written as whole-tensor steps (add the positional bias, add the
−inf mask, softmax, under bf16 in float32 and back), each step walks it in main memory, and in the backward pass as
many again. The output logits under bf16 take their cross-entropy in float32 the same way. Here each block of rows
(`BLOCK` float32 elements, 1 MB, a core's cache) goes through the same kernels while it is in cache; under bf16 the
backward pass recomputes the float32 block from the saved input instead of keeping a float32 copy of the whole
tensor. Rows are independent and the additions elementwise, so blocking gives the same numbers and gradients as
the whole tensor (tests/test_attention.py: both functions, and the whole attention in float32 and under bf16
autocast; checked bit for bit at the 41M, small and tiny shapes). One caveat is PyTorch's, not the blocking's: at
row widths that are not a multiple of the vector width its float32 softmax backward can differ in the last bit
with how rows are split among threads (the whole tensor on 1 thread against 2), so there a block's rows can
differ as the whole tensor's differ between thread counts. Reduced precision is softmaxed in float32 and
converted: PyTorch's own bf16 softmax rounds differently at some widths (108 of the tiny compressive
Transformer's keys; float16 at 333), though not at 64, 256 or 1024.

Measured (2 cores, torch 2.13, forward + backward): the 2 × 8 × 512 × 1024 attention scores of the 41M enwik8
model, softmax alone, 54 → 15 ms in bf16 (AMD EPYC); bias, mask and softmax together 48 → 42 ms in bf16 (Intel
Xeon with AMX); the 2,048 × 4,720 logits of the small word-level model 77 → 21 ms in bf16 and 63 → 54 ms in
float32 (AMD EPYC).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOW = (torch.bfloat16, torch.float16)
BLOCK = 1 << 18  # float32 elements per row block


def _blocks(k: int, n_rows: int):
    step = max(1, BLOCK // k)
    return ((i, min(i + step, n_rows)) for i in range(0, n_rows, step))


def handles(scores: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `masked_softmax` serves these scores (on a CPU, float32 or reduced precision, v of the same dtype)."""
    return scores.device.type == "cpu" and scores.dtype == v.dtype and (
        scores.dtype == torch.float32 or scores.dtype in LOW)


def masked_softmax(scores_BHTK: torch.Tensor, bias_BHTK: torch.Tensor | None, mask_TK: torch.Tensor) -> torch.Tensor:
    """Attention probabilities (`mask_TK` (T, K), True where forbidden): the numbers of the whole-tensor form, bit
    for bit, in row blocks:

        scores.add_(bias).add_(zeros(T, K).masked_fill_(mask, −inf))
        float32 scores: torch.softmax(scores, −1);  bf16/fp16: torch.softmax(scores, −1, dtype=float32).to(dtype)

    with the same gradient for the scores and for the bias (the gradient of the softmax's input, as the two
    additions pass it on). The bias (e.g. Transformer-XL's shifted positional term, a strided view) and the mask
    are added to each block while it is in cache, instead of in two more passes over the whole tensor. `scores`
    (B, H, T, K) is overwritten with the biased, masked scores (reduced precision: kept for the backward pass, which
    recomputes each float32 block from them; float32: the probabilities are kept, as torch.softmax keeps them)."""
    return _MaskedSoftmax.apply(scores_BHTK, bias_BHTK, mask_TK)


def cross_entropy_float32(logits_NV: torch.Tensor, target_N: torch.Tensor) -> torch.Tensor:
    """`F.cross_entropy(logits.float(), target, reduction="none")` (float32, (N,)): same values and gradient."""
    return _CrossEntropyFloat32.apply(logits_NV, target_N)


def _blocks_bhtk(bh: int, t: int, k: int):
    """(b0, b1, t0, t1) covering a (BH, T, K) tensor: whole (T, K) matrices per block where they fit, else rows."""
    if t * k <= BLOCK:
        step = max(1, BLOCK // (t * k))
        return ((i, min(i + step, bh), 0, t) for i in range(0, bh, step))
    step = max(1, BLOCK // k)
    return ((i, i + 1, j, min(j + step, t)) for i in range(bh) for j in range(0, t, step))


class _MaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, bias, mask):
        *lead, t, k = scores.shape
        low = scores.dtype in LOW
        s3 = scores.view(-1, t, k)  # the product's output: contiguous
        # a view where the strides allow (Transformer-XL's shifted term does), else one copy (a broadcast bias)
        b3 = None if bias is None else bias.expand(scores.shape).reshape(-1, t, k)
        neg = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device).masked_fill_(mask, float("-inf"))
        out = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
        o3 = out.view(-1, t, k)
        for b0, b1, t0, t1 in _blocks_bhtk(s3.shape[0], t, k):
            blk = s3[b0:b1, t0:t1]
            if b3 is not None:
                blk.add_(b3[b0:b1, t0:t1])
            blk.add_(neg[t0:t1])
            if low:  # in float32 and converted: torch's own bf16/fp16 softmax differs at some widths (108, 333)
                o3[b0:b1, t0:t1].copy_(torch.softmax(blk.float(), dim=-1))
            else:
                torch.softmax(blk, dim=-1, out=o3[b0:b1, t0:t1])
        ctx.low, ctx.has_bias = low, bias is not None
        ctx.save_for_backward(scores if low else out)
        return out

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        *lead, t, k = saved.shape
        x3, g3 = saved.view(-1, t, k), g.reshape(-1, t, k)
        grad = torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
        gr3 = grad.view(-1, t, k)
        for b0, b1, t0, t1 in _blocks_bhtk(x3.shape[0], t, k):
            if ctx.low:
                p = torch.softmax(x3[b0:b1, t0:t1].float(), dim=-1)
                gr3[b0:b1, t0:t1].copy_(torch._softmax_backward_data(g3[b0:b1, t0:t1].float(), p, -1, torch.float32))
            else:
                gr3[b0:b1, t0:t1] = torch._softmax_backward_data(g3[b0:b1, t0:t1], x3[b0:b1, t0:t1], -1,
                                                                 torch.float32)
        return grad, (grad if ctx.has_bias else None), None


class _CrossEntropyFloat32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target):
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        for i, j in _blocks(x.shape[1], x.shape[0]):
            out[i:j] = F.cross_entropy(x[i:j].float(), target[i:j], reduction="none")
        ctx.save_for_backward(x, target)
        return out

    @staticmethod
    def backward(ctx, g):
        x, target = ctx.saved_tensors
        grad = torch.empty_like(x)
        for i, j in _blocks(x.shape[1], x.shape[0]):
            with torch.enable_grad():  # the one-expression form's own backward kernels, on one block
                xb = x[i:j].detach().requires_grad_()
                (gb,) = torch.autograd.grad(F.cross_entropy(xb.float(), target[i:j], reduction="none"), xb, g[i:j])
            grad[i:j] = gb
        return grad, None
