"""The disk a group of fits needs is estimated from its models and checked before anything is written (a
full disk ended rehearsal stages in 20-line `No space left on device` tracebacks): `repro runs` and `repro
rehearse` refuse in one line when the free disk (`shutil.disk_usage`, monkeypatched here) cannot hold it.

The estimate is checked against a real checkpoint's size, and its arithmetic (files kept, files while saving,
groups run one after the other, files already in place) against hand-computed cases."""

import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from repro.cli import disk
from repro.cli.disk import RESERVE, Fit, check, checkpoint_bytes, memory_bytes, need, validates_once_at_the_end
from repro.cli.entry import main

ROOT = Path(__file__).resolve().parent.parent
TINY = "configs/transformer_xl/tiny/enwik8_12l.yaml"
Usage = namedtuple("Usage", "total used free")
GB = 10**9


@pytest.fixture
def full_disk(monkeypatch):
    """Every file system looks 100 MB free."""
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**8, 10**8))


@pytest.mark.slow
def test_checkpoint_bytes_match_a_real_checkpoint(tmp_path):
    """A tiny fit's checkpoint (weights, Adam's moments, memories, curves, provenance) against the estimate."""
    from repro.cli.cli import build

    ckpt = tmp_path / "a.ckpt"
    done = subprocess.run([sys.executable, "-m", "repro", "fit", "-c", TINY, "--trainer.max_steps", "1",
                           "--trainer.limit_val_batches", "0", "--run.tracking", "none", "--run.checkpoint", str(ckpt)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cli = build([str(ROOT / TINY)], meta=True)
    weights, memory = checkpoint_bytes(cli.model), memory_bytes(cli.model, cli.datamodule)
    assert memory == 4 * 16 * 64 * 128 * 4  # 4 layers × 16 streams × mem_len 64 × d_model 128, float32
    assert 0.98 < ckpt.stat().st_size / (weights + memory) < 1.05, (ckpt.stat().st_size, weights, memory)


def test_tied_parameters_count_once_and_frozen_ones_have_no_moments():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.out = torch.nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight
            self.frozen = torch.nn.Parameter(torch.zeros(5), requires_grad=False)
            self.register_buffer("mem", torch.zeros(3))
            self.register_buffer("scratch", torch.zeros(100), persistent=False)

    assert checkpoint_bytes(Tied()) == 40 * 4 * 3 + 5 * 4 + 3 * 4


def test_the_need_counts_kept_and_saving_files(tmp_path):
    g = 10**9
    plain = Fit(str(tmp_path / "a.ckpt"), 0, 1 * g, select=False)  # A.ckpt; while saving A.last + A.ckpt's temp
    chosen = Fit(str(tmp_path / "b.ckpt"), 0, 2 * g, select=True)  # A.ckpt and A.last.ckpt; 3 while saving
    once = Fit(str(tmp_path / "c.ckpt"), 0, 4 * g, select=True, shared=True)  # one file for both; 3 while saving
    assert need([plain]) == 1 * g + 1 * g + RESERVE
    assert need([chosen]) == 2 * 2 * g + 1 * 2 * g + RESERVE
    assert need([once]) == 4 * g + 2 * 4 * g + RESERVE
    # two workers: the two largest extras at once; one worker: the largest
    assert need([plain, chosen, once], jobs=2) == (1 + 4 + 4) * g + (8 + 2) * g + RESERVE
    assert need([plain, chosen, once], jobs=1) == (1 + 4 + 4) * g + 8 * g + RESERVE
    # groups run one after the other: only the largest group's extras at once
    assert need([[plain, chosen], [once]], jobs=2) == (1 + 4 + 4) * g + 8 * g + RESERVE
    # files already at the paths are replaced, a shared pair counted once
    (tmp_path / "c.ckpt").write_bytes(b"x" * 1000)
    os.link(tmp_path / "c.ckpt", tmp_path / "c.last.ckpt")
    assert need([once]) == 4 * g + 2 * 4 * g - 1000 + RESERVE


def test_a_selection_is_shared_when_the_only_validation_ends_the_fit():
    rehearsal = {"max_epochs": 1, "limit_train_batches": 2, "val_check_interval": 2}
    assert validates_once_at_the_end(rehearsal)
    assert not validates_once_at_the_end({**rehearsal, "val_check_interval": 1})
    assert not validates_once_at_the_end({**rehearsal, "max_epochs": None})
    assert not validates_once_at_the_end({"max_steps": 400000, "val_check_interval": 4000})


def test_check_refuses_in_one_line(tmp_path, full_disk):
    fits = [Fit(str(tmp_path / "x" / "a.ckpt"), 285_000_000, 3_420_000_000, select=True)]
    with pytest.raises(ValueError) as err:
        check("repro runs --group g", fits)
    text = str(err.value)
    assert "\n" not in text and text.startswith("repro runs --group g needs 11.3 GB of disk and 0.1 GB are free on ")
    assert "the largest 3.4 GB (285M parameters)" in text and "free 11.2 GB or more" in text


def test_check_passes_where_the_disk_holds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**10))
    assert check("small", [Fit(str(tmp_path / "b.ckpt"), 10, 120, select=False)]) == 240 + RESERVE


def _made(*paths) -> list[str]:
    return [p for p in paths if (ROOT / p).exists()]


def test_repro_runs_refuses_before_writing_anything(full_disk, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    group = "disk_check_test"  # no such group in the pipeline: nothing of it exists
    outputs = [f"checkpoints/transformer_xl/tiny/{group}", f"results/transformer_xl/runs/tiny/{group}",
               f"results/transformer_xl/curves/tiny/{group}"]
    assert _made(*outputs) == []
    with pytest.raises(SystemExit) as err:
        main(["runs", "--paper", "transformer_xl", "--profile", "tiny", "--group", group, "enwik8_12l", "ptb"])
    assert err.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: repro runs --paper transformer_xl --profile tiny "
                                                   f"--group {group} needs "), lines
    assert _made(*outputs) == []


def test_a_worker_refuses_before_taking_an_experiment(tmp_path, full_disk, monkeypatch):
    from repro.cli.runs import run_group

    monkeypatch.chdir(ROOT)
    queue = tmp_path / "queue"
    queue.write_text("enwik8_12l\nptb\n")
    with pytest.raises(SystemExit) as err:
        run_group(["--paper", "transformer_xl", "--profile", "tiny", "--group", "disk_check_test", "--queue",
                   str(queue), "--check-jobs", "2", "enwik8_12l", "ptb"])
    assert err.value.code == 3
    assert queue.read_text() == "enwik8_12l\nptb\n"  # no experiment taken
    assert (tmp_path / "refused").read_text().startswith("repro runs --paper transformer_xl --profile tiny")


def test_the_parent_of_workers_says_a_refusal_once(tmp_path, monkeypatch, capsys):
    """The workers (faked here: each writes the refusal and exits 3, as `_work_queue` does) print nothing; the
    parent raises it, and `repro` prints it as its one error line."""
    from repro.cli import runs

    class Refusing:
        def __init__(self, cmd, **kwargs):
            queue = Path(cmd[cmd.index("--queue") + 1])
            queue.with_name("refused").write_text("repro runs --paper p --profile tiny --group g needs 9.9 GB")
            self.stdout = iter(())

        def wait(self):
            return 3

    monkeypatch.setattr(subprocess, "Popen", Refusing)
    monkeypatch.setattr(runs, "_prepare_tracking", lambda paper: None)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as err:
        main(["runs", "--paper", "transformer_xl", "--profile", "tiny", "--group", "disk_check_test", "--jobs", "2",
              "enwik8_12l", "ptb"])
    assert err.value.code == 2
    out, errors = capsys.readouterr()
    assert errors.strip() == "error: repro runs --paper p --profile tiny --group g needs 9.9 GB  (REPRO_DEBUG=1 " \
                             "shows the traceback)"
    assert "worker" not in errors


@pytest.mark.slow
def test_repro_rehearse_refuses_before_creating_anything(tmp_path, full_disk, monkeypatch, capsys):
    from repro.cli.rehearsal import rehearse

    monkeypatch.chdir(ROOT)
    work = tmp_path / "rehearsal"
    with pytest.raises(ValueError) as err:
        rehearse(["--workdir", str(work), "--stages", "txl_run@ptb"])
    assert str(err.value).startswith("repro rehearse (1 fits) needs ") and "\n" not in str(err.value)
    assert "for the workspace's copy of the repository" in str(err.value)
    assert not work.exists()
