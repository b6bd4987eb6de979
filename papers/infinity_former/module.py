"""LightningModules for the ∞-former paper: one builds any of its three models on the shared backbone.

- `InfinityFormerLM`: a segment-recurrent language model on ordinary token streams (`repro.data.lm`), the
  shared `SegmentLM` with the model's auxiliary losses (the ∞-former's KL term, the compressive transformer's
  attention-reconstruction loss) added to the NLL.
- `SortingLM`: the sorting task (§4.1) with the batch contract of `repro.data.sorting` (`SortSegment`). The
  official training loop (deep-spin/infinite-former `sorting/train.py`): the memory is reset for every group of
  examples; segments without a scored target run without gradients and only carry the memory; the segments
  holding the sorted output give the loss on its tokens (with the official lengths all of it is in the last
  segment; if a segment boundary splits it, both parts contribute, gradients accumulated), the last segment adds
  λ_KL·KL, and one optimiser step follows the last segment — so `trainer.max_steps` counts groups of examples, as
  the official `max_step` (the official also steps after every other segment, on zero gradients: reproduced by
  `step_every_segment: true`, the paper configs' setting). Manual optimisation does this;
  gradient clipping is the module's `clip` (0.25, the official value), not the Trainer's `gradient_clip_val`.

Models (`backbone`): `transformer_xl` (the harness `TransformerXL`), `infinity_former` (`model.InfinityFormer`
with `ltm`), `compressive` (`compressive.CompressiveTransformer`, Rae et al. 2019, configured by `compressive`).
`memory.mem_len` is the Transformer-XL memory (TXL: 2048 in the paper's sorting runs) or the short-term memory
beside the long-term one (∞-former, compressive: 1024).

Deviations from the official sorting loop (README.md): the learning rate follows the cosine every step (the
official steps its scheduler every 240 updates); evaluation runs with `eval_batch_size` examples at once
(the official: one), which gives the same numbers.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, replace
from typing import Any, Literal

import torch
from torchmetrics import MeanMetric

from papers.infinity_former.compressive import CompressiveConfig, CompressiveTransformer
from papers.infinity_former.ltm import LTMConfig
from papers.infinity_former.model import InfinityFormer
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.data.sorting import N_SYMBOLS, PAD
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce
from repro.metrics import scored
from repro.metrics.sorting import SortedTokenAccuracy

BACKBONES = ("transformer_xl", "infinity_former", "compressive")


def build_backbone(kind: str, cfg: TransformerXLConfig, *, ltm: LTMConfig | None, compressive: dict | None):
    if kind == "transformer_xl":
        return TransformerXL(cfg)
    if kind == "infinity_former":
        return InfinityFormer(cfg, ltm)
    if kind == "compressive":
        return CompressiveTransformer(cfg, coerce(CompressiveConfig, compressive or {}))
    raise ValueError(f"backbone is one of {', '.join(BACKBONES)}, got {kind!r}")


class InfinityFormerLM(SegmentLM):
    """Args:
        model: the Transformer-XL backbone (`TransformerXLConfig`); `n_token` comes from the data.
        backbone: `transformer_xl`, `infinity_former` or `compressive`.
        ltm: the long-term memory (`LTMConfig`), for `infinity_former`.
        compressive: the compressive memory's settings (`compressive.CompressiveConfig` as a dict).
        memory, eval_memory: Transformer-XL memory / short-term memory lengths for training and evaluation.
        optim: Adam, warm-up and cosine schedule.
        n_token: vocabulary size, linked from the data module by the CLI.
    """

    def __init__(
        self,
        model: TransformerXLConfig,
        backbone: Literal["transformer_xl", "infinity_former", "compressive"] = "infinity_former",
        ltm: LTMConfig | None = None,
        compressive: dict[str, Any] | None = None,
        memory: MemorySettings = MemorySettings(),
        eval_memory: MemorySettings | None = None,
        optim: OptimConfig = OptimConfig(),
        n_token: int = 0,
    ):
        if backbone not in BACKBONES:
            raise ValueError(f"backbone is one of {', '.join(BACKBONES)}, got {backbone!r}")
        cfg = coerce(TransformerXLConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        self.backbone = backbone
        self.ltm_cfg = coerce(LTMConfig, ltm) if ltm is not None else None
        if backbone == "infinity_former" and self.ltm_cfg is None:
            raise ValueError("backbone infinity_former needs its long-term memory settings: set model.ltm "
                             "(an empty `ltm: {}` takes the official sorting values)")
        if backbone != "infinity_former" and self.ltm_cfg is not None:
            raise ValueError(f"ltm is set but backbone is {backbone}: remove ltm or use backbone infinity_former")
        self.compressive = dict(compressive or {})
        super().__init__(n_token=self.cfg.n_token, memory=memory, eval_memory=eval_memory, optim=optim,
                         eval_protocol=EvalProtocol())
        self.save_hyperparameters(self._plain_hparams())

    def _plain_hparams(self) -> dict[str, Any]:
        return {
            "model": asdict(self.cfg), "backbone": self.backbone,
            "ltm": asdict(self.ltm_cfg) if self.ltm_cfg is not None else None,
            "compressive": self.compressive, "memory": asdict(self.memory),
            "eval_memory": asdict(self.eval_memory), "optim": asdict(self.optim), "n_token": self.cfg.n_token,
        }

    def build_model(self) -> torch.nn.Module:
        return build_backbone(self.backbone, self.cfg, ltm=self.ltm_cfg, compressive=self.compressive)

    def extra_loss(self) -> dict[str, torch.Tensor]:
        aux = getattr(self.model, "aux_losses", None)
        return aux() if aux is not None else {}

    def diagnostics(self) -> dict[str, torch.Tensor]:
        diag = getattr(self.model, "diagnostics", None)
        return diag() if diag is not None else {}

    def describe(self) -> dict[str, Any]:
        out = super().describe() | {"backbone": self.backbone}
        if self.ltm_cfg is not None:
            out["ltm"] = {"n_basis": self.ltm_cfg.n_basis, "sampling": self.ltm_cfg.sampling}
        return out


class SortingLM(InfinityFormerLM):
    """The sorting task with the official loop (see the module docstring). Args as `InfinityFormerLM`, plus
    `clip`: the gradient-norm clip of each update (official 0.25), and `step_every_segment`: the official
    `sorting/train.py` calls `optimizer.step()` after every segment, not only after the last one that carries the
    gradient; under its pinned torch 1.9 `model.zero_grad()` leaves zero gradients (not None), so from the second
    group on Adam takes a step on zero gradients after each memory-only segment (its moments decay, its momentum
    moves the weights, its step count advances). True reproduces that (the paper configs: the paper's numbers come
    from it); False (the default) steps once per group. The extra steps do not count as trainer steps."""

    def __init__(self, *args, clip: float = 0.25, step_every_segment: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if clip <= 0:
            raise ValueError(f"clip must be positive, got {clip}")
        self.clip = clip
        self.step_every_segment = bool(step_every_segment)
        self.automatic_optimization = False
        self.save_hyperparameters(self._plain_hparams() | {"clip": clip, "step_every_segment": step_every_segment})
        self.acc_metrics = torch.nn.ModuleDict({s: SortedTokenAccuracy(ignore_index=PAD) for s in ("valid", "test")})
        self.reg_metrics = torch.nn.ModuleDict({s: MeanMetric() for s in ("valid", "test")})
        self._group = torch.zeros(3, dtype=torch.float64)

    def on_fit_start(self) -> None:
        if self.trainer.gradient_clip_val:
            raise ValueError("the sorting module clips gradients itself (model.init_args.clip): remove "
                             "trainer.gradient_clip_val from the config")

    def on_train_epoch_start(self) -> None:
        """The batches say when the memory resets (`SortSegment.first`): a resumed run keeps its memory."""

    def _scored(self, hidden_BTD, target_BT):
        mask = target_BT != PAD
        return hidden_BTD[mask][None], target_BT[mask][None]  # (1, n, D), (1, n)

    def training_step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        if batch.first:
            self._mems["train"] = None
            opt.zero_grad(set_to_none=not self.step_every_segment)  # official: zeros once gradients exist
            self._group = torch.zeros(3, dtype=torch.float64)  # Σ NLL, correct, scored tokens of this group
        self.tokens_seen += batch.input.numel() * self.trainer.world_size
        scored = bool((batch.target != PAD).any())
        if not scored and not batch.last:  # carries the memory only: nothing in this segment is scored
            with torch.no_grad():
                _, self._mems["train"] = self(batch.input, self._mems["train"], self.memory)
            self._official_segment_step(opt)
            return None
        hidden, self._mems["train"] = self(batch.input, self._mems["train"], self.memory)
        h, y = self._scored(hidden, batch.target)
        nll = self.model.nll(h, y)
        # the loss is the mean over the group's sorted outputs (N_SYMBOLS per example), wherever they fall
        loss = nll.sum() / (N_SYMBOLS * batch.target.shape[0])
        aux = self.extra_loss() if batch.last else {}
        if scored or aux:
            self.manual_backward(loss + sum(aux.values()) if aux else loss)
        with torch.no_grad():
            correct = (self.model.log_prob(h.detach()).argmax(-1) == y).sum() if y.numel() else 0
        self._group += torch.tensor([float(nll.detach().sum()), float(correct), float(y.numel())], dtype=torch.float64)
        if not batch.last:
            self._official_segment_step(opt)
            return None
        self.clip_gradients(opt, gradient_clip_val=self.clip, gradient_clip_algorithm="norm")
        opt.step()
        sched.step()
        self.train_batches += 1
        mean = self._group[0] / self._group[2].clamp(min=1)
        self.log("train/loss", mean.float(), prog_bar=True)
        self.log("train/ppl", torch.exp(mean).float())
        self.log("train/bpc", (mean / math.log(2)).float())
        self.log("train/acc", (self._group[1] / self._group[2].clamp(min=1)).float(), prog_bar=True)
        self.log("train/tokens_seen", self.tokens_seen.float())
        for name, value in aux.items():
            self.log(f"train/aux_{name}", value.detach())
        for name, value in self.diagnostics().items():
            self.log(f"train/{name}", value)
        return None

    def _official_segment_step(self, opt) -> None:
        """`step_every_segment`: the official step after a segment that is not the group's last (clipped as theirs;
        the raw optimiser, so that Lightning's step count stays one per group)."""
        if self.step_every_segment:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.clip)
            opt.optimizer.step()

    # ------------------------------------------------------------------------------------------- evaluation
    def _eval_start(self, split: str) -> None:
        self._mems[split] = None
        self.nll_metrics[split].reset()
        self.acc_metrics[split].reset()
        self.reg_metrics[split].reset()

    def _eval_step(self, split: str, batch) -> None:
        if batch.first:
            self._mems[split] = None
        measuring = getattr(self.model, "measuring_fit", nullcontext)  # the reconstruction error (Figure 3 right)
        with measuring():
            hidden, self._mems[split] = self(batch.input, self._mems[split], self.eval_memory)
        err = self.diagnostics().get("regression_error")
        if err is not None:
            self.reg_metrics[split].update(err)
        if (batch.target != PAD).any():
            h, y = self._scored(hidden, batch.target)
            self.nll_metrics[split].update(self.model.nll(h, y))
            self.acc_metrics[split].update(self.model.log_prob(h).argmax(-1), y)

    def _eval_end(self, split: str) -> None:
        prefix = "val" if split == "valid" else split
        result = scored(self.nll_metrics[split])
        self.log(f"{prefix}/loss", result["mean_nll"].float(), sync_dist=False)
        self.log(f"{prefix}/ppl", torch.exp(result["mean_nll"]).float(), sync_dist=False)
        self.log(f"{prefix}/bpc", (result["mean_nll"] / math.log(2)).float(), sync_dist=False)
        self.log(f"{prefix}/tokens", result["tokens"].float(), sync_dist=False)
        self.log(f"{prefix}/acc", self.acc_metrics[split].compute().float(), sync_dist=False)
        if self.reg_metrics[split].update_count:
            self.log(f"{prefix}/regression_error", self.reg_metrics[split].compute().float(), sync_dist=False)
        self._mems[split] = None
