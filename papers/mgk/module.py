"""Transformer-MGK language model as a LightningModule: the shared `SegmentLM` with `MGKLM` inside."""

from __future__ import annotations

from dataclasses import asdict, replace

from papers.mgk.model import MGKLM, MGKConfig
from papers.transformer_xl.model import TransformerXLConfig
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce


class MGKLanguageModel(SegmentLM):
    """Args:
        model: the backbone (`TransformerXLConfig`, with `attention: absolute`); `n_token` comes from the data.
        mgk: which attention and its mixture options (`MGKConfig`).
        optim, eval_protocol: as for Transformer-XL; evaluation is a sliding window in the paper.
    """

    def __init__(
        self,
        model: TransformerXLConfig,
        mgk: MGKConfig = MGKConfig(),
        optim: OptimConfig = OptimConfig(),
        eval_protocol: EvalProtocol = EvalProtocol(),
        n_token: int = 0,
    ):
        cfg = coerce(TransformerXLConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        self.mgk = coerce(MGKConfig, mgk)
        super().__init__(n_token=self.cfg.n_token, memory=MemorySettings(), eval_memory=None, optim=optim,
                         eval_protocol=eval_protocol)
        self.save_hyperparameters({"model": asdict(self.cfg), "mgk": asdict(self.mgk), "optim": asdict(self.optim),
                                   "eval_protocol": asdict(self.eval_protocol), "n_token": self.cfg.n_token})

    def build_model(self) -> MGKLM:
        return MGKLM(self.cfg, self.mgk)
