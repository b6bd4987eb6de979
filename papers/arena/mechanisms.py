"""The memory mechanisms of the four papers as plug-ins of the shared memory interface (`repro.memory`).

Each wraps its paper's own code, so that the arena composes the mechanisms the papers' models run, not copies:
- `compressive` (Rae et al. 2020, the ∞-former's baseline): `papers.infinity_former.compressive` — the evicted
  rows compressed by f_c into a FIFO memory attended before the short memory, f_c trained by the attention
  reconstruction loss;
- `ltm` (the ∞-former, Martins et al. 2022): `papers.infinity_former.ltm.ContinuousLTM` per layer — the evicted
  rows enter a continuous long-term memory at the next segment, read with the self-attention's queries and added
  to the attention's output (Eq. 12); `sampling: sticky` for sticky memories;
- `look_ahead` (LaMemo, Ji et al. 2022): `papers.lamemo.model` — owns the layer step: memory rows are refreshed
  by look-ahead attention and interpolation, layer by layer.

Memory states are laid out as each paper's model lays them out, so that a contestant with one mechanism carries
the same memory as that paper's model (`tests/test_arena.py` checks outputs and memories against the papers'
models with the same weights, over several segments; those models carry the parity with the authors' code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.compressive import (
    Compression,
    CompressiveConfig,
    layer_reconstruction_error,
    split_overflow,
)
from papers.infinity_former.ltm import ContinuousLTM, LTMConfig
from papers.lamemo.model import VARIANTS, LaMemoAttention
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


@register("compressive")
class CompressiveMemory(MemoryMechanism):
    """The compressed memory of `papers.infinity_former.compressive.CompressiveTransformer`, as a plug-in.

    State per layer: (cmem (B, C ≤ cmem_len, D),). Evicts whole groups of c rows (`split_overflow`)."""

    slots = ("cmem",)

    def __init__(self, cfg: TransformerXLConfig, **options):
        super().__init__()
        self.comp = coerce(CompressiveConfig, options)
        if self.comp.cmem_len <= 0:
            raise ValueError("the compressive mechanism needs cmem_len > 0 (without it, leave the mechanism out)")
        self.pre_lnorm = cfg.pre_lnorm
        self.compressors = nn.ModuleList(Compression(d_model=cfg.d_model, rate=self.comp.rate,
                                                     kind=self.comp.compression) for _ in range(cfg.n_layer))
        self.context_len = self.comp.cmem_len
        self._errors: list[torch.Tensor] = []
        self._train = False

    def empty(self, batch, like):
        return (like.new_empty(batch, 0, like.shape[-1]),)

    def begin(self) -> None:
        self._errors = []
        params = [p for p in self.compressors.parameters() if p.requires_grad]
        self._train = torch.is_grad_enabled() and bool(params) and self.comp.recon_weight > 0

    def context(self, i, state):
        return state[0]

    def evict(self, short_BMD, new_BTD, mem_len):
        return split_overflow(short_BMD, new_BTD, mem_len=mem_len, rate=self.comp.rate)

    def write(self, i, layer, state, evicted_BOD, inputs_BTD):
        (cmem,) = state
        if evicted_BOD.shape[1]:
            with torch.set_grad_enabled(self._train):
                new_BCD = self.compressors[i](evicted_BOD)
            if self._train:
                self._errors.append(self._reconstruction_error(layer, inputs_BTD.detach(), evicted_BOD, new_BCD))
            new_BCD = new_BCD.detach().to(evicted_BOD.dtype)
            cmem = torch.cat([cmem.to(new_BCD.dtype), new_BCD], dim=1) if cmem.shape[1] else new_BCD
        return (cmem[:, max(0, cmem.shape[1] - self.comp.cmem_len):].detach(),)

    def _reconstruction_error(self, layer, h_BTD, old_BOD, new_BCD):
        if not hasattr(layer.attn, "qkv_net"):
            raise ValueError("the compressive memory's reconstruction loss attends with a softmax attention's "
                             "projections: combine it with the default score, not mgk")
        return layer_reconstruction_error(layer, h_BTD, old_BOD, new_BCD, pre_lnorm=self.pre_lnorm)

    def aux_losses(self):
        if not self._train:
            return {}
        params = [p for p in self.compressors.parameters() if p.requires_grad]
        # a zero that touches every compression weight when nothing was evicted keeps DDP's reducer satisfied
        total = torch.stack(self._errors).sum() if self._errors else sum(p.sum() for p in params) * 0.0
        return {"attn_recon": self.comp.recon_weight * total}


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


@register("look_ahead")
class LookAhead(MemoryMechanism):
    """LaMemo's look-ahead memory (`papers.lamemo.model.LaMemo`): owns the layer step. The short memory it keeps
    is the embedding memory (the layer-0 input of the memory rows); state per layer: (attention vectors
    (B, M, H, E), log-normalisers (B, M, H) float32) of the memory rows. Other mechanisms read on the current
    rows and receive, per layer, the layer's inputs of the rows leaving the memory."""

    slots = ("vectors", "lse")
    owns_layer_step = True

    def __init__(self, cfg: TransformerXLConfig, variant: str = "disentangled"):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"look_ahead.variant is one of {', '.join(VARIANTS)}, got {variant!r}")
        if cfg.attention != "relative":
            raise ValueError("the look-ahead memory builds on relative attention: set model.attention: relative")
        self.variant = variant
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        # Xavier uniform, as LaMemo (the reference's `weights_init` leaves the look-ahead biases as drawn)
        if variant in ("disentangled", "disentangled_v2", "full"):
            self.r_r_bias_future = nn.Parameter(nn.init.xavier_uniform_(torch.empty(cfg.n_head, cfg.d_head)))
        if variant == "disentangled_v2":
            self.r_w_bias_future = nn.Parameter(nn.init.xavier_uniform_(torch.empty(cfg.n_head, cfg.d_head)))

    @staticmethod
    def attention(cfg: TransformerXLConfig, variant: str = "disentangled") -> nn.Module:
        """The attention the backbone's layers are built with."""
        return LaMemoAttention(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt,
                               full=variant == "full")

    def empty(self, batch, like):
        return (like.new_empty(batch, 0, self.n_head, self.d_head),
                like.new_empty(batch, 0, self.n_head).float())

    def future_biases(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """(u₊, v₊): the look-ahead's content and position biases for the variant."""
        v_fut = model.r_r_bias if self.variant == "txl" else self.r_r_bias_future
        u_fut = self.r_w_bias_future if self.variant == "disentangled_v2" else model.r_w_bias
        return u_fut, v_fut
