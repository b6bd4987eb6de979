"""The commands the ∞-former adds to `repro` (listed in pyproject.toml's `repro.commands` entry points and
collected by `repro.cli.registry`): `repro bench-context`, the cost of one segment as the context grows, against
Transformer-XL (`papers.infinity_former.context_cost`), `repro ltm-gain`, whether a config's long-term memory
stays bounded over updates (`papers.infinity_former.stability`), and `repro bench-infinity-former-authors`, the
whole sorting model against the authors' code (`papers.infinity_former.bench_authors`). Importing this module
imports neither torch nor the commands' modules."""

from __future__ import annotations

import argparse

from papers.infinity_former import stability


def bench_context(argv: list[str]) -> None:
    from papers.infinity_former import context_cost  # heavy: Lightning

    parser = argparse.ArgumentParser(prog="repro bench-context", description=HELP)
    context_cost.add_arguments(parser)
    context_cost.main(parser.parse_args(argv))


def ltm_gain(argv: list[str]) -> None:
    stability.main(argv)


def bench_authors(argv: list[str]) -> None:
    from papers.infinity_former import bench_authors as bench  # heavy: Lightning

    bench.main(argv)


HELP = "time and memory per segment as the context grows (∞-former vs TXL)"
GAIN_HELP = "the LTM update's gain per update for each config (> 1: the memory grows without bound)"

AUTHORS_HELP = "the whole ∞-former (sorting, or GPT-2 with the LTM) against the authors' code, training tokens/s"

COMMANDS = {"bench-context": (bench_context, HELP), "ltm-gain": (ltm_gain, GAIN_HELP),
            "bench-infinity-former-authors": (bench_authors, AUTHORS_HELP)}
