"""Transformer-MGK on Long Range Arena: the 2-layer classifiers of the paper's LRA experiments.

Reference code: minhtannguyen/transformer-mgk `lra/model.py`, `lra/model_wrapper.py`, `lra/run_tasks.py` (itself the
Nyströmformer LRA code, mlpen/Nystromformer `LRA/code`). Layout legend: B batch, T tokens, D model width.

The model, as the reference builds it: token embedding + learned position embedding (both N(0, 0.02)), dropout;
2 pre-LN encoder layers, x + dropout(attention(LN(x))) then x + MLP(LN(x)) with MLP = Linear(D, D_inner) → GELU →
dropout → Linear(D_inner, D) → dropout; a final LayerNorm; mean pooling over the tokens; the head Linear(D,
D_inner) → ReLU → Linear(D_inner, classes). Retrieval encodes both documents with the same encoder and classifies
[x₁, x₂, x₁ ⊙ x₂, x₁ − x₂] (LRA's two-tower matching). Sizes (PAPERS.md §4): D 64, D_inner 128, head width 32,
dropout 0.1 (attention dropout 0.1). Training: AdamW (eps 1e-6, weight decay 0), lr 1e-4, a one-cycle schedule
with linear warm-up and linear decay (`torch.optim.lr_scheduler.OneCycleLR`, as the reference).

Attention variants, by one string `variant` (`VARIANTS`): `softmax<H>`, `mgk<H>`, `smgk<H>`, `linear<H>`, `mlk<H>`,
`smlk<H>` with H heads, and `mgk<H>_softe` / `mgk<H>_harde` / `smgk<H>_softe` / `smgk<H>_harde` (π by the soft or
hard E-step, Table "learning options"). As `lra/attention.py` builds them: the q/k/v/output projections have
biases, MGK/MLK use R = 2 keys with σ² = √E for both components (the language-model code's √E and √E/3 are
not used in LRA), fixed.

`LRAConfig.form` (`official` in the paper configs; parity with the authors' code in tests/parity/test_mgk_parity.py):
- `official`: π as `lra/attention.py` keeps it: by gradient, two numbers shared by all heads and positions,
  clamped to [0, 1] (init 0.5); by the soft E-step, one per (head, key position), averaged over the (valid query,
  valid key) pairs; the linear family as `lra/attention_linear.py`: the raw keys mixed by π before φ = elu + 1, no
  normaliser, output scaled by 1/√L (L the padded length), so a linear layer's output grows with the keys' sum.
- `ours`: π a per-head softmax of learned logits (or a per-head soft-E-step average), and MLK as the paper
  writes it, φ(q)ᵀ Σ_j Σ_r π_r φ(k_jr) v_j / φ(q)ᵀ Σ_j Σ_r π_r φ(k_jr) (linear attention of Katharopoulos et al.).

Deviations from the reference (see README.md):
- `pooling: real` averages over the real tokens only; the reference (`pooling: padded`, with `data.pad_to` its
  fixed padded length) zeroes pad positions and divides by the padded length, so its logits change with the amount
  of padding. The paper configs use the reference's pooling, padding and (for Image and Pathfinder) black pixels as
  padding (`data.black_is_padding`); the tiny and small profiles ours.
- Padding is masked in every attention (keys) through a (B, 1, 1, K) mask; pixel value 0 is a real token here
  unless `data.black_is_padding` (the reference treats it as padding).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from papers.mgk.attention import MGKAttention, MLKAttention, SoftmaxAttention
from repro.config import coerce

_VARIANT = re.compile(r"^(softmax|mgk|smgk|linear|mlk|smlk)(\d+)(?:_(softe|harde))?$")


@dataclass(frozen=True)
class Variant:
    """One attention variant of the LRA tables."""

    family: str  # softmax | mgk | smgk | linear | mlk | smlk
    n_head: int
    pi: str = "gradient"  # gradient | soft_em | hard_em (MGK/sMGK only)

    @staticmethod
    def parse(name: str) -> Variant:
        m = _VARIANT.match(name)
        if not m or int(m[2]) < 1:
            raise ValueError(f"unknown LRA variant {name!r}: use softmax|mgk|smgk|linear|mlk|smlk followed by the "
                             "number of heads, e.g. mgk4, optionally _softe or _harde for MGK/sMGK (mgk1_softe)")
        if m[3] and m[1] not in ("mgk", "smgk"):
            raise ValueError(f"{name}: the E-step options exist for mgk and smgk only")
        return Variant(m[1], int(m[2]), {"softe": "soft_em", "harde": "hard_em", None: "gradient"}[m[3]])

    def attention(self, *, d_model: int, d_head: int, dropatt: float, form: str = "ours",
                  max_len: int = 4096) -> nn.Module:
        common = dict(d_model=d_model, n_head=self.n_head, d_head=d_head, bias=True)  # lra/attention.py biases
        keys = "shifted" if self.family.startswith("s") and self.family != "softmax" else "separate"
        official = form == "official"
        # lra/attention.py: π by gradient is one pair for the layer; the soft E-step keeps it per (head, position)
        layout = ("position" if self.pi == "soft_em" else "global") if official else "head"
        mixture = dict(pi_layout=layout, max_klen=max_len, form="lra_official" if official else "ours")
        if self.family == "softmax":
            return SoftmaxAttention(**common, dropatt=dropatt)
        if self.family in ("mgk", "smgk"):
            return MGKAttention(**common, **mixture, dropatt=dropatt, n_components=2, keys=keys, pi=self.pi,
                                sigma2_ratios=(1.0, 1.0))  # σ² = √E for both keys (lra/attention.py self.var)
        if self.family == "linear":
            return MLKAttention(**common, **mixture, n_components=1, keys="separate", causal=False)
        return MLKAttention(**common, **mixture, n_components=2, keys=keys, causal=False)


@dataclass(frozen=True)
class LRAConfig:
    """The reference's LRA model settings (lra/run_tasks.py defaults; Nyströmformer `lra_config.py`)."""

    n_token: int = 0  # from the data
    num_classes: int = 10
    dual: bool = False  # Retrieval: two documents
    max_len: int = 2000  # rows of the position table (the longest document)
    d_model: int = 64  # embedding_dim = transformer_dim
    d_inner: int = 128  # transformer_hidden_dim (MLP and head)
    d_head: int = 32
    n_layer: int = 2
    dropout: float = 0.1
    dropatt: float = 0.1
    form: str = "ours"  # official: π layout, soft E-step and linear attention of lra/attention*.py (docstring)
    # real: the mean over a document's real tokens; padded: the reference's (pads zeroed after the final LayerNorm,
    # then the mean over every position, pads included: with its fixed padded length, data.pad_to)
    pooling: str = "real"
    # True: each layer's attention (its projections included) runs in float32 with autocast off, as the reference's
    # `lra/attention.py` runs its attention core (Q, K, V cast to float32) under its fp16 training
    attention_fp32: bool = False

    def __post_init__(self):
        if self.form not in ("ours", "official"):
            raise ValueError(f"model.form is ours or official, got {self.form!r}")
        if self.pooling not in ("real", "padded"):
            raise ValueError(f"model.pooling is real or padded, got {self.pooling!r}")
        if self.num_classes < 2 or self.max_len < 1 or self.n_layer < 1:
            raise ValueError("num_classes must be ≥ 2, max_len and n_layer ≥ 1")


class EncoderLayer(nn.Module):
    def __init__(self, cfg: LRAConfig, variant: Variant):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = variant.attention(d_model=cfg.d_model, d_head=cfg.d_head, dropatt=cfg.dropatt, form=cfg.form,
                                      max_len=cfg.max_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_inner), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.d_inner, cfg.d_model), nn.Dropout(cfg.dropout))
        self.attention_fp32 = cfg.attention_fp32

    def forward(self, x_BTD: torch.Tensor, pad_B11K: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x_BTD)
        if self.attention_fp32 and torch.is_autocast_enabled(h.device.type):
            with torch.autocast(h.device.type, enabled=False):
                a, _ = self.attn(h.float(), mem_BMD=None, mask_TK=pad_B11K)
        else:
            a, _ = self.attn(h, mem_BMD=None, mask_TK=pad_B11K)
        x_BTD = x_BTD + self.drop(a)
        return x_BTD + self.mlp(self.norm2(x_BTD))


class LRAEncoder(nn.Module):
    """Tokens (B, T), 0 = pad → mean-pooled representation (B, D)."""

    def __init__(self, cfg: LRAConfig, variant: Variant):
        super().__init__()
        if cfg.n_token < 2:
            raise ValueError("LRAConfig.n_token comes from the data module (leave it unset in configs)")
        self.tok = nn.Embedding(cfg.n_token, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(cfg, variant) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.max_len = cfg.max_len
        self.pooling = cfg.pooling

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        b, t = tokens_BT.shape
        if t > self.max_len:
            raise ValueError(f"a document of {t} tokens exceeds the position table ({self.max_len}): raise "
                             "model.max_len or lower data.max_len")
        real_BT = tokens_BT != 0
        x = self.drop(self.tok(tokens_BT) + self.pos.weight[:t])
        pad = ~real_BT[:, None, None, :]  # (B, 1, 1, K): True where a key is padding
        for layer in self.layers:
            x = layer(x, pad)
        x = self.norm(x)
        w = real_BT.to(x.dtype)[..., None]
        if self.pooling == "padded":  # the reference: pads zeroed, then the mean over all t positions
            return (x * w).sum(1) / t
        return (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # mean over the real tokens


class LRAClassifier(nn.Module):
    def __init__(self, cfg: LRAConfig, variant: Variant):
        super().__init__()
        self.cfg, self.variant = cfg, variant
        self.encoder = LRAEncoder(cfg, variant)
        width = 4 * cfg.d_model if cfg.dual else cfg.d_model
        self.head = nn.Sequential(nn.Linear(width, cfg.d_inner), nn.ReLU(), nn.Linear(cfg.d_inner, cfg.num_classes))

    def forward(self, tokens_BT: torch.Tensor, tokens2_BT: torch.Tensor | None = None) -> torch.Tensor:
        x = self.encoder(tokens_BT)
        if self.cfg.dual:
            if tokens2_BT is None:
                raise ValueError("the Retrieval model needs two documents per example")
            y = self.encoder(tokens2_BT)
            x = torch.cat([x, y, x * y, x - y], dim=-1)
        return self.head(x)


@dataclass(frozen=True)
class LRAOptim:
    lr: float = 1e-4
    warmup_steps: int = 8000
    weight_decay: float = 0.0
    adam_eps: float = 1e-6


class LRAModule(L.LightningModule):
    """Args:
        variant: the attention, e.g. softmax2, mgk1, smgk1_softe (see `Variant.parse`).
        model: `LRAConfig` (n_token comes from the data module).
        optim: `LRAOptim`.
    """

    # the run's summary line: a classifier's accuracy and loss (its ppl and bpc are logged for the curves' CSV only)
    summary_metrics = ("acc", "loss")

    def __init__(self, variant: str = "softmax2", model: LRAConfig | dict = LRAConfig(),
                 optim: LRAOptim | dict = LRAOptim(), n_token: int = 0):
        super().__init__()
        cfg = coerce(LRAConfig, model)
        self.cfg = replace(cfg, n_token=n_token or cfg.n_token)
        self.variant_name = variant
        self.variant = Variant.parse(variant)
        self.optim = coerce(LRAOptim, optim)
        self.model = LRAClassifier(self.cfg, self.variant)
        self.acc = nn.ModuleDict({f"{s}_acc": MulticlassAccuracy(self.cfg.num_classes, average="micro")
                                  for s in ("train", "valid", "test")})
        # the evaluation loss, weighted by examples and summed over DDP ranks when computed
        self.eval_loss = nn.ModuleDict({s: MeanMetric() for s in ("valid", "test")})
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.int64), persistent=True)
        self.register_buffer("train_batches", torch.zeros((), dtype=torch.int64), persistent=True)
        self.save_hyperparameters({"variant": variant, "model": asdict(self.cfg), "optim": asdict(self.optim),
                                   "n_token": self.cfg.n_token})

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "num_classes"):
            return
        if dm.num_classes != self.cfg.num_classes or dm.info.dual != self.cfg.dual:
            raise ValueError(f"task {dm.task} has {dm.num_classes} classes (two documents: {dm.info.dual}), the model "
                             f"{self.cfg.num_classes} (dual: {self.cfg.dual}): set model.num_classes and model.dual")
        if dm.tgt_len > self.cfg.max_len:
            what = "data.pad_to" if getattr(dm, "pad_to", None) else "data.max_len"
            raise ValueError(f"{what} {dm.tgt_len} exceeds model.max_len {self.cfg.max_len} (the position table)")
        if self.cfg.pooling == "padded" and not getattr(dm, "pad_to", None):
            raise ValueError("model.pooling padded divides by the padded length: set data.pad_to (the reference "
                             "pads every document to a fixed length), or use model.pooling real")

    def forward(self, batch) -> torch.Tensor:
        return self.model(batch.tokens, batch.tokens2)

    def _step(self, batch, split: str) -> torch.Tensor:
        logits = self(batch)
        loss = F.cross_entropy(logits.float(), batch.labels)
        self.acc[f"{split}_acc"].update(logits.detach(), batch.labels)
        prefix = "val" if split == "valid" else split
        if split == "train":
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(batch.labels))
            # cross-entropy per example as a perplexity and in bits: the names the repository's curve recorder reads
            self.log("train/ppl", torch.exp(loss.detach()), on_step=True, on_epoch=False, batch_size=len(batch.labels))
            self.log("train/bpc", loss.detach() / math.log(2), on_step=True, on_epoch=False,
                     batch_size=len(batch.labels))
        else:
            self.eval_loss[split].update(loss.detach(), weight=len(batch.labels))
        self.log(f"{prefix}/acc", self.acc[f"{split}_acc"], on_step=False, on_epoch=True, batch_size=len(batch.labels))
        return loss

    def training_step(self, batch, batch_idx):
        n = batch.tokens.numel() + (batch.tokens2.numel() if batch.tokens2 is not None else 0)
        self.tokens_seen += n * self.trainer.world_size
        self.train_batches += 1
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "valid")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def _log_eval_loss(self, split: str) -> None:
        """The split's mean cross-entropy per example over every rank's examples (torchmetrics reduces it)."""
        prefix = "val" if split == "valid" else split
        loss = self.eval_loss[split].compute()
        self.eval_loss[split].reset()
        self.log(f"{prefix}/loss", loss)
        self.log(f"{prefix}/ppl", torch.exp(loss))
        self.log(f"{prefix}/bpc", loss / math.log(2))

    def on_validation_epoch_end(self) -> None:
        self._log_eval_loss("valid")

    def on_test_epoch_end(self) -> None:
        self._log_eval_loss("test")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.optim.lr, betas=(0.9, 0.999), eps=self.optim.adam_eps,
                                weight_decay=self.optim.weight_decay, foreach=True)  # same numbers, fewer ops
        total = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 0
        if total <= 0:
            raise ValueError("the one-cycle schedule spans trainer.max_steps: set --trainer.max_steps")
        if not 1 < self.optim.warmup_steps < total:  # OneCycleLR divides by warmup_steps - 1
            raise ValueError(f"optim.warmup_steps must lie in [2, max_steps = {total}), got {self.optim.warmup_steps}")
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.optim.lr, total_steps=total,
                                                    pct_start=self.optim.warmup_steps / total,
                                                    anneal_strategy="linear")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def describe(self) -> dict:
        return {"model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
                "module_class": f"{type(self).__module__}.{type(self).__qualname__}",
                "parameters": sum(p.numel() for p in self.parameters()), "variant": self.variant_name,
                "attention": self.variant.family, "n_head": self.variant.n_head, "pi": self.variant.pi}
