"""Language-model streams served as the Transformer-XL reference serves them (`LMOrderedIterator`).

The token stream of a split is cut into B contiguous streams (B = the global batch size; the tail that does not
fill B streams is dropped, as the reference does), and segments of `tgt_len` tokens are served in order,
unshuffled, so that the memory of stream b always holds the text just before its next segment. Under DDP each
rank takes its own contiguous slice of the B streams (what `DataParallel` did in the reference), so W ranks of
B/W streams see exactly what one process with B streams sees.

With `roll` (LaMemo's training scripts, `--roll` of its `train_ddp.py`, from NVIDIA's Transformer-XL), every
training pass starts with each stream rotated by its own random shift (`stream[(j + shift) mod N]`), drawn from a
generator seeded by the pass and `roll_seed` for all B streams at once, so that W ranks still see what one process
sees and a resumed run sees the same rotation. The reference rolls its rotated data again at every epoch (with the
process's global random state): shifts of the same distribution, not the same numbers.

Layout: a batch is `Segment(input, target)`, both (B_local, T) int64, target = input shifted by one token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import lightning as L
import torch

from repro.data.corpora import Corpus, load_corpus, spec, vocab_size


class Segment(NamedTuple):
    input: torch.Tensor  # (B, T)
    target: torch.Tensor  # (B, T)


class LMSegments:
    """Ordered segments of rank `rank`'s slice of `batch_size` contiguous streams.

    Sized and stateful: Lightning stores `state_dict()` in checkpoints, so a run resumed mid-epoch continues at
    the next unseen segment instead of restarting the epoch.
    """

    def __init__(self, tokens: torch.Tensor, *, batch_size: int, tgt_len: int, rank: int = 0, world_size: int = 1,
                 roll_seed: int | None = None):
        if batch_size <= 0 or tgt_len <= 0:
            raise ValueError(f"batch_size and tgt_len must be positive, got {batch_size} and {tgt_len}")
        if batch_size % world_size:
            raise ValueError(
                f"batch size {batch_size} does not split into {world_size} ranks: use a multiple of {world_size}"
            )
        n_step = tokens.numel() // batch_size
        if n_step < 2:
            raise ValueError(
                f"{tokens.numel()} tokens make streams of {n_step} token(s) at batch size {batch_size}; "
                "use a smaller batch size"
            )
        per_rank = batch_size // world_size
        streams = tokens[: n_step * batch_size].view(batch_size, n_step)
        self.streams = streams[rank * per_rank : (rank + 1) * per_rank]  # (B_local, N)
        self.batch_size, self.tgt_len, self.n_step = batch_size, tgt_len, n_step
        self.starts = list(range(0, n_step - 1, tgt_len))
        self._start = 0
        self._consumed = 0
        self._rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self.roll_seed = roll_seed
        self._pass = -1  # the pass being served (0 = the first); its rotation with `roll_seed`

    def shifts(self, pass_index: int) -> torch.Tensor | None:
        """This rank's streams' rotations in pass `pass_index` (B_local,), or None without `roll_seed`: drawn for
        all B streams, then sliced, so that they do not depend on the number of ranks."""
        if self.roll_seed is None:
            return None
        g = torch.Generator().manual_seed((self.roll_seed * 1_000_003 + pass_index) % (1 << 63))
        return torch.randint(0, self.n_step, (self.batch_size,), generator=g)[self._rows]

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def tokens_per_pass(self) -> int:
        """Target tokens one pass scores on this rank."""
        return self.streams.shape[0] * (self.n_step - 1)

    def __iter__(self) -> Iterator[Segment]:
        start, self._start = self._start, 0
        if start == 0:  # a new pass (a resumed one keeps the pass it was in)
            self._pass += 1
        shift = self.shifts(self._pass)
        for k in range(start, len(self.starts)):
            i = self.starts[k]
            seq_len = min(self.tgt_len, self.n_step - 1 - i)
            self._consumed = k + 1
            if shift is None:
                chunk = self.streams[:, i : i + seq_len + 1].long()
            else:  # the rotated streams' columns i … i + seq_len
                cols = (torch.arange(i, i + seq_len + 1)[None, :] + shift[:, None]) % self.n_step
                chunk = self.streams.gather(1, cols).long()
            yield Segment(chunk[:, :-1], chunk[:, 1:])

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self._consumed, "geometry": [self.batch_size, self.tgt_len, self.n_step],
                "pass": self._pass}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["geometry"]) != [self.batch_size, self.tgt_len, self.n_step]:
            raise ValueError(
                f"the checkpoint was taken with (batch_size, tgt_len, tokens per stream) = {state['geometry']}, "
                f"this run has {[self.batch_size, self.tgt_len, self.n_step]}: resume with the same data settings"
            )
        self._start = state["consumed"] if state["consumed"] < len(self) else 0
        # the pass it was in (continued when unfinished; the next one follows it otherwise)
        self._pass = state.get("pass", 0) if self._start else state.get("pass", -1)


class LMDataModule(L.LightningDataModule):
    """Segments of a registered corpus (see `repro.data.corpora.REGISTRY`).

    Args:
        corpus: registry name, e.g. `wt103`, `enwik8`, `embedded-char`.
        batch_size: global number of training streams (split across DDP ranks).
        tgt_len: training segment length.
        eval_batch_size: global number of evaluation streams (the reference evaluates with 10).
        eval_tgt_len: evaluation segment length (defaults to `tgt_len`).
        data_dir: where `raw/` downloads and `cache/` tensors live (default `$REPRO_DATA` or `data/`).
        roll: rotate every training stream by a random shift at the start of every pass (LaMemo's `--roll`; see
            the module docstring). Evaluation streams are never rotated.
        roll_seed: the rotations' seed; default: the run's seed (`--seed_everything`).
    """

    def __init__(
        self,
        corpus: str,
        batch_size: int,
        tgt_len: int,
        eval_batch_size: int = 10,
        eval_tgt_len: int | None = None,
        data_dir: str | None = None,
        roll: bool = False,
        roll_seed: int | None = None,
    ):
        super().__init__()
        spec(corpus)  # unknown names fail here, before any work
        for name, value in [("batch_size", batch_size), ("tgt_len", tgt_len), ("eval_batch_size", eval_batch_size),
                            ("eval_tgt_len", eval_tgt_len if eval_tgt_len is not None else tgt_len)]:
            if value <= 0:
                raise ValueError(f"data.{name} must be positive, got {value}")
        self.corpus_name = corpus
        self.batch_size, self.tgt_len = batch_size, tgt_len
        self.eval_batch_size = eval_batch_size
        self.eval_tgt_len = eval_tgt_len if eval_tgt_len is not None else tgt_len
        self.data_dir = data_dir
        self.roll, self.roll_seed = roll, roll_seed
        self.corpus: Corpus | None = None

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.corpus_name, self.data_dir)

    @property
    def level(self) -> str:
        return spec(self.corpus_name).level

    def prepare_data(self) -> None:
        load_corpus(self.corpus_name, self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is None:
            self.corpus = load_corpus(self.corpus_name, self.data_dir)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def segments(self, split: str) -> LMSegments:
        self.setup()
        rank, world = self._rank()
        train = split == "train"
        roll_seed = None
        if train and self.roll:
            roll_seed = self.roll_seed if self.roll_seed is not None else torch.initial_seed()
        return LMSegments(
            self.corpus.splits[split],
            batch_size=self.batch_size if train else self.eval_batch_size,
            tgt_len=self.tgt_len if train else self.eval_tgt_len,
            rank=rank,
            world_size=world,
            roll_seed=roll_seed,
        )

    def train_dataloader(self) -> LMSegments:
        return self.segments("train")

    def val_dataloader(self) -> LMSegments:
        return self.segments("valid")

    def test_dataloader(self) -> LMSegments:
        return self.segments("test")
