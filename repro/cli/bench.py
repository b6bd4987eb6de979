"""`repro bench`: speed and memory of a config's model (train, eval, or Transformer-XL's Table 9 slowdown), or of
several models side by side (`--compare`), or one model under several variants side by side (`--variants`: the
attention kernel, compilation, the optimiser's form).

The measurement is library code in `repro.ops.bench` (`bench_module`, on a built module and data module); this
module builds them from the config files (`repro.cli.cli.build`), applies the rehearsal's settings, and writes
one JSON line per row.
"""

from __future__ import annotations

import json

import torch

from repro.io import atomic_write_text
from repro.nn.attention import KERNELS


def bench(config: list[str], *, mode: str, precision: str = "32", steps: int = 10, warmup: int = 3,
          batch_size: int | None = None, tgt_len: int | None = None, device: str | None = None,
          attention_lengths: list[int] | None = None, segment: int = 32, overrides: list[str] | None = None,
          compile: bool = False, attention: str = "auto") -> list[dict]:
    """The rows of `repro bench` for config files merged in order (then `overrides`, CLI arguments)."""
    from repro.cli.cli import build  # heavy: Lightning
    from repro.ops.bench import bench_module  # heavy: Lightning

    if precision not in ("32", "bf16"):
        raise ValueError("--precision is 32 or bf16")
    cli = build(config, overrides)
    return bench_module(cli.model, cli.datamodule, config=config, mode=mode, precision=precision, steps=steps,
                        warmup=warmup, batch_size=batch_size, tgt_len=tgt_len, device=device,
                        attention_lengths=attention_lengths, segment=segment, compile=compile, attention=attention)


def compare(models: list[list[str]], *, mode: str, rounds: int = 2, overrides: list[str] | None = None,
            **kw) -> list[dict]:
    """`repro bench --compare`: each entry of `models` (config files merged in order) is one model; all are built
    first, then timed in turns (A, B, …, A, B, … for `rounds` rounds) in one process with the same settings, so
    that a machine's drift hits every model alike (a shared CPU varies by 2× over minutes; timed one after another
    in separate processes the models' ratio moved as much). Each row has its `round` and its speed relative to the
    first model's in the same round (`relative`)."""
    from repro.cli.cli import build  # heavy: Lightning
    from repro.ops.bench import bench_module  # heavy: Lightning

    if mode == "slowdown":
        raise ValueError("--compare times train or eval, not slowdown")
    built = [(cfgs, build(cfgs, overrides)) for cfgs in models]
    rows = []
    for r in range(1, rounds + 1):
        first = None
        for cfgs, cli in built:
            torch.manual_seed(0)
            row = bench_module(cli.model, cli.datamodule, config=cfgs, mode=mode, **kw)[0]
            first = first or row["tokens_per_s"]
            rows.append(row | {"round": r, "relative": round(row["tokens_per_s"] / first, 3)})
    return rows


def parse_variant(spec: str) -> dict:
    """`repro bench --variants`: a variant is an attention kernel with optional `+compile` or `+cudagraphs` (compiled
    with mode reduce-overhead: CUDA graphs on a GPU), `+whole` (one graph of the whole model's forward rather than
    one per decoder layer) and `+foreach` (the optimiser's multi-tensor form instead of the module's), e.g.
    `eager+foreach`, `sdpa+compile`, `sdpa+cudagraphs+whole`."""
    kernel, *flags = spec.split("+")
    unknown = [f for f in flags if f not in ("compile", "cudagraphs", "whole", "foreach")]
    compiles = {"compile", "cudagraphs"} & set(flags)
    if kernel not in KERNELS or unknown or len(compiles) > 1 or ("whole" in flags and not compiles):
        raise ValueError(f"variant {spec!r}: an attention kernel ({', '.join(KERNELS)}) and optionally "
                         "+compile or +cudagraphs (with +whole: one graph of the whole model), +foreach")
    compiled = "reduce-overhead" if "cudagraphs" in flags else "compile" in flags
    if "whole" in flags:
        compiled = ("reduce-overhead" if compiled == "reduce-overhead" else "default") + "+whole"
    return {"attention": kernel, "compile": compiled, "optimizer": "foreach" if "foreach" in flags else "module"}


def variants(config: list[str], specs: list[str], *, mode: str, rounds: int = 2,
             overrides: list[str] | None = None, **kw) -> list[dict]:
    """`repro bench --variants`: one model, timed under each variant in turns over `rounds` rounds (as
    `--compare` does for models), each row with its `variant`, `round` and speed relative to the first variant's
    in the same round. A compiled variant's graphs are built in its first round's warm-up and reused after."""
    from repro.cli.cli import build  # heavy: Lightning
    from repro.ops.bench import bench_module  # heavy: Lightning

    if mode == "slowdown":
        raise ValueError("--variants times train or eval, not slowdown")
    parsed = [(spec, parse_variant(spec)) for spec in specs]
    cli = build(config, overrides)
    rows = []
    for r in range(1, rounds + 1):
        first = None
        for spec, options in parsed:
            torch.manual_seed(0)
            row = bench_module(cli.model, cli.datamodule, config=config, mode=mode, **options, **kw)[0]
            first = first or row["tokens_per_s"]
            rows.append(row | {"variant": spec, "round": r, "relative": round(row["tokens_per_s"] / first, 3)})
            print(f"round {r}: {spec} {mode} {row['tokens_per_s']:,.0f} tokens/s ({rows[-1]['relative']:.2f}× the "
                  f"first){_mfu(row)}, peak {row['peak_memory_mb']:,.0f} MB", flush=True)
            if row.get("device_busy") is not None:
                print(f"  GPU busy {row['device_busy']:.0%} of the profiled steps' wall time", flush=True)
            for op in row.get("profile", []):
                print(f"  {op['ms_per_step']:9.3f} ms/step {op['calls_per_step']:5d}× {op['name']}", flush=True)
    return rows


def _mfu(row: dict) -> str:
    return f", MFU {row['mfu']:.1%} of {row['peak_tflop_per_s']:g} TFLOP/s" if "mfu" in row else ""


def main(args) -> None:
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    if getattr(args, "rehearsal", "false") == "true":  # the code path at the paper's sizes, not a measurement
        args.steps, args.warmup, args.batch_size = 1, 0, args.batch_size or 2
    if args.variants:
        rows = variants(args.config, args.variants.split(","), mode=args.mode, rounds=args.rounds,
                        overrides=args.override, precision=args.precision, steps=args.steps, warmup=args.warmup,
                        batch_size=args.batch_size, tgt_len=args.tgt_len, device=args.device,
                        profile=args.profile)
    elif args.compare:
        rows = compare([c.split(",") for c in args.config], mode=args.mode, rounds=args.rounds,
                       overrides=args.override, precision=args.precision, steps=args.steps, warmup=args.warmup,
                       batch_size=args.batch_size, tgt_len=args.tgt_len, device=args.device,
                       compile=args.compile, attention=args.attention)
        for row in rows:  # one line per model and round for people; the JSON lines below or in --output
            print(f"round {row['round']}: {'+'.join(row['config'])} {row['mode']} {row['tokens_per_s']:,.0f} tokens/s "
                  f"({row['relative']:.2f}× the first){_mfu(row)}", flush=True)
    else:
        rows = bench(args.config, mode=args.mode, precision=args.precision, steps=args.steps, warmup=args.warmup,
                     batch_size=args.batch_size, tgt_len=args.tgt_len, device=args.device,
                     attention_lengths=[int(x) for x in args.attention_lengths.split(",")] if args.attention_lengths
                     else None, segment=args.segment, overrides=args.override, compile=args.compile,
                     attention=args.attention)
    if getattr(args, "rehearsal", "false") == "true":
        rows = [{**r, "rehearsal": True} for r in rows]
    lines = [json.dumps(r) for r in rows]
    if args.output:  # the rows go to the file; the terminal gets one line
        atomic_write_text(args.output, "\n".join(lines) + "\n")
        print(f"repro bench: {len(lines)} row{'s' * (len(lines) != 1)} in {args.output}", flush=True)
    else:
        for line in lines:
            print(line, flush=True)
