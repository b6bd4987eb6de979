"""The memory hook of the ∞-former's GPT-2 experiments: the contract a layer's memory implements, and the wrapper
that adds a memory to GPT-2's self-attention.

Follows the official GPT-2 code of deep-spin/infinite-former (`finetune_gpt2` and `document_grounded_generation`,
`modeling_gpt2.py`: `Block.forward` keeps `self.mem`, `Attention.forward` adds the long-term attention's output to
`c_proj(a)`), where the long-term memory is written into GPT-2's own `Attention` and `Block` classes. Here it is a
hook around `transformers`' unmodified `GPT2Attention` (`MemoryAttention`), so any memory that keeps the contract
below can be plugged in; the LTM and compressive adapters are in `papers/infinity_former/adapters.py`, the model
that installs the hook (`GPT2WithMemory`) and its LightningModule in `papers/infinity_former/gpt2.py`. Unlike the
official attention, which applied one dropout to `c_proj(a) + Z`, GPT-2's own attention output is dropped out
inside `transformers` and `Z` gets its own dropout mask (same rate).

The memory hook (`MemoryHook`, `LayerMemory`)
-------------------------------------------
Every configured layer gets a `LayerMemory` module. Its contract, which the LTM (`papers/infinity_former/ltm.py`)
and the compressive memory (`papers/infinity_former/compressive.py`) implement through small adapters
(`build_layer_memory`), is:

- `empty(batch, like) -> dict[str, Tensor]`: an empty memory on `like`'s device (and dtype); every tensor is
  batch-first (the state is carried between blocks, sliced per DDP rank and saved in checkpoints);
- `write(state, x_BLD) -> state`: absorb `x`, what entered this layer during the previous block, detached, as
  the official `Block.mem`; which vector that is, is `MemoryHook.stores`: `block_input` (the block input before
  `ln_1`: the official language-modelling code, `finetune_gpt2` `Block.forward`, `self.mem = hidden_states.detach()`)
  or `ln_1` (the official document-grounded code, `document_grounded_generation` `Block.forward`,
  `self.mem = self.ln_1(hidden_states.detach())`: ln_1 of the detached input, so ln_1's gain and bias also learn
  through the memory; we apply the block's ln_1 to the detached input when the memory absorbs it, at the start of
  the next block — the same weights when the optimiser steps once per conversation, as the official does).
  It is called at the start of the next block's forward pass, with gradients on, so the memory's own parameters
  (e.g. the LTM's smoothing gate) learn from the loss of the block that reads it, as in the official code where
  the LTM refits its coefficients inside `LongTermAttention.forward`;
- `read(q_BHTd, state) -> Z_BTD | None`: the memory's contribution for the queries of this layer's
  self-attention (GPT-2's own query projection, split into heads); `None` when the memory is empty. `Z` is added
  to the self-attention output after its output projection, before the residual connection (the official
  `Attention.forward` adds `a_long_term` to `c_proj(a)`). GPT-2's residual dropout is applied to `Z` as well;
- `read` may replace entries of `state` (the sticky-memory histogram of this step's attention): the state
  carried to the next block is the one left after the forward pass;
- `aux_losses() -> dict[str, Tensor]`: the weighted auxiliary losses of the last `read` or `write` (the LTM's
  λ_KL · KL, the compressive memory's reconstruction), added to the NLL.

These are the names of the backbone's memory interface (`repro.memory.MemoryMechanism`: `empty`, `read`, `write`,
`aux_losses`), called per layer with GPT-2's queries and block inputs; both backbones' long-term memories are the
same `ContinuousLTM`.

After each block the carried state is detached (truncated back-propagation, PAPERS.md §5).

`kind: window` is a trivial memory of ours used to test the hook and as a sanity baseline: ordinary softmax
attention over the last `mem_len` block inputs with its own key/value/output projections (output projection
initialised to zero, so that a pretrained GPT-2 starts unchanged). `kind: none` is plain GPT-2 (the "GPT-2" and
"GPT-2 w/o doc" rows: each 512-token block sees nothing of the previous ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn


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


# ---------------------------------------------------------------------------------------------- the hook
class LayerMemory(nn.Module):
    """The contract of a layer's memory (see the module docstring)."""

    def empty(self, batch: int, like: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def write(self, state: dict[str, torch.Tensor], x_BLD: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def read(self, q_BHTd: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor | None:
        raise NotImplementedError

    def aux_losses(self) -> dict[str, torch.Tensor]:
        return {}


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

    def empty(self, batch, like):
        return {"x": like.new_zeros(batch, 0, self.d_model)}

    def write(self, state, x_BLD):
        return {"x": torch.cat([state["x"], x_BLD], dim=1)[:, -self.mem_len :]}

    def read(self, q_BHTd, state):
        x = state["x"]
        if x.shape[1] == 0:
            return None
        b, h, t, d = q_BHTd.shape
        k, v = self.kv(x.to(q_BHTd.dtype)).view(b, -1, 2, h, d).permute(2, 0, 3, 1, 4)  # 2 × (B, H, M, d)
        att = torch.softmax(q_BHTd @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        z = (att @ v).transpose(1, 2).reshape(b, t, h * d)
        return self.out(z)


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
        z = self.memory.read(q, state)
        if z is None:
            if self.training and torch.is_grad_enabled():
                # an empty memory (a stream's or conversation's first block) still touches its parameters with a
                # zero, so that DDP finds a (zero) gradient for every parameter at every step
                touch = sum(p.sum() for p in self.memory.parameters()) * 0.0
                return (out[0] + touch.to(out[0].dtype), *out[1:])
            return out
        attn_output = out[0] + self.inner.resid_dropout(z.to(out[0].dtype))
        return (attn_output, *out[1:])
