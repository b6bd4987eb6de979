"""Miniature Long Range Arena inputs in the formats the reference pipelines read, the same bytes on every call: the
inputs of the LRA data parity fixture (`make_lra_data.py` feeds them to google-research/long-range-arena's input
pipelines and the TensorFlow Datasets IMDb builder, `test_lra_data_parity.py` to ours). numpy only: the fixture
is made in a TensorFlow environment without torch.

- ListOps: `basic_{train,val,test}.tsv` as LRA releases them (`Source<TAB>Target` header, each operator application
  written as nested binary parentheses, `]` closing it); every token occurs in the validation file (the reference
  builds its vocabulary from it) and one test tree is longer than `LISTOPS_MAX` (truncated by both).
- Text: an `aclImdb_v1.tar.gz` layout (`aclImdb/{train,test}/{pos,neg}/<id>_<stars>.txt`, with `unsup/` and
  `imdb.vocab`, which neither reads): reviews with spaces, tabs and newlines at both ends (the IMDb builder strips
  them), `<br />`, UTF-8 beyond ASCII, and one longer than `TEXT_MAX` bytes.
- Retrieval: `new_aan_pairs.{train,eval,test}.tsv` (label, id1, id2, text1, text2; no header; labels written as
  `1`, `0` and `1.0`), with double quotes (literal: the reference turns quoting off), non-ASCII text, a `\\r\\n`
  line end and texts longer than `RETRIEVAL_MAX` bytes.
- Image: CIFAR-10 pictures (R, G and B planes of 32 × 32, the python and binary releases' layout): black, white,
  pure channels, a ramp over every value and random ones; grey levels at every rounding boundary. And a training
  split of `CIFAR_TRAIN` pictures, for which TensorFlow Datasets' order decides the validation pictures.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

LISTOPS_MAX, TEXT_MAX, RETRIEVAL_MAX = 40, 60, 50  # max_length given to both pipelines
CIFAR_TRAIN = 60  # pictures of the miniature CIFAR-10 training split (12 per batch file)
LISTOPS_EXTRA, TEXT_EXTRA, RETRIEVAL_EXTRA = 48, 24, 96  # zeros Nyströmformer's LRA/datasets/*.py append
OPS = ("[MAX", "[MIN", "[MED", "[SM")


def _listops_source(rng: np.random.Generator, depth: int, max_args: int) -> str:
    """One tree in LRA's written form: `( ( ( [OP a ) b ) ] )` with nested arguments."""
    op = OPS[int(rng.integers(len(OPS)))]
    args = []
    for _ in range(int(rng.integers(2, max_args + 1))):
        args.append(_listops_source(rng, depth - 1, max_args) if depth > 1 and rng.random() < 0.35
                    else str(int(rng.integers(10))))
    text = op
    for a in args:
        text = f"( {text} {a} )"
    return f"( {text} ] )"


def listops_files() -> dict[str, str]:
    """File name → contents of the three ListOps TSVs."""
    rng = np.random.default_rng(7)
    out = {}
    for split, n, depth in (("train", 6, 3), ("val", 8, 3), ("test", 5, 4)):
        rows = [_listops_source(rng, depth, 4) for _ in range(n)]
        if split == "val":  # every operator and digit, so that the reference's vocabulary holds them all
            rows.append("( ( ( ( ( " + " ".join(f"{op} {d} )" for op, d in zip(OPS, range(4))) +
                        " ] ) ] ) ] ) ] )")
            rows.append("( ( ( [SM " + " ) ".join(str(d) for d in range(4, 10)) + " ) ] )")
        if split == "test":
            rows.append("( " * 60 + "[MAX " + " ) ".join(str(d % 10) for d in range(60)) + " ) ] )")
        lines = ["Source\tTarget"] + [f"{r}\t{int(rng.integers(10))}" for r in rows]
        out[f"basic_{split}.tsv"] = "\n".join(lines) + "\n"
    return out


IMDB_REVIEWS = {
    "aclImdb/train/pos/0_9.txt": b"  A fine film.<br /><br />Caf\xc3\xa9 cr\xc3\xa8me, and more.  \n",
    "aclImdb/train/pos/1_7.txt": b"Good " * 20,
    "aclImdb/train/neg/0_2.txt": b"\tDull \xe2\x80\x94 the \"plot\" drags.\r\n",
    "aclImdb/train/neg/1_1.txt": b"Bad. \xf0\x9f\x98\x80",
    "aclImdb/train/pos/2_8.txt": b"Fine.\n",  # the pipeline logs its fifth training example: five at least
    "aclImdb/train/unsup/0_0.txt": b"unlabelled: read by neither",
    "aclImdb/test/pos/0_10.txt": b"\n\nLoved it\n\n",
    "aclImdb/test/neg/0_3.txt": b"No.",
    "aclImdb/test/neg/1_4.txt": b"x" * 80 + b" end",
    "aclImdb/imdb.vocab": b"the\nand\n",
}


def write_tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    """A .tar.gz holding `members` (name → bytes), as the releases ship them (`aclImdb_v1.tar.gz`, CIFAR-10's)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def aan_files() -> dict[str, bytes]:
    """File name → contents of the three retrieval TSVs."""
    def line(label: str, i: int, a: bytes, b: bytes, end: bytes = b"\n") -> bytes:
        return b"\t".join([label.encode(), f"aan/{i:03d}.txt".encode(), f"aan/{i + 500:03d}.txt".encode(), a, b]) + end

    long = b"Long abstract " * 6
    return {
        "new_aan_pairs.train.tsv": line("1", 1, b'A "quoted" title', b"plain text") +
        line("0", 2, b"caf\xc3\xa9 na\xc3\xafve", long) + line("1.0", 3, long, b"short", b"\r\n"),
        "new_aan_pairs.eval.tsv": line("0", 4, b"x", b"y") + line("1", 5, b'"open quote', b"end\""),
        # the pipeline logs the fifth test pair: five at least
        "new_aan_pairs.test.tsv": line("0.0", 6, b"t1", long) + line("1", 7, b"a\xe2\x80\x94b", b"c") +
        b"".join(line(str(i % 2), i, b"pair %d" % i, b"other") for i in range(8, 11)),
    }


def cifar_images() -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 3072) uint8 as R, G, B planes of 32 × 32, labels (N,))."""
    rng = np.random.default_rng(11)
    planes = []
    flat = np.zeros((3, 1024), dtype=np.uint8)
    planes.append(flat.copy())  # black: the reference's pad id after grey conversion
    planes.append(np.full((3, 1024), 255, dtype=np.uint8))
    for c in range(3):  # a pure channel ramp over every value
        p = np.zeros((3, 1024), dtype=np.uint8)
        p[c] = np.arange(1024) % 256
        planes.append(p)
    planes.append(np.tile((np.arange(1024) % 256).astype(np.uint8), (3, 1)))  # grey ramp
    for _ in range(10):
        planes.append(rng.integers(0, 256, size=(3, 1024), dtype=np.uint8))
    x = np.stack(planes).reshape(len(planes), 3072)
    y = (np.arange(len(x)) % 10).astype(np.int64)
    return x, y
