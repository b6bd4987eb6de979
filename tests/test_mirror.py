"""The rehearsal mirror (`repro.ops.mirror`): every paper source's real data-preparation code run end to end
against the miniature archives served on 127.0.0.1, and the parsed streams checked against what the archives hold.

The expected values are computed here independently of the code under test: from the mirror's manifest (counts
written when the miniatures were generated) or by reading the archives with zipfile / tarfile / pyarrow directly.
The Hub sources (PG-19 through `datasets`, the GPT-2 tokenizer and checkpoint through `tokenizers` and
`transformers`) run in a subprocess, since `HF_ENDPOINT` is read when `huggingface_hub` is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from repro.data import corpora
from repro.data import download as dl
from repro.ops.mirror import GPT2_VOCAB, REAL_VOCAB, build_mirror, environment, serve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = build_mirror(tmp_path_factory.mktemp("mirror"), gpt2_size="small")
    info = json.loads((root / "manifest.json").read_text())["sources"]
    with serve(root, idle_timeout=300) as server:
        yield root, server, info


@pytest.fixture
def data(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_MIRROR", mirror[1].url)
    monkeypatch.setenv("REPRO_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def _member(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read(name)


@pytest.mark.slow
def test_server_loopback_range_and_idle_stop(mirror, tmp_path):
    root, server, _ = mirror
    assert server.url.startswith("http://127.0.0.1:")
    rel = "mattmahoney.net/dc/text8.zip"
    whole = (root / "files" / rel).read_bytes()
    req = urllib.request.Request(server.url + rel, headers={"Range": "bytes=100-"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206 and resp.read() == whole[100:]
    # an interrupted download resumes through the mirror (Range) and is verified against the mirror's SHA256SUMS
    os.environ["REPRO_MIRROR"] = server.url
    try:
        dest = tmp_path / "text8.zip"
        dl.part_path(dest).write_bytes(whole[:1000])
        dl.download("http://mattmahoney.net/dc/text8.zip", dest, sha256="0" * 64)  # the real checksum is replaced
        assert dest.read_bytes() == whole
        dest.write_bytes(whole[:-1] + b"x")  # damaged after download: refused
        with pytest.raises(dl.ChecksumError):
            dl.download("http://mattmahoney.net/dc/text8.zip", dest, sha256=None)
        with pytest.raises(dl.DownloadError, match="holds none"):
            dl.download("http://example.org/missing.zip", tmp_path / "m.zip", sha256=None)
    finally:
        del os.environ["REPRO_MIRROR"]
    with serve(root, idle_timeout=0.5) as short:
        time.sleep(2)
        assert not short.running


def test_wikitext103(data, mirror):
    root, _, info = mirror
    c = corpora.load_corpus("wt103")
    zip_path = root / "files/wikitext.smerity.com/wikitext-103-v1.zip"
    for split in ("train", "valid", "test"):
        text = _member(zip_path, f"wikitext-103/wiki.{split}.tokens").decode()
        assert len(c.splits[split]) == info["wt103"][split]["words"] + info["wt103"][split]["lines"]
        assert len(c.splits[split]) == len(text.split()) + len(text.splitlines())
    first = info["wt103"]["valid"]["first_line"].split()
    ids = c.splits["valid"][1 : 1 + len(first)].tolist()  # after the first (blank) line's <eos>
    assert [c.vocab.symbols[i] for i in ids] == first
    assert "<unk>" in c.vocab.index
    assert len(c.vocab) == REAL_VOCAB["wt103"] == 267_735  # paper-size models on the mirror


@pytest.mark.slow
def test_enwik8_and_text8(data, mirror):
    """enwik8 through the corpus build (10^8 bytes, as the real file: the split sizes are fixed); text8 through
    its download and split only (the same build code follows)."""
    from repro.data import sources

    root, _, info = mirror
    c = corpora.load_corpus("enwik8")
    raw = _member(root / "files/mattmahoney.net/dc/enwik8.zip", "enwik8")
    assert len(raw) == info["enwik8"]["bytes"] == 10**8
    assert {k: len(v) for k, v in c.splits.items()} == {"train": 90_000_000, "valid": 5_000_000, "test": 5_000_000}
    assert len(c.vocab) == info["enwik8"]["distinct_bytes"] == REAL_VOCAB["enwik8"] == 205
    assert len(c.splits["test"]) and raw.decode("utf-8")  # valid UTF-8, as the real file
    head = bytes(int(c.vocab.symbols[i]) for i in c.splits["test"][:200].tolist())
    assert head == raw[95_000_000:95_000_200]
    del c, raw
    raw = _member(root / "files/mattmahoney.net/dc/text8.zip", "text8")
    parts = corpora.text8_splits(sources.text8_bytes(data / "raw" / "text8"))
    assert set(raw) == set(b"abcdefghijklmnopqrstuvwxyz ") and len(set(raw)) == REAL_VOCAB["text8"]
    assert parts == {"train": raw[:-10**7].strip(), "valid": raw[-10**7:-5 * 10**6].strip(),
                     "test": raw[-5 * 10**6:].strip()}


@pytest.mark.slow
def test_one_billion_word(data, mirror):
    root, _, info = mirror
    c = corpora.load_corpus("lm1b")
    i = info["lm1b"]
    assert len(c.splits["test"]) == i["test_words"] + i["test_sentences"] + 1  # <S> between and around sentences
    assert len(c.splits["valid"]) == i["valid_words"] + i["valid_sentences"] + 1
    assert len(c.splits["train"]) == i["train_words"] + i["train_sentences"] + i["train_shards"]
    vocab_file = (root / "files/github.com/rafaljozefowicz/lm/raw/master/1b_word_vocab.txt").read_text()
    assert {line.split()[0] for line in vocab_file.splitlines()} <= set(c.vocab.symbols)
    assert (c.splits["test"] == c.vocab.index["<UNK>"]).any()  # the rarest words are not in the vocabulary
    assert len(c.vocab) == len(vocab_file.splitlines()) == REAL_VOCAB["lm1b"]


def test_ptb(data, mirror):
    info = mirror[2]["ptb"]
    c = corpora.load_corpus("ptb")
    for split, n in info.items():
        assert len(c.splits[split]) == n["words"] + n["lines"]
    assert len(c.vocab) == REAL_VOCAB["ptb"] == 10_000


def test_lra_tasks(data, mirror):
    from repro.data.lra import LRADataModule

    info = mirror[2]["lra"]
    expected = {"text": (20, 20, 20), "retrieval": (24, 8, 8), "image": (500, 5000, 500), "pathfinder": (16, 2, 2)}
    for task, sizes in expected.items():
        dm = LRADataModule(task, max_len=1024 if task != "retrieval" else 4000)
        dm.setup()
        assert tuple(len(dm.splits[s].labels) for s in ("train", "valid", "test")) == sizes, task
    dm = LRADataModule("listops", listops_release=True)
    dm.setup()
    assert dm.splits["test"].labels.tolist() == info["listops_labels"]["test"]
    assert len(dm.splits["train"].labels) == info["listops"]["train"]


def test_cmu_dog(data, mirror):
    from repro.text.cmudog import cmu_dog_root, read_cmu_dog

    info = mirror[2]["cmu_dog"]
    root = cmu_dog_root()
    for split, n in info.items():
        convs = read_cmu_dog(root, split)
        assert len(convs) == n["conversations"]
        assert sum(len(c.utterances) for c in convs) == n["utterances"]
        assert all(c.document.startswith("movieName: Movie ") for c in convs)


_HUB_SCRIPT = r"""
import json, sys
from repro.text.streams import build_stream
from repro.text.tokenizer import TokenizerSpec, load_tokenizer
from papers.infinity_former import gpt2

out = {}
spec = TokenizerSpec(kind="pretrained", name="gpt2", special_tokens=False)
for source in ("pg19", "wt103-raw"):
    streams, meta = build_stream(source, spec, pg19_train_books=3)
    out[source] = {"tokens": meta["tokens"], "documents": meta["documents"], "first": streams["valid"][:50].tolist()}
out["dialogue_vocab"] = len(load_tokenizer(TokenizerSpec(kind="pretrained", name="gpt2")))
# the paper configs build GPT-2 small's shapes; the test mirror's checkpoint is small, so its shapes are named here
gpt2.PRETRAINED_SHAPES["gpt2"] = json.loads(sys.argv[1])
model = gpt2.GPT2WithMemory(gpt2.GPT2Settings(pretrained="gpt2"), gpt2.MemoryHook(kind="ltm", layers=(1,)),
                            n_token=out["dialogue_vocab"])
model.load_pretrained()
sd = model.lm.state_dict()
out["wte"] = sd["transformer.wte.weight"][:5, :4].tolist()
out["h1_qkv"] = sd["transformer.h.1.attn.inner.c_attn.weight"][:3, :3].tolist()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_hub_sources(mirror, tmp_path):
    """PG-19 (`datasets`), WikiText-103 raw, the GPT-2 tokenizer and checkpoint (`tokenizers`, `transformers`)."""
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from repro.ops.mirror import GPT2_SHAPES

    root, server, info = mirror
    env = os.environ | environment(server.url, tmp_path / "client") | {"REPRO_DATA": str(tmp_path / "data")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", _HUB_SCRIPT, json.dumps(GPT2_SHAPES["small"])], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])

    snap = next((root / "hub/models--gpt2/snapshots").iterdir())
    tok = Tokenizer.from_file(str(snap / "tokenizer.json"))
    assert tok.get_vocab_size() == GPT2_VOCAB and out["dialogue_vocab"] == GPT2_VOCAB + 6
    pg = next((root / "hub/datasets--emozilla--pg19/snapshots").iterdir())
    for split, hf in (("train", "train"), ("valid", "validation"), ("test", "test")):
        books = pq.read_table(pg / f"data/{hf}-00000-of-00001.parquet").column("text").to_pylist()
        books = books[:3] if split == "train" else books
        assert out["pg19"]["documents"][split] == len(books)
        assert out["pg19"]["tokens"][split] == sum(len(tok.encode(b).ids) for b in books)
        if split == "valid":
            assert out["pg19"]["first"] == tok.encode(books[0]).ids[:50]
            assert out["pg19"]["tokens"][split] >= 4 * 512  # a few paper-length blocks
    raw = _member(root / "files/wikitext.smerity.com/wikitext-103-raw-v1.zip",
                  "wikitext-103-raw/wiki.valid.raw").decode()
    assert out["wt103-raw"]["documents"]["valid"] == info["wt103-raw"]["valid"]["articles"] + 1  # + the leading blank
    docs, doc = [], []
    for line in raw.splitlines(keepends=True):  # a new article at every top-level heading ` = Title = `
        if doc and line.startswith(" = ") and not line.startswith(" = = "):
            docs.append("".join(doc))
            doc = []
        doc.append(line)
    docs.append("".join(doc))
    assert out["wt103-raw"]["tokens"]["valid"] == sum(len(tok.encode(d).ids) for d in docs)
    weights = load_file(str(snap / "model.safetensors"))
    torch.testing.assert_close(torch.tensor(out["wte"]), weights["transformer.wte.weight"][:5, :4])
    torch.testing.assert_close(torch.tensor(out["h1_qkv"]), weights["transformer.h.1.attn.c_attn.weight"][:3, :3])
