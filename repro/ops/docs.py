"""Generated blocks of the READMEs: every figure a README shows is rendered here from the committed tables and
records, between markers, by `repro tables readme`; `tests/test_docs.py` fails when a block differs from what
the records give.

A block is the text between `<!-- repro:begin NAME -->` and `<!-- repro:end NAME -->`; `NAME` is one of `BLOCKS`:
- `claims`: the pre-registered claims of the small profile, by paper and verdict (`results/<paper>/claims_small.csv`,
  written by each paper's `repro tables`);
- `speed`: for each model, mode and precision of the newest GPU record, today's path beside the fastest variant
  (`results/speed/records/`, the rows of `results/speed/gpu.md`);
- `rehearsal`: the rehearsal's freshness and the disk a full one needs (`disk_sentence`), rendered by
  `repro.cli.rehearsal_record.readme_block`, which the command layer adds to `BLOCKS` (it reads the pipeline);
- `file:PATH`: a table that `repro tables` wrote (`results/<paper>/<table>.md`), without its title line: how a
  paper's README shows its reproduced tables and its deviations (each paper's `tables.py` builds them from its
  records and files), so that the shared layer needs to know no paper.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from pathlib import Path

from repro.io import atomic_write_text
from repro.ops import speed
from repro.ops.units import gb
from repro.tables import RESULTS

PAPER_NAMES = {"transformer_xl": "Transformer-XL", "infinity_former": "∞-former", "lamemo": "LaMemo",
               "mgk": "Transformer-MGK", "arena": "the memory arena"}
VERDICTS = ("holds", "reversed", "not decided")


def claims_block(results: Path = RESULTS) -> str:
    lines = ["| paper | holds | reversed | not decided | table |", "|---|---|---|---|---|"]
    for paper, name in PAPER_NAMES.items():
        path = results / paper / "claims_small.csv"
        if not path.exists():
            continue
        groups: dict[str, list[str]] = {v: [] for v in VERDICTS}
        for row in csv.DictReader(path.open()):
            verdict = next((v for v in VERDICTS if row["verdict"].startswith(v)), None)
            if verdict is None:
                raise ValueError(f"{path}: claim {row['claim']} has the verdict {row['verdict']!r}, none of {VERDICTS}")
            groups[verdict].append(f"`{row['claim']}`")
        cells = [", ".join(groups[v]) or "—" for v in VERDICTS]
        lines.append(f"| {name} | {' | '.join(cells)} | [claims_small.md]({path.with_suffix('.md').as_posix()}) |")
    return "\n".join(lines)


def speed_block(records: Path = speed.RECORDS) -> str:
    """The newest record file of each (config, mode, precision) on a GPU: its first variant (today's path) and its
    fastest one (by the lowest tokens/s over its rounds, the cautious reading)."""
    newest: dict[tuple[str, str, str], tuple[str, list[dict]]] = {}
    for name, rows in speed.load(records).items():
        if rows[0]["device"].startswith("CPU"):
            continue
        key = (speed._config(rows[0]), rows[0]["mode"], rows[0]["precision"])
        newest[key] = (name, rows)  # names sort by date: the last one wins
    lines = ["| model, mode, precision | batch × length | today's path | fastest variant | MFU | device |",
             "|---|---|---|---|---|---|"]
    for (config, mode, precision), (name, rows) in sorted(newest.items()):
        groups = [speed.summary(name, v, g) for v, g in speed.rows_by_variant(rows).items()]
        first = groups[0]
        best = max(groups, key=lambda s: min(r["tokens_per_s"] for r in speed.rows_by_variant(rows)[s["variant"]]))
        lines.append(f"| `{config}` {mode}, {precision} | {first['shape']} | {first['variant']}: "
                     f"{first['tokens_per_s']} tok/s | {best['variant']}: {best['tokens_per_s']} tok/s "
                     f"({best['relative']}) | {first['mfu']} → {best['mfu']} | {first['device']} |")
    return "\n".join(lines)


def disk_sentence(summary: dict) -> str:
    """The sentence on the disk a full rehearsal needs, from its summary."""
    need, data, peak = (gb(summary["disk"][k], digits=0) for k in ("need_bytes", "mirror_and_data_bytes", "peak_bytes"))
    total = gb(summary["disk"]["need_bytes"] + summary["disk"]["mirror_and_data_bytes"], digits=0)
    return (f"A full rehearsal needs about {total} of free disk: {need} for the checkpoints and the copy of the "
            f"repository at their fullest, as `repro rehearse` estimates them from the models before it starts (it "
            f"refuses in one line with less), each stage's checkpoints deleted once the stages that read them have "
            f"run, and {data} for the mirror and the data built from it; the last one peaked at {peak} in its "
            f"scratch folder.")


BLOCKS: dict[str, Callable[[], str]] = {"claims": claims_block, "speed": speed_block}
_BLOCK = re.compile(r"(<!-- repro:begin (?P<name>[\w:./-]+) -->\n)(?P<body>.*?)(<!-- repro:end (?P=name) -->)", re.S)


def file_block(path: str) -> str:
    """A generated table's markdown without its `# title` line (the README gives its own heading)."""
    p = Path(path)
    if not (p.parts and p.parts[0] == "results" and p.suffix == ".md" and ".." not in p.parts):
        raise ValueError("a file block shows a generated table under results/ (results/<paper>/<table>.md), "
                         f"not {path}")
    if not p.exists():
        raise ValueError(f"{path} does not exist: run `repro tables` for its paper first")
    lines = p.read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def render(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """`text` with every generated block rendered again; an unknown block name is an error."""
    def one(m: re.Match) -> str:
        name = m.group("name")
        if name.startswith("file:"):
            body = file_block(name[len("file:"):])
        elif name in blocks:
            body = blocks[name]()
        else:
            raise ValueError(f"unknown generated block {name!r}: known are {', '.join(blocks)} and file:PATH")
        return m.group(1) + body.rstrip("\n") + "\n" + m.group(4)

    return _BLOCK.sub(one, text)


def block_names(text: str) -> list[str]:
    return [m.group("name") for m in _BLOCK.finditer(text)]


DOCUMENTS = ("README.md", "*/*/README.md", "docs/*.md")  # the front page, each paper's README, the docs pages


def documents(root: Path = Path()) -> list[Path]:
    """The repository's documents that may hold generated blocks (relative to `root`)."""
    return sorted({rel for pattern in DOCUMENTS for p in root.glob(pattern)
                   for rel in [p.relative_to(root)] if not rel.parts[0].startswith(".")})  # not .venv, .rehearsal


def write(paths: list[Path] | None = None, blocks: dict[str, Callable[[], str]] = BLOCKS) -> list[Path]:
    """Render the blocks of each document in place (atomically); returns the files that changed."""
    changed = []
    for p in paths if paths is not None else documents():
        old = p.read_text()
        new = render(old, blocks)
        if new != old:
            atomic_write_text(p, new)
            changed.append(p)
    return changed
