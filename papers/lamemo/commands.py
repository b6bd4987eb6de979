"""The commands LaMemo adds to `repro` (pyproject.toml's `repro.commands` entry points, collected by
`repro.cli.registry`): `repro bench-lamemo-authors`, LaMemo's cost against Transformer-XL's in ours and in the
authors' code side by side (`papers.lamemo.bench_authors`). Importing this module imports neither torch nor the
benchmark."""

from __future__ import annotations


def bench_lamemo_authors(argv: list[str]) -> None:
    from papers.lamemo import bench_authors  # heavy: torch

    bench_authors.main(argv)


HELP = "LaMemo / Transformer-XL tokens/s in ours and in thu-coai/LaMemo, interleaved (needs a checkout)"

COMMANDS = {"bench-lamemo-authors": (bench_lamemo_authors, HELP)}
