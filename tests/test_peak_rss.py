"""Peak resident memory is recorded: each run record's provenance holds its process's peak RSS (each
rank's under DDP), and the rehearsal's summary each stage's peak RSS and seconds — the largest process of the stage,
grandchildren included (a `dvc repro` stage runs `repro runs`, which runs workers).

The figures are checked against allocations of known size made by child processes: 300 MiB of touched bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.ops.rss import peak_rss_mb, run_measured

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "1", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.d_inner", "64", "--data.init_args.batch_size", "2", "--data.init_args.tgt_len", "16",
         "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "2",
         "--run.tracking", "none"]
ALLOCATE = "x = b'x' * (300 << 20)"  # bytes filled with 'x': every page touched, resident
CHILD_ALLOCATES = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {ALLOCATE!r}], check=True)"


def test_a_command_s_peak_includes_the_processes_it_waited_for():
    alone = run_measured([sys.executable, "-c", ALLOCATE])
    assert alone.returncode == 0 and 300 <= alone.peak_rss_mb < 400 and alone.seconds > 0
    # the child itself stays small; its own child allocates
    nested = run_measured([sys.executable, "-c", CHILD_ALLOCATES])
    assert nested.returncode == 0 and 300 <= nested.peak_rss_mb < 400
    small = run_measured([sys.executable, "-c", "pass"])
    assert small.peak_rss_mb < 100
    assert run_measured([sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3


def test_this_process_peak():
    assert 0 < peak_rss_mb() < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


@pytest.mark.slow
def test_a_run_record_holds_the_peak(tmp_path):
    record = tmp_path / "fit.json"
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", TINY, *SMALL, "--run.record", str(record)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    prov = json.loads(record.read_text())["provenance"]
    # torch and Lightning alone take more than 100 MiB; this tiny model on 2 cores far less than 4 GiB
    assert 100 < prov["peak_rss_mb"] < 4096 and "peak_rss_mb_ranks" not in prov


@pytest.mark.slow
def test_a_ddp_record_holds_every_rank_s_peak(tmp_path):
    record = tmp_path / "fit.json"
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", TINY, *SMALL, "--trainer.accelerator", "cpu",
                           "--trainer.devices", "2", "--trainer.strategy", "ddp", "--run.record", str(record)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    prov = json.loads(record.read_text())["provenance"]
    ranks = prov["peak_rss_mb_ranks"]
    assert len(ranks) == 2 and all(100 < r < 4096 for r in ranks) and prov["peak_rss_mb"] == ranks[0]


def test_the_rehearsal_summary_has_each_stage_s_peak_and_seconds(tmp_path, monkeypatch, capsys):
    from repro.cli import rehearsal

    commands = {"big": [sys.executable, "-c", CHILD_ALLOCATES], "small": [sys.executable, "-c", "pass"],
                "broken": [sys.executable, "-c", "raise SystemExit(1)"]}
    monkeypatch.setattr(rehearsal, "stage_command", lambda name: commands[name])
    plan = ["big", "small", "broken", "small"]
    summary = rehearsal.run_stages(plan, tmp_path, dict(os.environ), keep_going=False)
    assert [(r["stage"], r["exit"]) for r in summary] == [("big", 0), ("small", 0), ("broken", 1)]  # stopped
    assert 300 <= summary[0]["peak_rss_mb"] < 400 and summary[1]["peak_rss_mb"] < 100
    assert all(isinstance(r["seconds"], int) for r in summary)
    out = capsys.readouterr().out
    assert "rehearse: big done in " in out and ", peak RSS 0.3 GiB" in out and "rehearse: broken FAILED" in out
    assert len(rehearsal.run_stages(plan, tmp_path, dict(os.environ), keep_going=True)) == 4
