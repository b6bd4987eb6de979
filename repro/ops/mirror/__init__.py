"""A local mirror of every paper-profile source, in the real formats, served from 127.0.0.1: the rehearsal's network.

`build_mirror(root)` writes miniature copies of every archive the paper profile downloads, laid out as the real
ones (the same archive names, member paths, file formats and encodings; only the contents are small and made up):

| source | real URL (rewritten to the mirror) | what the code reads |
|---|---|---|
| WikiText-103 | wikitext.smerity.com/wikitext-103-v1.zip, …-raw-v1.zip | `wikitext-103/wiki.*.tokens`, `wikitext-103-raw/wiki.*.raw` |
| enwik8, text8 | mattmahoney.net/dc/{enwik8,text8}.zip | member `enwik8` / `text8`, 10^8 bytes each (as the real ones) |
| One Billion Word | statmt.org/lm-benchmark/…-r13output.tar.gz, github.com/rafaljozefowicz/lm/raw/master/1b_word_vocab.txt | 99 training shards, 50 held-out shards; `word count` lines |
| PTB | fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz | `./simple-examples/data/ptb.*.txt` |
| CMU-DoG | github.com/festvox/datasets-CMU_DoG/archive/<commit>.zip | `datasets-CMU_DoG-<commit>/{Conversations,WikiData}` |
| LRA | storage.googleapis.com/long-range-arena/lra_release.gz | `lra_release/{listops-1000,tsv_data,pathfinder32}` |
| IMDb, CIFAR-10 | ai.stanford.edu/…/aclImdb_v1.tar.gz, cs.toronto.edu/…/cifar-10-python.tar.gz | reviews; python pickle batches |
| PG-19 | Hugging Face dataset `emozilla/pg19` | parquet shards + a dataset card with `configs` |
| GPT-2 | Hugging Face model `gpt2` | `save_pretrained` checkpoint, a 50,257-symbol byte-level BPE |

Layout of `root`: `files/<host>/<path>` (a source URL's host and path) with `files/SHA256SUMS`, and `hub/` in the
Hugging Face cache layout (`models--gpt2/`, `datasets--emozilla--pg19/`: `refs/main` + `snapshots/<rev>/…`).

`serve(root)` serves it on 127.0.0.1 (an ephemeral port; plain files with HTTP Range, and the part of the Hub's
HTTP API that `huggingface_hub`, `transformers` and `datasets` use: `resolve`, `api/<kind>/<repo>[/revision|tree|
paths-info]`); it stops when its context exits, after `idle_timeout` seconds without a request, or after
`max_seconds`. `environment(url, cache)` is the one setting that points every download at it:
`REPRO_MIRROR` (read by `repro.ops.download.download`, which rewrites each real URL to `<mirror>/<host>/<path>`
and verifies against the mirror's `SHA256SUMS` instead of the real checksums) and `HF_ENDPOINT` (the Hub
libraries), with fresh Hub caches, so that the real download code runs end to end.

The GPT-2 checkpoint has the real shapes by default (12 layers, 768 wide, 1,024 positions, random weights:
the paper configs build the model from these shapes and copy the checkpoint in), or small ones
(`gpt2_size="small"`, for tests). The tokenizer is a real byte-level BPE with GPT-2's 50,257 symbols
(`<|endoftext|>` = 50256): merges trained on the mirror's text, then completed with further valid merges.

Content is deterministic for a given `seed`; `manifest.json` records what each source holds (counts the tests
compare the parsed streams with).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import pickle
import random
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HUTTER_SIZE = 100_000_000
LM1B_TRAIN_SHARDS = range(1, 100)  # news.en-00001-of-00100 … 00099 (shard 00000 became the held-out set)
LM1B_HELDOUT_SHARDS = range(50)
GPT2_REPO, PG19_REPO = "gpt2", "emozilla/pg19"
GPT2_VOCAB = 50257
GPT2_SHAPES = {"paper": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
               "small": {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 1024}}
FORMAT_VERSION = 2  # 2: the real vocabulary sizes (REAL_VOCAB)
_STAMP = "manifest.json"


# ------------------------------------------------------------------------------------------------- text
class _Words:
    """Deterministic pseudo-English: made-up words drawn with Zipf-like frequencies, so that counts and rare
    words (→ <unk>) behave like a real corpus."""

    def __init__(self, seed: int, n: int = 1500):
        rng = random.Random(seed)
        sy = ["ka", "lo", "mi", "ren", "ta", "vo", "shi", "an", "el", "or", "bu", "de", "fi", "gra", "ho", "ju",
              "ne", "pa", "qui", "su", "tor", "ul", "wen", "ya", "zo", "the", "ing", "ly", "ed", "st"]
        words: list[str] = []
        seen: set[str] = set()
        for w in ("the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "as", "with", "by", "he", "it"):
            words.append(w)
            seen.add(w)
        while len(words) < n:
            w = "".join(rng.choice(sy) for _ in range(rng.randint(1, 3)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.words = words
        self.cum = []
        total = 0.0
        for r in range(n):
            total += 1.0 / (r + 1)
            self.cum.append(total)
        self.rng = random.Random(seed + 1)

    def sentence(self, lo: int = 5, hi: int = 18) -> list[str]:
        n = self.rng.randint(lo, hi)
        return self.rng.choices(self.words, cum_weights=self.cum, k=n)


def _wikitext(words: _Words, n_articles: int, paragraphs: int) -> list[str]:
    """The raw lines of WikiText-style articles: ` = Title = `, ` = = Section = = `, blank lines ` `, paragraphs of
    tokenized sentences (` @-@ `, ` @,@ `, ` , `, ` . `)."""
    lines: list[str] = [" \n"]
    for a in range(n_articles):
        title = " ".join(words.sentence(1, 3)).title()
        lines += [f" = {title} = \n", " \n"]
        for p in range(paragraphs):
            if p and p % 3 == 0:
                lines += [f" = = {' '.join(words.sentence(1, 2)).title()} = = \n", " \n"]
            sents = []
            for _ in range(words.rng.randint(3, 7)):
                s = words.sentence()
                if words.rng.random() < 0.2:
                    s.insert(len(s) // 2, "@-@")
                if words.rng.random() < 0.1:
                    s += ["1", "@,@", "200"]
                if words.rng.random() < 0.3:
                    s.insert(2, ",")
                s[0] = s[0].capitalize()
                sents.append(" ".join(s) + " .")
            lines += [" " + " ".join(sents) + " \n", " \n"]
    return lines


def _unk(lines: list[str], counts: dict[str, int]) -> str:
    """The tokens file: words seen fewer than twice in the training split are `<unk>` (as in WikiText-103, whose
    validation and test words are all in the training vocabulary)."""
    return "".join(" ".join(w if not w or counts.get(w, 0) > 1 else "<unk>" for w in line[:-1].split(" ")) + "\n"
                   for line in lines)


# The real vocabularies, so that every paper model built on the mirror has its paper size (embedding and softmax
# grow with the vocabulary): WikiText-103 267,735 (training types, <unk> among them, plus <eos>), PTB 10,000
# (9,999 words plus <eos>), One Billion Word 793,471 lines of 1b_word_vocab.txt, enwik8 205 byte values, text8 27.
REAL_VOCAB = {"wt103": 267_735, "ptb": 10_000, "lm1b": 793_471, "enwik8": 205, "text8": 27}


def _lexicon(n: int, taken: set[str]) -> list[str]:
    """`n` distinct made-up lower-case words outside `taken` ("qz" + a base-26 number: no generated word starts so)."""
    out, i = [], 0
    while len(out) < n:
        k, w = i, ""
        while True:
            w = chr(97 + k % 26) + w
            k //= 26
            if not k:
                break
        i += 1
        if "qz" + w not in taken:
            out.append("qz" + w)
    return out


def _fill_bytes(chunk: bytes, target: int) -> bytes:
    """`chunk` plus a line of valid UTF-8 characters that brings its distinct byte values to exactly `target`
    (enwik8 is UTF-8: ASCII, continuation bytes 0x80-0xBF and lead bytes)."""
    have = set(chunk)
    extra = []
    for cp in [9, *range(32, 127), *range(0x80, 0xD800), *range(0xE000, 0x110000)]:
        if len(have) == target:
            break
        b = chr(cp).encode("utf-8")
        if set(b) - have and len(have | set(b)) <= target:
            have |= set(b)
            extra.append(chr(cp))
    if len(have) != target:
        raise AssertionError(f"could not reach {target} distinct bytes (got {len(have)})")
    return chunk + ("\n" + "".join(extra) + "\n").encode("utf-8")


def _tile(chunk: bytes, size: int) -> bytes:
    return (chunk * (size // len(chunk) + 1))[:size]


def _enwik8_chunk(words: _Words) -> bytes:
    """≈ 20 KB of MediaWiki XML with UTF-8 characters beyond ASCII (tiled to 10^8 bytes: deflate's 32 KB window
    then compresses the archive to a few hundred KB)."""
    out = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/" version="0.3" xml:lang="en">\n']
    extra = ["café", "Zürich", "naïve", "Ελλάδα", "東京", "–", "€"]
    while sum(map(len, out)) < 20_000:
        title = " ".join(words.sentence(1, 3)).title()
        body = " ".join(" ".join(words.sentence()) + "." for _ in range(6))
        body = body.replace(" the ", f" [[{words.rng.choice(extra)}]] ", 1)
        out.append(f"  <page>\n    <title>{title}</title>\n    <id>{len(out)}</id>\n    <revision>\n"
                   f"      <text xml:space=\"preserve\">'''{title}''' {body}\n&lt;ref&gt;{{{{cite}}}}&lt;/ref&gt;"
                   f"</text>\n    </revision>\n  </page>\n")
    return "".join(out).encode("utf-8")


def _text8_chunk(words: _Words) -> bytes:
    text = " " + " ".join(" ".join(words.sentence()) for _ in range(400))
    return re.sub(r"[^a-z ]", "", text.lower()).encode("ascii")


# ------------------------------------------------------------------------------------------- archives
def _zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2016, 9, 26, 0, 0, 0)), data,
                        compress_type=zipfile.ZIP_DEFLATED)


def _tar_gz(path: Path, members: dict[str, bytes], *, dirs: bool = True) -> None:
    """A gzipped tar with the members (and their folders first, as `tar czf` of a tree writes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        written: set[str] = set()
        for name, data in members.items():
            if dirs:
                parts = name.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in written and d not in (".", ""):
                        written.add(d)
                        info = tarfile.TarInfo(d)
                        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_300_000_000
                        tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1_300_000_000
            tar.addfile(info, io.BytesIO(data))


def _files(root: Path, url: str) -> Path:
    """Where the mirror keeps the file of a real URL: files/<host>/<path>."""
    p = urllib.parse.urlsplit(url)
    return root / "files" / p.netloc / p.path.lstrip("/")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------- sources
def _build_wikitext(root: Path, words: _Words, sizes: dict[str, int], info: dict) -> None:
    from repro.data.sources import WIKITEXT103_URLS
    from repro.text.streams import WT103_RAW_URLS

    lines = {split: _wikitext(words, n, 9) for split, n in sizes.items()}
    counts: dict[str, int] = {}
    for w in "".join(lines["train"]).split():
        counts[w] = counts.get(w, 0) + 1
    # the real number of types: one more article of made-up words, each twice (words seen once become <unk>)
    types = {w for w, c in counts.items() if c > 1} | {"<unk>"}
    extra = _lexicon(REAL_VOCAB["wt103"] - 1 - len(types), set(counts))
    lines["train"] += [" = Lexicon = \n", " \n"] + [" " + " ".join(extra[i:i + 50] * 2) + " \n"
                                                    for i in range(0, len(extra), 50)]
    for w in extra:
        counts[w] = 2
    raw = {s: "".join(v) for s, v in lines.items()}
    tok = {s: _unk(v, counts) for s, v in lines.items()}
    _zip(_files(root, WIKITEXT103_URLS[0]), {"wikitext-103/": b"", **{
        f"wikitext-103/wiki.{s}.tokens": tok[s].encode() for s in sizes}})
    _zip(_files(root, WT103_RAW_URLS[0]), {"wikitext-103-raw/": b"", **{
        f"wikitext-103-raw/wiki.{s}.raw": raw[s].encode() for s in sizes}})
    info["wt103"] = {s: {"lines": len(tok[s].splitlines()), "words": len(tok[s].split()),
                         "first_line": tok[s].splitlines()[1]} for s in sizes}
    info["wt103-raw"] = {s: {"articles": sum(1 for line in raw[s].splitlines() if re.match(r"^ = [^=].* = $", line)),
                             "chars": len(raw[s])} for s in sizes}


def _build_hutter(root: Path, words: _Words, info: dict) -> None:
    from repro.data.sources import ENWIK8_URLS, TEXT8_URLS

    text8 = _text8_chunk(words) + b" the quick brown fox jumps over the lazy dog"
    for name, url, chunk in (("enwik8", ENWIK8_URLS[0], _fill_bytes(_enwik8_chunk(words), REAL_VOCAB["enwik8"])),
                             ("text8", TEXT8_URLS[0], text8)):
        data = _tile(chunk, HUTTER_SIZE)
        _zip(_files(root, url), {name: data})
        info[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "distinct_bytes": len(set(chunk)), "newlines": data.count(b"\n")}


def _build_lm1b(root: Path, words: _Words, info: dict) -> None:
    from repro.data.sources import LM1B_HELDOUT_DIR, LM1B_ROOT, LM1B_TRAIN_DIR, LM1B_URLS, LM1B_VOCAB_URLS

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
    _tar_gz(_files(root, LM1B_URLS[0]), members)
    # the benchmark's file: `word count` per line, <S>, </S>, <UNK> first, then by decreasing count; the rarest
    # words are left out so that <UNK> occurs
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = [(w, c) for w, c in ranked if c > 2]
    lines = ["<S> 0", f"</S> {sum(1 for d in members.values() for _ in d.splitlines())}", "<UNK> 0"]
    lines += [f"{w} {c}" for w, c in kept]
    lines += [f"{w} 1" for w in _lexicon(REAL_VOCAB["lm1b"] - len(lines), set(counts))]  # the real size
    path = _files(root, LM1B_VOCAB_URLS[0])
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


def _build_ptb(root: Path, words: _Words, info: dict) -> None:
    from repro.data.sources import PTB_URLS

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
            extra = _lexicon(REAL_VOCAB["ptb"] - 1 - len(seen), seen)
            lines += [" " + " ".join(extra[i:i + 20]) + " \n" for i in range(0, len(extra), 20)]
        text[split] = "".join(lines)
    members = {f"./simple-examples/data/ptb.{s}.txt": t.encode() for s, t in text.items()}
    members["./simple-examples/data/ptb.char.train.txt"] = " ".join(text["train"][:2000].replace(" ", "_")).encode()
    members["./simple-examples/README"] = b"simple-examples (miniature mirror copy)\n"
    _tar_gz(_files(root, PTB_URLS[0]), members)
    info["ptb"] = {s: {"lines": len(t.splitlines()), "words": len(t.split())} for s, t in text.items()}


def _build_cmu_dog(root: Path, words: _Words, info: dict) -> None:
    from repro.text.cmudog import CMU_DOG_COMMIT, CMU_DOG_URL

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
            utts += 1 + sum(a["uid"] != b["uid"] for a, b in zip(history, history[1:]))  # a user's run is one
            k += 1
        info["cmu_dog"][split] = {"conversations": n, "utterances": utts}
    _zip(_files(root, CMU_DOG_URL), members)


def _png(pixels) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _build_lra(root: Path, words: _Words, info: dict) -> None:
    import numpy as np

    from repro.data import lra

    rng = np.random.default_rng(0)
    members: dict[str, bytes] = {}
    spec = lra.ListOpsSpec(n_train=40, n_valid=8, n_test=8, min_length=20, max_length=200, seed=7)
    rows = lra.generate_listops_examples(spec)
    for split, name in lra.LISTOPS_FILES.items():
        members[f"lra_release/listops-1000/{name}"] = ("Source\tTarget\n" + "".join(
            f"{s}\t{y}\n" for s, y in rows[split])).encode()
    aan = {}
    for split in ("train", "eval", "test"):
        lines = []
        for i in range(24 if split == "train" else 8):
            a, b = (" ".join(" ".join(words.sentence()) for _ in range(20)) for _ in range(2))
            lines.append(f"{i % 2}.0\tacl_{split}_{i}a\tacl_{split}_{i}b\t{a}\t{b}\n")
        aan[split] = lines
        members[f"lra_release/tsv_data/new_aan_pairs.{split}.tsv"] = "".join(lines).encode()
    pf = {}
    for diff in ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14"):
        meta = []
        for i in range(20):
            label = i % 2
            img = (rng.random((32, 32)) < 0.1).astype(np.uint8) * 255
            img[16, 4:28] = 255 if label else 0
            members[f"lra_release/pathfinder32/{diff}/imgs/0/sample_{i}.png"] = _png(img)
            meta.append(f"imgs/0 sample_{i}.png 0 {label} 1.8 6 2 5 2 0\n")
        members[f"lra_release/pathfinder32/{diff}/imgs/0/sample_20.png"] = b""  # the release has a few empty PNGs
        meta.append("imgs/0 sample_20.png 0 1 1.8 6 2 5 2 0\n")
        members[f"lra_release/pathfinder32/{diff}/metadata/0.npy"] = "".join(meta).encode()
        pf[diff] = 20
    _tar_gz(_files(root, lra.LRA_RELEASE_URL), members)

    imdb: dict[str, bytes] = {"aclImdb/README": b"Large Movie Review Dataset v1.0 (miniature mirror copy)\n",
                              "aclImdb/imdb.vocab": "\n".join(words.words[:200]).encode()}
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            for i in range(10):
                text = " ".join(" ".join(words.sentence()) + "." for _ in range(words.rng.randint(3, 12)))
                imdb[f"aclImdb/{split}/{label}/{i}_{7 if label == 'pos' else 2}.txt"] = (text + "<br /><br />").encode()
        imdb[f"aclImdb/{split}/urls_pos.txt"] = b"http://www.imdb.com/title/tt0000001/usercomments\n"
    imdb["aclImdb/train/unsup/0_0.txt"] = b"an unlabelled review"
    _tar_gz(_files(root, lra.IMDB_URL), imdb)

    # CIFAR-10: the train/valid split of the Image task keeps the last 5,000 training images for validation, so
    # the five batches hold 1,100 images each (5,500; the real ones 10,000). Smooth images compress well.
    cifar: dict[str, bytes] = {}
    labels_all = []

    def batch(name: str, n: int, seed: int) -> bytes:
        r = np.random.default_rng(seed)
        labels = r.integers(0, 10, n)
        base = np.arange(1024) % 32
        x = np.concatenate([np.tile(base * (c + 1), (n, 1)) for c in range(3)], axis=1)
        x = ((x + labels[:, None] * 20) % 256).astype(np.uint8)
        labels_all.append(labels)
        return pickle.dumps({b"batch_label": name.encode(), b"labels": [int(v) for v in labels], b"data": x,
                             b"filenames": [f"img_{i}.png".encode() for i in range(n)]}, protocol=2)

    for i in range(1, 6):
        cifar[f"cifar-10-batches-py/data_batch_{i}"] = batch(f"training batch {i} of 5", 1100, i)
    cifar["cifar-10-batches-py/test_batch"] = batch("testing batch 1 of 1", 500, 9)
    cifar["cifar-10-batches-py/batches.meta"] = pickle.dumps(
        {b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship",
                          b"truck"], b"num_cases_per_batch": 1100, b"num_vis": 3072}, protocol=2)
    cifar["cifar-10-batches-py/readme.html"] = b"<html>CIFAR-10 (miniature mirror copy)</html>\n"
    _tar_gz(_files(root, lra.CIFAR10_URL), cifar)
    info["lra"] = {"listops": {s: len(r) for s, r in rows.items()},
                   "listops_labels": {s: [y for _, y in r] for s, r in rows.items()},
                   "aan": {s: len(v) for s, v in aan.items()}, "pathfinder": pf,
                   "imdb": {"train": 20, "test": 20}, "cifar": {"train": 5500, "test": 500}}


# ----------------------------------------------------------------------------------------------- the Hub
def _hub_repo(root: Path, kind: str, repo: str, files: dict[str, Path | bytes]) -> str:
    """A repository in the Hugging Face cache layout: `<kind>s--<org>--<name>/snapshots/<rev>/…` + `refs/main`."""
    folder = root / "hub" / f"{kind}s--{repo.replace('/', '--')}"
    h = hashlib.sha1()
    blobs = {}
    for name in sorted(files):
        data = files[name] if isinstance(files[name], bytes) else Path(files[name]).read_bytes()
        blobs[name] = data
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    rev = h.hexdigest()
    shutil.rmtree(folder, ignore_errors=True)
    for name, data in blobs.items():
        path = folder / "snapshots" / rev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(rev)
    return rev


def gpt2_tokenizer(texts: list[str]):
    """A byte-level BPE with GPT-2's layout and size: 256 byte symbols, merges trained on `texts`, further valid
    merges (a trained symbol + a byte symbol) up to 50,256 symbols, then `<|endoftext|>` = 50256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trained = sorted(vocab, key=vocab.get)
    for a in trained:
        for b in alphabet:
            if len(vocab) >= GPT2_VOCAB - 1:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
    out = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    out.post_processor = processors.ByteLevel(trim_offsets=False)
    out.decoder = decoders.ByteLevel()
    out.add_special_tokens(["<|endoftext|>"])
    assert out.get_vocab_size(with_added_tokens=True) == GPT2_VOCAB
    return out


def _build_gpt2(root: Path, texts: list[str], size: str, info: dict) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tmp = root / "tmp-gpt2"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = GPT2TokenizerFast(tokenizer_object=gpt2_tokenizer(texts), bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.model_max_length = 1024
    tokenizer.save_pretrained(tmp)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=GPT2_VOCAB, **GPT2_SHAPES[size]))
    model.save_pretrained(tmp)
    files = {p.relative_to(tmp).as_posix(): p for p in tmp.rglob("*") if p.is_file()}
    rev = _hub_repo(root, "model", GPT2_REPO, files)
    shutil.rmtree(tmp)
    info["gpt2"] = {"revision": rev, "size": size, "parameters": sum(p.numel() for p in model.parameters()),
                    "files": sorted(files)}


def _build_pg19(root: Path, words: _Words, info: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    books = {"train": 4, "validation": 2, "test": 2}
    files: dict[str, bytes] = {}
    info["pg19"] = {}
    n = 0
    for split, count in books.items():
        rows = {"short_book_title": [], "publication_date": [], "url": [], "text": []}
        for _ in range(count):
            title = " ".join(words.sentence(2, 4)).title()
            paras = ["\n".join(" ".join(words.sentence(6, 14)).capitalize() + "." for _ in range(4))
                     for _ in range(60)]
            rows["short_book_title"].append(title)
            rows["publication_date"].append(1850 + n)
            rows["url"].append(f"http://www.gutenberg.org/ebooks/{10000 + n}")
            rows["text"].append(f"{title.upper()}\n\n\n" + "\n\n".join(paras) + "\n")
            n += 1
        table = pa.table({"short_book_title": pa.array(rows["short_book_title"], pa.string()),
                          "publication_date": pa.array(rows["publication_date"], pa.int32()),
                          "url": pa.array(rows["url"], pa.string()), "text": pa.array(rows["text"], pa.string())})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        files[f"data/{split}-00000-of-00001.parquet"] = buf.getvalue()
        info["pg19"][split] = {"books": count, "first_title": rows["short_book_title"][0],
                               "chars": [len(t) for t in rows["text"]]}
    card = ["---", "dataset_info:", "  features:"]
    card += [f"  - name: {c}\n    dtype: {t}" for c, t in (("short_book_title", "string"), ("publication_date", "int32"),
                                                           ("url", "string"), ("text", "string"))]
    sizes = {s: len(files[f"data/{s}-00000-of-00001.parquet"]) for s in books}
    card += ["  splits:"] + [f"  - name: {s}\n    num_bytes: {sizes[s]}\n    num_examples: {c}" for s, c in books.items()]
    card += ["configs:", "- config_name: default", "  data_files:"]
    card += [f"  - split: {s}\n    path: data/{s}-*" for s in books]
    card += ["---", "", "# PG-19 (miniature mirror copy of emozilla/pg19)", ""]
    files["README.md"] = "\n".join(card).encode()
    info["pg19"]["revision"] = _hub_repo(root, "dataset", PG19_REPO, files)


def build_mirror(root: str | os.PathLike, *, gpt2_size: str = "paper", seed: int = 0,
                 force: bool = False) -> Path:
    """Write every source into `root` (see the module docstring) and return it; a finished mirror with the same
    settings is reused."""
    root = Path(root)
    settings = {"format": FORMAT_VERSION, "gpt2_size": gpt2_size, "seed": seed}
    if gpt2_size not in GPT2_SHAPES:
        raise ValueError(f"gpt2_size is one of {sorted(GPT2_SHAPES)}, got {gpt2_size!r}")
    stamp = root / _STAMP
    if not force and stamp.exists() and json.loads(stamp.read_text()).get("settings") == settings:
        return root
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root / "files", ignore_errors=True)
    shutil.rmtree(root / "hub", ignore_errors=True)
    words = _Words(seed)
    info: dict = {}
    _build_wikitext(root, words, {"train": 60, "valid": 6, "test": 6}, info)
    _build_hutter(root, words, info)
    _build_lm1b(root, words, info)
    _build_ptb(root, words, info)
    _build_cmu_dog(root, words, info)
    _build_lra(root, words, info)
    _build_pg19(root, words, info)
    texts = [" ".join(words.sentence()) + "\n" for _ in range(3000)]
    _build_gpt2(root, texts, gpt2_size, info)
    files = sorted(p for p in (root / "files").rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    (root / "files" / "SHA256SUMS").write_text(
        "".join(f"{_sha256(p)}  {p.relative_to(root / 'files').as_posix()}\n" for p in files))
    stamp.write_text(json.dumps({"settings": settings, "sources": info}, indent=1))
    return root


# ------------------------------------------------------------------------------------------------ server
class _Hub:
    """The Hub repositories of a mirror, read from its `hub/` folder (Hugging Face cache layout)."""

    def __init__(self, root: Path):
        self.root = root / "hub"

    def snapshot(self, kind: str, repo: str, rev: str) -> tuple[str, Path] | None:
        folder = self.root / f"{kind}s--{repo.replace('/', '--')}"
        rev = urllib.parse.unquote(rev)
        ref = folder / "refs" / rev
        commit = ref.read_text().strip() if ref.is_file() else rev
        snap = folder / "snapshots" / commit
        return (commit, snap) if re.fullmatch(r"[0-9a-f]{40}", commit) and snap.is_dir() else None

    @staticmethod
    def entry(snap: Path, path: Path) -> dict:
        rel = path.relative_to(snap).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
        sha = _sha256(path)
        return {"type": "file", "oid": hashlib.sha1(path.read_bytes()).hexdigest(), "size": path.stat().st_size,
                "path": rel, "lfs": {"oid": sha, "size": path.stat().st_size, "pointerSize": 130}}


def _handler(root: Path, touch):
    hub = _Hub(root)
    files_root = (root / "files").resolve()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "repro-mirror/1"

        def log_message(self, fmt, *args):  # quiet; REPRO_MIRROR_LOG=1 shows every request
            if os.environ.get("REPRO_MIRROR_LOG"):
                sys.stderr.write("mirror: " + fmt % args + "\n")

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None, *, head: bool = False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, obj, *, head=False):
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head=head)

        def _not_found(self, what: str, *, head=False, hub: bool = False):
            headers = {"Content-Type": "text/plain"}
            if hub:  # huggingface_hub tells a missing file from a missing repository by this header
                headers["X-Error-Code"] = "EntryNotFound"
            self._send(404, f"not in the mirror: {what}\n".encode(), headers, head=head)

        def _file(self, path: Path, extra: dict, *, head: bool):
            size = path.stat().st_size
            start, end, code = 0, size - 1, 200
            rng = self.headers.get("Range")
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **extra}
            if rng:
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
                if not m or (not m[1] and not m[2]):
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head=head)
                if m[1]:
                    start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
                else:
                    start, end = max(0, size - int(m[2])), size - 1
                if start >= size or start > end:
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head=head)
                code = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            if head:
                return
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    block = f.read(min(1 << 20, left))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)

        def _route(self, *, head: bool):
            touch()
            url = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(url.path)
            # plain files: /<host>/<path>
            local = (files_root / path.lstrip("/")).resolve()
            if local.is_file() and local.is_relative_to(files_root):
                return self._file(local, {}, head=head)
            # the Hub: /api/{models,datasets}/<repo>[/revision/<rev> | /tree/<rev>[/<path>]]
            m = re.fullmatch(r"/api/(models|datasets)/(.+?)(?:/(revision|tree)/([^/]+)(/.*)?)?/?", path)
            if m and m[2].count("/") <= 1:
                kind = m[1][:-1]
                found = hub.snapshot(kind, m[2], m[4] or "main")
                if found is None:
                    return self._send(404, b'{"error": "Repository not found"}',
                                      {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head=head)
                commit, snap = found
                if m[3] == "tree":
                    base = snap / (m[5] or "/").lstrip("/")
                    if not base.is_dir():
                        return self._not_found(path, head=head, hub=True)
                    recursive = urllib.parse.parse_qs(url.query).get("recursive", ["false"])[0] in ("true", "1", "True")
                    items = sorted(base.rglob("*") if recursive else base.iterdir())
                    return self._json([hub.entry(snap, p) for p in items], head=head)
                siblings = [{"rfilename": p.relative_to(snap).as_posix()} for p in sorted(snap.rglob("*")) if p.is_file()]
                return self._json({"id": m[2], "modelId": m[2], "sha": commit, "private": False, "disabled": False,
                                   "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                                   "lastModified": "2024-01-01T00:00:00.000Z", "cardData": {}}, head=head)
            # /[datasets/]<repo>/resolve/<rev>/<file>
            m = re.fullmatch(r"/(datasets/)?(.+?)/resolve/([^/]+)/(.+)", path)
            if m:
                kind = "dataset" if m[1] else "model"
                found = hub.snapshot(kind, m[2], m[3])
                if found is None:
                    return self._send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, head=head)
                commit, snap = found
                target = (snap / m[4]).resolve()
                if not target.is_file() or not target.is_relative_to(snap.resolve()):
                    return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                                "X-Repo-Commit": commit}, head=head)
                return self._file(target, {"X-Repo-Commit": commit, "ETag": f'"{_sha256(target)}"'}, head=head)
            return self._not_found(path, head=head)

        def do_GET(self):
            self._route(head=False)

        def do_HEAD(self):
            self._route(head=True)

        def do_POST(self):
            touch()
            # /api/{models,datasets}/<repo>/paths-info/<rev>: form field `paths` (repeated)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            m = re.fullmatch(r"/api/(models|datasets)/(.+?)/paths-info/([^/]+)", path)
            if not m:
                return self._not_found(path)
            found = hub.snapshot(m[1][:-1], m[2], m[3])
            if found is None:
                return self._send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"})
            _, snap = found
            if "json" in (self.headers.get("Content-Type") or ""):
                paths = json.loads(body or "{}").get("paths", [])
            else:
                paths = urllib.parse.parse_qs(body).get("paths", [])
            paths = [paths] if isinstance(paths, str) else paths
            out = [hub.entry(snap, snap / p) for p in paths if (snap / p).exists()]
            self._json(out)

    return Handler


class MirrorServer:
    """The loopback server of a mirror folder (see `serve`)."""

    def __init__(self, root: Path, *, idle_timeout: float, max_seconds: float, port: int = 0):
        self.root, self.idle_timeout, self.max_seconds = root, idle_timeout, max_seconds
        self._last = time.monotonic()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(root, self._touch))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="repro-mirror")
        self._watch = threading.Thread(target=self._watchdog, daemon=True, name="repro-mirror-watchdog")

    def _touch(self) -> None:
        self._last = time.monotonic()

    def _watchdog(self) -> None:
        start = time.monotonic()
        while not self._stopped.wait(0.5):
            now = time.monotonic()
            if now - self._last > self.idle_timeout or now - start > self.max_seconds:
                self.stop()

    def start(self) -> "MirrorServer":
        self._thread.start()
        self._watch.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    def wait(self) -> None:
        self._stopped.wait()


@contextlib.contextmanager
def serve(root: str | os.PathLike, *, idle_timeout: float = 600, max_seconds: float = 6 * 3600,
          port: int = 0) -> Iterator[MirrorServer]:
    """Serve a built mirror on 127.0.0.1 until the block exits (or `idle_timeout` s without a request, or
    `max_seconds` in all)."""
    root = Path(root)
    if not (root / _STAMP).exists():
        raise ValueError(f"{root} is not a built mirror (no {_STAMP}): run `repro mirror build {root}` first")
    server = MirrorServer(root, idle_timeout=idle_timeout, max_seconds=max_seconds, port=port).start()
    try:
        yield server
    finally:
        server.stop()


def environment(url: str, cache: str | os.PathLike) -> dict[str, str]:
    """The variables that point every download at the mirror `url`: our downloads (`REPRO_MIRROR`), the Hub
    libraries (`HF_ENDPOINT`, with their caches under `cache` so that nothing real is reused or overwritten)."""
    cache = Path(cache)
    return {"REPRO_MIRROR": url, "HF_ENDPOINT": url.rstrip("/"), "HF_HOME": str(cache / "hf"),
            "HF_HUB_CACHE": str(cache / "hf" / "hub"), "HF_DATASETS_CACHE": str(cache / "hf" / "datasets"),
            "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_UPDATE_DOWNLOAD_COUNTS": "0", "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
            "HF_TOKEN": ""}


# ----------------------------------------------------------------------------------------- command line
def add_parser(sub) -> None:
    """The `mirror` subcommand (registered in repro/commands.py)."""
    m = sub.add_parser("mirror", help="build / serve a local mirror of every paper-profile source (rehearsal)")
    m.add_argument("action", choices=["build", "serve", "run"],
                   help="build: write the mirror; serve: serve it and print the settings; run: build if needed, "
                        "serve, run a command with the settings, stop")
    m.add_argument("root", help="the mirror folder (e.g. data/mirror)")
    m.add_argument("--exec", dest="command", help="run: the command line to run against the mirror, quoted "
                                                  "(e.g. --exec 'dvc repro -S profile=paper')")
    m.add_argument("--gpt2-size", choices=sorted(GPT2_SHAPES), default="paper",
                   help="shapes of the random GPT-2 checkpoint (paper: 12 x 768, as the configs build it)")
    m.add_argument("--cache", help="Hub caches of the clients (default: <root>/client-cache)")
    m.add_argument("--idle-timeout", type=float, default=1800, help="serve: stop after this many idle seconds")
    m.add_argument("--port", type=int, default=0)
    m.set_defaults(func=main)


def main(args) -> None:
    root = Path(args.root)
    if args.action in ("build", "run"):
        t0 = time.time()
        build_mirror(root, gpt2_size=args.gpt2_size)
        print(f"mirror built in {root} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    if args.action == "build":
        return
    cache = Path(args.cache) if args.cache else root / "client-cache"
    with serve(root, idle_timeout=args.idle_timeout, port=args.port) as server:
        env = environment(server.url, cache)
        if args.action == "serve":
            print("\n".join(f"export {k}={v!r}" for k, v in env.items()), flush=True)
            print(f"# serving {root} on {server.url} until {args.idle_timeout:.0f} s without a request (Ctrl-C stops)",
                  file=sys.stderr, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                server.wait()
            return
        if not args.command:
            raise ValueError("repro mirror run ROOT --exec 'COMMAND': give the command to run against the mirror")
        rc = subprocess.call(shlex.split(args.command), env=os.environ | env)
    if rc:
        raise SystemExit(rc)
