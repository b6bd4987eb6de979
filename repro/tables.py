"""Tables with provenance: every number says whether it is the paper's or ours, and where ours came from.

A paper's `tables.py` defines `build(results: Results) -> list[Table]`; `repro tables PAPER` calls it and writes
`results/<paper>/<table>.md` and `.csv`. Our numbers come from the run records that `repro fit|test
--run.record` writes under `results/<paper>/runs/<profile>/`; each cell of ours carries a footnote with the
profile, corpus, steps, tokens seen, hardware, precision and MLflow run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.io import atomic_write_text
from repro.tracking import experiment_id, tracking_uri

RESULTS = Path("results")
# Provenance of a run of `repro rehearse` (records with `rehearsal: true`) starts with this; its cells read
# "rehearsal <value>" in every table.
REHEARSAL = "REHEARSAL of the paper profile (a few steps: not a result); "


@dataclass
class Cell:
    value: float | str | None
    source: str = ""  # "paper", "ours", or "" for labels
    provenance: str = ""  # footnote text for cells of ours
    fmt: str = "{:.2f}"

    def text(self) -> str:
        if self.value is None:
            return "—"
        if isinstance(self.value, str):
            return self.value
        return self.fmt.format(self.value)


@dataclass
class Table:
    name: str  # file stem
    title: str
    columns: list[str]
    rows: list[list[Cell | str | float | None]]
    notes: list[str] = field(default_factory=list)

    def _cells(self) -> list[list[Cell]]:
        return [[c if isinstance(c, Cell) else Cell(c) for c in row] for row in self.rows]

    def markdown(self) -> str:
        footnotes: dict[str, int] = {}
        lines = [f"# {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        for row in self._cells():
            texts = []
            for c in row:
                t = c.text()
                if c.source == "ours" and c.provenance.startswith(REHEARSAL) and c.value is not None:
                    t = f"rehearsal {t}"  # a rehearsal run is plumbing, never a result (`repro rehearse`)
                if c.source == "ours" and c.provenance and c.value is not None:
                    n = footnotes.setdefault(c.provenance, len(footnotes) + 1)
                    t = f"{t} [{n}]"
                texts.append(t)
            lines.append("| " + " | ".join(texts) + " |")
        if footnotes:
            lines += ["", "Where our numbers come from:", ""]
            lines += [f"{n}. {p}" for p, n in footnotes.items()]
        if self.notes:
            lines += [""] + self.notes
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow([*self.columns, "provenance"])
        for row in self._cells():
            prov = "; ".join(sorted({c.provenance for c in row if c.source == "ours" and c.provenance}))
            w.writerow([c.text() if c.value is None or isinstance(c.value, str) else c.value for c in row] + [prov])
        return buf.getvalue()


# A run did not learn when its loss ends within this fraction of the uniform level (ln of the symbols it predicts),
# or less than this fraction below its first logged loss.
LEARNED_MARGIN = 0.01
DID_NOT_LEARN = "did not learn"
# the record's metrics that say how well it learned: a run that did not learn shows none of them as a number
QUALITY = ("loss", "ppl", "bpc", "acc", "f1", "rouge", "meteor", "error")


def uniform_loss(rec: dict[str, Any]) -> float | None:
    """ln N, the loss of guessing uniformly among the N symbols a task predicts, where its data say N (the sorting
    task's "20 symbols, separator 20, pad 21"); None where they do not."""
    vocabulary = ((rec.get("provenance") or {}).get("corpus_meta") or {}).get("vocabulary")
    m = re.match(r"(\d+) symbols", str(vocabulary or ""))
    return math.log(int(m[1])) if m and int(m[1]) > 1 else None


def first_logged_loss(curve: Path) -> float | None:
    """The first loss of a fit's curve (`--run.curves`: step, split, loss, …), or None."""
    if not curve.is_file():
        return None
    with curve.open() as f:
        row = next(csv.DictReader(f), None)
    try:
        return float(row["loss"]) if row else None
    except (KeyError, TypeError, ValueError):
        return None


def did_not_learn(rec: dict[str, Any], curve: Path | None = None) -> str | None:
    """Why a run's record shows that it did not learn, or None: its final loss (`test/loss`, else `val/loss`) within
    `LEARNED_MARGIN` of the uniform level, or not `LEARNED_MARGIN` below the first loss its fit logged. A rehearsal's
    records (two steps) are never judged."""
    metrics = rec.get("metrics") or {}
    loss = metrics.get("test/loss", metrics.get("val/loss"))
    if loss is None or rec.get("rehearsal"):
        return None
    uniform = uniform_loss(rec)
    if uniform is not None and loss >= uniform * (1 - LEARNED_MARGIN):
        return f"loss {loss:.4f} at the uniform level ln {round(math.exp(uniform))} = {uniform:.4f}"
    first = first_logged_loss(curve) if curve is not None else None
    if first is not None and loss >= first * (1 - LEARNED_MARGIN):
        return f"loss {loss:.4f}, no better than its first logged loss {first:.4f}"
    return None


class Results:
    """Run records of one paper: `get(profile, experiment, stage)`. A record of a run that did not learn
    (`did_not_learn`) keeps its quality metrics under `unlearned_metrics` and its reason under `did_not_learn`, so
    that no table shows them as a number and no claim counts them."""

    def __init__(self, paper: str, root: Path = RESULTS):
        self.paper, self.root = paper, root
        self.records: dict[tuple[str, str, str], dict[str, Any]] = {}
        # runs/<profile>/<record>.json, or runs/<profile>/<group>/<record>.json (`repro runs`)
        for path in sorted([*(root / paper / "runs").glob("*/*.json"), *(root / paper / "runs").glob("*/*/*.json")]):
            rec = json.loads(path.read_text())
            experiment = rec.get("experiment") or path.stem.split(".")[0]
            curve = root / paper / "curves" / path.parent.relative_to(root / paper / "runs") / f"{experiment}.csv"
            why = did_not_learn(rec, curve) if isinstance(rec.get("metrics"), dict) else None
            if why:
                quality = {k: v for k, v in rec["metrics"].items() if any(q in k for q in QUALITY)}
                rec = {**rec, "did_not_learn": why, "unlearned_metrics": quality,
                       "metrics": {k: v for k, v in rec["metrics"].items() if k not in quality}}
            self.records[(rec.get("profile") or path.parent.name, experiment, rec.get("stage") or "")] = rec

    def get(self, profile: str, experiment: str, stage: str) -> dict[str, Any] | None:
        return self.records.get((profile, experiment, stage))

    def metric(self, profile: str, experiment: str, stage: str, key: str, *, fmt: str = "{:.2f}") -> Cell:
        rec = self.get(profile, experiment, stage)
        if rec is not None and rec.get("did_not_learn"):
            return unlearned_cell([rec])
        if rec is None or key not in rec.get("metrics", {}):
            return Cell("not run", "ours")
        return Cell(rec["metrics"][key], "ours", provenance(rec), fmt)


    def load_json_lines(self, relpath: str) -> list[dict[str, Any]]:
        path = self.root / self.paper / relpath
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unlearned_cell(recs: list[dict[str, Any]], of: int | None = None) -> Cell:
    """The cell of runs that did not learn: "did not learn" (k of n seeds), its footnote each run and why."""
    bad = [r for r in recs if r.get("did_not_learn")]
    count = f" ({len(bad)} of {of} seeds)" if of and of > 1 else ""
    why = "; ".join(f"`{r.get('experiment')}`: {r['did_not_learn']}" for r in bad)
    return Cell(f"{DID_NOT_LEARN}{count}", "ours", f"{provenance(bad[0])}; did not learn: {why}")


def provenance(rec: dict[str, Any]) -> str:
    p = rec.get("provenance", {})
    meta = p.get("corpus_meta") or {}
    corpus = p.get("corpus") or "?"
    if meta.get("python"):
        corpus += f" (Python {meta['python']} docs, sha256 {meta.get('sha256', '')[:12]})"
    run = p.get("mlflow_run")
    mlflow = f"MLflow run {run[:12]} (experiment {p.get('mlflow_experiment')})" if run else "no MLflow run"
    return ((REHEARSAL if rec.get("rehearsal") else "")
            + f"this repository, profile `{rec.get('profile')}`, `{rec.get('experiment')}` {rec.get('stage')}; "
            f"data {corpus}; {p.get('steps', 0):,} steps, {p.get('tokens_seen', 0):,} tokens seen; "
            f"{p.get('parameters', 0):,} parameters; {p.get('hardware')}, precision {p.get('precision')}; {mlflow}")


def bench_provenance(row: dict[str, Any], text: str) -> str:
    """The footnote of a benchmark row (a JSON line of `repro bench*`), marked when a rehearsal wrote it."""
    return (REHEARSAL if row.get("rehearsal") else "") + text


def paper_cell(value: float | None, fmt: str = "{:.2f}") -> Cell:
    return Cell(value, "paper", fmt=fmt)


def write(paper: str, tables: list[Table], root: Path = RESULTS) -> list[Path]:
    out = []
    for t in tables:
        md = root / paper / f"{t.name}.md"
        atomic_write_text(md, t.markdown())
        atomic_write_text(root / paper / f"{t.name}.csv", t.csv())
        out.append(md)
    return out


def log_to_mlflow(paper: str, tables: list[Table], paths: list[Path], results: Results) -> int:
    """One MLflow run `tables:<paper>` in the paper's experiment holds the tables and plots as artifacts; every run
    the tables cite gets the tag `tables_run` pointing to it (find it in the UI by that id). Returns how many cited
    runs were recorded in another database (another machine, the rehearsal's copy) and so not tagged."""
    runs = {rec["provenance"]["mlflow_run"] for rec in results.records.values()
            if rec.get("provenance", {}).get("mlflow_run")}
    if not runs:
        return 0
    from mlflow.tracking import MlflowClient  # heavy: MLflow

    client = MlflowClient(tracking_uri())
    run = client.create_run(experiment_id(paper, client), run_name=f"tables:{paper}", tags={"subcommand": "tables"})
    rid = run.info.run_id
    for p in [*paths, *sorted((results.root / paper).glob("*.png"))]:
        client.log_artifact(rid, str(p), artifact_path="tables")
    client.set_tag(rid, "cited_runs", ",".join(sorted(runs))[:5000])
    elsewhere = 0
    for cited in sorted(runs):
        try:
            client.set_tag(cited, "tables_run", rid)
        except Exception:  # a run recorded in another database (another machine, the rehearsal's copy): not fatal
            elsewhere += 1
    client.set_terminated(rid)
    return elsewhere
