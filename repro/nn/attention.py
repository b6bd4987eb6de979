"""Attention building blocks shared by the papers: sinusoid positions, masks, and attention with memory.

Layout legend for this file: B batch, H heads, T query (current segment) length, M memory length, K = M + T key
length, D model width, E = per-head width. Tensors are batch-first; suffixes give their layout (`q_BHTE`).

Two attentions share one interface, `forward(h_BTD, *, mem_BMD, mask_TK, pos) -> (B, T, D)`, and differ only in
the scores:
- `RelPartialLearnableAttention`: Transformer-XL's relative attention (Dai et al. 2019, §3.3, App. B),
  score(i, j) = q_i·k_j + q_i·W_kR R_{i-j} + u·k_j + v·W_kR R_{i-j}, the last two with learned u, v per head.
- `AbsoluteAttention`: the standard attention of Vaswani et al. (positions added to the input), with the memory
  prepended to the keys, as the reference's `attn_type=2`.
Masking, softmax, attention dropout and the value product are written once, in `attend`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoid_table(pos_seq: torch.Tensor, d_model: int) -> torch.Tensor:
    """(len(pos_seq), d_model): [sin(p·f), cos(p·f)] with f = 1/10000^(2i/d), as the reference's `PositionalEmbedding`."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=pos_seq.device) / d_model))
    angles = torch.outer(pos_seq.float(), inv_freq)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_distances(k_len: int, *, clamp_len: int = -1, device=None) -> torch.Tensor:
    """Distances K-1, …, 1, 0 (the order the shift trick expects), clamped at `clamp_len` when it is > 0."""
    pos = torch.arange(k_len - 1, -1, -1, device=device)
    return pos.clamp(max=clamp_len) if clamp_len > 0 else pos


def rel_shift(x_BHTK: torch.Tensor) -> torch.Tensor:
    """Re-index scores computed against distances (K-1 … 0) so that out[..., i, j] holds distance (M + i − j).

    The shift trick of App. B: pad one zero column on the left, view the (T, K+1) block as (K+1, T), drop its
    first row and view the rest as (T, K). Entries with j > M + i (future keys) hold garbage and must be masked.
    """
    *lead, t, k = x_BHTK.shape
    padded = F.pad(x_BHTK, (1, 0))  # (…, T, K+1)
    return padded.view(*lead, k + 1, t)[..., 1:, :].reshape(*lead, t, k)


def causal_mask(q_len: int, k_len: int, *, same_length: bool = False, mem_len: int = 0, device=None) -> torch.Tensor:
    """(T, K) bool, True where query i may NOT attend key j. Query i sits at key position M + i, M = K − T.

    `same_length` (evaluation) makes every query see the same number of keys: the last `mem_len` keys up to and
    including itself, once that many exist (the reference's `same_length` mask, which counts against the
    configured `mem_len`, not the memory actually present).
    """
    m = k_len - q_len
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + m)
    if same_length:
        excess = k_len - mem_len
        shift = q_len - excess if excess > 0 else q_len
        mask = mask | torch.tril(ones, diagonal=-shift)
    return mask


def attend(
    q_BHTE: torch.Tensor,
    k_BHKE: torch.Tensor,
    v_BHKE: torch.Tensor,
    *,
    mask_TK: torch.Tensor,
    score_bias_BHTK: torch.Tensor | None = None,
    dropatt: nn.Dropout,
) -> torch.Tensor:
    """softmax((q·kᵀ + bias) / √E, masked) · v → (B, H, T, E)."""
    scores = q_BHTE @ k_BHKE.transpose(-1, -2)
    if score_bias_BHTK is not None:
        scores = scores + score_bias_BHTK
    scores = (scores * (1.0 / math.sqrt(q_BHTE.shape[-1]))).masked_fill(mask_TK, float("-inf"))
    prob = dropatt(torch.softmax(scores, dim=-1, dtype=torch.float32))
    return prob.to(v_BHKE.dtype) @ v_BHKE


class _MemoryAttention(nn.Module):
    """Projections shared by both attentions: one (3·H·E, D) weight as the reference's `qkv_net`, applied as a
    query projection of the current segment and a key/value projection of [memory; segment] (the memory rows
    need no query)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.dropatt = nn.Dropout(dropatt)

    def project(self, h_BTD: torch.Tensor, mem_BMD: torch.Tensor | None):
        b, t, _ = h_BTD.shape
        he = self.n_head * self.d_head
        w = self.qkv_net.weight
        cat_BKD = h_BTD if mem_BMD is None or mem_BMD.shape[1] == 0 else torch.cat([mem_BMD, h_BTD], dim=1)
        q_BTHE = F.linear(h_BTD, w[:he]).view(b, t, self.n_head, self.d_head)
        kv = F.linear(cat_BKD, w[he:]).view(b, cat_BKD.shape[1], 2, self.n_head, self.d_head)
        return q_BTHE, kv[:, :, 0], kv[:, :, 1]  # (B,T,H,E), (B,K,H,E), (B,K,H,E)

    def output(self, out_BHTE: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out_BHTE.shape
        return self.o_net(out_BHTE.transpose(1, 2).reshape(b, t, self.n_head * self.d_head))


class RelPartialLearnableAttention(_MemoryAttention):
    """Transformer-XL attention. `pos` is (r_KD, u_HE, v_HE): sinusoids of distances K-1 … 0 and the two biases
    (the reference's `r_w_bias` = u, `r_r_bias` = v, shared by all layers)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)  # W_kR

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos):
        r_KD, u_HE, v_HE = pos
        q_BTHE, k_BKHE, v_BKHE = self.project(h_BTD, mem_BMD)
        r_HEK = self.r_net(r_KD).view(-1, self.n_head, self.d_head).permute(1, 2, 0)
        q_BHTE = q_BTHE.transpose(1, 2)
        bd_BHTK = rel_shift((q_BHTE + v_HE[:, None]) @ r_HEK)  # terms (b) + (d)
        out = attend(q_BHTE + u_HE[:, None], k_BKHE.transpose(1, 2), v_BKHE.transpose(1, 2),  # (a) + (c)
                     mask_TK=mask_TK, score_bias_BHTK=bd_BHTK, dropatt=self.dropatt)
        return self.output(out)


class AbsoluteAttention(_MemoryAttention):
    """Vaswani et al. attention over [memory; segment]; positions enter through the input, `pos` is unused."""

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos=None):
        q_BTHE, k_BKHE, v_BKHE = self.project(h_BTD, mem_BMD)
        out = attend(q_BTHE.transpose(1, 2), k_BKHE.transpose(1, 2), v_BKHE.transpose(1, 2),
                     mask_TK=mask_TK, dropatt=self.dropatt)
        return self.output(out)


class PositionwiseFF(nn.Module):
    """Linear → ReLU → dropout → Linear → dropout (the reference's `CoreNet`)."""

    def __init__(self, *, d_model: int, d_inner: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_inner), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(d_inner, d_model), nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)
