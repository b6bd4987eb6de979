"""Files that are never half-written, and checkpoints that load without unpickling code."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) for the duration of the block, across processes: cache
    builders that clear a folder before filling it hold it, so that two workers never build into one folder."""
    import fcntl

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
    with atomic_path(path) as tmp:
        torch.save(tensors, tmp)


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors only (`weights_only=True`): a file that carries code is refused, not run."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # truncated or foreign file
        raise RuntimeError(
            f"{path} is not a readable tensor file ({type(err).__name__}: {err}); delete it and run the "
            "command again to rebuild it"
        ) from err
