"""Peak memory of a paper config's training step against `--run.batch_chunk` and `--run.checkpoint_layers`, and the
settings that fit its batch on a 40 GB or an 80 GB GPU:

    repro step-memory -c configs/transformer_xl/paper/wt103_large.yaml \\
        --out results/transformer_xl/step_memory/wt103_large.json

What is measured, on the CPU and in float32 (the paper configs' precision): every byte the allocator hands out during
the first two chunks of a step at full memory, from no gradients (as `repro.lm.SegmentLM` leaves them before a
step), its peak above what was alive before (PyTorch's profiler with `profile_memory`: each allocation and free with
the running total, the figure `torch.cuda.max_memory_allocated` reads on a GPU, less the kernels' own workspaces).
The first chunk's backward puts the gradients in place; the second's adds to them, as every later chunk does, so
its peak is the step's: the gradients, one chunk's activations and the accumulation's temporaries. At a few chunk
sizes (streams per chunk), with and without layer checkpointing. Tokens are drawn from a Zipf law over the
vocabulary (rank r with probability ∝ 1/(r + 1); the vocabularies are sorted by frequency): the adaptive softmax
computes a tail cluster's logits only for the targets in it, so uniform tokens would overstate its share.

What is estimated from it: a step's peak on one device holding `streams` of the batch (the global batch over the
devices, `repro.data.lm`) in `chunks` = the state outside the measured steps (weights and Adam's two moments: 12
bytes a trained float32 parameter; the carried memory of the device's streams, `repro.cli.disk.memory_bytes`) plus
the measured allocations, on a line through the measured chunk sizes (activations grow with the streams of a chunk).
A setting fits a card when that estimate is at most `USABLE` of its memory, the rest left to the CUDA context, the
kernels' workspaces and the caching allocator's rounding.

Follows the authors' `--batch_chunk` (their PyTorch `train.py`: the batch split along the streams, each chunk's
backward before the next chunk's forward) and PyTorch's memory-profiling guide. Differs: measured on a CPU, not a
GPU (no GPU was lent here); the estimate is a line through the measured chunk sizes, not a measurement at each
setting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

from repro.cli.cli import build
from repro.cli.disk import memory_bytes
from repro.io import atomic_write_json, atomic_write_text
from repro.ops.bench import environment
from repro.tracking import hardware

CARDS_GB = (40, 80)  # GPU memory, in GiB as the cards are sold (A100/H100 40 GB and 80 GB: 40 and 80 GiB)
USABLE = 0.9  # of a card's memory, the rest for the CUDA context, workspaces and the allocator's rounding
STATE_BYTES = 12  # a trained float32 parameter outside the measured steps: weight, Adam's exp_avg and exp_avg_sq


@contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to /dev/null in the block (C++ libraries write there, below Python's sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def peak_allocated(step: Callable[[], object]) -> int:
    """The peak, in bytes, of the memory the CPU allocator handed out during `step()` above what was alive before it
    (the running total of PyTorch's profiler's memory events). A block made before the step and freed in it is not
    seen to go: the figure then errs high, never low."""
    # the profiler's C++ start and stop lines, and its warning that blocks from before the step (the memory it
    # replaces) are freed unseen: the total then stays above the truth, never below
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    if not memory:
        return 0
    # the running total is the process's, kept only while a profiler listens: the window's start is the first
    # event's total less that event's own bytes
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(0, max(m["Total Allocated"] for m in memory) - start)


def zipf_tokens(n_token: int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Token ids with P(r) ∝ 1/(r + 1): the rank-frequency law of words (and, roughly, of characters)."""
    weights = 1.0 / torch.arange(1, n_token + 1, dtype=torch.float64)
    flat = torch.multinomial(weights, int(torch.tensor(shape).prod()), replacement=True, generator=generator)
    return flat.view(shape)


def chunk_peak(module, streams: int, tgt_len: int, *, checkpoint_layers: bool, seed: int = 0) -> int:
    """Measured bytes of a step's first two chunks of `streams` streams each, forward (at full memory) and backward,
    from no gradients: the peak of a step of two or more such chunks, and at least that of a step of one. `module`:
    a `repro.lm.SegmentLM` in float32 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    n_token = module.n_token

    def segment():
        tokens = zipf_tokens(n_token, (streams, tgt_len + 1), g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    if checkpoint_layers and not getattr(module.model, "supports_checkpoint_layers", False):
        raise ValueError(f"{type(module.model).__name__} does not checkpoint its layers (--run.checkpoint_layers)")
    saved = getattr(module.model, "checkpoint_layers", False)
    module.model.checkpoint_layers = checkpoint_layers
    module.train()
    state = {"mems": None}

    def step():
        x, y = segment()
        hidden, mems = module(x, state["mems"], module.memory)
        loss = module.model.nll(hidden, y).mean()
        aux = module.extra_loss()
        (loss + sum(aux.values()) if aux else loss).backward()
        state["mems"] = [m.detach() for m in mems] if mems else mems

    try:
        with torch.no_grad():  # the memory filled: every later segment of a stream meets a full one
            x, _ = segment()
            _, mems = module(x, None, module.memory)
            state["mems"] = [m.detach() for m in mems] if mems else mems
        module.zero_grad(set_to_none=True)

        def two_chunks():
            step()  # the gradients made: freed within the window, their frees are seen
            step()

        return peak_allocated(two_chunks)
    finally:
        module.model.checkpoint_layers = saved
        module.zero_grad(set_to_none=True)


def line(points: list[tuple[int, int]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (streams, bytes) points."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def state_bytes(module, datamodule, streams: int) -> dict[str, int]:
    """What a device holds besides a step's measured allocations: weights and Adam's moments, and the carried memory
    of its `streams` streams."""
    params = list(module.parameters())
    trained = sum(p.numel() for p in params if p.requires_grad)
    frozen = sum(p.numel() for p in params if not p.requires_grad)
    carried = memory_bytes(module, datamodule) // max(1, datamodule.batch_size) * streams
    return {"weights_adam": trained * STATE_BYTES + frozen * 4, "memory": carried}


def settings(batch: int, state: Callable[[int], int], activations: dict[bool, tuple[float, float]],
             devices: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[dict]:
    """For each device count that divides the batch, each card and each checkpointing setting: the fewest chunks
    (a divisor of the device's streams) whose estimated peak fits `USABLE` of the card, or None."""
    rows = []
    for d in devices:
        if batch % d:
            continue
        streams = batch // d
        for card in CARDS_GB:
            for ckpt, (a0, a1) in sorted(activations.items()):
                fit = None
                for n in (k for k in range(1, streams + 1) if streams % k == 0):
                    peak = state(streams) + a0 + a1 * (streams // n)
                    if peak <= USABLE * card * 2**30:
                        fit = {"batch_chunk": n, "streams_per_chunk": streams // n, "peak_bytes": round(peak)}
                        break
                rows.append({"devices": d, "streams_per_device": streams, "card_gb": card,
                             "checkpoint_layers": ckpt, "fits": fit})
    return rows


def measure(config: list[str], chunk_streams: list[int]) -> dict:
    cli = build(config)
    module, dm = cli.model.float(), cli.datamodule
    torch.manual_seed(0)
    measured = []
    for ckpt in (False, True):
        for s in chunk_streams:
            t = time.perf_counter()
            measured.append({"streams": s, "checkpoint_layers": ckpt,
                             "allocated_peak_bytes": chunk_peak(module, s, dm.tgt_len, checkpoint_layers=ckpt),
                             "seconds": round(time.perf_counter() - t, 1)})
            print(f"stepmemory: {s} stream(s) a chunk, checkpoint_layers {str(ckpt).lower()}: "
                  f"{measured[-1]['allocated_peak_bytes'] / 2**20:,.0f} MiB ({measured[-1]['seconds']} s)", flush=True)
    fits = {ckpt: line([(m["streams"], m["allocated_peak_bytes"]) for m in measured
                        if m["checkpoint_layers"] == ckpt]) for ckpt in (False, True)}

    def state(streams: int) -> int:
        return sum(state_bytes(module, dm, streams).values())

    run = cli.config.get("run", {}) or {}
    return {"config": config, "paper": run.get("paper"), "experiment": run.get("experiment"),
            "batch_size": dm.batch_size, "tgt_len": dm.tgt_len, "mem_len": module.memory.mem_len,
            "parameters": sum(p.numel() for p in module.parameters()),
            "state_bytes_whole_batch": state_bytes(module, dm, dm.batch_size), "measured": measured,
            "activation_line": {str(k).lower(): {"intercept_bytes": round(a0), "bytes_per_stream": round(a1)}
                                for k, (a0, a1) in fits.items()},
            "usable_fraction": USABLE, "settings": settings(dm.batch_size, state, fits)}


def table_path(out: str | os.PathLike) -> str:
    """The Markdown table written beside a record: `wt103_large.json` → `wt103_large.md`."""
    root, _ = os.path.splitext(os.fspath(out))
    return root + ".md"


def render(record: dict) -> str:
    """The record as the Markdown table written beside it (`<out>.md`), which docs/multinode.md shows: per device
    count, the fewest chunks that fit each card with and without layer checkpointing, then the measured points."""
    p = record["provenance"]

    def cell(fit: dict | None) -> str:
        if fit is None:
            return "does not fit"
        return f"`--run.batch_chunk {fit['batch_chunk']}` ({fit['peak_bytes'] / 2**30:.1f} GiB)"

    by = {(r["devices"], r["card_gb"], r["checkpoint_layers"]): r for r in record["settings"]}
    devices = sorted({r["devices"] for r in record["settings"]})
    cols = [(card, ck) for card in CARDS_GB for ck in (False, True)]
    lines = [f"# Step memory: {record['paper']} {record['experiment']}", "",
             f"{record['experiment']}: {record['parameters'] / 1e6:.1f}M parameters, a batch of "
             f"{record['batch_size']} streams of {record['tgt_len']} tokens, memory {record['mem_len']}. Estimated "
             f"peak of a training step and the fewest chunks that fit {USABLE:.0%} of a card's memory, from the "
             f"allocations measured on {p['host_cpu']} with torch {p['torch']} in float32: `{p['command']}`.", "",
             "| devices | streams a device | " + " | ".join(f"{c} GB{', layer checkpointing' if k else ''}"
                                                       for c, k in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for d in devices:
        first = by[(d, *cols[0])]
        lines.append(f"| {d} | {first['streams_per_device']} | "
                     + " | ".join(cell(by[(d, c, k)]["fits"]) for c, k in cols) + " |")
    lines += ["", "| streams a chunk | layer checkpointing | measured: two chunks' allocations (GiB) |",
              "|---|---|---|"]
    for m in record["measured"]:
        lines.append(f"| {m['streams']} | {'yes' if m['checkpoint_layers'] else 'no'} | "
                     f"{m['allocated_peak_bytes'] / 2**30:.2f} |")
    state = record["state_bytes_whole_batch"]
    lines += ["", f"Beside the measured allocations: weights and Adam's moments "
                  f"{state['weights_adam'] / 2**30:.1f} GiB, the carried memory of the whole batch "
                  f"{state['memory'] / 2**30:.1f} GiB (a device holds its share)."]
    return "\n".join(lines) + "\n"


def config_comment(record: dict, record_path: str) -> list[str]:
    """The comment lines the config carries (above its `data:` section), for one device holding the whole batch:
    the chunks that fit each card, without and with layer checkpointing. tests/test_step_memory.py checks that
    each measured config carries exactly these lines."""
    fits = {(r["card_gb"], r["checkpoint_layers"]): r["fits"] for r in record["settings"] if r["devices"] == 1}

    def say(card: int, ckpt: bool) -> str:
        fit = fits[(card, ckpt)]
        return f"{card} GB: " + (f"--run.batch_chunk {fit['batch_chunk']}" if fit else "does not fit")

    return [f"# The batch of {record['batch_size']} streams on one GPU, estimated from the step memory measured in",
            f"#   {record_path}:",
            f"#   {say(40, False)}; {say(80, False)}",
            f"#   with --run.checkpoint_layers true, {say(40, True)}; {say(80, True)}",
            "#   on several GPUs each holds its share of the streams: the record's table gives their settings"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="repro step-memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", required=True, help="a paper config (and overrides)")
    ap.add_argument("--streams", default="1,2", help="streams per chunk to measure (comma-separated)")
    ap.add_argument("--out", required=True, help="the JSON record to write (and its Markdown table beside it)")
    args = ap.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    if len(set(streams)) < 2 or min(streams) < 1:
        raise SystemExit("error: --streams needs two or more different positive chunk sizes, e.g. --streams 1,2")
    for path in args.config:
        if not os.path.isfile(path):
            raise SystemExit(f"error: config {path} does not exist")
    record = measure(args.config, streams)
    env = environment(torch.device("cpu"))
    record["provenance"] = {"command": "repro step-memory " + " ".join(argv or []),
                            "hardware": hardware(), "host_cpu": env["host_cpu"], "torch": env["torch"],
                            "threads": torch.get_num_threads()}
    atomic_write_json(args.out, record)
    atomic_write_text(table_path(args.out), render(record))
    best = {(r["card_gb"], r["checkpoint_layers"]): r["fits"] for r in record["settings"] if r["devices"] == 1}
    print(f"stepmemory: {args.out}: one device of {record['batch_size']} streams: " + "; ".join(
        f"{card} GB{' with layer checkpointing' if ck else ''}: "
        + (f"--run.batch_chunk {f['batch_chunk']}" if f else "does not fit")
        for (card, ck), f in sorted(best.items())), flush=True)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
