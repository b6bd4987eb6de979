"""The Transformer-MGK language model: the repository's Transformer-XL backbone (adaptive input and softmax,
post-LN layers, sinusoid positions added to the input, no memory) with the attention of each layer replaced by
softmax, MGK, linear or MLK attention. This is the setting of the paper's WikiText-103 experiments (the
reference's `lmtool-fwms` `MemTransformerLM` with attn_type 2 = softmax and 200 = MGK: absolute positions,
mem_len 0, independent segments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from papers.mgk.attention import MGKAttention, MLKAttention
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.nn.attention import AbsoluteAttention


@dataclass(frozen=True)
class MGKConfig:
    attention: Literal["softmax", "mgk", "linear", "mlk"] = "mgk"
    n_components: int = 2  # R (the reference uses 2)
    keys: Literal["separate", "shifted"] = "separate"  # MGK or sMGK / MLK or sMLK
    pi: Literal["gradient", "soft_em", "hard_em"] = "gradient"
    sigma2_ratios: tuple[float, ...] = (1.0, 1.0 / 3.0)  # σ_r² = √E · ratio_r (the reference: √E and √E/3)
    learn_variance: bool = False

    def __post_init__(self):
        if self.attention not in ("softmax", "mgk", "linear", "mlk"):
            raise ValueError(f"mgk.attention is softmax, mgk, linear or mlk, got {self.attention!r}")
        if self.n_components < 1 or len(self.sigma2_ratios) != self.n_components:
            raise ValueError("mgk.n_components must be ≥ 1 with one sigma2 ratio per component")


class MGKLM(TransformerXL):
    """`TransformerXL` with absolute positions, no memory, and the attention `mgk.attention`."""

    supports_memory = False

    def __init__(self, cfg: TransformerXLConfig, mgk: MGKConfig):
        if cfg.attention != "absolute":
            raise ValueError("the MGK language model adds positions to its input: set model.attention: absolute")
        self.__dict__["_mgk"] = mgk  # read by make_attention during the backbone's construction
        super().__init__(cfg)
        self.mgk = mgk

    @property
    def supports_kv_memory(self) -> bool:
        return False

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        mgk: MGKConfig = self.__dict__["_mgk"]
        common = dict(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head)
        if mgk.attention == "softmax":
            return AbsoluteAttention(**common, dropatt=cfg.dropatt)
        if mgk.attention == "mgk":
            return MGKAttention(**common, dropatt=cfg.dropatt, n_components=mgk.n_components, keys=mgk.keys,
                                pi=mgk.pi, sigma2_ratios=mgk.sigma2_ratios, learn_variance=mgk.learn_variance)
        if mgk.attention == "linear":  # one component with its own key: plain linear attention
            return MLKAttention(**common, n_components=1, keys="separate", causal=True)
        return MLKAttention(**common, n_components=mgk.n_components, keys=mgk.keys, causal=True)
