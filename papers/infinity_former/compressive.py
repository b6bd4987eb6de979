"""The compressive transformer (Rae, Potapenko, Jayakumar, Lillicrap; ICLR 2020, arXiv 1911.05507), the baseline
of the ∞-former's sorting experiment (Martins et al. 2022, §4.1: "memory 1024 + compressed memory 1024, CNN
compression").

A Transformer-XL (the repository's `papers/transformer_xl/model.py`, relative attention) whose layers attend over
[compressed memory; memory; segment]. When the short memory overflows, its oldest states are not dropped but
compressed by a factor c (Rae et al. Algorithm 1) — by default a Conv1d with kernel = stride = c, one per layer;
max or mean pooling as in the paper's ablation (§3.1, Table 2 of Rae et al.) — and pushed into a FIFO compressed
memory of `cmem_len` slots. The compression network is trained only by the attention-reconstruction loss
(Algorithm 2): for each layer, the content attention of the current segment's queries over the evicted states
against the same attention over their compression, with the queries, the evicted states and the attention
weights held fixed, so that its gradient reaches the compression network only. The ∞-former paper gives no code
for this baseline (its repository contains none), so this file follows Rae et al.

Layout legend: B batch, T segment length, M short-memory length, C compressed-memory length, O evicted states
(a multiple of c), K = C + M + T keys, D model width; tensors are batch-first.

Memory layout (what `forward` takes and returns, a flat list so that `SegmentLM` can gather/scatter dim 0 for
checkpoints and DDP): `mems = [short_0, …, short_{L−1}, cmem_0, …, cmem_{L−1}]` with `short_i` (B, M, D) the
last inputs of layer i (as Transformer-XL's memory) and `cmem_i` (B, C ≤ cmem_len, D) the compressions of the
inputs of layer i evicted earlier, oldest first. M ≤ mem_len + c − 1 (see "partial overflow" below); M ≤ mem_len
whenever mem_len and T are multiples of c. Every entry is detached.

Where this differs from Rae et al. (and why):
- Memories start empty (as the harness's Transformer-XL), not as n_m zero vectors: with `cmem_len = 0` the model
  is the harness's Transformer-XL weight for weight, and no compressions of zero vectors enter the memory.
- Partial overflow. Rae et al. evict exactly n_s states per step from an always-full memory, with n_s a multiple
  of c. With an empty start (or T, mem_len not multiples of c) the overflow beyond mem_len need not be a multiple
  of c; we evict only whole groups of c (the oldest ⌊overflow/c⌋·c states) and leave the remaining < c oldest
  states in the short memory, where they stay attended until the next segment completes their group. Nothing is
  dropped uncompressed, nothing is padded, and the compressed memory holds exactly f_c of consecutive c-groups of
  the layer's input stream in order (tested against a naive recomputation).
- The reconstruction error is the mean squared difference of the two attention outputs (averaged over batch,
  heads, queries and channels), summed over layers and multiplied by `recon_weight`; Algorithm 2 writes an L2
  norm. Both vanish together and, the gradient reaching only the compression network, only its step size differs.
- The reconstruction attention is softmax(q·kᵀ/√E)·v per head, with q, k, v from the layer's own projection (and,
  with `pre_lnorm`, its LayerNorm), all detached; Algorithm 2 writes σ((hQ)(mK)ᵀ)(mV) without the 1/√E scale.
  No relative-position terms and no output projection (neither appears in Algorithm 2).
- Positions: the compressed slots are ordinary key positions placed before the short memory (relative distances
  run over all K keys), as in Rae et al.'s Transformer-XL-based model; `same_length` counts against
  mem_len + cmem_len keys.
- On a training step in which nothing is evicted (the first segments of a stream) the auxiliary loss is a zero
  that still touches the compression weights, so that DDP finds a gradient (zero) for every parameter.
- The Conv1d keeps PyTorch's default initialisation (the backbone's normal(0, 0.02) covers Linear layers only);
  Rae et al. do not state theirs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.config import coerce
from repro.memory import MemoryMechanism, evict_oldest, register


@dataclass(frozen=True)
class CompressiveConfig:
    """The compressed memory of Rae et al. (the backbone's sizes live in `TransformerXLConfig`)."""

    # c: evicted states per compressed slot. Rae et al. sweep c ∈ {2, 3, 4}; the ∞-former paper does not state the
    # rate of its baseline.
    rate: int = 3
    # n_cm: compressed slots per layer (the ∞-former's sorting baseline: 1024, beside a short memory of 1024);
    # 0 turns the compressed memory off (the model is then Transformer-XL)
    cmem_len: int = 0
    # f_c: "conv" (Conv1d, kernel = stride = c, the paper's choice), "max_pool" or "mean_pool" (its ablation)
    compression: Literal["conv", "max_pool", "mean_pool"] = "conv"
    # weight of the attention-reconstruction loss (it trains the compression network only)
    recon_weight: float = 1.0

    def __post_init__(self):
        if self.rate < 1:
            raise ValueError(f"compressive.rate (c) must be ≥ 1, got {self.rate}")
        if self.cmem_len < 0:
            raise ValueError(f"compressive.cmem_len must be ≥ 0, got {self.cmem_len}")
        if self.compression not in ("conv", "max_pool", "mean_pool"):
            raise ValueError(f"compressive.compression is conv, max_pool or mean_pool, got {self.compression!r}")
        if self.recon_weight < 0:
            raise ValueError(f"compressive.recon_weight must be ≥ 0, got {self.recon_weight}")


def split_overflow(
    short_BMD: torch.Tensor, new_BTD: torch.Tensor, *, mem_len: int, rate: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, evicted) of [short; new], detached: the oldest ⌊(M + T − mem_len)/c⌋·c states are evicted (whole
    groups of c only; the < c left over stay in the short memory), the rest is kept."""
    with torch.no_grad():
        cat = torch.cat([short_BMD.to(new_BTD.dtype), new_BTD], dim=1) if short_BMD.shape[1] else new_BTD
        cat = cat.detach()
    over = cat.shape[1] - mem_len
    n_out = (over // rate) * rate if over > 0 else 0
    return cat[:, n_out:], cat[:, :n_out]


class Compression(nn.Module):
    """f_c: (B, O, D) → (B, O/c, D), one slot per consecutive group of c states (O must be a multiple of c)."""

    def __init__(self, *, d_model: int, rate: int, kind: str):
        super().__init__()
        self.rate, self.kind = rate, kind
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate, stride=rate) if kind == "conv" else None

    def forward(self, old_BOD: torch.Tensor) -> torch.Tensor:
        if old_BOD.shape[1] % self.rate:
            raise ValueError(f"compression takes whole groups of c={self.rate} states, got {old_BOD.shape[1]}")
        x_BDO = old_BOD.transpose(1, 2)
        if self.kind == "conv":
            y = self.conv(x_BDO.to(self.conv.weight.dtype))
        elif self.kind == "max_pool":
            y = F.max_pool1d(x_BDO, self.rate, self.rate)
        else:
            y = F.avg_pool1d(x_BDO, self.rate, self.rate)
        return y.transpose(1, 2)  # (B, O/c, D)


@register("compressive")
class CompressiveMemory(MemoryMechanism):
    """The compressed memory as a mechanism of the backbone's loop (`repro.memory.MemoryMechanism`).

    State per layer: (cmem (B, C ≤ cmem_len, D),), attended before the short memory. Evicts whole groups of c rows
    (`split_overflow`), compresses them (`Compression`) and pushes them into the FIFO; with `cmem_len` 0 it keeps
    Transformer-XL's eviction and an empty compressed memory (the model is then Transformer-XL)."""

    slots = ("cmem",)
    settings = CompressiveConfig

    def __init__(self, cfg: TransformerXLConfig, **options):
        super().__init__()
        self.comp = coerce(CompressiveConfig, options)
        self.pre_lnorm = cfg.pre_lnorm
        self.compressors = nn.ModuleList(Compression(d_model=cfg.d_model, rate=self.comp.rate,
                                                     kind=self.comp.compression)
                                         for _ in range(cfg.n_layer if self.comp.cmem_len > 0 else 0))
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
        if self.comp.cmem_len == 0:  # Transformer-XL: the oldest rows are dropped
            return evict_oldest(short_BMD, new_BTD, mem_len)
        return split_overflow(short_BMD, new_BTD, mem_len=mem_len, rate=self.comp.rate)

    def write(self, i, layer, state, evicted_BOD, inputs_BTD):
        (cmem,) = state
        if self.comp.cmem_len == 0:
            return (cmem,)
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
        """{"attn_recon": recon_weight · Σ_layers reconstruction error} of the last forward pass (already weighted),
        or nothing when no gradient was recorded or nothing is trainable."""
        if not self._train:
            return {}
        params = [p for p in self.compressors.parameters() if p.requires_grad]
        # a zero that touches every compression weight when nothing was evicted keeps DDP's reducer satisfied
        total = torch.stack(self._errors).sum() if self._errors else sum(p.sum() for p in params) * 0.0
        return {"attn_recon": self.comp.recon_weight * total}


class CompressiveTransformer(TransformerXL):
    """`TransformerXL` with the compressed memory (`CompressiveMemory`) in its loop: `forward(tokens, mems,
    mem_len=…) -> (hidden, new_mems)` with the memory layout of the module docstring; `aux_losses()` gives the
    attention-reconstruction loss of the last forward pass."""

    def __init__(self, cfg: TransformerXLConfig, comp: CompressiveConfig):
        if cfg.attention != "relative":
            raise ValueError("the compressive transformer uses relative positions: set model.attention: relative")
        super().__init__(cfg, [(CompressiveMemory, asdict(comp))])  # the backbone draws its weights first
        self.comp = comp
        self.register_load_state_dict_pre_hook(_renamed_compressors)

    @property
    def compressors(self) -> nn.ModuleList | None:
        """f_c of each layer (None without a compressed memory)."""
        return self.mechanisms[0].compressors if self.comp.cmem_len > 0 else None

    def split_memory(self, mems: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(short memories, compressed memories), one tensor per layer each."""
        n = self.cfg.n_layer
        if len(mems) != 2 * n:
            raise ValueError(
                f"a compressive memory holds 2 × n_layer = {2 * n} tensors ([short_0..short_{n - 1}, "
                f"cmem_0..cmem_{n - 1}]), got {len(mems)}: pass the memory this model returned, or None to start"
            )
        return list(mems[:n]), list(mems[n:])


def _renamed_compressors(module, state_dict, prefix, *args) -> None:
    """Checkpoints of the model before its compressed memory became a mechanism held `compressors.*` at the top."""
    for key in [k for k in state_dict if k.startswith(prefix + "compressors.")]:
        state_dict[prefix + "mechanisms.0." + key[len(prefix):]] = state_dict.pop(key)


def layer_reconstruction_error(layer: nn.Module, h_BTD, old_BOD, new_BCD, *, pre_lnorm: bool) -> torch.Tensor:
    """mean ‖attn(h, old) − attn(h, f_c(old))‖² for one backbone layer (its attention's `qkv_net`, and with
    `pre_lnorm` its LayerNorm), with stop-gradients on everything but f_c. Also the arena's compressive memory's
    (`papers/arena/mechanisms.py`)."""
    att = layer.attn
    if pre_lnorm:  # the layer attends over LayerNorm-ed inputs and memories
        ln = layer.attn_norm
        w_ln, b_ln = ln.weight.detach(), ln.bias.detach()
        h_BTD, old_BOD, new_BCD = (F.layer_norm(x, ln.normalized_shape, w_ln, b_ln, ln.eps)
                                   for x in (h_BTD, old_BOD, new_BCD))
    w = att.qkv_net.weight.detach()
    nh, e = att.n_head, att.d_head
    b, t, _ = h_BTD.shape
    q_BHTE = F.linear(h_BTD, w[: nh * e]).view(b, t, nh, e).transpose(1, 2) * att.scale

    def keys_values(m_BND):
        kv = F.linear(m_BND, w[nh * e:]).view(b, m_BND.shape[1], 2, nh, e).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    return reconstruction_error(q_BHTE, keys_values, old_BOD, new_BCD)


def reconstruction_error(q_BHTE: torch.Tensor, keys_values, old_BOD: torch.Tensor,
                         new_BCD: torch.Tensor) -> torch.Tensor:
    """Rae et al. Algorithm 2: mean ‖attn(q, old) − attn(q, f_c(old))‖² (over batch, heads, queries, channels).

    `q_BHTE`: the layer's queries, already scaled and detached; `keys_values(m_BND) -> (k_BHNE, v_BHNE)`: the
    layer's key and value projections with detached weights, so that the gradient reaches f_c (through `new_BCD`)
    only. Content attention softmax(q·kᵀ)·v per head in float32, no mask, no positional terms, no output projection.
    Used by `CompressiveTransformer` and by the compressive GPT-2 memory (`adapters.CompressiveLayerMemory`)."""

    def attend_to(m_BND):
        k, v = keys_values(m_BND)
        prob = torch.softmax(q_BHTE @ k.to(q_BHTE.dtype).transpose(-1, -2), dim=-1, dtype=torch.float32)
        return prob.to(v.dtype) @ v  # (B, H, T, E)

    with torch.no_grad():
        target = attend_to(old_BOD).float()
    return F.mse_loss(attend_to(new_BCD.to(old_BOD.dtype)).float(), target)
