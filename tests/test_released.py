"""The released Transformer-XL models' commands (`repro released download|evaluate`),
tried as a user would against the loopback mirror serving the authors' URL layout with files the authors' TF code
wrote (tests/parity/transformer_xl_tf/): the download records and prints each file's size and sha256 and reuses
them offline; the evaluation converts the checkpoint, reads the released vocabulary and test split from cache.pkl
and gives the mean NLL of its segments as a hand-assembled evaluation does; a damaged file is refused in one line."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from papers.transformer_xl import released
from papers.transformer_xl.released import RELEASES, Release, TFProtocol, load_tf, tf_protocol_nll
from repro.data import download as dl
from repro.ops import mirror
from repro.weights.py2pickle import load

FIX = Path(__file__).resolve().parent / "parity" / "transformer_xl_tf"
HOST = "curtis.ml.cmu.edu/datasets/pretrained_xl"


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A mirror holding the enwik8 release's files at the authors' paths (the TF fixture's model, the miniature
    cache.pkl), served on 127.0.0.1."""
    root = tmp_path / "mirror"
    rel = RELEASES["enwik8"]
    files = {"data/cache.pkl": FIX / "cache.pkl", "model/checkpoint": FIX / "enwik8" / "checkpoint",
             "model/model.ckpt-0.index": FIX / "enwik8" / "model.ckpt-0.index",
             "model/model.ckpt-0.data-00000-of-00001": FIX / "enwik8" / "model.ckpt-0.data-00000-of-00001"}
    sums = []
    for rel_path in rel.files():
        dest = root / "files" / HOST / rel.folder / rel_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if rel_path in files:
            shutil.copy(files[rel_path], dest)
        else:
            dest.write_text(json.dumps({"vocab_size": 40, "dataset": "enwik8"}))
        sums.append(f"{hashlib.sha256(dest.read_bytes()).hexdigest()}  {HOST}/{rel.folder}/{rel_path}")
    (root / "files" / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    (root / "manifest.json").write_text("{}")
    with mirror.serve(root) as server:
        monkeypatch.setenv(dl.MIRROR_ENV, server.url)
        monkeypatch.setattr(dl, "_mirror_sums", {})
        yield root


def test_download_records_each_file_and_reuses_it_offline(served, tmp_path, capsys, monkeypatch):
    folder = released.download_released("enwik8", tmp_path / "pretrained_xl")
    said = capsys.readouterr().out.splitlines()
    assert len(said) == len(RELEASES["enwik8"].files())
    for line, rel_path in zip(said, RELEASES["enwik8"].files()):
        f = folder / rel_path
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        assert f"{f.stat().st_size:,} bytes sha256 {digest}" in line
        assert (f.parent / (f.name + ".sha256")).read_text().split()[0] == digest
    # no mirror, and the authors' host unreachable from here: the files present are checked and kept
    monkeypatch.delenv(dl.MIRROR_ENV)
    released.download_released("enwik8", tmp_path / "pretrained_xl")
    assert len(capsys.readouterr().out.splitlines()) == len(said)


def test_evaluate_gives_the_mean_nll_of_the_test_segments(served, tmp_path):
    root = tmp_path / "pretrained_xl"
    released.download_released("enwik8", root)
    meta = json.loads((FIX / "enwik8" / "fixture.json").read_text())
    mini = Release(RELEASES["enwik8"].folder, "model.ckpt-0", released.Layout(n_head=2, d_head=8), tgt_len=4,
                   protocol=TFProtocol(meta["mem_len"], meta["clamp_len"], True), batch=2, level="char", paper=0.99)
    record = released.evaluate_released("enwik8", root, release=mini)
    # by hand: cache.pkl's test split in 2 streams, consecutive segments of 4, the TF protocol
    test = np.asarray(load(FIX / "cache.pkl").test)
    n = len(test) // 2
    streams = torch.tensor(test[: 2 * n]).view(2, n)
    segments = [(streams[:, k * 4:(k + 1) * 4], streams[:, k * 4 + 1:(k + 1) * 4 + 1]) for k in range((n - 1) // 4)]
    model = load_tf(FIX / "enwik8" / "model.ckpt-0", mini.layout)
    nll = torch.cat([x.flatten() for x in tf_protocol_nll(model, segments, mini.protocol)])
    assert record["segments"] == len(segments) >= 2 and record["tokens"] == nll.numel()
    assert record["loss"] == pytest.approx(nll.mean().item(), abs=1e-6)


def test_a_damaged_download_is_refused_in_one_line(served, tmp_path):
    root = tmp_path / "pretrained_xl"
    folder = released.download_released("enwik8", root)
    data = folder / "model" / "model.ckpt-0.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(SystemExit) as err:
        released.main(["download", "enwik8", "--root", str(root)])
    text = str(err.value.code)
    assert text.startswith("error: ") and data.name in text and "\n" not in text
