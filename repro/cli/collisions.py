"""Runs that would collide, refused in one line before they start (`repro.cli.lightning_cli.ReproCLI`): a second fit
on a checkpoint path that a live fit holds, and a resume whose settings differ from the checkpoint's.

- **One fit per checkpoint.** A fit with `--run.checkpoint A.ckpt` holds `A.ckpt.lock` while it runs (created
  exclusively, `O_EXCL`, by rank 0; it names the process, the host, when it started and its command line) and
  removes it when it ends. Another fit given the same path is refused, naming that process. A lock whose process is
  gone (same host, no such pid) is taken over with a note; one from another host is never guessed about: the line
  says to delete it once that run is known to be over. Follows the pid files of daemons (`O_EXCL` creation, the
  pid checked with signal 0); differs in naming the command, so that the user sees which run holds the path.
- **A resume continues the same run.** `--run.resume true` compares the settings that change what is trained
  (`RUN_SETTINGS`: the model, the data, the seed, the optimiser and schedule, the trainer's precision,
  accumulation and clipping) with those the checkpoint was trained with (the config that `repro.callbacks.
  Provenance` stores in it) and refuses the first that differs, naming it and both values; `--run.resume_changed
  true` continues anyway. Paths, tracking, logging, progress, the number of steps and of devices may change.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import yaml

from repro.tracking import process_alive

# dotted prefixes of the settings a resumed fit must share with its checkpoint
# (not the trainer's step count: a resume that trains further continues the same trajectory; a schedule's own
# horizon is a model setting)
RUN_SETTINGS = ("model", "data", "seed_everything", "optimizer", "lr_scheduler", "trainer.precision",
                "trainer.accumulate_grad_batches", "trainer.gradient_clip_val", "trainer.gradient_clip_algorithm")


def lock_path(checkpoint: str | os.PathLike) -> Path:
    return Path(f"{checkpoint}.lock")


class CheckpointLock:
    """`A.ckpt.lock` while a fit writes `A.ckpt` (see the module's docstring); `acquire()` refuses with a
    ValueError naming the holder, `release()` removes the lock if it is this process's."""

    def __init__(self, checkpoint: str | os.PathLike, command: str = ""):
        self.checkpoint, self.path, self.command = Path(checkpoint), lock_path(checkpoint), command
        self.held = False

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def acquire(self) -> str:
        """Take the lock; returns a note when a dead process's lock was taken over, else ''."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": self.command}
        note = ""
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                other = self._holder()
                pid, host = other.get("pid"), other.get("host")
                if host == me["host"] and isinstance(pid, int) and (pid == me["pid"] or not process_alive(pid)):
                    self.path.unlink(missing_ok=True)  # its process is gone: an interrupted fit's leftover
                    note = f"note: took over {self.path} from process {pid}, which no longer runs"
                    continue
                where = f"process {pid} on {host}" if host != me["host"] else f"process {pid}"
                since = f" since {other['started']}" if other.get("started") else ""
                what = f" ({other['command']})" if other.get("command") else ""
                fix = ("wait for it to end, or give this fit another --run.checkpoint" if host == me["host"] else
                       f"if that run is over, delete {self.path}; else give this fit another --run.checkpoint")
                raise ValueError(f"{self.checkpoint} is being written by {where}{since}{what}: {fix}") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return note
        raise ValueError(f"{self.path} could not be taken: delete it if no fit writes {self.checkpoint}")

    def release(self) -> None:
        if self.held and self._holder().get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def changed_settings(saved: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, the checkpoint's value, this command's) for every setting of `RUN_SETTINGS` that differs between two
    configs (nested dictionaries, as a config's YAML reads); a setting absent from one side is None there."""
    a, b = _flat(saved), _flat(now)

    def run_setting(key: str) -> bool:
        return any(key == p or key.startswith(p + ".") for p in RUN_SETTINGS)

    keys = sorted(k for k in set(a) | set(b) if run_setting(k))
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def check_resume(checkpoint: str | os.PathLike, saved_config: str | None, config_now: str, *,
                 allow: bool) -> list[tuple[str, Any, Any]]:
    """Refuse a resume from `checkpoint` whose settings differ from those it was trained with (both configs as YAML
    text), in one line naming the first and both values, unless `allow`; returns the differences."""
    if not saved_config:
        return []
    diff = changed_settings(yaml.safe_load(saved_config) or {}, yaml.safe_load(config_now) or {})
    if diff and not allow:
        key, then, now = diff[0]
        more = f" (and {len(diff) - 1} more setting{'s' if len(diff) > 2 else ''})" if len(diff) > 1 else ""
        raise ValueError(f"--run.resume: {checkpoint} was trained with {key} = {then}, this command gives {now}{more}: "
                         "resume with the settings it was trained with, or add --run.resume_changed true to continue "
                         "it under the new ones")
    return diff
