"""The mirror's language-model and dialogue corpora (`repro.ops.mirror`): WikiText-103 (tokens and raw), enwik8 and
text8, One Billion Word (shards and its vocabulary file), PTB (`simple-examples.tgz`) and CMU-DoG, each written as
the real archive (the same archive name, member paths and formats) with made-up content (`repro.ops.mirror.text`).

Every corpus has its real vocabulary size (`REAL_VOCAB`, filler words added to the training split), so that a paper
model built on the mirror has its paper size; enwik8 and text8 have their real length, 10^8 bytes (a repeating
chunk: the zip stays a few hundred KB). What each builder wrote is counted into `info` (the mirror's manifest),
which the tests compare the parsed streams with.
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import pairwise
from pathlib import Path

from repro.data.sources import (
    ENWIK8_URLS,
    LM1B_HELDOUT_DIR,
    LM1B_ROOT,
    LM1B_TRAIN_DIR,
    LM1B_URLS,
    LM1B_VOCAB_URLS,
    PTB_URLS,
    TEXT8_URLS,
    WIKITEXT103_URLS,
)
from repro.ops.mirror.layout import file_of, write_tar_gz, write_zip
from repro.ops.mirror.text import (
    REAL_VOCAB,
    Words,
    enwik8_chunk,
    fill_bytes,
    lexicon,
    text8_chunk,
    tile,
    wikitext_lines,
    with_unk,
)
from repro.text.cmudog import CMU_DOG_COMMIT, CMU_DOG_URL

HUTTER_SIZE = 100_000_000
LM1B_TRAIN_SHARDS = range(1, 100)  # news.en-00001-of-00100 … 00099 (shard 00000 became the held-out set)
LM1B_HELDOUT_SHARDS = range(50)


def build_wikitext(root: Path, words: Words, sizes: dict[str, int], info: dict) -> None:
    from repro.text.streams import WT103_RAW_URLS  # heavy: Lightning

    lines = {split: wikitext_lines(words, n, 9) for split, n in sizes.items()}
    counts: dict[str, int] = {}
    for w in "".join(lines["train"]).split():
        counts[w] = counts.get(w, 0) + 1
    # the real number of types: one more article of made-up words, each twice (words seen once become <unk>)
    types = {w for w, c in counts.items() if c > 1} | {"<unk>"}
    extra = lexicon(REAL_VOCAB["wt103"] - 1 - len(types), set(counts))
    lines["train"] += [" = Lexicon = \n", " \n"] + [" " + " ".join(extra[i:i + 50] * 2) + " \n"
                                                    for i in range(0, len(extra), 50)]
    for w in extra:
        counts[w] = 2
    raw = {s: "".join(v) for s, v in lines.items()}
    tok = {s: with_unk(v, counts) for s, v in lines.items()}
    write_zip(file_of(root, WIKITEXT103_URLS[0]), {"wikitext-103/": b"", **{
        f"wikitext-103/wiki.{s}.tokens": tok[s].encode() for s in sizes}})
    write_zip(file_of(root, WT103_RAW_URLS[0]), {"wikitext-103-raw/": b"", **{
        f"wikitext-103-raw/wiki.{s}.raw": raw[s].encode() for s in sizes}})
    info["wt103"] = {s: {"lines": len(tok[s].splitlines()), "words": len(tok[s].split()),
                         "first_line": tok[s].splitlines()[1]} for s in sizes}
    info["wt103-raw"] = {s: {"articles": sum(1 for line in raw[s].splitlines() if re.match(r"^ = [^=].* = $", line)),
                             "chars": len(raw[s])} for s in sizes}


def build_hutter(root: Path, words: Words, info: dict) -> None:
    text8 = text8_chunk(words) + b" the quick brown fox jumps over the lazy dog"
    for name, url, chunk in (("enwik8", ENWIK8_URLS[0], fill_bytes(enwik8_chunk(words), REAL_VOCAB["enwik8"])),
                             ("text8", TEXT8_URLS[0], text8)):
        data = tile(chunk, HUTTER_SIZE)
        write_zip(file_of(root, url), {name: data})
        info[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "distinct_bytes": len(set(chunk)), "newlines": data.count(b"\n")}


def build_lm1b(root: Path, words: Words, info: dict) -> None:
    def shard(n: int) -> str:
        return "".join(" ".join(words.sentence(4, 25)) + " .\n" for _ in range(n))

    members = {f"{LM1B_ROOT}/README": b"One Billion Word benchmark (miniature mirror copy)\n"}
    counts: dict[str, int] = {}
    for i in LM1B_TRAIN_SHARDS:
        members[f"{LM1B_TRAIN_DIR}/news.en-{i:05d}-of-00100"] = shard(8).encode()
    for i in LM1B_HELDOUT_SHARDS:
        members[f"{LM1B_HELDOUT_DIR}/news.en.heldout-{i:05d}-of-00050"] = shard(60 if i < 2 else 3).encode()
    for data in members.values():
        for w in data.decode().split():
            counts[w] = counts.get(w, 0) + 1
    write_tar_gz(file_of(root, LM1B_URLS[0]), members)
    # the benchmark's file: `word count` per line, <S>, </S>, <UNK> first, then by decreasing count; the rarest
    # words are left out so that <UNK> occurs
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = [(w, c) for w, c in ranked if c > 2]
    lines = ["<S> 0", f"</S> {sum(1 for d in members.values() for _ in d.splitlines())}", "<UNK> 0"]
    lines += [f"{w} {c}" for w, c in kept]
    lines += [f"{w} 1" for w in lexicon(REAL_VOCAB["lm1b"] - len(lines), set(counts))]  # the real size
    path = file_of(root, LM1B_VOCAB_URLS[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    test = members[f"{LM1B_HELDOUT_DIR}/news.en.heldout-00000-of-00050"].decode()
    valid = members[f"{LM1B_HELDOUT_DIR}/news.en.heldout-00001-of-00050"].decode()
    info["lm1b"] = {"vocab_lines": len(lines), "train_shards": len(LM1B_TRAIN_SHARDS),
                    "test_sentences": len(test.splitlines()), "test_words": len(test.split()),
                    "valid_sentences": len(valid.splitlines()), "valid_words": len(valid.split()),
                    "train_words": sum(len(members[f"{LM1B_TRAIN_DIR}/news.en-{i:05d}-of-00100"].split())
                                       for i in LM1B_TRAIN_SHARDS),
                    "train_sentences": 8 * len(LM1B_TRAIN_SHARDS)}


def build_ptb(root: Path, words: Words, info: dict) -> None:
    vocab = set(words.words[:300])
    text = {}
    for split, n in (("train", 1500), ("valid", 200), ("test", 200)):
        lines = []
        for _ in range(n):
            s = [w if w in vocab else "<unk>" for w in words.sentence(4, 30)]
            s = [("N" if words.rng.random() < 0.05 else w) for w in s]
            lines.append(" " + " ".join(s) + " \n")
        if split == "train":  # the real vocabulary: 9,999 training types (<unk> among them) plus <eos>
            seen = {w for line in lines for w in line.split()}
            extra = lexicon(REAL_VOCAB["ptb"] - 1 - len(seen), seen)
            lines += [" " + " ".join(extra[i:i + 20]) + " \n" for i in range(0, len(extra), 20)]
        text[split] = "".join(lines)
    members = {f"./simple-examples/data/ptb.{s}.txt": t.encode() for s, t in text.items()}
    members["./simple-examples/data/ptb.char.train.txt"] = " ".join(text["train"][:2000].replace(" ", "_")).encode()
    members["./simple-examples/README"] = b"simple-examples (miniature mirror copy)\n"
    write_tar_gz(file_of(root, PTB_URLS[0]), members)
    info["ptb"] = {s: {"lines": len(t.splitlines()), "words": len(t.split())} for s, t in text.items()}


def build_cmu_dog(root: Path, words: Words, info: dict) -> None:
    top = f"datasets-CMU_DoG-{CMU_DOG_COMMIT}"
    members: dict[str, bytes] = {f"{top}/": b"", f"{top}/README.md": b"# CMU Document Grounded Conversations\n"}
    n_docs = 4
    for d in range(n_docs):
        def para(n):
            return " ".join(" ".join(words.sentence()) + "." for _ in range(n))
        doc = {"0": {"cast": [" ".join(words.sentence(2, 2)).title() for _ in range(3)],
                     "critical_response": [para(2), para(2)], "director": " ".join(words.sentence(2, 2)).title(),
                     "genre": "Drama", "introduction": para(6), "movieName": f"Movie {d}",
                     "rating": ["82%", "7.1/10"], "year": str(1990 + d)},
               "1": para(8), "2": para(8), "3": para(8), "wikiDocumentIdx": d}
        members[f"{top}/WikiData/Movie_{d}.json"] = json.dumps(doc, indent=1).encode()
    convs = {"train": 6, "valid": 2, "test": 2}
    k = 0
    info["cmu_dog"] = {}
    for split, n in convs.items():
        utts = 0
        for _ in range(n):
            history = []
            for t in range(24):
                uid = "user1" if t % 2 == 0 else "user2"
                if t == 5:  # a second message of the same user: merged into one utterance
                    uid = "user1"
                history.append({"docIdx": min(3, t // 6), "text": " ".join(words.sentence(4, 20)),
                                "uid": uid, "utcTimestamp": "2018-03-01T10:00:00.000Z"})
            conv = {"date": "2018-03-01T10:00:00.000Z", "history": history, "rating": 2, "status": 1,
                    "uid1LogInTime": "", "uid2LogInTime": "", "user1_id": f"USR{k}", "user2_id": f"USR{k + 1}",
                    "whoSawDoc": ["user1", "user2"], "wikiDocumentIdx": k % n_docs}
            name = hashlib.sha1(f"{split}{k}".encode()).hexdigest()
            members[f"{top}/Conversations/{split}/{name}.json"] = json.dumps(conv).encode()
            utts += 1 + sum(a["uid"] != b["uid"] for a, b in pairwise(history))  # a user's run is one
            k += 1
        info["cmu_dog"][split] = {"conversations": n, "utterances": utts}
    write_zip(file_of(root, CMU_DOG_URL), members)
