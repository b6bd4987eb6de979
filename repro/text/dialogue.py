"""Document-grounded dialogue: the CMU-DoG loader, the tiny generated set, and the official input layout.

CMU-DoG (github festvox/datasets-CMU_DoG; PAPERS.md §2) is two folders:

- `Conversations/{train,valid,test}/<sha1>.json`: `history` (a list of `{text, uid, docIdx, utcTimestamp}`, uid
  `user1` / `user2`), `whoSawDoc`, `rating`, ... and the index of the movie's document. The repository's files name
  that index `wikiDocumentIdx` since its "fix format" commit (73d7587); its first commit (3711ccc) named it
  `docLinkIdx` in the conversations and `index` in the documents, and copies of the data made from it still do.
  Both spellings are read; a file with neither is an error.
- `WikiData/<movie>.json`: sections `"0"` (a dict: cast, critical_response, director, genre, introduction,
  movieName, rating, year) and `"1"`-`"3"` (scene descriptions, strings), plus the index.

A conversation becomes, as in the official scripts (deep-spin/infinite-former `document_grounded_generation`),
one token sequence: `<doc>` + the document (all four sections) + `<eos>`, then every utterance preceded by its
speaker token. "The document is given only before the dialogue starts": nothing of it is repeated later, so a
model sees it only through what it remembers once the conversation has moved past the 512-token window. The
sequence is cut into 512-token pieces fed in order (cut from the end, as the official `DoGDataset`, so the last
piece is full and the first one short); a model's memory is reset at the start of each conversation.

Choices the official preprocessing does not fix (its conversion from the JSON files is not in the repository):
- section "0" is written as `key: value` lines (lists joined with "; ") in the order movieName, year, director,
  genre, cast, introduction, rating, critical_response; sections 1-3 follow, one per line;
- consecutive messages of the same user are joined into one utterance (so speaker tokens alternate), and the
  speaker token follows the user (`user1` → <speaker1>, `user2` → <speaker2>), where the official scripts
  alternated <speaker2>/<speaker1> by position;
- empty messages are dropped.

Losses, as the official scripts: training predicts every token of the sequence (document included); evaluation
(perplexity) scores the utterance tokens only, never the document or a speaker token. Unlike the official
pieces, which are scored inside each piece only (the first token of every piece is never predicted), a piece's
first target here is predicted from the piece before (targets are the inputs shifted by one across the cut), so
every token is predicted exactly once.

The tiny profile's set (`generate_tiny_dog`) is written in the CMU-DoG layout itself and read by the same loader.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch

from repro.text.tokenizer import TokenizerSpec, load_tokenizer, vocab_size

IGNORE = -100  # target of a position that is not scored
SPLITS = ("train", "valid", "test")
DOC_INDEX_KEYS = ("wikiDocumentIdx", "docLinkIdx")  # conversations: current name, first-commit name
WIKI_INDEX_KEYS = ("wikiDocumentIdx", "index")  # documents: current name, first-commit name
SECTION0_ORDER = ("movieName", "year", "director", "genre", "cast", "introduction", "rating", "critical_response")


@dataclass
class Conversation:
    name: str
    document: str
    utterances: list[str]
    speakers: list[int]  # 1 or 2, per utterance


# ------------------------------------------------------------------------------------------------- CMU-DoG
def _index(obj: dict, keys: Sequence[str], where: Path) -> int:
    for k in keys:
        if k in obj:
            return int(obj[k])
    raise ValueError(f"{where} has no document index (looked for {', '.join(keys)}): is this a CMU-DoG file?")


def document_text(doc: dict[str, Any], where: Path | str = "document") -> str:
    """The four sections of a CMU-DoG WikiData document as text (see the module docstring)."""
    missing = [s for s in "0123" if s not in doc]
    if missing:
        raise ValueError(f"{where} lacks section(s) {missing}: a CMU-DoG document has sections '0'-'3'")
    intro = doc["0"]
    if not isinstance(intro, dict):
        raise ValueError(f"{where}: section '0' must be a dict (cast, director, ...), got {type(intro).__name__}")
    lines = []
    for key in [*SECTION0_ORDER, *sorted(set(intro) - set(SECTION0_ORDER))]:
        if key in intro and intro[key] not in (None, "", []):
            value = intro[key]
            value = "; ".join(str(v) for v in value) if isinstance(value, list) else str(value)
            lines.append(f"{key}: {value}")
    lines += [str(doc[s]).strip() for s in "123" if str(doc[s]).strip()]
    return "\n".join(lines)


def read_documents(root: Path) -> dict[int, str]:
    folder = root / "WikiData"
    if not folder.is_dir():
        raise ValueError(f"{folder} does not exist: point data.root at a CMU-DoG checkout "
                         "(git clone https://github.com/festvox/datasets-CMU_DoG)")
    docs = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        docs[_index(doc, WIKI_INDEX_KEYS, path)] = document_text(doc, path)
    if not docs:
        raise ValueError(f"no WikiData/*.json documents in {root}")
    return docs


def merge_turns(history: list[dict]) -> tuple[list[str], list[int]]:
    """Utterances (consecutive messages of one user joined) and their speakers (1 = user1, 2 = user2)."""
    utts: list[str] = []
    spk: list[int] = []
    for h in history:
        text = " ".join(str(h.get("text", "")).split())
        if not text:
            continue
        uid = h.get("uid")
        if uid not in ("user1", "user2"):
            raise ValueError(f"unknown speaker uid {uid!r} (CMU-DoG uses 'user1' / 'user2')")
        s = 1 if uid == "user1" else 2
        if spk and spk[-1] == s:
            utts[-1] += " " + text
        else:
            utts.append(text)
            spk.append(s)
    return utts, spk


def read_cmu_dog(root: str | os.PathLike, split: str) -> list[Conversation]:
    """The conversations of one split, in file-name order, each with its document."""
    if split not in SPLITS:
        raise ValueError(f"split is one of {SPLITS}, got {split!r}")
    root = Path(root)
    docs = read_documents(root)
    folder = root / "Conversations" / split
    if not folder.is_dir():
        raise ValueError(f"{folder} does not exist: a CMU-DoG checkout has Conversations/{{train,valid,test}}")
    out = []
    for path in sorted(folder.glob("*.json")):
        conv = json.loads(path.read_text(encoding="utf-8"))
        idx = _index(conv, DOC_INDEX_KEYS, path)
        if idx not in docs:
            raise ValueError(f"{path} refers to document {idx}, which no WikiData file has (have {sorted(docs)})")
        utts, spk = merge_turns(conv.get("history", []))
        out.append(Conversation(path.stem, docs[idx], utts, spk))
    if not out:
        raise ValueError(f"no conversations in {folder}")
    return out


# -------------------------------------------------------------------------------------------- the tiny set
_NAMES = ["Alma", "Boris", "Cleo", "Dario", "Edith", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lukas",
          "Mona", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Yara", "Zeno"]
_FACTS = {  # attribute: (values, statement template, question template)
    "city": (["Lisbon", "Oslo", "Quito", "Dakar", "Hanoi", "Lima", "Perth", "Cairo", "Turin", "Kyoto"],
             "{n} lives in {v}.", "where does {n} live?"),
    "pet": (["a parrot", "a turtle", "a ferret", "a goat", "a rabbit", "a hamster", "a pony", "a gecko"],
            "{n} keeps {v}.", "what pet does {n} keep?"),
    "job": (["a baker", "a pilot", "a nurse", "a judge", "a potter", "a sailor", "a farmer", "a tailor"],
            "{n} works as {v}.", "what does {n} do for work?"),
    "food": (["plums", "noodles", "olives", "lentils", "figs", "dumplings", "oysters", "pears"],
             "{n} likes to eat {v}.", "what does {n} like to eat?"),
    "color": (["amber", "teal", "crimson", "violet", "ochre", "indigo", "olive", "silver"],
              "{n} paints the door {v}.", "what colour is the door of {n}?"),
}
_FILLER = ["The weather was mild that year.", "Nothing else happened in the village.", "The market opened at dawn.",
           "A long road crossed the hills.", "The river was calm in summer.", "People talked about the harvest."]


def generate_tiny_dog(root: str | os.PathLike, *, n_docs: int = 12, conversations: dict[str, int] | None = None,
                      people: int = 6, filler: int = 10, questions: int = 4, seed: int = 0) -> Path:
    """Write a small grounded-dialogue set in the CMU-DoG layout under `root`.

    Each document lists facts about `people` people (one line per fact, section "1"), followed by `filler`
    sentences that say nothing about them (sections "2"-"3"), so the facts sit early in a long document. Each
    conversation asks `questions` questions about facts of its document and answers them word for word
    ("where does Alma live?" / "Alma lives in Oslo."). The answers are predictable only from the document: a model
    that keeps the document in memory after the window has moved into the dialogue can predict them, one that
    does not can only guess among the values. Deterministic given `seed`. Returns `root`."""
    from repro.io import atomic_write_json

    rng = random.Random(seed)
    root = Path(root)
    counts = conversations or {"train": 160, "valid": 16, "test": 16}
    docs = []
    for d in range(n_docs):
        names = rng.sample(_NAMES, people)
        facts = []
        for n in names:
            for attr, (values, statement, question) in _FACTS.items():
                facts.append((n, attr, rng.choice(values)))
        rng.shuffle(facts)
        fill = [rng.choice(_FILLER) for _ in range(filler)]
        doc = {
            "0": {"movieName": f"Village {d}", "year": str(1900 + d), "director": rng.choice(_NAMES),
                  "genre": "chronicle", "cast": names, "introduction": f"A chronicle of village {d}.",
                  "rating": [], "critical_response": []},
            "1": " ".join(_FACTS[a][1].format(n=n, v=v) for n, a, v in facts),
            "2": " ".join(fill[: filler // 2]),
            "3": " ".join(fill[filler // 2 :]),
            "wikiDocumentIdx": d,
        }
        docs.append((doc, facts))
        atomic_write_json(root / "WikiData" / f"village_{d:02d}.json", doc)
    k = 0
    for split in SPLITS:
        for i in range(counts[split]):
            d = rng.randrange(n_docs)
            doc, facts = docs[d]
            history = [{"text": "hi! did you read about the village?", "uid": "user1", "docIdx": 0},
                       {"text": "yes, I did.", "uid": "user2", "docIdx": 0}]
            for n, a, v in rng.sample(facts, questions):
                history.append({"text": _FACTS[a][2].format(n=n), "uid": "user1", "docIdx": 1})
                history.append({"text": _FACTS[a][1].format(n=n, v=v), "uid": "user2", "docIdx": 1})
            for h in history:
                h["utcTimestamp"] = "2018-03-01T00:00:00.000Z"
            conv = {"date": "2018-03-01T00:00:00.000Z", "history": history, "rating": 3, "status": 1,
                    "whoSawDoc": ["user2"], "user1_id": f"USR{k:04d}", "user2_id": f"USR{k + 1:04d}",
                    "wikiDocumentIdx": d}
            atomic_write_json(root / "Conversations" / split / f"{k:06d}.json", conv)
            k += 1
    return root


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


# ----------------------------------------------------------------------------------------- sources on disk
CMU_DOG_COMMIT = "618a14f27546165859305649aa84e6ac8710bb63"  # festvox/datasets-CMU_DoG, newest commit read
CMU_DOG_URL = f"https://github.com/festvox/datasets-CMU_DoG/archive/{CMU_DOG_COMMIT}.zip"
# No checksum is published for this archive (GitHub generates it on request and does not promise the same bytes
# over time): trusted on first use, its sha256 recorded beside it. The commit pins the content.


def cmu_dog_root(data_root: str | os.PathLike | None = None) -> Path:
    """`<data>/raw/cmu_dog/datasets-CMU_DoG-<commit>`: downloaded (checksum recorded at the first download) and
    unpacked once; a checkout placed there by hand is used as is."""
    import shutil
    import zipfile

    from repro.data.corpora import data_dir
    from repro.data.download import download

    from repro.io import file_lock

    base = data_dir(data_root) / "raw" / "cmu_dog"
    root = base / f"datasets-CMU_DoG-{CMU_DOG_COMMIT}"
    if (root / "WikiData").is_dir() and (root / "Conversations").is_dir():
        return root
    with file_lock(base / ".lock"):
        if not ((root / "WikiData").is_dir() and (root / "Conversations").is_dir()):
            archive = download(CMU_DOG_URL, base / f"{CMU_DOG_COMMIT}.zip", sha256=None, record_sha256=True)
            tmp = base / ".unpacking"
            shutil.rmtree(tmp, ignore_errors=True)
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
            os.replace(tmp / root.name, root)
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def tiny_dog_root(data_root: str | os.PathLike | None = None, **settings) -> Path:
    """The generated tiny set, built once per settings under `<data>/cache/tiny_dog-<digest>`."""
    import hashlib
    import shutil

    from repro.data.corpora import data_dir
    from repro.io import atomic_write_json, file_lock

    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    root = data_dir(data_root) / "cache" / f"tiny_dog-{key}"
    if (root / "complete.json").exists():
        return root
    with file_lock(root.with_name(root.name + ".lock")):  # workers of one `repro runs` may arrive together
        if not (root / "complete.json").exists():
            shutil.rmtree(root, ignore_errors=True)  # an interrupted build
            generate_tiny_dog(root, **settings)
            atomic_write_json(root / "complete.json", settings)  # written last: marks a complete set
    return root


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
        tiny: settings of `generate_tiny_dog`.
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
        from repro.text.streams import _Corpus, _Vocab

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
