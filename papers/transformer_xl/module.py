"""Transformer-XL as a LightningModule: the shared `SegmentLM` with `TransformerXL` inside."""

from __future__ import annotations

from dataclasses import asdict, replace

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce


class TransformerXLLM(SegmentLM):
    """Args:
        model: the architecture (`TransformerXLConfig`); its `n_token` comes from the data.
        memory: training memory (`mem_len` = the reference's training mem_len).
        eval_memory: memory, clamp and same_length for validation and test (defaults to `memory`).
        optim: Adam, warm-up and cosine schedule.
        eval_protocol: `memory` (Transformer-XL) or `sliding` (the vanilla model of Al-Rfou et al.).
        n_token: vocabulary size, linked from the data module by the CLI.
    """

    def __init__(
        self,
        model: TransformerXLConfig,
        memory: MemorySettings = MemorySettings(),
        eval_memory: MemorySettings | None = None,
        optim: OptimConfig = OptimConfig(),
        eval_protocol: EvalProtocol = EvalProtocol(),
        n_token: int = 0,
    ):
        cfg = coerce(TransformerXLConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        super().__init__(n_token=self.cfg.n_token, memory=memory, eval_memory=eval_memory, optim=optim,
                         eval_protocol=eval_protocol)
        # plain values only, so that checkpoints load with weights_only=True
        self.save_hyperparameters({
            "model": asdict(self.cfg),
            "memory": asdict(self.memory),
            "eval_memory": asdict(self.eval_memory),
            "optim": asdict(self.optim),
            "eval_protocol": asdict(self.eval_protocol),
            "n_token": self.cfg.n_token,
        })

    def build_model(self) -> TransformerXL:
        return TransformerXL(self.cfg)
