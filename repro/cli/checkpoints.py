"""The checkpoints of a run (`repro.cli.lightning_cli.ReproCLI`): the default file of a fit that needs one and was
given none (`checkpoints/<paper>/<profile>/<experiment>.ckpt`, a rehearsal's under a profile of its own), how a fit
with `--run.select` ends (the best validation's file becomes the checkpoint, the final state stays in `A.last.ckpt`,
one hard link where both hold the same weights), and a path as the user copies it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from repro.callbacks import BestCheckpoint, save_checkpoint
from repro.io import link_or_copy
from repro.tracking import repo_root


def default_profile(run: dict[str, Any]) -> str:
    """The profile folder of a run's default checkpoint: a rehearsal of the paper profile (`run.rehearsal`) has its
    own, so that rehearsing a config never replaces (nor resumes from) the checkpoint of its real run."""
    profile = run.get("profile") or ""
    return "rehearsal" if run.get("rehearsal") else profile


def default_checkpoint(run: dict[str, Any], root: Path | None = None) -> Path | None:
    """`checkpoints/<paper>/<profile>/<experiment>.ckpt` under the repository root, the checkpoint of a fit that
    needs one and was given no `--run.checkpoint` (or None when the run section names no paper or experiment). The
    pipeline's runs sit one level down, in their DVC stage's group (`repro.cli.runs.group_dirs`:
    `checkpoints/<paper>/<profile>/<group>/<experiment>.ckpt`), so a fit by hand never replaces a stage's output.
    The experiment names the file as `repro runs` names it; runs of one config that differ in seed or variant
    share it unless they name their own experiment (`--run.experiment`), as `repro runs` does."""
    if not run.get("paper") or not run.get("experiment"):
        return None
    parts = [run["paper"], default_profile(run)]
    return (root or repo_root()) / "checkpoints" / Path(*filter(None, parts)) / f"{run['experiment']}.ckpt"


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (the line a user copies), else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def finish_selection(trainer, select: BestCheckpoint, *, ckpt: Path, last: Path) -> None:
    """`--run.select`: the final state goes to `last`, the best validation's checkpoint becomes `ckpt` (a resumed
    fit that had already finished keeps the `ckpt` it selected then). Where the selected step is the final one
    (the usual case while the loss still falls, and a rehearsal's one validation) or no validation ran, `ckpt`
    and `last` hold the same weights: `ckpt` becomes a hard link of `last` (`repro.io.link_or_copy`) instead of
    a second copy, 3.4 GB at 285M parameters. The best validation's own file differs from `last` only in
    Lightning's loop counters (it was saved inside the validation); no optimiser step came after it."""
    sel, rank0 = select, trainer.global_rank == 0
    save_checkpoint(trainer, last)
    action = None
    if rank0:
        action = ("same" if sel.step is not None and sel.step == trainer.global_step
                  and sel.path.exists() else
                  "best" if sel.step is not None and sel.path.exists() else
                  "kept" if sel.step is not None and ckpt.exists() else "final")
    if trainer.world_size > 1:
        action = trainer.strategy.broadcast(action)
    if action == "best" and rank0:
        os.replace(sel.path, ckpt)
    elif action == "same" and rank0:
        link_or_copy(last, ckpt)
        sel.path.unlink()
    elif action == "final":  # no validation ran (or its checkpoint is gone): the final state is all there is
        if rank0:
            link_or_copy(last, ckpt)
            sel.path.unlink(missing_ok=True)  # a file left by an earlier, interrupted run is not this run's
            why = "no validation ran" if sel.step is None else f"the checkpoint of step {sel.step} is gone"
            print(f"repro: --run.select {sel.metric}:{sel.mode}: {why}, so {ckpt} holds the final weights "
                  f"(step {trainer.global_step})", file=sys.stderr, flush=True)
    if trainer.world_size > 1:
        trainer.strategy.barrier("repro.select")
