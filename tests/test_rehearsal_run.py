"""The paper profile, rehearsed end to end (`repro rehearse`): download from the local mirror → data → training at
the papers' model sizes → evaluation protocol → tables, in a scratch copy that leaves this repository untouched.

`python -m pytest` runs the CI subset (one full-size experiment per paper, download → table; a few minutes);
`python -m pytest -m rehearsal` runs every stage of the four papers and the 2-process DDP fits (see README.md,
"Rehearsal of the paper profile").
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".rehearsal"
PAPERS = ("transformer_xl", "mgk", "lamemo", "infinity_former")


def _state() -> dict[str, str]:
    """What a rehearsal must not touch: dvc.lock, params.yaml, every committed result, the tracking database."""
    files = [ROOT / "dvc.lock", ROOT / "params.yaml", ROOT / "mlflow.db", *sorted((ROOT / "results").rglob("*"))]
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def _rehearse(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REPRO_DATA", "MLFLOW_TRACKING_URI")}
    before = _state()
    done = subprocess.run([sys.executable, "-m", "repro", "rehearse", "--workdir", str(WORK), *args], cwd=ROOT,
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


@pytest.mark.rehearsal
def test_rehearsal_every_stage():
    """Every stage of the four papers, then the 2-process DDP fits of each paper's main model."""
    _rehearse("--subset", "all", "--keep-going")
    summary = json.loads((WORK / "summary.json").read_text())
    assert [s for s in summary["stages"] if s["exit"]] == []
    assert any(s["stage"].startswith("ddp:") for s in summary["stages"])
    _check_paper_cells(WORK / "repo")
