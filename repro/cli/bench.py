"""`repro bench`: speed and memory of a config's model (train, eval, or Transformer-XL's Table 9 slowdown).

The measurement is library code in `repro.bench` (`bench_module`, on a built module and data module); this
module builds them from the config files (`repro.cli.cli.build`), applies the rehearsal's settings, and writes
one JSON line per row.
"""

from __future__ import annotations

import json

import torch


def bench(config: list[str], *, mode: str, precision: str = "32", steps: int = 10, warmup: int = 3,
          batch_size: int | None = None, tgt_len: int | None = None, device: str | None = None,
          attention_lengths: list[int] | None = None, segment: int = 32, overrides: list[str] | None = None) -> list[dict]:
    """The rows of `repro bench` for config files merged in order (then `overrides`, CLI arguments)."""
    from repro.bench import bench_module
    from repro.cli.cli import build

    if precision not in ("32", "bf16"):
        raise ValueError("--precision is 32 or bf16")
    cli = build(config, overrides)
    return bench_module(cli.model, cli.datamodule, config=config, mode=mode, precision=precision, steps=steps,
                        warmup=warmup, batch_size=batch_size, tgt_len=tgt_len, device=device,
                        attention_lengths=attention_lengths, segment=segment)


def main(args) -> None:
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    if getattr(args, "rehearsal", "false") == "true":  # the code path at the paper's sizes, not a measurement
        args.steps, args.warmup, args.batch_size = 1, 0, args.batch_size or 2
    rows = bench(args.config, mode=args.mode, precision=args.precision, steps=args.steps, warmup=args.warmup,
                 batch_size=args.batch_size, tgt_len=args.tgt_len, device=args.device,
                 attention_lengths=[int(x) for x in args.attention_lengths.split(",")] if args.attention_lengths else None,
                 segment=args.segment, overrides=args.override)
    if getattr(args, "rehearsal", "false") == "true":
        rows = [{**r, "rehearsal": True} for r in rows]
    lines = [json.dumps(r) for r in rows]
    if args.output:  # the rows go to the file; the terminal gets one line
        from repro.io import atomic_write_text

        atomic_write_text(args.output, "\n".join(lines) + "\n")
        print(f"repro bench: {len(lines)} row{'s' * (len(lines) != 1)} in {args.output}", flush=True)
    else:
        for line in lines:
            print(line, flush=True)
