"""The arena's measurements of one trained contestant: size, training FLOPs per token, speed, memory, and the loss
at several evaluation memory lengths, in one record per experiment, `{record_dir}/{experiment}.arena.json`.

`repro runs --paper arena --profile tiny --group G --tests train --after papers.arena.measure SPEC…` calls
`after_run` after each experiment's test (in the same process); `python -m papers.arena.measure -c CONFIG --ckpt
CHECKPOINT --out FILE` measures one checkpoint alone. `papers/arena/tables.py` renders the records.

Follows `papers/lamemo/utilisation.py` (a trained checkpoint, loaded from its Lightning config, analysed outside a
Trainer) and `repro bench` (`repro.ops.bench`: timed steps after a warm-up, FLOPs by `torch.utils.flop_counter`
through `repro.ops.timing.count_flops`). Differs from `repro bench` in what it runs: the config's own data (the
training and test streams, not random tokens), the module's own evaluation path (`SegmentLM._eval_step`, so that a
loss here is what `repro test --trainer.limit_test_batches N` gives at that memory), and FLOPs counted on a training
step only once every memory of the contestant is full.

What the record holds:
- `parameters` (trainable, each tied weight once) and `non_embedding_parameters` (less the token embedding,
  which the output layer shares);
- `train_flops_per_token`: the FLOPs of one training step (forward and backward of the NLL's mean plus the module's
  auxiliary losses, `ArenaLM.extra_loss`) divided by its tokens (batch × segment of the config), counted once the
  memory is full: segments run forward without gradients until no memory tensor changes shape from one segment to
  the next (the short memory at `memory.mem_len`, a compressed or long-term memory at its size; `train_flops.
  fill_segments` says how many). `FlopCounterMode` counts matrix products (mm, addmm, bmm, baddbmm, convolutions,
  scaled dot-product attention) with the eager attention kernel, forward and backward: 2 FLOPs per multiply-add. It
  does not count elementwise operations, softmax, layer norms, the embedding lookup and its backward, linear
  solves (the ∞-former's ridge-regression matrix is solved once per geometry and cached; its products with the
  memory are counted), the reductions of the losses, the gradient clip or the optimiser's update: a lower bound
  that compares the contestants' matrix work (tests/test_arena_tables.py checks it against a count by hand of the
  backbone's products). `eval_flops_per_token`: the same for one evaluation step of the test split (`_eval_step`,
  after warm-up segments);
- `train_tokens_per_s` (forward, backward, the trainer's gradient clip and the module's Adam, with the training
  memory carried) and `eval_tokens_per_s` (`_eval_step` under `torch.inference_mode`), each over `timing.steps`
  timed steps after `timing.warmup`, at the config's batch and segment, in the config trainer's precision (bf16
  autocast for `bf16-mixed`); the weights the timed training steps update are not saved, and the losses below are
  measured before them;
- `train_forward_tensor_peak_mb`: the peak of the tensors one training forward pass creates at full memory (the
  activations kept for the backward; `repro.ops.memtrack.TensorPeak`), comparable between contestants;
  `peak_rss_mb`: the process's peak resident memory since it started (`repro.ops.rss`: under `repro runs` that of
  the training before it too, so it is the run's, not the measurement's); `cuda_peak_mb` on a GPU;
- `loss_by_context`: the test loss (nats), bpc and perplexity over the first `EVAL_TOKENS` test tokens (whole
  segments: `tokens` in each entry; `--eval-tokens`), with the short memory at each evaluation length (0, T/2,
  T, 2T, 4T for the evaluation segment T; the contestant's clamp and same_length kept). The mechanisms' own
  memories (compressed, long-term, the look-ahead's refreshed rows) keep their configured sizes: only
  Transformer-XL's `mem_len` moves. The memory-less contestant (protocol `sliding`) is evaluated on sliding windows
  of T + mem_len tokens instead, its stride kept. At the training memory, over 52 test segments of
  `lamemo_infinity`, the loss equalled that of `repro test --trainer.limit_test_batches 52` to 1e-7;
- `provenance`: command, config files, checkpoint, hardware (as the run records' `provenance.hardware`), host CPU,
  torch, CUDA, precision, threads.
With `overrides` (the rehearsal's configs) only a few batches are run: a check of the code path, not a measurement.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from itertools import islice

import torch

from repro.io import atomic_write_json
from repro.metrics import scored
from repro.ops.memtrack import TensorPeak
from repro.ops.rss import peak_rss_mb
from repro.ops.timing import autocast, count_flops, timed
from repro.tracking import hardware

EVAL_TOKENS = 8_192  # test tokens per evaluation memory length (26 segments of 10 × 32 in the tiny profile)
CONTEXT_MULTIPLES = (0, 0.5, 1, 2, 4)  # evaluation memory lengths, in evaluation segments
WARMUP, STEPS = 2, 5  # timed steps
FILL_LIMIT = 64  # segments that may pass before a memory counts as never full
REHEARSAL = {"eval_batches": 2, "warmup": 1, "steps": 1}  # with overrides: the code path only


def precision_of(trainer_precision) -> str:
    """`repro.ops.timing.autocast`'s name of a Lightning precision: `bf16` for bf16-mixed/true, else `32`."""
    return "bf16" if "bf16" in str(trainer_precision) else "32"


def _shapes(state) -> tuple:
    if state is None:
        return ()
    if isinstance(state, torch.Tensor):
        return (tuple(state.shape),)
    return tuple(tuple(t.shape) for t in state)


def warm_up(step, state, *, limit: int = FILL_LIMIT) -> tuple[int, bool]:
    """Call `step()` until `state()` (tensors) keeps its shapes over one call — every memory full — at least once;
    (calls made, whether it got full within `limit`)."""
    for n in range(1, limit + 1):
        before = _shapes(state())
        step()
        if n > 1 and _shapes(state()) == before:
            return n, True
    return limit, False


def _train_loss(module, batch, mems, precision, device):
    with autocast(device, precision):
        hidden, mems = module(batch.input, mems, module.memory)
        loss = module.model.nll(hidden, batch.target).mean()
        aux = module.extra_loss()
        total = loss + sum(aux.values()) if aux else loss
    return total, mems


def parameters(module) -> tuple[int, int]:
    """(trainable parameters, those less the token embedding's tables), each tied weight once."""
    total = sum(p.numel() for p in module.parameters() if p.requires_grad)
    emb = getattr(module.model, "word_emb", None)
    tables = sum(p.numel() for layer in getattr(emb, "emb_layers", []) for p in layer.parameters())
    return total, total - tables


def train_flops(module, batches, *, precision: str = "32", device=None) -> dict:
    """FLOPs of one training step at full memory (the module docstring), the memory filled from `batches` first."""
    device = device or next(module.parameters()).device
    module.train()
    state = {"mems": None}

    def fill():
        with torch.no_grad():
            _, state["mems"] = _train_loss(module, next(batches), state["mems"], precision, device)

    n, full = warm_up(fill, lambda: state["mems"])
    batch = next(batches)

    def step():
        loss, _ = _train_loss(module, batch, state["mems"], precision, device)
        loss.backward()

    flops = count_flops(step, module)
    module.zero_grad(set_to_none=True)
    tokens = batch.target.numel()
    return {"per_step": flops, "tokens": tokens, "per_token": flops / tokens, "batch_size": batch.input.shape[0],
            "tgt_len": batch.input.shape[1], "mem_len": module.memory.mem_len, "fill_segments": n,
            "memory_full": full, "short_memory_rows": state["mems"][0].shape[1] if state["mems"] else 0}


def _eval_state(module, split: str):
    return module._history[split] if module.eval_protocol.kind == "sliding" else module._mems[split]


def evaluate(module, batches, *, mem_len: int | None = None, precision: str = "32", device=None) -> dict:
    """Loss over `batches` (from the start of a stream) by the module's own evaluation path, with the short memory
    at `mem_len` (the sliding protocol: windows of segment + `mem_len` tokens); None: the config's."""
    device = device or next(module.parameters()).device
    saved = module.eval_memory, module.eval_protocol
    batches = list(batches)
    t = batches[0].input.shape[1]
    window = None
    if mem_len is not None and module.eval_protocol.kind == "sliding":
        window = t + mem_len
        module.eval_protocol = replace(saved[1], window=window, stride=min(saved[1].stride, window))
    elif mem_len is not None:
        module.eval_memory = replace(saved[0], mem_len=mem_len)
    elif module.eval_protocol.kind == "sliding":
        window = module.eval_protocol.window
    module.eval()
    try:
        module._eval_start("test")
        with torch.inference_mode(), autocast(device, precision):
            for batch in batches:
                module._eval_step("test", batch)
        result = scored(module.nll_metrics["test"])
    finally:
        module.eval_memory, module.eval_protocol = saved
        module._eval_start("test")
    loss = float(result["mean_nll"])
    return {"mem_len": module.eval_memory.mem_len if mem_len is None else mem_len, "window": window,
            "protocol": module.eval_protocol.kind, "loss": loss, "bpc": loss / math.log(2), "ppl": math.exp(loss),
            "tokens": int(result["tokens"]), "batches": len(batches)}


def eval_flops(module, batches, *, precision: str = "32") -> dict:
    """FLOPs per token of one evaluation step of the test split at full memory (`_eval_step`, `inference_mode`)."""
    device = next(module.parameters()).device
    module.eval()
    module._eval_start("test")
    try:
        with torch.inference_mode(), autocast(device, precision):
            n, full = warm_up(lambda: module._eval_step("test", next(batches)), lambda: _eval_state(module, "test"))
            batch = next(batches)
            flops = count_flops(lambda: module._eval_step("test", batch), module)
    finally:
        module._eval_start("test")
    return {"per_token": flops / batch.target.numel(), "fill_segments": n, "memory_full": full}


def throughput(module, train_batches, test_batches, *, precision: str, clip: float | None, warmup: int,
               steps: int) -> dict:
    """Tokens per second of training steps (forward, backward, clip, the module's Adam) and evaluation steps, and
    the peak of a training forward's tensors. Updates the weights: call it last."""
    device = next(module.parameters()).device
    module.train()
    opt = module.make_optimizer()
    state = {"mems": None, "tokens": 0, "shape": None}

    def train_step():
        batch = next(train_batches)
        loss, state["mems"] = _train_loss(module, batch, state["mems"], precision, device)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["tokens"] += batch.target.numel()
        state["shape"] = list(batch.input.shape)

    def eval_step():
        batch = next(test_batches)
        module._eval_step("test", batch)
        state["tokens"] += batch.target.numel()
        state["shape"] = list(batch.input.shape)

    for _ in range(warmup):
        train_step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    state["tokens"] = 0
    train_s = timed(train_step, steps, device)
    train_tokens, train_shape = state["tokens"], state["shape"]
    cuda_peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    with TensorPeak() as tracker:
        _train_loss(module, next(train_batches), state["mems"], precision, device)
    module.zero_grad(set_to_none=True)

    module.eval()
    module._eval_start("test")
    try:
        with torch.inference_mode(), autocast(device, precision):
            for _ in range(warmup):
                eval_step()
            state["tokens"] = 0
            eval_s = timed(eval_step, steps, device)
    finally:
        module._eval_start("test")
    return {"train_tokens_per_s": train_tokens / train_s, "eval_tokens_per_s": state["tokens"] / eval_s,
            "train_forward_tensor_peak_mb": tracker.peak_mb, "cuda_peak_mb": cuda_peak,
            "timing": {"warmup": warmup, "steps": steps, "train_seconds": train_s, "eval_seconds": eval_s,
                       "train_batch": train_shape, "eval_batch": state["shape"], "gradient_clip_val": clip,
                       "optimizer": type(opt).__name__}}


def _stream(dm, split: str, device):
    """Endless segments of `split` on `device` (passes repeated)."""
    while True:
        for batch in dm.segments(split):
            yield type(batch)(batch.input.to(device), batch.target.to(device))


def context_lengths(tgt_len: int) -> list[int]:
    return sorted({int(m * tgt_len) for m in CONTEXT_MULTIPLES})


def measure(module, dm, *, precision: str, clip: float | None, rehearsal: bool = False,
            eval_tokens: int = EVAL_TOKENS) -> dict:
    """Every measurement of the module docstring, on the module's device (the weights are changed afterwards)."""
    device = next(module.parameters()).device
    torch.manual_seed(0)  # sticky memories sample positions
    t0 = time.perf_counter()
    n_batches = REHEARSAL["eval_batches"] if rehearsal else max(1, -(-eval_tokens // (dm.eval_batch_size *
                                                                                     dm.eval_tgt_len)))
    first = list(islice(_stream(dm, "test", device), n_batches))
    total, non_emb = parameters(module)
    phases = {}
    # the rehearsal checks the code path at the config's own memory only: at paper scale the sliding protocol scores
    # each of a window's first tokens from its own prefix, and five windows up to 5 segments ran past 35 minutes
    lengths = [None] if rehearsal else context_lengths(dm.eval_tgt_len)
    by_context = [evaluate(module, first, mem_len=m, precision=precision) for m in lengths]
    phases["loss_by_context"] = time.perf_counter() - t0
    flops = train_flops(module, _stream(dm, "train", device), precision=precision)
    ev = eval_flops(module, _stream(dm, "test", device), precision=precision)
    phases["flops"] = time.perf_counter() - t0 - sum(phases.values())
    warm, steps = (REHEARSAL["warmup"], REHEARSAL["steps"]) if rehearsal else (WARMUP, STEPS)
    speed = throughput(module, _stream(dm, "train", device), _stream(dm, "test", device), precision=precision,
                       clip=clip, warmup=warm, steps=steps)
    phases["throughput"] = time.perf_counter() - t0 - sum(phases.values())

    return {"parameters": total, "non_embedding_parameters": non_emb,
            "train_flops_per_token": flops["per_token"], "train_flops": flops,
            "eval_flops_per_token": ev["per_token"], "eval_flops": ev,
            **speed, "peak_rss_mb": round(peak_rss_mb(), 1),
            "loss_by_context": by_context, "loss_by_context_split": "test",
            "seconds": round(time.perf_counter() - t0, 2),
            "phase_seconds": {k: round(v, 2) for k, v in phases.items()}}


def _load(configs: list[str], checkpoint: str):
    from repro.cli.cli import build  # heavy: Lightning

    cli = build(configs)
    module, dm = cli.model, cli.datamodule
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    module.load_state_dict(state["state_dict"])
    dm.setup("test")
    return module.float(), dm, cli.config


def main(argv: list[str] | None = None) -> dict:
    from repro.ops.bench import environment  # heavy: Lightning

    ap = argparse.ArgumentParser(prog="python -m papers.arena.measure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", required=True, help="training config (and overrides)")
    ap.add_argument("--ckpt", required=True, help="the trained checkpoint")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--experiment", help="name in the record (default: the config's run.experiment)")
    ap.add_argument("--rehearsal", action="store_true", help="a few batches only: the code path, not a measurement")
    ap.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS, help="test tokens per evaluation memory length")
    args = ap.parse_args(argv)
    module, dm, config = _load(args.config, args.ckpt)
    if torch.cuda.is_available():
        module.cuda()
    device = next(module.parameters()).device
    trainer = config.get("trainer") or {}
    precision = precision_of(trainer.get("precision"))
    run = dict(config.get("run") or {})
    out = measure(module, dm, precision=precision, clip=trainer.get("gradient_clip_val"), rehearsal=args.rehearsal,
                  eval_tokens=args.eval_tokens)
    env = environment(device)
    if env["command"].split(" ", 1)[0].endswith("arena/measure.py"):  # run as `python -m papers.arena.measure`
        env["command"] = "python -m papers.arena.measure " + env["command"].partition(" ")[2]
    record = {"paper": run.get("paper"), "experiment": args.experiment or run.get("experiment"),
              "profile": run.get("profile"), "stage": "arena", "rehearsal": bool(run.get("rehearsal") or
                                                                                  args.rehearsal),
              "corpus": dm.corpus_name, "level": dm.level, "mechanisms": module.mechanisms,
              "mem_len": module.memory.mem_len, "eval": {"mem_len": module.eval_memory.mem_len,
                                                         "clamp_len": module.eval_memory.clamp_len,
                                                         "same_length": module.eval_memory.same_length,
                                                         "protocol": module.eval_protocol.kind,
                                                         "window": module.eval_protocol.window},
              **out,
              "provenance": {"command": env["command"], "config": args.config, "checkpoint": args.ckpt,
                             "hardware": hardware(), "host_cpu": env["host_cpu"], "torch": env["torch"],
                             "cuda": env["cuda"], "precision": precision, "threads": torch.get_num_threads()}}
    atomic_write_json(args.out, record)
    at = {c["mem_len"]: c["bpc"] for c in out["loss_by_context"]}
    print(f"{args.out}: {out['train_flops_per_token'] / 1e6:.2f} MFLOP/token, train {out['train_tokens_per_s']:,.0f} "
          f"tok/s, eval {out['eval_tokens_per_s']:,.0f} tok/s, bpc by memory "
          + ", ".join(f"{m}: {v:.3f}" for m, v in at.items()) + f" ({out['seconds']:.1f} s)", flush=True)
    return record


def after_run(config: str, checkpoint: str, experiment: str, record_dir: str, *,
              overrides: list[str] | tuple[str, ...] = ()) -> None:
    """`repro runs --after papers.arena.measure`: measure each trained checkpoint in the same process. With
    `overrides` (the rehearsal's configs, `repro runs --rehearsal true`) they are composed after the config and
    only a few batches are run: the code path at the profile's sizes, not a measurement."""
    extra = [a for c in overrides for a in ("-c", c)] + (["--rehearsal"] if overrides else [])
    main(["-c", config, *extra, "--ckpt", checkpoint, "--experiment", experiment,
          "--out", f"{record_dir}/{experiment}.arena.json"])


if __name__ == "__main__":
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    main()
