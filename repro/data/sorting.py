"""The ∞-former's synthetic sorting task (Martins et al. 2022, §4.1; PAPERS.md §2), generated here.

Each example is a sequence of L symbols from a vocabulary of 20 whose distribution drifts along the sequence:
p = (1 − r)·p₀ + r·p₁ with r = (j + 1)/L at position j (0-based) and p₀, p₁ random integers 1–9 normalised
(the official `generate_data.py`); then a separator and the 20 symbols in decreasing order of their count in the
sequence. Ties are broken by first occurrence in the sequence (the order of Python's `Counter.most_common`, as the
official generator) and symbols that never occur come last, in increasing order.

Token ids: symbols 0–19, separator 20, pad 21 (a target that is not scored; 22 outputs as the official model).
The language-model view of an example (the official `load_sequences`): input = [x_1 … x_L, SEP, s_1 … s_19],
target = [PAD × L, s_1 … s_20]: only the sorted output is scored, the separator predicts the first symbol.

Files: `<data_dir>/sorting/<name>/{train,valid,test}.pt` (uint8 tensors `sequences` (n, L) and `sorted` (n, 20))
and `meta.json` (settings, seed, sha256 per split), each written once and atomically; a folder whose meta does not
match the requested settings is an error, never silently reused. Every split has its own random stream, derived
from (seed, split) — the official script draws all three from one unseeded stream and writes train to another
folder than valid and test.

Batches (the contract with `papers.infinity_former.module.SortingLM`): `SortSegment(input, target, first, last)`
with input/target (B, T) int64 and two Python booleans. The examples are taken B at a time, in file order; each
group is cut into segments of T tokens (the last may be shorter) served in order: `first` marks the first segment
of a group (the memory must be reset before it), `last` the final one (it holds the sorted output, so the loss,
the accuracy and the optimiser step happen there). Under DDP each rank takes its contiguous slice of each group
of B examples, so all ranks see segments of the same length and the same first/last flags.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import numpy as np
import torch

from repro.data.vocab import Vocab
from repro.io import atomic_write_json, build_lock, load_tensors, save_tensors

N_SYMBOLS = 20
SEP = 20
PAD = 21
N_TOKEN = 22
SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1


def data_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get("REPRO_DATA") or "data")


def sort_by_frequency(sequence) -> list[int]:
    """The 20 symbols in decreasing order of count; ties by first occurrence; absent symbols last, ascending."""
    counts = Counter(int(x) for x in sequence)
    first: dict[int, int] = {}
    for i, x in enumerate(sequence):
        first.setdefault(int(x), i)
    seen = sorted(counts, key=lambda s: (-counts[s], first[s]))
    return seen + [s for s in range(N_SYMBOLS) if s not in counts]


def drifting_sequence(rng: np.random.Generator, length: int) -> np.ndarray:
    """L symbols drawn from p = (1 − r)p₀ + r p₁, r = (j + 1)/L (the official generator's mixture)."""
    p0 = rng.integers(1, 10, N_SYMBOLS).astype(np.float64)
    p1 = rng.integers(1, 10, N_SYMBOLS).astype(np.float64)
    p0, p1 = p0 / p0.sum(), p1 / p1.sum()
    r = (np.arange(length, dtype=np.float64) + 1) / length
    cdf = np.cumsum((1 - r)[:, None] * p0 + r[:, None] * p1, axis=1)  # (L, 20)
    u = rng.random(length) * cdf[:, -1]
    return (u[:, None] >= cdf).sum(axis=1).astype(np.uint8)


def generate_split(n: int, length: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    seqs = np.empty((n, length), dtype=np.uint8)
    srt = np.empty((n, N_SYMBOLS), dtype=np.uint8)
    for i in range(n):
        seqs[i] = drifting_sequence(rng, length)
        srt[i] = sort_by_frequency(seqs[i])
    return {"sequences": torch.from_numpy(seqs), "sorted": torch.from_numpy(srt)}


def lm_view(sequences: torch.Tensor, sorted_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target), both (n, L + 20) int64: input = x, SEP, s_1..s_19; target = PAD × L, s_1..s_20."""
    n, length = sequences.shape
    full = torch.cat([sequences.long(), torch.full((n, 1), SEP, dtype=torch.long), sorted_.long()], dim=1)
    inp, tgt = full[:, :-1], full[:, 1:].clone()
    tgt[:, :length] = PAD
    return inp, tgt


@dataclass(frozen=True)
class SortingSpec:
    length: int
    n_train: int
    n_valid: int
    n_test: int
    seed: int

    @property
    def name(self) -> str:
        return f"L{self.length}-n{self.n_train}-{self.n_valid}-{self.n_test}-seed{self.seed}"

    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "valid": self.n_valid, "test": self.n_test}


def build(spec: SortingSpec, root: str | os.PathLike | None = None) -> Path:
    """Write the three split files (once, atomically) and their meta; returns the folder."""
    folder = data_dir(root) / "sorting" / spec.name
    with build_lock(folder):  # two runs of one task may build it at once
        return _build(spec, folder)


def _build(spec: SortingSpec, folder: Path) -> Path:
    meta_path = folder / "meta.json"
    settings = {"format": FORMAT_VERSION, "length": spec.length, "sizes": spec.sizes(), "seed": spec.seed,
                "vocabulary": f"{N_SYMBOLS} symbols, separator {SEP}, pad {PAD}"}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in settings} != settings:
            raise ValueError(f"{folder} holds sorting data with other settings ({meta_path}); delete the folder "
                             "to regenerate it")
        return folder
    sha = {}
    for idx, split in enumerate(SPLITS):
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, idx]))
        tensors = generate_split(spec.sizes()[split], spec.length, rng)
        path = folder / f"{split}.pt"
        save_tensors(path, tensors)
        sha[split] = hashlib.sha256(path.read_bytes()).hexdigest()
    atomic_write_json(meta_path, settings | {"sha256": sha})  # written last: its presence means complete
    return folder


def load(spec: SortingSpec, root: str | os.PathLike | None = None) -> dict[str, dict[str, torch.Tensor]]:
    folder = build(spec, root)
    meta = json.loads((folder / "meta.json").read_text())
    out = {}
    for split in SPLITS:
        path = folder / f"{split}.pt"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != meta["sha256"][split]:
            raise ValueError(f"{path} does not match its checksum in meta.json; delete {folder} to regenerate it")
        out[split] = load_tensors(path)
    return out


@dataclass
class SortingCorpus:
    """What `SegmentLM` and the run records read from a data module's `corpus`: vocabulary and provenance."""

    name: str
    vocab: Vocab
    meta: dict


def sorting_vocab() -> Vocab:
    return Vocab(tuple(str(i) for i in range(N_SYMBOLS)) + ("<sep>", "<pad>"))


class SortSegment(NamedTuple):
    input: torch.Tensor  # (B, T)
    target: torch.Tensor  # (B, T), PAD where nothing is scored
    first: bool  # first segment of a group of examples: reset the memory before it
    last: bool  # final segment: holds the sorted output


class SortSegments:
    """Segments of groups of `batch_size` examples (rank `rank`'s slice of each group), in order.

    Stateful for mid-epoch resume: Lightning saves `state_dict()` in checkpoints."""

    def __init__(self, inp: torch.Tensor, tgt: torch.Tensor, *, batch_size: int, tgt_len: int, rank: int = 0,
                 world_size: int = 1, drop_last: bool = True):
        if batch_size <= 0 or tgt_len <= 0:
            raise ValueError(f"batch_size and tgt_len must be positive, got {batch_size} and {tgt_len}")
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} does not split into {world_size} ranks: use a multiple")
        n = inp.shape[0]
        if not drop_last and n % batch_size:
            raise ValueError(f"{n} evaluation examples do not fill batches of {batch_size}: use a batch size that "
                             f"divides {n}, so that every example is scored")
        if n < batch_size:
            raise ValueError(f"{n} examples cannot fill one batch of {batch_size}: use a smaller batch size")
        per = batch_size // world_size
        self.inp, self.tgt = inp, tgt
        self.batch_size, self.tgt_len, self.per, self.rank = batch_size, tgt_len, per, rank
        self.n_groups = n // batch_size
        total = inp.shape[1]
        self.starts = list(range(0, total, tgt_len))
        self._start = 0
        self._consumed = 0

    def __len__(self) -> int:
        return self.n_groups * len(self.starts)

    @property
    def examples(self) -> int:
        return self.n_groups * self.per

    def __iter__(self) -> Iterator[SortSegment]:
        start, self._start = self._start, 0
        s = len(self.starts)
        for k in range(start, len(self)):
            g, j = divmod(k, s)
            lo = g * self.batch_size + self.rank * self.per
            a = self.starts[j]
            self._consumed = k + 1
            yield SortSegment(self.inp[lo : lo + self.per, a : a + self.tgt_len],
                              self.tgt[lo : lo + self.per, a : a + self.tgt_len], j == 0, j == s - 1)

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self._consumed,
                "geometry": [self.batch_size, self.tgt_len, self.n_groups, len(self.starts)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["geometry"]) != [self.batch_size, self.tgt_len, self.n_groups, len(self.starts)]:
            raise ValueError(f"the checkpoint was taken with (batch_size, tgt_len, groups, segments) = "
                             f"{state['geometry']}: resume with the same data settings")
        self._start = state["consumed"] if state["consumed"] < len(self) else 0


class SortingDataModule(L.LightningDataModule):
    """The sorting task, generated on first use.

    Args:
        length: symbols per sequence (the paper: 4000, 8000, 16000).
        n_train, n_valid, n_test: examples per split (the official: 8000 / 800 / 800).
        seed: generation seed (each split has its own stream derived from it).
        batch_size: training examples per group (official 8), split across DDP ranks.
        tgt_len: segment length (official 1024).
        eval_batch_size, eval_tgt_len: the same for validation and test (eval_batch_size must divide n_valid
            and n_test: every example is scored).
        data_dir: root of `sorting/` (default `$REPRO_DATA` or `data/`).
    """

    def __init__(self, length: int, n_train: int = 8000, n_valid: int = 800, n_test: int = 800, seed: int = 0,
                 batch_size: int = 8, tgt_len: int = 1024, eval_batch_size: int = 8,
                 eval_tgt_len: int | None = None, data_dir: str | None = None):
        super().__init__()
        for name, value in [("length", length), ("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test),
                            ("batch_size", batch_size), ("tgt_len", tgt_len), ("eval_batch_size", eval_batch_size)]:
            if value <= 0:
                raise ValueError(f"data.{name} must be positive, got {value}")
        self.spec = SortingSpec(length, n_train, n_valid, n_test, seed)
        self.batch_size, self.tgt_len = batch_size, tgt_len
        self.eval_batch_size = eval_batch_size
        self.eval_tgt_len = eval_tgt_len or tgt_len
        self.data_dir = data_dir
        self.corpus: SortingCorpus | None = None
        self._views: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def corpus_name(self) -> str:
        return f"sorting-{self.spec.name}"

    @property
    def vocab_size(self) -> int:
        return N_TOKEN

    def prepare_data(self) -> None:
        build(self.spec, self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is None:
            splits = load(self.spec, self.data_dir)
            self._views = {s: lm_view(d["sequences"], d["sorted"]) for s, d in splits.items()}
            meta = json.loads((data_dir(self.data_dir) / "sorting" / self.spec.name / "meta.json").read_text())
            self.corpus = SortingCorpus(self.corpus_name, sorting_vocab(), meta)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def segments(self, split: str) -> SortSegments:
        self.setup()
        rank, world = self._rank()
        train = split == "train"
        inp, tgt = self._views[split]
        return SortSegments(inp, tgt, batch_size=self.batch_size if train else self.eval_batch_size,
                            tgt_len=self.tgt_len if train else self.eval_tgt_len, rank=rank, world_size=world,
                            drop_last=train)

    def train_dataloader(self) -> SortSegments:
        return self.segments("train")

    def val_dataloader(self) -> SortSegments:
        return self.segments("valid")

    def test_dataloader(self) -> SortSegments:
        return self.segments("test")
