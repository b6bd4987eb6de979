"""The reader of CMU-DoG, the document-grounded dialogue data (Zhou et al. 2018), in its GitHub archive layout.

CMU-DoG (github festvox/datasets-CMU_DoG; PAPERS.md §2) is two folders:

- `Conversations/{train,valid,test}/<sha1>.json`: `history` (a list of `{text, uid, docIdx, utcTimestamp}`, uid
  `user1` / `user2`), `whoSawDoc`, `rating`, ... and the index of the movie's document. The repository's files name
  that index `wikiDocumentIdx` since its "fix format" commit (73d7587); its first commit (3711ccc) named it
  `docLinkIdx` in the conversations and `index` in the documents, and copies of the data made from it still do.
  Both spellings are read; a file with neither is an error.
- `WikiData/<movie>.json`: sections `"0"` (a dict: cast, critical_response, director, genre, introduction,
  movieName, rating, year) and `"1"`-`"3"` (scene descriptions, strings), plus the index.

`read_cmu_dog(root, split)` turns one split into `Conversation`s (a document as text, utterances and their
speakers); `cmu_dog_root` downloads the archive of a pinned commit once. The encoding into the official input
layout, the pieces and the data module are in `repro.text.dialogue`; the generated stand-ins (tiny profile:
`repro.text.dialogue_tiny`; tiny and small: `repro.text.dialogue_synthetic`) are written in this layout and read
by this reader.

Follows the official scripts (deep-spin/infinite-former `document_grounded_generation`) where they fix something;
their conversion from the JSON files is not in that repository, so these choices are ours:
- section "0" is written as `key: value` lines (lists joined with "; ") in the order movieName, year, director,
  genre, cast, introduction, rating, critical_response; sections 1-3 follow, one per line;
- consecutive messages of the same user are joined into one utterance (so speaker tokens alternate), and the
  speaker is the user (`user1` → 1, `user2` → 2; `repro.text.dialogue` writes <speaker1> / <speaker2> from it),
  where the official scripts alternated <speaker2>/<speaker1> by position;
- empty messages are dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.data.download import download
from repro.data.root import data_dir
from repro.io import file_lock

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


# ----------------------------------------------------------------------------------------- sources on disk
CMU_DOG_COMMIT = "618a14f27546165859305649aa84e6ac8710bb63"  # festvox/datasets-CMU_DoG, newest commit read
CMU_DOG_URL = f"https://github.com/festvox/datasets-CMU_DoG/archive/{CMU_DOG_COMMIT}.zip"
# No checksum is published for this archive (GitHub generates it on request and does not promise the same bytes
# over time): trusted on first use, its sha256 recorded beside it. The commit pins the content.


def cmu_dog_root(data_root: str | os.PathLike | None = None) -> Path:
    """`<data>/raw/cmu_dog/datasets-CMU_DoG-<commit>`: downloaded (checksum recorded at the first download) and
    unpacked once; a checkout placed there by hand is used as is."""
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

