"""Side by side with the authors' code: the machinery of the `repro bench-*-authors` commands. Each paper's
`bench_authors.py` declares only what is its own: how to build their code and ours, its shapes, its extra options,
its row and its summary line.

Follows `repro.ops.bench` (training = forward, backward, clipping at 0.25 and an Adam step per segment, carrying
the memory; evaluation = forward passes without gradients carrying the evaluation memory; the matrix-product FLOPs
of one step at full memory counted by `repro.ops.timing.count_flops`) and differs in what it is for: two or more
codes take turns (theirs, ours, theirs, ours, … for `--rounds` rounds) with the same threads, the same tokens and
the same precision, so that a machine's drift hits all of them alike; each round's tokens/s is reported, and the
ratios round by round, never a ratio of two medians taken at different times.

- the device: `check_device` (a `--device` this process cannot time on is refused in one line), `device_name`;
- turns: `take_turns` (the order every side-by-side benchmark keeps), `interleaved_steps` (whole steps, warmed up
  once, each turn `repro.ops.timing.timed`), `interleaved` (segment codes in one process, each turn from an empty
  memory), `interleaved_processes` (each code in its own spawned process, with or without `repro.ops.allocator`'s
  policy) and `per_round` (the ratios);
- segment codes (`reset`, `detach`, `forward(x, y) -> loss`, `model`, `mem_len`): `SegmentCode` (ours: a model
  called as `repro.lm` calls it), `TimeMajorCode` (theirs: the `MemTransformerLM` family of
  kimiyoung/transformer-xl, which LaMemo, Transformer-MGK and the ∞-former's sorting code derive from),
  `time_segments`, `product_flops`, `token_stream`;
- the authors' code: `checkout_on_path` (a checkout's modules importable, unmodified, inside a block),
  `byte_masks_as_bool` (the run-time shim their `.byte()` masks need on today's torch);
- the command: `parser` (the options every side-by-side command takes), `main` (parse, check, run, append the JSON
  rows, print a line per row).

Imports torch and the light modules of `repro` only (`repro.ops.timing`, `repro.ops.allocator`, `repro.precision`), not
`repro.ops.bench`: a spawned process starts from this module, and Lightning (which `repro.ops.bench` brings) would
cost each of them seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch

from repro.ops.allocator import keep_freed_memory
from repro.ops.timing import autocast, count_flops, timed
from repro.precision import emulate_bf16_matmul

PRECISIONS = ("32", "bf16")


def check_device(prog: str, device: str) -> None:
    """A `--device` this process cannot use ends the command in one line, before anything is built."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SystemExit(f"{prog}: --device {device!r} is not a device; give cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{prog}: --device {device}: this torch ({torch.__version__}) sees no GPU; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"{prog}: --device {device}: only cpu and cuda are timed")


def device_name(device: str | torch.device) -> str:
    """What a row was measured on: the GPU's name, or `cpu`."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def take_turns(turns: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each turn once per round, in the order of `turns` (theirs, ours, theirs, ours, …): what each returned, per
    round."""
    results: dict[str, list[float]] = {name: [] for name in turns}
    for _ in range(rounds):
        for name, turn in turns.items():
            results[name].append(turn())
    return results


def per_round(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a / b in each round, to three decimals."""
    return [round(x / y, 3) for x, y in zip(a, b)]


def interleaved_steps(steps_of: dict[str, Callable[[], object]], device: torch.device, *, rounds: int, steps: int,
                      warmup: int, tokens_per_step: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """`warmup` untimed steps of every code in turn (on a GPU, each code's peak memory is measured over its own),
    then `rounds` rounds in which every code runs `steps` steps in turn. Returns (tokens/s per code and round, to
    0.1, peak MiB per code on a GPU, empty on a CPU). A step is whole: the code's precision, gradients and memory
    are its own."""
    peak = {}
    for name, step in steps_of.items():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        timed(step, warmup, device)
        if device.type == "cuda":
            peak[name] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    speeds = take_turns({name: partial(_tokens_per_s, step, steps, device, tokens_per_step)
                         for name, step in steps_of.items()}, rounds)
    return speeds, peak


def _tokens_per_s(step, steps: int, device: torch.device, tokens_per_step: int) -> float:
    return round(steps * tokens_per_step / timed(step, steps, device), 1)


class SegmentCode:
    """Ours: a segment-recurrent model called as `repro.lm` calls it, `model(x_BT, mems, mem_len=, kv_memory=) ->
    (hidden, mems)` and `model.nll(hidden, y_BT)`. `kv_memory`: the evaluation memory keeps keys and values
    (Transformer-XL's, `repro.lm`) rather than hidden states; give it for evaluation only."""

    def __init__(self, model: torch.nn.Module, *, mem_len: int, kv_memory: bool = False):
        self.model, self.mem_len, self.kv = model, mem_len, kv_memory
        self.mems = None

    def reset(self) -> None:
        self.mems = None

    def detach(self) -> None:
        self.mems = [m.detach() for m in self.mems]

    def forward(self, x_BT: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        h, self.mems = self.model(x_BT, self.mems, mem_len=self.mem_len, kv_memory=self.kv)
        return self.model.nll(h, y_BT).mean()


@contextmanager
def byte_masks_as_bool() -> Iterator[None]:
    """Their masks are `.byte()` tensors, which today's torch refuses in `masked_fill`: read as booleans inside the
    block (tests/parity/make_transformer_xl.py runs their model under it too; their code is not edited)."""
    byte = torch.Tensor.byte
    torch.Tensor.byte = lambda self: self.bool()
    try:
        yield
    finally:
        torch.Tensor.byte = byte


class TimeMajorCode:
    """Theirs: a `MemTransformerLM` of kimiyoung/transformer-xl's family (`pytorch/mem_transformer.py` and the
    repositories that copied it), run unmodified: tokens time-major, the memories passed after the target and
    returned after the loss (`unpack`, where a derived model returns more), `.byte()` masks as booleans."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.mem_len = model, model.mem_len
        self.mems: tuple = ()

    def reset(self) -> None:
        self.mems = ()

    def detach(self) -> None:
        self.mems = tuple(m.detach() for m in self.mems)

    def unpack(self, out) -> tuple[torch.Tensor, tuple]:
        """(loss, memories) of the model's output: `[loss] + memories` in kimiyoung/transformer-xl."""
        return out[0], tuple(out[1:])

    def forward(self, x_BT: torch.Tensor, y_BT: torch.Tensor) -> torch.Tensor:
        with byte_masks_as_bool():
            out = self.model(x_BT.t().contiguous(), y_BT.t().contiguous(), *self.mems)
        loss, self.mems = self.unpack(out)
        return loss.float().mean()


def token_stream(*, n_token: int, batch: int, segment: int, segments: int, device: str | torch.device = "cpu"
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`segments` consecutive (input, target) pairs of (batch, segment) tokens drawn uniformly with a fixed seed (on
    the CPU, so that every device gets the same tokens), on `device`."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, n_token, (batch, segments * segment + 1), generator=g, device="cpu").to(device)
    return [(tokens[:, i * segment:(i + 1) * segment], tokens[:, i * segment + 1:(i + 1) * segment + 1])
            for i in range(segments)]


def time_segments(code, stream, *, mode: str, precision: str, steps: int, warmup: int) -> float:
    """Tokens per second of `steps` segments after `warmup` others, the memory carried through all of them from an
    empty one, on the stream's device: a training step is forward, backward, clipping at 0.25 and an Adam step (the
    memory detached after it), an evaluation step a forward pass under `torch.inference_mode`."""
    model = code.model
    train = mode == "train"
    model.train(train)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4) if train else None
    device = stream[0][0].device
    cast = autocast(device, precision)
    grad = nullcontext() if train else torch.inference_mode()
    segments = iter(stream[: warmup + steps])
    code.reset()

    def step() -> None:
        x, y = next(segments)
        with grad, cast:
            loss = code.forward(x, y)
        if opt is not None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            opt.zero_grad(set_to_none=True)
            code.detach()

    for _ in range(warmup):
        step()
    b, t = stream[0][0].shape
    return b * t * steps / timed(step, steps, device)


def product_flops(code, stream, *, mode: str) -> int:
    """Floating-point operations of the matrix products in one step whose memory is full (the segment after
    ceil(memory / segment) others): forward, and in training the backward pass (clipping and Adam have none).
    Counted in float32 (the count does not depend on the precision); leaves the code reset, no gradient kept."""
    model = code.model
    train = mode == "train"
    model.train(train)
    t = stream[0][0].shape[1]
    full = -(-code.mem_len // t)
    if len(stream) <= full:
        raise ValueError(f"product_flops needs {full + 1} segments, got {len(stream)}")
    code.reset()
    grad = torch.enable_grad() if train else torch.no_grad()  # inference mode hides views from the counter

    def step(x, y) -> None:
        with grad:
            loss = code.forward(x, y)
            if train:
                loss.backward()
        if train:
            code.detach()

    for x, y in stream[:full]:
        step(x, y)
    counted = count_flops(lambda: step(*stream[full]), model)
    model.zero_grad(set_to_none=True)
    code.reset()
    return counted


def interleaved(codes: dict, stream, *, mode: str, precision: str, rounds: int, steps: int, warmup: int
                ) -> dict[str, list[float]]:
    """Tokens/s of every segment code in every round (`time_segments`), the codes taking turns in one process."""
    return take_turns({name: partial(time_segments, code, stream, mode=mode, precision=precision, steps=steps,
                                     warmup=warmup) for name, code in codes.items()}, rounds)


def _serve(conn, build: Callable[[], object], stream: dict, *, mode: str, precision: str, steps: int, warmup: int,
           threads: int, keep_freed: bool, device: str) -> None:
    """One code in its own process: built once, then timed whenever the parent asks (None ends it). Its first
    message is (parameter count, whether `repro.ops.allocator`'s policy is in force, product FLOPs per step)."""
    applied = keep_freed_memory() if keep_freed else False
    emulate_bf16_matmul()  # as the parent has it (every code alike): float32 products on a CPU without bf16 kernels
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    code = build()
    code.model.to(device)
    segments = token_stream(**stream, segments=warmup + steps, device=device)
    flops = product_flops(code, segments, mode=mode)
    conn.send((sum(p.numel() for p in code.model.parameters()), applied, flops))
    while conn.recv() is not None:
        conn.send(time_segments(code, segments, mode=mode, precision=precision, steps=steps, warmup=warmup))


def _ask(conn) -> float:
    conn.send("time")
    return conn.recv()


def interleaved_processes(codes: dict[str, tuple[Callable[[], object], bool]], *, stream: dict, mode: str,
                          precision: str, rounds: int, steps: int, warmup: int, threads: int, device: str = "cpu"
                          ) -> tuple[dict, dict, dict, dict]:
    """Tokens/s of every segment code in every round, taking turns, each in its own spawned process, so that each
    runs under the C allocator's policy it is given. `codes`: name → (a picklable function that builds the code, a
    module-level function or a `functools.partial` of one; whether its process keeps freed memory as `repro` does,
    `repro.ops.allocator`). `stream`: `token_stream`'s `n_token`, `batch` and `segment`. Returns (speeds,
    parameter counts, whether each process had the allocator policy in force, product FLOPs per step)."""
    ctx = mp.get_context("spawn")
    procs, conns, params, policy, flops = {}, {}, {}, {}, {}
    for name, (build, keep) in codes.items():
        parent, child = ctx.Pipe()
        procs[name] = ctx.Process(target=_serve, args=(child, build, stream), daemon=True,
                                  kwargs=dict(mode=mode, precision=precision, steps=steps, warmup=warmup,
                                              threads=threads, keep_freed=keep, device=device))
        procs[name].start()
        conns[name] = parent
    try:
        for name, conn in conns.items():
            params[name], policy[name], flops[name] = conn.recv()
        speeds = take_turns({name: partial(_ask, conn) for name, conn in conns.items()}, rounds)
    finally:
        for name, conn in conns.items():
            if procs[name].is_alive():
                conn.send(None)
            procs[name].join(timeout=30)
    return speeds, params, policy, flops


@contextmanager
def checkout_on_path(prog: str, checkout: Path, *, repository: str, folders: Sequence[str], module: str
                     ) -> Iterator[None]:
    """Inside the block, the modules of a checkout of `repository` import unmodified: `folders` (relative to the
    checkout; the first holds `module`.py, which is checked first) lead `sys.path`, and `torch.version.cuda` reads
    as a version on a CPU build (kimiyoung/transformer-xl's `utils/proj_adaptive_softmax.py`, copied by every
    derived repository, parses it at import). After the block, the path and the version are as before and every
    module imported from the folders is forgotten, so that another checkout's modules of the same names
    (`mem_transformer`, `utils`) import afresh; the objects built inside keep theirs."""
    root = Path(checkout).resolve()
    if not (root / folders[0] / f"{module}.py").is_file():
        raise SystemExit(f"{prog}: {checkout} has no {folders[0]}/{module}.py; pass a checkout of {repository} "
                         "with --checkout")
    paths = [str(root / f) for f in folders]
    for name in [n for n in sys.modules if n == module or n.startswith(f"{module}.")]:
        del sys.modules[name]  # imported from another checkout before this one
    before = set(sys.modules)
    sys.path[:0] = paths
    cuda = torch.version.cuda
    torch.version.cuda = cuda or "10.0"
    try:
        yield
    finally:
        torch.version.cuda = cuda
        for p in paths:
            sys.path.remove(p)
        for name in set(sys.modules) - before:
            if (getattr(sys.modules.get(name), "__file__", None) or "").startswith(tuple(paths)):
                del sys.modules[name]


def parser(prog: str, description: str, *, repository: str, codes: str, rounds: int, steps: int | None,
           warmup: int | None, steps_help: str | None = None, warmup_help: str | None = None
           ) -> argparse.ArgumentParser:
    """The options of every side-by-side command (`description`: the command module's docstring, whose first
    paragraph is shown); the paper's command adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=description.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help=f"a checkout of {repository}")
    p.add_argument("--precision", choices=PRECISIONS, default="32", help="32, or bf16 under torch.autocast")
    p.add_argument("--rounds", type=int, default=rounds, help="rounds of turns (default: %(default)s)")
    p.add_argument("--steps", type=int, default=steps,
                   help=steps_help or "timed steps per code and round (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=warmup,
                   help=warmup_help or "untimed steps per code first (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every code (default: %(default)s)")
    p.add_argument("--device", default="cpu", help=f"cpu or cuda[:N]: {codes} on it")
    p.add_argument("--output", type=Path, help="append the rows (one JSON line each) to this file")
    return p


def main(p: argparse.ArgumentParser, argv: list[str], run: Callable[[argparse.Namespace], list[dict]],
         describe: Callable[[dict], str], *, prepare: Callable[[argparse.Namespace], None] | None = None,
         keep_freed: bool = False) -> None:
    """The command: parse `argv`; `prepare` (the paper's checks and defaults that depend on other options); refuse in
    one line a count below 1 (`--rounds`, `--steps`, `--threads`, `--batch`), a negative `--warmup` and a device
    this process cannot time on, before any checkout is read; with `keep_freed`, the allocator policy of the
    `repro` command for this process (codes timed in it); then `run`, and each row appended to `--output` and
    summed up in one printed line."""
    a = p.parse_args(argv)
    if prepare is not None:
        prepare(a)
    for name in ("rounds", "steps", "threads", "batch"):
        if getattr(a, name, None) is not None and getattr(a, name) < 1:
            raise SystemExit(f"{p.prog}: --{name} must be at least 1, got {getattr(a, name)}")
    if a.warmup is not None and a.warmup < 0:
        raise SystemExit(f"{p.prog}: --warmup must be at least 0, got {a.warmup}")
    check_device(p.prog, a.device)
    if keep_freed:
        keep_freed_memory()
    for row in run(a):
        if a.output:
            with a.output.open("a") as f:
                f.write(json.dumps(row) + "\n")
        print(describe(row), flush=True)
