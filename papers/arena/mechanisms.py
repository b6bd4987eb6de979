"""The memory mechanisms of the four papers as plug-ins of the shared memory interface (`repro.memory`).

Each wraps its paper's own code, so that the arena composes the mechanisms the papers' models run, not copies:
- `compressive` (Rae et al. 2020, the ∞-former's baseline): `papers.infinity_former.compressive.CompressiveMemory`,
  defined there (the compressive transformer is the backbone with it) — the evicted rows compressed by f_c into a
  FIFO memory attended before the short memory, f_c trained by the attention reconstruction loss;
- `ltm` (the ∞-former, Martins et al. 2022): `papers.infinity_former.ltm.ContinuousLTM` per layer — the evicted
  rows enter a continuous long-term memory at the next segment, read with the self-attention's queries and added
  to the attention's output (Eq. 12); `sampling: sticky` for sticky memories;
- `look_ahead` (LaMemo, Ji et al. 2022): `papers.lamemo.model.LookAhead`, defined there (LaMemo is the backbone
  with it) — owns the layer step: memory rows are refreshed by look-ahead attention and interpolation, layer by
  layer.

Memory states are laid out as each paper's model lays them out, so that a contestant with one mechanism carries
the same memory as that paper's model (`tests/test_arena.py` checks outputs and memories against the papers'
models with the same weights, over several segments; those models carry the parity with the authors' code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.compressive import CompressiveMemory  # registers `compressive`
from papers.infinity_former.ltm import ContinuousLTM, LTMConfig
from papers.lamemo.model import LookAhead  # registers `look_ahead`
from papers.transformer_xl.model import TransformerXLConfig
from repro.lm import coerce
from repro.memory import MemoryMechanism, register


def _queries(layer: nn.Module, x_BTD: torch.Tensor) -> torch.Tensor:
    """The layer's self-attention queries (B, H, T, E), without the u bias (as the ∞-former's official LTM)."""
    att = layer.attn
    he = att.n_head * att.d_head
    b, t, _ = x_BTD.shape
    w = att.qkv_net.weight[:he] if hasattr(att, "qkv_net") else att.proj.q_net.weight  # softmax or MGK attention
    return F.linear(x_BTD, w).view(b, t, att.n_head, att.d_head).transpose(1, 2)


@register("ltm")
class LongTermMemory(MemoryMechanism):
    """The ∞-former's continuous long-term memory (`papers.infinity_former.model.InfinityFormer`), as a plug-in.

    State per layer: (pending (B, P, D): the rows evicted at the last segment, entering the LTM at this one;
    coefficients (B, N, D) of the signal, (B, 0, D) before the first fit; sticky histogram (B, K), (B, 0) without
    sticky memories) — the ∞-former's `[pending ×n, coefficients ×n, histogram ×n]`."""

    slots = ("pending", "coef", "hist")

    def __init__(self, cfg: TransformerXLConfig, **options):
        super().__init__()
        self.ltm_cfg = coerce(LTMConfig, options)
        self.ltms = nn.ModuleList(ContinuousLTM(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head,
                                                cfg=self.ltm_cfg) for _ in range(cfg.n_layer))
        self._steps: dict[int, object] = {}
        self._aux: dict[str, torch.Tensor] = {}
        self.diagnostics: dict[str, torch.Tensor] = {}

    def empty(self, batch, like):
        d = like.shape[-1]
        return like.new_empty(batch, 0, d), like.new_empty(batch, 0, d).float(), like.new_empty(batch, 0).float()

    def begin(self) -> None:
        self._steps = {}

    def read(self, i, layer, x_BTD, state):
        pending, coef, hist = state
        z_BTD, self._steps[i] = self.ltms[i](_queries(layer, x_BTD), coef_BND=coef, new_BPD=pending, hist_BK=hist)
        return z_BTD

    def write(self, i, layer, state, evicted_BOD, inputs_BTD):
        _, coef, hist = state
        step = self._steps.get(i)
        if step is not None and step.coef_BND is not None:
            coef = step.coef_BND.detach().float()
        if step is not None and step.hist_BK is not None:
            hist = step.hist_BK.float()
        return evicted_BOD.detach(), coef, hist

    def aux_losses(self):
        kls = [s.kl for s in self._steps.values() if s is not None and s.kl is not None]
        self.diagnostics = {}
        if not kls:
            return {}
        kl = torch.stack(kls).sum()  # mean over batch, heads, queries; summed over layers (official)
        self.diagnostics["ltm_kl"] = kl.detach()
        return {"ltm_kl": self.ltm_cfg.kl_weight * kl} if self.ltm_cfg.kl_weight > 0 else {}


__all__ = ["CompressiveMemory", "LongTermMemory", "LookAhead"]
