"""What a finished `repro fit|validate|test` leaves behind (`repro.cli.lightning_cli.ReproCLI` calls these after
each stage): the run's JSON record (its metrics and provenance: steps, tokens, hardware, precision, devices, MLflow
run, corpus, parameters, wall time, every rank's peak memory), the run's one summary line, and a fit's loss curves
as a PNG beside their CSV.

Free functions of the Trainer, the module and the data module, so that a record's form is read in one place; the
CLI decides when they run and where the record goes (`--run.record`, MLflow, `repro runs`' summary lines).
"""

from __future__ import annotations

import csv
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from repro.io import atomic_path
from repro.ops.rss import peak_rss_mb
from repro.tracking import hardware


def plot_curves(csv_path: str) -> Path | None:
    """The loss curves of a fit as a PNG beside its CSV."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for split in ("train", "valid"):
        pts = [(int(r["step"]), float(r["loss"])) for r in rows if r["split"] == split]
        if pts:
            ax.plot(*zip(*pts), "o-" if split == "valid" else "-", label=split, ms=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(csv_path).with_suffix(".png")

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


def peak_rss_ranks(trainer) -> list[float]:
    """Every rank's peak RSS in MiB (`repro.ops.rss`), gathered: the ranks of a DDP run on one machine share its
    memory, and rank 0's own figure would hide the others'. Collective: called on every rank."""
    if trainer.world_size <= 1:
        return [peak_rss_mb()]
    mine = torch.tensor([peak_rss_mb()], dtype=torch.float64, device=trainer.strategy.root_device)
    return [float(x) for x in trainer.strategy.all_gather(mine).flatten()]


def run_record(*, stage: str, run: dict[str, Any], trainer, model, datamodule, logger, peaks: list[float],
               wall_seconds: float, select=None) -> dict[str, Any]:
    """The record of a finished stage: the run section's names, the Trainer's metrics and the provenance; with
    `select` (a fit's `BestCheckpoint`) the selected step, and the module's own `describe()` where it has one."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    record = {
        "paper": run.get("paper"),
        "experiment": run.get("experiment"),
        "profile": run.get("profile"),
        "rehearsal": bool(run.get("rehearsal")),
        "stage": stage,
        "metrics": metrics,
        "provenance": {
            "steps": max(int(trainer.global_step), int(getattr(model, "train_batches", torch.tensor(0)).item())),
            "tokens_seen": int(getattr(model, "tokens_seen", torch.tensor(0)).item()),
            "hardware": hardware(),
            "precision": str(trainer.precision),
            "devices": trainer.world_size,
            "mlflow_run": logger.run_id if logger is not None else None,
            "mlflow_experiment": logger.experiment_id if logger is not None else None,
            "corpus": getattr(datamodule, "corpus_name", None),
            "corpus_meta": getattr(getattr(datamodule, "corpus", None), "meta", None),
            "parameters": sum(p.numel() for p in model.parameters()),
            "wall_seconds": wall_seconds,
            # the process's peak resident memory so far, MiB (under `repro runs`, earlier runs of the process
            # included), and each rank's under DDP (`repro.ops.rss`)
            "peak_rss_mb": round(peaks[0]),
            **({"peak_rss_mb_ranks": [round(x) for x in peaks]} if len(peaks) > 1 else {}),
            "torch": torch.__version__,
        },
    }
    if stage == "fit" and getattr(model, "batch_chunk", 1) > 1:  # how the step was split (the same numbers)
        record["provenance"]["batch_chunk"] = model.batch_chunk
    if stage == "fit" and select is not None:
        record["provenance"]["selected"] = {"metric": select.metric, "mode": select.mode, "value": select.best,
                                            "step": select.step}
    if hasattr(model, "describe"):
        record["model"] = model.describe()
    return record


def summary_line(stage: str, name: str, metrics: dict[str, float], prov: dict[str, Any], *,
                 keep: Collection[str] | None = None) -> str:
    """One line per finished run: `test tiny/char_txl  loss 1.234  ppl 3.43  bpc 1.780  (40,960 tokens, 12.3 s)`.
    `keep`: the metrics shown (a module's own choice, e.g. a classifier's acc and loss; default: all), six at most."""
    prefix = {"fit": "val/", "validate": "val/", "test": "test/"}[stage]
    shown = {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and k != f"{prefix}tokens"}
    if keep is not None:
        shown = {k: v for k, v in shown.items() if k in keep}
    if stage == "fit" and "train/loss" in metrics:
        shown = {"train loss": metrics["train/loss"], **{f"val {k}": v for k, v in shown.items()}}
    parts = [f"{stage} {name}", *(f"{k} {v:.4g}" for k, v in list(shown.items())[:6])]
    tokens = metrics.get(f"{prefix}tokens")
    sel = prov.get("selected")
    extra = ([f"{int(tokens):,} tokens"] if tokens and stage != "fit" else []) + \
        ([f"{prov['steps']} steps"] if stage == "fit" else []) + \
        ([f"selected step {sel['step']}, {sel['metric']} {sel['value']:.4g}"] if sel and sel["step"] is not None
         else []) + [f"{prov['wall_seconds']} s"]
    return "  ".join(parts) + f"  ({', '.join(extra)})"
