"""The corpora registry: every corpus by name, built once into token tensors and cached.

A built corpus is a folder `<data_dir>/cache/<name>/` with `tokens.pt` (one int32 tensor per split, loaded with
`weights_only=True`), `vocab.json` (the symbols, in index order) and `meta.json` (sizes, sources, checksums).
Everything is written atomically: an interrupted build leaves no half-written cache.

`<data_dir>` is `$REPRO_DATA` when set, else `data/` under the working directory.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from repro.data import embedded, sources
from repro.data.root import data_dir
from repro.data.vocab import EOS, Vocab, char_vocab, encode_chars, encode_words, frequency_order, word_vocab
from repro.io import atomic_write_json, build_lock, load_tensors, save_tensors

SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Built:
    vocab: Vocab
    splits: dict[str, np.ndarray]
    meta: dict


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    level: Literal["word", "char"]
    stands_in_for: str | None
    # Expected vocabulary size, used only to describe a config before its data is downloaded; the built
    # vocabulary is authoritative (a difference is reported at build time). None for the embedded corpora,
    # which build in seconds.
    vocab_size: int | None
    build: Callable[[Path], Built]
    description: str
    # raised when the builder's output changes, so that caches built before are rebuilt (a cache without one is 1).
    # wt103 and ptb 2: lines read as the reference reads them, not with `str.splitlines`
    # (tests/parity/test_data_parity.py)
    revision: int = 1


@dataclass
class Corpus:
    name: str
    level: Literal["word", "char"]
    vocab: Vocab
    splits: dict[str, torch.Tensor]  # int32, 1-D
    meta: dict

    @property
    def unit(self) -> str:
        return "bpc" if self.level == "char" else "ppl"


# ---------------------------------------------------------------------------------------------- builders


def _build_word(lines: dict[str, list[str]], meta: dict) -> Built:
    vocab = word_vocab(lines["train"])
    return Built(vocab, {s: encode_words(lines[s], vocab) for s in SPLITS}, meta)


def _build_char(data: dict[str, bytes], meta: dict) -> Built:
    vocab = char_vocab(data[s] for s in SPLITS)  # counted on all splits, as the reference does
    return Built(vocab, {s: encode_chars(data[s], vocab) for s in SPLITS}, meta)


def _embedded_char(_: Path) -> Built:
    return _build_char(embedded.char_splits(), embedded.provenance())


def _embedded_text8(_: Path) -> Built:
    return _build_char(embedded.text8_splits(), embedded.provenance())


def _embedded_word(_: Path) -> Built:
    return _build_word(embedded.word_splits(), embedded.provenance())


def wikitext103_lines(files: dict[str, Path]) -> dict[str, list[str]]:
    """The lines of `wiki.{train,valid,test}.tokens` as the reference reads them (`_file_lines`: a file's lines, not
    `str.splitlines`, which would also break at \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028 and \\u2029 and add an
    `<eos>` there)."""
    return {s: _file_lines(files[s]) for s in SPLITS}


def _wikitext103(raw: Path) -> Built:
    return _build_word(wikitext103_lines(sources.wikitext103_files(raw)),
                       {"source": "wikitext-103-v1.zip (tokenized)"})


HUTTER_TAIL = 5_000_000  # validation and test: the last 2 × 5M bytes (`prep_enwik8.py`, `prep_text8.py`)


def enwik8_splits(data: bytes, *, drop_newlines: bool = False) -> dict[str, bytes]:
    """The last 5M bytes test, the 5M before them valid, the rest train (`prep_enwik8.py`; 90M / 5M / 5M of the
    real 100M, whose size `sources.enwik8_bytes` checks). `drop_newlines`: without the newline bytes, as the
    Transformer-XL pipeline reads `prep_enwik8.py`'s output (one line per newline, each stripped)."""
    n = HUTTER_TAIL
    if len(data) <= 2 * n:
        raise ValueError(f"enwik8 has 100,000,000 bytes, got {len(data):,}")
    parts = {"train": data[: -2 * n], "valid": data[-2 * n : -n], "test": data[-n:]}
    if drop_newlines:
        parts = {s: p.replace(b"\n", b"") for s, p in parts.items()}
    return parts


def _enwik8(raw: Path, *, drop_newlines: bool) -> Built:
    data = sources.enwik8_bytes(raw.parent / "enwik8")  # one download for both variants
    return _build_char(enwik8_splits(data, drop_newlines=drop_newlines),
                       {"source": "enwik8.zip", "newlines": "dropped" if drop_newlines else "kept"})


def text8_splits(data: str | bytes) -> dict[str, bytes]:
    """The last 10M characters split 5M valid / 5M test, the rest train; each part stripped (`prep_text8.py`)."""
    if isinstance(data, str):
        data = data.encode("ascii")
    n = HUTTER_TAIL
    parts = {"train": data[: -2 * n], "valid": data[-2 * n : -n], "test": data[-n:]}
    return {s: p.strip() for s, p in parts.items()}


def _text8(raw: Path) -> Built:
    return _build_char(text8_splits(sources.text8_bytes(raw)), {"source": "text8.zip"})


LM1B_BOUNDARY, LM1B_UNK = "<S>", "<UNK>"
LM1B_SHUFFLE_SEED = 1111


def _file_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a text file as the reference iterates them (`for line in open(path)`): split at \\n, \\r and
    \\r\\n only. `str.splitlines` would also split at \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028 and \\u2029, which
    can occur inside a news sentence or word."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def lm1b_vocab(path: str | os.PathLike) -> Vocab:
    """The benchmark's vocabulary file (`word count` per line: `<S>`, `</S>`, `<UNK>`, then words by decreasing
    count), read as the reference's `Vocab._build_from_file` (`utils/vocabulary.py`) reads `1b_word_vocab.txt`:
    the first field of `line.strip().split()` of every line, in file order, a symbol already seen skipped, nothing
    added (`special=[]` for lm1b). Python's `split()` cuts at Unicode whitespace too, so a line whose word holds
    one (e.g. a no-break space) can give an earlier word again: the vocabulary then has fewer symbols than the
    file has lines, exactly as the reference's."""
    symbols: dict[str, None] = {}
    for line in _file_lines(path):
        fields = line.strip().split()
        if fields:  # the reference fails on a blank line; none is in the real file
            symbols.setdefault(fields[0], None)
    vocab = Vocab(tuple(symbols))
    for s in (LM1B_BOUNDARY, LM1B_UNK):
        if s not in vocab.index:
            raise ValueError(f"{path} has no {s!r}: it is not the One Billion Word vocabulary (1b_word_vocab.txt)")
    return vocab


def encode_sentences(sentences: list[str], vocab: Vocab) -> np.ndarray:
    """One stream of sentences with one boundary token between them (and at both ends): `<S> a b <S> c d <S>`.

    The reference wraps every sentence as `<S> … <S>` and never feeds a sentence's last `<S>` as input, so the next
    sentence's input starts with its own `<S>`: the inputs and targets it scores are exactly those of this stream.
    Words outside the vocabulary become `<UNK>`; words are split as the reference's `line.strip().split()`, and a
    blank line is an empty sentence (`<S> <S>` there, one more `<S>` here), as the reference encodes every line."""
    index = vocab.index
    bos, unk = index[LM1B_BOUNDARY], index[LM1B_UNK]
    out = array("i", [bos])
    for line in sentences:
        out.extend(index.get(w, unk) for w in line.split())
        out.append(bos)
    return np.frombuffer(out, dtype=np.int32).copy()


def lm1b_splits(train_shards: list[Path], valid: Path, test: Path, vocab: Vocab, *,
                seed: int = LM1B_SHUFFLE_SEED) -> dict[str, np.ndarray]:
    """Train: the shards in a seeded random order, each shard's sentences shuffled (the reference reshuffles both
    every epoch; a built corpus is one fixed draw). Valid and test: one held-out shard each, in file order."""
    rng = np.random.default_rng(seed)
    parts = []
    for i in rng.permutation(len(train_shards)):
        lines = _file_lines(train_shards[i])
        parts.append(encode_sentences([lines[j] for j in rng.permutation(len(lines))], vocab))
    train = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def held_out(path: Path) -> np.ndarray:
        return encode_sentences(_file_lines(path), vocab)

    return {"train": train, "valid": held_out(valid), "test": held_out(test)}


def _lm1b(raw: Path) -> Built:
    files = sources.lm1b_files(raw)
    vocab = lm1b_vocab(files["vocab"])
    return Built(vocab, lm1b_splits(files["train"], files["valid"], files["test"], vocab),
                 {"source": "1-billion-word-language-modeling-benchmark-r13output.tar.gz + 1b_word_vocab.txt",
                  "valid": sources.LM1B_VALID_SHARD, "test": sources.LM1B_TEST_SHARD,
                  "train_shards": len(files["train"]), "shuffle_seed": LM1B_SHUFFLE_SEED,
                  # symbols = distinct first fields; it can be fewer than the lines (see `lm1b_vocab`)
                  "vocab_file_lines": len(_file_lines(files["vocab"]))})


def ptb_lines(files: dict[str, Path]) -> dict[str, list[str]]:
    """The lines of `ptb.{train,valid,test}.txt`, lower-cased, as the reference reads them (`_file_lines`)."""
    return {s: [line.lower() for line in _file_lines(files[s])] for s in SPLITS}


def build_ptb(lines: dict[str, list[str]], meta: dict) -> Built:
    """Penn Treebank as the reference reads it: lower-cased, whitespace split, `<eos>` after every line, the
    vocabulary counted on all three splits (`<eos>` first, then decreasing count). The data already maps rare words
    to `<unk>`, so the vocabulary is the closed 10,000 symbols."""
    counter: Counter = Counter()
    for s in SPLITS:
        for line in lines[s]:
            counter.update(line.split())
    vocab = frequency_order(counter, special=(EOS,))
    return Built(vocab, {s: encode_words(lines[s], vocab) for s in SPLITS}, meta)


def _ptb(raw: Path) -> Built:
    return build_ptb(ptb_lines(sources.ptb_files(raw)), {"source": "simple-examples.tgz (Mikolov), data/ptb.*.txt"})


REGISTRY: dict[str, CorpusSpec] = {
    spec.name: spec
    for spec in [
        CorpusSpec("embedded-char", "char", "enwik8", None, _embedded_char,
                   "UTF-8 bytes of Python's own documentation"),
        CorpusSpec("embedded-text8", "char", "text8", None, _embedded_text8,
                   "Python's documentation reduced to text8's alphabet (a-z and space)"),
        CorpusSpec("embedded-word", "word", "wt103", None, _embedded_word,
                   "Python's documentation tokenized WikiText-style, <unk> below 3 training occurrences"),
        # 267,735 types: PAPERS.md §1 (train-only counts plus <eos>)
        CorpusSpec("wt103", "word", None, 267_735, _wikitext103, "WikiText-103 (tokenized v1)", revision=2),
        # Every byte value that occurs in enwik8, the newline (byte 10) included; the reference pipeline loses
        # the newline (see papers/transformer_xl/README.md), hence one symbol less in `enwik8-txl`.
        CorpusSpec("enwik8", "char", None, 205, lambda raw: _enwik8(raw, drop_newlines=False),
                   "enwik8, every byte (the Hutter Prize definition)"),
        CorpusSpec("enwik8-txl", "char", None, 204, lambda raw: _enwik8(raw, drop_newlines=True),
                   "enwik8 as the Transformer-XL pipeline reads it: newline bytes removed from every split"),
        # a-z and space
        CorpusSpec("text8", "char", None, 27, _text8, "text8"),
        # the benchmark vocabulary: 793,471 (Chelba et al. 2013, Jozefowicz et al. 2016). The built count is the
        # reference's (distinct first fields of 1b_word_vocab.txt, see `lm1b_vocab`), authoritative, and recorded
        # in meta.json with the file's line count; this number serves `repro describe` before the data exist.
        CorpusSpec("lm1b", "word", None, 793_471, _lm1b,
                   "One Billion Word: shuffled sentences, <S> boundaries, the standard vocabulary"),
        # Mikolov's PTB: 9,999 words (with <unk>) and <eos>
        CorpusSpec("ptb", "word", None, 10_000, _ptb, "Penn Treebank, word level (Mikolov's preprocessing)",
                   revision=2),
    ]
}


def spec(name: str) -> CorpusSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown corpus {name!r}; the registry has: {', '.join(sorted(REGISTRY))}") from None


def cache_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    return data_dir(root) / "cache" / name


def is_built(name: str, root: str | os.PathLike | None = None) -> bool:
    return (cache_dir(name, root) / "meta.json").exists()


def build(name: str, root: str | os.PathLike | None = None) -> Path:
    """Build the cache of `name` if it is missing (downloading its sources if needed)."""
    with build_lock(cache_dir(name, root)):  # the workers of `repro runs` may all start by building one corpus
        return _build(name, root)


def _build(name: str, root: str | os.PathLike | None) -> Path:
    folder = cache_dir(name, root)
    s = spec(name)
    if is_built(name, root):
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("format") == FORMAT_VERSION and meta.get("revision", 1) == s.revision:
            return folder
    t0 = time.time()
    built = s.build(data_dir(root) / "raw" / name)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int32)) for k, v in built.splits.items()}
    built.vocab.save(folder / "vocab.json")
    save_tensors(folder / "tokens.pt", tensors)
    meta = dict(built.meta)
    if s.revision != 1:
        meta["revision"] = s.revision
    meta.update(
        format=FORMAT_VERSION,
        name=name,
        level=s.level,
        vocab_size=len(built.vocab),
        vocab_digest=built.vocab.digest,
        tokens={k: int(v.numel()) for k, v in tensors.items()},
        build_seconds=round(time.time() - t0, 1),
    )
    if s.vocab_size is not None and s.vocab_size != len(built.vocab):
        print(f"note: {name} has {len(built.vocab)} symbols; the registry expected {s.vocab_size} "
              "(used only by `repro describe` before the data exists)", flush=True)
    atomic_write_json(folder / "meta.json", meta)  # written last: its presence marks a complete build
    return folder


def load_corpus(name: str, root: str | os.PathLike | None = None) -> Corpus:
    s = spec(name)
    folder = build(name, root)
    meta = json.loads((folder / "meta.json").read_text())
    vocab = Vocab.load(folder / "vocab.json")
    tensors = load_tensors(folder / "tokens.pt")
    if vocab.digest != meta["vocab_digest"] or set(tensors) != set(SPLITS):
        raise RuntimeError(f"the cache in {folder} is inconsistent; delete the folder and run again to rebuild it")
    return Corpus(name, s.level, vocab, {k: tensors[k] for k in SPLITS}, meta)


def vocab_size(name: str, root: str | os.PathLike | None = None) -> int:
    """The vocabulary size without building a paper corpus that is not there yet."""
    s = spec(name)
    folder = cache_dir(name, root)
    if is_built(name, root):
        return int(json.loads((folder / "meta.json").read_text())["vocab_size"])
    if s.vocab_size is not None:
        return s.vocab_size
    return int(json.loads((build(name, root) / "meta.json").read_text())["vocab_size"])
