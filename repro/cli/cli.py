"""The command line of the Lightning CLI (`repro.cli.entry` routes these commands here), and configs built into
objects.

    repro fit|validate|test -c CONFIG [-c OVERRIDE ...] [--trainer.devices N --trainer.strategy ddp ...]
    repro steps "fit -c CONFIG ..." "test -c CONFIG -c EVAL ... --ckpt_path ..."   (several runs, one process)
    repro fit -c CONFIG ... --run.dry_run true   (build the config's objects, say what would run, run nothing)

`build` (a config's module and data module, untrained) and `load_module` (with a checkpoint's weights, for
evaluation outside a Trainer) serve the other commands (`repro.cli.commands`, `repro.cli.bench`, …), which hand
the objects to the library (`repro.ops.bench`, `repro.context`, `repro.generate`); nothing below `repro.cli` imports
this module. The CLI itself is `repro.cli.lightning_cli.ReproCLI`; its errors come out in one line
(`repro.cli.errors`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from argparse import ArgumentError
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

from repro.cli.errors import error_line
from repro.cli.lightning_cli import LIGHTNING_SUBCOMMANDS, ReproCLI, _OwnProcess
from repro.data.download import ArchiveError, ChecksumError, DownloadError
from repro.io import check_config_files
from repro.ops.allocator import release_freed_memory


def build(config_paths: list[str], overrides: list[str] | None = None, *, meta: bool = False):
    """Model and data module of a config without training (for describe, bench, tests)."""
    args = []
    for c in config_paths:
        args += ["-c", c]
    args += ["--run.tracking", "none", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args += overrides or []
    argv, sys.argv = sys.argv, sys.argv[:1]  # the args are given here, not on this process's command line
    try:
        with torch.device("meta") if meta else nullcontext():
            return ReproCLI(args=args, run=False)
    finally:
        sys.argv = argv


def load_module(configs: Sequence[str], ckpt: str | None):
    """The module (weights from `ckpt`, eval mode, fp32) and data module of a config, outside any Trainer."""
    cli = build(list(configs))
    module, dm = cli.model, cli.datamodule
    if ckpt is not None:
        if not Path(ckpt).exists():
            raise ValueError(f"checkpoint {ckpt} does not exist: train it first (`repro fit -c {configs[0]} "
                             f"--run.checkpoint {ckpt}`)")
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        saved = state.get("repro", {})
        if saved.get("n_token") not in (None, module.n_token):
            raise ValueError(f"{ckpt} was trained on {saved['n_token']} symbols, the config's data has "
                             f"{module.n_token}: give the config the checkpoint was trained with")
        dm.setup("test")
        corpus = getattr(dm, "corpus", None)
        if saved.get("vocab_digest") and corpus is not None and saved["vocab_digest"] != corpus.vocab.digest:
            raise ValueError(f"{ckpt} was trained on another vocabulary than corpus {dm.corpus_name}'s")
        module.load_state_dict(state["state_dict"])
    return module.float().eval(), dm


def run_steps(steps: list[str], *, quiet: bool = False) -> list[str]:
    """Several Lightning CLI runs, one after the other, in this one process: `repro steps "fit -c A.yaml …"
    "test -c A.yaml -c A.eval.yaml --ckpt_path …"`. Each step is exactly the command `repro <step>` (its own
    seed, Trainer, MLflow run and record); only the start-up (imports, ~10 s on 2 cores) is paid once, which is
    most of a tiny run's time. A step on several processes (DDP) runs as its own process. A failing step stops
    the rest. `quiet`: the steps' summary lines are returned instead of printed (with the command lines)."""
    usage = ('usage: repro steps "fit -c CONFIG …" "test -c CONFIG … --ckpt_path …" …\n'
             "each quoted step is one `repro fit|validate|test` command, run in order in one process")
    if any(s.strip() in ("-h", "--help") for s in steps):
        print(usage)
        return []
    if not steps:
        raise ValueError("repro steps needs at least one quoted step, e.g. "
                         '"fit -c CONFIG --run.checkpoint A.ckpt" "test -c CONFIG --ckpt_path A.ckpt"')
    parsed = [shlex.split(s) for s in steps]
    for args in parsed:  # check every step before running the first, so a typo fails in seconds
        if not args or args[0] not in LIGHTNING_SUBCOMMANDS:
            raise ValueError(f"each step of `repro steps` starts with one of {', '.join(LIGHTNING_SUBCOMMANDS)}, "
                             f"got {' '.join(args)!r}")

    for args in parsed:
        check_config_files(args)
    argv = sys.argv
    if quiet:
        ReproCLI.summaries = []
    try:
        for args in parsed:
            if not quiet:
                print(f"repro steps: {' '.join(args)}", flush=True)
            sys.argv = argv[:1]  # the step is given to the CLI as args (DDP steps run as their own process)
            # Lightning launches DDP ranks by re-running this process's command line, which here would be the
            # whole chain: a multi-process step runs as its own `repro <step>` process instead.
            ReproCLI._in_steps = True
            try:
                ReproCLI(args=args)
            except _OwnProcess:
                done = subprocess.run([sys.executable, "-m", "repro", *args], check=False)
                if done.returncode:
                    raise SystemExit(done.returncode) from None
            # the next step starts without the last one's freed memory (its trainer, model and optimiser)
            release_freed_memory()
        return list(ReproCLI.summaries or [])
    finally:
        sys.argv = argv
        ReproCLI._in_steps = False
        ReproCLI.summaries = None


def main(argv: list[str] | None = None) -> None:
    """Errors the user can act on (no data, bad checksum, impossible settings, a bad option or config file) end
    with one line that names the problem and the fix; REPRO_DEBUG=1 shows the traceback."""
    try:
        _main(argv)
    except (DownloadError, ChecksumError, ArchiveError, ValueError, ArgumentError) as err:
        if os.environ.get("REPRO_DEBUG"):
            raise
        print(f"error: {error_line(err)}  (REPRO_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def _main(argv: list[str] | None) -> None:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_SUBCOMMANDS:
        check_config_files(argv)
        if from_shell:
            sys.argv = [sys.argv[0], *argv]  # `python -m repro fit …` and `repro fit …` alike
        ReproCLI(args=None if from_shell else argv)
        return
    if argv and argv[0] == "steps":
        run_steps(argv[1:])
        return
    # the other commands are routed by `repro.cli.entry`, which is above this module (no import circle)
    raise ValueError(f"repro.cli.cli runs {', '.join(LIGHTNING_SUBCOMMANDS)} and steps, got {' '.join(argv[:1])!r}: "
                     "run it through `repro` (repro.cli.entry.main)")


if __name__ == "__main__":
    main()
