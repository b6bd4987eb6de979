"""The ∞-former on the repository's Transformer-XL backbone (Martins, Marinho, Martins; ACL 2022, §3, Fig. 1).

Reference code: deep-spin/infinite-former `sorting/mem_transformer.py` (`RelPartialLearnableMultiHeadAttn` with
`long_term_attention`) and `sorting/long_term_attention.py`. Layout legend: B batch, T segment length, S short-term
memory length, P vectors waiting to enter the long-term memory, N basis functions, K histogram bins, D width.

The ∞-former is the backbone (`papers.transformer_xl.model.TransformerXL`, its one layer loop) with one memory
mechanism, `LongTermMemory` (registered as `ltm`, which the memory arena composes with the others). Each layer
keeps Transformer-XL's short-term memory (STM: the last `mem_len` inputs of the layer, attended with relative
positions) and a continuous long-term memory (`ltm.ContinuousLTM`, kept in the layer's attention as
`layers.<i>.attn.ltm`, where the paper and the official code put it): the vectors that leave the STM enter the LTM
at the next segment, whose attention output (with the self-attention's queries) is added to the self-attention
output before the residual, LayerNorm and feed-forward (Eq. 12: Z = Z_T + Z_LTM).

The memory is a list of batch-first tensors, so `SegmentLM` checkpoints, restores and re-shards it like
Transformer-XL's:
- LTM off: one (B, S, D) tensor per layer — exactly Transformer-XL's memory;
- LTM on: 4 × n_layer tensors, `[STM ×n, pending ×n, coefficients ×n, histogram ×n]`: the STM (B, S, D); the
  vectors evicted from the STM at the last segment, not yet in the LTM (B, P, D); the signal's coefficients
  (B, N, D), (B, 0, D) before the first fit; the sticky histogram of the last step's attention (B, K), (B, 0)
  without sticky memories.
The official code evicts through a memory of mem_len + augment_len states and reads the older half; carrying the
evicted block explicitly is the same for its setting (segment = STM = augment length) and stays right when the
segment length differs from the STM length. The gate's gradient flows through the pending block as in the
official code, where the block is gated inside the step that fits it.

With `ltm=None` this is Transformer-XL weight for weight (same parameters, same initialisation, same outputs and
memory); `tests/test_infinity_former.py` checks it against `papers.transformer_xl.model.TransformerXL`.

Deviations (also in README.md): the LTM query is the self-attention query without the u bias, as the official
code; relative attention only (the official sorting runs use attn_type 0); no key/value evaluation memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.ltm import ContinuousLTM, LTMConfig
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.config import coerce
from repro.memory import MemoryMechanism, register


def _queries(attn: nn.Module, x_BTD: torch.Tensor) -> torch.Tensor:
    """The self-attention's queries (B, H, T, E) without the u bias, as the official LTM reads `w_head_q` (softmax
    attention, or the query map of MGK's attention in the arena)."""
    he = attn.n_head * attn.d_head
    b, t, _ = x_BTD.shape
    w = attn.qkv_net.weight[:he] if hasattr(attn, "qkv_net") else attn.proj.q_net.weight
    return F.linear(x_BTD, w).view(b, t, attn.n_head, attn.d_head).transpose(1, 2)


def _ltm_config(config: LTMConfig | dict | None, options: dict) -> LTMConfig:
    return coerce(LTMConfig, config if config is not None else options)


@register("ltm")
class LongTermMemory(MemoryMechanism):
    """The ∞-former's continuous long-term memory as a mechanism of the backbone's loop.

    State per layer (`slots`, laid out by slot: `[pending ×n, coefficients ×n, histogram ×n]` after the STM): the
    rows evicted from the STM at the last segment, entering the LTM at this one (B, P, D); the signal's
    coefficients (B, N, D), (B, 0, D) before the first fit; the sticky histogram of the last step's attention
    (B, K), (B, 0) without sticky memories. The per-layer `ContinuousLTM` lives in the layer's attention
    (`layer_module`). Options: the fields of `LTMConfig` (or `config=` one)."""

    slots = ("pending", "coef", "hist")
    layer_module_name = "ltm"
    settings = LTMConfig

    def __init__(self, cfg: TransformerXLConfig, config: LTMConfig | dict | None = None, **options):
        super().__init__()
        self.ltm_cfg = _ltm_config(config, options)
        self._steps: dict[int, object] = {}

    @classmethod
    def layer_module(cls, cfg: TransformerXLConfig, config: LTMConfig | dict | None = None, **options) -> nn.Module:
        return ContinuousLTM(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head,
                             cfg=_ltm_config(config, options))

    def empty(self, batch, like):
        d = like.shape[-1]
        return like.new_empty(batch, 0, d), like.new_empty(batch, 0, d).float(), like.new_empty(batch, 0).float()

    def begin(self) -> None:
        self._steps = {}

    def read(self, i, layer, x_BTD, state):
        ltm = getattr(layer.attn, self.layer_module_name, None)
        if ltm is None:
            return None
        pending, coef, hist = state
        z_BTD, self._steps[i] = ltm(_queries(layer.attn, x_BTD), coef_BND=coef, new_BPD=pending, hist_BK=hist)
        return z_BTD

    def write(self, i, layer, state, evicted_BOD, inputs_BTD):
        """The evicted rows wait for the next segment (§3.2); the fit's coefficients and the step's histogram
        replace the old ones."""
        _, coef, hist = state
        step = self._steps.get(i)
        if step is not None and step.coef_BND is not None:
            coef = step.coef_BND.detach().float()
        if step is not None and step.hist_BK is not None:
            hist = step.hist_BK.float()
        return evicted_BOD.detach(), coef, hist

    def aux_losses(self):
        """{"ltm_kl": λ_KL · KL} (Eq. 15), the KL a mean over batch, heads and queries, summed over the layers as the
        official code; the unweighted KL and, when measured, the fits' error go to `diagnostics`."""
        steps = [s for s in self._steps.values() if s is not None]
        kls = [s.kl for s in steps if s.kl is not None]
        errs = [s.regression_error for s in steps if s.regression_error is not None]
        self.diagnostics = {}
        if errs:
            self.diagnostics["regression_error"] = torch.stack(errs).mean().detach()
        if not kls:
            return {}
        kl = torch.stack(kls).sum()
        self.diagnostics["ltm_kl"] = kl.detach()
        return {"ltm_kl": self.ltm_cfg.kl_weight * kl} if self.ltm_cfg.kl_weight > 0 else {}


class InfinityFormer(TransformerXL):
    """The backbone with `LongTermMemory` (`ltm`; None: Transformer-XL). `forward(tokens, mems, mem_len=…)` with
    mem_len the STM length; `aux_losses()` gives the last forward's λ_KL-weighted KL term, `diagnostics()` its
    unweighted KL and, inside `measuring_fit()`, the fits' regression error."""

    def __init__(self, cfg: TransformerXLConfig, ltm: LTMConfig | None):
        if cfg.attention != "relative":
            raise ValueError("the ∞-former backbone uses Transformer-XL's relative attention: "
                             "set model.attention: relative")
        super().__init__(cfg, [(LongTermMemory, {"config": ltm})] if ltm is not None else [])
        self.ltm_cfg = ltm

    @property
    def supports_kv_memory(self) -> bool:
        return False
