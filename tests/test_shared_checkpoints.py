"""A final checkpoint and its `.last.ckpt` that hold the same weights are one file with two names (a
paper-size rehearsal stored 3.4 GB twice per experiment): `--run.select` whose best validation is the final step,
or under which no validation ran, hard-links `A.ckpt` to `A.last.ckpt` (`repro.io.link_or_copy`, a copy where the
file system refuses the link). Both load; a later save to either name (an atomic replace, a new inode) leaves the
other's bytes as they were; a resumed fit still continues from `A.last.ckpt` and keeps the selection."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.io import atomic_write_text, link_or_copy

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/enwik8_12l.yaml")
SMALL = ["--model.init_args.model.n_layer", "2", "--model.init_args.model.d_model", "32",
         "--model.init_args.model.n_head", "2", "--model.init_args.model.d_head", "16",
         "--model.init_args.model.d_inner", "64", "--model.init_args.memory.mem_len", "16",
         "--data.init_args.batch_size", "4", "--data.init_args.tgt_len", "16", "--trainer.limit_val_batches", "2",
         "--trainer.precision", "32-true", "--run.tracking", "none", "--run.select", "val/loss:min"]


def _cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "repro", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_link_replaces_atomically_and_a_later_write_leaves_the_other(tmp_path):
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    a.write_text("state 1")
    b.write_text("an older file")
    assert link_or_copy(a, b) is True
    assert a.stat().st_ino == b.stat().st_ino and a.stat().st_nlink == 2 and b.read_text() == "state 1"
    atomic_write_text(a, "state 2")  # how every checkpoint is written: a new inode under the old name
    assert b.read_text() == "state 1" and a.read_text() == "state 2" and a.stat().st_ino != b.stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt"]  # no temporary file left


def test_where_links_are_refused_the_bytes_are_copied(tmp_path, monkeypatch):
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    a.write_bytes(os.urandom(4096))

    def refuse(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    assert link_or_copy(a, b) is False
    assert b.read_bytes() == a.read_bytes() and a.stat().st_ino != b.stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt"]


@pytest.mark.slow
def test_a_selection_of_the_final_step_shares_the_last_checkpoint(root, tmp_path):
    """One validation, at the last step (a rehearsal's shape): the selected and the final checkpoint are one inode,
    and `repro test` scores it."""
    ckpt, last = tmp_path / "a.ckpt", tmp_path / "a.last.ckpt"
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--trainer.val_check_interval", "4",
                "--run.checkpoint", str(ckpt)], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert ckpt.stat().st_ino == last.stat().st_ino and ckpt.stat().st_nlink == 2
    assert not (tmp_path / "a.best.ckpt").exists() and "selected step 4" in fit.stdout
    assert _load(ckpt)["global_step"] == 4 and _load(last)["global_step"] == 4
    test = _cli(["test", "-c", TINY, *SMALL, "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "1"], root)
    assert test.returncode == 0, test.stderr[-3000:]


@pytest.mark.slow
def test_a_later_save_to_last_leaves_the_selected_checkpoint(root, tmp_path):
    """Shared after one fit; a resumed fit whose later validations are all worse keeps `A.ckpt` as selected, and
    the saves of `A.last.ckpt` (periodic, final) leave its bytes as they were."""
    ckpt, last = tmp_path / "a.ckpt", tmp_path / "a.last.ckpt"
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
                "--run.checkpoint", str(ckpt), "--run.select", "val/loss:max"], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert ckpt.stat().st_ino == last.stat().st_ino
    before = _digest(ckpt)
    more = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
                 "--run.checkpoint", str(ckpt), "--run.resume", "true", "--run.select", "val/loss:max",
                 "--run.last_every_steps", "1"], root)
    assert more.returncode == 0, more.stderr[-3000:]
    assert _digest(ckpt) == before and _load(ckpt)["global_step"] == 2  # the loss falls: step 2 stays the highest
    assert _load(last)["global_step"] == 6 and ckpt.stat().st_ino != last.stat().st_ino


@pytest.mark.slow
def test_no_validation_shares_the_final_state(root, tmp_path):
    ckpt, last = tmp_path / "a.ckpt", tmp_path / "a.last.ckpt"
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
                "--run.checkpoint", str(ckpt)], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "no validation ran" in fit.stderr
    assert ckpt.stat().st_ino == last.stat().st_ino
    a, b = _load(ckpt), _load(last)
    assert a["global_step"] == b["global_step"] == 2
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


@pytest.mark.slow
def test_under_ddp_rank_0_links_and_every_rank_waits(root, tmp_path):
    ckpt, last = tmp_path / "a.ckpt", tmp_path / "a.last.ckpt"
    fit = _cli(["fit", "-c", TINY, *SMALL, "--trainer.max_steps", "4", "--trainer.val_check_interval", "4",
                "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
                "--run.checkpoint", str(ckpt)], root)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert ckpt.stat().st_ino == last.stat().st_ino and _load(ckpt)["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "a.last.ckpt"]
