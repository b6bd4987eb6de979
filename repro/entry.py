"""The `repro` command (`pyproject.toml` [project.scripts], `python -m repro`): routes a subcommand to its module
without importing more than it needs (Lightning takes ~5 s to import on 2 cores)."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    """The `repro` command. Lightning subcommands and `steps` go to `repro.cli.main`; `runs` starts without torch
    (its workers import it); the other subcommands (`tables`, `describe`, `bench`, …) start without Lightning and
    import what they use. Errors the user can act on end with their message alone; REPRO_DEBUG=1 shows the
    traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("fit", "validate", "test", "predict", "steps"):
        from repro.cli import main

        main(argv)
        return
    try:
        if args and args[0] == "runs":
            from repro.runs import run_group

            run_group(args[1:])
            return
        if args and args[0] == "rehearse":
            from repro.rehearsal import rehearse

            rehearse(args[1:])
            return
        from repro.commands import main as commands_main
        from repro.data.download import ArchiveError, ChecksumError, DownloadError

        try:
            commands_main(args)
        except (DownloadError, ChecksumError, ArchiveError) as err:
            raise ValueError(str(err)) from err
    except ValueError as err:
        if os.environ.get("REPRO_DEBUG"):
            raise
        print(f"error: {err}\n(set REPRO_DEBUG=1 to see the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
