"""Make the Long Range Arena data parity fixture from the reference pipelines: `python tests/parity/make_lra_data.py
LRA` with LRA a checkout of google-research/long-range-arena, run in an environment with TensorFlow,
TensorFlow Datasets and TensorFlow Text (not torch: `pip install tensorflow-cpu tensorflow-datasets
tensorflow-text` in a separate virtual environment). Writes `tests/parity/data/lra.json`.

Follows `make_data.py` (the language-model corpora). MGK's LRA code trains on the pickles of Nyströmformer's
`LRA/datasets/{listops,text,retrieval,cifar10}.py`, which call LRA's input pipelines with batch 1 and append 48,
24 and 96 zeros (ListOps, Text, Retrieval). The miniature inputs of `lra_sources.py` go through those pipelines
unmodified — `listops/input_pipeline.get_datasets`, `text_classification/input_pipeline.get_tc_datasets` (byte
level), `matching/input_pipeline.get_matching_datasets` (`tokenizer='char'`), `image/input_pipeline
.get_cifar10_datasets` — with one run-time shim: `tfds.load`, which would download IMDb and CIFAR-10, returns the
miniatures instead: IMDb examples made by the TensorFlow Datasets IMDb builder's own `_generate_examples` from the
miniature archive (labels by its class names neg, pos), CIFAR-10 pictures in the builder's layout (32 × 32 × 3).
Saved: every example's tokens (ListOps: the symbols, decoded by the pipeline's own encoder; text: the ids), its
label and its length in the pickle; the grey levels of every picture of the test split (which the pipeline keeps in
order); which training pictures `train[:90%]` and `train[90%:]` serve, in order, after the CIFAR-10 builder of
TensorFlow Datasets prepared a miniature of the binary release (its download shimmed to a local folder). The pipelines
shuffle some splits: the test compares each split as a sorted list.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lra_sources as src

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "lra.json"


def commit_of(checkout: Path) -> str:
    """`tests/parity/common.py` `checkout_commit`, repeated: that module imports torch, which this environment lacks."""
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        marker = checkout / "COMMIT"
        if marker.is_file():
            return marker.read_text().strip()
        raise SystemExit(f"{checkout}: no git history and no COMMIT file") from None


def pipeline(lra: Path, task: str):
    """LRA's `lra_benchmarks/<task>/input_pipeline.py` as a module of its own (the four share the name)."""
    path = lra / "lra_benchmarks" / task / "input_pipeline.py"
    spec = importlib.util.spec_from_file_location(f"lra_{task}_input_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(ds):
    return [{k: v.numpy() for k, v in ex.items()} for ex in ds]


def listops(lra: Path, tmp: Path) -> dict:
    for name, text in src.listops_files().items():
        (tmp / name).write_text(text)
    train, val, test, encoder = pipeline(lra, "listops").get_datasets(
        n_devices=1, task_name="basic", data_dir=str(tmp) + "/", batch_size=1, max_length=src.LISTOPS_MAX)
    vocab = list(encoder.tokens)
    out = {}
    for split, ds in (("train", train), ("valid", val), ("test", test)):
        examples = []
        for ex in rows(ds):
            ids = np.concatenate([ex["inputs"][0], np.zeros(src.LISTOPS_EXTRA, dtype=np.int32)])  # listops.py
            real = [int(i) for i in ids if i != 0]
            assert all(i != 0 for i in ids[: len(real)]), "a pad inside a sequence"
            examples.append({"tokens": [vocab[i - 1] for i in real], "label": int(ex["targets"][0]),
                             "length": len(ids)})
        out[split] = sorted(examples, key=json.dumps)
    return out


def imdb_load_shim(archive: Path):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    builder = tfds.builder_cls("imdb_reviews")

    def split(directory: str):
        iterator = tfds.download.iter_archive(str(archive), tfds.download.ExtractMethod.TAR_GZ_STREAM)
        examples = list(builder._generate_examples(None, iterator, directory))
        texts = [ex["text"] for _, ex in examples]
        labels = [["neg", "pos"].index(ex["label"]) for _, ex in examples]
        return tf.data.Dataset.from_tensor_slices({"text": texts, "label": np.asarray(labels, dtype=np.int64)})

    def load(name, **kwargs):
        assert name == "imdb_reviews", name
        return {"train": split("aclImdb/train"), "test": split("aclImdb/test")}

    return load


def text(lra: Path, tmp: Path) -> dict:
    archive = src.write_tar_gz(tmp / "aclImdb_v1.tar.gz", src.IMDB_REVIEWS)
    module = pipeline(lra, "text_classification")
    load, module.tfds.load = module.tfds.load, imdb_load_shim(archive)  # the shim: no download
    try:
        train, val, test, _ = module.get_tc_datasets(n_devices=1, task_name="imdb_reviews", data_dir=None,
                                                     batch_size=1, fixed_vocab=None, max_length=src.TEXT_MAX)
    finally:
        module.tfds.load = load
    out = {}
    for split, ds in (("train", train), ("valid", val), ("test", test)):
        examples = []
        for ex in rows(ds):
            ids = np.concatenate([ex["inputs"][0], np.zeros(src.TEXT_EXTRA, dtype=np.int32)])  # text.py
            examples.append({"ids": [int(i) for i in ids if i != 0], "label": int(ex["targets"][0]),
                             "length": len(ids)})
        out[split] = sorted(examples, key=json.dumps)
    return out


def retrieval(lra: Path, tmp: Path) -> dict:
    for name, data in src.aan_files().items():
        (tmp / name).write_bytes(data)
    train, val, test, _ = pipeline(lra, "matching").get_matching_datasets(
        n_devices=1, task_name=None, data_dir=str(tmp), batch_size=1, fixed_vocab=None,
        max_length=src.RETRIEVAL_MAX, tokenizer="char", vocab_file_path=None)
    out = {}
    for split, ds in (("train", train), ("valid", val), ("test", test)):
        examples = []
        for ex in rows(ds):
            a, b = (np.concatenate([ex[k][0], np.zeros(src.RETRIEVAL_EXTRA, dtype=np.int32)])  # retrieval.py
                    for k in ("inputs1", "inputs2"))
            examples.append({"ids1": [int(i) for i in a if i != 0], "ids2": [int(i) for i in b if i != 0],
                             "label": int(ex["targets"][0]), "length": len(a)})
        out[split] = sorted(examples, key=json.dumps)
    return out


def image(lra: Path) -> dict:
    import tensorflow as tf

    x, y = src.cifar_images()
    hwc = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # the CIFAR-10 builder's (32, 32, 3)

    def load(name, split, **kwargs):
        assert name == "cifar10", name
        return tf.data.Dataset.from_tensor_slices({"image": hwc, "label": y})

    module = pipeline(lra, "image")
    original, module.tfds.load = module.tfds.load, load  # the shim: no download; every split the miniature pictures
    try:
        _, _, test, *_ = module.get_cifar10_datasets(n_devices=1, batch_size=1, normalize=False)
    finally:
        module.tfds.load = original
    grey = np.stack([ex["inputs"][0].reshape(-1) for ex in rows(test)])  # cifar10.py: reshape(-1)
    assert grey.shape == (len(x), 1024) and grey.min() >= 0 and grey.max() <= 255
    return {"grey_levels_uint8_base64": base64.b64encode(grey.astype(np.uint8).tobytes()).decode(),
            "labels": [int(ex["targets"][0]) for ex in rows(test)]}


def cifar_split(tmp: Path) -> dict:
    """Which training pictures `tfds.load('cifar10', split='train[90%:]')` serves, in order (LRA's validation split):
    the CIFAR-10 builder of TensorFlow Datasets prepares a miniature of the binary release (`CIFAR_TRAIN` pictures
    over the five batch files, with the download replaced by the local folder) with its own writer, which orders a
    split by the md5 of its keys; each served picture is named by its index in the batch files."""
    import tensorflow_datasets as tfds

    root = tmp / "cifar_bin"
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    (folder / "batches.meta.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    per = src.CIFAR_TRAIN // 5
    for b in range(5):
        # each picture carries its index in its first two red values (the builder keeps no id in the examples)
        records = b"".join(bytes([i % 10, i // 256, i % 256]) + bytes(3070) for i in range(b * per, (b + 1) * per))
        (folder / f"data_batch_{b + 1}.bin").write_bytes(records)
    (folder / "test_batch.bin").write_bytes(b"".join(bytes([i % 10]) + bytes(3072) for i in range(10)))
    manager = tfds.download.DownloadManager
    fetch, manager.download_and_extract = manager.download_and_extract, lambda self, url: str(root)  # the shim
    data_dir = tmp / "tfds"
    try:
        tfds.builder("cifar10", data_dir=str(data_dir)).download_and_prepare()
    finally:
        manager.download_and_extract = fetch
    out = {}
    for split in ("train[:90%]", "train[90%:]"):
        ds = tfds.load("cifar10", split=split, data_dir=str(data_dir), shuffle_files=False)
        out[split] = [int(im[0, 0, 0]) * 256 + int(im[0, 1, 0]) for im in (ex["image"].numpy() for ex in ds)]
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[0])
    lra = Path(sys.argv[1]).resolve()
    if not (lra / "lra_benchmarks" / "listops" / "input_pipeline.py").is_file():
        raise SystemExit(f"{lra}: not a checkout of google-research/long-range-arena")
    import tensorflow as tf
    import tensorflow_datasets as tfds
    import tensorflow_text

    sys.path.insert(0, str(lra))  # image/input_pipeline.py imports lra_benchmarks.data
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fixture = {
            "repo": "google-research/long-range-arena", "commit": commit_of(lra),
            "versions": {"tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__,
                         "tensorflow_text": tensorflow_text.__version__},
            "max_length": {"listops": src.LISTOPS_MAX, "text": src.TEXT_MAX, "retrieval": src.RETRIEVAL_MAX},
            "listops": listops(lra, tmp), "text": text(lra, tmp), "retrieval": retrieval(lra, tmp),
            "image": image(lra), "cifar10_split": cifar_split(tmp),
        }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = OUT.with_suffix(".json.part")
    tmp_out.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    os.replace(tmp_out, OUT)
    print(f"{OUT}: listops {[len(fixture['listops'][s]) for s in ('train', 'valid', 'test')]}, text "
          f"{[len(fixture['text'][s]) for s in ('train', 'valid', 'test')]}, retrieval "
          f"{[len(fixture['retrieval'][s]) for s in ('train', 'valid', 'test')]}, "
          f"image {len(fixture['image']['labels'])}")


if __name__ == "__main__":
    main()
