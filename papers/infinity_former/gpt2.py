"""GPT-2 with a memory of the text that left its 512-token window: the ∞-former's GPT-2 experiments (paper §4.2-4.3).

The paper fine-tunes GPT-2 small on 512-token blocks fed in order (batch 1), and adds to each layer (or the
configured layers) a long-term memory (LTM) that attends from the layer's queries to the hidden states that
entered the layer during the previous blocks. This module builds that model around `transformers`'
`GPT2LMHeadModel`, the same code path for both profiles:

- paper profile: `GPT2Settings(pretrained="gpt2")` loads the pretrained weights (hub; needs network once);
- tiny profile: `GPT2Settings(pretrained=None, n_layer=.., n_embd=.., n_head=..)` builds a random `GPT2Config`
  whose vocabulary is the locally trained BPE's (`repro.text.tokenizer`).

The model is assembled from four files:
- `papers/infinity_former/hooks.py`: the memory hook's contract (`MemoryHook`, `LayerMemory`), the wrapper of
  GPT-2's self-attention that adds a memory (`MemoryAttention`), and the trivial `WindowMemory`;
- `papers/infinity_former/adapters.py`: the ∞-former's long-term memory and the compressive baseline behind the
  hook, and `build_layer_memory`;
- `papers/infinity_former/dialogue_generation.py`: response generation and scores for the dialogue test;
- this file: the GPT-2 backbone with the hook installed (`GPT2WithMemory`: every configured layer's attention
  wrapped, each layer's block input captured and absorbed by its memory at the start of the next block), the
  fine-tuning optimiser (`FinetuneOptim`) and the LightningModule (`GPT2MemoryLM`).

Deviations from the official code (deep-spin/infinite-former `finetune_gpt2`, `document_grounded_generation`):
- targets are the inputs shifted by one across block boundaries, so the first token of every block is
  predicted from the block before; the official `run_clm` / `DoGDataset` score each block on its own;
- the official GPT-2 attention applied one dropout to `c_proj(a) + Z`; here GPT-2's own attention output is
  dropped out inside `transformers` and `Z` gets its own dropout mask (same rate).

Official details matched through settings (the paper configs set them; see README "GPT-2 parity"): σ² ≥ 1e-4
(`ltm.min_var`), what the memory stores (`memory_hook.stores`), the language-modelling code's μ term of the KL
(`ltm.mu_0` = −1), N(0, 0.02) for the LTM's linear maps (`ltm.init_std`), for language modelling the memory's own
learning rate (`optim.lr_memory` 2.5e-4) and a linear decay over one epoch (`trainer.max_epochs: 1`, no
`max_steps`), and for dialogue one optimiser step per conversation after back-propagating and clipping each piece
(`optim.step_per: conversation`, `optim.clip`) with `transformers.AdamW`'s ε 1e-6 (`optim.eps`).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from papers.infinity_former.adapters import build_layer_memory
from papers.infinity_former.dialogue_generation import GenerationSettings, generate_and_score, respond
from papers.infinity_former.hooks import MemoryAttention, MemoryHook, _Runtime
from repro.data.hf_hub import HUB_HELP, hub_offline
from repro.lm import EvalProtocol, MemorySettings, OptimConfig, SegmentLM, coerce
from repro.metrics.text import ConversationNLL

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
class FinetuneOptim:
    """AdamW with a linear decay to 0 over the run's optimiser steps: `trainer.max_steps`, or where that is unset
    (−1) the `trainer.max_epochs` epochs of the training data (the official language-modelling fine-tuning: lr
    5e-5 over one epoch). `lr_memory` gives the memory's parameters (the LTM's, or the compressive memory's) that
    rate, as the official `run_clm.py` Trainer does (`learning_rate_ltm`, default 2.5e-4; its dialogue `train.py`
    keeps one rate: `--lr_ltm 0`). None: `lr`. `weight_decay` applies, as in that Trainer, to GPT-2's weights only:
    not to biases, LayerNorm parameters or the memory's parameters.

    `step_per: conversation` reproduces the official dialogue loop (`document_grounded_generation/train.py`,
    `update`): each piece of a conversation is back-propagated (its mean NLL + λ_KL·KL, not divided by the number
    of pieces) and the accumulated gradient clipped to norm `clip` after every piece, and the optimiser (and the
    schedule) steps once per conversation. It needs dialogue batches and one process (the official batch is one
    conversation); `trainer.gradient_clip_val` must then be unset (`clip` replaces it) and `trainer.max_steps`
    counts conversations. `step_per: piece` steps after every batch (Lightning's loop, `trainer.gradient_clip_val`)."""

    lr: float = 5e-5
    lr_memory: float | None = None
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
        if self.lr_memory is not None and self.lr_memory < 0:
            raise ValueError(f"optim.lr_memory must be >= 0 (or null: optim.lr), got {self.lr_memory}")
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


# ------------------------------------------------------------------------------------------------ backbone
# shapes of the pretrained checkpoints (their config.json); the vocabulary is the tokenizer's (+ special tokens)
PRETRAINED_SHAPES = {"gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}}


class GPT2WithMemory(nn.Module):
    """`GPT2LMHeadModel` + memory hook, with the repository's model interface:
    `forward(tokens_BT, mems, ..., types=None) -> (hidden_BTD, new_mems)`, `nll`, `logits`."""

    def __init__(self, settings: GPT2Settings, hook: MemoryHook, n_token: int):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel  # heavy: transformers

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
        from transformers import GPT2LMHeadModel  # heavy: transformers

        name = self.settings.pretrained
        offline = not Path(name).is_dir() and hub_offline()  # fail at once, not after the hub's retries
        if not os.environ.get("REPRO_VERBOSE"):  # transformers' "Loading weights" bar: two lines per run in the logs
            from transformers.utils import logging as hf_logging  # heavy: transformers

            hf_logging.disable_progress_bar()
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
                keys = tuple(self.memories[str(l)].empty(1, torch.empty(0)))
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
                states = {l: self.memories[str(l)].empty(b, torch.empty(0, device=tokens_BT.device, dtype=dtype))
                          for l in self.layers}
                pending = {l: torch.zeros(b, 0, self.d_model, device=tokens_BT.device, dtype=dtype)
                           for l in self.layers}
            else:
                states, pending = self._unflatten(mems)
            for l in self.layers:
                if pending[l].shape[1]:
                    states[l] = self.memories[str(l)].write(states[l], self._memory_input(l, pending[l]))
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

    def forget(self, mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        """The memory emptied of what it absorbed, its pending block kept (the next `absorb` or block fits only
        that block): the official dialogue sampling's `new_doc` at its first drawn token (`dialogue_generation`)."""
        if mems is None or not self.layers:
            return mems
        states, pending = self._unflatten(mems)
        for l in self.layers:
            p = pending[l]
            states[l] = self.memories[str(l)].empty(p.shape[0], p)
        return self._flatten(states, pending)

    def absorb(self, mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        """The memory with its pending block absorbed (generation reuses it for every new token)."""
        if mems is None or not self.layers:
            return mems
        states, pending = self._unflatten(mems)
        for l in self.layers:
            if pending[l].shape[1]:
                states[l] = self.memories[str(l)].write(states[l], self._memory_input(l, pending[l]))
                pending[l] = pending[l][:, :0]
        return self._flatten(states, pending)

    def logits(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden_BTD)

    def nll(self, hidden_BTD: torch.Tensor, target_BT: torch.Tensor) -> torch.Tensor:
        """Per-token NLL in float32, 0 where the target is IGNORE (−100). The vocabulary is the last, contiguous
        dimension of the softmax: over `logits.transpose(1, 2)` (B, V, T) both devices take a strided kernel, on
        an H200 57 ms forward + 27 ms backward per 512-token block of GPT-2's 50,257 words (against ≈ 1 ms), on 2
        CPU cores 340 ms against 102 (`repro bench-infinity-former-authors --model gpt2_lm`)."""
        logits = self.logits(hidden_BTD).float()
        nll = F.cross_entropy(logits.flatten(0, 1), target_BT.flatten(), ignore_index=IGNORE, reduction="none")
        return nll.view(target_BT.shape)

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """The layers' memories' weighted auxiliary losses of the last forward pass, each summed over the layers."""
        by_name: dict[str, list[torch.Tensor]] = {}
        for m in self.memories.values():
            for name, loss in m.aux_losses().items():
                by_name.setdefault(name, []).append(loss.float())
        return {name: torch.stack(losses).sum() for name, losses in by_name.items()}


# ------------------------------------------------------------------------------------------ LightningModule
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
        losses = self.model.aux_losses()
        aux = sum(losses.values()) if losses else None
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
        # The official run_clm Trainer's groups: weight decay on GPT-2's weights only (not on biases or LayerNorm
        # parameters), none on the memory's parameters, which take `learning_rate_ltm` (lr_memory; None: lr). Its
        # dialogue train.py decays nothing (transformers' AdamW, weight_decay 0). Without weight decay the groups
        # stay as few as the rates need: the parameters' order is that of the gradient clip's norm, so the runs
        # made before this split keep their numbers bit for bit.
        params = list(self.parameters())
        memory = {id(p) for m in self.model.modules() if isinstance(m, MemoryAttention) for p in m.memory.parameters()}
        rest = [p for p in params if id(p) not in memory]
        if o.weight_decay > 0:
            no_decay = {id(p) for m in self.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
            no_decay |= {id(p) for n, p in self.named_parameters() if "bias" in n}
            groups = [{"params": [p for p in rest if id(p) not in no_decay]},
                      {"params": [p for p in rest if id(p) in no_decay], "weight_decay": 0.0}]
        else:
            groups = [{"params": rest if o.lr_memory is not None else params}]
        if o.weight_decay > 0 or o.lr_memory is not None:
            groups.append({"params": [p for p in params if id(p) in memory], "weight_decay": 0.0,
                           "lr": o.lr if o.lr_memory is None else o.lr_memory})
        groups = [g for g in groups if g["params"]]
        opt = torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                foreach=True)  # the same numbers as the per-parameter loop, fewer ops
        max_steps = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 0
        if max_steps <= 0 and o.schedule == "linear":
            if not self.automatic_optimization:  # one step per conversation: Lightning counts pieces, not those
                raise ValueError("optim.step_per: conversation decays over trainer.max_steps (conversations): "
                                 "set --trainer.max_steps")
            # one epoch (or max_epochs) of the training data, as the official Trainer's horizon
            total = self.trainer.estimated_stepping_batches
            if not math.isfinite(total) or total <= 0:
                raise ValueError("the linear schedule decays over the run's steps: set --trainer.max_steps or "
                                 "--trainer.max_epochs")
            max_steps = int(total)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: o.factor(s, max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -------------------------------------------------------------------------------------------- generation
    def respond(self, context: list[int], types: list[int], *, stop: set[int], generator: torch.Generator,
                block: int, responder_type: int, banned: set[int] | None = None) -> list[int]:
        """Nucleus-sample a response after `context` (`papers.infinity_former.dialogue_generation.respond`)."""
        return respond(self, context, types, stop=stop, generator=generator, block=block,
                       responder_type=responder_type, banned=banned)

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        acc = self.__dict__.pop("_conversation_nll", None)
        if acc is not None:
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
        """Sample and score every test response (`papers.infinity_former.dialogue_generation.generate_and_score`)."""
        generate_and_score(self)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(memory=self.hook.kind, memory_layers=list(self.model.layers),
                   pretrained=self.settings.pretrained)
        return out
