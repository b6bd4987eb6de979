"""The Transformer-MGK language model: the repository's Transformer-XL backbone (adaptive input and softmax,
post-LN layers, sinusoid positions added to the input, no memory) with the attention of each layer replaced by
softmax, MGK, linear or MLK attention. This is the setting of the paper's WikiText-103 experiments (the
reference's `lmtool-fwms` `MemTransformerLM` with attn_type 2 = softmax and 200 = MGK: absolute positions,
mem_len 0, independent segments).

`MGKConfig.form: lm_official` with `pi_layout: position` (the paper configs) computes what the reference computes
(tests/parity/test_mgk_parity.py, against fixtures made from its code): π per (component, head, key position),
its normalisation eps, its soft E-step averaging, and MLK/linear with the feature normalisation and 1/√E scale of
attn_types 400 and 34. `linear` is attn_type 34 (`CudaFastWeightSumLinearTransformerLayer`) under `lm_official`
and elu + 1 with a plain normaliser (≈ attn_type 4, `LinearMultiHeadAttn`) under `ours` (README, "Linear").
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
    pi_layout: Literal["head", "position"] = "head"  # position: the reference's π table per key position
    max_klen: int = 256  # positions of that table (the reference hard-codes 256 = its tgt_len)
    form: Literal["ours", "lm_official"] = "ours"  # lm_official: the numerics of mem_transformer.py (see attention.py)

    def __post_init__(self):
        if self.attention not in ("softmax", "mgk", "linear", "mlk"):
            raise ValueError(f"mgk.attention is softmax, mgk, linear or mlk, got {self.attention!r}")
        if self.n_components < 1 or len(self.sigma2_ratios) != self.n_components:
            raise ValueError("mgk.n_components must be ≥ 1 with one sigma2 ratio per component")
        if self.pi_layout not in ("head", "position") or self.form not in ("ours", "lm_official"):
            raise ValueError("mgk.pi_layout is head or position, mgk.form ours or lm_official")


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
        mixture = dict(pi_layout=mgk.pi_layout, max_klen=mgk.max_klen, form=mgk.form)
        if mgk.attention == "softmax":
            return AbsoluteAttention(**common, dropatt=cfg.dropatt)
        if mgk.attention == "mgk":
            return MGKAttention(**common, **mixture, dropatt=cfg.dropatt, n_components=mgk.n_components,
                                keys=mgk.keys, pi=mgk.pi, sigma2_ratios=mgk.sigma2_ratios,
                                learn_variance=mgk.learn_variance)
        if mgk.attention == "linear":  # one component with its own key and no π: plain linear attention
            return MLKAttention(**common, **mixture, n_components=1, keys="separate", causal=True)
        return MLKAttention(**common, **mixture, n_components=mgk.n_components, keys=mgk.keys, causal=True)
