"""The generated grounded-dialogue set (tiny and small profiles): answers that need the document, marked as such.

It replaces the first tiny set (template questions about facts, answers and questions scored together), on which
GPT-2 without the document beat every grounded model by construction. `tiny_dog_root` builds it
(`generate_tiny_dog(root, **settings)`; settings: `conversations` per split, `filler`, `seed`); the test scores the
answers apart with `utterance_acts` and `repro.metrics.text.scores_by_act`.

A stand-in for CMU-DoG (Table 2 of Martins et al. 2022) built so that the paper's claim can be tested at all: the
document is given only before the dialogue starts, and each conversation asks for two facts of its document:

- an EARLY fact, the document's first sentence ("The treasure is in Oslo."), followed by `filler` sentences
  that say nothing about it, so that it has left a GPT-2 window of `block_size` tokens long before it is asked
  for: only a model that keeps the document in memory can answer;
- a LATE fact, the document's last sentence ("The key is in the cellar."), a few tokens before its question:
  inside the window, so that GPT-2 with the document in context can answer it, and GPT-2 without the document
  cannot.

Each answer is the fact's value alone ("Oslo." / "cellar."): F1, ROUGE and METEOR of an answer then measure
whether the value is right, not whether the answer's template was learnt. A model that never sees the value can
only guess among the values (1 in 10 cities, 1 in 8 places). Questions and greetings are templates predictable
without the document; every utterance carries its dialogue act (`act` in the conversation files: `greeting`,
`question`, `answer_early`, `answer_late`), so the test scores answers apart from the rest
(`test/<metric>_answer`, and per act). Every conversation has its own document (values and filler drawn afresh),
so no document can be recognised from its filler and its values remembered from training.

Written in the CMU-DoG layout (`WikiData/<doc>.json`, `Conversations/<split>/<id>.json`) and read by the CMU-DoG
reader; deterministic given `seed`. The order of the two questions is drawn per conversation.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from repro.io import atomic_write_json

SPLITS = ("train", "valid", "test")
CITIES = ["Lisbon", "Oslo", "Quito", "Dakar", "Hanoi", "Lima", "Perth", "Cairo", "Turin", "Kyoto"]
PLACES = ["cellar", "attic", "drawer", "basket", "garden", "kettle", "piano", "wardrobe"]
EARLY = ("The treasure is in {v}.", "where is the treasure?", "{v}.")
LATE = ("The key is in the {v}.", "where is the key?", "{v}.")
FILLER = ["The weather was mild that year.", "Nothing else happened in the village.", "The market opened at dawn.",
          "A long road crossed the hills.", "The river was calm in summer.", "People talked about the harvest.",
          "The baker sold bread every morning.", "Children played near the old bridge.",
          "A storm came late in the autumn.", "The school had a new teacher.", "Sheep grazed on the slopes.",
          "The mayor gave a short speech."]
ACTS = ("greeting", "question", "answer_early", "answer_late")


FORMAT = 2  # the first tiny set (people × facts, template answers) was format 1


def generate_tiny_dog(root: str | os.PathLike, *, conversations: dict[str, int] | None = None, filler: int = 10,
                      seed: int = 0, format: int = FORMAT) -> Path:
    """Write the set under `root` (CMU-DoG layout); `conversations` per split (default 160 / 16 / 40).

    `format` names this set in the configs' settings (`data.tiny`), so that the cache folder of a set built by the
    first generator is never taken for this one, and that the first generator refuses these settings."""
    if format != FORMAT:
        raise ValueError(f"data.tiny.format {format} is not this generator's ({FORMAT}): the first tiny dialogue set "
                         "is no longer generated")
    rng = random.Random(seed)
    root = Path(root)
    counts = conversations or {"train": 160, "valid": 16, "test": 40}
    missing = [s for s in SPLITS if s not in counts]
    if missing:
        raise ValueError(f"conversations needs a count for every split, missing {missing}")
    k = 0
    for split in SPLITS:
        for _ in range(int(counts[split])):
            city, place = rng.choice(CITIES), rng.choice(PLACES)
            fill = [rng.choice(FILLER) for _ in range(filler)]
            doc = {"0": {"movieName": f"Story {k}", "introduction": EARLY[0].format(v=city)},
                   "1": " ".join(fill[: filler // 2]), "2": " ".join(fill[filler // 2:]),
                   "3": LATE[0].format(v=place), "wikiDocumentIdx": k}
            atomic_write_json(root / "WikiData" / f"story_{k:06d}.json", doc)
            turns = [("user1", "hi!", "greeting"), ("user2", "hello.", "greeting")]
            qa = [(EARLY, city, "answer_early"), (LATE, place, "answer_late")]
            rng.shuffle(qa)
            for (_, question, answer), value, act in qa:
                turns += [("user1", question, "question"), ("user2", answer.format(v=value), act)]
            history = [{"text": t, "uid": u, "docIdx": 0, "act": a, "utcTimestamp": "2018-03-01T00:00:00.000Z"}
                       for u, t, a in turns]
            conv = {"date": "2018-03-01T00:00:00.000Z", "history": history, "rating": 3, "status": 1,
                    "whoSawDoc": ["user2"], "user1_id": f"USR{2 * k:05d}", "user2_id": f"USR{2 * k + 1:05d}",
                    "wikiDocumentIdx": k}
            atomic_write_json(root / "Conversations" / split / f"{k:06d}.json", conv)
            k += 1
    return root


def utterance_acts(root: str | os.PathLike, split: str) -> dict[tuple[str, int], str]:
    """{(conversation, utterance index): act} of a split whose messages carry an `act` (this set's); {} for CMU-DoG.

    Utterances are indexed as the CMU-DoG reader makes them (empty messages dropped, consecutive messages of one
    user joined: the act of the first one is kept), so that the keys match `ResponseExample.conversation/turn`."""
    out: dict[tuple[str, int], str] = {}
    for path in sorted((Path(root) / "Conversations" / split).glob("*.json")):
        history = json.loads(path.read_text(encoding="utf-8")).get("history", [])
        turn, last = -1, None
        for h in history:
            if not " ".join(str(h.get("text", "")).split()):
                continue
            if h.get("uid") != last:
                turn, last = turn + 1, h.get("uid")
                if h.get("act"):
                    out[(path.stem, turn)] = str(h["act"])
    return out
