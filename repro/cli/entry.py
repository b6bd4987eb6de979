"""The `repro` command (`pyproject.toml` [project.scripts], `python -m repro`): routes a subcommand to its module;
torch and Lightning (~5 s to import on 2 cores) are imported only by the commands that use them.

The top of the stack: the Lightning CLI (`repro.cli.cli`), the shared commands (`repro.cli.commands`), `runs`
and `rehearse`, and the papers' own commands, found by name through `repro.cli.registry` (the `repro.commands`
entry points), so that no module under `repro/` imports `papers`."""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError

from repro.cli.commands import main as commands_main
from repro.cli.errors import error_line
from repro.cli.profile import main as profile_main
from repro.cli.registry import paper_commands
from repro.cli.rehearsal import rehearse
from repro.cli.runs import run_group
from repro.data.download import ArchiveError, ChecksumError, DownloadError
from repro.tracking import repo_root

# the commands that start without torch (the others may compute under bf16 autocast; `rehearse` runs `repro runs`
# and `repro fit`, which see to it themselves)
NO_TORCH = ("", "-h", "--help", "profile", "rehearse", "tables")


def main(argv: list[str] | None = None) -> None:
    """The `repro` command. Lightning subcommands and `steps` go to `repro.cli.cli.main`; `runs` with workers
    starts without torch (its workers import it); a paper's command goes to its paper (`repro.cli.registry`); the other
    subcommands (`tables`, `describe`, `bench`, …) start without Lightning and import what they use. Errors the
    user can act on end with their message alone; REPRO_DEBUG=1 shows the traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    # the C allocator's policy (freed memory kept for the next step) is decided where a model is built, from its
    # size (`repro.ops.allocator`): every command starts with glibc's default
    if (args[0] if args else "") not in NO_TORCH and not _starts_workers(args):
        from repro.precision import emulate_bf16_matmul  # heavy: torch

        emulate_bf16_matmul()  # on a CPU without bf16 kernels (AVX2 only): float32 products (REPRO_BF16=native: not)
    if not os.environ.get("REPRO_VERBOSE"):  # MLflow's database set-up notes (read when mlflow is imported)
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    _at_repository_root(args[0] if args else "")
    if args and args[0] in ("fit", "validate", "test", "predict", "steps"):
        from repro.cli.cli import main  # heavy: Lightning

        main(argv)
        return
    try:
        if args and args[0] == "runs":
            run_group(args[1:])
            return
        if args and args[0] == "profile":
            profile_main(args[1:])
            return
        if args and args[0] == "rehearse":
            rehearse(args[1:])
            return
        if args and args[0] == "export":
            from repro.cli.export import main as export_main  # heavy: torch and Lightning

            export_main(args[1:])
            return
        if args and args[0] == "step-memory":
            from repro.cli.stepmemory import main as step_memory_main  # heavy: torch and Lightning

            step_memory_main(args[1:])
            return

        papers = paper_commands()
        routed = {name: run for cmds in papers.values() for name, (run, _) in cmds.items()}
        try:
            if args and args[0] in routed:
                routed[args[0]](args[1:])
                return
            commands_main(args, papers)
        except (DownloadError, ChecksumError, ArchiveError) as err:
            raise ValueError(str(err)) from err
    except (ValueError, ArgumentError) as err:  # ArgumentError: a config a command builds (jsonargparse)
        if os.environ.get("REPRO_DEBUG"):
            raise
        if isinstance(err, ArgumentError):
            err = error_line(err)
        print(f"error: {err}  (REPRO_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def _starts_workers(args: list[str]) -> bool:
    """Whether `args` is a `repro runs` that only starts worker processes (which train) and so needs no torch:
    more than one spec and `--jobs` above 1, not itself a worker (`--queue`). Every option of `runs` takes a value."""
    if not args or args[0] != "runs" or "--queue" in args or any(a.startswith("--queue=") for a in args):
        return False
    jobs, specs, rest = 1, 0, iter(args[1:])
    for a in rest:
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            value = value if eq else next(rest, "")
            if name == "--jobs":
                jobs = int(value) if value.isdigit() else 1
        elif a != "-h":
            specs += 1
    return min(jobs, specs) > 1


def _at_repository_root(command: str) -> None:
    """Run from a subdirectory of the repository, a command writes where it would from the root: data to
    `<root>/data` (unless $REPRO_DATA says otherwise) and runs to `<root>/mlflow.db` (`repro.tracking`); the
    pipeline commands (`runs`, `tables`), whose paths are relative to the root, run there. The
    user's own paths (configs, checkpoints) keep their meaning."""
    root, here = repo_root(), os.getcwd()
    if os.path.samefile(root, here) or not (root / "dvc.yaml").is_file():
        return
    if not os.environ.get("REPRO_DATA"):
        os.environ["REPRO_DATA"] = str(root / "data")
    if command in ("runs", "tables"):
        os.chdir(root)
        print(f"repro: running in the repository root {root}", file=sys.stderr, flush=True)
