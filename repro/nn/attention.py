"""Attention building blocks shared by the papers: sinusoid positions, masks, and attention with memory.

Layout legend for this file: B batch, H heads, T query (current segment) length, M memory length, K = M + T key
length, D model width, E = per-head width. Tensors are batch-first; suffixes give their layout (`q_BHTE`).

Two attentions share one interface, `forward(h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None) -> (out_BTD,
kv_2BHKE)` (the output, and the keys/values of [memory; segment], which an evaluation memory can keep), and
differ only in the scores:
- `RelPartialLearnableAttention`: Transformer-XL's relative attention (Dai et al. 2019, §3.3, App. B),
  score(i, j) = q_i·k_j + q_i·W_kR R_{i-j} + u·k_j + v·W_kR R_{i-j}, the last two with learned u, v per head.
- `AbsoluteAttention`: the standard attention of Vaswani et al. (positions added to the input), with the memory
  prepended to the keys, as the reference's `attn_type=2`.
Masking, softmax, attention dropout and the value product are written once, in `attend`, which runs the kernel
its caller passes, each attention module's `kernel` setting (`set_attention_kernel(model, name)`, or for a block
`attention_kernel(model, name)`): `eager`, the scores as a (B, H, T, K) tensor, softmax in float32 (on a CPU in
row blocks, `repro.nn.blocked`), as the reference computes them; or `sdpa`, PyTorch's fused
`scaled_dot_product_attention`, with Transformer-XL's positional term and the mask passed as one additive bias
(its memory-efficient kernel on a GPU takes a bias and returns its gradient), so that the softmax's probabilities
never exist as a tensor. `auto` (the default) is `sdpa` on a GPU and `eager` on a CPU, where the blocked softmax is
faster and every committed result was computed. Both give the same function: tests/test_attention.py compares
them in float64, with gradients, and the parity suite runs either kernel against the authors' code.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from repro.nn import blocked
from repro.nn.dropout import Dropout, dropout_matmul


def sinusoid_table(pos_seq: torch.Tensor, d_model: int) -> torch.Tensor:
    """(len(pos_seq), d_model): [sin(p·f), cos(p·f)] with f = 1/10000^(2i/d), as the reference's
    `PositionalEmbedding`."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=pos_seq.device) / d_model))
    angles = torch.outer(pos_seq.float(), inv_freq)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_distances(k_len: int, *, clamp_len: int = -1, device=None) -> torch.Tensor:
    """Distances K-1, …, 1, 0 (the order the shift trick expects), clamped at `clamp_len` when it is > 0."""
    pos = torch.arange(k_len - 1, -1, -1, device=device)
    return pos.clamp(max=clamp_len) if clamp_len > 0 else pos


def rel_shift(x_BHTK: torch.Tensor) -> torch.Tensor:
    """Re-index scores computed against distances (K-1 … 0) so that out[..., i, j] holds distance (M + i − j).

    The shift trick of App. B pads one zero column on the left, views the (T, K+1) block as (K+1, T), drops its
    first row and views the rest as (T, K). The same re-indexing is a strided view of the input (row i starts
    T−1−i elements later) that copies nothing: `_RelShift`, whose backward writes the gradient back through the
    same view. Entries with j > M + i (future keys) hold other scores than the reference's (its pad zeros and
    wrapped rows; here wrapped rows) and must be masked, as in the reference; the two forms agree everywhere else,
    gradients included (tests/test_attention.py).
    """
    return _RelShift.apply(x_BHTK)


def _shift_view(x: torch.Tensor) -> torch.Tensor:
    *lead, t, k = x.shape
    return x.as_strided((*lead, t, k), (*x.stride()[:-2], k - 1, 1), x.storage_offset() + t - 1)


class _RelShift(torch.autograd.Function):
    """Forward: the strided view of a contiguous copy-free input. Backward: the gradient written into a zero
    tensor through the same view. The view's rows overlap by one element (out[i, K−1] is out[i+1, 0]), so the
    last column is added after the other columns are copied; the other columns are one contiguous range, which
    with the last column covers all of each block but its first T−1 elements (zeroed)."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.shape = x.shape
        return _shift_view(x)

    @staticmethod
    def backward(ctx, g):
        t = ctx.shape[-2]
        grad = g.new_empty(ctx.shape)
        grad[..., 0, : t - 1].zero_()  # the only elements of each (T, K) block the view does not reach
        view = _shift_view(grad)
        view[..., :-1].copy_(g[..., :-1])
        view[..., :-1, -1].add_(g[..., :-1, -1])  # rows 0 … T−2 of the last column alias the next row's first
        view[..., -1, -1].copy_(g[..., -1, -1])  # the block's last element, written by nothing else
        return grad


def softmax_lse(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) in float32 and the log-normaliser log Σ exp(scores) (float32), along the last axis: what
    `torch.softmax` and `torch.logsumexp` give, from one pass of exponentials instead of two (forward) or three
    (backward). Every row needs one finite score (a fully masked row is NaN, as in `torch.softmax`)."""
    return _SoftmaxLSE.apply(scores)


class _SoftmaxLSE(torch.autograd.Function):
    """lse = max s − log(max p): the largest probability is at least 1/K, so its logarithm is as accurate as
    logsumexp's (equal to rounding; tests/test_attention.py). ∂lse/∂s = p, so the gradient of both outputs is
    softmax's backward of g_p plus p·g_lse."""

    @staticmethod
    def forward(ctx, scores):
        prob = torch.softmax(scores, dim=-1, dtype=torch.float32)
        lse = scores.amax(dim=-1).float().sub_(prob.amax(dim=-1).log_())
        ctx.save_for_backward(prob)
        ctx.in_dtype = scores.dtype
        ctx.set_materialize_grads(False)
        return prob, lse

    @staticmethod
    def backward(ctx, g_prob, g_lse):
        (prob,) = ctx.saved_tensors
        grad = None
        if g_prob is not None:
            grad = torch.ops.aten._softmax_backward_data(g_prob.float(), prob, -1, torch.float32)
        if g_lse is not None:
            by_lse = prob * g_lse.float().unsqueeze(-1)
            grad = by_lse if grad is None else grad.add_(by_lse)
        return None if grad is None else grad.to(ctx.in_dtype)


def causal_mask(q_len: int, k_len: int, *, same_length: bool = False, span: int = 0, device=None) -> torch.Tensor:
    """(T, K) bool, True where query i may NOT attend key j. Query i sits at key position M + i, M = K − T.

    `same_length` (evaluation) makes every query see the same number of keys: the last `span` keys up to and
    including itself, once that many exist. `span` is the most keys before the segment: the configured memory
    length (the reference's `same_length` mask counts against the configured `mem_len`, not the memory actually
    present), plus the most rows a memory mechanism attends before it.
    """
    m = k_len - q_len
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + m)
    if same_length:
        excess = k_len - span
        shift = q_len - excess if excess > 0 else q_len
        mask = mask | torch.tril(ones, diagonal=-shift)
    return mask


KERNELS = ("auto", "eager", "sdpa")


def check_kernel(name: str) -> str:
    if name not in KERNELS:
        raise ValueError(f"the attention kernel is one of {', '.join(KERNELS)}, got {name!r}")
    return name


def _kernel_holders(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that call `attend` (each holds its `kernel` setting)."""
    return [m for m in model.modules() if isinstance(getattr(m, "kernel", None), str)]


def set_attention_kernel(model: nn.Module, name: str) -> None:
    """Every attention of `model` runs kernel `name` (`auto`, `eager` or `sdpa`: the module docstring); `repro fit
    --run.attention` and `repro bench --attention` set it on the model they build."""
    check_kernel(name)
    for m in _kernel_holders(model):
        m.kernel = name


@contextmanager
def attention_kernel(model: nn.Module, name: str):
    """Within the block, every attention of `model` runs kernel `name`; each module's own setting after it."""
    check_kernel(name)
    with attribute_within(_kernel_holders(model), "kernel", name):
        yield


@contextmanager
def attribute_within(modules, attribute: str, value):
    """Within the block, each of `modules` has `attribute` = `value`; each its own value after it."""
    before = [getattr(m, attribute) for m in modules]
    for m in modules:
        setattr(m, attribute, value)
    try:
        yield
    finally:
        for m, b in zip(modules, before):
            setattr(m, attribute, b)


def uses_sdpa(kernel: str, device: torch.device) -> bool:
    return kernel == "sdpa" or (kernel == "auto" and device.type == "cuda")


def _attend_sdpa(q_BHTE, k_BHKE, v_BHKE, mask_TK, score_bias_BHTK, p: float) -> torch.Tensor:
    """`attend` through `F.scaled_dot_product_attention` (q already scaled, so scale=1). The mask enters the bias
    as −inf (a new tensor: the bias may be a strided view, and the kernel wants rows of unit stride); without a bias
    it is a boolean mask (True: may attend, the opposite of ours)."""
    if score_bias_BHTK is None:
        mask = ~mask_TK
    else:
        mask = score_bias_BHTK.masked_fill(mask_TK, float("-inf"))
    # under autocast the kernel's inputs are cast to its precision (the queries, which the float32 biases u and v
    # promote, and the bias); outside it every input has the model's dtype
    return F.scaled_dot_product_attention(q_BHTE, k_BHKE, v_BHKE, attn_mask=mask, dropout_p=p, scale=1.0)


def attend(
    q_BHTE: torch.Tensor,
    k_BHKE: torch.Tensor,
    v_BHKE: torch.Tensor,
    *,
    mask_TK: torch.Tensor,
    score_bias_BHTK: torch.Tensor | None = None,
    dropatt: nn.Dropout,
    kernel: str,
) -> torch.Tensor:
    """softmax(q·kᵀ + bias, masked) · v → (B, H, T, E) with `kernel` (`auto`, `eager`, `sdpa`: the module
    docstring; the calling module's `kernel` setting). The caller scales q (and the bias) by 1/√E: scaling the
    (B, H, T, E) queries is cheaper than scaling the (B, H, T, K) scores."""
    if uses_sdpa(kernel, q_BHTE.device):
        return _attend_sdpa(q_BHTE, k_BHKE, v_BHKE, mask_TK, score_bias_BHTK,
                            dropatt.p if dropatt.training else 0.0)
    scores = q_BHTE @ k_BHKE.transpose(-1, -2)
    no_dropout = dropatt.p == 0 or not dropatt.training
    if no_dropout and mask_TK.dim() == 2 and blocked.handles(scores, v_BHKE):
        # bias, mask and softmax on each block of rows while it is in cache: the numbers of the lines below
        return blocked.masked_softmax(scores, score_bias_BHTK, mask_TK) @ v_BHKE
    if score_bias_BHTK is not None:
        scores = scores.add_(score_bias_BHTK)
    # −inf added rather than filled: the same scores, and a backward with nothing to do (the softmax's gradient
    # is already 0 where the probability is), where masked_fill's backward fills the (B, H, T, K) gradient again
    scores = scores.add_(torch.zeros(mask_TK.shape, dtype=scores.dtype, device=scores.device)
                         .masked_fill_(mask_TK, float("-inf")))
    # dropout and the value product in one: the backward keeps the softmax's probabilities and a bool mask, not
    # the dropped probabilities and a float mask beside them (`repro.nn.dropout`; same numbers)
    return dropout_matmul(torch.softmax(scores, dim=-1, dtype=torch.float32), v_BHKE, dropatt)


class _MemoryAttention(nn.Module):
    """Projections shared by both attentions: one (3·H·E, D) weight as the reference's `qkv_net`, applied as a
    query projection of the current segment and a key/value projection of [memory; segment] (the memory rows
    need no query)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.scale = 1.0 / math.sqrt(d_head)
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.dropatt = Dropout(dropatt)
        self.kernel = "auto"  # `attend`'s kernel (`set_attention_kernel`)

    def project(self, h_BTD: torch.Tensor, mem_BMD: torch.Tensor | None, kv_mem: torch.Tensor | None = None):
        """q (B,H,T,E); kv (2,B,H,K,E) = keys and values of [memory; segment], contiguous per head.

        With `kv_mem` (2,B,H,M,E) (evaluation only: the weights must not change between segments) the memory's
        keys and values are reused as computed when those positions were the current segment, instead of being
        projected again from the memory's hidden states: the same numbers at a fraction of the cost when the
        memory is much longer than the segment (Transformer-XL's evaluation uses 2100 or 3800 positions). The
        returned kv then serves as the next memory (the caller keeps its last mem_len positions)."""
        b, t, _ = h_BTD.shape
        he = self.n_head * self.d_head
        w = self.qkv_net.weight
        q_BHTE = F.linear(h_BTD, w[:he]).view(b, t, self.n_head, self.d_head).transpose(1, 2)
        src = h_BTD
        if kv_mem is None and mem_BMD is not None and mem_BMD.shape[1]:
            src = torch.cat([mem_BMD, h_BTD], dim=1)
        kv = F.linear(src, w[he:]).view(b, src.shape[1], 2, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)
        if kv_mem is not None and kv_mem.shape[3]:
            kv = torch.cat([kv_mem.to(kv.dtype), kv], dim=3)
        return q_BHTE, kv.contiguous()

    def output(self, out_BHTE: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out_BHTE.shape
        return self.o_net(out_BHTE.transpose(1, 2).reshape(b, t, self.n_head * self.d_head))


class RelPartialLearnableAttention(_MemoryAttention):
    """Transformer-XL attention. `pos` is (r_KD, u_HE, v_HE): sinusoids of distances K-1 … 0 and the two biases
    (the reference's `r_w_bias` = u, `r_r_bias` = v, shared by all layers)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)  # W_kR

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None):
        r_KD, u_HE, v_HE = pos
        q_BHTE, kv = self.project(h_BTD, mem_BMD, kv_mem)
        r_HEK = self.r_net(r_KD).view(-1, self.n_head, self.d_head).permute(1, 2, 0)
        bd_BHTK = rel_shift(((q_BHTE + v_HE[:, None]) * self.scale) @ r_HEK)  # terms (b) + (d)
        k_BHKE, v_BHKE = kv.unbind(0)  # unbind: its backward stacks; indexing would zero-fill (2, B, H, K, E) twice
        out = attend((q_BHTE + u_HE[:, None]) * self.scale, k_BHKE, v_BHKE,  # terms (a) + (c)
                     mask_TK=mask_TK, score_bias_BHTK=bd_BHTK, dropatt=self.dropatt, kernel=self.kernel)
        return self.output(out), kv


class AbsoluteAttention(_MemoryAttention):
    """Vaswani et al. attention over [memory; segment]; positions enter through the input, `pos` is unused."""

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos=None, kv_mem=None):
        q_BHTE, kv = self.project(h_BTD, mem_BMD, kv_mem)
        k_BHKE, v_BHKE = kv.unbind(0)
        out = attend(q_BHTE * self.scale, k_BHKE, v_BHKE, mask_TK=mask_TK, dropatt=self.dropatt,
                     kernel=self.kernel)
        return self.output(out), kv


class PositionwiseFF(nn.Module):
    """Linear → ReLU → dropout → Linear → dropout (the reference's `CoreNet`). The ReLU is out of place: in place
    on the linear's output (a view) its backward copies the whole (B, T, d_inner) tensor twice (CopySlices);
    same numbers either way."""

    def __init__(self, *, d_model: int, d_inner: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.ReLU(), Dropout(dropout),
            nn.Linear(d_inner, d_model), Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)
