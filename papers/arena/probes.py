"""Memory probes: tasks whose evidence sits a chosen distance before the question, so that only what a memory carries
across segments can answer (the arena's testbed).

Two kinds, generated here, each example a token sequence whose last part asks and is scored:
- `mqar`, multi-query associative recall (Zoology's MQAR, Arora et al. 2023, "Zoology: measuring and improving
  recall in efficient language models", §3): `n_pairs` key-value pairs (distinct keys drawn from `n_keys`, values
  from `n_values`), then `distance` filler tokens, then a separator and the keys again in a new random order, each
  followed by its value: `k1 v1 … kP vP  f … f  SEP  kπ1 vπ1 … kπP vπP`. The value after each queried key is
  scored; the others not. Every queried pair sits at least `distance` tokens before its question.
- `passkey`, retrieval of a span after filler (as the passkey test of Mohtashami and Jaggi 2023, "Landmark
  attention", §4.2, in tokens rather than words): a span of `n_pairs` value tokens, then `distance` filler tokens,
  then a separator and the span again, each of its tokens scored given the ones before it.
Filler tokens come from their own symbols, never a key or a value, so nothing between evidence and question helps.

Token ids: keys 0 … n_keys − 1, values n_keys … n_keys + n_values − 1, filler the next `n_filler`, then SEP, then
PAD (a target that is not scored). The language-model view (as the sorting task's, `repro.data.sorting`): input =
the sequence without its last token, target = its next token where scored, PAD elsewhere.

Follows `repro.data.sorting` in everything but the task: files `<data_dir>/probes/<name>/{train,valid,test}.pt`
and `meta.json` (settings, seed, sha256 per split), written once and atomically under a lock; a folder whose meta
does not match is an error; each split its own random stream from (seed, split); served by `SortSegments` (groups
of B examples cut into segments, `first`/`last` flags, ranks sharing each group). Differs: the pad and the
vocabulary size are the spec's (`ProbeSpec.pad`, `n_token`), not the sorting task's constants.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch

from repro.data.sorting import SortSegments, data_dir
from repro.io import atomic_write_json, build_lock, load_tensors, save_tensors

KINDS = ("mqar", "passkey")
SPLITS = ("train", "valid", "test")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ProbeSpec:
    kind: str
    distance: int
    n_pairs: int = 8
    n_keys: int = 64
    n_values: int = 64
    n_filler: int = 16
    n_train: int = 2000
    n_valid: int = 200
    n_test: int = 200
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"probe kind is one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.distance < 0 or self.n_pairs < 1 or self.n_filler < 1 or self.n_values < 2:
            raise ValueError("a probe needs distance ≥ 0, n_pairs ≥ 1, n_filler ≥ 1 and n_values ≥ 2")
        if self.kind == "mqar" and self.n_pairs > self.n_keys:
            raise ValueError(f"mqar draws {self.n_pairs} distinct keys from n_keys {self.n_keys}: raise n_keys")

    @property
    def sep(self) -> int:
        return self.n_keys + self.n_values + self.n_filler

    @property
    def pad(self) -> int:
        return self.sep + 1

    @property
    def n_token(self) -> int:
        return self.sep + 2

    @property
    def length(self) -> int:
        """Tokens of one example (the input is one shorter)."""
        evidence = 2 * self.n_pairs if self.kind == "mqar" else self.n_pairs
        return 2 * evidence + self.distance + 1

    @property
    def name(self) -> str:
        return (f"{self.kind}_d{self.distance}_p{self.n_pairs}_k{self.n_keys}_v{self.n_values}_f{self.n_filler}"
                f"_s{self.seed}_n{self.n_train}-{self.n_valid}-{self.n_test}")

    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "valid": self.n_valid, "test": self.n_test}


def example(spec: ProbeSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One example: (tokens (length,), scored (length,) bool: the positions whose token is predicted and scored)."""
    values = spec.n_keys + rng.integers(0, spec.n_values, size=spec.n_pairs)
    filler = spec.n_keys + spec.n_values + rng.integers(0, spec.n_filler, size=spec.distance)
    if spec.kind == "mqar":
        keys = rng.choice(spec.n_keys, size=spec.n_pairs, replace=False)
        evidence = np.stack([keys, values], 1).reshape(-1)
        order = rng.permutation(spec.n_pairs)
        question = np.stack([keys[order], values[order]], 1).reshape(-1)
        answer = np.zeros(len(question), dtype=bool)
        answer[1::2] = True  # each value after its key
    else:
        evidence = values
        question = values.copy()
        answer = np.ones(len(question), dtype=bool)
    tokens = np.concatenate([evidence, filler, [spec.sep], question]).astype(np.int64)
    scored = np.concatenate([np.zeros(len(evidence) + len(filler) + 1, dtype=bool), answer])
    return tokens, scored


def generate_split(spec: ProbeSpec, n: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    pairs = [example(spec, rng) for _ in range(n)]
    tokens = torch.from_numpy(np.stack([t for t, _ in pairs])) if n else torch.zeros(0, spec.length, dtype=torch.int64)
    scored = torch.from_numpy(np.stack([s for _, s in pairs])) if n else torch.zeros(0, spec.length, dtype=torch.bool)
    return {"tokens": tokens, "scored": scored}


def lm_view(spec: ProbeSpec, tokens: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target), each (n, length − 1): the target is the next token where it is scored, PAD elsewhere."""
    inp = tokens[:, :-1]
    target = torch.where(scored[:, 1:], tokens[:, 1:], torch.full_like(tokens[:, 1:], spec.pad))
    return inp.contiguous(), target.contiguous()


def _digest(split: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(split):
        h.update(k.encode())
        h.update(split[k].numpy().tobytes())
    return h.hexdigest()


def build(spec: ProbeSpec, root: str | os.PathLike | None = None) -> Path:
    """The probe's files under `<data_dir>/probes/<name>/` (built once; a mismatching meta is an error)."""
    folder = data_dir(root) / "probes" / spec.name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(folder):
        meta_path = folder / "meta.json"
        settings = {"format": FORMAT_VERSION, **asdict(spec)}
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta.get("settings") != settings:
                raise ValueError(f"{folder} holds another probe ({meta.get('settings')}): delete the folder or "
                                 "change the spec")
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        digests = {}
        for i, split in enumerate(SPLITS):
            rng = np.random.default_rng([spec.seed, i, FORMAT_VERSION])
            data = generate_split(spec, spec.sizes()[split], rng)
            save_tensors(folder / f"{split}.pt", data)
            digests[split] = _digest(data)
        atomic_write_json(meta_path, {"settings": settings, "sha256": digests})  # last: the mark of a finished build
    return folder


def load(spec: ProbeSpec, root: str | os.PathLike | None = None) -> dict[str, dict[str, torch.Tensor]]:
    folder = build(spec, root)
    meta = json.loads((folder / "meta.json").read_text())
    out = {}
    for split in SPLITS:
        data = load_tensors(folder / f"{split}.pt")
        if _digest(data) != meta["sha256"][split]:
            raise ValueError(f"{folder / (split + '.pt')} does not match its recorded sha256: delete {folder} and "
                             "run again")
        out[split] = data
    return out


class ProbeDataModule(L.LightningDataModule):
    """A probe served as the sorting task is (`SortSegments`): groups of `batch_size` examples, each cut into segments
    of `tgt_len`, the question in the last segment of each group.

    Args: the `ProbeSpec` fields, and `batch_size`, `eval_batch_size`, `tgt_len`, `data_dir`."""

    def __init__(self, kind: str, distance: int, n_pairs: int = 8, n_keys: int = 64, n_values: int = 64,
                 n_filler: int = 16, n_train: int = 2000, n_valid: int = 200, n_test: int = 200, seed: int = 0,
                 batch_size: int = 16, eval_batch_size: int = 16, tgt_len: int = 64,
                 data_dir: str | None = None):
        super().__init__()
        self.spec = ProbeSpec(kind, distance, n_pairs, n_keys, n_values, n_filler, n_train, n_valid, n_test, seed)
        self.batch_size, self.eval_batch_size, self.tgt_len = batch_size, eval_batch_size, tgt_len
        self.data_dir = data_dir
        self._data: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def corpus_name(self) -> str:
        return f"probe-{self.spec.name}"

    @property
    def vocab_size(self) -> int:
        return self.spec.n_token

    def prepare_data(self) -> None:
        build(self.spec, self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if not self._data:
            for split, data in load(self.spec, self.data_dir).items():
                self._data[split] = lm_view(self.spec, data["tokens"], data["scored"])

    def _rank(self) -> tuple[int, int]:
        t = getattr(self, "trainer", None)
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def segments(self, split: str) -> SortSegments:
        self.setup()
        rank, world = self._rank()
        inp, tgt = self._data[split]
        batch = self.batch_size if split == "train" else self.eval_batch_size
        # every evaluation example scored: a split that does not fill its batches is refused, not cut
        return SortSegments(inp, tgt, batch_size=batch, tgt_len=self.tgt_len, rank=rank, world_size=world,
                            drop_last=split == "train")

    def train_dataloader(self) -> SortSegments:
        return self.segments("train")

    def val_dataloader(self) -> SortSegments:
        return self.segments("valid")

    def test_dataloader(self) -> SortSegments:
        return self.segments("test")
