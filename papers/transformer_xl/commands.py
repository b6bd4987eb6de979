"""The commands Transformer-XL adds to `repro` (pyproject.toml's `repro.commands` entry points, collected by
`repro.cli.registry`): `repro bench-txl-authors`, its speed side by side with the authors' code
(`papers.transformer_xl.bench_authors`), and `repro released download|evaluate NAME`, the authors' released
models (`papers.transformer_xl.released`). Importing this module imports neither torch nor those modules."""

from __future__ import annotations


def bench_txl_authors(argv: list[str]) -> None:
    from papers.transformer_xl import bench_authors  # heavy: torch

    bench_authors.main(argv)


def released(argv: list[str]) -> None:
    from papers.transformer_xl import released as module  # heavy: torch

    module.main(argv)


HELP = "training/evaluation tokens/s of ours and the official MemTransformerLM, interleaved (needs a checkout)"

COMMANDS = {"bench-txl-authors": (bench_txl_authors, HELP),
            "released": (released, "the authors' released models: download (checksummed) or evaluate NAME")}
