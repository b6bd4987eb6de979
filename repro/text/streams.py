"""Subword document streams for GPT-2 language-model fine-tuning: WikiText-103 (raw), PG-19, the embedded corpus.

The ∞-former paper fine-tunes GPT-2 small on WikiText-103 and on the first 2,000 training books of PG-19,
evaluating on their validation / test sets, in blocks of 512 tokens fed in order with batch 1, so that a memory
carries across blocks (`run_clm.py --block_size 512`, PAPERS.md §2). Here every split is one token stream: the
documents in their published order, each tokenized with the GPT-2 tokenizer (or the tiny profile's BPE) and
concatenated; `repro.data.lm.LMSegments` serves it in order (B contiguous streams; B = 1 in the paper).

Sources:
- `wt103-raw`: `wikitext-103-raw-v1.zip` (members `wikitext-103-raw/wiki.{train,valid,test}.raw`) from the
  mirror https://wikitext.smerity.com/ (the original S3 link answers 403), verified against the sha256 and size
  that Hugging Face `datasets` publishes for it (`WT103_RAW_PUBLISHED`); the raw (untokenized) text, as GPT-2
  needs. Documents are cut at the top-level headings ` = Title = `.
- `pg19`: the parquet copy `emozilla/pg19` on the Hugging Face hub through `datasets` (PAPERS.md §5: the
  `deepmind/pg19` loading script no longer runs), train: the first `pg19_train_books` rows (2,000), validation and
  test: all books. Written once as JSON lines under `<data>/raw/pg19/` (atomic).
- `embedded`: the training / validation / test text of the embedded corpus (`repro.data.embedded`), the tiny
  profile's stand-in.

`line_breaks: keep` (the default): documents are tokenised whole, their lines with their newline characters (as
later versions of `run_clm --keep_linebreaks`). `line_breaks: drop`: the official copy of `run_clm.py` (the paper
configs): a `.txt` file read by `datasets`' `text` loader without `keep_linebreaks`, one example per line without
its line break, each line tokenised on its own and the tokens concatenated (`encode_documents`; lines split with
`str.splitlines`, as the `datasets` of that copy's time did). Tokens are cached per source, tokenizer digest and
line mode as `<data>/cache/gpt2-<source>[-nolinebreaks]-<digest>/tokens.pt` (int32, `weights_only` loading)
with `meta.json`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import lightning as L
import torch

from repro.data.download import download, read_member
from repro.data.embedded import split_text
from repro.data.lm import LMSegments
from repro.data.root import data_dir
from repro.io import atomic_write_json, atomic_write_text, build_lock, load_tensors, save_tensors
from repro.text.tokenizer import TokenizerSpec, load_tokenizer, vocab_size

SPLITS = ("train", "valid", "test")
SOURCES = ("wt103-raw", "pg19", "embedded")
WT103_RAW_URLS = ("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
                  "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip")
# Published for the same archive (copied exactly; the same sha256 appears in Julia DataDeps registrations of
# WikiText-103-raw-v1): every download and every later use is verified against it.
WT103_RAW_PUBLISHED = {"sha256": "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
                       "size": 191_984_949}  # huggingface/datasets datasets/wikitext/dataset_infos.json
PG19_HF = "emozilla/pg19"
PG19_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
_HEADING = re.compile(r"^ = [^=].* = \n?$")


def split_wikitext_documents(text: str) -> list[str]:
    """WikiText articles: a new document starts at each top-level heading line ` = Title = `."""
    docs: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if _HEADING.match(line) or not docs:
            docs.append([])
        docs[-1].append(line)
    return ["".join(d) for d in docs]


def wt103_raw_documents(raw: Path, split: str) -> list[str]:
    archive = download(WT103_RAW_URLS, raw / "wikitext-103-raw-v1.zip", **WT103_RAW_PUBLISHED, record_sha256=True)
    name = {"train": "train", "valid": "valid", "test": "test"}[split]
    text = read_member(archive, f"wikitext-103-raw/wiki.{name}.raw").decode("utf-8")
    return split_wikitext_documents(text)


def pg19_documents(raw: Path, split: str, train_books: int) -> list[str]:
    limit = train_books if split == "train" else None
    path = raw / f"{split}{'' if limit is None else f'-first{limit}'}.jsonl"
    if not path.exists():
        try:
            from datasets import load_dataset  # heavy: datasets

            rows = load_dataset(PG19_HF, split=PG19_SPLITS[split], streaming=True)
            books = []
            for row in rows:
                books.append(row["text"])
                if limit is not None and len(books) >= limit:
                    break
        except Exception as err:
            raise ValueError(f"could not read PG-19 ({PG19_HF}, {split}) from the Hugging Face hub: {err}; the "
                             "paper profile needs network access once") from err
        atomic_write_text(path, "".join(json.dumps(b) + "\n" for b in books))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def embedded_documents(split: str) -> list[str]:
    return [split_text()[split]]


LINE_BREAKS = ("keep", "drop")


def encode_documents(docs: list[str], tok, line_breaks: str = "keep") -> list[int]:
    """The token ids of `docs` in order: each document whole (`keep`), or each of its lines without its line break,
    one by one (`drop`: the official `run_clm.py` through `datasets`' `text` loader, see the module docstring)."""
    ids: list[int] = []
    for d in docs:
        if line_breaks == "keep":
            ids += tok.encode(d)
        else:
            for line in d.splitlines():
                ids += tok.encode(line)
    return ids


def build_stream(source: str, spec: TokenizerSpec, data_root: str | os.PathLike | None = None, *,
                 pg19_train_books: int = 2000, line_breaks: str = "keep") -> tuple[dict[str, torch.Tensor], dict]:
    """Token streams of the three splits (int32) and their provenance, cached."""
    if source not in SOURCES:
        raise ValueError(f"unknown text source {source!r}; choose one of {SOURCES}")
    if line_breaks not in LINE_BREAKS:
        raise ValueError(f"data.line_breaks is keep | drop, got {line_breaks!r}")
    tok = load_tokenizer(spec, data_root)
    tag = f"{source}{'-' + str(pg19_train_books) if source == 'pg19' else ''}"
    tag += "-nolinebreaks" if line_breaks == "drop" else ""
    folder = data_dir(data_root) / "cache" / f"gpt2-{tag}-{tok.digest}"
    with build_lock(folder):  # two runs of one source may build it at once
        if (folder / "meta.json").exists():
            return load_tensors(folder / "tokens.pt"), json.loads((folder / "meta.json").read_text())
        raw = data_dir(data_root) / "raw" / source
        streams, docs_per_split = {}, {}
        for split in SPLITS:
            if source == "wt103-raw":
                docs = wt103_raw_documents(raw, split)
            elif source == "pg19":
                docs = pg19_documents(raw, split, pg19_train_books)
            else:
                docs = embedded_documents(split)
            streams[split] = torch.tensor(encode_documents(docs, tok, line_breaks), dtype=torch.int32)
            docs_per_split[split] = len(docs)
        meta = {"source": source, "tokenizer": tok.digest, "vocab_size": len(tok), "documents": docs_per_split,
                "tokens": {s: int(t.numel()) for s, t in streams.items()}}
        if source == "pg19":
            meta["train_books"] = pg19_train_books
        if line_breaks == "drop":
            meta["line_breaks"] = "dropped, each line tokenised alone (run_clm.py's text loader)"
        save_tensors(folder / "tokens.pt", streams)
        atomic_write_json(folder / "meta.json", meta)  # last: marks a complete cache
        return streams, meta


class _Vocab:
    def __init__(self, digest: str, size: int):
        self.digest, self.size = digest, size

    def __len__(self) -> int:
        return self.size


class _Corpus:
    """What `SegmentLM.setup` and the CLI's record read from a data module's `corpus`."""

    def __init__(self, vocab: _Vocab, meta: dict):
        self.vocab, self.meta = vocab, meta


class TextStreamDataModule(L.LightningDataModule):
    """Ordered blocks of a subword stream (see the module docstring).

    Args:
        source: `wt103-raw`, `pg19` or `embedded`.
        tokenizer: `TokenizerSpec` (paper: pretrained `gpt2`, special tokens off; tiny: a BPE).
        block_size: tokens per block (512 in the paper).
        batch_size / eval_batch_size: global numbers of contiguous streams (1 in the paper).
        pg19_train_books: PG-19 training books used (the first 2,000 in the paper).
        line_breaks: `keep` (documents tokenised whole) or `drop` (the official `run_clm.py`: each line alone,
            without its line break; the paper configs).
    """

    def __init__(self, source: str = "embedded", tokenizer: TokenizerSpec | dict | None = None,
                 block_size: int = 512, batch_size: int = 1, eval_batch_size: int = 1,
                 pg19_train_books: int = 2000, data_dir: str | None = None, line_breaks: str = "keep"):
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")
        if line_breaks not in LINE_BREAKS:
            raise ValueError(f"data.line_breaks is keep | drop, got {line_breaks!r}")
        self.line_breaks = line_breaks
        self.source, self.block_size = source, block_size
        self.spec = tokenizer if isinstance(tokenizer, TokenizerSpec) else TokenizerSpec(**(tokenizer or {}))
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.pg19_train_books, self.data_dir = pg19_train_books, data_dir
        self.corpus_name = "embedded-gpt2" if source == "embedded" else source
        self.streams: dict[str, torch.Tensor] | None = None
        self.corpus: _Corpus | None = None

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.spec, self.data_dir)

    def prepare_data(self) -> None:
        build_stream(self.source, self.spec, self.data_dir, pg19_train_books=self.pg19_train_books,
                     line_breaks=self.line_breaks)

    def setup(self, stage: str | None = None) -> None:
        if self.streams is None:
            self.streams, meta = build_stream(self.source, self.spec, self.data_dir,
                                              pg19_train_books=self.pg19_train_books, line_breaks=self.line_breaks)
            self.corpus = _Corpus(_Vocab(meta["tokenizer"], meta["vocab_size"]), meta)

    def _segments(self, split: str) -> LMSegments:
        self.setup()
        t = self.trainer
        rank, world = (t.global_rank, t.world_size) if t is not None else (0, 1)
        bs = self.batch_size if split == "train" else self.eval_batch_size
        return LMSegments(self.streams[split], batch_size=bs, tgt_len=self.block_size, rank=rank, world_size=world)

    def train_dataloader(self):
        return self._segments("train")

    def val_dataloader(self):
        return self._segments("valid")

    def test_dataloader(self):
        return self._segments("test")
