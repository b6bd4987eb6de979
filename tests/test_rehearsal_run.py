"""The paper profile, rehearsed end to end (`repro rehearse`): download from the local mirror → data → training at
the papers' model sizes → evaluation protocol → tables, in a scratch copy that leaves this repository untouched.

The slow tier (`python -m pytest -n 2 -m slow`) runs the CI subset (one full-size experiment per paper, download →
table; 5-6 minutes on 2 cores) and, apart, the rehearsal's four 2-process DDP fits with the largest model of each paper;
`python -m pytest -m rehearsal` runs every stage of the four papers and the DDP fits (see README.md, "Rehearsal of
the paper profile"; its committed record is checked by tests/test_rehearsal_record.py).
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli.rehearsal import DDP_RUNS
from repro.cli.rehearsal_record import SUMMARY

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".rehearsal"
PAPERS = ("transformer_xl", "mgk", "lamemo", "infinity_former")


def _state() -> dict[str, str]:
    """What a rehearsal must not touch: dvc.lock, params.yaml, every committed result but the full rehearsal's own
    record (`results/rehearsal/`), the tracking database."""
    files = [ROOT / "dvc.lock", ROOT / "params.yaml", ROOT / "mlflow.db",
             *sorted(p for p in (ROOT / "results").rglob("*") if "rehearsal" not in p.relative_to(ROOT).parts[:2])]
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def _rehearse(*args: str, work: Path = WORK) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REPRO_DATA", "MLFLOW_TRACKING_URI")}
    before = _state()
    done = subprocess.run([sys.executable, "-m", "repro", "rehearse", "--workdir", str(work), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert _state() == before, "the rehearsal changed the repository's own results, lock or tracking"


def _records(ws: Path, paper: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in (ws / "results" / paper / "runs" / "paper").rglob("*.json")
            if p.name != "data.json"]


def _check_paper_cells(ws: Path, papers=PAPERS) -> None:
    for paper in papers:
        recs = [r for r in _records(ws, paper) if r.get("stage")]
        assert recs, f"{paper}: no rehearsal record"
        assert all(r["rehearsal"] and r["profile"] == "paper" for r in recs)
        tables = "".join(p.read_text() for p in (ws / "results" / paper).glob("*.md"))
        assert "| rehearsal " in tables or " rehearsal " in tables, f"{paper}: no table cell filled by the rehearsal"
        assert "REHEARSAL of the paper profile" in tables


@pytest.mark.slow
def test_rehearsal_ci_subset():
    """One experiment of each paper at its paper size, from the mirror's download to the tables."""
    _rehearse("--subset", "ci")
    ws = WORK / "repo"
    _check_paper_cells(ws)
    # paper sizes: Transformer-XL PTB 24.07M (the config's target), GPT-2 small with its memories (> 124M)
    ptb = [r for r in _records(ws, "transformer_xl") if r["experiment"] == "ptb" and r["stage"] == "fit"][0]
    assert ptb["provenance"]["parameters"] == 24_073_420 and ptb["provenance"]["steps"] == 2
    gpt2 = [r for r in _records(ws, "infinity_former") if r["experiment"].startswith("gpt2_wt103")]
    assert gpt2 and all(r["provenance"]["parameters"] > 124_000_000 for r in gpt2)


def _largest_stages() -> dict[str, str]:
    """Each paper's `repro runs` stage that trains its largest paper model (the first such stage in DVC's order):
    today Transformer-XL's One Billion Word large (841M parameters), MGK's WikiText-103 MGK-8 (44M), LaMemo's
    WikiText-103 (151M), the ∞-former's CMU-DoG dialogue stage (GPT-2 with a memory, 167M)."""
    from repro.cli.cli import build
    from repro.cli.rehearsal import merged_params, runs_stages
    from repro.cli.runs import run_spec, runs_parser

    params = merged_params(ROOT)
    best: dict[str, tuple[int, str]] = {}
    for stage, argv in runs_stages(ROOT, params).items():
        a = runs_parser().parse_args(argv)
        if a.paper not in PAPERS:  # the memory arena composes the papers' models: the full rehearsal runs it
            continue
        for spec in a.specs:
            cfg = ROOT / "configs" / a.paper / "paper" / f"{run_spec(spec)[0]}.yaml"
            n = sum(p.numel() for p in build([str(cfg)], meta=True).model.parameters())
            if n > best.get(a.paper, (0, ""))[0]:
                best[a.paper] = (n, stage)
    return {paper: stage for paper, (_, stage) in best.items()}


@pytest.mark.slow
def test_rehearsal_ddp_fits_and_each_papers_largest_model(tmp_path, monkeypatch):
    """The rehearsal's four 2-process DDP fits and the stage of each paper's largest model (with the stages
    upstream of them), at their paper sizes: every step passes, each at most 16 GiB resident."""
    monkeypatch.chdir(ROOT)
    stages = _largest_stages()
    assert set(stages) == set(PAPERS) and stages["transformer_xl"] == "txl_run@lm1b_large"
    work = tmp_path / "rehearsal"
    _rehearse("--stages", *stages.values(), "--ddp", "yes", "--keep-going", work=work)
    summary = json.loads((work / "summary.json").read_text())
    ran = [s["stage"] for s in summary["stages"]]
    assert set(stages.values()) <= set(ran) and sum(s.startswith("ddp:") for s in ran) == len(DDP_RUNS)
    assert summary["failed"] == [] and all(s["peak_rss_mb"] <= 16 * 1024 for s in summary["stages"])
    # each largest model's peak within 10% of what the committed rehearsal measured for its stage
    recorded = {s["stage"]: s["peak_rss_mb"] for s in json.loads((ROOT / SUMMARY).read_text())["stages"]}
    peaks = {s["stage"]: s["peak_rss_mb"] for s in summary["stages"]}
    grew = {s: (peaks[s], recorded[s]) for s in stages.values() if peaks[s] > 1.1 * recorded[s]}
    assert not grew, f"peak RSS (MiB) more than 10% above the rehearsal's record, (now, then): {grew}"


@pytest.mark.rehearsal
def test_rehearsal_every_stage():
    """Every stage of the four papers, then the 2-process DDP fits of each paper's main model."""
    _rehearse("--subset", "all", "--keep-going")
    summary = json.loads((WORK / "summary.json").read_text())
    assert [s for s in summary["stages"] if s["exit"]] == []
    assert any(s["stage"].startswith("ddp:") for s in summary["stages"])
    _check_paper_cells(WORK / "repo")
