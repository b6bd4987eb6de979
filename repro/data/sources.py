"""The raw sources of the paper corpora: WikiText-103 (tokenized v1), enwik8 and text8.

Sources (the project's reference notes):
- WikiText-103 v1 (Merity et al., 2016, "Pointer Sentinel Mixture Models"): `wikitext-103-v1.zip`, members
  `wikitext-103/wiki.{train,valid,test}.tokens`. The original link
  https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip answers 403 nowadays; the
  mirror https://wikitext.smerity.com/wikitext-103-v1.zip serves the same archive. When neither answers, the
  Hugging Face dataset `Salesforce/wikitext` (config `wikitext-103-v1`, parquet, one row per line) is read
  through the `datasets` library and written back as the three `.tokens` files.
- enwik8 (the Hutter Prize corpus, the first 10^8 bytes of an English Wikipedia XML dump):
  http://mattmahoney.net/dc/enwik8.zip, member `enwik8`.
- text8 (enwik9 reduced to a-z and space by Matt Mahoney's `wikifil.pl`, first 10^8 characters):
  http://mattmahoney.net/dc/text8.zip, member `text8`.

Each archive lands in `raw_dir` (e.g. `data/raw/<corpus>/`); an archive placed there by hand is used without
network access. Checksums: `PUBLISHED` pins the ones a maintained library publishes for the same file (each with
its repository and path); the files without one (PTB's simple-examples.tgz, the One Billion Word vocabulary) are
trusted on first use. README.md, "Downloaded files and their checksums", has the table.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from repro.data.download import (
    ArchiveError,
    DownloadError,
    Published,
    download,
    extract_member,
    published_kwargs,
    read_member,
    read_sidecar,
    sha256_file,
)
from repro.data.hf_hub import HUB_HELP, hub_offline
from repro.io import atomic_path, atomic_write_json

# Checksums published for the same files by maintained libraries, copied exactly from the file named (read through
# the code index, not computed by us; never fill in a value that was not read from such a record). `download`
# verifies every one given and refuses a file that differs; files not listed here are trusted on first use (the
# checksum of the first download is recorded in `<archive>.sha256` and later uses are verified against it).
PUBLISHED: dict[str, Published] = {
    # the same sha256 appears in other projects' download code (Julia DataDeps registrations, found through the code
    # index); gluon-nlp pins SHA-1 0aec09a7537b58d4bb65362fee27650eeaba625a (its WikiText103 `_archive_file`)
    # and torchtext MD5 9ddaacaf6af0710eda8c456decff7832 (torchtext/experimental/datasets/raw/wikitext103.py)
    "wikitext-103-v1.zip": Published(
        source="huggingface/datasets datasets/wikitext/dataset_infos.json (download_checksums)",
        sha256="242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590", size=190_229_076),
    # the same sha256 appears in other projects' download code (Julia DataDeps `register_enwiki8`, found through the
    # code index)
    "enwik8.zip": Published(
        source="huggingface/datasets datasets/enwik8/dataset_infos.json (download_checksums)",
        sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc", size=36_445_475),
    # gluon-nlp pins SHA-1 6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e for the same URL
    # (gluonnlp/data/word_embedding_training.py, `Text8.archive_file`)
    "text8.zip": Published(
        source="tensorflow/tensorflow tensorflow/examples/tutorials/word2vec/word2vec_basic.py (maybe_download)",
        sha256="a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232", size=31_344_016),
    # the same sha256 appears in other projects' download code (`tf.keras.utils.get_file(..., file_hash=...)` calls,
    # Julia DataDeps registrations, found through the code index)
    "1-billion-word-language-modeling-benchmark-r13output.tar.gz": Published(
        source="tensorflow/datasets tensorflow_datasets/url_checksums/lm1b.txt",
        sha256="01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e", size=1_792_209_805),
    # No published checksum was found for `1b_word_vocab.txt` nor for PTB's `simple-examples.tgz` (tutorials pin
    # only its size): both are trusted on first use.
}

# The working mirror first: the S3 original answers 403 but is kept in case it comes back.
WIKITEXT103_URLS = (
    "https://wikitext.smerity.com/wikitext-103-v1.zip",
    "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
)
ENWIK8_URLS = ("http://mattmahoney.net/dc/enwik8.zip",)
TEXT8_URLS = ("http://mattmahoney.net/dc/text8.zip",)

WIKITEXT103_HF = ("Salesforce/wikitext", "wikitext-103-v1")
SPLITS = ("train", "valid", "test")
HUTTER_SIZE = 100_000_000

# Written beside the extracted .tokens files once all three are complete: where they came from and their sizes,
# so a later call knows they match the archive without extracting again.
_STAMP = ".extracted.json"


def _fetch_archive(raw_dir: Path, name: str, urls: Sequence[str] | None, default: Sequence[str], *,
                   timeout: float) -> Path:
    raw_dir.mkdir(parents=True, exist_ok=True)
    return download(list(urls) if urls is not None else list(default), raw_dir / name,
                    **published_kwargs(PUBLISHED, name), record_sha256=True, timeout=timeout)


def _read_stamp(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _STAMP).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _stamp_matches(stamp: dict | None, files: dict[str, Path], *, source: str | None = None) -> bool:
    if stamp is None or (source is not None and stamp.get("source") != source):
        return False
    sizes = stamp.get("sizes", {})
    return all(p.exists() and p.stat().st_size == sizes.get(s) for s, p in files.items())


def wikitext103_files(raw_dir: str | os.PathLike, *, urls: Sequence[str] | None = None,
                      hf_fallback: bool = True, timeout: float = 60) -> dict[str, Path]:
    """Paths of `wiki.{train,valid,test}.tokens` under `raw_dir/wikitext-103/`, downloaded and extracted if needed.

    Args:
        raw_dir: folder for the archive and the extracted files (created).
        urls: mirrors of `wikitext-103-v1.zip` to try instead of the default ones.
        hf_fallback: when every mirror fails, read Hugging Face `Salesforce/wikitext` with `datasets`.
        timeout: seconds without an answer before a mirror counts as unreachable.
    """
    raw_dir = Path(raw_dir)
    folder = raw_dir / "wikitext-103"
    files = {s: folder / f"wiki.{s}.tokens" for s in SPLITS}
    zip_path = raw_dir / "wikitext-103-v1.zip"
    stamp = _read_stamp(folder)

    # Extracted earlier and the archive since removed (or the files came from Hugging Face): nothing to fetch.
    if not zip_path.exists() and _stamp_matches(stamp, files):
        return files
    try:
        zip_path = _fetch_archive(raw_dir, zip_path.name, urls, WIKITEXT103_URLS, timeout=timeout)
    except DownloadError as err:
        if not hf_fallback:
            raise
        try:
            _wikitext103_from_hf(files)
        except Exception as hf_err:  # no `datasets`, no network to the Hub, or a changed dataset layout
            offline = "OfflineMode" in str(hf_err)  # the hub unreachable (hub_offline) and the cache without it
            raise DownloadError(f"{err}\nThe Hugging Face fallback ({'/'.join(WIKITEXT103_HF)}) failed too: "
                                + (f"the hub is unreachable and its cache lacks the dataset ({HUB_HELP})" if offline
                                   else f"{type(hf_err).__name__}: {hf_err}")) from err
        return files

    # download() verified the archive against its published or recorded checksum and wrote our sha256 to the
    # sidecar (the real file's, or a rehearsal mirror's miniature's: the stamp tells them apart).
    digest = read_sidecar(zip_path) or sha256_file(zip_path)
    if _stamp_matches(stamp, files, source=f"{zip_path.name} sha256:{digest}"):
        return files
    (folder / _STAMP).unlink(missing_ok=True)  # the files are about to change: invalid until all three are done
    for path in files.values():
        extract_member(zip_path, f"wikitext-103/{path.name}", path)
    atomic_write_json(folder / _STAMP, {"source": f"{zip_path.name} sha256:{digest}",
                                         "sizes": {s: p.stat().st_size for s, p in files.items()}})
    return files


def _hf_rows(split: str) -> Iterable[str]:
    hub_offline()  # an unreachable hub: its cache only, at once (not ~30 s of retry messages per request)
    import datasets  # heavy: datasets, only when every zip mirror is unreachable

    ds = datasets.load_dataset(*WIKITEXT103_HF, split=split)
    for batch in ds.iter(batch_size=10_000):
        yield from batch["text"]


def _wikitext103_from_hf(files: dict[str, Path]) -> None:
    folder = next(iter(files.values())).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _STAMP).unlink(missing_ok=True)
    hf_split = {"train": "train", "valid": "validation", "test": "test"}
    for s, path in files.items():
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as out:
            # Each row is one line of the .tokens file with its newline; blank lines are "" (the file has " "),
            # which tokenizes identically.
            for text in _hf_rows(hf_split[s]):
                out.write(text if text.endswith("\n") else text + "\n")
    atomic_write_json(folder / _STAMP, {"source": "hf:" + "/".join(WIKITEXT103_HF),
                                         "sizes": {s: p.stat().st_size for s, p in files.items()}})


def _hutter_bytes(raw_dir: str | os.PathLike, name: str, default_urls: Sequence[str], *,
                  urls: Sequence[str] | None, expected_size: int, timeout: float) -> bytes:
    zip_path = _fetch_archive(Path(raw_dir), f"{name}.zip", urls, default_urls, timeout=timeout)
    data = read_member(zip_path, name)
    if len(data) != expected_size:
        raise ValueError(f"{name} in {zip_path} has {len(data):,} bytes, expected {expected_size:,}: it is not the "
                         f"{name} corpus. Delete {zip_path} and its .sha256 and run again to download it afresh.")
    return data


def enwik8_bytes(raw_dir: str | os.PathLike, *, urls: Sequence[str] | None = None,
                 expected_size: int = HUTTER_SIZE, timeout: float = 60) -> bytes:
    """The 100,000,000 bytes of enwik8 (from `raw_dir/enwik8.zip`, downloaded if missing)."""
    return _hutter_bytes(raw_dir, "enwik8", ENWIK8_URLS, urls=urls, expected_size=expected_size, timeout=timeout)


def text8_bytes(raw_dir: str | os.PathLike, *, urls: Sequence[str] | None = None,
                expected_size: int = HUTTER_SIZE, timeout: float = 60) -> bytes:
    """The 100,000,000 characters of text8, as ASCII bytes (from `raw_dir/text8.zip`, downloaded if missing)."""
    return _hutter_bytes(raw_dir, "text8", TEXT8_URLS, urls=urls, expected_size=expected_size, timeout=timeout)


# ------------------------------------------------------------------------ One Billion Word and Penn Treebank
# One Billion Word (Chelba et al., 2013, arXiv 1312.3005): the r13 output tarball of statmt.org, as the
# Transformer-XL `getdata.sh` fetches it; training data = the 99 shuffled training shards, test = heldout shard
# 00000 (the benchmark's test set). The vocabulary is the benchmark's standard list (Jozefowicz et al., 2016),
# fetched from the same address as the official script. Penn Treebank, word level: Mikolov's simple-examples.tgz.
LM1B_URLS = ("http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz",)
LM1B_VOCAB_URLS = ("https://github.com/rafaljozefowicz/lm/raw/master/1b_word_vocab.txt",)
LM1B_ROOT = "1-billion-word-language-modeling-benchmark-r13output"
LM1B_TRAIN_DIR = f"{LM1B_ROOT}/training-monolingual.tokenized.shuffled"
LM1B_HELDOUT_DIR = f"{LM1B_ROOT}/heldout-monolingual.tokenized.shuffled"
LM1B_TEST_SHARD = "news.en.heldout-00000-of-00050"  # the benchmark's test set
# Our validation shard: another held-out shard. The official getdata.sh writes shard 00000 to both valid.txt and
# test.txt, so its validation numbers are test numbers (papers/transformer_xl/README.md, Deviations).
LM1B_VALID_SHARD = "news.en.heldout-00001-of-00050"
PTB_URLS = ("http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",)
# The tarball's sha256 is pinned in `PUBLISHED`; the vocabulary and PTB's archive have none published, so the first
# download's checksum is recorded beside the file and later uses are verified against it.


def _extract_tar(tar_path: Path, folder: Path, wanted) -> dict[str, Path]:
    """Extract the members of a .tar.gz for which `wanted(name)` is true into `folder` (names without a leading
    './'), each atomically; a stamp beside them records the archive's checksum and the sizes, so that a second
    call extracts nothing. Returns member name → path."""
    digest = read_sidecar(tar_path) or sha256_file(tar_path)
    source = f"{tar_path.name} sha256:{digest}"
    stamp = _read_stamp(folder)
    if stamp is not None and stamp.get("source") == source:
        files = {name: folder / name for name in stamp.get("sizes", {})}
        if _stamp_matches(stamp, files, source=source):
            return files
    (folder / _STAMP).unlink(missing_ok=True)
    files: dict[str, Path] = {}
    try:
        with tarfile.open(tar_path, "r:gz") as tf:
            for info in tf:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if not info.isfile() or not wanted(name):
                    continue
                if ".." in Path(name).parts or Path(name).is_absolute():
                    raise ArchiveError(f"{tar_path} has a member with an unsafe path {info.name!r}; refusing it")
                dest = folder / name
                with atomic_path(dest) as tmp, tf.extractfile(info) as src, open(tmp, "wb") as out:
                    while block := src.read(1 << 20):
                        out.write(block)
                files[name] = dest
    except (tarfile.TarError, EOFError, OSError) as err:
        if isinstance(err, ArchiveError):
            raise
        raise ArchiveError(f"{tar_path} is not a readable .tar.gz ({type(err).__name__}: {err}); it is probably a "
                           f"truncated download: delete it (and its .sha256) and run again") from err
    atomic_write_json(folder / _STAMP, {"source": source, "sizes": {n: p.stat().st_size for n, p in files.items()}})
    return files


def lm1b_files(raw_dir: str | os.PathLike, *, urls: Sequence[str] | None = None,
               vocab_urls: Sequence[str] | None = None, timeout: float = 60) -> dict:
    """The One Billion Word files under `raw_dir`, downloaded and extracted if needed:
    {"train": [99 training shards, sorted], "valid": heldout shard 00001, "test": heldout shard 00000,
    "vocab": 1b_word_vocab.txt}. A tarball or vocabulary placed in `raw_dir` by hand is used offline."""
    raw_dir = Path(raw_dir)
    name = LM1B_URLS[0].rsplit("/", 1)[1]
    tar_path = _fetch_archive(raw_dir, name, urls, LM1B_URLS, timeout=timeout)
    vocab = _fetch_archive(raw_dir, "1b_word_vocab.txt", vocab_urls, LM1B_VOCAB_URLS, timeout=timeout)
    keep = {f"{LM1B_HELDOUT_DIR}/{LM1B_TEST_SHARD}", f"{LM1B_HELDOUT_DIR}/{LM1B_VALID_SHARD}"}
    files = _extract_tar(tar_path, raw_dir / "extracted",
                         lambda n: n in keep or (n.startswith(f"{LM1B_TRAIN_DIR}/news.en-")))
    train = sorted(p for n, p in files.items() if n.startswith(LM1B_TRAIN_DIR))
    missing = [n for n in keep if n not in files]
    if not train or missing:
        raise ValueError(f"{tar_path} lacks {missing or 'the training shards'}: is it the r13output tarball? "
                         "Delete it and its .sha256 and run again to download it afresh.")
    return {"train": train, "valid": files[f"{LM1B_HELDOUT_DIR}/{LM1B_VALID_SHARD}"],
            "test": files[f"{LM1B_HELDOUT_DIR}/{LM1B_TEST_SHARD}"], "vocab": vocab}


def ptb_files(raw_dir: str | os.PathLike, *, urls: Sequence[str] | None = None, timeout: float = 60) -> dict[str, Path]:
    """`ptb.{train,valid,test}.txt` of Mikolov's simple-examples.tgz (word level), downloaded if needed."""
    raw_dir = Path(raw_dir)
    tar_path = _fetch_archive(raw_dir, "simple-examples.tgz", urls, PTB_URLS, timeout=timeout)
    want = {s: f"simple-examples/data/ptb.{s}.txt" for s in SPLITS}
    files = _extract_tar(tar_path, raw_dir / "extracted", lambda n: n in want.values())
    missing = [m for m in want.values() if m not in files]
    if missing:
        raise ValueError(f"{tar_path} lacks {missing}: is it Mikolov's simple-examples.tgz? Delete it and its "
                         ".sha256 and run again to download it afresh.")
    return {s: files[m] for s, m in want.items()}
