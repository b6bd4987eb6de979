"""What each paper adds to `repro`: its commands and its tables, one registry filled from two entry-point groups.

A paper lists its commands in `papers/<paper>/commands.py` as `COMMANDS = {name: (run, help)}` — `run` takes the
command's arguments (`argv` after the name) and `help` is one line for `repro --help` — and pyproject.toml names
that dict under `[project.entry-points."repro.commands"]`, one entry per paper (`mgk =
"papers.mgk.commands:COMMANDS"`). The entry point (`repro.cli.entry`) collects them here, so that no module under
`repro/` imports `papers` (the shared layer depends on no paper; tests/test_layout.py checks it). The names come
from the installed package's metadata; a checkout whose install predates an entry (an editable install not rerun
after pulling, or a stale `*.egg-info` at the root that shadows it) reads them from its own pyproject.toml.

A paper's tables (`papers/<paper>/tables.py`: `build(results) -> list[Table]`, and optionally `PAPER_PARAMS`, the
published parameter counts) are named the same way under `[project.entry-points."repro.tables"]`: `repro tables
PAPER` and `repro describe` find them here, never through a module name built from a string.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

GROUP = "repro.commands"
TABLES = "repro.tables"

Command = tuple[Callable[[list[str]], None], str]


def _declared(group: str = GROUP) -> list[tuple[str, str]]:
    """(paper, "module:attribute") of every entry of the group, in the order declared."""
    found = [(ep.name, ep.value) for ep in entry_points(group=group)]
    if found:
        return found

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    return list(project.get("entry-points", {}).get(group, {}).items())


def paper_commands() -> dict[str, dict[str, Command]]:
    """{paper: {command name: (run, help)}}: every paper's commands, papers in the order pyproject declares them."""
    out: dict[str, dict[str, Command]] = {}
    owner: dict[str, str] = {}
    for paper, target in _declared():
        module, _, attr = target.partition(":")
        commands = getattr(importlib.import_module(module), attr or "COMMANDS")
        for name in commands:
            if name in owner:
                raise ValueError(f"command {name!r} is declared by both {owner[name]} and {paper}: rename one in "
                                 f"papers/{paper}/commands.py")
            owner[name] = paper
        out[paper] = dict(commands)
    return out


def table_papers() -> list[str]:
    """The papers that declare tables, in the order pyproject declares them."""
    return [paper for paper, _ in _declared(TABLES)]


def paper_tables(paper: str):
    """The tables module of `paper` (its `build`, and `PAPER_PARAMS` where it has one); a paper without tables is
    an error that names those with tables."""
    targets = dict(_declared(TABLES))
    if paper not in targets:
        raise ValueError(f"no tables for paper {paper!r}: papers with tables are {', '.join(targets) or 'none'}")
    return importlib.import_module(targets[paper].partition(":")[0])
