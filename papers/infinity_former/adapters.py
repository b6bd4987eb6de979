"""The ∞-former's long-term memory and the compressive baseline behind GPT-2's memory hook, and `build_layer_memory`.

Each adapter implements the `LayerMemory` contract of `papers/infinity_former/hooks.py` around a memory written
for the sorting task: the LTM (`papers/infinity_former/ltm.py`, `ContinuousLTM`; official deep-spin/infinite-former
`LongTermAttention` in `finetune_gpt2` / `document_grounded_generation`, `long_term_attention.py`) and the
compressive memory (`papers/infinity_former/compressive.py`, Rae et al. 2019; the official repository has no code
for it). `build_layer_memory(hook, ...)` picks the memory of `memory_hook.kind` (window, ltm, compressive) for one
layer. How each differs from the official code is said below and in the classes.

`kind: ltm` is the ∞-former's continuous memory (`papers/infinity_former/ltm.py`, `ContinuousLTM`) through
`LTMLayerMemory`: the state is the signal's coefficients B (B, N, D), the sticky histogram and the number of
tokens absorbed; the memory is emptied once it has absorbed `threshold` tokens (the official GPT-2 code's
`mem_threshold` = 2048 for language modelling) and at the start of each conversation (dialogue).
`kind: compressive` is the compressive-transformer baseline (below), `CompressiveLayerMemory`.

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
  times `recon_weight`, summed over layers (`aux_losses`). The slots entering the memory are detached, so the LM
  loss does not train the Conv1d; it trains the positional bias. On a step where nothing was compressed the loss
  is a zero that touches every memory parameter (DDP).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.compressive import Compression, CompressiveConfig, reconstruction_error
from papers.infinity_former.hooks import LayerMemory, MemoryHook, WindowMemory
from papers.infinity_former.ltm import ContinuousLTM, LTMConfig, attention_histogram, kl_regulariser


class LTMLayerMemory(LayerMemory):
    """The ∞-former's continuous long-term memory (`ContinuousLTM`) behind the hook.

    Args (from `memory_hook.args`): `ltm` (an `LTMConfig` dict: N, widths, ridge, τ, samples, sticky, bins, σ₀,
    μ₀, λ_KL, gate, σ² floor, init std), `threshold` (tokens absorbed before the memory is emptied; None: never)."""

    def __init__(self, d_model: int, n_head: int, ltm: dict | None = None, threshold: int | None = None):
        super().__init__()

        args = dict(ltm or {})
        if isinstance(args.get("widths"), list):
            args["widths"] = tuple(args["widths"])
        self.cfg = LTMConfig(**args)
        if threshold is not None and threshold <= 0:
            raise ValueError(f"the LTM threshold must be positive or null, got {threshold}")
        self.threshold, self.d_model = threshold, d_model
        self.ltm = ContinuousLTM(d_model=d_model, n_head=n_head, d_head=d_model // n_head, cfg=self.cfg)
        self._loss: torch.Tensor | None = None

    def empty(self, batch, like):
        return {"coef": torch.zeros(batch, 0, self.d_model, device=like.device),
                "hist": torch.zeros(batch, 0, device=like.device),
                "count": torch.zeros(batch, dtype=torch.long, device=like.device)}

    def write(self, state, x_BLD):
        if self.threshold is not None and bool((state["count"] >= self.threshold).any()):
            state = self.empty(x_BLD.shape[0], x_BLD)  # the official memory threshold
        coef = state["coef"] if state["coef"].shape[1] else None
        hist = state["hist"] if state["hist"].shape[-1] else None
        coef, _ = self.ltm.update(coef, x_BLD, hist_BK=hist)  # refit (§3.2), sticky sample points (§3.3)
        return {"coef": coef, "hist": state["hist"], "count": state["count"] + x_BLD.shape[1]}

    def read(self, q_BHTd, state):
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

    def aux_losses(self):
        return {"ltm_kl": self._loss} if self._loss is not None else {}


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

    def empty(self, batch, like):
        return {"cmem": like.new_zeros(batch, 0, self.d_model), "rest": like.new_zeros(batch, 0, self.d_model)}

    def write(self, state, x_BLD):
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

    def read(self, q_BHTd, state):
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
        b, nh, t, hd = q_BHTd.shape

        def keys_values(m_BND):
            k, v = self._kv(inner, ln, m_BND, detach=True)
            return tuple(x.reshape(b, m_BND.shape[1], nh, hd).transpose(1, 2) for x in (k, v))

        return reconstruction_error(q_BHTd.detach() * inner.scaling, keys_values, old_BOD, new_BCD)

    def aux_losses(self):
        return {"attn_recon": self._loss} if self._loss is not None else {}


def build_layer_memory(hook: MemoryHook, d_model: int, n_head: int, layer: int) -> LayerMemory:
    if hook.kind == "window":
        return WindowMemory(d_model, n_head, **hook.args)
    if hook.kind == "ltm":
        return LTMLayerMemory(d_model, n_head, **hook.args)
    if hook.kind == "compressive":
        return CompressiveLayerMemory(d_model, n_head, **hook.args)
    raise ValueError(f"no layer memory for kind {hook.kind!r}")
