"""ListOps (Nangia & Bowman 2018) as the Long Range Arena (Tay et al., ICLR 2021) generates it: the task's trees,
their value, LRA's written form, a seeded generator and the TSV files of `lra_release/listops-1000/`.

A tree whose inner nodes are one of MAX, MIN, MED (median, truncated to an integer: the median of an even number
of values is the mean of the middle two, rounded down) and SM (sum modulo 10) over 2…`max_args` arguments, and
whose leaves are digits 0–9; a node below `max_depth` is an operator with probability 0.25 (`VALUE_P`: otherwise a
digit); trees whose length (operators, closing brackets and digits) lies outside [min_length, max_length] are
drawn again. The label is the value of the tree. Written as LRA writes it (`Source\\tTarget` with a header, the
source fully parenthesised as binary applications); our tokenizer keeps the operators, `]` and digits, and drops
the parentheses, which repeat the bracket structure.

Follows LRA's generator (google-research/long-range-arena `lra_benchmarks/data/listops.py`: the operators,
`VALUE_P`, the recursion, the written form; like it, no tree appears twice in or across splits), and differs in
being seeded (`ListOpsSpec.seed`; LRA draws from the unseeded `random` module), in keeping lengths in the closed
interval [min_length, max_length] (LRA's bounds are strict) and in drawing the splits one after the other (LRA
draws one set and slices it). The files are written once with their sha256 in a manifest and reused while they
match (`write_listops`); `repro.data.lra_tasks` builds the ListOps task from them or from the release's files.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from repro.data.download import sha256_file
from repro.io import atomic_write_json, atomic_write_text

FORMAT_VERSION = 1  # of the generated files' manifest

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUE_P = 0.25  # probability that a node above the depth limit is an operator
LISTOPS_VOCAB = ("<pad>", *(str(d) for d in range(10)), MIN, MAX, MED, SUM_MOD, END)
_LISTOPS_ID = {s: i for i, s in enumerate(LISTOPS_VOCAB)}

Tree = Any  # an int (a digit) or (operator, [children])


def listops_value(tree: Tree) -> int:
    """The value of a ListOps tree: MAX, MIN, MED = int(median), SM = sum mod 10."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [listops_value(a) for a in args]
    if op == MAX:
        return max(vals)
    if op == MIN:
        return min(vals)
    if op == MED:
        return int(np.median(vals))
    if op == SUM_MOD:
        return sum(vals) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def listops_tokens(tree: Tree) -> list[str]:
    """Prefix tokens without parentheses: `[MAX 2 [MIN 4 7 ] 0 ]`."""
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [op, *(t for a in args for t in listops_tokens(a)), END]


def listops_source(tree: Tree) -> str:
    """LRA's written form: every application bracketed as a binary pair, ( ( ( [MAX 2 ) 9 ) ] )."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    text = f"( {op} {listops_source(args[0])} )"
    for a in args[1:]:
        text = f"( {text} {listops_source(a)} )"
    return f"( {text} {END} )"


def parse_listops(source: str) -> Tree:
    """A tree from a source string (with or without LRA's parentheses)."""
    toks = [t for t in source.split() if t not in ("(", ")")]
    pos = 0

    def node() -> Tree:
        nonlocal pos
        if pos >= len(toks):
            raise ValueError(f"ListOps source ends early: {source[:80]!r}")
        tok = toks[pos]
        pos += 1
        if tok in OPERATORS:
            args = []
            while pos < len(toks) and toks[pos] != END:
                args.append(node())
            if pos >= len(toks):
                raise ValueError(f"unclosed {tok} in ListOps source {source[:80]!r}")
            pos += 1
            return tok, args
        if tok.isdigit() and len(tok) == 1:
            return int(tok)
        raise ValueError(f"unexpected token {tok!r} in ListOps source {source[:80]!r}")

    tree = node()
    if pos != len(toks):
        raise ValueError(f"trailing tokens in ListOps source {source[:80]!r}")
    return tree


def _draw_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[Tree, int]:
    """One tree by LRA's recursive procedure; returns (tree, length in tokens without parentheses)."""
    if depth >= max_depth or rng.random() > VALUE_P:
        return rng.randrange(10), 1
    n_args = rng.randint(2, max_args)
    args, length = [], 2  # the operator and its closing bracket
    for _ in range(n_args):
        sub, n = _draw_tree(rng, depth + 1, max_depth, max_args)
        args.append(sub)
        length += n
    return (rng.choice(OPERATORS), args), length


@dataclass(frozen=True)
class ListOpsSpec:
    """How a ListOps data set is generated. Defaults: LRA's (96k/2k/2k examples, depth 10, 10 arguments,
    lengths 500–2000)."""

    n_train: int = 96_000
    n_valid: int = 2_000
    n_test: int = 2_000
    min_length: int = 500
    max_length: int = 2000
    max_depth: int = 10
    max_args: int = 10
    seed: int = 0

    def __post_init__(self):
        if min(self.n_train, self.n_valid, self.n_test) <= 0:
            raise ValueError("ListOps split sizes must be positive")
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 ≤ min_length ≤ max_length, got {self.min_length}, {self.max_length}")
        if self.max_depth < 1 or self.max_args < 2:
            raise ValueError("max_depth must be ≥ 1 and max_args ≥ 2")
        if self.min_length > 2 and self.max_depth < 2:
            raise ValueError("with max_depth 1 every tree is a single digit: raise max_depth or lower min_length")

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "valid": self.n_valid, "test": self.n_test}


def generate_listops_examples(spec: ListOpsSpec) -> dict[str, list[tuple[str, int]]]:
    """(source, label) per split, deterministic for a spec; no source appears twice in or across splits."""
    rng = random.Random(spec.seed)
    seen: set[str] = set()
    out: dict[str, list[tuple[str, int]]] = {}
    for split, n in spec.sizes.items():
        rows: list[tuple[str, int]] = []
        tries = 0
        while len(rows) < n:
            tries += 1
            if tries > 1000 * n + 100_000:
                raise ValueError(f"ListOps generation found only {len(rows)} of {n} distinct {split} trees with "
                                 f"lengths in [{spec.min_length}, {spec.max_length}]: widen the bounds or raise "
                                 "max_depth/max_args")
            tree, length = _draw_tree(rng, 1, spec.max_depth, spec.max_args)
            if not spec.min_length <= length <= spec.max_length:
                continue
            src = listops_source(tree)
            if src in seen:
                continue
            seen.add(src)
            rows.append((src, listops_value(tree)))
        out[split] = rows
    return out


LISTOPS_FILES = {"train": "basic_train.tsv", "valid": "basic_val.tsv", "test": "basic_test.tsv"}


def write_listops(folder: str | os.PathLike, spec: ListOpsSpec) -> dict[str, Path]:
    """Generate ListOps into `folder` as LRA's TSV files, once: a folder whose manifest matches `spec` and whose
    files match their recorded sha256 is reused; anything else is regenerated (each file written atomically, the
    manifest last)."""
    folder = Path(folder)
    files = {s: folder / name for s, name in LISTOPS_FILES.items()}
    manifest = folder / "manifest.json"
    want = {"format": FORMAT_VERSION, "spec": asdict(spec)}
    try:
        old = json.loads(manifest.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        old = None
    if old and {k: old.get(k) for k in want} == want and all(
            p.exists() and sha256_file(p) == old["sha256"].get(s) for s, p in files.items()):
        return files
    manifest.unlink(missing_ok=True)
    rows = generate_listops_examples(spec)
    for s, path in files.items():
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", lineterminator="\n")
        w.writerow(["Source", "Target"])
        w.writerows(rows[s])
        atomic_write_text(path, buf.getvalue())
    atomic_write_json(manifest, want | {"sha256": {s: sha256_file(p) for s, p in files.items()},
                                        "examples": spec.sizes})
    return files


def read_listops_tsv(path: str | os.PathLike) -> list[tuple[list[int], int]]:
    """(token ids, label) of an LRA ListOps TSV (ours or `lra_release/listops-1000/basic_*.tsv`)."""
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["Source", "Target"]:
            raise ValueError(f"{path} is not a ListOps TSV: its first line must be 'Source<TAB>Target'")
        for n, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != 2:
                raise ValueError(f"{path}:{n}: expected 2 tab-separated fields, got {len(row)}")
            ids = [_LISTOPS_ID[t] for t in row[0].split() if t not in ("(", ")")]
            out.append((ids, int(row[1])))
    return out
