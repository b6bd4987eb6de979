"""The speed tables: `results/speed/*.md` and `.csv`, rendered by `repro tables speed` from the benchmark records
in `results/speed/records/*.jsonl` (the JSON lines `repro bench --output` writes; each names its device, torch
and CUDA versions and its command).

One row per record file and variant (or config, for rows without variants): tokens/s, model-FLOPs utilisation,
the speed relative to the file's first variant in the same round, the GPU's busy share and the peak memory, each
as the range over the rounds in the file. Nothing is typed by hand: a README's speed figures are blocks rendered
from these tables (`repro tables readme`), and a test fails when they differ.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from repro.tables import RESULTS, Table
from repro.tables import write as write_tables

RECORDS = RESULTS / "speed" / "records"


def load(records: Path = RECORDS) -> dict[str, list[dict[str, Any]]]:
    """{record file name: its rows}, files in name order."""
    return {p.name: [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for p in sorted(records.glob("*.jsonl"))}


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _config(row: dict[str, Any]) -> str:
    return " + ".join(Path(c).with_suffix("").as_posix().removeprefix("configs/") for c in row["config"])


def rows_by_variant(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A file's rows grouped by variant (by config where the rows have no variant), in first-seen order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[row.get("variant") or _config(row)].append(row)
    return dict(out)


def summary(name: str, variant: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row's values for the rows of one variant in one record file."""
    first = rows[0]
    mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
    busy = [r["device_busy"] for r in rows if r.get("device_busy") is not None]
    rel = [r["relative"] for r in rows if r.get("relative") is not None]
    return {
        "record": name, "device": first["device"], "torch": first["torch"], "config": _config(first),
        "mode": first["mode"], "precision": first["precision"],
        "shape": f"{first['batch_size']} × {first['tgt_len']}", "variant": variant,
        "tokens_per_s": _span([r["tokens_per_s"] for r in rows], "{:,.0f}"),
        "mfu": _span([100 * m for m in mfu], "{:.1f}%") if mfu else "—",
        "relative": _span(rel, "{:.2f}×") if rel else "—",
        "busy": _span([100 * b for b in busy], "{:.0f}%") if busy else "—",
        "peak_mb": f"{max(r['peak_memory_mb'] for r in rows):,.0f}",
        "rounds": len(rows),
    }


COLUMNS = ["config", "mode", "precision", "batch × length", "variant", "tokens/s", "MFU", "× first variant",
           "GPU busy", "peak MB", "rounds", "record"]


def build(records: Path = RECORDS) -> list[Table]:
    """The GPU table (rows measured on a GPU) and the CPU table, each row with its record file."""
    by_kind: dict[str, list[dict[str, Any]]] = {"gpu": [], "cpu": []}
    devices: dict[str, set[str]] = {"gpu": set(), "cpu": set()}
    for name, rows in load(records).items():
        for variant, group in rows_by_variant(rows).items():
            s = summary(name, variant, group)
            kind = "cpu" if s["device"].startswith("CPU") else "gpu"
            by_kind[kind].append(s)
            devices[kind].add(f"{s['device']}, torch {s['torch']}")
    tables = []
    for kind, title in (("gpu", "Speed on a GPU"), ("cpu", "Speed on a CPU")):
        if not by_kind[kind]:
            continue
        rows = [[s["config"], s["mode"], s["precision"], s["shape"], s["variant"], s["tokens_per_s"], s["mfu"],
                 s["relative"], s["busy"], s["peak_mb"], str(s["rounds"]), f"`{s['record']}`"] for s in by_kind[kind]]
        notes = [f"Measured on: {'; '.join(sorted(devices[kind]))}.",
                 "Each cell is the range over the rounds of its record (`repro bench --variants`: the variants of one "
                 "model timed in turns in one process). MFU: the step's FLOPs (matrix products and attention, "
                 "counted with the eager kernel) over its median time and the device's dense peak for the precision. "
                 "`× first variant`: tokens/s over the first variant's in the same round. GPU busy: the kernels' "
                 "share of the wall time of three profiled steps. Records: `results/speed/records/`."]
        tables.append(Table(kind, title, COLUMNS, rows, notes))
    return tables


def write(tables: list[Table], root: Path = RESULTS) -> list[Path]:
    return write_tables("speed", tables, root)
