"""The memory arena's model: Transformer-XL's backbone with any composition of memory mechanisms.

The layer loop is the backbone's (`papers.transformer_xl.model.TransformerXL` with `mechanisms`: contexts,
reads, eviction, writes, and a layer-step owner's own loop); this file checks a config's list into the
mechanisms' classes and options (`repro.memory.check_mechanisms`) and builds MGK's attention where the config asks
for its score (`papers/arena/mgk.py`).

Mechanisms are named in the config, `mechanisms: [{name: ltm, n_basis: 64, …}, …]`, by the name they registered
under (`repro.memory.register`); `module: pkg.mod` imports the file that registers a new one first. With one
mechanism the memory is that paper's model's layout, and the contestant is that paper's model.
"""

from __future__ import annotations

from torch import nn

from papers.arena import mechanisms as _builtin  # noqa: F401  (registers compressive, ltm, look_ahead)
from papers.arena.mgk import LookAheadMGKAttention, RelativeMGKAttention
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.memory import check_mechanisms


class Arena(TransformerXL):
    """`TransformerXL` with the memory mechanisms `mechanisms` (config entries, see the module docstring) and, with
    `score: {name: mgk, …MGKAttention options}`, MGK's mixture-of-Gaussian keys in every layer's attention. The
    layer loop is the backbone's; this class resolves the config's names and builds the MGK attention."""

    def __init__(self, cfg: TransformerXLConfig, mechanisms: tuple[dict, ...] | list[dict] = (),
                 score: dict | None = None):
        if score is not None and cfg.attention != "relative":
            raise ValueError("memory mechanisms build on relative attention: set model.attention: relative")
        if score is not None and score.get("name") != "mgk":
            raise ValueError(f"score.name is mgk (mixture-of-Gaussian keys) or the score is left out (softmax), "
                             f"got {score.get('name')!r}")
        self.__dict__["_score"] = score  # read by make_attention, while the backbone builds its layers
        super().__init__(cfg, check_mechanisms(mechanisms))
        self.score = score

    @property
    def supports_kv_memory(self) -> bool:
        return super().supports_kv_memory and self.score is None

    def make_attention(self, cfg: TransformerXLConfig) -> nn.Module:
        score = self.__dict__["_score"]
        if score is None:
            return super().make_attention(cfg)
        # MGK inside Transformer-XL (papers/arena/mgk.py), with the look-ahead when a mechanism owns the layer step
        opts = {k: tuple(v) if isinstance(v, list) else v for k, v in score.items() if k != "name"}
        common = dict(d_model=cfg.d_model, n_head=cfg.n_head, d_head=cfg.d_head, dropatt=cfg.dropatt, **opts)
        owner = self._owner_spec
        if owner is not None:
            return LookAheadMGKAttention(full=owner[1].get("variant") == "full", **common)
        return RelativeMGKAttention(**common)
