"""Our corpora against the authors' data pipeline: the fixtures of `make_data.py` (Transformer-XL's `getdata.sh`
steps, `prep_enwik8.py`, `prep_text8.py`, `data_utils.get_lm_corpus` and `LMOrderedIterator`, run on the
miniature corpora of `data_sources.py`) against our builders (`repro/data/corpora.py`) and our ordered segments
(`repro/data/lm.py` `LMSegments`) on the same bytes: vocabulary size (and the symbols of the word corpora), every
split's ids, and every batch of inputs and targets. LaMemo's and MGK's language-model code carry the same
`Corpus` and `Vocab` (their `data_utils.py` adds iterators), so this holds for the three papers' WikiText-103,
enwik8 and text8 runs; LaMemo's `--roll` is tested in tests/test_data.py.

The miniatures hold what separates line-reading rules (`\\x0b` … `\\u2029` inside lines, `\\r\\n` and `\\r`), byte
values counted only in validation and test, ties in the frequency order and spaces at the split boundaries; the
last test shows that reading lines with `str.splitlines`, as the WikiText-103 and PTB builders did before,
changes the ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.data import corpora
from repro.data.lm import LMSegments
from tests.parity import data_sources
from tests.parity.common import HERE, load_fixture

FIX = HERE / "data"
CORPORA = ("wt103", "ptb", "enwik8", "text8")


def _digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def _files(tmp: Path, texts: dict[str, str]) -> dict[str, Path]:
    paths = {}
    for split, text in texts.items():
        paths[split] = tmp / f"{split}.txt"
        paths[split].write_bytes(text.encode("utf-8"))
    return paths


def build_ours(corpus: str, tmp: Path) -> corpora.Built:
    """Our corpus from the miniature, through the functions the registry's builders call after the download."""
    if corpus == "wt103":
        return corpora._build_word(corpora.wikitext103_lines(_files(tmp, data_sources.wikitext())), {})
    if corpus == "ptb":
        return corpora.build_ptb(corpora.ptb_lines(_files(tmp, data_sources.ptb())), {})
    if corpus == "enwik8":  # the Transformer-XL pipeline's enwik8: our `enwik8-txl`
        return corpora._build_char(corpora.enwik8_splits(data_sources.enwik8(), drop_newlines=True), {})
    return corpora._build_char(corpora.text8_splits(data_sources.text8()), {})


def batches_digest(ids: np.ndarray, bsz: int, bptt: int) -> tuple[int, str]:
    """Our segments as theirs lay them out: every segment's inputs then every segment's targets, time-first."""
    segs = list(LMSegments(torch.from_numpy(ids.astype(np.int64)), batch_size=bsz, tgt_len=bptt))
    xs = torch.cat([s.input.T for s in segs])
    ys = torch.cat([s.target.T for s in segs])
    return len(segs), _digest(torch.cat([xs, ys]).numpy())


@pytest.mark.parametrize("corpus", CORPORA)
def test_corpus_equals_the_authors_pipeline(corpus, tmp_path):
    tensors, meta = load_fixture(FIX / f"{corpus}.pt")
    assert meta["repo"] == "kimiyoung/transformer-xl" and len(meta["commit"]) == 40
    built = build_ours(corpus, tmp_path)
    assert len(built.vocab) == meta["vocab_size"]
    if "symbols_sha256" in meta:
        assert hashlib.sha256("\n".join(built.vocab.symbols).encode()).hexdigest() == meta["symbols_sha256"]
    for split in corpora.SPLITS:
        ids, want = built.splits[split], meta[split]
        assert len(ids) == want["tokens"], split
        assert ids[:64].tolist() == tensors[f"output.{split}.head"].tolist(), split
        assert ids[-64:].tolist() == tensors[f"output.{split}.tail"].tolist(), split
        assert _digest(ids) == want["sha256"], split
        assert batches_digest(ids, meta["bsz"], meta["bptt"]) == (want["batches"], want["batches_sha256"]), split


def test_the_miniatures_hold_what_tells_the_rules_apart():
    texts = data_sources.wikitext()
    assert all(any(c in texts[s] for s in texts) for c in data_sources.ODD) and "\r\n" in texts["train"]
    data = data_sources.enwik8()
    valid, test = data[-2 * data_sources.HUTTER_TAIL : -data_sources.HUTTER_TAIL], data[-data_sources.HUTTER_TAIL :]
    train = data[: -2 * data_sources.HUTTER_TAIL]
    assert b"\x01" in valid and b"\x02" in test and b"\x01" not in train and b"\x02" not in train
    t8 = data_sources.text8()
    assert t8[:1] == t8[-1:] == b" "


def test_reading_lines_with_splitlines_changes_the_ids(tmp_path):
    """Before this fixture existed our WikiText-103 and PTB builders read lines with `str.splitlines`: on the
    miniature that adds `<eos>` tokens where the reference has none."""
    _, meta = load_fixture(FIX / "wt103.pt")
    paths = _files(tmp_path, data_sources.wikitext())
    lines = {s: p.read_text(encoding="utf-8").splitlines() for s, p in paths.items()}
    built = corpora._build_word(lines, {})
    assert len(built.splits["train"]) > meta["train"]["tokens"]
