"""GPT-2 with a memory of the text that left its 512-token window: the ∞-former's GPT-2 experiments (paper §4.2-4.3).

The paper fine-tunes GPT-2 small on 512-token blocks fed in order (batch 1), and adds to each layer (or the
configured layers) a long-term memory (LTM) that attends from the layer's queries to the hidden states that
entered the layer during the previous blocks. This module builds that model around `transformers`'
`GPT2LMHeadModel`, the same code path for both profiles:

- paper profile: `GPT2Settings(pretrained="gpt2")` loads the pretrained weights (hub; needs network once);
- tiny profile: `GPT2Settings(pretrained=None, n_layer=.., n_embd=.., n_head=..)` builds a random `GPT2Config`
  whose vocabulary is the locally trained BPE's (`repro.text.tokenizer`).

The memory hook (`MemoryHook`, `LayerMemory`)
-------------------------------------------
Every configured layer gets a `LayerMemory` module. Its contract, which the LTM (`papers/infinity_former/ltm.py`)
and the compressive memory (`papers/infinity_former/compressive.py`) implement through small adapters
(`build_layer_memory`), is:

- `init_state(batch, device, dtype) -> dict[str, Tensor]`: an empty memory; every tensor is batch-first (the
  state is carried between blocks, sliced per DDP rank and saved in checkpoints);
- `update(state, x_BLD) -> state`: absorb `x`, what entered this layer during the previous block, detached, as
  the official `Block.mem`; which vector that is, is `MemoryHook.stores`: `block_input` (the block input before
  `ln_1`: the official language-modelling code, `finetune_gpt2` `Block.forward`, `self.mem = hidden_states.detach()`)
  or `ln_1` (the official document-grounded code, `document_grounded_generation` `Block.forward`,
  `self.mem = self.ln_1(hidden_states.detach())`: ln_1 of the detached input, so ln_1's gain and bias also learn
  through the memory; we apply the block's ln_1 to the detached input when the memory absorbs it, at the start of
  the next block — the same weights when the optimiser steps once per conversation, as the official does).
  It is called at the start of the next block's forward pass, with gradients on, so the memory's own parameters
  (e.g. the LTM's smoothing gate) learn from the loss of the block that reads it, as in the official code where
  the LTM refits its coefficients inside `LongTermAttention.forward`;
- `attend(q_BHTd, state) -> Z_BTD | None`: the memory's contribution for the queries of this layer's
  self-attention (GPT-2's own query projection, split into heads); `None` when the memory is empty. `Z` is added
  to the self-attention output after its output projection, before the residual connection (the official
  `Attention.forward` adds `a_long_term` to `c_proj(a)`). GPT-2's residual dropout is applied to `Z` as well;
- `attend` may replace entries of `state` (the sticky-memory histogram of this step's attention): the state
  carried to the next block is the one left after the forward pass;
- `extra_loss() -> Tensor | None`: the weighted auxiliary loss of the last `attend` (the LTM's λ_KL · KL), added
  to the NLL.

`kind: ltm` is the ∞-former's continuous memory (`papers/infinity_former/ltm.py`, `ContinuousLTM`) through
`LTMLayerMemory`: the state is the signal's coefficients B (B, N, D), the sticky histogram and the number of
tokens absorbed; the memory is emptied once it has absorbed `threshold` tokens (the official GPT-2 code's
`mem_threshold` = 2048 for language modelling) and at the start of each conversation (dialogue).
`kind: compressive` is the compressive-transformer baseline (below), `CompressiveLayerMemory`.

After each block the carried state is detached (truncated back-propagation, PAPERS.md §5).

The compressive baseline (`kind: compressive`, Tables 1-2 "Compressive")
-----------------------------------------------------------------------
The paper: "GPT-2 with a compressed memory with attention positional biases (compressive), of size 512", "having
the same computational budget" as the ∞-former's memory threshold of 2,048 tokens. The official repository has
no code for it, so it follows Rae et al. 2019 (`papers/infinity_former/compressive.py` on the sorting task), with
these choices:

- Unlike the LTM (an added attention), the compressed slots EXTEND the layer's own self-attention keys: one softmax
  over [compressed slots; the causal block]. A memory with `extends_attention = True` gets the whole attention
  from `MemoryAttention`: q, k, v = c_attn(ln_1(x)) of the wrapped GPT-2 attention, the slots' keys and values =
  c_attn's key/value part of ln_1(slots) (the block's own ln_1: a slot is a compressed block input, the same kind
  of vector as x), scores scaled by the wrapped attention's `scaling` (1/√d_head in GPT-2), the causal mask on the
  block part, a learned bias per (head, slot) added to the slots' scores, softmax in float32, GPT-2's attention
  dropout, c_proj and residual dropout. With an empty memory this is `transformers`' attention exactly (tested).
- "Attention positional biases": GPT-2's positions are absolute input embeddings, which the slots do not have; a
  learned scalar per (head, slot) tells the layer how old a slot is. It is indexed from the newest slot (the newest
  slot always has column cmem_len − 1, also while the memory fills) and starts at 0.
- No short-term memory: the plain GPT-2 window is the block of 512 (as every GPT-2 run of the paper), so the inputs
  of a layer during block t are compressed at the start of block t + 1 and only their compressions are attended.
- Rate c = 4 (Conv1d, kernel = stride = c, Rae et al.'s best; the paper does not state the rate), so that the
  512 slots cover 2,048 tokens, the span of the ∞-former's memory threshold of 2,048 tokens. A block whose length
  is not a multiple of c leaves its < c newest inputs in the state (`rest`) until their group completes: nothing is
  dropped uncompressed, nothing padded; these few states are not attended meanwhile (there is no short memory to
  hold them). FIFO of `cmem_len` slots, oldest first; no threshold (the FIFO bounds it); emptied at the start of
  each conversation (dialogue), where the LTM is, and never within a language-modelling stream.
- The compression network is trained only by Rae et al.'s attention-reconstruction loss (Algorithm 2), as in
  `compressive.py`: the queries of the block that first reads the new slots (the block at whose start they were
  compressed), keys/values of the evicted raw states against those of their compression through the layer's
  detached ln_1 and c_attn, content attention without mask, bias or output projection, mean squared error,
  times `recon_weight`, summed over layers (`extra_loss`). The slots entering the memory are detached, so the LM
  loss does not train the Conv1d; it trains the positional bias. On a step where nothing was compressed the loss
  is a zero that touches every memory parameter (DDP).

`kind: window` is a trivial memory of ours used to test the hook and as a sanity baseline: ordinary softmax
attention over the last `mem_len` block inputs with its own key/value/output projections (output projection
initialised to zero, so that a pretrained GPT-2 starts unchanged). `kind: none` is plain GPT-2 (the "GPT-2" and
"GPT-2 w/o doc" rows: each 512-token block sees nothing of the previous ones).

Deviations from the official code (deep-spin/infinite-former `finetune_gpt2`, `document_grounded_generation`):
- targets are the inputs shifted by one across block boundaries, so the first token of every block is
  predicted from the block before; the official `run_clm` / `DoGDataset` score each block on its own;
- AdamW and a linear decay to 0 over `trainer.max_steps` (the official: the same, over 3 epochs) — see
  `FinetuneOptim`;
- the official GPT-2 attention applied one dropout to `c_proj(a) + Z`; here GPT-2's own attention output is
  dropped out inside `transformers` and `Z` gets its own dropout mask (same rate).

Official details matched through settings (the paper configs set them; see README "GPT-2 parity"): σ² ≥ 1e-4
(`ltm.min_var`), what the memory stores (`memory_hook.stores`), the language-modelling code's μ term of the KL
(`ltm.mu_0` = −1), N(0, 0.02) for the LTM's linear maps (`ltm.init_std`), and for dialogue one optimiser step per
conversation after back-propagating and clipping each piece (`optim.step_per: conversation`, `optim.clip`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce

IGNORE = -100


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class GPT2Settings:
    pretrained: str | None = None  # "gpt2": pretrained weights from the hub (paper); None: random GPT2Config (tiny)
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    n_positions: int = 512  # GPT-2's window; the blocks fed to it are at most this long
    dropout: float = 0.1  # GPT-2's resid / embd / attn dropout (the pretrained model's 0.1)

    def __post_init__(self):
        if self.pretrained is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")


@dataclass(frozen=True)
class MemoryHook:
    kind: Literal["none", "window", "ltm", "compressive"] = "none"
    layers: tuple[int, ...] | None = None  # layers with a memory (None: all)
    args: dict[str, Any] = field(default_factory=dict)  # passed to the memory's constructor
    # what a layer's memory absorbs: its block input (official finetune_gpt2, Table 1) or ln_1 of it (official
    # document_grounded_generation, Table 2); see the module docstring
    stores: Literal["block_input", "ln_1"] = "block_input"

    def __post_init__(self):
        if self.kind not in ("none", "window", "ltm", "compressive"):
            raise ValueError(f"memory kind is none | window | ltm | compressive, got {self.kind!r}")
        if self.stores not in ("block_input", "ln_1"):
            raise ValueError(f"memory_hook.stores is block_input | ln_1, got {self.stores!r}")
        if self.kind == "compressive" and self.stores != "block_input":
            raise ValueError("the compressive memory projects its slots through the block's ln_1 itself: "
                             "use memory_hook.stores: block_input")


@dataclass(frozen=True)
class FinetuneOptim:
    """AdamW with a linear decay to 0 over `trainer.max_steps` (the official fine-tuning: lr 5e-5).

    `step_per: conversation` reproduces the official dialogue loop (`document_grounded_generation/train.py`,
    `update`): each piece of a conversation is back-propagated (its mean NLL + λ_KL·KL, not divided by the number
    of pieces) and the accumulated gradient clipped to norm `clip` after every piece, and the optimiser (and the
    schedule) steps once per conversation. It needs dialogue batches and one process (the official batch is one
    conversation); `trainer.gradient_clip_val` must then be unset (`clip` replaces it) and `trainer.max_steps`
    counts conversations. `step_per: piece` steps after every batch (Lightning's loop, `trainer.gradient_clip_val`)."""

    lr: float = 5e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["linear", "constant"] = "linear"
    step_per: Literal["piece", "conversation"] = "piece"
    clip: float | None = None  # gradient-norm clip after each piece (step_per: conversation; official max_norm 1.0)

    def __post_init__(self):
        if self.step_per not in ("piece", "conversation"):
            raise ValueError(f"optim.step_per is piece | conversation, got {self.step_per!r}")
        if self.clip is not None and (self.clip <= 0 or self.step_per != "conversation"):
            raise ValueError("optim.clip (> 0) is for step_per: conversation; with step_per: piece use "
                             "trainer.gradient_clip_val")

    def factor(self, step: int, max_steps: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(1, max_steps - self.warmup_steps)
        return max(0.0, 1.0 - (step - self.warmup_steps) / span)


# ---------------------------------------------------------------------------------------------- the hook
class LayerMemory(nn.Module):
    """The contract of a layer's memory (see the module docstring)."""

    def init_state(self, batch: int, device, dtype) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def update(self, state: dict[str, torch.Tensor], x_BLD: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def attend(self, q_BHTd: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor | None:
        raise NotImplementedError

    def extra_loss(self) -> torch.Tensor | None:
        return None


class WindowMemory(LayerMemory):
    """Softmax attention over the last `mem_len` hidden states that left the window (a trivial memory)."""

    def __init__(self, d_model: int, n_head: int, mem_len: int = 512):
        super().__init__()
        if mem_len <= 0:
            raise ValueError(f"window memory needs mem_len > 0, got {mem_len}")
        self.d_model, self.n_head, self.mem_len = d_model, n_head, mem_len
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        nn.init.zeros_(self.out.weight)  # a pretrained GPT-2 starts as it was
        nn.init.zeros_(self.out.bias)

    def init_state(self, batch, device, dtype):
        return {"x": torch.zeros(batch, 0, self.d_model, device=device, dtype=dtype)}

    def update(self, state, x_BLD):
        return {"x": torch.cat([state["x"], x_BLD], dim=1)[:, -self.mem_len :]}

    def attend(self, q_BHTd, state):
        x = state["x"]
        if x.shape[1] == 0:
            return None
        b, h, t, d = q_BHTd.shape
        k, v = self.kv(x.to(q_BHTd.dtype)).view(b, -1, 2, h, d).permute(2, 0, 3, 1, 4)  # 2 × (B, H, M, d)
        att = torch.softmax(q_BHTd @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        z = (att @ v).transpose(1, 2).reshape(b, t, h * d)
        return self.out(z)


class LTMLayerMemory(LayerMemory):
    """The ∞-former's continuous long-term memory (`ContinuousLTM`) behind the hook.

    Args (from `memory_hook.args`): `ltm` (an `LTMConfig` dict: N, widths, ridge, τ, samples, sticky, bins, σ₀,
    μ₀, λ_KL, gate, σ² floor, init std), `threshold` (tokens absorbed before the memory is emptied; None: never)."""

    def __init__(self, d_model: int, n_head: int, ltm: dict | None = None, threshold: int | None = None):
        super().__init__()
        from papers.infinity_former.ltm import ContinuousLTM, LTMConfig

        args = dict(ltm or {})
        if isinstance(args.get("widths"), list):
            args["widths"] = tuple(args["widths"])
        self.cfg = LTMConfig(**args)
        if threshold is not None and threshold <= 0:
            raise ValueError(f"the LTM threshold must be positive or null, got {threshold}")
        self.threshold, self.d_model = threshold, d_model
        self.ltm = ContinuousLTM(d_model=d_model, n_head=n_head, d_head=d_model // n_head, cfg=self.cfg)
        self._loss: torch.Tensor | None = None

    def init_state(self, batch, device, dtype):
        return {"coef": torch.zeros(batch, 0, self.d_model, device=device),
                "hist": torch.zeros(batch, 0, device=device),
                "count": torch.zeros(batch, dtype=torch.long, device=device)}

    def update(self, state, x_BLD):
        if self.threshold is not None and bool((state["count"] >= self.threshold).any()):
            state = self.init_state(x_BLD.shape[0], x_BLD.device, x_BLD.dtype)  # the official memory threshold
        coef = state["coef"] if state["coef"].shape[1] else None
        hist = state["hist"] if state["hist"].shape[-1] else None
        coef, _ = self.ltm.update(coef, x_BLD, hist_BK=hist)  # refit (§3.2), sticky sample points (§3.3)
        return {"coef": coef, "hist": state["hist"], "count": state["count"] + x_BLD.shape[1]}

    def attend(self, q_BHTd, state):
        from papers.infinity_former.ltm import attention_histogram, kl_regulariser

        self._loss = None
        if state["coef"].shape[1] == 0:
            return None
        out, mu, var = self.ltm.attend(q_BHTd, state["coef"])
        if self.cfg.sampling == "sticky":
            with torch.no_grad():  # where this block's queries looked: the next update's sampling histogram
                state["hist"] = attention_histogram(mu.detach(), var.detach(), self.cfg.n_bins)
        if self.training and self.cfg.kl_weight:
            # mean over batch, heads and queries, summed over layers (the official `kl_reg.mean()` of the layers' sum)
            kl = kl_regulariser(mu, var, sigma_0=self.cfg.sigma_0, mu_0=self.cfg.mu_0)
            self._loss = self.cfg.kl_weight * kl.mean()
        return out

    def extra_loss(self):
        return self._loss


class CompressiveLayerMemory(LayerMemory):
    """The compressive-transformer baseline (Rae et al. 2019) on GPT-2: a FIFO of compressed slots that extends
    the layer's OWN self-attention keys (one softmax over [compressed slots; the causal block]), with a learned
    attention positional bias per (head, slot). See the module docstring ("The compressive baseline").

    Args (from `memory_hook.args`): `cmem_len` (compressed slots per layer, the paper's 512), `rate` (c: block
    inputs per slot; 4, so that 512 slots span 2,048 tokens, the ∞-former's memory threshold — the paper does not
    state the rate), `compression` ("conv": Conv1d with kernel = stride = c, Rae et al.'s choice; "max_pool" /
    "mean_pool": their ablation), `recon_weight` (weight of the attention-reconstruction loss, the only loss
    that trains the Conv1d).

    State (batch-first): `cmem` (B, C ≤ cmem_len, D) the compressions, oldest first; `rest` (B, r < c, D) the
    newest block inputs whose group of c is not complete yet (compressed once it is; never attended)."""

    extends_attention = True  # `MemoryAttention` hands the whole self-attention to `self_attention`

    def __init__(self, d_model: int, n_head: int, cmem_len: int = 512, rate: int = 4,
                 compression: Literal["conv", "max_pool", "mean_pool"] = "conv", recon_weight: float = 1.0):
        super().__init__()
        from papers.infinity_former.compressive import Compression, CompressiveConfig

        if cmem_len <= 0:
            raise ValueError(f"the compressive memory needs cmem_len > 0, got {cmem_len}")
        CompressiveConfig(rate=rate, cmem_len=cmem_len, compression=compression, recon_weight=recon_weight)  # checks
        self.d_model, self.n_head, self.cmem_len, self.rate = d_model, n_head, cmem_len, rate
        self.recon_weight = recon_weight
        self.compress = Compression(d_model=d_model, rate=rate, kind=compression)
        # the "attention positional bias": one learned scalar per (head, slot) added to the slot's score; the
        # newest slot is column cmem_len − 1 whatever the fill; zero at the start
        self.pos_bias = nn.Parameter(torch.zeros(n_head, cmem_len))
        self._recon: tuple[torch.Tensor, torch.Tensor] | None = None  # (evicted states, their compression)
        self._loss: torch.Tensor | None = None

    def init_state(self, batch, device, dtype):
        return {"cmem": torch.zeros(batch, 0, self.d_model, device=device, dtype=dtype),
                "rest": torch.zeros(batch, 0, self.d_model, device=device, dtype=dtype)}

    def update(self, state, x_BLD):
        """Compress every complete group of c states of [rest; x] (Rae et al. Algorithm 1, f_c) and push the slots
        into the FIFO; the < c newest states wait in `rest`. The slots entering the memory are detached (the LM
        loss does not train f_c); with gradients on, the Conv1d output is kept for this block's reconstruction."""
        x = x_BLD.detach()
        rest, cmem = state["rest"], state["cmem"]
        cat = torch.cat([rest.to(x.dtype), x], dim=1) if rest.shape[1] else x
        n = cat.shape[1] // self.rate * self.rate
        old_BOD, rest = cat[:, :n], cat[:, n:]
        self._recon = None
        if n:
            params = [p for p in self.compress.parameters() if p.requires_grad]
            train_f = self.training and torch.is_grad_enabled() and bool(params) and self.recon_weight > 0
            with torch.set_grad_enabled(train_f):
                new_BCD = self.compress(old_BOD)
            if train_f:
                self._recon = (old_BOD, new_BCD)
            new_BCD = new_BCD.detach().to(cmem.dtype)
            cmem = torch.cat([cmem, new_BCD], dim=1) if cmem.shape[1] else new_BCD
            cmem = cmem[:, max(0, cmem.shape[1] - self.cmem_len):]
        return {"cmem": cmem, "rest": rest.to(cmem.dtype)}

    def attend(self, q_BHTd, state):
        raise RuntimeError("the compressive memory extends the self-attention itself: see `self_attention`")

    def self_attention(self, inner: nn.Module, ln: nn.LayerNorm, h_BTD: torch.Tensor, state: dict[str, torch.Tensor],
                       attention_mask: torch.Tensor | None = None, record=None):
        """The layer's attention over [compressed slots; causal block], with the wrapped `GPT2Attention`'s weights
        (`inner`) and the block's `ln_1` (`ln`); `h_BTD` is ln_1 of the block input. Returns (output, probs) as
        the wrapped attention returns (output, weights)."""
        d, nh, hd = inner.embed_dim, inner.num_heads, inner.head_dim
        b, t, _ = h_BTD.shape
        q, k, v = inner.c_attn(h_BTD).split(d, dim=2)

        def heads(x):
            return x.reshape(b, x.shape[1], nh, hd).transpose(1, 2)  # (B, H, ·, d)

        q_BHTd, k, v = heads(q), heads(k), heads(v)
        if record is not None:
            record(q_BHTd)
        cmem = state["cmem"]
        c = cmem.shape[1]
        if c:
            mk, mv = self._kv(inner, ln, cmem.to(h_BTD.dtype), detach=False)
            k, v = torch.cat([heads(mk).to(k.dtype), k], dim=2), torch.cat([heads(mv).to(v.dtype), v], dim=2)
        scores = (q_BHTd @ k.transpose(-1, -2)).float() * inner.scaling  # (B, H, T, C + T)
        if c:
            bias_HC = self.pos_bias[:, self.cmem_len - c:].float()
            scores = torch.cat([scores[..., :c] + bias_HC[None, :, None, :], scores[..., c:]], dim=-1)
        allowed = torch.ones(t, c + t, dtype=torch.bool, device=h_BTD.device).tril(diagonal=c)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if attention_mask is not None:  # transformers' eager path passes its (causal) mask over the block
            block = scores[..., c:]
            block = (block.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                     else block + attention_mask.float())
            scores = torch.cat([scores[..., :c], block], dim=-1)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        probs = inner.attn_dropout(probs)
        out = (probs @ v).transpose(1, 2).reshape(b, t, d)
        out = inner.resid_dropout(inner.c_proj(out))
        self._loss = None
        if self.training and torch.is_grad_enabled():
            # a zero that touches every parameter (DDP finds a gradient for each at every step, also on a
            # conversation's first block, when the memory is empty and nothing was compressed)
            loss = sum(p.sum() for p in self.parameters()) * 0.0
            if self._recon is not None:
                loss = loss + self.recon_weight * self._reconstruction_error(inner, ln, q_BHTd, *self._recon)
            self._loss = loss
        self._recon = None
        return out, probs

    @staticmethod
    def _kv(inner, ln, x_BND, *, detach: bool):
        """Keys and values (B, N, D) each of `x` (block inputs) through the layer's ln_1 and c_attn."""
        d = inner.embed_dim
        w_ln, b_ln = ln.weight, ln.bias
        w, bias = inner.c_attn.weight[:, d:], inner.c_attn.bias[d:]  # Conv1D: x @ W + b, W is (in, out)
        if detach:
            w_ln, b_ln, w, bias = w_ln.detach(), b_ln.detach(), w.detach(), bias.detach()
        kv = F.layer_norm(x_BND, ln.normalized_shape, w_ln, b_ln, ln.eps)
        kv = torch.matmul(kv, w) + bias
        return kv.split(d, dim=-1)

    def _reconstruction_error(self, inner, ln, q_BHTd, old_BOD, new_BCD) -> torch.Tensor:
        """Rae et al. Algorithm 2 (`compressive.reconstruction_error`) with this block's queries and the layer's
        ln_1 / key / value weights, all detached: the gradient reaches f_c only."""
        from papers.infinity_former.compressive import reconstruction_error

        b, nh, t, hd = q_BHTd.shape

        def keys_values(m_BND):
            k, v = self._kv(inner, ln, m_BND, detach=True)
            return tuple(x.reshape(b, m_BND.shape[1], nh, hd).transpose(1, 2) for x in (k, v))

        return reconstruction_error(q_BHTd.detach() * inner.scaling, keys_values, old_BOD, new_BCD)

    def extra_loss(self):
        return self._loss


def build_layer_memory(hook: MemoryHook, d_model: int, n_head: int, layer: int) -> LayerMemory:
    if hook.kind == "window":
        return WindowMemory(d_model, n_head, **hook.args)
    if hook.kind == "ltm":
        return LTMLayerMemory(d_model, n_head, **hook.args)
    if hook.kind == "compressive":
        return CompressiveLayerMemory(d_model, n_head, **hook.args)
    raise ValueError(f"no layer memory for kind {hook.kind!r}")


class _Runtime:
    """What the attention wrappers read during one forward pass: each layer's memory state."""

    def __init__(self):
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.queries: dict[int, torch.Tensor] = {}  # tests look at them
        self.record_queries = False


class MemoryAttention(nn.Module):
    """GPT-2's self-attention plus a `LayerMemory`'s contribution (added after `c_proj`); for a memory that extends
    the attention's own keys (`extends_attention`, the compressive memory) the memory computes the whole attention
    from the wrapped attention's weights and the block's ln_1."""

    def __init__(self, inner: nn.Module, memory: LayerMemory, layer: int, runtime: _Runtime,
                 ln: nn.Module | None = None):
        super().__init__()
        self.inner, self.memory, self.layer = inner, memory, layer
        self._runtime = [runtime]  # a list: not registered as a submodule
        self._ln = [ln]  # the block's ln_1 (a compressive memory projects its slots through it); not registered

    def forward(self, hidden_states, *args, **kwargs):
        rt = self._runtime[0]
        state = rt.states.get(self.layer)
        if state is not None and getattr(self.memory, "extends_attention", False):
            # the compressed memory adds keys to this attention's own softmax: the memory computes the attention
            if args or kwargs.get("past_key_values") is not None or kwargs.get("encoder_hidden_states") is not None:
                raise ValueError("the compressive GPT-2 attention runs without a key/value cache or cross-attention")
            record = (lambda q: rt.queries.__setitem__(self.layer, q)) if rt.record_queries else None
            return self.memory.self_attention(self.inner, self._ln[0], hidden_states, state,
                                              kwargs.get("attention_mask"), record=record)
        out = self.inner(hidden_states, *args, **kwargs)
        if state is None:
            return out
        d = self.inner.embed_dim
        q = self.inner.c_attn(hidden_states)[..., :d]
        b, t, _ = q.shape
        q = q.view(b, t, self.inner.num_heads, self.inner.head_dim).transpose(1, 2)  # (B, H, T, d)
        if rt.record_queries:
            rt.queries[self.layer] = q
        z = self.memory.attend(q, state)
        if z is None:
            if self.training and torch.is_grad_enabled():
                # an empty memory (a stream's or conversation's first block) still touches its parameters with a
                # zero, so that DDP finds a (zero) gradient for every parameter at every step
                touch = sum(p.sum() for p in self.memory.parameters()) * 0.0
                return (out[0] + touch.to(out[0].dtype), *out[1:])
            return out
        attn_output = out[0] + self.inner.resid_dropout(z.to(out[0].dtype))
        return (attn_output, *out[1:])


# ------------------------------------------------------------------------------------------------ backbone
# shapes of the pretrained checkpoints (their config.json); the vocabulary is the tokenizer's (+ special tokens)
PRETRAINED_SHAPES = {"gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}}


class GPT2WithMemory(nn.Module):
    """`GPT2LMHeadModel` + memory hook, with the repository's model interface:
    `forward(tokens_BT, mems, ..., types=None) -> (hidden_BTD, new_mems)`, `nll`, `logits`."""

    def __init__(self, settings: GPT2Settings, hook: MemoryHook, n_token: int):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.settings, self.hook = settings, hook
        drop = {"resid_pdrop": settings.dropout, "embd_pdrop": settings.dropout, "attn_pdrop": settings.dropout}
        if settings.pretrained:
            # the architecture of the checkpoint; its weights are copied in by `load_pretrained` (at fit start), so
            # that describing a config or testing a checkpoint needs no network. A local directory written by
            # `save_pretrained` works too (its config.json gives the shapes).
            local = Path(settings.pretrained) / "config.json"
            if settings.pretrained in PRETRAINED_SHAPES:
                shapes = PRETRAINED_SHAPES[settings.pretrained]
            elif local.exists():
                c = GPT2Config.from_json_file(str(local))
                shapes = {"n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "n_positions": c.n_positions}
            else:
                raise ValueError(f"pretrained model {settings.pretrained!r} unknown; known: "
                                 f"{sorted(PRETRAINED_SHAPES)} or a directory with a config.json")
            cfg = GPT2Config(vocab_size=n_token, **shapes, **drop)
        else:
            cfg = GPT2Config(vocab_size=n_token, n_positions=settings.n_positions, n_embd=settings.n_embd,
                             n_layer=settings.n_layer, n_head=settings.n_head, bos_token_id=None,
                             eos_token_id=None, **drop)  # GPT-2's 50256 is not in a small vocabulary
        self.lm = GPT2LMHeadModel(cfg)
        self.lm.config.use_cache = False
        cfg = self.lm.config
        self.d_model, self.n_layer = cfg.n_embd, cfg.n_layer
        self.n_positions = cfg.n_positions
        self._runtime = _Runtime()
        self.layers = tuple(range(self.n_layer)) if hook.layers is None else tuple(hook.layers)
        if hook.kind == "none":
            self.layers = ()
        bad = [l for l in self.layers if not 0 <= l < self.n_layer]
        if bad:
            raise ValueError(f"memory layers {bad} do not exist in a {self.n_layer}-layer GPT-2")
        self.memories = nn.ModuleDict()
        for l in self.layers:
            mem = build_layer_memory(hook, self.d_model, cfg.n_head, l)
            self.memories[str(l)] = mem
            block = self.lm.transformer.h[l]
            block.attn = MemoryAttention(block.attn, mem, l, self._runtime, ln=block.ln_1)
            block.register_forward_pre_hook(self._capture(l), with_kwargs=True)
        self.supports_memory = bool(self.layers)
        self._keys: dict[int, tuple[str, ...]] = {}

    @torch.no_grad()
    def load_pretrained(self) -> None:
        """Copy the pretrained checkpoint's weights in (hub download on first use). The rows of tokens added after
        its vocabulary (the dialogue's special tokens) keep their initialisation; the memories are new."""
        from transformers import GPT2LMHeadModel

        from repro.text.tokenizer import HUB_HELP, hub_offline

        name = self.settings.pretrained
        offline = not Path(name).is_dir() and hub_offline()  # fail at once, not after the hub's retries
        try:
            src = GPT2LMHeadModel.from_pretrained(name, local_files_only=offline).state_dict()
        except Exception as err:
            why = "the hub is unreachable and the cache lacks them" if offline else type(err).__name__
            raise ValueError(f"this config needs the pretrained {name!r} weights (model.safetensors or "
                             f"pytorch_model.bin) from the Hugging Face hub ({why}): {HUB_HELP}; or give "
                             "model.pretrained a directory written by save_pretrained") from err
        own = self.lm.state_dict()
        renamed = {}
        for key, value in src.items():
            ours = key.replace(".attn.", ".attn.inner.") if any(
                key.startswith(f"transformer.h.{l}.attn.") for l in self.layers) else key
            if ours not in own:
                continue
            if value.shape != own[ours].shape:  # the embedding / tied output rows: the base vocabulary only
                if value.shape[1:] != own[ours].shape[1:] or value.shape[0] > own[ours].shape[0]:
                    raise ValueError(f"{key}: checkpoint shape {tuple(value.shape)} does not fit "
                                     f"{tuple(own[ours].shape)}")
                own[ours][: value.shape[0]].copy_(value)
                continue
            renamed[ours] = value
        missing, unexpected = self.lm.load_state_dict(renamed, strict=False)
        left = [k for k in missing if ".memory." not in k and k not in ("transformer.wte.weight", "lm_head.weight")
                and not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")]
        if left or unexpected:
            raise ValueError(f"pretrained weights did not fit: missing {left[:5]}, unexpected {unexpected[:5]}")

    def _capture(self, layer: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self._runtime.inputs[layer] = x
        return hook

    # -------------------------------------------------------------------------------- flat memory lists
    def _flatten(self, states: dict[int, dict[str, torch.Tensor]], pending: dict[int, torch.Tensor]):
        flat = []
        for l in self.layers:
            keys = tuple(states[l])
            self._keys[l] = keys
            flat += [states[l][k].detach() for k in keys] + [pending[l].detach()]
        return flat

    def _unflatten(self, flat: list[torch.Tensor]):
        states, pending, i = {}, {}, 0
        for l in self.layers:
            keys = self._keys.get(l)
            if keys is None:  # restored from a checkpoint: the key order of a fresh state
                keys = tuple(self.memories[str(l)].init_state(1, "cpu", torch.float32))
                self._keys[l] = keys
            states[l] = dict(zip(keys, flat[i : i + len(keys)]))
            pending[l] = flat[i + len(keys)]
            i += len(keys) + 1
        if i != len(flat):
            raise ValueError(f"the memory holds {len(flat)} tensors, this model's layers expect {i}")
        return states, pending

    # --------------------------------------------------------------------------------------------- forward
    def forward(self, tokens_BT, mems=None, *, mem_len: int = 0, clamp_len: int = -1, same_length: bool = False,
                kv_memory: bool = False, types: torch.Tensor | None = None):
        """Hidden states after the final layer norm (B, T, D) and the memory to carry to the next block."""
        b, t = tokens_BT.shape
        if t > self.n_positions:
            raise ValueError(f"a block of {t} tokens exceeds GPT-2's {self.n_positions} positions")
        rt = self._runtime
        rt.states, rt.inputs = {}, {}
        dtype = self.lm.transformer.wte.weight.dtype
        if self.layers:
            if mems is None:
                states = {l: self.memories[str(l)].init_state(b, tokens_BT.device, dtype) for l in self.layers}
                pending = {l: torch.zeros(b, 0, self.d_model, device=tokens_BT.device, dtype=dtype)
                           for l in self.layers}
            else:
                states, pending = self._unflatten(mems)
            for l in self.layers:
                if pending[l].shape[1]:
                    states[l] = self.memories[str(l)].update(states[l], self._memory_input(l, pending[l]))
            rt.states = states
        out = self.lm.transformer(input_ids=tokens_BT, token_type_ids=types, use_cache=False)
        hidden = out.last_hidden_state
        new_mems = None
        if self.layers:
            new_mems = self._flatten(rt.states, {l: rt.inputs[l] for l in self.layers})
        rt.states = {}
        rt.inputs = {}
        return hidden, new_mems

    def _memory_input(self, layer: int, x_BLD: torch.Tensor) -> torch.Tensor:
        """What layer `layer`'s memory absorbs of its detached block inputs: themselves, or the block's ln_1 of them
        (with gradients into ln_1, as the official document-grounded `Block.forward`)."""
        if self.hook.stores == "ln_1":
            return self.lm.transformer.h[layer].ln_1(x_BLD)
        return x_BLD

    def absorb(self, mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        """The memory with its pending block absorbed (generation reuses it for every new token)."""
        if mems is None or not self.layers:
            return mems
        states, pending = self._unflatten(mems)
        for l in self.layers:
            if pending[l].shape[1]:
                states[l] = self.memories[str(l)].update(states[l], self._memory_input(l, pending[l]))
                pending[l] = pending[l][:, :0]
        return self._flatten(states, pending)

    def logits(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden_BTD)

    def nll(self, hidden_BTD: torch.Tensor, target_BT: torch.Tensor) -> torch.Tensor:
        """Per-token NLL in float32, 0 where the target is IGNORE (−100)."""
        logits = self.logits(hidden_BTD).float()
        return F.cross_entropy(logits.transpose(1, 2), target_BT, ignore_index=IGNORE, reduction="none")

    def extra_loss(self) -> torch.Tensor | None:
        losses = [l for m in self.memories.values() if (l := m.extra_loss()) is not None]
        return torch.stack([x.float() for x in losses]).sum() if losses else None


# ------------------------------------------------------------------------------------------ LightningModule
@dataclass(frozen=True)
class GenerationSettings:
    """Dialogue decoding at test time (PAPERS.md §2): nucleus sampling, scored with F1 / ROUGE / METEOR.

    The last four fields choose between our protocol and the official `eval.py`'s (the paper configs set the
    official one; README "Evaluation protocol (Table 2)")."""

    enabled: bool = False
    top_p: float = 0.9
    temperature: float = 1.0
    max_tokens: int = 50
    seed: int = 0
    meteor: bool = True  # requires WordNet; the run stops with instructions when it is missing
    output: str | None = None  # JSONL of the generated responses (also logged to MLflow)
    # "split": lower-case + white space, what nltk 3.6.4 did to the official raw strings; "treebank": ours
    meteor_tokens: Literal["split", "treebank"] = "split"
    # False: the official `sample_sequence` stops only at <bos>/<eos>/<doc>/<pad>; a drawn speaker token is kept,
    # generation goes on (into the next turn), and the speaker tokens are removed from the text
    stop_at_speaker: bool = True
    # True: the official reference is the response's tokens but the last (`torch.cat(labels).tolist()[:-1]`);
    # its data has no end marker there, so a real token (mostly the final punctuation) is dropped
    trim_reference: bool = False
    # False: the official sampling loop runs the last piece and the drawn tokens without token-type ids (only the
    # earlier, memory-filling pieces get them); True: every position gets its type, as in training
    types_while_sampling: bool = True
    # how the first token avoids the special tokens (`min_length = 1`): "ban" removes them from its distribution;
    # "redraw" is the official loop: draw again while special, at most 10 times, and keep a special token after
    # that or when the nucleus holds it alone (a kept speaker token is stripped from the text, another one ends
    # the response empty)
    first_special: Literal["ban", "redraw"] = "ban"

    def __post_init__(self):
        if self.first_special not in ("ban", "redraw"):
            raise ValueError(f"generation.first_special is 'ban' or 'redraw' (official), got {self.first_special!r}")
        if self.meteor_tokens not in ("split", "treebank"):
            raise ValueError(f"generation.meteor_tokens is 'split' (official) or 'treebank', "
                             f"got {self.meteor_tokens!r}")


class GPT2MemoryLM(SegmentLM):
    """GPT-2 fine-tuning (language modelling on ordered blocks, or grounded dialogue) with an optional memory.

    Batches are `repro.data.lm.Segment` (LM streams: the memory runs on across the whole split) or
    `repro.text.dialogue.DialogueChunk` (a conversation's pieces: the memory is reset at each conversation's first
    piece; targets of −100 are not scored; `types` are the official token-type ids).

    Args:
        model: `GPT2Settings`.
        memory_hook: `MemoryHook` (none | window | ltm | compressive, which layers, their arguments, λ_KL).
        optim: `FinetuneOptim`.
        generation: `GenerationSettings` (dialogue test runs only).
        n_token: vocabulary size, linked from the data module (the tokenizer with its special tokens).
    """

    def __init__(self, model: GPT2Settings | dict = GPT2Settings(), memory_hook: MemoryHook | dict = MemoryHook(),
                 optim: FinetuneOptim | dict = FinetuneOptim(),
                 generation: GenerationSettings | dict = GenerationSettings(), n_token: int = 0):
        if n_token <= 0:
            raise ValueError("n_token must come from the data (the tokenizer's size)")
        self.settings = coerce(GPT2Settings, model)
        hook = memory_hook
        if isinstance(hook, dict) and isinstance(hook.get("layers"), list):
            hook = {**hook, "layers": tuple(hook["layers"])}
        self.hook = coerce(MemoryHook, hook)
        self.finetune = coerce(FinetuneOptim, optim)
        self.generation = coerce(GenerationSettings, generation)
        super().__init__(n_token=n_token, memory=MemorySettings(), eval_memory=None,
                         optim=OptimConfig(lr=self.finetune.lr, schedule="constant"), eval_protocol=EvalProtocol())
        self.save_hyperparameters({"model": asdict(self.settings), "memory_hook": asdict(self.hook),
                                   "optim": asdict(self.finetune), "generation": asdict(self.generation),
                                   "n_token": n_token})
        self.generated: list[dict[str, Any]] = []
        # one optimiser step per conversation (the official dialogue loop): Lightning's automatic loop steps after
        # every batch and accumulates only fixed counts, so the steps are taken by hand (`training_step`)
        self.automatic_optimization = self.finetune.step_per == "piece"
        self._unstepped = False  # gradients of the current conversation's pieces wait for its step

    def build_model(self) -> GPT2WithMemory:
        return GPT2WithMemory(self.settings, self.hook, self.n_token)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # fine-tuning starts from the pretrained weights (a checkpoint being resumed overwrites them afterwards)
        if stage == "fit" and self.settings.pretrained:
            self.model.load_pretrained()

    # ------------------------------------------------------------------------------------------------- steps
    def _run(self, split: str, batch):
        if getattr(batch, "reset", False):
            self._mems[split] = None
        hidden, self._mems[split] = self.model(batch.input, self._mems[split], types=getattr(batch, "types", None))
        nll = self.model.nll(hidden, batch.target)
        return nll, batch.target != IGNORE

    def on_train_start(self) -> None:
        if not self.automatic_optimization:
            if self.trainer.world_size > 1:
                raise ValueError("optim.step_per: conversation runs in one process (the official batch is one "
                                 "conversation; ranks would step at different pieces): use step_per: piece under DDP")
            if self.trainer.gradient_clip_val:
                raise ValueError("optim.step_per: conversation clips by itself: unset trainer.gradient_clip_val and "
                                 "set optim.clip")

    def _conversation_step(self) -> None:
        """The step after a conversation's pieces (official `update`: `optimizer.step(); optimizer.zero_grad()`),
        then the schedule, which counts conversations (the official `PiecewiseLinear` over iterations)."""
        opt = self.optimizers()
        opt.step()
        opt.zero_grad()
        self.lr_schedulers().step()
        self._unstepped = False

    def training_step(self, batch, batch_idx):
        if not self.automatic_optimization:
            if not hasattr(batch, "reset"):
                raise ValueError("optim.step_per: conversation needs dialogue batches (repro.text.dialogue); "
                                 "language-modelling streams use step_per: piece")
            if batch.reset and self._unstepped:  # a new conversation: the previous one is complete
                self._conversation_step()
        nll, mask = self._run("train", batch)
        n = mask.sum()
        loss = nll.sum() / n.clamp(min=1)
        total = loss
        aux = self.model.extra_loss()
        if aux is not None:
            total = loss + aux
            self.log("train/aux_loss", aux.detach())
        self.tokens_seen += n * self.trainer.world_size
        self.train_batches += 1
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log("train/ppl", torch.exp(loss.detach()))
        self.log("train/bpc", loss.detach() / math.log(2))
        if self.automatic_optimization:
            return total
        opt = self.optimizers()
        self.manual_backward(total)
        if self.finetune.clip:  # the accumulated gradient, after every piece (official `clip_grad_norm_` per piece)
            self.clip_gradients(opt, gradient_clip_val=self.finetune.clip, gradient_clip_algorithm="norm")
        self._unstepped = True
        return None

    def on_train_epoch_end(self) -> None:
        if not self.automatic_optimization and self._unstepped:  # the epoch's last conversation
            self._conversation_step()

    def _eval_step(self, split: str, batch) -> None:
        nll, mask = self._run(split, batch)
        self.nll_metrics[split].update(nll[mask])
        if split == "test" and hasattr(batch, "reset"):
            # the official test perplexity's average as well (conversations weighted by their label positions;
            # `repro.metrics.text.ConversationNLL`), logged by `on_test_epoch_end` beside our per-token one
            from repro.metrics.text import ConversationNLL

            acc = self.__dict__.get("_conversation_nll")
            if acc is None:
                dm = getattr(self.trainer, "datamodule", None)
                acc = self.__dict__["_conversation_nll"] = ConversationNLL(
                    getattr(dm, "block_size", None) or self.settings.n_positions)
            if batch.reset:
                acc.close()
            acc.add(nll_sum=float(nll[mask].double().sum()), scored=int(mask.sum()), positions=batch.target.numel())

    def configure_optimizers(self):
        o = self.finetune
        opt = torch.optim.AdamW(self.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        max_steps = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 0
        if o.schedule == "linear" and max_steps <= 0:
            raise ValueError("the linear schedule decays over trainer.max_steps: set --trainer.max_steps")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: o.factor(s, max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -------------------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def respond(self, context: list[int], types: list[int], *, stop: set[int], generator: torch.Generator,
                block: int, responder_type: int, banned: set[int] | None = None) -> list[int]:
        """Nucleus-sample a response after `context` (ours ends with the responder's speaker token).

        As the official `sample_sequence`: the context is cut from the end into pieces, the last one leaving room
        for `max_tokens` new tokens; the earlier pieces go through the model in order to fill its memory (skipped
        for a model without memory: they cannot affect it), then each new token is drawn from the model run on
        the last piece plus the tokens drawn so far, with the memory as it was after the earlier pieces.
        Generation ends at a token of `stop` (not kept) or after `max_tokens`; the first token avoids `banned`
        (default: `stop`) as `generation.first_special` says (the official `min_length = 1` re-draws). Without
        `generation.types_while_sampling` the last piece and the drawn tokens get no token-type ids (official)."""
        from repro.generate_text import SamplingSettings, nucleus_mask, sample_token
        from repro.text.dialogue import pieces_from_end

        g = self.generation
        settings = SamplingSettings(top_p=g.top_p, temperature=g.temperature, max_tokens=g.max_tokens)
        dev = self.device
        ids = torch.tensor(context, dtype=torch.long, device=dev)
        typ = torch.tensor(types, dtype=torch.long, device=dev)
        spans = pieces_from_end(len(context), block, last=max(1, block - g.max_tokens - 1))
        mems = None
        if self.model.supports_memory:
            # sticky memories draw their sample points from torch's global generator: seed it from `generator`
            # for this response only, so that a response depends on its seed alone
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
                for a, b in spans[:-1]:
                    _, mems = self.model(ids[None, a:b], mems, types=typ[None, a:b])
                mems = self.model.absorb(mems)  # refit once, not at every drawn token
        a, b = spans[-1]

        def next_logits(generated: list[int]) -> torch.Tensor:
            extra = torch.tensor(generated, dtype=torch.long, device=dev)
            inp = torch.cat([ids[a:b], extra])[None]
            tt = None
            if g.types_while_sampling:
                tt = torch.cat([typ[a:b], torch.full_like(extra, responder_type)])[None]
            hidden, _ = self.model(inp, mems, types=tt)
            return self.model.logits(hidden[0, -1]).float()

        first_banned = stop if banned is None else banned
        out: list[int] = []
        for step in range(g.max_tokens):
            logits = next_logits(out)
            if step == 0 and g.first_special == "redraw":
                token = sample_token(logits, settings, generator)
                alone = int(nucleus_mask(logits.float() / g.temperature, g.top_p).sum()) == 1  # probs.max() == 1
                redraws = 0
                while token in first_banned and not alone and redraws < 10:
                    token = sample_token(logits, settings, generator)
                    redraws += 1
            else:
                token = sample_token(logits, settings, generator, banned=first_banned if step == 0 else ())
            if token in stop:
                break
            out.append(token)
        return out

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        acc = self.__dict__.pop("_conversation_nll", None)
        if acc is not None:
            import torch.distributed as dist

            totals = torch.tensor(acc.totals(), dtype=torch.float64, device=self.device)
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(totals)  # Σ n_c·mean_c, Σ n_c, conversations over ranks
            if totals[1] > 0:
                nll = float(totals[0] / totals[1])
                self.log("test/nll_official", nll, sync_dist=False)
                self.log("test/ppl_official", math.exp(nll), sync_dist=False)
        if self.generation.enabled:
            self._generate_and_score()

    def _generate_and_score(self) -> None:
        import json

        import torch.distributed as dist

        from repro.metrics.text import corpus_scores, wordnet

        dm = self.trainer.datamodule
        if not hasattr(dm, "response_examples"):
            raise ValueError("generation.enabled needs a dialogue data module (repro.text.dialogue)")
        if self.generation.meteor:
            wordnet()  # stops here, with instructions, before any sampling when WordNet is missing
        tok = dm.tokenizer
        examples = dm.response_examples("test")
        rank, world = self.trainer.global_rank, self.trainer.world_size
        g = self.generation
        special = {tok.id(t) for t in ("<bos>", "<eos>", "<doc>", "<speaker1>", "<speaker2>", "<pad>")}
        speakers = {tok.id("<speaker1>"), tok.id("<speaker2>")}
        # the official `sample_sequence` breaks on a special token other than the two speakers
        stop = special if g.stop_at_speaker else special - speakers
        rows = []
        for k in range(rank, len(examples), world):
            ex = examples[k]
            gen = torch.Generator().manual_seed(g.seed * 1_000_003 + k)  # per example: DDP-invariant
            out = self.respond(ex.context, ex.context_types, stop=stop, banned=special, generator=gen,
                               block=dm.block_size, responder_type=ex.context_types[-1])
            # the official text drops the speaker tokens (`.replace('<speaker1>', '')...`)
            prediction = tok.decode([t for t in out if t not in speakers])
            reference = tok.decode(tok.encode(ex.reference)[:-1]) if g.trim_reference else ex.reference
            rows.append({"index": k, "conversation": ex.conversation, "turn": ex.turn,
                         "prediction": prediction, "reference": reference})
        if world > 1 and dist.is_available() and dist.is_initialized():
            parts: list = [None] * world
            dist.all_gather_object(parts, rows)
            rows = sorted((r for p in parts for r in p), key=lambda r: r["index"])
        self.generated = rows
        scores = corpus_scores([r["prediction"] for r in rows], [r["reference"] for r in rows],
                               with_meteor=g.meteor, meteor_tokens=g.meteor_tokens)
        for name, value in scores.items():
            self.log(f"test/{name}", float(value), sync_dist=False)
        self.log("test/responses", float(len(rows)), sync_dist=False)
        if rank == 0 and self.generation.output:
            from repro.io import atomic_write_text

            atomic_write_text(self.generation.output, "".join(json.dumps(r) + "\n" for r in rows))
            lg = self.logger
            if lg is not None and hasattr(lg, "run_id") and hasattr(lg.experiment, "log_artifact"):
                lg.experiment.log_artifact(lg.run_id, self.generation.output)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(memory=self.hook.kind, memory_layers=list(self.model.layers),
                   pretrained=self.settings.pretrained)
        return out
