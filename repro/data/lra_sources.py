"""The official sources of the Long Range Arena tasks (`repro.data.lra`): where each is downloaded from, the
checksums published for it, and readers of their real formats (IMDb reviews from `aclImdb_v1.tar.gz`, the AAN pairs
of Retrieval, CIFAR-10's python pickle batches as grey levels, Pathfinder-32's PNGs and text `.npy` metadata, and the
members of `lra_release.gz` extracted by prefix), with the byte-level encoding of Text and Retrieval.

As the reference pipelines (tests/parity/test_lra_data_parity.py runs LRA's own on miniatures): IMDb reviews
stripped of whitespace at both ends (the TensorFlow Datasets builder does), byte ids byte + 1, Retrieval's
tab-separated pairs (quotes literal), grey levels exactly as `tf.image.rgb_to_grayscale`. Unlike a plain
`pickle.load`, the CIFAR-10 batches are unpickled by an allow-list of numpy reconstructors only.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np

from repro.data.download import ChecksumError

LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
# Checksums published for the same files (copied exactly from the file named; `download` verifies every one given):
# IMDb: sha256 and size in tensorflow/datasets tensorflow_datasets/url_checksums/imdb_reviews.txt, the same in
# huggingface/datasets datasets/imdb/dataset_infos.json. CIFAR-10: sha256 in keras-team/keras
# keras/src/datasets/cifar10.py (`file_hash`), the same in tensorflow/datasets url_checksums/cifar10.csv; MD5 in
# pytorch/vision torchvision/datasets/cifar.py (`tgz_md5`). No checksum is published for lra_release.gz (the LRA
# README gives only the URL): the first download records its sha256 beside the file (`<file>.sha256`) and later uses
# are verified against it (trust on first use, see repro.data.download).
IMDB_PUBLISHED = {"sha256": "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe", "size": 84_125_825}
CIFAR10_PUBLISHED = {"sha256": "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                     "md5": "c58f30108f718f92721af3b95e74349a"}


def encode_bytes(data: bytes, max_len: int) -> list[int]:
    """Byte-level tokens (byte + 1; 0 is padding), truncated to `max_len`, as LRA's byte-level encoders."""
    return [b + 1 for b in data[:max_len]]


_IMDB_MEMBER = re.compile(r"(?:^|/)aclImdb/(train|test)/(pos|neg)/[^/]+\.txt$")


def read_imdb(source: str | os.PathLike) -> dict[str, list[tuple[bytes, int]]]:
    """IMDb reviews by split ('train', 'test') as (text bytes, label: 1 positive, 0 negative), sorted by file
    name. `source` is `aclImdb_v1.tar.gz` or a folder holding `aclImdb/` as extracted from it. Each text is
    stripped of ASCII whitespace at both ends, as the TensorFlow Datasets IMDb builder (LRA's source) strips it."""
    source = Path(source)
    out: dict[str, list[tuple[str, bytes, int]]] = {"train": [], "test": []}
    if source.is_dir():
        for path in sorted(source.rglob("*.txt")):
            m = _IMDB_MEMBER.search(path.as_posix())
            if m:
                out[m[1]].append((path.as_posix(), path.read_bytes().strip(), int(m[2] == "pos")))
    else:
        try:
            with tarfile.open(source, "r:*") as tar:
                for member in tar:
                    m = _IMDB_MEMBER.search(member.name)
                    if m and member.isfile():
                        out[m[1]].append((member.name, tar.extractfile(member).read().strip(), int(m[2] == "pos")))
        except (tarfile.TarError, EOFError, OSError) as err:
            raise ChecksumError(f"{source} is not a readable IMDb archive ({err}); delete it and its .sha256 and run "
                                "again to download it afresh") from err
    if not out["train"] or not out["test"]:
        raise ValueError(f"{source} holds no aclImdb/{{train,test}}/{{pos,neg}}/*.txt reviews: "
                         "is it aclImdb_v1.tar.gz?")
    return {s: [(text, label) for _, text, label in sorted(rows)] for s, rows in out.items()}


def read_aan_tsv(path: str | os.PathLike) -> list[tuple[bytes, bytes, int]]:
    """AAN pairs of LRA's retrieval task: `label<TAB>id1<TAB>id2<TAB>text1<TAB>text2` per line."""
    out = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise ValueError(f"{path}:{n}: expected 5 tab-separated fields (label, id1, id2, text1, text2), "
                                 f"got {len(fields)}")
            try:
                label = int(float(fields[0]))
            except ValueError:
                if n == 1:  # a header line
                    continue
                raise ValueError(f"{path}:{n}: label {fields[0][:20]!r} is not a number") from None
            out.append((fields[3], fields[4], label))
    return out


# --------------------------------------------------------------------------------------------------- images


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, lists, dicts, bytes and numbers only: a pickle that names any other callable is
    refused instead of run (the CIFAR-10 batches are pickles)."""

    ALLOWED = frozenset({("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                         ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")})

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: a CIFAR-10 batch holds only arrays")


def read_cifar_batch(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 3072) uint8 as R, G, B planes of 32×32, labels (N,)) from one CIFAR-10 python batch."""
    d = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise ValueError("not a CIFAR-10 python batch: expected a dict with b'data' and b'labels'")
    x = np.asarray(d[b"data"], dtype=np.uint8)
    y = np.asarray(d[b"labels"], dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != 3072 or len(x) != len(y):
        raise ValueError(f"CIFAR-10 batch of unexpected shape {x.shape} with {len(y)} labels")
    return x, y


def grey_levels(x_N3072: np.ndarray) -> np.ndarray:
    """(N, 1024) grey levels of each pixel, row-major, as the reference computes them (LRA's image pipeline:
    `tf.image.rgb_to_grayscale` of the uint8 picture): in float32, v = (R, G, B) / 255 · (0.2989, 0.5870, 0.1140),
    then v · 255.5 truncated. Not round(0.2989 R + 0.5870 G + 0.1140 B): that differs on about a quarter of the
    pixels by one level (tests/parity/test_lra_data_parity.py)."""
    rgb = x_N3072.reshape(-1, 3, 1024).astype(np.float32) * np.float32(1 / 255)
    w = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    g = rgb[:, 0] * w[0] + rgb[:, 1] * w[1] + rgb[:, 2] * w[2]
    return (g * np.float32(255.5)).astype(np.uint8)


def read_cifar10(archive: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Grey CIFAR-10 from `cifar-10-python.tar.gz`: train = data_batch_1…5, test = test_batch."""
    parts: dict[str, bytes] = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            name = member.name.rsplit("/", 1)[-1]
            if member.isfile() and (name.startswith("data_batch_") or name == "test_batch"):
                parts[name] = tar.extractfile(member).read()
    names = [f"data_batch_{i}" for i in range(1, 6)]
    missing = [n for n in [*names, "test_batch"] if n not in parts]
    if missing:
        raise ValueError(f"{archive} lacks {missing}: is it cifar-10-python.tar.gz?")
    train = [read_cifar_batch(parts[n]) for n in names]
    test = read_cifar_batch(parts["test_batch"])
    return {"train": (grey_levels(np.concatenate([x for x, _ in train])), np.concatenate([y for _, y in train])),
            "test": (grey_levels(test[0]), test[1])}


def read_pathfinder(folder: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 1024) uint8, labels (N,)) of one Pathfinder-32 difficulty folder of the LRA release.

    Each `metadata/*.npy` is text despite its name: one line per image, `<image folder> <file name> <…> <label>
    …`, label in the fourth field. Empty PNG files (a few exist in the release) are skipped."""
    from PIL import Image  # optional: Pillow (matplotlib's dependency, not ours)

    folder = Path(folder)
    metas = sorted((folder / "metadata").glob("*.npy"), key=lambda p: (len(p.stem), p.stem))
    if not metas:
        raise ValueError(f"{folder} has no metadata/*.npy: point it at lra_release/pathfinder32/<difficulty>")
    images, labels = [], []
    for meta in metas:
        for n, line in enumerate(meta.read_text().splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 4:
                raise ValueError(f"{meta}:{n}: expected ≥ 4 fields (folder, file, …, label), got {line!r}")
            path = folder / fields[0] / fields[1]
            if path.stat().st_size == 0:
                continue
            with Image.open(path) as im:
                img = np.asarray(im.convert("L"), dtype=np.uint8)
            if img.shape != (32, 32):
                raise ValueError(f"{path} is {img.shape}, expected a 32×32 Pathfinder-32 image")
            images.append(img.reshape(-1))
            labels.append(int(fields[3]))
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def extract_prefix(archive: str | os.PathLike, prefix: str, dest: str | os.PathLike) -> Path:
    """Extract the members of a tar archive under `prefix` into `dest` (once: a `.done` stamp marks a finished
    extraction; an interrupted one is started over). Paths that would leave `dest` are refused."""
    dest = Path(dest)
    stamp = dest / ".done"
    if stamp.exists():
        return dest
    tmp = dest.with_name(dest.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    found = 0
    with tarfile.open(archive, "r|*") as tar:  # streaming: the release is one 7 GB gzip
        for member in tar:
            name = member.name.lstrip("./")
            if not name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = Path(name[len(prefix):].lstrip("/"))
            if rel.is_absolute() or ".." in rel.parts:
                raise ValueError(f"refusing archive member {member.name!r}: it points outside the extraction folder")
            out = tmp / rel
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(member).read())
            found += 1
    if not found:
        raise ValueError(f"{archive} has no members under {prefix!r}: is it lra_release.gz?")
    (tmp / ".done").write_text(f"{found} files from {Path(archive).name}:{prefix}\n")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest
