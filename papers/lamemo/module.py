"""LaMemo as a LightningModule: the shared `SegmentLM` with `LaMemo` inside.

The memory is the model's list of batch-first tensors (embedding memory, then per layer the attention vectors and
log-normalisers of the memory positions), so `SegmentLM` saves it in checkpoints, restores it on resume and
re-shards it across DDP ranks along the stream dimension like any other memory.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from papers.lamemo.model import LaMemo, LaMemoConfig
from papers.transformer_xl.model import TransformerXLConfig
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce


class LaMemoLM(SegmentLM):
    """LaMemo's LightningModule.

    On the first segment of a stream the memory is empty and the look-ahead refresh of the memory uses none of its
    parameters, so under DDP (`--trainer.strategy ddp`) the step would leave them without gradients:
    `ddp_find_unused_parameters` makes `repro fit` use Lightning's `ddp_find_unused_parameters_true` (the official
    `train_ddp.py` wraps the model in apex's `DistributedDataParallel(delay_allreduce=True)`, which reduces every
    gradient after the backward pass and so tolerates unused parameters).

    Args:
        model: the backbone (`TransformerXLConfig`, relative attention); `n_token` comes from the data.
        lamemo: look-ahead on/off and the variant (`LaMemoConfig`).
        memory: training memory; eval_memory: memory, clamp and same_length for validation and test.
        optim: Adam, warm-up and cosine schedule (the reference: 2.5e-4, cosine, clip 0.25).
        eval_protocol: `memory` (the carried memory; LaMemo has no key/value shortcut).
    """

    ddp_find_unused_parameters = True

    def __init__(
        self,
        model: TransformerXLConfig,
        lamemo: LaMemoConfig = LaMemoConfig(),
        memory: MemorySettings = MemorySettings(),
        eval_memory: MemorySettings | None = None,
        optim: OptimConfig = OptimConfig(),
        eval_protocol: EvalProtocol = EvalProtocol(),
        n_token: int = 0,
    ):
        cfg = coerce(TransformerXLConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        self.lamemo = coerce(LaMemoConfig, lamemo)
        super().__init__(n_token=self.cfg.n_token, memory=memory, eval_memory=eval_memory, optim=optim,
                         eval_protocol=eval_protocol)
        self.save_hyperparameters({
            "model": asdict(self.cfg),
            "lamemo": asdict(self.lamemo),
            "memory": asdict(self.memory),
            "eval_memory": asdict(self.eval_memory),
            "optim": asdict(self.optim),
            "eval_protocol": asdict(self.eval_protocol),
            "n_token": self.cfg.n_token,
        })

    def build_model(self) -> LaMemo:
        return LaMemo(self.cfg, self.lamemo)

    def describe(self):
        return super().describe() | {"lamemo": asdict(self.lamemo)}
