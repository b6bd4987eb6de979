"""The commands the memory arena adds to `repro` (pyproject.toml's `repro.commands` entry points, collected by
`repro.cli.registry`): `repro arena-budget PROFILE`, the equal-FLOPs configs of the profile's contestants
(`papers.arena.budget`). Importing this module imports neither torch nor the arena."""

from __future__ import annotations

from papers.arena import budget


def arena_budget(argv: list[str]) -> None:
    budget.main(argv)


HELP = "the arena's contestants at Transformer-XL's training FLOPs per token (±5%): configs NAME_eqflops.yaml"

COMMANDS = {"arena-budget": (arena_budget, HELP)}
