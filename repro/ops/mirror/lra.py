"""The mirror's Long Range Arena sources (`repro.ops.mirror`): `lra_release.gz` (ListOps TSVs, the AAN pairs of
Retrieval, Pathfinder-32 PNGs with their text `.npy` metadata, a few empty PNGs as in the release), IMDb's
`aclImdb_v1.tar.gz` and CIFAR-10's python pickle batches, in the real archive layouts with made-up content.

ListOps comes from our own generator (`repro.data.listops`) at miniature lengths; the CIFAR-10 batches hold 1,100
images each instead of 10,000 (the Image task keeps the last 5,000 training images for validation).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from repro.ops.mirror.layout import file_of, write_tar_gz
from repro.ops.mirror.text import Words


def _png(pixels) -> bytes:
    from PIL import Image  # optional: Pillow (matplotlib's dependency, not ours)

    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def build_lra(root: Path, words: Words, info: dict) -> None:
    import numpy as np  # heavy: numpy

    from repro.data.listops import LISTOPS_FILES, ListOpsSpec, generate_listops_examples  # heavy: numpy
    from repro.data.lra_sources import CIFAR10_URL, IMDB_URL, LRA_RELEASE_URL  # heavy: numpy

    rng = np.random.default_rng(0)
    members: dict[str, bytes] = {}
    spec = ListOpsSpec(n_train=40, n_valid=8, n_test=8, min_length=20, max_length=200, seed=7)
    rows = generate_listops_examples(spec)
    for split, name in LISTOPS_FILES.items():
        members[f"lra_release/listops-1000/{name}"] = ("Source\tTarget\n" + "".join(
            f"{s}\t{y}\n" for s, y in rows[split])).encode()
    aan = {}
    for split in ("train", "eval", "test"):
        lines = []
        for i in range(24 if split == "train" else 8):
            a, b = (" ".join(" ".join(words.sentence()) for _ in range(20)) for _ in range(2))
            lines.append(f"{i % 2}.0\tacl_{split}_{i}a\tacl_{split}_{i}b\t{a}\t{b}\n")
        aan[split] = lines
        members[f"lra_release/tsv_data/new_aan_pairs.{split}.tsv"] = "".join(lines).encode()
    pf = {}
    for diff in ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14"):
        meta = []
        for i in range(20):
            label = i % 2
            img = (rng.random((32, 32)) < 0.1).astype(np.uint8) * 255
            img[16, 4:28] = 255 if label else 0
            members[f"lra_release/pathfinder32/{diff}/imgs/0/sample_{i}.png"] = _png(img)
            meta.append(f"imgs/0 sample_{i}.png 0 {label} 1.8 6 2 5 2 0\n")
        members[f"lra_release/pathfinder32/{diff}/imgs/0/sample_20.png"] = b""  # the release has a few empty PNGs
        meta.append("imgs/0 sample_20.png 0 1 1.8 6 2 5 2 0\n")
        members[f"lra_release/pathfinder32/{diff}/metadata/0.npy"] = "".join(meta).encode()
        pf[diff] = 20
    write_tar_gz(file_of(root, LRA_RELEASE_URL), members)

    imdb: dict[str, bytes] = {"aclImdb/README": b"Large Movie Review Dataset v1.0 (miniature mirror copy)\n",
                              "aclImdb/imdb.vocab": "\n".join(words.words[:200]).encode()}
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            for i in range(10):
                text = " ".join(" ".join(words.sentence()) + "." for _ in range(words.rng.randint(3, 12)))
                imdb[f"aclImdb/{split}/{label}/{i}_{7 if label == 'pos' else 2}.txt"] = (text + "<br /><br />").encode()
        imdb[f"aclImdb/{split}/urls_pos.txt"] = b"http://www.imdb.com/title/tt0000001/usercomments\n"
    imdb["aclImdb/train/unsup/0_0.txt"] = b"an unlabelled review"
    write_tar_gz(file_of(root, IMDB_URL), imdb)

    # CIFAR-10: the train/valid split of the Image task keeps the last 5,000 training images for validation, so
    # the five batches hold 1,100 images each (5,500; the real ones 10,000). Smooth images compress well.
    cifar: dict[str, bytes] = {}
    labels_all = []

    def batch(name: str, n: int, seed: int) -> bytes:
        r = np.random.default_rng(seed)
        labels = r.integers(0, 10, n)
        base = np.arange(1024) % 32
        x = np.concatenate([np.tile(base * (c + 1), (n, 1)) for c in range(3)], axis=1)
        x = ((x + labels[:, None] * 20) % 256).astype(np.uint8)
        labels_all.append(labels)
        return pickle.dumps({b"batch_label": name.encode(), b"labels": [int(v) for v in labels], b"data": x,
                             b"filenames": [f"img_{i}.png".encode() for i in range(n)]}, protocol=2)

    for i in range(1, 6):
        cifar[f"cifar-10-batches-py/data_batch_{i}"] = batch(f"training batch {i} of 5", 1100, i)
    cifar["cifar-10-batches-py/test_batch"] = batch("testing batch 1 of 1", 500, 9)
    cifar["cifar-10-batches-py/batches.meta"] = pickle.dumps(
        {b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship",
                          b"truck"], b"num_cases_per_batch": 1100, b"num_vis": 3072}, protocol=2)
    cifar["cifar-10-batches-py/readme.html"] = b"<html>CIFAR-10 (miniature mirror copy)</html>\n"
    write_tar_gz(file_of(root, CIFAR10_URL), cifar)
    info["lra"] = {"listops": {s: len(r) for s, r in rows.items()},
                   "listops_labels": {s: [y for _, y in r] for s, r in rows.items()},
                   "aan": {s: len(v) for s, v in aan.items()}, "pathfinder": pf,
                   "imdb": {"train": 20, "test": 20}, "cifar": {"train": 5500, "test": 500}}
