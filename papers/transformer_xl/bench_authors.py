"""Transformer-XL's speed side by side with the authors' code: `repro bench-txl-authors --checkout PATH`.

Follows `repro.ops.bench` (training = forward, backward, clipping at 0.25 and an Adam step per segment, carrying the
memory; evaluation = forward passes without gradients carrying the evaluation memory), applied to two models of the
same shape: ours (`papers.transformer_xl.model.TransformerXL`) and the official `MemTransformerLM`
(kimiyoung/transformer-xl `pytorch/mem_transformer.py`) imported from a checkout and run unmodified, with the
run-time shims of `tests/parity/make_transformer_xl.py` only (`torch.version.cuda` set for its import, `.byte()`
masks as booleans). Differs from `repro bench` in what it is for: the two codes take turns (theirs, ours,
theirs, ours, … for `--rounds` rounds) with the same thread count, the same token stream and the same precision,
so that a machine's drift hits both; the ratio of each round is reported, and the range over rounds. Each code
lives in its own process, so that each runs with the C allocator's policy it is run with: ours with
`repro.ops.allocator`'s (as the `repro` command sets it), theirs with the C library's default (as their `train.py`
runs), or with ours too (`--same-allocator`). `interleaved` is the one-process form (`bench-lamemo-authors`).

The row also says where each code's time goes against the machine: the floating-point operations of the matrix
products of one step with a full memory (`torch.utils.flop_counter`: forward, and backward in training), each
round's product GFLOP/s that follows from the tokens/s, and the share of what this process measures a square
product (n = 2048) to reach in the same precision, the same threads and the same autocast (on a CPU without bf16
kernels, `repro.precision`'s float32 products). A code whose share is near 1 is bound by the products themselves.

Shapes (issue 15's table): `enwik8_12l` (41M: 12 layers, width 512, 8 heads of 64, inner 2048, 204 symbols,
batch 2, segment = memory = 512, dropout 0.1) and `small` (4 layers, width 128, 4 heads of 32, inner 512, the
4,720-word vocabulary of `embedded-word`, batch 16, segment = memory = 128, dropout 0.1). Evaluation keeps the
shape with memory = segment, no clamp and no same_length. bf16 is `torch.autocast` on both. `--device cuda` runs
both on a GPU (the clock starts and stops with the GPU's queue drained) and `--batch` replaces the shape's batch
(e.g. the paper's 22 sequences per step, which a GPU needs to be measured doing more than launching kernels).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
# imported before `_official` sets torch.version.cuda for the authors' import, which would make it warn on the
# terminal that a CPU build has no triton
from torch.utils.flop_counter import FlopCounterMode

SHAPES = {
    "enwik8_12l": dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, n_token=204, batch=2, tgt=512,
                       mem=512),
    "small": dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, n_token=4720, batch=16, tgt=128,
                  mem=128),
}
DROPOUT = 0.1


@contextmanager
def _shims():
    byte = torch.Tensor.byte
    torch.Tensor.byte = lambda self: self.bool()
    try:
        yield
    finally:
        torch.Tensor.byte = byte


def _official(checkout: Path):
    source = checkout / "pytorch"
    if not (source / "mem_transformer.py").is_file():
        raise SystemExit(f"repro bench-txl-authors: {checkout} has no pytorch/mem_transformer.py; "
                         "pass a checkout of kimiyoung/transformer-xl with --checkout")
    torch.version.cuda = torch.version.cuda or "10.0"  # its adaptive softmax parses the CUDA version at import
    sys.path[:0] = [str(source), str(source / "utils")]
    try:
        import mem_transformer  # noqa: PLC0415
    finally:
        del sys.path[:2]
    return mem_transformer


class _Theirs:
    def __init__(self, mt, s: dict, mode: str):
        self.model = mt.MemTransformerLM(s["n_token"], s["n_layer"], s["n_head"], s["d_model"], s["d_head"],
                                         s["d_inner"], DROPOUT, 0.0, tie_weight=True, d_embed=None, div_val=1,
                                         tie_projs=[False], pre_lnorm=False, tgt_len=s["tgt"], ext_len=0,
                                         mem_len=s["mem"], cutoffs=[], same_length=False, attn_type=0,
                                         clamp_len=-1)
        self.mems: tuple = ()

    def reset(self):
        self.mems = ()

    def detach(self):
        self.mems = tuple(m.detach() for m in self.mems)

    def forward(self, x_BT, y_BT):
        with _shims():
            out = self.model(x_BT.t().contiguous(), y_BT.t().contiguous(), *self.mems)
        self.mems = tuple(out[1:])
        return out[0].float().mean()


class _Ours:
    def __init__(self, s: dict, mode: str, model=None, kv_memory: bool = True):
        from papers.transformer_xl.model import TransformerXL, TransformerXLConfig

        self.model = model or TransformerXL(TransformerXLConfig(
            n_layer=s["n_layer"], d_model=s["d_model"], n_head=s["n_head"], d_head=s["d_head"],
            d_inner=s["d_inner"], n_token=s["n_token"], dropout=s.get("dropout", DROPOUT), dropatt=0.0))
        # our Transformer-XL evaluation keeps keys and values (repro.lm); a model without that memory keeps states
        self.mem_len, self.kv = s["mem"], mode == "eval" and kv_memory
        self.mems = None

    def reset(self):
        self.mems = None

    def detach(self):
        self.mems = [m.detach() for m in self.mems]

    def forward(self, x_BT, y_BT):
        h, self.mems = self.model(x_BT, self.mems, mem_len=self.mem_len, kv_memory=self.kv)
        return self.model.nll(h, y_BT).mean()


def _sync(device: torch.device) -> None:
    """`repro.ops.bench`'s clock barrier, repeated here: importing `repro.ops.bench` brings Lightning into each timed
    process, and with it a torch warning ("triton not found; flop counting …") on the terminal."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(code, stream, *, mode: str, precision: str, steps: int, warmup: int) -> float:
    """Tokens per second of `steps` segments after `warmup` (the memory carried through all of them), on the
    stream's device (a GPU's queue is drained before the clock starts and before it is read)."""
    model = code.model
    model.train(mode == "train")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4) if mode == "train" else None
    device = stream[0][0].device
    cast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    code.reset()
    grad = nullcontext() if mode == "train" else torch.inference_mode()
    b, t = stream[0][0].shape
    start = 0.0
    for i, (x, y) in enumerate(stream[: warmup + steps]):
        if i == warmup:
            _sync(device)
            start = time.perf_counter()
        with grad, cast:
            loss = code.forward(x, y)
        if opt is not None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            opt.zero_grad(set_to_none=True)
            code.detach()
    _sync(device)
    return b * t * steps / (time.perf_counter() - start)


def product_flops(code, stream, *, mode: str) -> int:
    """Floating-point operations of the matrix products in one step whose memory is full (the segment after
    ceil(memory / segment) others): forward, and in training the backward pass (clipping and Adam have none).
    Counted in float32 (the count does not depend on the precision); leaves the code reset, no gradient kept."""
    model = code.model
    model.train(mode == "train")
    b, t = stream[0][0].shape
    full = -(-code_memory(code) // t)
    if len(stream) <= full:
        raise ValueError(f"product_flops needs {full + 1} segments, got {len(stream)}")
    code.reset()
    grad = torch.enable_grad() if mode == "train" else torch.no_grad()  # inference mode hides views from the counter
    counted = 0
    for i, (x, y) in enumerate(stream[: full + 1]):
        counter = FlopCounterMode(display=False) if i == full else nullcontext()
        with grad, counter:
            loss = code.forward(x, y)
            if mode == "train":
                loss.backward()
        if i == full:
            counted = counter.get_total_flops()
        if mode == "train":
            code.detach()
    model.zero_grad(set_to_none=True)
    code.reset()
    return counted


def code_memory(code) -> int:
    """The memory length a code carries (both codes keep it as `mem_len`)."""
    return code.mem_len if isinstance(code, _Ours) else code.model.mem_len


def matmul_rate(precision: str, device: str = "cpu", n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of an (n, n) × (n, n) product in `precision` (bf16: under autocast, as the timed steps), best of
    `reps` after one warm-up, with this process's threads."""
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dev) for _ in range(2))
    cast = torch.autocast(dev.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    best = float("inf")
    with torch.no_grad(), cast:
        for i in range(reps + 1):
            _sync(dev)
            t0 = time.perf_counter()
            a @ b
            _sync(dev)
            if i:
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def token_stream(s: dict, n: int, device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n segments (input, target) of (batch, segment) tokens drawn uniformly with a fixed seed (on the CPU, the
    same tokens whatever the device), on `device`."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, s["n_token"], (s["batch"], n * s["tgt"] + 1), generator=g, device="cpu").to(device)
    return [(tokens[:, i * s["tgt"]:(i + 1) * s["tgt"]], tokens[:, i * s["tgt"] + 1:(i + 1) * s["tgt"] + 1])
            for i in range(n)]


def interleaved(codes: dict, stream, *, mode: str, precision: str, rounds: int, steps: int, warmup: int
                ) -> dict[str, list[float]]:
    """Tokens/s of every code in every round, the codes taking turns within each round."""
    speeds: dict[str, list[float]] = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            speeds[name].append(_time(code, stream, mode=mode, precision=precision, steps=steps, warmup=warmup))
    return speeds


def _build(which: str, checkout: Path, s: dict, mode: str):
    return _Theirs(_official(checkout), s, mode) if which == "theirs" else _Ours(s, mode)


def _serve(conn, which: str, checkout: Path | None, s: dict, mode: str, precision: str, steps: int, warmup: int,
           threads: int, keep_freed: bool, device: str = "cpu") -> None:
    """One code in its own process: built once, then timed whenever the parent asks (None ends it). Its first
    message is (parameter count, whether `repro.ops.allocator`'s policy is in force)."""
    applied = False
    if keep_freed:
        from repro.ops.allocator import keep_freed_memory  # noqa: PLC0415

        applied = keep_freed_memory()
    from repro.precision import emulate_bf16_matmul  # noqa: PLC0415

    emulate_bf16_matmul()  # as the parent has it (both codes alike): float32 products on a CPU without bf16 kernels
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    code = _build(which, checkout, s, mode)
    code.model.to(device)
    stream = token_stream(s, warmup + steps, device)
    flops = product_flops(code, stream, mode=mode)
    conn.send((sum(p.numel() for p in code.model.parameters()), applied, flops))
    while conn.recv() is not None:
        conn.send(_time(code, stream, mode=mode, precision=precision, steps=steps, warmup=warmup))


def interleaved_processes(codes: dict[str, tuple[str, bool]], checkout: Path | None, s: dict, *, mode: str,
                          precision: str, rounds: int, steps: int, warmup: int, threads: int,
                          device: str = "cpu") -> tuple[dict, dict, dict, dict]:
    """Tokens/s of every code in every round, taking turns, each in its own (spawned) process. `codes`: name →
    (`"theirs"` or `"ours"`, whether the process keeps freed memory as `repro` does, `repro.ops.allocator`). Returns
    (speeds, parameter counts, whether each process had the allocator policy in force, product FLOPs per step)."""
    import multiprocessing as mp  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    procs, conns, params, policy, flops = {}, {}, {}, {}, {}
    for name, (which, keep) in codes.items():
        parent, child = ctx.Pipe()
        procs[name] = ctx.Process(target=_serve, args=(child, which, checkout, s, mode, precision, steps, warmup,
                                                       threads, keep, device), daemon=True)
        procs[name].start()
        conns[name] = parent
    try:
        for name, conn in conns.items():
            params[name], policy[name], flops[name] = conn.recv()
        speeds: dict[str, list[float]] = {name: [] for name in conns}
        for _ in range(rounds):
            for name, conn in conns.items():
                conn.send("time")
                speeds[name].append(conn.recv())
    finally:
        for name, conn in conns.items():
            if procs[name].is_alive():
                conn.send(None)
            procs[name].join(timeout=30)
    return speeds, params, policy, flops


def run(checkout: Path, *, shape: str, mode: str, precision: str, rounds: int, steps: int, warmup: int,
        threads: int, same_allocator: bool = False, device: str = "cpu", batch: int | None = None) -> dict:
    s = dict(SHAPES[shape], batch=batch or SHAPES[shape]["batch"])
    _official(checkout)  # a bad checkout fails here, in one line, before any process starts
    codes = {"theirs": ("theirs", same_allocator), "ours": ("ours", True)}  # theirs as their train.py runs
    speeds, params, policy, flops = interleaved_processes(codes, checkout, s, mode=mode, precision=precision,
                                                          rounds=rounds, steps=steps, warmup=warmup, threads=threads,
                                                          device=device)
    ratios = [o / t for o, t in zip(speeds["ours"], speeds["theirs"])]
    torch.set_num_threads(threads)
    peak = matmul_rate(precision, device)  # after the rounds, in this process: no code is running beside it
    tokens = s["batch"] * s["tgt"]
    rates = {k: [flops[k] * v / tokens / 1e9 for v in vs] for k, vs in speeds.items()}
    return {"shape": shape, "mode": mode, "precision": precision, "threads": threads, "rounds": rounds,
            "steps": steps, "warmup": warmup, "batch": s["batch"], "segment": s["tgt"], "memory": s["mem"],
            "allocator": {k: "repro (freed memory kept)" if v else "C library default" for k, v in policy.items()},
            "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in speeds.items()},
            "ratio": [round(r, 3) for r in ratios], "ratio_median": round(statistics.median(ratios), 3),
            "parameters": params, "device": device_name(device), "torch": torch.__version__,
            "product_gflop_per_step": {k: round(v / 1e9, 3) for k, v in flops.items()},
            "product_gflop_per_s": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
            "matmul_gflop_per_s": round(peak, 1),
            "product_share": {k: [round(v / peak, 3) for v in vs] for k, vs in rates.items()}}


def device_name(device: str) -> str:
    """What a row was measured on: the GPU's name, or `cpu`."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


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


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="repro bench-txl-authors", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, required=True, help="a checkout of kimiyoung/transformer-xl")
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--mode", choices=["train", "eval"], default="train")
    p.add_argument("--precision", choices=["32", "bf16"], default="32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: both codes on it")
    p.add_argument("--batch", type=int, help="sequences per step instead of the shape's (e.g. a GPU's batch)")
    p.add_argument("--same-allocator", action="store_true",
                   help="run theirs with our allocator policy too (repro.ops.allocator); default: the C library's")
    p.add_argument("--output", type=Path, help="append the row (one JSON line) to this file")
    a = p.parse_args(argv)
    check_device(p.prog, a.device)
    row = run(a.checkout, shape=a.shape, mode=a.mode, precision=a.precision, rounds=a.rounds, steps=a.steps,
              warmup=a.warmup, threads=a.threads, same_allocator=a.same_allocator, device=a.device,
              batch=a.batch)
    if a.output:
        with a.output.open("a") as f:
            f.write(json.dumps(row) + "\n")
    tps = row["tokens_per_s"]
    print(f"{a.shape} {a.mode} {a.precision}: ours {'/'.join(f'{v:.0f}' for v in tps['ours'])} tokens/s, "
          f"theirs {'/'.join(f'{v:.0f}' for v in tps['theirs'])} → {'–'.join(f'{r:.2f}' for r in row['ratio'])}×",
          flush=True)
    per_step, share = row["product_gflop_per_step"], row["product_share"]
    print(f"  matrix products: ours {per_step['ours']:.2f}, theirs {per_step['theirs']:.2f} GFLOP per step; "
          f"{'–'.join(f'{v:.0%}' for v in share['ours'])} and {'–'.join(f'{v:.0%}' for v in share['theirs'])} of "
          f"a 2048² product's {row['matmul_gflop_per_s']:.0f} GFLOP/s here", flush=True)
