"""The tiny profile's first generated dialogue set: template questions about facts of a document, in the CMU-DoG layout.

`generate_tiny_dog(root, ...)` writes a small grounded-dialogue set (`WikiData/<doc>.json`,
`Conversations/<split>/<id>.json`, the layout of festvox/datasets-CMU_DoG) that `repro.text.cmudog.read_cmu_dog`
reads like the real data; `tiny_dog_root` builds it once per settings under `<data>/cache/tiny_dog-<digest>`, where
`repro.text.dialogue.DialogueDataModule` (`source: tiny`) finds it.

It stands in for CMU-DoG (Table 2 of Martins et al. 2022; the official code is deep-spin/infinite-former
`document_grounded_generation`, which has no such set): people's facts sit early in a long document, and each
conversation asks for some of them and answers word for word, so the answers are predictable only from the
document. Unlike CMU-DoG its documents are villages, not movies (section "0" keeps CMU-DoG's keys), and its
utterances are templates. `repro.text.dialogue_synthetic` is the later set, with answers scored apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

from repro.data.root import data_dir
from repro.io import atomic_write_json, file_lock
from repro.text.cmudog import SPLITS
from repro.text.dialogue_synthetic import generate_tiny_dog as generate_synthetic

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
    rng = random.Random(seed)
    root = Path(root)
    counts = conversations or {"train": 160, "valid": 16, "test": 16}
    docs = []
    for d in range(n_docs):
        names = rng.sample(_NAMES, people)
        facts = []
        for n in names:
            for attr, (values, *_) in _FACTS.items():
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
        for _ in range(counts[split]):
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


def tiny_dog_root(data_root: str | os.PathLike | None = None, **settings) -> Path:
    """The generated set the settings name, built once per settings under `<data>/cache/tiny_dog-<digest>`:
    `format: 2` the set of `repro.text.dialogue_synthetic` (answers that need the document, marked by act; the
    tiny and small configs), otherwise this module's first set."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    root = data_dir(data_root) / "cache" / f"tiny_dog-{key}"
    if (root / "complete.json").exists():
        return root
    with file_lock(root.with_name(root.name + ".lock")):  # workers of one `repro runs` may arrive together
        if not (root / "complete.json").exists():
            shutil.rmtree(root, ignore_errors=True)  # an interrupted build
            if settings.get("format", 1) == 2:
                generate_synthetic(root, **settings)
            else:
                generate_tiny_dog(root, **{k: v for k, v in settings.items() if k != "format"})
            atomic_write_json(root / "complete.json", settings)  # written last: marks a complete set
    return root
