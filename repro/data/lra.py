"""Long Range Arena (Tay et al., ICLR 2021) classification data: ListOps generated here, the other tasks read from
their official sources, all cached as padded token tensors.

Tasks, sources and the preprocessing of the MGK reference (which trains on the Nyströmformer repository's pickles,
mlpen/Nystromformer `LRA/datasets/*.py`, built with the LRA input pipelines):

| task | source (`lra_release/…`: inside LRA's release archive) | input | classes | length |
|---|---|---|---|---|
| `listops` | generated here, or `lra_release/listops-1000/basic_*.tsv` | operator/digit tokens | 10 | ≤ 2000 |
| `text` | IMDb reviews, `aclImdb_v1.tar.gz` (Maas et al. 2011) | bytes | 2 | 1000 (truncated) |
| `retrieval` | ACL Anthology Network pairs, `…/tsv_data/new_aan_pairs.*.tsv` | bytes, two documents | 2 | 4000 each |
| `image` | CIFAR-10, `cifar-10-python.tar.gz` (python pickle batches), grey levels | pixels | 10 | 1024 |
| `pathfinder` | `lra_release/pathfinder32/<difficulty>/{metadata/*.npy, imgs/*/*.png}` | pixels | 2 | 1024 |

ListOps is generated here (`repro.data.listops`: LRA's procedure and written form, seeded). Retrieval's files are
`new_aan_pairs.{train,eval,test}.tsv`.

Token ids: 0 is padding everywhere and never a real token (bytes and pixels are shifted by one), so a pad mask is
`tokens != 0`. (The reference's byte ids are byte + 1 too, but its pixel ids are the grey levels themselves, so
black pixels of Image and Pathfinder are masked out of attention and pooling there: `black_is_padding` does the
same; by default ours keeps them.)

Built tasks live in `<data_dir>/cache/lra/<name>/{train,valid,test}.pt` (int16 tokens (N, L) padded with 0,
lengths (N,), labels (N,); Retrieval also tokens2/lengths2) with `meta.json` (sizes, sources, sha256 of every
file); the generated ListOps TSVs in `<data_dir>/raw/lra/<name>/` with their own manifest. Every file is written
atomically; a finished build is reused, and its checksums are verified on load.

As the reference pipelines (tests/parity/test_lra_data_parity.py runs LRA's own on miniatures): ListOps symbols,
truncation and labels; IMDb reviews stripped of whitespace at both ends (the TensorFlow Datasets builder does)
and byte ids; Retrieval's tab-separated pairs (quotes literal); grey levels exactly as `tf.image.rgb_to_grayscale`;
with `pad_to` the reference's fixed padded lengths and with `black_is_padding` its pad id for black pixels.
Deviations (see papers/mgk/README.md): Text uses the IMDb test set for both validation and test, as LRA and the
reference do; Pathfinder is split 80/10/10 after a seeded shuffle (the reference's shuffle is unseeded). Image's
validation pictures are the reference's: the last 5,000 of TensorFlow Datasets' order (`train[90%:]`, `tfds_order`).

The modules: `repro.data.listops` (the ListOps generator and files), `repro.data.lra_sources` (the official
sources and readers of their formats), `repro.data.lra_tasks` (each task's splits, built and cached), and this
one (batches, collation and the data module).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import lightning as L
import torch
import torch.nn.functional as F

from repro.data.listops import ListOpsSpec
from repro.data.lra_tasks import (
    BUILDERS,
    FORMAT_VERSION,
    TASKS,
    Split,
    TaskInfo,
    load_task,
    save_task,
)
from repro.data.root import data_dir
from repro.io import build_lock


class Batch(NamedTuple):
    tokens: torch.Tensor  # (B, T) int64, 0 = pad
    labels: torch.Tensor  # (B,)
    tokens2: torch.Tensor | None = None  # (B, T2), Retrieval


class _Examples(torch.utils.data.Dataset):
    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split.labels)

    def __getitem__(self, i: int) -> int:
        return i


def _collate(split: Split, *, pad_to: int | None = None, black_is_padding: bool = False):
    """Indices → a Batch trimmed to the longest sequence in it (padding beyond it would change nothing), or padded
    to `pad_to` tokens (the reference's fixed length, on which its mean pooling and linear attention depend).
    `black_is_padding`: the pixel ids 1…256 become the grey levels 0…255, so that black takes the pad id 0 (the
    reference's pipeline)."""

    def cut(tokens: torch.Tensor, lengths: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        t = tokens[i, : max(1, int(lengths[i].max()))].long()
        if black_is_padding:
            t = (t - 1).clamp_min(0)
        if pad_to is not None:
            t = F.pad(t, (0, pad_to - t.shape[1]))
        return t

    def collate(idx: list[int]) -> Batch:
        i = torch.as_tensor(idx, device=split.labels.device)  # the split's device, whatever the default device
        t2 = cut(split.tokens2, split.lengths2, i) if split.tokens2 is not None else None
        return Batch(cut(split.tokens, split.lengths, i), split.labels[i], t2)

    return collate


# The reference's padded lengths (Nyströmformer LRA/datasets/*.py: the LRA pipelines' max_length, then 48, 24 and
# 96 more zeros for ListOps, Text and Retrieval): what `pad_to` reproduces in the paper configs.
REFERENCE_PADDED_LENGTH = {"listops": 2048, "text": 1024, "retrieval": 4096, "image": 1024, "pathfinder": 1024}


class LRADataModule(L.LightningDataModule):
    """One LRA task as classification batches: `Batch(tokens (B, T), labels (B,), tokens2)`, pad id 0.

    Args:
        task: listops | text | retrieval | image | pathfinder.
        batch_size: training examples per step, over all DDP ranks (the reference: 32; Image and Pathfinder 256).
        eval_batch_size: examples per evaluation step.
        max_len: tokens kept per document (ListOps 2000, Text 1000, Retrieval 4000 per document, Image and
            Pathfinder 1024).
        listops: generation settings (`ListOpsSpec`) when task = listops and `listops_release` is false.
        listops_release: read ListOps from the LRA release instead of generating it.
        pad_to: pad every batch to this many tokens per document instead of trimming it to its longest example:
            the reference trains on documents padded to a fixed length (`REFERENCE_PADDED_LENGTH`: ListOps 2048,
            Text 1024, Retrieval 4096, Image and Pathfinder 1024), and its mean pooling (`model.pooling: padded`)
            and linear attention (1/√L) depend on that length. None (default): trimmed.
        black_is_padding: Image and Pathfinder: give grey level 0 the pad id, as the reference's pipeline does
            (black pixels are then masked out of attention and pooling). Default false: every pixel is a token.
        pathfinder_difficulty: curv_baseline | curv_contour_length_9 | curv_contour_length_14.
        split_seed: seed of the Pathfinder split.
        name: the cache folder name (default: the task, with a digest of the ListOps spec).
        data_dir: `$REPRO_DATA` or `data/` by default.
        shuffle_seed: order of the training examples (each epoch reshuffles deterministically); default: the
            run's seed (`--seed_everything`), so that seeds differ in data order as well as initialisation.
    """

    def __init__(self, task: str, batch_size: int = 32, eval_batch_size: int = 64, max_len: int = 2000,
                 listops: ListOpsSpec | dict | None = None, listops_release: bool = False,
                 pathfinder_difficulty: str = "curv_contour_length_14", split_seed: int = 0,
                 name: str | None = None, data_dir: str | None = None, shuffle_seed: int | None = None,
                 pad_to: int | None = None, black_is_padding: bool = False):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"unknown LRA task {task!r}; tasks: {', '.join(TASKS)}")
        if batch_size <= 0 or eval_batch_size <= 0 or max_len <= 0:
            raise ValueError("batch_size, eval_batch_size and max_len must be positive")
        if pathfinder_difficulty not in ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14"):
            raise ValueError(f"unknown Pathfinder difficulty {pathfinder_difficulty!r}")
        if pad_to is not None and pad_to < max_len:
            raise ValueError(f"data.pad_to ({pad_to}) is shorter than data.max_len ({max_len}): pad to at least "
                             f"max_len (the reference pads {task} to {REFERENCE_PADDED_LENGTH[task]})")
        if black_is_padding and task not in ("image", "pathfinder"):
            raise ValueError(f"data.black_is_padding is for the pixel tasks (image, pathfinder), not {task}")
        self.task, self.batch_size, self.eval_batch_size, self.max_len = task, batch_size, eval_batch_size, max_len
        self.pad_to, self.black_is_padding = pad_to, black_is_padding
        if isinstance(listops, dict):
            listops = ListOpsSpec(**listops)
        self.listops = listops if listops is not None else ListOpsSpec()
        self.listops_release = listops_release
        self.pathfinder_difficulty, self.split_seed, self.shuffle_seed = pathfinder_difficulty, split_seed, shuffle_seed
        self.corpus_name = name or task
        self.data_dir = data_dir
        self.splits: dict[str, Split] | None = None
        self.meta: dict | None = None
        self._epoch = 0

    @property
    def info(self) -> TaskInfo:
        return TASKS[self.task]

    @property
    def vocab_size(self) -> int:
        return self.info.n_token

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    @property
    def tgt_len(self) -> int:
        """Tokens per document in a batch at most (the fixed length with `pad_to`)."""
        return self.pad_to or self.max_len

    @property
    def folder(self) -> Path:
        return data_dir(self.data_dir) / "cache" / "lra" / self.corpus_name

    def _settings(self) -> dict:
        s = {"task": self.task, "max_len": self.max_len}
        if self.task == "listops":
            s |= {"listops": "release" if self.listops_release else asdict(self.listops)}
        if self.task == "pathfinder":
            s |= {"difficulty": self.pathfinder_difficulty, "split_seed": self.split_seed}
        if self.task in ("text", "image"):
            # 2 (2026-11-26): IMDb texts stripped, grey levels and the validation pictures as the reference's; a
            # cache built before is rebuilt
            s |= {"revision": 2}
        return s

    def prepare_data(self) -> None:
        with build_lock(self.folder):  # two runs of one task may build it at once
            self._prepare()

    def _prepare(self) -> None:
        folder = self.folder
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("settings") == self._settings() and meta.get("format") == FORMAT_VERSION:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        raw = data_dir(self.data_dir) / "raw" / "lra" / self.corpus_name
        raw.mkdir(parents=True, exist_ok=True)
        splits, meta = BUILDERS[self.task](raw, spec=self.listops, max_len=self.max_len, release=self.listops_release,
                                           difficulty=self.pathfinder_difficulty, seed=self.split_seed)
        save_task(folder, splits, meta | {"settings": self._settings()})

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.prepare_data()
            self.splits, self.meta = load_task(self.folder)

    @property
    def corpus(self):  # what `repro prepare` and run records cite
        class _C:
            meta = self.meta

        return _C() if self.meta is not None else None

    def _loader(self, split: str, *, train: bool):
        """Training: reshuffled every epoch; evaluation: every example once, in order. Under DDP each rank takes
        its own share (the repository turns Lightning's automatic sampler off for the language models); in
        evaluation the shares differ by at most one example, and the module's metrics are reduced over the ranks."""
        self.setup()
        data = self.splits[split]
        seed = self.shuffle_seed if self.shuffle_seed is not None else torch.initial_seed()
        bs = self.batch_size if train else self.eval_batch_size
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            if train and bs % trainer.world_size:
                raise ValueError(f"batch size {bs} does not split into {trainer.world_size} ranks")
            if train:
                sampler = torch.utils.data.DistributedSampler(_Examples(data), num_replicas=trainer.world_size,
                                                              rank=trainer.global_rank, shuffle=True,
                                                              seed=seed % 2**31, drop_last=True)
            else:  # every example exactly once over the ranks (DistributedSampler would repeat some to even them)
                sampler = range(trainer.global_rank, len(data.labels), trainer.world_size)
            return torch.utils.data.DataLoader(_Examples(data), batch_size=bs // trainer.world_size if train else bs,
                                               sampler=sampler, drop_last=train, collate_fn=self._collate(data))
        if train:
            g = torch.Generator().manual_seed(seed)
            return torch.utils.data.DataLoader(_Examples(data), batch_size=bs, shuffle=True, generator=g,
                                               drop_last=len(data.labels) >= bs, collate_fn=self._collate(data))
        return torch.utils.data.DataLoader(_Examples(data), batch_size=bs, shuffle=False,
                                           collate_fn=self._collate(data))

    def _collate(self, data: Split):
        return _collate(data, pad_to=self.pad_to, black_is_padding=self.black_is_padding)

    def train_dataloader(self):
        return self._loader("train", train=True)

    def val_dataloader(self):
        return self._loader("valid", train=False)

    def test_dataloader(self):
        return self._loader("test", train=False)
