"""Files that are never half-written, one file under two names where both hold the same state (`link_or_copy`),
and checkpoints that load without unpickling code."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import torch  # imported where used: `repro tables` and other torch-free commands start 2 s sooner


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting it to read it back is a race
    with any thread that creates a file meanwhile)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    # mkstemp creates the file 0600; the published file gets the permissions any tool would give it (0666 less
    # the user's umask), so that records and tables are readable by whoever reads the repository
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> bool:
    """Make `dst` a hard link of `src`, atomically (a link under a temporary name beside `dst` replaces it), so that
    two names of one state share storage: a paper-size final checkpoint and its `.last.ckpt` held 3.4 GB each at
    285M parameters. Where the file system has no hard links (or refuses one: another device, a link
    count limit) the bytes are copied instead, as atomically. Returns whether a link was made.

    Sharing is safe because every writer here replaces a file (`atomic_path`: a new inode under the old name) and
    none writes into one: a later save to either name leaves the other's bytes as they were."""
    with atomic_path(dst) as tmp:
        os.unlink(tmp)  # os.link makes its own file
        try:
            os.link(src, tmp)
            return True
        except OSError:
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            return False


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) for the duration of the block, across processes: cache
    builders that clear a folder before filling it hold it, so that two workers never build into one folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor]) -> None:
    """Atomically, and byte for byte the same for the same tensors: `torch.save` to a path names the archive's
    records after the file, which here is a random temporary name, so two builds of one data set wrote different
    bytes and a concurrent build broke the other's recorded sha256; through a file object the name is fixed."""
    import torch  # heavy: torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(tensors, f)


@contextmanager
def build_lock(folder: str | os.PathLike) -> Iterator[None]:
    """The lock of a data build into `folder` (`<folder>.lock` beside it): two processes that build the same data
    set at once (two `repro fit` of one task, the workers of `repro runs`) take turns, and the second finds the
    first's complete build (builders check for their completion marker, `meta.json`, inside the lock)."""
    folder = Path(folder)
    with file_lock(folder.with_name(folder.name + ".lock")):
        yield


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors only (`weights_only=True`): a file that carries code is refused, not run."""
    import torch  # heavy: torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # truncated or foreign file
        raise RuntimeError(
            f"{path} is not a readable tensor file ({type(err).__name__}: {err}); delete it and run the "
            "command again to rebuild it"
        ) from err


def check_checkpoint(path: str | os.PathLike, model: torch.nn.Module) -> dict[str, Any]:
    """Refuse, in one line that names the problem, a `--ckpt_path` that is missing, unreadable (truncated, random
    bytes, pickled code) or of another model (class, vocabulary or weight shapes), before a run starts. Returns the
    provenance the checkpoint carries (`repro_run`: module class, config, experiment, MLflow run; see
    `repro.callbacks.Provenance`), or {} for a checkpoint written without it. Loads with `mmap=True`: the weights
    are not read into memory twice."""
    import torch  # heavy: torch

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--ckpt_path {path}: no such file (a fit writes one with --run.checkpoint PATH)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated, not a torch file, or carries code (weights_only refuses it)
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise ValueError(f"--ckpt_path {path} is not a readable checkpoint ({type(err).__name__}: {reason}); it may "
                         "be truncated or not a checkpoint: give one written by `repro fit --run.checkpoint`") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"--ckpt_path {path} is a torch file but not a Lightning checkpoint (no state_dict): give one "
                         "written by `repro fit --run.checkpoint`")
    info = dict(ckpt.get("repro_run") or {})
    ours = f"{type(model).__module__}.{type(model).__qualname__}"
    theirs = info.get("module_class") or (ckpt.get("repro") or {}).get("module_class")
    origin = ", ".join(f"{k} {info[k]}" for k in ("paper", "experiment", "profile") if info.get(k))
    origin = f" ({origin})" if origin else ""
    if theirs and theirs != ours:
        raise ValueError(f"--ckpt_path {path} holds a {theirs}{origin}, but this config builds a {ours}: give a "
                         "checkpoint of this model, or the config it was trained with")
    n_token = (ckpt.get("repro") or {}).get("n_token")
    if n_token is not None and getattr(model, "n_token", n_token) != n_token:
        raise ValueError(f"--ckpt_path {path}{origin} was trained on a vocabulary of {n_token} symbols, this config's "
                         f"data has {model.n_token}: evaluate it on the corpus it was trained on")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if isinstance(v, torch.Tensor)}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
        if extra:
            parts.append(f"{len(extra)} unknown weights (e.g. {extra[0]})")
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} of another shape (e.g. {k}: checkpoint {have[k]}, model {want[k]})")
        raise ValueError(f"--ckpt_path {path}{origin} does not fit this config's {type(model).__name__}: "
                         f"{'; '.join(parts)}; give the config it was trained with")
    return info


def check_config_files(args: list[str]) -> None:
    """Every `-c/--config FILE` of a command line exists and is valid YAML — checked before the command parser
    sees it, which reports a missing file after its whole usage and a syntax error without the file's name."""
    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--config")]
    paths += [a.split("=", 1)[1] for a in args if a.startswith(("--config=", "-c="))]
    for p in paths:
        if not Path(p).is_file():
            raise ValueError(f"config file {p} does not exist (configs are in configs/<paper>/<profile>/)")
        try:
            yaml.safe_load(Path(p).read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"config file {p} is not valid YAML{where}: {problem}") from None
