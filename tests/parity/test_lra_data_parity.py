"""Long Range Arena data parity: the miniature inputs of `lra_sources.py` through our readers, splits and batches
equal what the reference's pipelines made of them (`data/lra.json`, from `make_lra_data.py`: LRA's input
pipelines as Nyströmformer's `LRA/datasets/*.py` call them, the pickles MGK's `run_tasks.py` trains on).

Compared per split, as sorted lists (the reference shuffles some splits): ListOps symbols (ours `]`, theirs `X`,
which LRA renames it to), labels and the padded length of `data.pad_to`; Text and Retrieval byte ids (byte + 1, as
`ByteTextEncoder`), labels and padded lengths; the grey levels of every Image picture, and with
`data.black_is_padding` the ids and pad mask the reference's model sees.

Found by this test (2026-11-26) and fixed: the IMDb builder strips every review of whitespace at both ends, ours
did not; our grey levels were round(0.2989 R + 0.5870 G + 0.1140 B), which differs from `tf.image.rgb_to_grayscale`
(float32 scaling, truncation) on 3,809 of the miniature's 16,384 pixels; our Image validation took the last 5,000
pictures of the batch files, the reference's are the last 5,000 of TensorFlow Datasets' hash order.
"""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.data import listops, lra, lra_sources, lra_tasks
from tests.parity import lra_sources as src

FIXTURE = Path(__file__).resolve().parent / "data" / "lra.json"
SPLITS = ("train", "valid", "test")


@pytest.fixture(scope="module")
def theirs():
    return json.loads(FIXTURE.read_text())


def batch_rows(split: lra_tasks.Split, *, pad_to: int, black_is_padding: bool = False) -> list[lra.Batch]:
    collate = lra._collate(split, pad_to=pad_to, black_is_padding=black_is_padding)
    return [collate([i]) for i in range(len(split.labels))]


def test_listops(theirs, tmp_path):
    files = src.listops_files()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    symbols = {i: ("X" if s == "]" else s) for i, s in enumerate(listops.LISTOPS_VOCAB)}
    pad_to = src.LISTOPS_MAX + src.LISTOPS_EXTRA
    for ours_split, file in zip(SPLITS, ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")):
        rows = listops.read_listops_tsv(tmp_path / file)
        split = lra_tasks._split_from([r[0] for r in rows], [r[1] for r in rows], src.LISTOPS_MAX)
        ours = []
        for b in batch_rows(split, pad_to=pad_to):
            ids = b.tokens[0].tolist()
            ours.append({"tokens": [symbols[i] for i in ids if i], "label": int(b.labels[0]), "length": len(ids)})
        assert sorted(ours, key=json.dumps) == theirs["listops"][ours_split], ours_split
    assert any(len(e["tokens"]) == src.LISTOPS_MAX for e in theirs["listops"]["test"])  # a truncated tree


def test_text(theirs, tmp_path):
    archive = src.write_tar_gz(tmp_path / "aclImdb_v1.tar.gz", src.IMDB_REVIEWS)
    splits = lra_tasks._text_splits(lra_sources.read_imdb(archive), src.TEXT_MAX)
    for s in SPLITS:
        ours = [{"ids": [i for i in b.tokens[0].tolist() if i], "label": int(b.labels[0]),
                 "length": b.tokens.shape[1]}
                for b in batch_rows(splits[s], pad_to=src.TEXT_MAX + src.TEXT_EXTRA)]
        assert sorted(ours, key=json.dumps) == theirs["text"][s], s


def test_retrieval(theirs, tmp_path):
    for name, data in src.aan_files().items():
        (tmp_path / name).write_bytes(data)
    splits = lra_tasks._retrieval_splits(tmp_path, src.RETRIEVAL_MAX)
    for s in SPLITS:
        ours = [{"ids1": [i for i in b.tokens[0].tolist() if i], "ids2": [i for i in b.tokens2[0].tolist() if i],
                 "label": int(b.labels[0]), "length": b.tokens.shape[1]}
                for b in batch_rows(splits[s], pad_to=src.RETRIEVAL_MAX + src.RETRIEVAL_EXTRA)]
        assert all(len(b.tokens2[0]) == src.RETRIEVAL_MAX + src.RETRIEVAL_EXTRA
                   for b in batch_rows(splits[s], pad_to=src.RETRIEVAL_MAX + src.RETRIEVAL_EXTRA))
        assert sorted(ours, key=json.dumps) == theirs["retrieval"][s], s


def _cifar_archive(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """cifar-10-python.tar.gz with every miniature picture in test_batch (the reference keeps its order) and one
    in each training batch."""
    batches = {**{f"data_batch_{i}": (x[i - 1: i], y[i - 1: i]) for i in range(1, 6)}, "test_batch": (x, y)}
    return src.write_tar_gz(path, {f"cifar-10-batches-py/{name}": pickle.dumps({b"data": xs, b"labels": ys.tolist()})
                                   for name, (xs, ys) in batches.items()})


def test_image_grey_levels_and_black_as_padding(theirs, tmp_path):
    x, y = src.cifar_images()
    grey = np.frombuffer(base64.b64decode(theirs["image"]["grey_levels_uint8_base64"]), dtype=np.uint8)
    grey = grey.reshape(len(x), 1024)
    assert theirs["image"]["labels"] == y.tolist()
    data = lra_sources.read_cifar10(_cifar_archive(tmp_path / "cifar-10-python.tar.gz", x, y))
    np.testing.assert_array_equal(data["test"][0], grey)
    test = lra_tasks._image_splits(data, n_valid=1)["test"]
    # the reference's model input: the grey levels themselves, 0 (black) masked as padding
    for i, b in enumerate(batch_rows(test, pad_to=1024, black_is_padding=True)):
        assert torch.equal(b.tokens[0], torch.from_numpy(grey[i].astype(np.int64)))
    ours = batch_rows(test, pad_to=1024)[0].tokens[0]  # our default: every pixel a token, black included
    assert bool((ours != 0).all()) and int(ours.min()) == 1
    assert int((grey == 0).sum()) >= 1024  # the black picture (and more): what the option masks


def test_image_validation_pictures_are_the_references(theirs):
    """LRA validates on `tfds.load('cifar10', split='train[90%:]')`: TensorFlow Datasets' own order of the training
    pictures (its writer's md5 of the keys), which the fixture took from a miniature the CIFAR-10 builder prepared."""
    served = theirs["cifar10_split"]
    n = src.CIFAR_TRAIN
    assert lra_tasks.tfds_order(n, "train").tolist() == served["train[:90%]"] + served["train[90%:]"]
    x = np.zeros((n, 3072), dtype=np.uint8)
    x[:, [0, 1024, 2048]] = np.arange(n)[:, None]  # each picture names itself in its first pixel, grey (R = G = B)
    grey = lra_sources.grey_levels(x)[:, 0]
    splits = lra_tasks._image_splits({"train": (x, np.arange(n) % 10), "test": (x[:2], np.zeros(2))},
                               n_valid=len(served["train[90%:]"]))
    index_of = {int(g): i for i, g in enumerate(grey)}
    assert len(index_of) == n
    for split, name in (("valid", "train[90%:]"), ("train", "train[:90%]")):
        got = [index_of[int(t) - 1] for t in splits[split].tokens[:, 0]]
        assert got == served[name], split
