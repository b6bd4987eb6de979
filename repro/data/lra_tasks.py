"""The Long Range Arena tasks built from their sources (`repro.data.lra`): each task's train/valid/test splits as
padded token tensors (`Split`), the per-task builders that download and read the sources (`BUILDERS`), and the
cache of built tasks (`save_task`, `load_task`: `<data_dir>/cache/lra/<name>/{train,valid,test}.pt` with a
`meta.json` of sizes, sources and sha256, verified on load).

Token ids: 0 is padding (`PAD`) everywhere and never a real token (bytes and pixels are shifted by one).
The splits follow LRA and the reference (mlpen/Nystromformer `LRA/datasets/*.py`): Text validates on the IMDb test
set, as both do; Image's validation pictures are the last 5,000 of TensorFlow Datasets' order (`tfds_order`).
Deviation: Pathfinder is split 80/10/10 after a seeded shuffle (the reference's shuffle is unseeded).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from repro.data.download import ChecksumError, download, sha256_file
from repro.data.listops import (
    LISTOPS_FILES,
    LISTOPS_VOCAB,
    ListOpsSpec,
    read_listops_tsv,
    write_listops,
)
from repro.data.lra_sources import (
    CIFAR10_PUBLISHED,
    CIFAR10_URL,
    IMDB_PUBLISHED,
    IMDB_URL,
    LRA_RELEASE_URL,
    encode_bytes,
    extract_prefix,
    read_aan_tsv,
    read_cifar10,
    read_imdb,
    read_pathfinder,
)
from repro.io import atomic_write_json, load_tensors, save_tensors

FORMAT_VERSION = 1  # of a built task (meta.json): a task cached under another is rebuilt
SPLITS = ("train", "valid", "test")
PAD = 0


class Split(NamedTuple):
    tokens: torch.Tensor  # (N, L) int16, 0-padded
    lengths: torch.Tensor  # (N,) int64
    labels: torch.Tensor  # (N,) int64
    tokens2: torch.Tensor | None = None  # Retrieval's second documents
    lengths2: torch.Tensor | None = None


def pad_sequences(seqs: Sequence[Sequence[int]], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L) int16 tokens right-padded with 0 to the longest sequence (≤ max_len; longer ones are truncated)."""
    lengths = torch.tensor([min(len(s), max_len) for s in seqs], dtype=torch.int64)
    width = max(1, int(lengths.max()) if len(seqs) else 1)
    out = torch.zeros(len(seqs), width, dtype=torch.int16)
    for i, s in enumerate(seqs):
        n = int(lengths[i])
        if n:
            out[i, :n] = torch.as_tensor(list(s[:n]), dtype=torch.int16)
    return out, lengths


def _split_from(seqs, labels, max_len: int, seqs2=None) -> Split:
    tok, n = pad_sequences(seqs, max_len)
    tok2 = n2 = None
    if seqs2 is not None:
        tok2, n2 = pad_sequences(seqs2, max_len)
    return Split(tok, n, torch.as_tensor(np.asarray(labels), dtype=torch.int64), tok2, n2)


@dataclass(frozen=True)
class TaskInfo:
    n_token: int  # embedding rows (PAD included)
    num_classes: int
    dual: bool  # two documents per example (Retrieval)


TASKS: dict[str, TaskInfo] = {
    "listops": TaskInfo(len(LISTOPS_VOCAB), 10, False),
    "text": TaskInfo(257, 2, False),
    "retrieval": TaskInfo(257, 2, True),
    "image": TaskInfo(257, 10, False),
    "pathfinder": TaskInfo(257, 2, False),
}


def _build_listops(raw: Path, *, spec: ListOpsSpec | None, max_len: int, release: bool, **_) -> tuple[dict, dict]:
    if release:
        src = extract_prefix(_release(raw.parent), "lra_release/listops-1000/", raw.parent / "release_listops")
        files = {s: src / name for s, name in LISTOPS_FILES.items()}
        source = "lra_release.gz listops-1000"
    else:
        files = write_listops(raw, spec or ListOpsSpec())
        source = f"generated: {json.dumps(asdict(spec or ListOpsSpec()), sort_keys=True)}"
    splits = {}
    for s, path in files.items():
        rows = read_listops_tsv(path)
        splits[s] = _split_from([r[0] for r in rows], [r[1] for r in rows], max_len)
    return splits, {"source": source}


def _release(raw_root: Path) -> Path:
    return download(LRA_RELEASE_URL, raw_root / "lra_release.gz", sha256=None, record_sha256=True)


def _build_text(raw: Path, *, max_len: int, **_) -> tuple[dict, dict]:
    archive = download(IMDB_URL, raw / "aclImdb_v1.tar.gz", **IMDB_PUBLISHED, record_sha256=True)
    return _text_splits(read_imdb(archive), max_len), {"source": IMDB_URL}


def _text_splits(data: dict[str, list[tuple[bytes, int]]], max_len: int) -> dict[str, Split]:
    def mk(rows):
        return _split_from([encode_bytes(t, max_len) for t, _ in rows], [y for _, y in rows], max_len)

    test = mk(data["test"])
    return {"train": mk(data["train"]), "valid": test, "test": test}  # LRA evaluates on the IMDb test set


def _build_retrieval(raw: Path, *, max_len: int, **_) -> tuple[dict, dict]:
    src = extract_prefix(_release(raw.parent), "lra_release/tsv_data/", raw.parent / "release_tsv_data")
    return _retrieval_splits(src, max_len), {"source": "lra_release.gz tsv_data/new_aan_pairs"}


def _retrieval_splits(folder: Path, max_len: int) -> dict[str, Split]:
    out = {}
    for s, name in {"train": "train", "valid": "eval", "test": "test"}.items():
        rows = read_aan_tsv(folder / f"new_aan_pairs.{name}.tsv")
        out[s] = _split_from([encode_bytes(a, max_len) for a, _, _ in rows], [y for _, _, y in rows], max_len,
                             [encode_bytes(b, max_len) for _, b, _ in rows])
    return out


def _build_image(raw: Path, *, max_len: int, **_) -> tuple[dict, dict]:
    archive = download(CIFAR10_URL, raw / "cifar-10-python.tar.gz", **CIFAR10_PUBLISHED, record_sha256=True)
    return _image_splits(read_cifar10(archive), n_valid=5000), {"source": CIFAR10_URL}


def tfds_order(n: int, split: str) -> np.ndarray:
    """The order in which TensorFlow Datasets serves the n examples of a split its builder keyed 0…n−1 (CIFAR-10's
    keys each picture by its index in the batch files): ascending md5 of the split name followed by the key, the
    order its writer gives a split (`tensorflow_datasets.core.hashing`, salted by the split name)."""
    salt = hashlib.md5(split.encode())

    def key(i: int) -> int:
        h = salt.copy()
        h.update(str(i).encode())
        return int(h.hexdigest(), 16)

    return np.array(sorted(range(n), key=key), dtype=np.int64)


def _image_splits(data: dict[str, tuple[np.ndarray, np.ndarray]], *, n_valid: int) -> dict[str, Split]:
    """LRA's CIFAR-10 splits: `train[:90%]` and `train[90%:]` of TensorFlow Datasets' order (`tfds_order`), so
    that the validation pictures are the reference's (`n_valid` = 5,000 of 50,000), and the test set."""
    def mk(x, y):
        return Split(torch.from_numpy(x.astype(np.int16) + 1), torch.full((len(x),), x.shape[1], dtype=torch.int64),
                     torch.from_numpy(y.astype(np.int64)))

    x, y = data["train"]
    order = tfds_order(len(x), "train")
    train, valid = order[: len(x) - n_valid], order[len(x) - n_valid:]
    return {"train": mk(x[train], y[train]), "valid": mk(x[valid], y[valid]), "test": mk(*data["test"])}


def _build_pathfinder(raw: Path, *, difficulty: str, seed: int, **_) -> tuple[dict, dict]:
    prefix = f"lra_release/pathfinder32/{difficulty}/"
    src = extract_prefix(_release(raw.parent), prefix, raw.parent / f"release_pathfinder32_{difficulty}")
    x, y = read_pathfinder(src)
    return _pathfinder_splits(x, y, seed=seed), {"source": f"lra_release.gz {prefix}"}


def _pathfinder_splits(x: np.ndarray, y: np.ndarray, *, seed: int) -> dict[str, Split]:
    order = np.random.default_rng(seed).permutation(len(x))
    a, b = int(len(x) * 0.8), int(len(x) * 0.9)
    parts = {"train": order[:a], "valid": order[a:b], "test": order[b:]}
    return {s: Split(torch.from_numpy(x[i].astype(np.int16) + 1), torch.full((len(i),), x.shape[1], dtype=torch.int64),
                     torch.from_numpy(y[i])) for s, i in parts.items()}


BUILDERS = {"listops": _build_listops, "text": _build_text, "retrieval": _build_retrieval,
            "image": _build_image, "pathfinder": _build_pathfinder}


def _split_tensors(split: Split) -> dict[str, torch.Tensor]:
    return {k: v for k, v in split._asdict().items() if v is not None}


def save_task(folder: Path, splits: dict[str, Split], meta: dict) -> None:
    """Write the splits and then `meta.json` (with their sha256): a folder with a meta file is complete."""
    (folder / "meta.json").unlink(missing_ok=True)
    sums = {}
    for s in SPLITS:
        save_tensors(folder / f"{s}.pt", _split_tensors(splits[s]))
        sums[s] = sha256_file(folder / f"{s}.pt")
    atomic_write_json(folder / "meta.json", meta | {"format": FORMAT_VERSION, "sha256": sums,
                                                     "examples": {s: len(splits[s].labels) for s in SPLITS}})


def load_task(folder: Path) -> tuple[dict[str, Split], dict]:
    meta = json.loads((folder / "meta.json").read_text())
    splits = {}
    for s in SPLITS:
        path = folder / f"{s}.pt"
        if sha256_file(path) != meta["sha256"][s]:
            raise ChecksumError(f"{path} differs from the sha256 recorded in {folder / 'meta.json'}: delete {folder} "
                                "and run again to rebuild it")
        splits[s] = Split(**load_tensors(path))
    return splits, meta
