"""The LightningModule shared by every segment-recurrent language model of the repository.

A paper's module subclasses `SegmentLM` and builds its `nn.Module` in `build_model`; the model must provide
`forward(tokens_BT, mems, *, mem_len, clamp_len, same_length) -> (hidden_BTD, new_mems)`, `nll(hidden, target)`
and a `supports_memory` flag. Everything else is written here once:

- one detached memory per split, reset at the start of each pass over a split (Lightning 2 has no truncated
  BPTT), carried across segments, saved in checkpoints and restored on resume (re-sharded when the number of
  DDP ranks changes, since each rank holds a contiguous slice of the streams);
- token-weighted NLL sums synced across ranks (`repro.metrics.TokenNLL`) → loss, ppl and bpc;
- two evaluation protocols: `memory` (the Transformer-XL protocol, segments with carried memory under the
  evaluation lengths) and `sliding` (the vanilla model of Al-Rfou et al.: every token predicted from a fresh
  window of the `window` tokens that end at its input, or of all tokens so far near the start of a stream);
- the reference optimiser: Adam, linear warm-up, cosine decay to `eta_min` over `trainer.max_steps`
  (gradient clipping at 0.25 is the Trainer's `gradient_clip_val`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import lightning as L
import torch
import torch.distributed as dist

from repro.config import coerce
from repro.metrics import TokenNLL, scored


@dataclass(frozen=True)
class MemorySettings:
    """How much memory a forward pass keeps and sees."""

    mem_len: int = 0  # memory kept per layer
    clamp_len: int = -1  # relative distances beyond this use the embedding of clamp_len; -1: no clamp
    same_length: bool = False  # every query sees the same number of keys (evaluation)

    def __post_init__(self):
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be ≥ 0, got {self.mem_len}")
        if self.clamp_len == 0 or self.clamp_len < -1:
            raise ValueError(f"clamp_len is -1 (off) or positive, got {self.clamp_len}")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2.5e-4
    warmup_steps: int = 0
    schedule: Literal["cosine", "constant"] = "cosine"
    eta_min: float = 0.0  # the cosine's floor, as a learning rate (the reference's `eta_min`)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0

    def factor(self, step: int, max_steps: int) -> float:
        """Learning-rate multiplier for optimiser update `step` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = min(step, max_steps) / max(1, max_steps)
        floor = self.eta_min / self.lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class EvalProtocol:
    kind: Literal["memory", "sliding"] = "memory"
    window: int = 0  # sliding: tokens of context per prediction (the attention length)
    # sliding: tokens scored per window, from its end (1 = the paper's protocol, every token from its own window;
    # s > 1 costs s times less and gives the first tokens of each block w − s + 1 … w tokens of context)
    stride: int = 1
    window_batch: int = 256  # sliding: windows per forward pass

    def __post_init__(self):
        if self.kind not in ("memory", "sliding"):
            raise ValueError(f"eval protocol is 'memory' or 'sliding', got {self.kind!r}")
        if self.kind == "sliding" and self.window <= 0:
            raise ValueError("the sliding protocol needs a positive window (its attention length)")
        if not 1 <= self.stride <= max(1, self.window):
            raise ValueError(f"the sliding stride must lie in [1, window], got {self.stride}")


# Adam's multi-tensor (`foreach`) update makes a temporary of every parameter it updates at once (√v̂, the
# denominator): One Billion Word large's 841M parameters took 3.4 GB more for it, beside 13.5 GB of weights,
# gradients and moments. Updated in groups of at most this many bytes, the temporary stays that small;
# the update of each element is the same, so are the numbers, bit for bit; a model below it keeps one group.
FOREACH_GROUP_BYTES = 256 << 20


def bounded_groups(params, max_bytes: int) -> list[dict] | list[torch.nn.Parameter]:
    """The parameters in their order, as optimiser groups of at most `max_bytes` each (a larger parameter alone in
    its group); the plain list when they fit in one, so that a small model's optimiser state keeps its one group
    (and its checkpoints load as before). The order, which the gradient clip's norm sums in, is kept."""
    params = list(params)
    groups: list[list] = [[]]
    size = 0
    for p in params:
        n = p.numel() * p.element_size()
        if groups[-1] and size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += n
    return params if len(groups) == 1 else [{"params": g} for g in groups]


class SegmentLM(L.LightningModule):
    """Base module; subclasses implement `build_model()` and may extend `extra_loss`."""

    def __init__(
        self,
        *,
        n_token: int,
        memory: MemorySettings | dict,
        eval_memory: MemorySettings | dict | None,
        optim: OptimConfig | dict,
        eval_protocol: EvalProtocol | dict,
    ):
        super().__init__()
        self.n_token = n_token
        self.memory = coerce(MemorySettings, memory)
        self.eval_memory = coerce(MemorySettings, eval_memory) if eval_memory is not None else self.memory
        self.optim = coerce(OptimConfig, optim)
        self.eval_protocol = coerce(EvalProtocol, eval_protocol)
        self.model = self.build_model()
        if not getattr(self.model, "supports_memory", False):
            for name, lengths in [("memory", self.memory), ("eval_memory", self.eval_memory)]:
                if lengths.mem_len > 0:
                    raise ValueError(
                        f"{type(self.model).__name__} keeps no memory, but {name}.mem_len = {lengths.mem_len}: "
                        "set it to 0"
                    )
        if self.eval_protocol.kind == "sliding" and self.eval_memory.mem_len > 0:
            raise ValueError("the sliding-window protocol evaluates without memory: set eval_memory.mem_len to 0")
        self._mems: dict[str, list[torch.Tensor] | None] = {"train": None, "valid": None, "test": None}
        # `repro fit --run.batch_chunk N`: each training batch in N chunks of streams, gradients accumulated within
        # the step (`_chunked_training_step`)
        self.batch_chunk = 1
        self._history: dict[str, torch.Tensor | None] = {"valid": None, "test": None}  # sliding protocol
        self.nll_metrics = torch.nn.ModuleDict({s: TokenNLL() for s in ("valid", "test")})
        # training progress travels with the weights, so that a test run can cite what it evaluates
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.int64), persistent=True)
        self.register_buffer("train_batches", torch.zeros((), dtype=torch.int64), persistent=True)
        self.vocab_digest: str | None = None
        self._graphs: dict[torch.nn.Module, Any] | None = None  # units compiled for CUDA graphs (compile_model)

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def extra_loss(self) -> dict[str, torch.Tensor]:
        """Auxiliary losses of the last forward pass, added to the NLL (e.g. ∞-former's KL term)."""
        return {}

    # ------------------------------------------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and getattr(dm, "corpus", None) is not None:
            self.vocab_digest = dm.corpus.vocab.digest
            if len(dm.corpus.vocab) != self.n_token:
                raise ValueError(
                    f"the model has {self.n_token} output symbols but corpus {dm.corpus_name} has "
                    f"{len(dm.corpus.vocab)}: build the model from this data (leave n_token unset)"
                )

    # ---------------------------------------------------------------------------------------------- training
    def on_train_epoch_start(self) -> None:
        self._mems["train"] = None

    def on_train_batch_start(self, batch, batch_idx) -> None:
        # Lightning frees the last update's gradients (`zero_grad`, set to None) between this step's forward and its
        # backward: they sat beside the forward's activations (1.1 GB for Transformer-XL enwik8 24L).
        # Nothing reads them before the backward, so they go before the forward, on the batches where Lightning
        # frees them (the first of each accumulation); the numbers are the same.
        if self.automatic_optimization and batch_idx % self.trainer.accumulate_grad_batches == 0:
            for opt in self.trainer.optimizers:
                opt.zero_grad(set_to_none=True)

    def forward(self, tokens_BT, mems, lengths: MemorySettings, *, kv_memory: bool = False):
        extra = {"kv_memory": True} if kv_memory else {}
        return self.model(tokens_BT, mems, mem_len=lengths.mem_len, clamp_len=lengths.clamp_len,
                          same_length=lengths.same_length, **extra)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        """Lightning's zero_grad runs between the training step and its backward; `on_train_batch_start` has
        already freed the gradients on the same batches. With `batch_chunk` it must not run: the step's first chunks
        have put their gradients there."""
        if self.batch_chunk <= 1:
            super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def training_step(self, batch, batch_idx):
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if self.batch_chunk > 1:
            return self._chunked_training_step(batch)
        hidden, mems = self(batch.input, self._mems["train"], self.memory)
        self._mems["train"] = self._persist(mems)
        nll = self.model.nll(hidden, batch.target)
        loss = nll.mean()
        aux = self.extra_loss()
        total = loss + sum(aux.values()) if aux else loss
        self.tokens_seen += batch.target.numel() * self.trainer.world_size
        self.train_batches += 1
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", torch.exp(loss.detach()))
        self.log("train/bpc", loss.detach() / math.log(2))
        self.log("train/tokens_seen", self.tokens_seen.float())
        for name, value in aux.items():
            self.log(f"train/{name}", value)
        return total

    def _chunked_training_step(self, batch):
        """The authors' `--batch_chunk`: the batch's streams in `batch_chunk` equal chunks, each with its own slice of
        the memory, its forward and its backward one after the other (one chunk's activations alive at a time), the
        loss of each divided by the number of chunks: the same loss and gradients as the whole batch. The last chunk's
        loss goes back to Lightning, whose backward then adds its gradients (and, under DDP, reduces the sum: the
        earlier chunks' backwards run inside the step, before DDP expects its hooks, as under `no_sync`)."""
        n, b = self.batch_chunk, batch.input.shape[0]
        if b % n:
            raise ValueError(f"--run.batch_chunk {n} does not divide the batch of {b} streams: give a divisor of {b}")
        size, mems = b // n, self._mems["train"]
        new, losses, auxes, last = [], [], [], None
        for c in range(n):
            rows = slice(c * size, (c + 1) * size)
            hidden, chunk_mems = self(batch.input[rows], [m[rows] for m in mems] if mems else mems, self.memory)
            new.append(chunk_mems)
            loss = self.model.nll(hidden, batch.target[rows]).mean()
            aux = self.extra_loss()
            part = (loss + sum(aux.values()) if aux else loss) / n
            losses.append(loss.detach())
            auxes.append({k: v.detach() for k, v in aux.items()})
            if c < n - 1:
                self.trainer.strategy.backward(part, None)
            else:
                last = part
        self._mems["train"] = self._persist([torch.cat(parts, dim=0) for parts in zip(*new)])
        loss = torch.stack(losses).mean()
        self.tokens_seen += batch.target.numel() * self.trainer.world_size
        self.train_batches += 1
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", torch.exp(loss))
        self.log("train/bpc", loss / math.log(2))
        self.log("train/tokens_seen", self.tokens_seen.float())
        for name in auxes[0]:
            self.log(f"train/{name}", torch.stack([a[name] for a in auxes]).mean())
        return last

    def make_optimizer(self) -> torch.optim.Optimizer:
        """The reference's Adam. On a CPU `foreach`: one multi-tensor kernel per update term instead of a loop over
        parameters (the same numbers; the per-parameter loop costs a small model more than its matmuls do), over
        parameter groups of at most `FOREACH_GROUP_BYTES` (`bounded_groups`). On a GPU `fused`: the whole update in
        one kernel per group of tensors (the same update, rounded differently in the last bits)."""
        fused = all(p.device.type == "cuda" for p in self.parameters())
        params = list(self.parameters()) if fused else bounded_groups(self.parameters(), FOREACH_GROUP_BYTES)
        return torch.optim.Adam(params, lr=self.optim.lr, betas=self.optim.betas,
                                weight_decay=self.optim.weight_decay, **({"fused": True} if fused else
                                                                         {"foreach": True}))

    def compile_model(self, *, mode: str | None = None, whole: bool = False,
                      undo: list[torch.nn.Module] | None = None) -> list[torch.nn.Module]:
        """Compile the model for this process (`repro fit --run.compile true`, `repro bench --compile`):
        `nn.Module.compile` of each of the model's `compile_units()` (Transformer-XL and the models built on it:
        its decoder layers, one graph shared by the layers of one shape) or of the whole model, with static shapes
        (one graph per memory length: a training memory has two, the empty first one and the full one). `mode`:
        torch.compile's (None: the default; `reduce-overhead`: each graph replayed as a CUDA graph on a GPU, for
        models whose step is bound by kernel launches). The state dict, checkpoints and numbers are the eager
        model's (to rounding; tests/test_compile.py). `whole`: one graph of the whole model's forward instead (fewer
        launches and graph calls per step, a longer compilation). Returns the units compiled; `undo=` those units
        turns them back to eager."""
        if undo is not None:
            for unit in undo:
                unit._compiled_call_impl = None  # what nn.Module.compile sets; None is the eager call
            self._graphs = None
            return undo
        units = [self.model] if whole or not hasattr(self.model, "compile_units") else list(self.model.compile_units())
        for unit in units:
            unit.compile(dynamic=False, mode=mode)
        # CUDA graphs: the training steps replay them; evaluation runs eager (a 12-layer evaluation under them read
        # an output that a later replay of the same graph had overwritten, on an H200), see `_eval_start`
        self._graphs = {unit: unit._compiled_call_impl for unit in units} if mode == "reduce-overhead" else None
        return units

    def _graphs_on(self, on: bool) -> None:
        for unit, compiled in (self._graphs or {}).items():
            unit._compiled_call_impl = compiled if on else None

    def _persist(self, mems):
        """The memory out of the CUDA graphs' pool (it outlives the step, and a graph's next replay overwrites its
        outputs); unchanged without CUDA graphs."""
        return [m.clone() for m in mems] if self._graphs and mems is not None else mems

    def configure_optimizers(self):
        opt = self.make_optimizer()
        max_steps = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 0
        if self.optim.schedule == "cosine" and max_steps <= 0:
            raise ValueError("the cosine schedule decays over trainer.max_steps: set --trainer.max_steps")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: self.optim.factor(s, max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ------------------------------------------------------------------------------------------- evaluation
    def _eval_start(self, split: str) -> None:
        self._graphs_on(False)
        self._mems[split] = None
        self._history[split] = None
        self.nll_metrics[split].reset()

    def _eval_step(self, split: str, batch) -> None:
        if self.eval_protocol.kind == "sliding":
            nll = self._sliding_nll(split, batch.input, batch.target)
        else:
            # evaluation memories keep keys and values where the model can (same numbers, far less work)
            kv = getattr(self.model, "supports_kv_memory", False) and not torch.is_grad_enabled()
            hidden, self._mems[split] = self(batch.input, self._mems[split], self.eval_memory, kv_memory=kv)
            nll = self.model.nll(hidden, batch.target)
        self.nll_metrics[split].update(nll)

    def _eval_end(self, split: str) -> None:
        result = scored(self.nll_metrics[split])
        loss = result["mean_nll"]
        prefix = "val" if split == "valid" else split
        self.log(f"{prefix}/loss", loss.float(), sync_dist=False)
        self.log(f"{prefix}/ppl", torch.exp(loss).float(), sync_dist=False)
        self.log(f"{prefix}/bpc", (loss / math.log(2)).float(), sync_dist=False)
        self.log(f"{prefix}/tokens", result["tokens"].float(), sync_dist=False)
        self._mems[split] = None
        self._graphs_on(True)

    def on_validation_epoch_start(self):
        self._eval_start("valid")

    def validation_step(self, batch, batch_idx):
        self._eval_step("valid", batch)

    def on_validation_epoch_end(self):
        self._eval_end("valid")

    def on_test_epoch_start(self):
        self._eval_start("test")

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch)

    def on_test_epoch_end(self):
        self._eval_end("test")

    def _sliding_nll(self, split: str, inp_BT: torch.Tensor, tgt_BT: torch.Tensor) -> torch.Tensor:
        """NLL of each target from a window of the `window` tokens that end at its input token."""
        w = self.eval_protocol.window
        hist = self._history[split]
        seq = inp_BT if hist is None else torch.cat([hist, inp_BT], dim=1)  # (B, h + T)
        b, t = inp_BT.shape
        h = seq.shape[1] - t
        nll = torch.empty(b, t, dtype=torch.float32, device=inp_BT.device)
        # near the stream's start the window is the whole prefix. A model whose outputs depend on the prefix only
        # (`prefix_invariant`: relative positions) scores all of those positions in one causal forward; otherwise
        # (absolute positions counted from the end) each position gets its own forward
        done = min(max(0, w - 1 - h), t)
        if done and getattr(self.model, "prefix_invariant", False):
            hidden, _ = self(seq[:, : h + done], None, MemorySettings())
            nll[:, :done] = self.model.nll(hidden[:, h : h + done], tgt_BT[:, :done])
        else:
            for i in range(done):
                hidden, _ = self(seq[:, : h + i + 1], None, MemorySettings())
                nll[:, i] = self.model.nll(hidden[:, -1:], tgt_BT[:, i : i + 1]).squeeze(1)
        stride, step = self.eval_protocol.stride, self.eval_protocol.window_batch
        if done < t:
            # the remaining positions in blocks of `stride`; each block is scored from the window of w tokens that
            # ends at its last position (stride 1: every token from its own window)
            jobs = []
            n_full = (t - done) // stride
            if n_full:
                start = h + done + stride - w  # window ending at segment position done + stride − 1
                wins = seq[:, start : start + (n_full - 1) * stride + w].unfold(1, w, stride)  # (B, n_full, w)
                jobs.append((wins.reshape(-1, w), tgt_BT[:, done : done + n_full * stride].reshape(-1, stride)))
            rest = t - done - n_full * stride
            if rest:
                jobs.append((seq[:, h + t - w : h + t], tgt_BT[:, t - rest :]))
            outs = []
            for wins, tgt in jobs:
                n = tgt.shape[1]
                res = torch.empty(tgt.shape, dtype=torch.float32, device=inp_BT.device)
                for i in range(0, wins.shape[0], step):
                    hidden, _ = self(wins[i : i + step], None, MemorySettings())
                    res[i : i + step] = self.model.nll(hidden[:, -n:], tgt[i : i + step])
                outs.append(res.view(b, -1))
            nll[:, done:] = torch.cat(outs, dim=1)
        self._history[split] = seq[:, -(w - 1):] if w > 1 else seq[:, :0]
        return nll

    # ------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["repro"] = {
            # what the weights are, so that a checkpoint given to another model is refused by name
            # (`repro.io.check_checkpoint`)
            "module_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "n_token": self.n_token,
            "vocab_digest": self.vocab_digest,
            "train_memory": self._gather_memory(self._mems["train"]),
            # Lightning does not save RNG states; dropout after a resume must draw what it would have drawn
            "rng": self._gather_rng(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("repro", {})
        if state.get("n_token") not in (None, self.n_token):
            raise ValueError(
                f"the checkpoint was trained on a vocabulary of {state['n_token']} symbols, this run's data has "
                f"{self.n_token}: evaluate it on the corpus it was trained on"
            )
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        corpus = getattr(dm, "corpus", None)
        ours = corpus.vocab.digest if corpus is not None else self.vocab_digest
        if state.get("vocab_digest") and ours and state["vocab_digest"] != ours:
            raise ValueError(
                f"the checkpoint's vocabulary (digest {state['vocab_digest']}) differs from this data's ({ours}): "
                "same size, different symbols or order; evaluate it on the corpus it was trained on"
            )
        self._mems["train"] = self._scatter_memory(state.get("train_memory"))
        rng = state.get("rng")
        if rng:
            rank = self._trainer.global_rank if self._trainer is not None else 0
            mine = rng[rank] if rank < len(rng) else rng[0]
            torch.set_rng_state(mine["cpu"])
            if torch.cuda.is_available() and mine.get("cuda") is not None:
                torch.cuda.set_rng_state(mine["cuda"])

    def _gather_rng(self) -> list[dict[str, torch.Tensor | None]]:
        on_cuda = torch.cuda.is_available() and self.device.type == "cuda"
        mine = {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if on_cuda else None}
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            out: list = [None] * dist.get_world_size()
            dist.all_gather_object(out, mine)
            return out
        return [mine]

    def _gather_memory(self, mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        """The memory of all ranks, concatenated along the batch (= stream) dimension, on the CPU."""
        if mems is None:
            return None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            out = []
            for m in mems:
                parts = [torch.empty_like(m) for _ in range(dist.get_world_size())]
                dist.all_gather(parts, m.contiguous())
                out.append(torch.cat(parts, dim=0).cpu())
            return out
        return [m.detach().cpu().clone() for m in mems]

    def _scatter_memory(self, mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        if mems is None:
            return None
        world = self._trainer.world_size if self._trainer is not None else 1
        rank = self._trainer.global_rank if self._trainer is not None else 0
        b = mems[0].shape[0]
        if b % world:
            raise ValueError(f"the checkpoint's memory holds {b} streams, which do not split into {world} ranks")
        per = b // world
        return [m[rank * per : (rank + 1) * per].to(self.device) for m in mems]

    # ----------------------------------------------------------------------------------------------- summary
    def describe(self) -> dict[str, Any]:
        return {
            "model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
            "module_class": f"{type(self).__module__}.{type(self).__qualname__}",
            "parameters": sum(p.numel() for p in self.parameters()),
            "mem_len": self.memory.mem_len,
            "eval": asdict(self.eval_memory) | {"protocol": self.eval_protocol.kind},
        }
