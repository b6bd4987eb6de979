"""The disk that a group of fits needs for its checkpoints, estimated from the models' sizes and checked against the
free disk before anything is written (`repro runs`, `repro rehearse`; a full rehearsal's scratch copy
reached 64 GB, nothing checked the free space, and a full disk ended stages in 20-line `OSError: No space left on
device` tracebacks).

A fit's checkpoint holds its weights, the optimiser's state and the saved buffers (`checkpoint_bytes`), and a
segment-recurrent LM's training memory (`memory_bytes`), the models built on the meta device (no memory, a fraction of a
second each once the paper's code is imported). A fit keeps `A.ckpt`, and with `--run.select` also `A.last.ckpt`, unless
the two are one file: a fit whose only validation comes at its end (a rehearsal's) selects its final state, and
`repro.cli.checkpoints.finish_selection` links them; any other selecting fit is counted with both, as nothing tells
beforehand which step it will select. While a fit saves, more files sit side by side (`Fit.peak`): each of the `jobs`
fits running at once adds those of the largest models. Checkpoints already at the paths a fit writes are replaced, not
added. Not counted: the data caches (built before by the data stages) and DVC's cache (hard links in the rehearsal,
copies under DVC's default settings).

Built on `repro.cli.cli.build`; `repro.cli.runs` and `repro.cli.rehearsal` call it. A command that has not
imported torch (the parent of `repro runs --jobs N`, `repro rehearse`) sizes the models in a child process
(`fits_in_child`), which frees the memory of torch, Lightning and the papers' code when it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from repro.ops.units import gb

# Adam keeps two moments (exp_avg, exp_avg_sq) of a trained parameter's size: a float32 parameter takes 12 bytes
# in a checkpoint (the 285M-parameter WikiText-103 large model's measured 3.4 GB, 11.9 bytes per parameter)
OPTIMISER_COPIES = 2
# records, curves, MLflow's database and logs that the runs write beside their checkpoints
RESERVE = 1 << 30


@dataclass(frozen=True)
class Fit:
    checkpoint: str
    parameters: int
    size: int  # bytes of one checkpoint (`checkpoint_bytes`)
    select: bool
    shared: bool = False  # with `select`: the selected checkpoint is the final one (`validates_once_at_the_end`)

    @property
    def kept(self) -> int:
        """Checkpoint files the fit leaves: A.ckpt, and with --run.select an A.last.ckpt of its own unless the two
        are one file."""
        return 2 if self.select and not self.shared else 1

    @property
    def peak(self) -> int:
        """Checkpoint files at once while it runs: with --run.select, when the final state is saved, A.best.ckpt,
        the old A.last.ckpt and the new one's temporary; without, A.last.ckpt and the final checkpoint's temporary."""
        return 3 if self.select else 2

    @property
    def paths(self) -> list[Path]:
        from repro.callbacks import best_path, last_path  # heavy: Lightning

        return [Path(self.checkpoint), last_path(self.checkpoint), best_path(self.checkpoint)]


def checkpoint_bytes(model) -> int:
    """Bytes of a fit's checkpoint of `model` (on any device, meta included): each parameter once (tied ones share
    one tensor), with Adam's `OPTIMISER_COPIES` for those it trains, and the buffers the state dict saves (a
    memory-carrying model's memories, GPT-2's attention masks)."""
    params = dict(model.named_parameters())  # tied parameters once
    saved = set(model.state_dict(keep_vars=True))
    total = sum(p.numel() * p.element_size() * (1 + OPTIMISER_COPIES * p.requires_grad) for p in params.values())
    return total + sum(b.numel() * b.element_size() for name, b in model.named_buffers() if name in saved)


def memory_bytes(module, datamodule) -> int:
    """The training memory a segment-recurrent LM's checkpoint carries beside its weights (`repro.lm.SegmentLM.
    on_save_checkpoint`: the last `mem_len` hidden states of every stream at every layer, float32, all ranks'
    streams): n_layer × batch_size × mem_len × d_model × 4 bytes where the module says them (`memory.mem_len`, its
    model's `cfg`), else 0. At the paper sizes it can match the weights (WikiText-103 large: 18 layers × 60
    streams × 384 × 1024); a memory of another form (keys and values, compressed or continuous) is approximated."""
    mem_len = getattr(getattr(module, "memory", None), "mem_len", 0) or 0
    cfg = getattr(getattr(module, "model", None), "cfg", None)
    batch = getattr(datamodule, "batch_size", 0) or 0
    layers, width = getattr(cfg, "n_layer", 0), getattr(cfg, "d_model", 0)
    if not (isinstance(mem_len, int) and isinstance(layers, int) and isinstance(width, int) and isinstance(batch, int)):
        return 0
    return layers * batch * mem_len * width * 4


def validates_once_at_the_end(trainer: dict) -> bool:
    """Whether a fit's only validation comes after its last training batch: one epoch of `limit_train_batches`
    batches validated every as many (the rehearsal's caps, `configs/rehearsal/trainer.yaml`). Its selected
    checkpoint is then its final state, and `A.ckpt` shares `A.last.ckpt`'s file."""
    batches, every = trainer.get("limit_train_batches"), trainer.get("val_check_interval")
    return (trainer.get("max_epochs") == 1 and isinstance(batches, int) and not isinstance(batches, bool)
            and batches == every and (trainer.get("check_val_every_n_epoch") or 1) == 1)


def _split(args: list[str]) -> tuple[list[str], list[str]]:
    """A `fit` command line's config files and its other arguments."""
    configs, rest, it = [], [], iter(args[1:] if args and args[0] == "fit" else args)
    for a in it:
        if a in ("-c", "--config"):
            configs.append(next(it))
        elif a.startswith(("--config=", "-c=")):
            configs.append(a.split("=", 1)[1])
        else:
            rest.append(a)
    return configs, rest


def fits_of(steps: list[list[str]]) -> list[Fit]:
    """The fits among command lines (`fit -c A.yaml … --run.checkpoint A.ckpt`, as `repro runs` builds them), each
    with its checkpoint path, its model's parameters and whether it selects. A fit without a checkpoint file (no
    --run.checkpoint, no --run.select or --run.resume) writes none and is left out."""
    from repro.cli.checkpoints import default_checkpoint  # heavy: Lightning
    from repro.cli.cli import build  # heavy: Lightning

    out = []
    for args in steps:
        if not args or args[0] != "fit":
            continue
        configs, rest = _split(args)
        cli = build(configs, rest, meta=True)
        run = dict(cli.config.get("run", {}) or {})
        path = run.get("checkpoint") or (default_checkpoint(run) if run.get("select") or run.get("resume") else None)
        if path is None:
            continue
        trainer = dict(cli.config.get("trainer", {}) or {})
        size = checkpoint_bytes(cli.model) + memory_bytes(cli.model, cli.datamodule)
        out.append(Fit(str(path), sum(p.numel() for p in cli.model.parameters()), size,
                       bool(run.get("select")), shared=bool(run.get("select")) and validates_once_at_the_end(trainer)))
    return out


def fits_in_child(groups: list[list[list[str]]], *, cwd: str | os.PathLike | None = None) -> list[list[Fit]]:
    """`fits_of` of each group of command lines, in a fresh interpreter (see the module's docstring); its error,
    if any, as a ValueError."""
    code = ("import json, sys\nfrom dataclasses import asdict\nfrom repro.cli.disk import fits_of\n"
            "print(json.dumps([[asdict(f) for f in fits_of(g)] for g in json.load(sys.stdin)]))")
    return [[Fit(**f) for f in group] for group in in_child(code, groups, what="sizing the checkpoints", cwd=cwd)]


def in_child(code: str, payload, *, what: str, cwd: str | os.PathLike | None = None):
    """Run `code` in a fresh interpreter with `payload` as JSON on its standard input; the JSON of its last line of
    output, or its last error line as a ValueError that starts with `what`."""
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True, text=True,
                          cwd=cwd)
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ValueError(f"{what} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def need(fits: list[Fit] | list[list[Fit]], *, jobs: int = 1, replacing: bool = True,
         drops: list[list[int]] | None = None) -> int:
    """Bytes the fits' checkpoints need on top of what their paths already hold (see the module's docstring;
    `replacing=False`: those files go before the fits start, as a rehearsal's workspace does): what every fit
    keeps, and what the `jobs` fits running at once hold beyond that while they finish. `fits` may come in groups
    run one after the other (a rehearsal's stages): only fits of one group run at once. `drops[i]`: the groups
    whose files are deleted once group i has run (a rehearsal's workspace, `repro.cli.rehearsal_plan.drops`;
    it starts empty): the need is then the most the disk holds at once, group by group."""
    groups = fits if fits and isinstance(fits[0], list) else [fits]
    flat = [f for group in groups for f in group]

    def running_of(group: list[Fit]) -> int:
        return sum(sorted((f.size * (f.peak - f.kept) for f in group), reverse=True)[: max(1, jobs)])

    if drops is not None:
        on_disk = peak = 0
        for i, group in enumerate(groups):
            on_disk += sum(f.size * f.kept for f in group)
            peak = max(peak, on_disk + running_of(group))
            on_disk -= sum(f.size * f.kept for j in drops[i] for f in groups[j])
        return peak + RESERVE
    kept = sum(f.size * f.kept for f in flat)
    running = max((running_of(group) for group in groups), default=0)
    if not replacing:
        return kept + running + RESERVE
    # by inode: a selected final checkpoint and its .last.ckpt may be one file
    present = sum({(st.st_dev, st.st_ino): st.st_size for f in flat for p in f.paths if p.is_file()
                   for st in [p.stat()]}.values())
    return max(0, kept + running - present) + RESERVE


def free_bytes(path: str | os.PathLike) -> tuple[int, Path]:
    """Free bytes on the file system that holds `path` (or would: its nearest existing folder), and that folder."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free, where


def check(what: str, fits: list[Fit] | list[list[Fit]], *, jobs: int = 1, extra: int = 0, extra_what: str = "",
          reclaimed: int = 0, where: str | os.PathLike | None = None, drops: list[list[int]] | None = None) -> int:
    """Refuse, in one line, when the disk cannot hold `fits`' checkpoints (and `extra` bytes, `extra_what`; with
    `reclaimed` bytes that the command deletes before it writes them, which it does not replace then; with `drops`,
    groups whose files go once others have run, as `need` counts them); returns the need in bytes. The free space
    is read where the first checkpoint goes, or at `where`."""
    flat = [f for group in fits for f in group] if fits and isinstance(fits[0], list) else list(fits)
    if not flat and not extra:
        return 0
    total = need(fits, jobs=jobs, replacing=not reclaimed, drops=drops) + extra
    free, where = free_bytes(where or (flat[0].checkpoint if flat else "."))
    free += reclaimed
    if total > free:
        largest = max(flat, key=lambda f: f.size, default=None)
        biggest = f", the largest {gb(largest.size)} ({largest.parameters / 1e6:.0f}M parameters)" if largest else ""
        dropped = "; a stage's checkpoints dropped once the stages that read them have run" if drops and any(drops) \
            else ""
        raise ValueError(
            f"{what} needs {gb(total)} of disk and {gb(free)} are free on {where}: {len(flat)} checkpoints (weights "
            f"and Adam's moments{biggest}; with --run.select also a .last.ckpt, and up to 2 more per running fit "
            f"while it saves{dropped}), {gb(RESERVE)} for records{', ' + extra_what if extra_what else ''}; free "
            f"{gb(total - free)} or more and run it again")
    return total
