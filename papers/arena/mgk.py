"""MGK inside Transformer-XL: attention keys as Gaussian mixtures (Nguyen et al. 2022), with the memory and the
relative positions of Transformer-XL (Dai et al. 2019), alone and with LaMemo's look-ahead memory (Ji et al. 2022).

Follows `papers.mgk.attention.MGKAttention` (the mixture keys, π, σ², and its one-product joint softmax over
(component, key) pairs) and `repro.nn.attention.RelPartialLearnableAttention` (terms (b) + (d) of the relative
score, with the model's v bias and the layer's `r_net`). The score of query i and key j is

    s_ij = logsumexp_r(log π_r − ‖q_i − k_jr‖² / 2σ_r²) + (q_i + v) · W_R R_{i−j} / √E,

a masked softmax over j, then the values. Neither paper defines this combination: MGK's language models use
absolute positions and no memory, Transformer-XL's content terms (a) + (c) are dot products. Here the mixture's
distance score takes the place of (a) + (c) (so the u bias is unused) and the position terms stay as they are.
The look-ahead variant runs LaMemo's look-ahead itself (`papers.lamemo.model.LaMemoAttention.look_ahead`: memory
rows attend to the window on their right, with the future position table and v₊, interpolated with their carried
vectors by the log-normalisers) through its score hooks, which this attention gives: the union-of-key-sets
identity behind the interpolation holds for any scores, these included.
"""

from __future__ import annotations

import math

import torch

from papers.lamemo.model import LaMemoAttention
from papers.mgk.attention import MGKAttention
from repro.nn.attention import rel_shift
from repro.nn.dropout import dropout_matmul


class RelativeMGKAttention(MGKAttention):
    """MGK attention over [memory; segment] with Transformer-XL's relative position terms. `pos` is
    (r_KD, u_HE, v_HE); the interface of `repro.nn.attention` (returns (output, None): no key/value memory). Its
    score hooks (`rows`, `key_window`, `position_scores`, `scored`) are those `LaMemoAttention.look_ahead` runs."""

    def __init__(self, *, d_model: int, n_head: int, d_head: int, dropatt: float, **mgk):
        super().__init__(d_model=d_model, n_head=n_head, d_head=d_head, dropatt=dropatt, **mgk)
        if self.weights.kind != "gradient":
            raise ValueError("MGK inside Transformer-XL learns π by gradient (mgk.pi: gradient)")
        self.r_net = torch.nn.Linear(d_model, n_head * d_head, bias=False)  # W_kR
        self.scale = 1.0 / math.sqrt(d_head)

    def rows(self, x_BKD):
        """Queries (B, H, K, E), mixture keys (B, H, R, K, E) and values (B, H, K, E) of every row of x."""
        return self.proj(x_BKD, x_BKD)

    @staticmethod
    def key_window(k_BHRKE, start: int, end: int):
        return k_BHRKE[:, :, :, start:end]

    def position_scores(self, q_BHTE, r_KD, v_HE):
        """Terms (b) + (d): (q_i + v) · W_R R_{i−j} / √E, (B, H, T, K)."""
        r_HEK = self.r_net(r_KD).view(-1, self.n_head, self.d_head).permute(1, 2, 0)
        return rel_shift(((q_BHTE + v_HE[:, None]) * self.scale) @ r_HEK.to(q_BHTE.dtype))

    def scored(self, q_BHTE, k_BHRKE, v_BHKE, u_HE, position_BHTK, bias_TK, *, record: bool = False):
        """(vectors (B, H, T, E), log-normalisers (B, H, T) float32) of the mixture scores plus the position term,
        masked where `bias_TK` is −inf; the content bias u has no place in a distance score and is unused."""
        mask = torch.isinf(bias_TK) if bias_TK is not None else torch.zeros_like(position_BHTK, dtype=torch.bool)
        prob, lse = self.joint_probabilities(q_BHTE.float(), k_BHRKE.float(), mask, with_lse=True,
                                             score_bias=position_BHTK.float())
        return dropout_matmul(prob.sum(-2), v_BHKE, self.dropatt), lse

    def output(self, vec_BHTE):
        b, _, t, _ = vec_BHTE.shape
        return self.o_net(vec_BHTE.transpose(1, 2).reshape(b, t, -1))

    def forward(self, h_BTD, *, mem_BMD, mask_TK, pos, kv_mem=None):
        if kv_mem is not None:
            raise ValueError("MGK inside Transformer-XL keeps hidden states, not keys and values")
        r_KD, u_HE, v_HE = pos[:3]
        src = torch.cat([mem_BMD.to(h_BTD.dtype), h_BTD], dim=1) if mem_BMD is not None and mem_BMD.shape[1] \
            else h_BTD
        q, k, v = self.proj(h_BTD, src)
        mask = torch.zeros(mask_TK.shape, dtype=torch.float32, device=mask_TK.device).masked_fill_(mask_TK,
                                                                                                   float("-inf"))
        vec, _ = self.scored(q, k, v, u_HE, self.position_scores(q, r_KD, v_HE), mask)
        return self.output(vec), None


class LookAheadMGKAttention(RelativeMGKAttention):
    """`RelativeMGKAttention` that also refreshes memory rows by LaMemo's look-ahead: `look_ahead` and
    `window_scores` are `LaMemoAttention`'s own, run on this attention's score hooks (`layer_look_ahead` calls
    `look_ahead`). LaMemo's `full` variant (the causal table in the window) is not defined for it."""

    look_ahead = LaMemoAttention.look_ahead
    window_scores = LaMemoAttention.window_scores
    full = False

    def __init__(self, *, full: bool = False, **kw):
        if full:
            raise ValueError("MGK with look-ahead takes the variants disentangled, txl or disentangled_v2")
        super().__init__(**kw)
