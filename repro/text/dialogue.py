"""Document-grounded dialogue as ordered pieces: the official input layout, chunking, response contexts, data module.

The data come from `repro.text.cmudog` (the reader of CMU-DoG, github festvox/datasets-CMU_DoG; PAPERS.md §2) or
from a generated set in the same layout (`repro.text.dialogue_tiny`), both read into `Conversation`s by
`read_cmu_dog`.

A conversation becomes, as in the official scripts (deep-spin/infinite-former `document_grounded_generation`),
one token sequence: `<doc>` + the document (all four sections) + `<eos>`, then every utterance preceded by its
speaker token. "The document is given only before the dialogue starts": nothing of it is repeated later, so a
model sees it only through what it remembers once the conversation has moved past the 512-token window. The
sequence is cut into 512-token pieces fed in order (cut from the end, as the official `DoGDataset`, so the last
piece is full and the first one short); a model's memory is reset at the start of each conversation. The speaker
token follows the user (`user1` → <speaker1>, `user2` → <speaker2>), where the official scripts alternated
<speaker2>/<speaker1> by position (the reader's other choices: `repro.text.cmudog`).

Losses, as the official scripts: training predicts every token of the sequence (document included); evaluation
(perplexity) scores the utterance tokens only, never the document or a speaker token. Unlike the official
pieces, which are scored inside each piece only (the first token of every piece is never predicted), a piece's
first target here is predicted from the piece before (targets are the inputs shifted by one across the cut), so
every token is predicted exactly once.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch

from repro.text.cmudog import SPLITS, Conversation, cmu_dog_root, read_cmu_dog
from repro.text.dialogue_tiny import tiny_dog_root
from repro.text.streams import _Corpus, _Vocab
from repro.text.tokenizer import TokenizerSpec, load_tokenizer, vocab_size

IGNORE = -100  # target of a position that is not scored


# --------------------------------------------------------------------------------------------- sequences
@dataclass
class Encoded:
    ids: list[int]
    types: list[int]  # the segment's special token at every position (the official token_type_ids)
    scored: list[bool]  # evaluation: is this token a word of an utterance
    starts: list[int]  # position of each utterance's speaker token
    spans: list[tuple[int, int]]  # each utterance's word tokens [a, b)


def encode_conversation(conv: Conversation, tok, *, with_document: bool = True,
                        doc_max_tokens: int | None = None) -> Encoded:
    """The official layout: <doc> document <eos>, then <speakerK> utterance ... (see the module docstring).

    `with_document=False` is the "GPT-2 w/o doc" baseline; `doc_max_tokens` keeps only the first tokens of the
    document."""
    doc_id, eos = tok.id("<doc>"), tok.id("<eos>")
    ids: list[int] = []
    types: list[int] = []
    scored: list[bool] = []
    if with_document:
        body = tok.encode(conv.document)
        if doc_max_tokens is not None:
            body = body[:doc_max_tokens]
        part = [doc_id, *body, eos]
        ids += part
        types += [doc_id] * len(part)
        scored += [False] * len(part)
    starts, spans = [], []
    for text, s in zip(conv.utterances, conv.speakers):
        spk = tok.id(f"<speaker{s}>")
        words = tok.encode(text)
        starts.append(len(ids))
        ids.append(spk)
        types.append(spk)
        scored.append(False)
        spans.append((len(ids), len(ids) + len(words)))
        ids += words
        types += [spk] * len(words)
        scored += [True] * len(words)
    return Encoded(ids, types, scored, starts, spans)


def pieces_from_end(n: int, size: int, *, last: int | None = None) -> list[tuple[int, int]]:
    """[start, end) spans of `n` positions cut into pieces of `size` from the end (the first piece is the short
    one); `last` (≤ size) caps the final piece (generation leaves room for the response)."""
    if size <= 0:
        raise ValueError(f"piece size must be positive, got {size}")
    spans = []
    end, cap = n, last if last is not None else size
    while end > 0:
        start = max(0, end - cap)
        spans.append((start, end))
        end, cap = start, size
    return spans[::-1]


class DialogueChunk(NamedTuple):
    input: torch.Tensor  # (1, T) int64
    target: torch.Tensor  # (1, T) int64, IGNORE where not scored
    types: torch.Tensor  # (1, T) int64
    reset: bool  # first piece of a conversation: memories start empty


def conversation_chunks(enc: Encoded, block: int, *, train: bool) -> list[DialogueChunk]:
    ids = torch.tensor(enc.ids, dtype=torch.long)
    types = torch.tensor(enc.types, dtype=torch.long)
    if train:
        tgt = ids[1:].clone()
    else:
        tgt = torch.where(torch.tensor(enc.scored[1:]), ids[1:], torch.full_like(ids[1:], IGNORE))
    inp, typ = ids[:-1], types[:-1]
    out = []
    for k, (a, b) in enumerate(pieces_from_end(inp.numel(), block)):
        out.append(DialogueChunk(inp[a:b].unsqueeze(0), tgt[a:b].unsqueeze(0), typ[a:b].unsqueeze(0), k == 0))
    return out


@dataclass
class ResponseExample:
    conversation: str
    turn: int  # index of the response among the utterances
    context: list[int]  # everything before the response, ending with the responder's speaker token
    context_types: list[int]
    reference: str


RESPONSE_CONTEXTS = ("preceding", "official")


def official_context(enc: Encoded) -> tuple[list[int], list[int]]:
    """The context the official `eval.py` gives EVERY response of a conversation (`build_input_from_segments_`).

    Its loop appends one list object per response and keeps extending that same list (`new` is never set back to
    True), so after the loop every stored context is the final one: the document part, ONE speaker token, then the
    words of every utterance but the last, with no speaker token between them; the token types keep each
    utterance's speaker. Built here from our encoding (whose speaker tokens follow the user, where the official
    alternated <speaker2>/<speaker1> by position)."""
    if not enc.starts:
        return list(enc.ids), list(enc.types)
    keep = list(range(enc.starts[0] + 1))  # document part and the first speaker token
    for a, b in enc.spans[:-1]:
        keep += range(a, b)
    return [enc.ids[i] for i in keep], [enc.types[i] for i in keep]


def response_examples(convs: Sequence[Conversation], encoded: Sequence[Encoded], *, min_history: int = 2,
                      limit: int | None = None, context: str = "preceding") -> list[ResponseExample]:
    """Every response with at least `min_history` previous utterances (the paper's generation protocol).

    `context="preceding"` (ours): the context of each response holds the utterances before it and nothing after,
    each with its speaker token, and ends with the responder's speaker token. `context="official"`: every response
    of a conversation gets `official_context` (the whole conversation but its last utterance, the reference and the
    turns after it included), as the official `eval.py` built it (an aliasing bug, reproduced for the paper
    protocol). The official `--min_history 2` with its test `i >= min_length` keeps responses with ≥ 3 previous
    utterances: `min_history=3` here."""
    if context not in RESPONSE_CONTEXTS:
        raise ValueError(f"response context is one of {RESPONSE_CONTEXTS}, got {context!r}")
    if min_history < 0:
        raise ValueError(f"min_history must be ≥ 0, got {min_history}")
    out = []
    for conv, enc in zip(convs, encoded):
        shared = official_context(enc) if context == "official" else None
        for i in range(min_history, len(conv.utterances)):
            if shared is not None:
                ctx, typ = shared
            else:
                s = enc.starts[i] + 1  # through the speaker token of the responder
                ctx, typ = enc.ids[:s], enc.types[:s]
            out.append(ResponseExample(conv.name, i, list(ctx), list(typ), conv.utterances[i]))
            if limit is not None and len(out) >= limit:
                return out
    return out


# ------------------------------------------------------------------------------------------- data module
class DialogueChunks:
    """Pieces of whole conversations in order, one conversation after another (batch size 1, as the paper).

    Under DDP each rank takes a contiguous share of the conversations. Training cuts every rank to the smallest
    rank's number of pieces (DDP needs the same number of steps everywhere); evaluation pads the shorter ranks
    with unscored one-token pieces, so every piece of every conversation is scored once. Conversations are
    shuffled for training with `seed + epoch` (the official loader shuffled them); pieces within a conversation
    always stay in order. Stateful: a resumed run continues at the next unseen piece."""

    def __init__(self, encoded: Sequence[Encoded], block: int, *, train: bool, rank: int = 0, world_size: int = 1,
                 seed: int = 0, pad_id: int = 0):
        self.encoded, self.block, self.train = list(encoded), block, train
        self.rank, self.world, self.seed, self.pad_id = rank, world_size, seed, pad_id
        self.epoch, self._start, self._consumed = 0, 0, 0
        self._counts = [len(pieces_from_end(len(e.ids) - 1, block)) for e in self.encoded]

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.encoded)))
        if self.train:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _shares(self, order: list[int]) -> list[list[int]]:
        n = len(order)
        return [order[r * n // self.world : (r + 1) * n // self.world] for r in range(self.world)]

    def _length(self, order: list[int]) -> int:
        per_rank = [sum(self._counts[i] for i in share) for share in self._shares(order)]
        return min(per_rank) if self.train else max(per_rank)

    def __len__(self) -> int:
        return self._length(self._order(self.epoch))

    def __iter__(self) -> Iterator[DialogueChunk]:
        order = self._order(self.epoch)
        total = self._length(order)
        mine = self._shares(order)[self.rank]
        start, self._start = self._start, 0
        k = 0
        for i in mine:
            for chunk in conversation_chunks(self.encoded[i], self.block, train=self.train):
                if k >= total:
                    break
                if k >= start:
                    self._consumed = k + 1
                    yield chunk
                k += 1
        while k < total:  # evaluation padding (never reached in training)
            if k >= start:
                self._consumed = k + 1
                pad = torch.full((1, 1), self.pad_id, dtype=torch.long)
                yield DialogueChunk(pad, torch.full((1, 1), IGNORE, dtype=torch.long), pad.clone(), True)
            k += 1
        self._consumed = 0
        if self.train:
            self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self._consumed, "epoch": self.epoch, "conversations": len(self.encoded),
                "block": self.block}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["conversations"], state["block"]) != (len(self.encoded), self.block):
            raise ValueError("the checkpoint was taken on other dialogue data or another block size: resume with "
                             "the same data settings")
        self.epoch, self._start = state["epoch"], state["consumed"]


class DialogueDataModule(L.LightningDataModule):
    """CMU-DoG (`source: cmu_dog`, paper) or the generated set (`source: tiny`) as ordered 512-token pieces.

    Args:
        source: `cmu_dog` or `tiny`.
        tokenizer: a `TokenizerSpec` (special tokens are always added: the layout needs them).
        block_size: tokens per piece (the paper: 512, GPT-2's window).
        with_document: False gives the "GPT-2 w/o doc" baseline's input.
        doc_max_tokens: keep only the first tokens of each document (None: all).
        min_history: generation: responses with at least this many previous utterances (the official protocol:
            3, what its `--min_history 2` kept).
        response_context: generation: "preceding" (each response after the utterances before it) or "official"
            (the context the official `eval.py` built for every response; see `response_examples`).
        max_responses: generation: score only the first N responses of the test split (None: all).
        root: a CMU-DoG checkout (default: downloaded under `<data>/raw/cmu_dog`).
        tiny: settings of `repro.text.dialogue_tiny.generate_tiny_dog`.
        seed: conversation order of training.
    """

    def __init__(self, source: str = "tiny", tokenizer: TokenizerSpec | dict | None = None,
                 block_size: int = 512, with_document: bool = True, doc_max_tokens: int | None = None,
                 min_history: int = 2, max_responses: int | None = None, root: str | None = None,
                 tiny: dict | None = None, seed: int = 0, data_dir: str | None = None,
                 response_context: str = "preceding"):
        super().__init__()
        if source not in ("cmu_dog", "tiny"):
            raise ValueError(f"data.source is 'cmu_dog' or 'tiny', got {source!r}")
        if block_size < 2:
            raise ValueError(f"data.block_size must be ≥ 2, got {block_size}")
        spec = TokenizerSpec(**{**(tokenizer or {}), "special_tokens": True}) if not isinstance(
            tokenizer, TokenizerSpec) else tokenizer
        self.source, self.spec, self.block_size = source, spec, block_size
        self.with_document, self.doc_max_tokens = with_document, doc_max_tokens
        if response_context not in RESPONSE_CONTEXTS:
            raise ValueError(f"data.response_context is one of {RESPONSE_CONTEXTS}, got {response_context!r}")
        self.min_history, self.max_responses = min_history, max_responses
        self.response_context = response_context
        self.root, self.tiny, self.seed, self.data_dir = root, dict(tiny or {}), seed, data_dir
        # "embedded-": the tiny set is generated by the project (nothing to download), as the embedded corpora
        self.corpus_name = "embedded-tiny-dog" if source == "tiny" else "cmu-dog"
        self.tok = None
        self.corpus = None
        self.convs: dict[str, list[Conversation]] = {}
        self.encoded: dict[str, list[Encoded]] = {}
        self._loaders: dict[str, DialogueChunks] = {}

    @property
    def tokenizer(self):
        if self.tok is None:
            self.tok = load_tokenizer(self.spec, self.data_dir)
        return self.tok

    @property
    def vocab_size(self) -> int:
        if self.tok is not None:
            return len(self.tok)
        return vocab_size(self.spec, self.data_dir)

    def data_root(self) -> Path:
        if self.root:
            return Path(self.root)
        if self.source == "tiny":
            return tiny_dog_root(self.data_dir, **self.tiny)
        return cmu_dog_root(self.data_dir)

    def prepare_data(self) -> None:
        self.data_root()
        _ = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        if self.encoded:
            return

        root = self.data_root()
        tok = self.tokenizer
        self.corpus = _Corpus(_Vocab(tok.digest, len(tok)), {"source": self.source, "root": str(root),
                                                             "tokenizer": tok.digest})
        for split in SPLITS:
            self.convs[split] = read_cmu_dog(root, split)
            self.encoded[split] = [encode_conversation(c, self.tokenizer, with_document=self.with_document,
                                                       doc_max_tokens=self.doc_max_tokens)
                                   for c in self.convs[split]]

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def chunks(self, split: str) -> DialogueChunks:
        self.setup()
        rank, world = self._rank()
        key = f"{split}:{rank}/{world}"
        if key not in self._loaders:  # one stateful loader per split, so a resume finds its position
            self._loaders[key] = DialogueChunks(self.encoded[split], self.block_size, train=split == "train",
                                                rank=rank, world_size=world, seed=self.seed,
                                                pad_id=self.tokenizer.id("<pad>"))
        return self._loaders[key]

    def train_dataloader(self):
        return self.chunks("train")

    def val_dataloader(self):
        return self.chunks("valid")

    def test_dataloader(self):
        return self.chunks("test")

    def response_examples(self, split: str = "test") -> list[ResponseExample]:
        self.setup()
        return response_examples(self.convs[split], self.encoded[split], min_history=self.min_history,
                                 limit=self.max_responses, context=self.response_context)
