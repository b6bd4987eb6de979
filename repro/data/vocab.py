"""Vocabularies as the Transformer-XL reference builds them (kimiyoung/transformer-xl `utils/vocabulary.py`).

Word level (WikiText-103): symbols counted on the training split only, lines split on whitespace, case kept, no
minimum frequency; the special `<eos>` gets index 0 and every other symbol follows in decreasing count, ties in
order of first occurrence (`Counter.most_common`); `<eos>` is appended to every line when encoding.

Character level (enwik8, text8): one symbol per byte or character, counted on all three splits (as the
reference does for these corpora), no special symbols, the same frequency order.

A vocabulary is a list of symbols, stored as JSON beside the token tensors; nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from repro.io import atomic_write_text

EOS = "<eos>"
UNK = "<unk>"


@dataclass(frozen=True)
class Vocab:
    symbols: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(set(self.symbols)) != len(self.symbols):
            raise ValueError("a vocabulary lists each symbol once")

    def __len__(self) -> int:
        return len(self.symbols)

    @cached_property
    def index(self) -> dict[str, int]:
        # built once per vocabulary: One Billion Word's 793k symbols took 0.36 s a call, once per training shard
        return {s: i for i, s in enumerate(self.symbols)}

    @property
    def digest(self) -> str:
        """A fingerprint of the symbols and their order: a checkpoint stores it to refuse the wrong data."""
        return hashlib.sha256("\n".join(self.symbols).encode("utf-8")).hexdigest()[:16]

    def encode(self, symbols: Iterable[str]) -> list[int]:
        index = self.index
        try:
            return [index[s] for s in symbols]
        except KeyError as err:
            raise KeyError(f"symbol {err.args[0]!r} is not in the vocabulary ({len(self)} symbols)") from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.symbols[i] for i in ids]

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps({"symbols": list(self.symbols)}, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> Vocab:
        return cls(tuple(json.loads(Path(path).read_text(encoding="utf-8"))["symbols"]))


def frequency_order(counter: Counter, special: Sequence[str] = ()) -> Vocab:
    """`special` first, then every counted symbol by decreasing count (ties: first occurrence)."""
    symbols = list(special)
    seen = set(symbols)
    for sym, _ in counter.most_common():
        if sym not in seen:
            symbols.append(sym)
            seen.add(sym)
    return Vocab(tuple(symbols))


def word_vocab(train_lines: Iterable[str]) -> Vocab:
    """The WikiText-103 recipe: train-only counts, whitespace split, `<eos>` first."""
    counter: Counter = Counter()
    for line in train_lines:
        counter.update(line.split())
    return frequency_order(counter, special=(EOS,))


def encode_words(lines: Iterable[str], vocab: Vocab) -> np.ndarray:
    """Whitespace tokens of every line followed by `<eos>` (lines are stripped, empty lines give `<eos>` alone)."""
    index = vocab.index
    eos = index[EOS]
    out = array("i")
    for n, line in enumerate(lines, 1):
        try:
            out.extend(index[s] for s in line.split())
        except KeyError as err:
            raise KeyError(
                f"line {n}: word {err.args[0]!r} is not in the training vocabulary; WikiText-style corpora map "
                f"such words to {UNK!r} before the vocabulary is built"
            ) from None
        out.append(eos)
    return np.frombuffer(out, dtype=np.int32).copy()


def char_vocab(splits: Iterable[bytes]) -> Vocab:
    """Byte-level symbols, written as the byte's decimal value (as the reference's `prep_enwik8.py` does)."""
    counts = np.zeros(256, dtype=np.int64)
    first_seen = np.full(256, np.iinfo(np.int64).max, dtype=np.int64)
    offset = 0
    for text in splits:
        arr = np.frombuffer(text, dtype=np.uint8)
        counts += np.bincount(arr, minlength=256)
        values, first = np.unique(arr, return_index=True)
        first_seen[values] = np.minimum(first_seen[values], first + offset)
        offset += len(arr)
    present = np.flatnonzero(counts)
    # decreasing count, ties by first occurrence: the order Counter.most_common gives
    order = sorted(present, key=lambda b: (-counts[b], first_seen[b]))
    return Vocab(tuple(str(int(b)) for b in order))


def encode_chars(text: bytes, vocab: Vocab) -> np.ndarray:
    lut = np.full(256, -1, dtype=np.int32)
    for i, sym in enumerate(vocab.symbols):
        lut[int(sym)] = i
    ids = lut[np.frombuffer(text, dtype=np.uint8)]
    if (ids < 0).any():
        missing = sorted(set(np.frombuffer(text, dtype=np.uint8)[ids < 0].tolist()))
        raise KeyError(f"bytes {missing[:10]} are not in the vocabulary ({len(vocab)} symbols)")
    return ids


def decode_chars(ids: Iterable[int], vocab: Vocab) -> bytes:
    return bytes(int(vocab.symbols[i]) for i in ids)
