"""The memory arena as LightningModules: the shared `SegmentLM` with `papers.arena.model.Arena` inside
(`ArenaLM`, language modelling), and the ∞-former's sorting task with the same contestants (`ArenaSortingLM`,
the long-range probe).

Follows `papers/lamemo/module.py`; differs in that the memory mechanisms are a config list (`mechanisms`), so that
every contestant is the same module with another list, and their auxiliary losses (the compressive memory's
attention reconstruction, the long-term memory's KL term) are added to the NLL as their papers add them.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from papers.arena.model import Arena
from papers.infinity_former.module import SortingLM
from papers.transformer_xl.model import TransformerXLConfig
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce


class ArenaLM(SegmentLM):
    """One contestant of the arena.

    Args:
        model: the backbone (`TransformerXLConfig`, relative attention); `n_token` comes from the data.
        mechanisms: the memory mechanisms, `[{name: …, …options}]` (`papers/arena/model.py`); [] is
            Transformer-XL, and with `memory.mem_len: 0` and the sliding protocol the memory-less baseline.
        score: None (softmax with relative positions) or `{name: mgk, …}`: MGK's mixture-of-Gaussian keys inside
            Transformer-XL (`papers/arena/mgk.py`; `MGKAttention`'s options: n_components, sigma2_ratios, …).
        memory: training memory; eval_memory: memory, clamp and same_length for validation and test.
        optim: Adam, warm-up and cosine schedule; eval_protocol: `memory` or `sliding`.
    """

    def __init__(
        self,
        model: TransformerXLConfig,
        mechanisms: list[dict] | None = None,
        score: dict | None = None,
        memory: MemorySettings = MemorySettings(),
        eval_memory: MemorySettings | None = None,
        optim: OptimConfig = OptimConfig(),
        eval_protocol: EvalProtocol = EvalProtocol(),
        n_token: int = 0,
    ):
        cfg = coerce(TransformerXLConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        self.mechanisms = [dict(m) for m in (mechanisms or [])]
        self.score = dict(score) if score else None
        # a mechanism's parameters sit unused on a stream's first segment (nothing evicted, nothing to refresh)
        # (and MGK's scores leave the content bias u unused)
        self.ddp_find_unused_parameters = bool(self.mechanisms) or self.score is not None
        super().__init__(n_token=self.cfg.n_token, memory=memory, eval_memory=eval_memory, optim=optim,
                         eval_protocol=eval_protocol)
        self.save_hyperparameters({
            "model": asdict(self.cfg),
            "mechanisms": self.mechanisms,
            "score": self.score,
            "memory": asdict(self.memory),
            "eval_memory": asdict(self.eval_memory),
            "optim": asdict(self.optim),
            "eval_protocol": asdict(self.eval_protocol),
            "n_token": self.cfg.n_token,
        })

    def build_model(self) -> Arena:
        return Arena(self.cfg, self.mechanisms, self.score)

    def extra_loss(self):
        return self.model.aux_losses()

    def describe(self):
        return super().describe() | {"mechanisms": self.mechanisms, "score": self.score}


class ArenaSortingLM(SortingLM):
    """One contestant on the ∞-former's sorting task (§4.1; the official loop of `SortingLM`): the arena's
    long-range probe. Args as `ArenaLM` (model, mechanisms, score, memory, optim) plus `SortingLM`'s `clip` and
    `step_every_segment`."""

    def __init__(
        self,
        model: TransformerXLConfig,
        mechanisms: list[dict] | None = None,
        score: dict | None = None,
        memory: MemorySettings = MemorySettings(),
        eval_memory: MemorySettings | None = None,
        optim: OptimConfig = OptimConfig(),
        n_token: int = 0,
        clip: float = 0.25,
        step_every_segment: bool = False,
    ):
        self.mechanisms = [dict(m) for m in (mechanisms or [])]
        self.score = dict(score) if score else None
        self.ddp_find_unused_parameters = bool(self.mechanisms) or self.score is not None
        super().__init__(model, backbone="transformer_xl", memory=memory, eval_memory=eval_memory, optim=optim,
                         n_token=n_token, clip=clip, step_every_segment=step_every_segment)

    def _plain_hparams(self):
        out = super()._plain_hparams()
        del out["backbone"], out["ltm"], out["compressive"]
        return out | {"mechanisms": self.mechanisms, "score": self.score}

    def build_model(self) -> Arena:
        return Arena(self.cfg, self.mechanisms, self.score)

    def describe(self):
        return SegmentLM.describe(self) | {"mechanisms": self.mechanisms, "score": self.score}
