"""Make the data parity fixtures from the authors' data pipeline: `python tests/parity/make_data.py TXL AWD` with
TXL a checkout of kimiyoung/transformer-xl and AWD one of salesforce/awd-lstm-lm (Transformer-XL's `getdata.sh`
fetches `data/enwik8/prep_enwik8.py` from it). Writes `tests/parity/data/<corpus>.pt`.

Follows `tests/parity/common.py`. The miniature corpora of `tests/parity/data_sources.py` go through the official
steps unmodified: `getdata.sh`'s renames (done here), `prep_enwik8.py` and `prep_text8.py` (run as scripts in the
corpus folder, reading the zip as downloaded), then `pytorch/data_utils.py` `get_lm_corpus` (their vocabulary and
encoding, the settings `train.py` uses per dataset) and `LMOrderedIterator` (their ordered batches). LaMemo's and
MGK's language-model code carry the same `Corpus` and `Vocab` (their `data_utils.py` adds iterators). Saved per
corpus: the vocabulary's size (and its symbols' digest for word corpora), every split's length, the sha256 of its
ids (int32, little-endian), its first and last ids, and the sha256 of the batches
`LMOrderedIterator(split, bsz=4, bptt=37)` yields (inputs and targets, time-first, concatenated). The test builds the
same corpora with ours and compares all of it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.parity import data_sources
from tests.parity.common import HERE, checkout_commit, on_path, save_fixture

OUT = HERE / "data"
BSZ, BPTT = 4, 37
SPLITS = ("train", "valid", "test")


def ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int32).contiguous().numpy().astype("<i4").tobytes()).hexdigest()


def symbols_digest(symbols: list[str]) -> str:
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()


def batches_digest(data_utils, ids: torch.Tensor) -> tuple[int, str]:
    it = data_utils.LMOrderedIterator(ids, BSZ, BPTT)
    xs, ys = zip(*((x, y) for x, y, _ in it.get_fixlen_iter()))
    return len(xs), ids_digest(torch.cat([torch.cat(xs), torch.cat(ys)]))


def write_text(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))  # as the archive holds it: no newline translation


def prepare(folder: Path, corpus: str, txl: Path, awd: Path) -> None:
    """The folder `train.py --data` points at, as `getdata.sh` leaves it."""
    folder.mkdir(parents=True)
    if corpus == "wt103":  # unzip, then mv wiki.<split>.tokens <split>.txt
        for split, text in data_sources.wikitext().items():
            write_text(folder / f"{split}.txt", text)
    elif corpus == "ptb":  # mv ../simple-examples/data/ptb.<split>.txt <split>.txt
        for split, text in data_sources.ptb().items():
            write_text(folder / f"{split}.txt", text)
    else:
        data, script = {"enwik8": (data_sources.enwik8(), awd / "data" / "enwik8" / "prep_enwik8.py"),
                        "text8": (data_sources.text8(), txl / "prep_text8.py")}[corpus]
        with zipfile.ZipFile(folder / f"{corpus}.zip", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(corpus, data)
        subprocess.run([sys.executable, str(script)], cwd=folder, check=True, stdout=subprocess.DEVNULL)


def make(corpus: str, data_utils, txl: Path, awd: Path, commits: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / corpus
        prepare(folder, corpus, txl, awd)
        c = data_utils.get_lm_corpus(str(folder), corpus)
    tensors, meta = {}, {"corpus": corpus, "vocab_size": len(c.vocab), "bsz": BSZ, "bptt": BPTT,
                         "repo": "kimiyoung/transformer-xl", "commit": commits["txl"],
                         "file": "pytorch/data_utils.py, utils/vocabulary.py" + (
                             ", prep_text8.py" if corpus == "text8" else "")}
    if corpus == "enwik8":
        meta["prep"] = {"repo": "salesforce/awd-lstm-lm", "commit": commits["awd"],
                        "file": "data/enwik8/prep_enwik8.py"}
    if corpus in ("wt103", "ptb"):
        meta["symbols_sha256"] = symbols_digest(list(c.vocab.idx2sym))
    for split in SPLITS:
        ids = getattr(c, split)
        n_batch, digest = batches_digest(data_utils, ids)
        meta[split] = {"tokens": int(ids.numel()), "sha256": ids_digest(ids), "batches": n_batch,
                       "batches_sha256": digest}
        tensors[f"output.{split}.head"] = ids[:64].to(torch.int32)
        tensors[f"output.{split}.tail"] = ids[-64:].to(torch.int32)
    save_fixture(OUT / f"{corpus}.pt", tensors, meta)
    print(f"{corpus}: {len(c.vocab)} symbols, " + ", ".join(f"{s} {meta[s]['tokens']:,}" for s in SPLITS))


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python tests/parity/make_data.py PATH/TO/transformer-xl PATH/TO/awd-lstm-lm")
    txl, awd = Path(sys.argv[1]), Path(sys.argv[2])
    if not (txl / "pytorch" / "data_utils.py").is_file() or not (txl / "prep_text8.py").is_file():
        raise SystemExit(f"{txl}: no pytorch/data_utils.py or prep_text8.py; "
                         "pass a checkout of kimiyoung/transformer-xl")
    if not (awd / "data" / "enwik8" / "prep_enwik8.py").is_file():
        raise SystemExit(f"{awd}: no data/enwik8/prep_enwik8.py; pass a checkout of salesforce/awd-lstm-lm")
    commits = {"txl": checkout_commit(txl), "awd": checkout_commit(awd)}
    with on_path(txl / "pytorch"):  # inside: their get_lm_corpus pickles its Corpus (a cache.pt) by module name
        import data_utils

        for corpus in ("wt103", "ptb", "enwik8", "text8"):
            make(corpus, data_utils, txl, awd, commits)


if __name__ == "__main__":
    main()
