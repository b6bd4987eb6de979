"""The commands Transformer-XL adds to `repro` (pyproject.toml's `repro.commands` entry points, collected by
`repro.cli.registry`): `repro bench-txl-authors`, its speed side by side with the authors' code
(`papers.transformer_xl.bench_authors`). Importing this module imports neither torch nor the benchmark."""

from __future__ import annotations


def bench_txl_authors(argv: list[str]) -> None:
    from papers.transformer_xl import bench_authors  # heavy: torch

    bench_authors.main(argv)


HELP = "training/evaluation tokens/s of ours and the official MemTransformerLM, interleaved (needs a checkout)"

COMMANDS = {"bench-txl-authors": (bench_txl_authors, HELP)}
