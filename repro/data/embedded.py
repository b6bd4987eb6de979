"""The embedded corpus of the tiny profile: English text that ships with every Python installation.

Sources, read without importing anything or touching the network:
- the documentation topics of the standard library's `pydoc_data` (the text `help("if")` shows), and
- the docstrings of the standard library's top-level modules (module, class and function docstrings), read
  from the source files with `ast`.

Documents are put in a fixed pseudo-random order (by the SHA-256 of their names) and concatenated; the text is
then cut at line boundaries into train / valid / test = 90 / 5 / 5 % of its characters, like enwik8's contiguous
split. Three stand-ins for the papers' corpora are derived from it:

| name | stands in for | how |
|---|---|---|
| `embedded-char` | enwik8 | the UTF-8 bytes, newlines kept |
| `embedded-text8` | text8 | lower-cased, every run of characters outside a-z turned into one space |
| `embedded-word` | WikiText-103 | WikiText-style tokens (words, numbers and punctuation split), rare words as `<unk>` |

In `embedded-word`, words seen fewer than 3 times in train become `<unk>` in all splits (WikiText's rule), and every
line ends with `<eos>`.

The text depends on the Python version (it is that version's documentation): `meta.json` of each built corpus
records the version and the SHA-256 of the text, and tables cite them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from pydoc_data.topics import topics

SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
SPLITS = ("train", "valid", "test")
WIKITEXT_MIN_COUNT = 3  # WikiText replaced words seen fewer than 3 times by <unk>


def documents(*, docstrings: bool = True) -> list[tuple[str, str]]:
    """(name, text) for every document, in the fixed order."""
    docs = [(f"topic:{name}", text) for name, text in topics.items()]
    if docstrings:
        docs += _stdlib_docstrings()
    return sorted(docs, key=lambda d: hashlib.sha256(d[0].encode()).hexdigest())


def _stdlib_docstrings() -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        parts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
        if parts:
            docs.append((f"module:{path.stem}", "\n\n".join(parts)))
    return docs


def split_text(*, docstrings: bool = True) -> dict[str, str]:
    """The concatenated documents cut at line boundaries into the three splits."""
    return dict(zip(SPLITS, _split_text(docstrings)))


@functools.lru_cache(maxsize=2)
def _split_text(docstrings: bool) -> tuple[str, str, str]:
    text = "\n\n".join(doc.strip("\n") for _, doc in documents(docstrings=docstrings)) + "\n"
    lines = text.splitlines(keepends=True)
    total = len(text)
    bounds = [SPLIT_FRACTIONS[0] * total, (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]) * total]
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    seen = 0
    for line in lines:
        split = "train" if seen < bounds[0] else "valid" if seen < bounds[1] else "test"
        out[split].append(line)
        seen += len(line)
    return tuple("".join(out[s]) for s in SPLITS)


def provenance(*, docstrings: bool = True) -> dict[str, str]:
    splits = split_text(docstrings=docstrings)
    digest = hashlib.sha256("".join(splits[s] for s in SPLITS).encode("utf-8")).hexdigest()
    return {
        "source": "pydoc_data topics" + (" + standard-library docstrings" if docstrings else ""),
        "python": sys.version.split()[0],
        "sha256": digest,
    }


def char_splits(*, docstrings: bool = True) -> dict[str, bytes]:
    return {s: t.encode("utf-8") for s, t in split_text(docstrings=docstrings).items()}


_NON_LETTERS = re.compile(r"[^a-z]+")


def text8_splits(*, docstrings: bool = True) -> dict[str, bytes]:
    """text8's alphabet: a-z and single spaces (text8 also spelled digits out; we drop them)."""
    out = {}
    for split, text in split_text(docstrings=docstrings).items():
        out[split] = _NON_LETTERS.sub(" ", text.lower()).strip().encode("ascii")
    return out


_WORD_TOKENS = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?|[^\sA-Za-z\d]")


def word_splits(*, docstrings: bool = True) -> dict[str, list[str]]:
    """Lines of space-separated tokens, as in WikiText's `.tokens` files."""
    tokenized = {
        split: [" ".join(_WORD_TOKENS.findall(line)) for line in text.splitlines()]
        for split, text in split_text(docstrings=docstrings).items()
    }
    counts = Counter(tok for line in tokenized["train"] for tok in line.split())
    keep = {tok for tok, c in counts.items() if c >= WIKITEXT_MIN_COUNT}
    return {
        split: [" ".join(t if t in keep else "<unk>" for t in line.split()) for line in lines]
        for split, lines in tokenized.items()
    }
