"""The commands Transformer-MGK adds to `repro` (listed in pyproject.toml's `repro.commands` entry points and
collected by `repro.cli.registry`): `repro bench-attention`, the cost of the attention variants across lengths
(`papers.mgk.efficiency`), `repro bench-mgk-authors`, one decoder layer against the authors' code
(`papers.mgk.bench_authors`), and `repro bench-sdpa`, our attention layers against their SDPA forms
(`papers.mgk.bench_sdpa`). Importing this module imports neither torch nor the benchmarks."""

from __future__ import annotations

import argparse


def bench_attention(argv: list[str]) -> None:
    from papers.mgk import efficiency  # heavy: torch

    parser = argparse.ArgumentParser(prog="repro bench-attention", description=HELP)
    efficiency.add_arguments(parser)
    efficiency.main(parser.parse_args(argv))


HELP = "parameters, FLOPs, step time and activation memory of attention variants across lengths (JSON lines)"



def bench_mgk_authors(argv: list[str]) -> None:
    from papers.mgk import bench_authors  # heavy: torch

    bench_authors.main(argv)


HELP_AUTHORS = "one decoder layer at the WikiText-103 paper shape, ours against the official code (tokens/s)"



def bench_sdpa(argv: list[str]) -> None:
    from papers.mgk import bench_sdpa as bench  # heavy: torch

    bench.main(argv)


HELP_SDPA = "softmax-8 and MGK-4 attention layers, ours against the same layers through SDPA (ms per step)"

COMMANDS = {"bench-attention": (bench_attention, HELP), "bench-mgk-authors": (bench_mgk_authors, HELP_AUTHORS),
            "bench-sdpa": (bench_sdpa, HELP_SDPA)}
