"""The commands Transformer-MGK adds to `repro` (listed in pyproject.toml's `repro.commands` entry points and
collected by `repro.cli.registry`): `repro bench-attention`, the cost of the attention variants across lengths
(`papers.mgk.efficiency`). Importing this module imports neither torch nor the benchmark."""

from __future__ import annotations


def bench_attention(argv: list[str]) -> None:
    import argparse

    from papers.mgk import efficiency

    parser = argparse.ArgumentParser(prog="repro bench-attention", description=HELP)
    efficiency.add_arguments(parser)
    efficiency.main(parser.parse_args(argv))


HELP = "parameters, FLOPs, step time and activation memory of attention variants across lengths (JSON lines)"

COMMANDS = {"bench-attention": (bench_attention, HELP)}
