"""MGK inside Transformer-XL: attention keys as Gaussian mixtures (Nguyen et al. 2022), with the memory and the
relative positions of Transformer-XL (Dai et al. 2019), alone and with LaMemo's look-ahead memory (Ji et al. 2022).

Follows `papers.mgk.attention.MGKAttention` (the mixture keys, π, σ², and its one-product joint softmax over
(component, key) pairs) and `repro.nn.attention.RelPartialLearnableAttention` (terms (b) + (d) of the relative
score, with the model's v bias and the layer's `r_net`). The score of query i and key j is

    s_ij = logsumexp_r(log π_r − ‖q_i − k_jr‖² / 2σ_r²) + (q_i + v) · W_R R_{i−j} / √E,

a masked softmax over j, then the values. Neither paper defines this combination: MGK's language models use
absolute positions and no memory, Transformer-XL's content terms (a) + (c) are dot products. Here the mixture's
distance score takes the place of (a) + (c) (so the u bias is unused) and the position terms stay as they are.
The look-ahead variant computes LaMemo's look-ahead (memory rows attend to the window on their right, with the
future position table and v₊, interpolated with their carried vectors by the log-normalisers) with the same
score: the union-of-key-sets identity behind the interpolation holds for any scores, these included.
"""

from __future__ import annotations

import math

import torch

from papers.lamemo.model import interpolate, window_position_scores
from papers.mgk.attention import MGKAttention
from repro.nn.attention import rel_shift
from repro.nn.dropout import dropout_matmul


class RelativeMGKAttention(MGKAttention):
    """MGK attention over [memory; segment] with Transformer-XL's relative position terms. `pos` is
    (r_KD, u_HE, v_HE); the interface of `repro.nn.attention` (returns (output, None): no key/value memory)."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, **mgk):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt, **mgk)
        if self.weights.kind != "gradient":
            raise ValueError("MGK inside Transformer-XL learns π by gradient (mgk.pi: gradient)")
        self.r_net = torch.nn.Linear(d_model, n_head * d_head, bias=False)  # W_kR
        self.scale = 1.0 / math.sqrt(d_head)

    def position_scores(self, q_BHTE, r_KD, v_HE):
        """Terms (b) + (d): (q_i + v) · W_R R_{i−j} / √E, (B, H, T, K)."""
        r_HEK = self.r_net(r_KD).view(-1, self.n_head, self.d_head).permute(1, 2, 0)
        return rel_shift(((q_BHTE + v_HE[:, None]) * self.scale) @ r_HEK.to(q_BHTE.dtype))

    def attend(self, q_BHTE, k_BHRKE, v_BHKE, mask, bias):
        """(vectors (B, H, T, E), log-normalisers (B, H, T) float32) of the mixture scores plus `bias`."""
        prob, lse = self.joint_probabilities(q_BHTE.float(), k_BHRKE.float(), mask, with_lse=True,
                                             score_bias=bias.float())
        return dropout_matmul(prob.sum(-2), v_BHKE, self.dropatt), lse

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None):
        if kv_mem is not None:
            raise ValueError("MGK inside Transformer-XL keeps hidden states, not keys and values")
        r_KD, _, v_HE = pos[:3]
        src = torch.cat([mem_BMD.to(h_BTD.dtype), h_BTD], dim=1) if mem_BMD is not None and mem_BMD.shape[1] \
            else h_BTD
        q, k, v = self.proj(h_BTD, src)
        vec, _ = self.attend(q, k, v, mask_TK, self.position_scores(q, r_KD, v_HE))
        b, t, _ = h_BTD.shape
        return self.o_net(vec.transpose(1, 2).reshape(b, t, -1)), None


class LookAheadMGKAttention(RelativeMGKAttention):
    """`RelativeMGKAttention` that also refreshes memory rows by LaMemo's look-ahead (`look_ahead`, the interface
    of `papers.lamemo.model.LaMemoAttention.look_ahead`: `layer_look_ahead` calls it)."""

    def __init__(self, *, full: bool = False, **kw):
        if full:
            raise ValueError("MGK with look-ahead takes the variants disentangled, txl or disentangled_v2")
        super().__init__(**kw)

    def look_ahead(self, x_BKD, m: int, *, bias_TK, pos, recur_BMHE, lse_BMH, first: int = 0,
                   memory_output: bool = True):
        r_KD, _, v_HE, r_fut_MD, _, v_fut_HE, window = pos
        b, k_len, _ = x_BKD.shape
        q, k, v = self.proj(x_BKD, x_BKD)  # queries of every row; keys (B, H, R, K, E); values (B, H, K, E)
        q_cur = q[:, :, m:]
        vec, lse = self.attend(q_cur, k, v, torch.isinf(bias_TK), self.position_scores(q_cur, r_KD, v_HE))
        out_cur = self.o_net(vec.transpose(1, 2).reshape(b, k_len - m, -1))
        vec_cur, lse_cur = vec.transpose(1, 2), lse.transpose(1, 2)
        if memory_output and first:
            raise ValueError("the memory rows' output needs every memory row refreshed (first = 0)")
        if first >= m:
            empty = x_BKD.new_empty(b, 0, x_BKD.shape[2]) if memory_output else None
            return out_cur, empty, None, None, vec_cur, lse_cur
        start, index_MW, bias_MW = window
        qm = q[:, :, first:m]
        r_HEN = self.r_net(r_fut_MD).view(-1, self.n_head, self.d_head).permute(1, 2, 0).to(qm.dtype)
        bd = window_position_scores((qm + v_fut_HE[:, None]) * self.scale, r_HEN, index_MW, m=m, t=k_len - m,
                                    first=first, full=False)
        mask = torch.isinf(bias_MW[first:]) if bias_MW is not None else torch.zeros_like(bd, dtype=torch.bool)
        vec_new, lse_new = self.attend(qm, k[:, :, :, start : m + 1], v[:, :, start : m + 1], mask, bd)
        vec_mem, lse_mem = interpolate(recur_BMHE[:, first:], lse_BMH[:, first:], vec_new.transpose(1, 2),
                                       lse_new.transpose(1, 2))
        out_mem = self.o_net(vec_mem.reshape(b, m - first, -1)) if memory_output else None
        return out_cur, out_mem, vec_mem, lse_mem, vec_cur, lse_cur
